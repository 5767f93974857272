"""A complete, tiny fixture root on disk (scenario, stage map, trace, link bench), for tests that need one."""
from __future__ import annotations

import json
from pathlib import Path

T0 = 1_700_000_000_000_000_000
SCENARIO = """
simulation: {batches: 2, microbatches: 2, seed: 1}
pipeline:
  schedule: 1f1b
  activation_mb: 1.0
  stages:
    - {device: gpu_a, weights_mb: 10, compute: {mode: analytical, tflop: 0.01, memory_mb: 10}}
    - {device: gpu_b, weights_mb: 10, compute: {mode: analytical, tflop: 0.01, memory_mb: 10}}
hardware:
  devices: [{id: gpu_a, gpu: a10g, node: n0}, {id: gpu_b, gpu: a10g, node: n1}]
  interconnect: {same_node: pcie, cross_node: ethernet}
optimizer: {enabled: false}
failure: {enabled: false}
output: {}
"""


def _event(stage, it, mb, phase, start_ms, dur_ms):
    dev = ("gpu_a", "gpu_b")[stage]
    return {"stage": stage, "iteration": it, "microbatch": mb, "event_type": "compute", "phase": phase,
            "start_wall_ns": T0 + int(start_ms * 1e6), "end_wall_ns": T0 + int((start_ms + dur_ms) * 1e6),
            "device_id": dev}


def make_fixture(root: Path, split: str, fid: str, *, link_bench: bool = True) -> Path:
    """A 2-stage, 2-microbatch, 4-iteration fixture at ROOT/SPLIT/cluster_results/FID."""
    d = root / split / "cluster_results" / fid
    (d / "megatron_trace").mkdir(parents=True)
    (d / "hops.base.yaml").write_text(SCENARIO)
    (d / "hops_trace_map.json").write_text(json.dumps({"stages": {"0": "gpu_a", "1": "gpu_b"}}))
    ranks = {0: [], 1: []}
    t = 0.0
    for it in range(4):
        for mb in range(2):
            ranks[0].append(_event(0, it, mb, "FORWARD", t, 1.0))
            ranks[1].append(_event(1, it, mb, "FORWARD", t + 1.5, 1.0))
            ranks[1].append(_event(1, it, mb, "BACKWARD", t + 2.5, 2.0))
            ranks[0].append(_event(0, it, mb, "BACKWARD", t + 5.0, 2.0))
            t += 8.0
        for s in (0, 1):
            ranks[s].append(_event(s, it, 1, "OPTIMIZER", t + 3.0, 1.0))
        t += 10.0
    for r, evs in ranks.items():
        (d / "megatron_trace" / f"rank{r}.jsonl").write_text("\n".join(json.dumps(e) for e in evs) + "\n")
    if link_bench:
        (d / "calibration" / "link_bench").mkdir(parents=True)
        (d / "calibration" / "link_bench" / "pair_0_1.jsonl").write_text(
            json.dumps({"rank": 0, "size_mb": 1, "p50_ms": 0.5}) + "\n")
    return d
