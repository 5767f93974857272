"""Scoring a prediction against a measurement, and rolling scores up into a suite.

Both sides are reduced by the same functions (`side_of` on any Timeline), which
call the single metrics implementation in hops.metrics, so a score can only
differ because the timelines differ.

Phase breakdowns are in ms *per iteration* (total over the measured window
divided by its iteration count): the measured window holds the trace's kept
iterations and the simulated one the scenario's `simulation.batches`, so raw
totals would differ by that ratio alone. Per stage the phases F + BW + OPT +
iter_end + pipe_idle add up to the mean iteration wall time, which makes the
breakdown an exact decomposition of the throughput error: a phase that is off by
x ms per iteration on the critical stage moves the predicted wall by x ms. The two
idle parts are hops.metrics.time_breakdown's: idle after the pipeline flush
(iteration-end syncs, collectives, host overhead) and idle before it (the
schedule's bubble).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from hops.metrics import measured_window, summarize, time_breakdown
from hops.timeline import Timeline

PHASES = ("F", "BW", "OPT", "iter_end", "pipe_idle")  # BW = all backward work (fused BW, or B + W when split)
METRICS = ("mape", "bubble_mae_pp", "rho_mean", "n")


@dataclass(frozen=True)
class Side:
    """What scoring needs from one run, measured or predicted (small and picklable)."""

    throughput_per_s: float
    bubble_ratio: float
    stage_utilization: tuple[float, ...]
    breakdown: tuple[tuple[int, str, float], ...]  # (stage, phase, ms per iteration)
    window_ms: float
    iterations: int


def phase_breakdown(tl: Timeline) -> tuple[tuple[tuple[int, str, float], ...], float, int]:
    """(stage, phase, ms per iteration) over the measured window, plus the window and its iteration count."""
    w, t0, t1 = measured_window(tl)
    n_iter = max(len(np.unique(w.iteration[w.iteration >= 0])), 1)
    p = tl.n_stages
    compute = w.kind == "compute"
    code = np.where(w.phase == "F", 0, 1)
    code = np.where(w.kind == "optimizer", 2, code)
    rows = compute | (w.kind == "optimizer")
    idx = w.stage[rows] * 3 + code[rows]
    totals = np.bincount(idx, weights=(w.end_ms - w.start_ms)[rows], minlength=3 * p).reshape(p, 3) / n_iter
    idle = time_breakdown(w, t0, t1)
    out = []
    for s in range(p):
        f, bw, opt = (float(x) for x in totals[s])
        out += [(s, "F", f), (s, "BW", bw), (s, "OPT", opt), (s, "iter_end", idle[s]["iteration_end_ms"]),
                (s, "pipe_idle", idle[s]["pipeline_idle_ms"])]
    return tuple(out), t1 - t0, n_iter


def side_of(tl: Timeline) -> Side:
    summary = summarize(tl)
    breakdown, window, n_iter = phase_breakdown(tl)
    util = summary["utilization"]["per_stage"]
    return Side(throughput_per_s=float(summary["throughput"]["microbatches_per_s"]),
                bubble_ratio=float(summary["bubble_ratio"]),
                stage_utilization=tuple(float(util[str(s)]) for s in range(tl.n_stages)),
                breakdown=breakdown, window_ms=float(window), iterations=int(n_iter))


def spearman(a, b) -> float:
    """Spearman rho as Pearson on average ranks; NaN when either side has no spread.

    Values are rounded to 1e-9 first so floating-point noise does not break ties
    (identical stages simulate to utilizations equal up to rounding).
    """
    x = pd.Series(np.round(np.asarray(a, dtype=float), 9)).rank()
    y = pd.Series(np.round(np.asarray(b, dtype=float), 9)).rank()
    if len(x) != len(y) or len(x) < 2 or x.nunique() < 2 or y.nunique() < 2:
        return math.nan
    return float(np.corrcoef(x.to_numpy(), y.to_numpy())[0, 1])


def score(measured: Side, predicted: Side) -> dict:
    """Per-fixture scores (definitions: autoresearch/README.md) and the stage x phase breakdown."""
    m, p = measured.throughput_per_s, predicted.throughput_per_s
    pred = {(s, ph): v for s, ph, v in predicted.breakdown}
    return {
        "measured_throughput_per_s": m,
        "predicted_throughput_per_s": p,
        "throughput_error_pct": (p - m) / m * 100.0 if m > 0 else math.nan,
        "measured_bubble_ratio": measured.bubble_ratio,
        "predicted_bubble_ratio": predicted.bubble_ratio,
        "bubble_pp_delta": (predicted.bubble_ratio - measured.bubble_ratio) * 100.0,
        "util_spearman_rho": spearman(predicted.stage_utilization, measured.stage_utilization),
        "phase_breakdown": [{"stage": s, "phase": ph, "measured_ms": v, "predicted_ms": pred.get((s, ph), math.nan)}
                            for s, ph, v in measured.breakdown],
    }


def aggregate(df: pd.DataFrame) -> dict:
    """Suite metrics of a set of per-fixture rows; rho_mean ignores fixtures where rho is undefined."""
    rho = df["util_spearman_rho"].dropna()
    return {"mape": float(df["throughput_error_pct"].abs().mean()) if len(df) else math.nan,
            "bubble_mae_pp": float(df["bubble_pp_delta"].abs().mean()) if len(df) else math.nan,
            "rho_mean": float(rho.mean()) if len(rho) else math.nan,
            "n": int(len(df))}


def aggregates_by_variant(df: pd.DataFrame) -> dict:
    return {v: aggregate(g) for v, g in df.groupby("variant", sort=False)}


GROUPS = ("device_family", "schedule", "pipeline_depth", "microbatches")


def group_aggregates(df: pd.DataFrame) -> dict:
    """{group: {label: {variant: aggregate}}}, labels sorted naturally (2 before 10)."""
    out = {}
    for group in GROUPS:
        labels = sorted(df[group].unique(), key=lambda s: (0, int(s), "") if str(s).isdigit() else (1, 0, str(s)))
        out[group] = {str(label): aggregates_by_variant(df[df[group] == label]) for label in labels}
    return out


def phase_error_table(phases: pd.DataFrame) -> pd.DataFrame:
    """Mean (predicted - measured) ms per iteration per phase, averaged over stages then fixtures."""
    if phases.empty:
        return pd.DataFrame()
    d = phases.assign(delta_ms=phases["predicted_ms"] - phases["measured_ms"])
    per_fixture = d.groupby(["variant", "id", "phase"], sort=False)["delta_ms"].mean().reset_index()
    table = per_fixture.pivot_table(index="variant", columns="phase", values="delta_ms", aggfunc="mean", sort=False)
    return table.reindex(columns=[p for p in PHASES if p in table.columns])
