"""Cross-check the trace importer + hops.metrics against megatron_summary.json.

An importer bug would poison every score downstream, so we compare with an
independent tool. Raw disagreement is expected (the tools define the window
and "busy" differently); the `repro_*` columns recompute the other tool's
numbers from our Timeline under its definitions. If those match to ~1e-9 the
import is event-for-event right and the gap is purely definitional.

    python -m experiments.importer_crosscheck --fixtures ROOT --split train
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

from hops.metrics import summarize, union_length
from hops.traces import load_trace
from hops.traces.guard import check_path, check_split, names_held_out_split


def fixture_root(arg: str | None) -> Path:
    return Path(arg or os.environ.get("HOPS_FIXTURES") or "fixtures")


def megatron_definitions(tl) -> tuple[float, float]:
    """The other tool's throughput and bubble, reverse-engineered (see fixtures/README.md)."""
    compute = tl.kind == "compute"
    busy_kinds = compute | (tl.kind == "optimizer")
    n_mb = len(np.unique(tl.microbatch[compute]))
    compute_span = tl.end_ms[compute].max() - tl.start_ms[compute].min()
    trace_span = tl.end_ms.max() - tl.start_ms.min()
    busy = sum(union_length(tl.start_ms[busy_kinds & (tl.stage == s)], tl.end_ms[busy_kinds & (tl.stage == s)])
               for s in range(tl.n_stages))
    return n_mb / compute_span * 1000.0, 1.0 - busy / (tl.n_stages * trace_span)


def crosscheck(root: Path, split: str, cache_dir=None) -> pd.DataFrame:
    check_split(split)
    check_path(root / split / "cluster_results")  # a split directory symlinked into the held-out split
    rows = []
    for d in sorted((root / split / "cluster_results").glob("*")):
        if not (d / "megatron_trace").is_dir():
            continue
        tl = load_trace(d, cache_dir=cache_dir)
        ours = summarize(tl)
        ref = json.loads((d / "megatron_summary.json").read_text())
        repro_thr, repro_bub = megatron_definitions(tl)
        thr, ref_thr = ours["throughput"]["microbatches_per_s"], ref["throughput"]["per_s"]
        opt = tl.kind == "optimizer"
        rows.append({
            "fixture": d.name,
            "mb_per_s": thr, "ref_mb_per_s": ref_thr, "thr_diff_%": (thr - ref_thr) / ref_thr * 100,
            "bubble": ours["bubble_ratio"], "ref_bubble": ref["bubble_ratio"],
            "bubble_diff_pp": (ours["bubble_ratio"] - ref["bubble_ratio"]) * 100,
            "repro_thr_diff_%": (repro_thr - ref_thr) / ref_thr * 100,
            "repro_bubble_diff_pp": (repro_bub - ref["bubble_ratio"]) * 100,
            "warmup_dropped": ours["window"]["warmup_iterations_dropped"],
            "tail_ms": tl.end_ms.max() - tl.end_ms[tl.kind == "compute"].max(),
            "opt_share_%": float(np.sum(tl.end_ms[opt] - tl.start_ms[opt])) / (tl.n_stages * ours["makespan_ms"]) * 100,
        })
    return pd.DataFrame(rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fixtures", help="fixture root (default: $HOPS_FIXTURES, else ./fixtures)")
    ap.add_argument("--split", default="train")
    ap.add_argument("--cache-dir", default=None)
    args = ap.parse_args(argv)
    if names_held_out_split(args.split):  # test, test/, ./test, train/../test
        print(f"refusing to read the guarded '{args.split}' split", file=sys.stderr)
        return 2
    t = time.perf_counter()
    df = crosscheck(fixture_root(args.fixtures), args.split, args.cache_dir)
    elapsed = time.perf_counter() - t
    if df.empty:
        print("no fixtures found", file=sys.stderr)
        return 1
    with pd.option_context("display.width", 250, "display.max_rows", None, "display.max_columns", None, "display.float_format", "{:.3f}".format):
        print(df.set_index("fixture"))
    thr = df["thr_diff_%"].abs()
    print(f"\n{len(df)} fixtures, {elapsed:.2f} s (import + summarize)")
    print(f"throughput within 1%: {int((thr <= 1).sum())}/{len(df)}; |diff| mean {thr.mean():.2f}% "
          f"median {thr.median():.2f}% max {thr.max():.2f}% (ours is {'lower' if df['thr_diff_%'].max() < 0 else 'mixed'})")
    bub = df["bubble_diff_pp"].abs()
    print(f"bubble |diff| mean {bub.mean():.2f} pp, max {bub.max():.2f} pp")
    print(f"under megatron_summary's own definitions: max |throughput diff| {df['repro_thr_diff_%'].abs().max():.2e}%, "
          f"max |bubble diff| {df['repro_bubble_diff_pp'].abs().max():.2e} pp")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
