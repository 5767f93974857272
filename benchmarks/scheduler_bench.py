"""Configure-time cost of every built-in scheduler on a 16-stage, 64-microbatch pipeline.

The target is under 1 s per configure (issue 11): a scheduler's search runs once per
simulation, before the first microbatch. Stage times are heterogeneous (drawn from a fixed
seed) so the search has real choices; hetero_search's and zb_auto's plan caches are cleared
between repeats.
Run: python benchmarks/scheduler_bench.py [--repeats 5] [--stages 16] [--microbatches 64]
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np

from hops.schedulers import PipelineMeta, available, resolve_scheduler
from hops.schedulers import hetero_search, zb_auto


def meta(p: int, m: int, seed: int = 0, v: int = 1) -> PipelineMeta:
    """p stages; with v > 1, p * v virtual stages (chunks of half the time) over the p devices.

    The one-chunk meta can also lay itself out as ZB-V's V (``layout_for``, as the engine's
    does: each chunk half its stage's times, messages at the link's time), so hetero_search's
    configure includes its search over the V placement, as it does in a simulation."""
    rng = np.random.default_rng(seed)
    n = p * v
    f = rng.uniform(5, 15, n) / v
    b = f * rng.uniform(0.9, 1.2, n)
    w = f * rng.uniform(0.6, 1.0, n)
    bw = b + w * 0.9
    x = rng.uniform(0.2, 1.0, n).tolist()

    def layout_for(placement) -> PipelineMeta:
        k2 = len(placement)
        dev = [d for d, _ in placement]
        xfer = [0.0 if k == k2 - 1 or dev[k] == dev[k + 1] else x[min(dev[k], dev[k + 1])] for k in range(k2)]
        half = lambda a: [float(a[d]) / 2 for d in dev]  # noqa: E731
        return PipelineMeta(k2, m, half(f), half(b), half(w), half(bw), [f"d{d}" for d in dev], xfer,
                            stage_of=dev, virtual_stages=k2 // p)

    return PipelineMeta(n, m, f.tolist(), b.tolist(), w.tolist(), bw.tolist(),
                        [f"d{i % p}" for i in range(n)], x,
                        stage_of=[i % p for i in range(n)] if v > 1 else (), virtual_stages=v,
                        layout_for=layout_for if v == 1 else None)


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
            zb_auto._PLANS.clear()
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
