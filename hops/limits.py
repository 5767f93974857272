"""Sizes HOPS refuses up front, so a scenario too big to simulate fails in a second, not after an hour.

The ceiling is where the measured cost (benchmarks/scale_bench.py: wall time and
peak memory of a full simulate + summary at 1k, 4k and 16k stages) stops being
something one machine does interactively. Raise it together with that benchmark.
"""
from __future__ import annotations

from .errors import ScenarioError

MAX_STAGES = 16_384


def check_stage_count(n: int, source: str | None = None) -> None:
    """Refuse a pipeline deeper than MAX_STAGES (called before the stages are even parsed)."""
    if n > MAX_STAGES:
        raise ScenarioError("pipeline.stages", f"{n} stages is above the ceiling of {MAX_STAGES} stages HOPS "
                                               f"simulates (measured in benchmarks/scale_bench.py); "
                                               f"expected at most {MAX_STAGES}", source)


def check_scale(scenario) -> None:
    """Refuse a Scenario too big to simulate before any simulation work starts."""
    check_stage_count(scenario.n_stages)
