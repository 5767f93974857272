"""The single implementation of every headline metric, applied to any Timeline.

Definitions follow autoresearch/README.md (Definitions): leading warm-up iterations (wall time >= 3x the
median of the iterations after them) are dropped, and everything is measured
over the window spanned by the iterations that remain.
"""
from __future__ import annotations

import numpy as np

from hops.timeline import Timeline

WARMUP_FACTOR = 3.0
BACKWARD_PHASES = ("B", "BW", "W")
ROUNDING = 1e-9  # how far a share of the window may stray outside [0, 1] by floating-point rounding alone


def share(x: float) -> float:
    """A fraction of the window (bubble, utilization), with rounding's strays pulled back into [0, 1].

    1 - busy / window is -2.2e-16 for a stage busy the whole window; a report showing a
    negative bubble reads as a bug. Larger strays are left as they are: they would be one.
    """
    if -ROUNDING < x < 0.0:
        return 0.0
    if 1.0 < x < 1.0 + ROUNDING:
        return 1.0
    return x


def distinct(values: np.ndarray) -> np.ndarray:
    """np.unique(values): sorted distinct values, found by a sort for integer columns.

    numpy 2's np.unique hashes integers first, which costs 2-5x a plain sort on the
    iteration, microbatch and stage columns the metrics take it of, several times per summary.
    """
    if values.dtype.kind not in "iu" or len(values) < 2:
        return np.unique(values)
    s = np.sort(values)
    return s[np.concatenate(([True], s[1:] != s[:-1]))]


def union_length(start: np.ndarray, end: np.ndarray) -> float:
    """Total time covered by possibly-overlapping intervals (overlap is not double counted)."""
    if len(start) == 0:
        return 0.0
    order = np.argsort(start, kind="stable")
    s, e = start[order], end[order]
    prev_end = np.concatenate(([-np.inf], np.maximum.accumulate(e)[:-1]))
    return float(np.sum(np.clip(e - np.maximum(s, prev_end), 0.0, None)))


def iteration_walls(tl: Timeline) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(iteration ids, start ms, wall ms): wall runs to the next iteration's start, so
    per-iteration dead time between iterations is charged to the iteration before it."""
    work = tl.iteration >= 0
    ids = distinct(tl.iteration[work])
    if len(ids) == 0:
        return ids, np.zeros(0), np.zeros(0)
    starts = np.array([tl.start_ms[work & (tl.iteration == i)].min() for i in ids])
    ends = np.array([tl.end_ms[work & (tl.iteration == i)].max() for i in ids])
    walls = np.append(np.diff(starts), ends[-1] - starts[-1])
    return ids, starts, walls


def warmup_iterations(walls: np.ndarray) -> int:
    """How many leading iterations the warm-up rule drops (never all of them)."""
    n = 0
    while n < len(walls) - 1 and walls[n] >= WARMUP_FACTOR * np.median(walls[n + 1:]):
        n += 1
    return n


def measured_window(tl: Timeline) -> tuple[Timeline, float, float]:
    """The Timeline restricted to kept iterations, with the window start and end (ms)."""
    ids, starts, walls = iteration_walls(tl)
    if len(ids) == 0:
        raise ValueError("timeline has no iterations to measure")
    drop = warmup_iterations(walls)
    t0 = float(starts[drop])
    t1 = float(starts[-1] + walls[-1])
    # The kept iterations are the tail of the sorted ids, so "kept" is "at least the first kept id".
    mask = (tl.iteration >= ids[drop]) | ((tl.iteration < 0) & (tl.start_ms >= t0) & (tl.end_ms <= t1))
    return (tl if mask.all() else tl.select(mask)), t0, t1  # nothing dropped (one iteration, say): no copy


def _disjoint_pieces(keys: np.ndarray, start: np.ndarray, end: np.ndarray):
    """Per-key union of intervals as disjoint pieces, in one vectorized pass.

    Groups are laid end to end on the time axis (offset by more than the whole span) so
    one running max never crosses groups. Returns (key names, group index, piece start,
    piece end) with pieces in the original time base; empty pieces have start == end.
    """
    names = distinct(keys)  # without an inverse; codes by binary search are far cheaper
    group = np.searchsorted(names, keys)
    span = float(end.max() - start.min()) + 1.0
    shift = group * span * 2.0
    s, e = start + shift, end + shift
    order = np.lexsort((s, group))
    s, e, g = s[order], e[order], group[order]
    prev_end = np.concatenate(([-np.inf], np.maximum.accumulate(e)[:-1]))
    lo = np.maximum(s, prev_end)
    lo = np.minimum(lo, e)
    return names, g, lo - shift[order], e - shift[order]


def grouped_union(keys: np.ndarray, start: np.ndarray, end: np.ndarray) -> dict[str, float]:
    """union_length per key (overlap inside a key is not double counted)."""
    if len(keys) == 0:
        return {}
    names, g, lo, hi = _disjoint_pieces(keys, start, end)
    totals = np.bincount(g, weights=hi - lo, minlength=len(names))
    return {str(k): float(v) for k, v in zip(names.tolist(), totals)}


def busy_mask(tl: Timeline) -> np.ndarray:
    """Rows during which a stage is busy: F, B, W, fused BW, or an optimizer step.

    This is the rule megatron_summary.json uses, and the one every bubble and utilization
    figure in HOPS reads, for simulated and measured runs alike. Transfers, collectives,
    syncs and host overhead are idle time of the stage.
    """
    return (tl.kind == "compute") | (tl.kind == "optimizer")


BREAKDOWN_PARTS = ("compute_ms", "optimizer_ms", "iteration_end_ms", "pipeline_idle_ms")


def time_breakdown(w: Timeline, t0: float, t1: float) -> list[dict]:
    """Per stage, ms per iteration: compute, optimizer, iteration-end idle, pipeline idle.

    The split point of each iteration is its pipeline flush, the last end of any F/B/W/BW
    of that iteration on any stage. Idle before the flush is the schedule's bubble (fill,
    drain, waiting on a neighbour); idle after it, until the next iteration starts, is the
    iteration-end work a stage waits through (gradient all-reduces, the embedding sync,
    barriers, host/framework overhead). The four parts add up to the mean iteration wall.
    """
    p = w.n_stages
    ids = distinct(w.iteration[w.iteration >= 0])
    n_iter = max(len(ids), 1)
    work = w.iteration >= 0
    comp = w.kind == "compute"
    starts = np.array([w.start_ms[work & (w.iteration == i)].min() for i in ids]) if len(ids) else np.zeros(0)
    flush = np.array([w.end_ms[comp & (w.iteration == i)].max() if (comp & (w.iteration == i)).any()
                      else w.start_ms[work & (w.iteration == i)].min() for i in ids]) if len(ids) else np.zeros(0)
    nexts = np.append(starts[1:], t1) if len(ids) else np.zeros(0)
    # F(t): pre-flush time in [t0, t]; piecewise linear through the iteration boundaries.
    xs = np.ravel(np.column_stack([starts, np.minimum(flush, nexts)])) if len(ids) else np.array([t0])
    fx = np.zeros(len(xs))
    if len(ids):
        fx[1::2] = np.cumsum(np.minimum(flush, nexts) - starts)
        fx[2::2] = fx[1:-1:2]
    pre_total = float(fx[-1])

    def pre(t):
        return np.interp(t, xs, fx)

    rows = []
    for part, mask in (("compute_ms", comp), ("optimizer_ms", w.kind == "optimizer")):
        vals = np.bincount(w.stage[mask], weights=(w.end_ms - w.start_ms)[mask], minlength=p)[:p]
        rows.append(vals)
    busy = busy_mask(w) & (w.stage >= 0)
    busy_pre = np.zeros(p)
    busy_all = np.zeros(p)
    if busy.any():
        names, g, lo, hi = _disjoint_pieces(w.stage[busy], w.start_ms[busy], w.end_ms[busy])
        lo, hi = np.clip(lo, t0, t1), np.clip(hi, t0, t1)
        stage_of = names[g]
        busy_all = np.bincount(stage_of, weights=hi - lo, minlength=p)[:p]
        busy_pre = np.bincount(stage_of, weights=pre(hi) - pre(lo), minlength=p)[:p]
    window = t1 - t0
    pipeline_idle = pre_total - busy_pre
    iteration_end = (window - pre_total) - (busy_all - busy_pre)
    out = []
    for s in range(p):
        vals = (rows[0][s], rows[1][s], iteration_end[s], pipeline_idle[s])
        out.append({"stage": s, **{k: max(float(v), 0.0) / n_iter for k, v in zip(BREAKDOWN_PARTS, vals)}})
    return out


def summarize(tl: Timeline) -> dict:
    """Headline metrics of a Timeline; JSON-ready, keys as in the summary.json contract."""
    w, t0, t1 = measured_window(tl)
    window = t1 - t0
    compute = w.kind == "compute"
    transfer = w.kind == "transfer"

    busy = busy_mask(w)
    by_stage = grouped_union(w.stage[busy], w.start_ms[busy], w.end_ms[busy])
    stage_busy = [by_stage.get(str(s), 0.0) for s in range(tl.n_stages)]
    device_busy = grouped_union(w.device[busy], w.start_ms[busy], w.end_ms[busy])
    breakdown = time_breakdown(w, t0, t1)
    n_iter = len(distinct(w.iteration[w.iteration >= 0]))
    n_iter_w = max(n_iter, 1)
    idle_total = {k: sum(r[k] for r in breakdown) * n_iter_w for k in ("iteration_end_ms", "pipeline_idle_ms")}
    link_busy = {}
    if transfer.any():
        # Name only the links that carried traffic: a table of every device pair is quadratic.
        ends = np.unique(np.concatenate([w.src[transfer], w.dst[transfer]]))
        n_ends = np.int64(len(ends))
        code = np.searchsorted(ends, w.src[transfer]).astype(np.int64) * n_ends + np.searchsorted(ends, w.dst[transfer])
        link_busy = {f"{ends[int(k) // n_ends]}->{ends[int(k) % n_ends]}": v for k, v in
                     grouped_union(code, w.start_ms[transfer], w.end_ms[transfer]).items()}

    mbs = distinct(w.microbatch[compute & (w.microbatch >= 0)])
    latencies = _microbatch_latencies(w)
    # one call for both quantiles: np.percentile's fixed cost is most of it at these sizes
    p50, p99 = np.percentile(latencies, (50, 99)).tolist() if len(latencies) else (0.0, 0.0)
    compute_ms = float(np.sum(w.end_ms[compute] - w.start_ms[compute]))
    transfer_ms = float(np.sum(w.end_ms[transfer] - w.start_ms[transfer]))
    per_s = len(mbs) / (window / 1000.0) if window > 0 else 0.0

    return {
        "throughput": {
            "microbatches_per_s": per_s,
            "samples_per_s": per_s * tl.samples_per_microbatch,
            "iterations_per_s": n_iter / (window / 1000.0) if window > 0 else 0.0,
        },
        "latency_ms": {
            "mean": float(np.mean(latencies)) if len(latencies) else 0.0,
            "p50": p50,
            "p99": p99,
        },
        "makespan_ms": window,
        "bubble_ratio": share(1.0 - sum(stage_busy) / (tl.n_stages * window)) if window > 0 else 0.0,
        "bubble_per_stage": [share(1.0 - b / window) for b in stage_busy] if window > 0 else [],
        "idle_breakdown": {  # the bubble, read: shares of stages x window
            "pipeline": share(idle_total["pipeline_idle_ms"] / (tl.n_stages * window)) if window > 0 else 0.0,
            "iteration_end": share(idle_total["iteration_end_ms"] / (tl.n_stages * window)) if window > 0 else 0.0,
        },
        "time_breakdown_ms_per_iteration": breakdown,
        "utilization": {
            "per_stage": {str(s): share(b / window) for s, b in enumerate(stage_busy)},
            "per_device": {d: share(b / window) for d, b in sorted(device_busy.items())},
            "per_link": {k: share(b / window) for k, b in sorted(link_busy.items())},
        },
        "communication_overhead": transfer_ms / compute_ms if compute_ms > 0 else 0.0,
        "window": {
            "start_ms": t0, "end_ms": t1, "iterations": n_iter,
            "warmup_iterations_dropped": int(len(distinct(tl.iteration[tl.iteration >= 0])) - n_iter),
            "completed_microbatches": int(len(mbs)),
        },
    }


def _microbatch_latencies(w: Timeline) -> np.ndarray:
    """First forward start to last backward end, per microbatch seen complete in the window."""
    compute = (w.kind == "compute") & (w.microbatch >= 0)
    fwd = compute & (w.phase == "F")
    bwd = compute & np.isin(w.phase, BACKWARD_PHASES)
    if not fwd.any() or not bwd.any():
        return np.zeros(0)
    n = int(w.microbatch[compute].max()) + 1
    first = np.full(n, np.inf)
    last = np.full(n, -np.inf)
    np.minimum.at(first, w.microbatch[fwd], w.start_ms[fwd])
    np.maximum.at(last, w.microbatch[bwd], w.end_ms[bwd])
    ok = np.isfinite(first) & np.isfinite(last)
    return (last - first)[ok]


def phase_totals(tl: Timeline) -> dict[tuple[int, str], float]:
    """Total compute ms per (stage, phase) inside the measured window; scoring compares these."""
    w, _, _ = measured_window(tl)
    compute = w.kind == "compute"
    out: dict[tuple[int, str], float] = {}
    for s, ph, dur in zip(w.stage[compute], w.phase[compute], (w.end_ms - w.start_ms)[compute]):
        out[(int(s), str(ph))] = out.get((int(s), str(ph)), 0.0) + float(dur)
    return out
