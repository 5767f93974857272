"""Render-time benchmark for the plots and the Chrome trace, on synthetic pipelines.

Why synthetic: plotting cost depends only on the number of rows and bars, and a
generated 1F1B/GPipe layout (heterogeneous stage speeds, serialized links, one
failure) exercises every drawing path without needing the engine or a fixture.

    python benchmarks/plot_bench.py                 # 64 stages x 1024 microbatches
    python benchmarks/plot_bench.py --stages 16 --microbatches 200 --out /tmp/plots
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from hops.timeline import Timeline


def _order(schedule: str, s: int, n_st: int, m: int) -> list[tuple[str, int]]:
    if schedule == "gpipe":
        return [("F", i) for i in range(m)] + [("B", i) for i in reversed(range(m))]
    warm = min(n_st - s - 1, m)
    ops = [("F", i) for i in range(warm)]
    f, b = warm, 0
    while b < m:
        if f < m:
            ops.append(("F", f))
            f += 1
        ops.append(("B", b))
        b += 1
    return ops


def synthetic_timeline(stages: int, microbatches: int, iterations: int = 1, schedule: str = "1f1b",
                       seed: int = 0, failure: bool = True) -> Timeline:
    """A dependency-correct pipeline run: F/B per stage in schedule order, transfers
    serialized per link, optimizer + all-reduce per stage after each iteration."""
    rng = np.random.default_rng(seed)
    kinds = ["h100", "a100", "l40s", "l4"]
    speed = {"h100": 1.0, "a100": 1.6, "l40s": 2.2, "l4": 3.5}
    devices = [f"{kinds[(s * len(kinds)) // stages]}_node{s}_gpu0" for s in range(stages)]
    f_ms = np.array([speed[d.split("_")[0]] for d in devices]) * 4.0
    xfer_ms = 0.6
    cols = {k: [] for k in ("kind", "stage", "device", "microbatch", "phase", "start_ms", "end_ms",
                            "src", "dst", "iteration")}

    def add(kind, stage, dev, mb, ph, s, e, src="", dst="", it=0):
        for k, v in zip(cols, (kind, stage, dev, mb, ph, s, e, src, dst, it)):
            cols[k].append(v)

    t_iter = 0.0
    for it in range(iterations):
        m0 = it * microbatches
        orders = [_order(schedule, s, stages, microbatches) for s in range(stages)]
        ptr = [0] * stages
        free = [t_iter] * stages
        link_free: dict[tuple[int, int], float] = {}
        arrive_f = np.full((stages, microbatches), np.nan)   # activation arrival at stage s
        arrive_b = np.full((stages, microbatches), np.nan)   # gradient arrival at stage s
        arrive_f[0, :] = t_iter
        done = 0
        total = 2 * stages * microbatches
        while done < total:
            progressed = False
            for s in range(stages):
                while ptr[s] < len(orders[s]):
                    ph, m = orders[s][ptr[s]]
                    ready = arrive_f[s, m] if ph == "F" else arrive_b[s, m]
                    if np.isnan(ready):
                        break
                    dur = f_ms[s] * (1.0 if ph == "F" else 2.0) * rng.uniform(0.95, 1.08)
                    st = max(free[s], ready)
                    en = st + dur
                    free[s] = en
                    add("compute", s, devices[s], m0 + m, ph, st, en, it=it)
                    nxt = s + 1 if ph == "F" else s - 1
                    if ph == "F" and s == stages - 1:
                        arrive_b[s, m] = en
                    elif 0 <= nxt < stages:
                        key = (s, nxt)
                        ts = max(en, link_free.get(key, 0.0))
                        te = ts + xfer_ms * rng.uniform(0.9, 1.3)
                        link_free[key] = te
                        add("transfer", s, devices[s], m0 + m, ph, ts, te, devices[s], devices[nxt], it)
                        (arrive_f if ph == "F" else arrive_b)[nxt, m] = te
                    ptr[s] += 1
                    done += 1
                    progressed = True
            if not progressed:
                raise RuntimeError("schedule deadlocked")
        end = max(free)
        for s in range(stages):
            add("allreduce", s, devices[s], -1, "", end, end + 1.5, it=it)
            add("optimizer", s, devices[s], -1, "OPT", end + 1.5, end + 1.5 + 2.0 + f_ms[s] * 0.2, it=it)
        t_iter = end + 1.5 + 2.0 + float(f_ms.max()) * 0.2 + 5.0
    if failure and stages > 1:
        s = stages // 2
        t = t_iter * 0.4
        add("failure", s, devices[s], -1, "", t, t + max(t_iter * 0.01, 1.0), it=-1)
    return Timeline.from_rows(cols, stage_devices=devices, microbatches_per_iteration=microbatches,
                              samples_per_microbatch=8, meta={"schedule": schedule, "seed": seed})


def synthetic_summary(tl: Timeline, seed: int = 0) -> dict:
    """summarize() plus the simulator-only fields (memory, contention) filled with plausible values."""
    from hops.metrics import summarize

    rng = np.random.default_rng(seed)
    summary = summarize(tl)
    summary.update(schedule=tl.meta.get("schedule", "?"), seed=seed)
    devs = sorted(set(tl.stage_devices))
    cap = {d: (80.0 if d.startswith(("h100", "a100")) else 48.0 if d.startswith("l40s") else 24.0) * 1024
           for d in devs}
    summary["memory_capacity_mb"] = cap
    summary["peak_memory_mb"] = {d: float(cap[d] * rng.uniform(0.4, 1.1)) for d in devs}
    summary["link_contention"] = {
        k: {"transfers": 100, "contended": int(rng.integers(0, 60)), "wait_ms": float(rng.uniform(0, 50))}
        for k in summary["utilization"]["per_link"]
    }
    return summary


def main() -> None:
    from hops.outputs.chrome_trace import write_chrome_trace
    from hops.outputs.plots import plot_dashboard, plot_timeline

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stages", type=int, default=64)
    ap.add_argument("--microbatches", type=int, default=1024)
    ap.add_argument("--iterations", type=int, default=1)
    ap.add_argument("--schedule", default="1f1b", choices=("1f1b", "gpipe"))
    ap.add_argument("--out", default="/tmp/hops_plot_bench")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)

    t = time.perf_counter()
    tl = synthetic_timeline(a.stages, a.microbatches, a.iterations, a.schedule)
    summary = synthetic_summary(tl)
    print(f"generated {len(tl)} events ({a.stages} stages x {a.microbatches} mb) "
          f"in {time.perf_counter() - t:.2f}s")
    for name, fn in (("timeline.png", lambda p: plot_timeline(tl, p)),
                     ("dashboard.png", lambda p: plot_dashboard(summary, tl, p)),
                     ("trace.json", lambda p: write_chrome_trace(tl, p))):
        t = time.perf_counter()
        fn(out / name)
        print(f"{name:14s} {time.perf_counter() - t:6.2f}s  {(out / name).stat().st_size / 1e6:7.2f} MB")


if __name__ == "__main__":
    main()
