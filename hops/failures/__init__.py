"""Failures, stragglers and recovery: the scenario's `failure` section and the long-horizon model.

`parse_failure` validates the section (docs/failures.md has the schema);
`simulate_horizon` advances a job over weeks of wall clock in iteration units,
fault event by fault event; `summary_block` is the "failures" block of
summary.json; `straggler_factors` gives per-device slowdowns for the detailed engine, and
`replica_stragglers` the same drawn over every data-parallel replica of the pipeline.
"""
from __future__ import annotations

from hops.failures.config import FailureConfig, parse_failure
from hops.failures.horizon import (
    FaultEvent,
    HorizonResult,
    cluster_units,
    fault_rng,
    job_mtbf_hours,
    replica_stragglers,
    resolve_device_mtbf,
    simulate_horizon,
    straggler_factors,
    summary_block,
    young_daly_interval_minutes,
)

__all__ = [
    "FailureConfig", "FaultEvent", "HorizonResult", "cluster_units", "fault_rng", "job_mtbf_hours",
    "parse_failure", "replica_stragglers", "resolve_device_mtbf", "simulate_horizon", "straggler_factors", "summary_block",
    "young_daly_interval_minutes",
]
