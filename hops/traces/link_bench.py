"""Point-to-point link benchmarks -> per-link latency/bandwidth overrides.

Model: time_ms = latency_ms + size_mb / bandwidth_gbps (MB per ms is GB/s, with
MB the same unit as the scenario's *_mb fields, so the simulator reproduces the
benchmark exactly when it applies the fit to a message of the same size).

Only the sender's view (rank 0) is fitted: the receiver's clock starts when it
posts its receive, which folds the sender's launch skew into its timings (its
rows show much larger spread for the same message).

With several sizes, ordinary least squares of p50 on size. Clamps, and why:
- a negative intercept is a fitting artefact (protocol switches between small
  and large messages bend the curve); a link cannot deliver before it starts,
  so α is clamped to 0 and β refitted through the origin on the same points;
- a non-positive slope means the sizes were too close for the noise; then β is
  the mean of size/time over the points (the latency-free throughput), which
  is always positive and never claims more speed than any measurement showed.
With one size α and β cannot be separated; we set α = 0 and β = size/p50 so the
single measured point is reproduced exactly. That attributes all time to
bandwidth, i.e. it is pessimistic for smaller messages and exact at that size.
"""
from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np

from hops.errors import TraceError, echo
from hops.traces.guard import check_fixture_dir, check_path
from hops.traces.megatron import json_lines, stage_map

SENDER_RANK = 0
PAIR_RE = re.compile(r"pair_(\d+)_(\d+)\.jsonl$")


NUMBER_FIELDS = ("size_mb", "p50_ms", "mean_ms", "p99_ms", "min_ms", "max_ms", "std_ms")
BENCH_KEYS = ('"p50_ms"', '"size_mb"')


def _sender_points(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """(size_mb, p50_ms) for the sender rank, one point per size.

    Every row is checked, the receiver's too: a NaN, an infinity or a negative time
    anywhere in the file means the benchmark is not trustworthy as a whole.
    """
    points: dict[float, tuple[float, int]] = {}
    for lineno, rec in json_lines(path, "JSON benchmark row", BENCH_KEYS):
        where = f"{path}:{lineno}"
        if not isinstance(rec, dict):
            raise TraceError(f"{where}: row is {type(rec).__name__}, expected a JSON object")
        for name in ("rank", "size_mb", "p50_ms"):
            if name not in rec:
                raise TraceError(f"{where}: missing field {echo(name)}, expected rank, size_mb and p50_ms")
        if not isinstance(rec["rank"], int) or isinstance(rec["rank"], bool) or rec["rank"] < 0:
            raise TraceError(f"{where}: field 'rank' is {echo(rec['rank'])}, expected an integer >= 0")
        for name in NUMBER_FIELDS:
            if name not in rec:
                continue
            val = rec[name]
            if not isinstance(val, (int, float)) or isinstance(val, bool):
                raise TraceError(f"{where}: field {echo(name)} is {echo(val)}, expected a number")
            if not math.isfinite(val) or val < 0:
                raise TraceError(f"{where}: field {echo(name)} is {echo(val)}, expected a finite number >= 0")
        if rec["size_mb"] <= 0 or rec["p50_ms"] <= 0:
            raise TraceError(f"{where}: size_mb={rec['size_mb']} p50_ms={rec['p50_ms']}, expected both > 0")
        if rec["rank"] != SENDER_RANK:
            continue
        size = float(rec["size_mb"])
        if size in points:
            raise TraceError(f"{where}: size_mb={rec['size_mb']} of rank {SENDER_RANK} already on line "
                             f"{points[size][1]}, expected one row per size and rank")
        points[size] = (float(rec["p50_ms"]), lineno)
    if not points:
        raise TraceError(f"{path}: no rows from sender rank {SENDER_RANK}, expected at least one size_mb/p50_ms row")
    sizes = np.array(sorted(points))
    return sizes, np.array([points[s][0] for s in sizes])


def fit_alpha_beta(sizes: np.ndarray, times: np.ndarray) -> tuple[float, float, str]:
    """(latency_ms, bandwidth_gbps, method) for time = α + size/β, physically clamped."""
    if len(sizes) == 1:
        return 0.0, float(sizes[0] / times[0]), "single_size_zero_latency"
    slope, alpha = np.polyfit(sizes, times, 1)
    if slope > 0 and alpha >= 0:
        return float(alpha), float(1.0 / slope), "least_squares"
    if slope > 0:
        through_origin = float(np.dot(sizes, times) / np.dot(sizes, sizes))
        return 0.0, 1.0 / through_origin, "least_squares_zero_latency"
    return 0.0, float(np.mean(sizes / times)), "mean_throughput"


def bench_files(fixture_dir: str | Path, token: object = None) -> list[Path]:
    """The fixture's pair_<i>_<j>.jsonl files in pair order; [] when it has no link benchmark."""
    check_fixture_dir(fixture_dir, token)
    bench = Path(fixture_dir) / "calibration" / "link_bench"
    found = []
    for path in bench.glob("pair_*_*.jsonl"):
        check_path(path, token)
        m = PAIR_RE.search(path.name)
        if not m:
            raise TraceError(f"{path}: unexpected file name, expected pair_<i>_<j>.jsonl with stage numbers")
        found.append(((int(m.group(1)), int(m.group(2))), path))
    return [path for _, path in sorted(found)]


def fit_link_bench(fixture_dir: str | Path, token: object = None) -> list[dict]:
    """One fit per benchmarked stage pair i->j, in pair order ([] without a link benchmark)."""
    files = bench_files(fixture_dir, token)
    if not files:
        return []
    devices = stage_map(fixture_dir, token)
    fits = []
    for path in files:
        i, j = map(int, PAIR_RE.search(path.name).groups())
        if max(i, j) >= len(devices):
            raise TraceError(f"{path}: stage pair {i},{j} not in hops_trace_map.json, expected 0..{len(devices) - 1}")
        sizes, times = _sender_points(path)
        alpha, beta, method = fit_alpha_beta(sizes, times)
        if not (math.isfinite(alpha) and math.isfinite(beta) and alpha >= 0 and beta > 0):
            raise TraceError(f"{path}: fit gave latency_ms={alpha} bandwidth_gbps={beta}, expected finite "
                             f"latency >= 0 and bandwidth > 0")
        fits.append({"src": devices[i], "dst": devices[j], "latency_ms": alpha, "bandwidth_gbps": beta,
                     "sizes_mb": [float(s) for s in sizes], "source": "link_bench", "method": method})
    return fits


def link_overrides(fixture_dir: str | Path, token: object = None) -> dict:
    """Scenario `overrides` fragment; both directions share a fit because only i->j was timed."""
    links = []
    for fit in fit_link_bench(fixture_dir, token):
        for src, dst in ((fit["src"], fit["dst"]), (fit["dst"], fit["src"])):
            links.append({"src": src, "dst": dst, "latency_ms": fit["latency_ms"],
                          "bandwidth_gbps": fit["bandwidth_gbps"]})
    return {"links": links}
