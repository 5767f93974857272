"""Configure-time cost of every built-in scheduler on a 16-stage, 64-microbatch pipeline.

The target is under 1 s per configure (issue 11): a scheduler's search runs once per
simulation, before the first microbatch. Stage times are heterogeneous (drawn from a fixed
seed) so the search has real choices; hetero_search's plan cache is cleared between repeats.
Run: python benchmarks/scheduler_bench.py [--repeats 5] [--stages 16] [--microbatches 64]
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np

from hops.schedulers import PipelineMeta, available, resolve_scheduler
from hops.schedulers import hetero_search


def meta(p: int, m: int, seed: int = 0, v: int = 1) -> PipelineMeta:
    """p stages; with v > 1, p * v virtual stages (chunks of half the time) over the p devices."""
    rng = np.random.default_rng(seed)
    n = p * v
    f = rng.uniform(5, 15, n) / v
    b = f * rng.uniform(0.9, 1.2, n)
    w = f * rng.uniform(0.6, 1.0, n)
    return PipelineMeta(n, m, f.tolist(), b.tolist(), w.tolist(), (b + w * 0.9).tolist(),
                        [f"d{i % p}" for i in range(n)], rng.uniform(0.2, 1.0, n).tolist(),
                        stage_of=[i % p for i in range(n)] if v > 1 else (), virtual_stages=v)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--stages", type=int, default=16)
    ap.add_argument("--microbatches", type=int, default=64)
    args = ap.parse_args()
    print(f"configure time, {args.stages} stages x {args.microbatches} microbatches (median of {args.repeats})")
    for name in available():
        wall, cpu = [], []
        mt = meta(args.stages, args.microbatches)
        try:
            resolve_scheduler(name).placement(args.stages, 1)
        except ValueError:  # a chunked schedule (zb_v): 2 chunks per stage
            mt = meta(args.stages, args.microbatches, v=2)
        for _ in range(args.repeats):
            hetero_search._CACHE.clear()
            sched = resolve_scheduler(name)()
            t0, c0 = time.perf_counter(), time.process_time()
            sched.configure(mt)
            wall.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
        med, cmed = statistics.median(wall), statistics.median(cpu)
        print(f"{name:>18} {1000 * med:9.1f} ms wall {1000 * cmed:9.1f} ms CPU  {'OK' if med < 1.0 else 'OVER 1 s'}")
    print(f"(load average while measuring: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)")


if __name__ == "__main__":
    main()
