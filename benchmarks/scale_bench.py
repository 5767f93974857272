"""Scale benchmark: a full simulate + summary + outputs at 1k, 4k and 16k pipeline stages.

Each case runs in its own process, so the peak RSS printed is that case's own. Per case:
median wall time of load_scenario, simulate (engine + metrics + summary), summarize alone
(the metrics on the finished Timeline) and Result.write (summary.json + events.csv), peak
RSS, and the time and memory per stage. Cost per stage that stays flat from 1k to 16k
means linear scaling; the ratios largest/smallest are printed last. Then a scenario one
stage above hops.engine.loop.MAX_STAGES is submitted, to show it is refused up front (time to
the one-line error).

Run: python benchmarks/scale_bench.py [--repeats 3] [--stages 1024 4096 16384] [--microbatches 4]

Measured 2026-12-03 on the shared 2-core dev box (noisy; medians of 3):
  stages   simulate s  summarize s  write s  peak RSS MB
    1024        0.39        0.069     0.29       60
    4096        1.86        0.25      1.07      121
   16384        5.83        1.28      5.17      374      (16x stages: simulate 15x, RSS 6.2x)
Before the per-device-pair link names left hops.metrics and the engine setup went linear
(main at 3d7a0f2): 1024 stages 1.08 s / 0.35 s / 129 MB, 4096 stages 15.5 s / 6.0 s /
1241 MB; 16384 stages would need a table of 32766^2 link names (~1e9 strings).
Not covered here: python -m hops.run adds YAML parsing, OmegaConf copies of the scenario
and, with output.plots, the dashboard, which dominate its wall time on deep pipelines.
"""
from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time


def scenario(p: int, m: int, batches: int = 1) -> dict:
    """p stages, one H100 per stage, 8 per node (NVLink inside, InfiniBand between), 1F1B with jitter."""
    return {
        "simulation": {"batches": batches, "microbatches": m, "seed": 7},
        "pipeline": {"schedule": "1f1b", "compute_jitter": 0.05, "model": {"hidden_dim": 1024, "seq_len": 1024},
                     "stages": [{"device": f"g{i}", "weights_mb": 1000,
                                 "compute": {"mode": "analytical", "tflop": 0.06, "memory_mb": 128}}
                                for i in range(p)]},
        "hardware": {"devices": [{"id": f"g{i}", "gpu": "h100", "node": f"n{i // 8}"} for i in range(p)],
                     "interconnect": {"same_node": "nvlink", "cross_node": "infiniband"}},
        "optimizer": {"enabled": False}, "failure": {"enabled": False}, "output": {},
    }


def _timed(fn, repeats: int):
    times, out = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def run_case(p: int, m: int, repeats: int) -> dict:
    import hops
    from hops.metrics import summarize

    doc = scenario(p, m)
    t_load, sc = _timed(lambda: hops.load_scenario(doc), repeats)
    t_sim, res = _timed(lambda: hops.simulate(sc), repeats)
    t_sum, _ = _timed(lambda: summarize(res.timeline), repeats)
    with tempfile.TemporaryDirectory() as out:
        t_write, _ = _timed(lambda: res.write(out), repeats)
    return {"stages": p, "events": len(res.timeline), "load_s": t_load, "simulate_s": t_sim, "summarize_s": t_sum,
            "write_s": t_write, "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "links_in_summary": len(res.summary["utilization"]["per_link"])}


def refuse_case(p: int) -> dict:
    import hops
    from hops.errors import HopsError

    doc = scenario(p, 1)
    t0 = time.perf_counter()
    try:
        hops.simulate(doc)
        message = None
    except HopsError as exc:
        message = str(exc)
    return {"stages": p, "refused_after_s": time.perf_counter() - t0, "message": message}


def _child(args: list[str]) -> dict:
    proc = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"case {args} failed:\n{proc.stderr}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--stages", type=int, nargs="+", default=[1024, 4096, 16384])
    ap.add_argument("--microbatches", type=int, default=4)
    ap.add_argument("--case", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--refuse", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.case:
        print(json.dumps(run_case(args.case, args.microbatches, args.repeats)))
        return
    if args.refuse:
        print(json.dumps(refuse_case(args.refuse)))
        return

    from hops.engine.loop import MAX_STAGES

    print(f"1F1B, {args.microbatches} microbatches, 1 batch, median of {args.repeats}; one process per case")
    print(f"{'stages':>7} {'events':>8} {'load s':>7} {'simulate s':>10} {'summarize s':>11} {'write s':>8} "
          f"{'RSS MB':>7} {'ms/stage':>9} {'KB/stage':>9} {'links':>6}")
    rows = []
    for p in args.stages:
        r = _child(["--case", str(p), "--microbatches", str(args.microbatches), "--repeats", str(args.repeats)])
        rows.append(r)
        print(f"{p:>7} {r['events']:>8} {r['load_s']:>7.3f} {r['simulate_s']:>10.3f} {r['summarize_s']:>11.3f} "
              f"{r['write_s']:>8.3f} {r['rss_mb']:>7.0f} {1000 * r['simulate_s'] / p:>9.3f} "
              f"{1024 * r['rss_mb'] / p:>9.1f} {r['links_in_summary']:>6}", flush=True)
    if len(rows) > 1:
        a, b = rows[0], rows[-1]
        scale = b["stages"] / a["stages"]
        print(f"{b['stages']} vs {a['stages']} stages ({scale:.0f}x): simulate {b['simulate_s'] / a['simulate_s']:.1f}x, "
              f"summarize {b['summarize_s'] / a['summarize_s']:.1f}x, write {b['write_s'] / a['write_s']:.1f}x, "
              f"peak RSS {b['rss_mb'] / a['rss_mb']:.1f}x (linear = {scale:.0f}x)")
    r = _child(["--refuse", str(MAX_STAGES + 1)])
    print(f"ceiling hops.engine.loop.MAX_STAGES = {MAX_STAGES}: {r['stages']} stages refused after "
          f"{r['refused_after_s']:.2f} s: {r['message']}")


if __name__ == "__main__":
    main()
