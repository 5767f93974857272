"""Scenario builders shared by the specification tests (plain dicts, as a user would write)."""
from __future__ import annotations


def pipeline(p: int, m: int, *, f: float = 2.0, b: float = 4.0, schedule: str = "1f1b", hop_ms: float = 0.0,
             batches: int = 1, seed: int = 1, jitter: float = 0.0, split=None, per_stage=None) -> dict:
    """p stages on p devices with constant (or per-stage) F/B times; every hop costs exactly hop_ms."""
    stages = []
    for i in range(p):
        fi, bi = per_stage[i] if per_stage else (f, b)
        comp = {"mode": "distribution", "forward": {"kind": "constant", "ms": fi}}
        if split:
            comp["backward_b"] = {"kind": "constant", "ms": bi * split}
            comp["backward_w"] = {"kind": "constant", "ms": bi * (1 - split)}
        else:
            comp["backward"] = {"kind": "constant", "ms": bi}
        stages.append({"device": f"g{i}", "weights_mb": 100, "compute": comp})
    links = [{"src": f"g{i}", "dst": f"g{j}", "latency_ms": hop_ms, "bandwidth_gbps": 1e12, "jitter": jitter}
             for i in range(p) for j in (i - 1, i + 1) if 0 <= j < p]
    return {
        "simulation": {"batches": batches, "microbatches": m, "seed": seed},
        "pipeline": {"schedule": schedule, "activation_mb": 1.0, "stages": stages},
        "hardware": {"devices": [{"id": f"g{i}", "gpu": "a100", "node": f"n{i}"} for i in range(p)],
                     "interconnect": {"same_node": "nvlink", "cross_node": "infiniband"}},
        "optimizer": {"enabled": False},
        "failure": {"enabled": False},
        "output": {},
        "overrides": {"links": links},
    }
