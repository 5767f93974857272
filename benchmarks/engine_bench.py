"""Engine scaling benchmark: 1F1B with jitter at growing pipeline depth and microbatch count.

Prints compute tasks/s and peak RSS per case, and the per-task cost ratio of the largest to
the smallest case (flat cost per task means the engine never rescans stages per event).
Run: python benchmarks/engine_bench.py [--repeats 3]
"""
from __future__ import annotations

import argparse
import resource
import statistics
import time

import hops

CASES = [(8, 64), (16, 256), (32, 512), (64, 1024)]


def scenario(p: int, m: int) -> dict:
    return {
        "simulation": {"batches": 1, "microbatches": m, "seed": 7},
        "pipeline": {"schedule": "1f1b", "compute_jitter": 0.05, "model": {"hidden_dim": 1024, "seq_len": 1024},
                     "stages": [{"device": f"g{i}", "weights_mb": 1000,
                                 "compute": {"mode": "analytical", "tflop": 0.06, "memory_mb": 128}}
                                for i in range(p)]},
        "hardware": {"devices": [{"id": f"g{i}", "gpu": "h100", "node": f"n{i // 8}"} for i in range(p)],
                     "interconnect": {"same_node": "nvlink", "cross_node": "infiniband"}},
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    per_task = []
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


if __name__ == "__main__":
    main()
