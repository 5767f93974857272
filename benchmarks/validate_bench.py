"""Validation speed: the full train split (36 fixtures x 3 variants), cold and warm, --jobs 1 vs 2.

The calibration loop re-validates after every model change, so what matters is
(a) a fresh CLI run with no parsed-trace cache (first use on a machine),
(b) a fresh CLI run with the on-disk trace cache (every later command), and
(c) an in-process re-validation after a catalog change (the gate / search loop),
where the measured sides are memoised and only the simulations run.
Budget (issue): the full train split in under 20 s on a 2-core machine.

Run: python benchmarks/validate_bench.py [--fixtures ROOT] [--repeats 3]
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from autoresearch import validate as vmod  # noqa: E402
from autoresearch.fixtures import resolve_root  # noqa: E402


def cli_seconds(root: Path, jobs: int, cache: Path) -> float:
    """Wall time of one CLI run in a fresh interpreter (imports included)."""
    env = {**os.environ, "HOPS_CACHE": str(cache)}
    t = time.perf_counter()
    subprocess.run([sys.executable, "-m", "autoresearch", "validate", "--split", "train", "--fixtures", str(root),
                    "--jobs", str(jobs), "--json", os.devnull], cwd=REPO, env=env, check=True,
                   stdout=subprocess.DEVNULL)
    return time.perf_counter() - t


def api_seconds(root: Path, jobs: int, cache: Path, *, memo: bool, overrides=None) -> float:
    if not memo:
        vmod.clear_memo()
    t = time.perf_counter()
    vmod.validate("train", root=root, jobs=jobs, cache_dir=cache, overrides=overrides)
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fixtures", default=None)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    root = resolve_root(args.fixtures)
    rows = []
    for jobs in (1, 2):
        res = {k: [] for k in ("cli cold", "cli warm", "api cold", "api warm disk", "api re-validate")}
        for _ in range(args.repeats):
            with tempfile.TemporaryDirectory() as tmp:
                cache = Path(tmp)
                res["cli cold"].append(cli_seconds(root, jobs, cache))
                res["cli warm"].append(cli_seconds(root, jobs, cache))
            with tempfile.TemporaryDirectory() as tmp:
                cache = Path(tmp)
                res["api cold"].append(api_seconds(root, jobs, cache, memo=False))
                res["api warm disk"].append(api_seconds(root, jobs, cache, memo=False))
                res["api re-validate"].append(api_seconds(root, jobs, cache, memo=True,
                                                          overrides=["stacks.fixture_megatron.k_floor_ms.l4=1.2"]))
        rows.append((jobs, {k: statistics.median(v) for k, v in res.items()}))
    print(f"train split, {args.repeats} repeats, median seconds, {os.cpu_count()} cores")
    names = list(rows[0][1])
    print(f"{'jobs':>4} " + " ".join(f"{n:>16}" for n in names))
    for jobs, r in rows:
        print(f"{jobs:>4} " + " ".join(f"{r[n]:>16.2f}" for n in names))


if __name__ == "__main__":
    main()
