"""Wall time of the long-horizon failure model: 16,384 GPUs x 54 days.

    python benchmarks/failure_horizon_bench.py [--repeats 7]

Two configurations: the Llama-3-405B-like scenario (18 per-component processes,
~466 interruptions) and a "busy" one that adds Weibull per-GPU failures, link
stalls, link degradation and throttling episodes (tens of thousands of events).
Prints the median (and min/max) over several runs; the work grows with the
number of fault events, not with GPUs x iterations (~690k iterations here).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hops.failures import parse_failure, simulate_horizon  # noqa: E402


def configs():
    doc = yaml.safe_load((ROOT / "conf/scenario/llama3_405b_54d.yaml").read_text())
    llama = parse_failure(doc["failure"])
    busy = dict(doc["failure"])
    busy["devices"] = {"count": 16384, "per_node": 8, "mtbf_hours": 200000, "distribution": "weibull",
                       "weibull_shape": 0.8}
    busy["links"] = {"count": 16384, "mtbf_hours": 500000, "repair_minutes": 20,
                     "degradation": {"rate_per_hour": 0.0005, "bandwidth_factor": 0.5, "duration_minutes": 10}}
    busy["stragglers"] = {"drawn": {"probability": 0.001, "factor_range": [1.05, 1.3]},
                          "throttling": {"rate_per_hour": 0.0005, "factor": 1.3, "duration_minutes": 5}}
    return {"llama3_405b_54d": llama, "busy (all fault kinds)": parse_failure(busy)}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args(argv)
    for name, cfg in configs().items():
        times, res = [], None
        for k in range(args.repeats):
            t = time.perf_counter()
            res = simulate_horizon(cfg, iteration_ms=6740.0, n_devices=16, seed=405 + k)
            times.append(time.perf_counter() - t)
        events = sum(res.counts_by_kind.values())
        print(f"{name}: 16,384 GPUs x 54 days ({res.iterations_without_faults:,.0f} iterations, "
              f"~{events:,} fault events): median {statistics.median(times):.3f} s "
              f"(min {min(times):.3f}, max {max(times):.3f}, {args.repeats} runs), goodput {res.goodput_ratio:.1%}")


if __name__ == "__main__":
    main()
