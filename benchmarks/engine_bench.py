"""Engine benchmark: cost per task as pipelines deepen, and scaling to thousands of stages.

Part 1 (hops.simulate end to end, 1F1B with 5 % jitter): compute tasks/s per case and the
per-task cost ratio of the largest to the smallest case (flat cost per task means the
engine never rescans stages per event).
Part 2 (hops.engine.loop.run alone, one fresh process per case so peak RSS is the case's own):
1k, 4k and 16k stages x 16 microbatches: seconds, tasks/s and peak RSS, and the
ratio of per-stage cost 16k / 1k (linear in stages and links means ~1). Metrics are not
part of this: summarize() is timed separately in Part 1.
Part 3: a run above the documented ceiling (hops.engine.loop.MAX_STAGES) is refused up front;
the time to refuse is printed.
Run: python benchmarks/engine_bench.py [--repeats 3] [--skip-scaling]
"""
from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time

import hops

CASES = [(8, 64), (16, 256), (32, 512), (64, 1024)]
SCALING = [(1024, 16), (4096, 16), (16384, 16)]


def scenario(p: int, m: int, schedule: str = "1f1b") -> dict:
    return {
        "simulation": {"batches": 1, "microbatches": m, "seed": 7},
        "pipeline": {"schedule": schedule, "compute_jitter": 0.05,
                     "model": {"hidden_dim": 1024, "seq_len": 1024},
                     "stages": [{"device": f"g{i}", "weights_mb": 1000,
                                 "compute": {"mode": "analytical", "tflop": 0.06, "memory_mb": 128}}
                                for i in range(p)]},
        "hardware": {"devices": [{"id": f"g{i}", "gpu": "h100", "node": f"n{i // 8}"} for i in range(p)],
                     "interconnect": {"same_node": "nvlink", "cross_node": "infiniband"}},
    }


def one_engine_run(p: int, m: int) -> dict:
    """Time hops.engine.loop.run once in this process (called in a child process by main)."""
    from hops.engine import loop as engine
    from hops.model.hardware import Catalog

    catalog = Catalog.load()
    sc = hops.load_scenario(scenario(p, m), catalog)
    t0 = time.perf_counter()
    engine.run(sc, catalog)
    sec = time.perf_counter() - t0
    return {"sec": sec, "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--skip-scaling", action="store_true")
    ap.add_argument("--one", nargs=2, type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(one_engine_run(*args.one)))
        return
    per_task = []
    print("part 1: hops.simulate, 1F1B, 5 % jitter")
    print(f"{'case':>12} {'tasks':>8} {'median s':>9} {'tasks/s':>10} {'peak RSS MB':>12}")
    for p, m in CASES:
        sc = hops.load_scenario(scenario(p, m))
        times = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            hops.simulate(sc)
            times.append(time.perf_counter() - t0)
        med = statistics.median(times)
        tasks = 2 * p * m
        per_task.append(med / tasks)
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(f"{f'PP{p}x{m}':>12} {tasks:>8} {med:>9.3f} {tasks / med:>10.0f} {rss:>12.0f}")
    print(f"per-task cost ratio largest/smallest: {per_task[-1] / per_task[0]:.2f}")
    if args.skip_scaling:
        return

    print("\npart 2: hops.engine.loop.run alone, one process per case (median of repeats)")
    print(f"{'case':>12} {'tasks':>8} {'median s':>9} {'tasks/s':>10} {'peak RSS MB':>12}")
    per_stage = []
    for p, m in SCALING:
        runs = []
        for _ in range(args.repeats):
            out = subprocess.run([sys.executable, __file__, "--one", str(p), str(m)], capture_output=True,
                                 text=True, check=True)
            runs.append(json.loads(out.stdout))
        med = statistics.median(r["sec"] for r in runs)
        rss = max(r["rss_mb"] for r in runs)
        tasks = 2 * p * m
        per_stage.append(med / p)
        print(f"{f'PP{p}x{m}':>12} {tasks:>8} {med:>9.3f} {tasks / med:>10.0f} {rss:>12.0f}")
    print(f"per-stage cost ratio {SCALING[-1][0]} / {SCALING[0][0]} stages: {per_stage[-1] / per_stage[0]:.2f}")

    from hops.engine import loop as engine
    from hops.errors import ScenarioError
    from hops.model.hardware import Catalog

    over = engine.MAX_STAGES + 1
    t0 = time.perf_counter()
    try:  # refused when the scenario is read, or at the latest when the engine starts
        engine.run(hops.load_scenario(scenario(over, 2)), Catalog.load())
        print("part 3: NOT refused (bug)")
    except ScenarioError as exc:
        print(f"\npart 3: {over} stages refused in {1000 * (time.perf_counter() - t0):.2f} ms: {exc}")


if __name__ == "__main__":
    main()
