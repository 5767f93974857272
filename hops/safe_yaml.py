"""PyYAML's safe loader, reading numbers as YAML 1.2 does.

PyYAML implements YAML 1.1, where a float needs a dot and a signed exponent: `1e3`, `1e308`
and `1.0e3` are strings there, so `tflop: 1e3` failed as "expected a number, got '1e3'".
YAML 1.2 (and OmegaConf, which reads conf/) takes them as floats; every YAML file HOPS reads
itself (scenario files, presets, catalog override values) goes through this loader so they
all agree. Only plain scalars are resolved: a quoted "1e3" stays a string.
"""
from __future__ import annotations

import re
from typing import Any

import yaml

FLOAT_TAG = "tag:yaml.org,2002:float"
# What YAML 1.1's float pattern misses: an exponent without a dot or without a sign.
EXPONENT_FLOAT = re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9][0-9_]*)[eE][-+]?[0-9]+$")


class SafeLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # the C parser where libyaml is available
    """yaml.SafeLoader with YAML 1.2's exponent floats."""


SafeLoader.add_implicit_resolver(FLOAT_TAG, EXPONENT_FLOAT, list("-+0123456789."))


def load(text: str) -> Any:
    """YAML text to Python data, as yaml.safe_load would, exponent floats included."""
    return yaml.load(text, Loader=SafeLoader)
