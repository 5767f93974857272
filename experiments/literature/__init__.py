"""Published pipeline-schedule measurements as HOPS scenarios (python -m experiments.literature)."""
