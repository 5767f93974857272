"""`observe`: where the train error comes from, ranked, so the next hypothesis starts from evidence.

Per stage, F + BW + OPT + iter_end + pipe_idle add up to the iteration wall time (see
autoresearch.scoring), so the phase deltas are an exact decomposition of each
fixture's time error. Pooling them by (stage position x GPU type x phase)
shows which part of the model is wrong and on how many fixtures; pooling the
per-fixture errors by group shows where it hurts most. Shares are of the
summed |predicted - measured| ms per iteration, so they add up to 100%.
"""
from __future__ import annotations

import math

import pandas as pd

from hops.errors import HopsError
from hops.traces.guard import check_split

from . import ledger
from .fixtures import list_fixtures, resolve_root

PHASE_NAMES = {"F": "forward", "BW": "backward", "OPT": "optimizer", "iter_end": "iteration-end idle",
               "pipe_idle": "pipeline idle"}


def position(stage: int, depth: int) -> str:
    return "first" if stage == 0 else "last" if stage == depth - 1 else "middle"


def contributors(report, fixtures: dict, variant: str) -> pd.DataFrame:
    """One row per (position, device, phase) with pooled measured/predicted ms per iteration."""
    ph = report.phases()
    ph = ph[ph["variant"] == variant].copy()
    if ph.empty:
        return pd.DataFrame(columns=["position", "device", "phase", "measured_ms", "predicted_ms", "abs_error_ms",
                                     "fixtures", "stages", "error_pct", "direction", "share"])
    ph["position"] = [position(s, fixtures[i].depth) for i, s in zip(ph["id"], ph["stage"])]
    ph["device"] = [fixtures[i].stage_gpus[s] for i, s in zip(ph["id"], ph["stage"])]
    ph["abs_error_ms"] = (ph["predicted_ms"] - ph["measured_ms"]).abs()
    out = ph.groupby(["position", "device", "phase"], sort=False).agg(
        measured_ms=("measured_ms", "sum"), predicted_ms=("predicted_ms", "sum"),
        abs_error_ms=("abs_error_ms", "sum"), fixtures=("id", "nunique"), stages=("id", "size")).reset_index()
    total = out["abs_error_ms"].sum()
    out["share"] = out["abs_error_ms"] / total if total > 0 else 0.0
    under = out["predicted_ms"] < out["measured_ms"]
    out["direction"] = ["under" if u else "over" for u in under]
    out["error_pct"] = [100 * (p - m) / m if m > 0 else math.inf  # the throughput error's definition, per phase
                        for m, p in zip(out["measured_ms"], out["predicted_ms"])]
    return out.sort_values("abs_error_ms", ascending=False, ignore_index=True)


def contributor_line(r) -> str:
    n = max(r["stages"], 1)
    what = f"{r['position']}-stage {r['device']} {PHASE_NAMES.get(r['phase'], r['phase'])}"
    e = r["error_pct"]
    error = (f"{e:+.{2 if abs(e) < 1 else 1}f}%" if math.isfinite(e) else "(measured 0)")  # +0.50%, not "1.0x"
    return (f"{what} {r['direction']}-predicted {error} on {_n(r['fixtures'])} "
            f"(measured {r['measured_ms'] / n:.1f} vs predicted {r['predicted_ms'] / n:.1f} ms/iter per stage; "
            f"{100 * r['share']:.0f}% of phase error)")


def group_lines(report, variant: str) -> list[tuple[float, str]]:
    """Groups ranked by how many MAPE points they add to the suite beyond an average group of their size."""
    suite = report.aggregates()[variant]
    out = []
    for g, labels in report.groups().items():
        for label, per in labels.items():
            a = per.get(variant)
            if a and suite["n"]:
                excess = (a["mape"] - suite["mape"]) * a["n"] / suite["n"]
                out.append((excess, f"{g}={label}: MAPE {a['mape']:.1f}% on {_n(a['n'])} (suite {suite['mape']:.1f}%), "
                                    f"adds {excess:+.1f} points to the suite MAPE; bubble MAE {a['bubble_mae_pp']:.1f} pp"))
    return sorted(out, key=lambda t: -t[0])


def _n(k: int) -> str:
    return f"{k} fixture" + ("" if k == 1 else "s")


def observe(split: str = "train", *, root=None, variant: str = "link_calibrated", jobs: int = 1, top: int = 8,
            log: bool = True) -> str:
    from .validate import validate

    check_split(split)
    if split == "diagnostic":
        raise HopsError("observe reads train (or archive): the diagnostic split is sanity-only, and ranking its "
                        "errors would steer the next hypothesis with it")
    root = resolve_root(root)
    report = validate(split, root=root, variants=[variant], jobs=jobs)
    fixtures = {f.id: f for f in list_fixtures(root, split)}
    contrib = contributors(report, fixtures, variant)
    agg = report.aggregates()[variant]
    table = report.table()
    worst = table.reindex(table["throughput_error_pct"].abs().sort_values(ascending=False).index).head(top)
    lines = [f"observe {split} ({variant}): {table['id'].nunique()} fixtures, MAPE {agg['mape']:.2f}%, "
             f"bubble MAE {agg['bubble_mae_pp']:.2f} pp, rho {agg['rho_mean']:.2f}",
             "largest contributors by stage position x device x phase (share of summed |pred - meas| ms/iter):"]
    lines += [f"  {k + 1}. {contributor_line(r)}" for k, r in contrib.head(top).iterrows()]
    lines.append("groups by contribution to the suite MAPE:")
    lines += [f"  {k + 1}. {text}" for k, (_, text) in enumerate(group_lines(report, variant)[:top])]
    lines.append("worst fixtures by |throughput error|:")
    lines += [f"  {r['id']}: throughput {r['throughput_error_pct']:+.1f}%, bubble {r['bubble_pp_delta']:+.1f} pp"
              for r in worst.to_dict("records")]
    text = "\n".join(lines)
    if log:
        _log(report, contrib, text, split, variant)
    return text


def _log(report, contrib: pd.DataFrame, text: str, split: str, variant: str) -> None:
    ledger.log_evaluation(report, "observe",
                          sections=["## Ranked contributors", "", "```", text, "```"],
                          extra=lambda d: contrib.to_csv(d / "contributors.csv", index=False))
