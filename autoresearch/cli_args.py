"""Argument types the command line shares: a bad value is argparse's one-line error, not a
silent default (`--jobs -1` used to mean "all cores" by accident)."""
from __future__ import annotations

import argparse


def at_least(low: int):
    """An integer >= low."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer >= {low}, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"expected an integer >= {low}, got {value}")
        return value

    return parse
