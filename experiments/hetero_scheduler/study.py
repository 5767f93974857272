"""The scheduling study, against faithful baselines, from one command.

    python -m experiments.hetero_scheduler [--json PATH] [--out DIR] [--jobs N] [--reference DIR]

Grid: every config x scheduler x evaluation seed (101, 102, 103) x compute jitter (0 and
10 %) x split cost (the stack's backward_split_floor_factor 1.0 = "share": B and W share the fused
backward's dispatch floor by the kernels each launches, the model's default; 2.0 = "2x": the
split pays twice the fused floor, a sensitivity setting). Baselines: gpipe, 1f1b, zb_h1,
zb_h2, the ZB paper's automatically scheduled zb_1p and zb_2p (its measured schedules; zb_2p
post-validated only), zb_v (2 chunks per device in a V), interleaved_1f1b (2 chunks per
stage, where Megatron's m % p == 0 allows it) and interleaved_zb (PyTorch's interleaved zero
bubble on the same loop, where its equal rounds allow it), plus the seed's hops_hetero.
Fairness rules:
- memory: the cap is ZB-H1's activation memory (min(p, m) microbatches per stage, 1F1B's
  peak). A schedule "fits" if no device's peak memory exceeds ZB-H1's on that device; "best
  built-in" is the fastest built-in that fits. zb_v holds 2 min(p, m) half-stage chunks,
  the same cap, so it competes within it, and so do zb_1p (at most p microbatches by
  construction) and interleaved_zb where m is a multiple of p (2p half-stage chunks); zb_h2,
  zb_2p and interleaved_1f1b hold more, so they are reported, and named when they are faster,
  but are not the capped baseline.
- seeds: the evaluation seeds (101-103) differ from the configs' own seed (42). hetero_search
  plans from the expected stage times; under jitter it judges its finalists on draws from the
  "search" stream of its own seed (SEARCH_SEED = 42, scheduler option search_seed), never from an
  evaluation seed, so its plan is the same for all three. It may choose ZB-V's V placement or
  interleaved_zb's loop (2 chunks per device) per config; it runs under virtual_stages 1 and
  lays itself out.
Per config and setting: mean makespan per scheduler, delta vs zb_h1 with win/tie/regression
at +-0.5 %, the lower bound (lower_bound.py, at jitter 0 for one-chunk runs, asserted
for every one) and the gap to it. Then the placement planner against uniform and
FLOPs-proportional partitions. Writes into --out (default: this folder): results.json (the
contract: default model, jitter 0, reference configs), results_full.json (everything),
RESULTS.md (tables + narrative.md), and the charts.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from tqdm import tqdm

from hops.schedulers.interleaved_zb import rounds_divide

# The study's split-cost model: B and W each pay the floor of the kernels they launch, W's
# weight-gradient GEMMs being ~4 of a layer's ~20 backward launches (the megatron_core stack's
# own value; the fixture stack still holds the seed's charge, so the study states it).
W_KERNEL_SHARE = 0.2


def study_catalog(doc: dict, factor: float):
    """The presets under one split cost, for the training stack the config runs on."""
    from hops.model.hardware import Catalog
    from hops.schema.scenario import DEFAULT_STACK

    stack = (doc.get("pipeline") or {}).get("stack") or DEFAULT_STACK
    return Catalog.load({f"stacks.{stack}.backward_split_floor_factor": factor,
                         f"stacks.{stack}.backward_w_kernel_share": W_KERNEL_SHARE})

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
DEFAULT_REFERENCE = ROOT.parent / "shared" / "reference" / "hetero_bench"
SCHEDULERS = ["gpipe", "1f1b", "zb_h1", "zb_h2", "zb_h2_pv", "zb_1p", "zb_1p_pv", "zb_2p_pv", "zb_v", "zb_v_pv",
              "interleaved_1f1b", "interleaved_zb", "hops_hetero",
              "hetero_search", "hetero_search_pv"]
REF = "zb_h1"  # deltas are against the paper's ZB-H1 at its own (1F1B-peak) activation memory
PROPOSED = "hetero_search"
PROPOSED_PV = "hetero_search_pv"  # the same scheduler under optimizer post-validation
BUILTINS = [s for s in SCHEDULERS if s not in (PROPOSED, PROPOSED_PV)]
# ZB-H2 and ZB-V as the ZB paper and repository run them, and hetero_search, with optimizer
# post-validation (no barrier between iterations, optimizer.post_validation: true)
POST_VALIDATED = {"zb_h2_pv": "zb_h2", "zb_1p_pv": "zb_1p", "zb_2p_pv": "zb_2p", "zb_v_pv": "zb_v",
                  PROPOSED_PV: PROPOSED}
# What each proposed run is judged against: hetero_search keeps Megatron's barrier, so the
# baselines that keep it too; hetero_search_pv runs post-validated, so every baseline (barrier
# or post-validated), since either optimizer semantics is then open to it
JUDGED_AGAINST = {PROPOSED: [s for s in BUILTINS if s not in POST_VALIDATED], PROPOSED_PV: BUILTINS}
# Evaluation seeds per jitter setting (the configs' own seed is 42). At jitter 0 only the links
# jitter (2-10 % of sub-millisecond transfers): three seeds. At 10 % compute jitter one schedule's
# makespan spreads about 1 % from seed to seed, more than the 0.5 % tie band, so a comparison
# of two schedules needs more: twenty.
SEEDS = {"j0": [101, 102, 103], "j10": list(range(101, 121))}
# hetero_search's own seed: under jitter it judges its finalists on draws from this seed's "search"
# stream (scheduler option search_seed), so its plan is the same for every evaluation seed and
# nothing it sees comes from them
SEARCH_SEED = 42
assert all(SEARCH_SEED not in seeds for seeds in SEEDS.values())
FACTORS = {"share": 1.0, "2x": 2.0}
JITTERS = {"j0": 0.0, "j10": 0.10}
# chunks per stage for the virtual-stage baselines
VIRTUAL = {"interleaved_1f1b": 2, "interleaved_zb": 2, "zb_v": 2, "zb_v_pv": 2}
# no lower bound for these: it is built from whole-stage times and a barrier between iterations
NO_BOUND = set(VIRTUAL) | set(POST_VALIDATED)
# Schedules that run only some (p, m): Megatron's interleaving needs m a multiple of p, PyTorch's
# interleaved zero bubble m in equal rounds; elsewhere they are not applicable to a config
RUNS_ON = {"interleaved_1f1b": lambda p, m: m % p == 0,
           "interleaved_zb": rounds_divide}
TIE = 0.5  # percent


# --------------------------------------------------------------------------- grid
def run_config(path: str, factor: float, jitter: float = 0.0, seeds=SEEDS["j0"], schedulers=SCHEDULERS) -> dict:
    """All schedulers and seeds of one config under one split cost and compute jitter (one
    process, so the proposed scheduler's search is done once and reused across seeds)."""
    import hops
    from hops.model.hardware import Catalog
    from hops.scenario import load_document

    from .lower_bound import expected_times, memory_bound, run_bound

    doc, _ = load_document(path)
    catalog = study_catalog(doc, factor)
    doc["pipeline"]["compute_jitter"] = jitter
    out = {"makespan_ms": {}, "lower_bound_ms": {}, "peak_in_flight": {}, "peak_memory_mb": {}, "effective": {},
           "plan": None, "configure_s": {}, "bound_violations": []}
    t0 = time.perf_counter()
    p, m = len(doc["pipeline"]["stages"]), doc["simulation"]["microbatches"]
    for sched in schedulers:
        doc["pipeline"]["schedule"] = POST_VALIDATED.get(sched, sched)
        doc["pipeline"]["virtual_stages"] = VIRTUAL.get(sched, 1)
        doc.setdefault("optimizer", {})["post_validation"] = sched in POST_VALIDATED
        doc["pipeline"]["scheduler_options"] = {"search_seed": SEARCH_SEED} if sched in JUDGED_AGAINST else {}
        if not RUNS_ON.get(sched, lambda p, m: True)(p, m):
            continue
        ms, lbs = [], []
        for seed in seeds:
            t_c = time.perf_counter()
            r = hops.simulate(doc, seed=seed, catalog=catalog)
            out["configure_s"][sched] = max(out["configure_s"].get(sched, 0.0), time.perf_counter() - t_c)
            # The bound uses expected times of whole stages: not for chunks (zb_v, interleaved, or
            # hetero_search where its plan chose the V or the loop).
            if jitter == 0 and sched not in NO_BOUND and r.extras.get("virtual_stages", 1) == 1:
                lb = run_bound(r, catalog)
                if r.summary["makespan_ms"] < lb["lower_bound_ms"] - 1e-6:  # reported, never hidden
                    out["bound_violations"].append(f"{Path(path).stem} {sched} seed {seed}: makespan "
                                                   f"{r.summary['makespan_ms']:.3f} < bound {lb['lower_bound_ms']:.3f}")
                lbs.append(lb["lower_bound_ms"])
                last_lb, last_r = lb, r
            ms.append(r.summary["makespan_ms"])
        out["makespan_ms"][sched] = ms
        out["lower_bound_ms"][sched] = lbs
        out["peak_in_flight"][sched] = r.summary["peak_in_flight"]
        out["peak_memory_mb"][sched] = r.summary["peak_memory_mb"]
        out["effective"][sched] = r.summary["scheduler_effective"]
        if sched in JUDGED_AGAINST:
            out["plan" if sched == PROPOSED else "plan_pv"] = plan_info(doc, catalog, seeds[0])
    doc["pipeline"]["virtual_stages"] = 1
    if jitter > 0:
        out["seconds"] = time.perf_counter() - t0
        return out
    lb, r = last_lb, last_r
    stages = r.summary["stages"]
    f, b, w, bw = expected_times(r.summary)
    p = len(stages)
    m = doc["simulation"]["microbatches"]
    xf, xb = lb["transfer_lb_ms"]  # of the last iteration: a diagnostic, not asserted
    iters = r.summary["window"]["iterations"]
    out["memory_bound_ms"] = iters * memory_bound(f, b, w, bw, m, xf, xb, [min(p, m)] * p, lb["sync_ms"])
    out["stages"] = [{"gpu": s["gpu"], **{k: round(v, 3) for k, v in s["expected_ms"].items()}} for s in stages]
    out["seconds"] = time.perf_counter() - t0
    return out


def plan_info(doc: dict, catalog, seed: int) -> dict:
    """What the proposed scheduler chose (its search is memoized, so this costs one replay)."""
    from hops.engine import loop as engine
    from hops.scenario import load_scenario

    plan = engine.run(load_scenario(doc, catalog), catalog, seed).scheduler.plan
    split = sum(1 for o in plan.orders for ph, _ in o if ph == "B")
    fused = sum(1 for o in plan.orders for ph, _ in o if ph == "BW")
    head, tail, f_first = plan.params if plan.params else (None, None, None)
    return {"label": plan.label, "placement": plan.placement_name,
            "predicted_by_placement_ms": plan.alternatives,
            "modes": [str(m) for m in plan.modes], "split_backwards": split,
            "fused_backwards": fused, "predicted_ms": plan.makespan, "evaluated": plan.evaluated,
            "baselines_ms": plan.baselines, "head": head, "tail": tail, "f_first": f_first}


# Ablations of the proposed scheduler (scheduler options; seed 42, both split costs).
ABLATIONS = {
    "per-stage only": {"per_microbatch": False},
    "no descent (seeds only)": {"search_passes": 0},
    "+1 activation per stage": {"extra_in_flight": 1},
    "one-chunk placement only (no V, no loop)": {"placement": "one_chunk"},
}


def run_ablation(path: str, factor: float) -> dict:
    import hops
    from hops.model.hardware import Catalog
    from hops.scenario import load_document

    doc, _ = load_document(path)
    catalog = study_catalog(doc, factor)
    doc["pipeline"]["schedule"] = PROPOSED
    out = {"default": hops.simulate(doc, seed=SEEDS["j0"][0], catalog=catalog).summary["makespan_ms"]}
    for name, opts in ABLATIONS.items():
        doc["pipeline"]["scheduler_options"] = dict(opts)
        out[name] = hops.simulate(doc, seed=SEEDS["j0"][0], catalog=catalog).summary["makespan_ms"]
    return out


def table_ablations(abl: dict) -> str:
    """abl[(group, cost)][config] = {variant: makespan}: mean and worst change vs the default."""
    lines = ["| variant | configs | split cost | mean makespan change | worst | best |", "|---|---|---|---|---|---|"]
    for name in ABLATIONS:
        for (group, cost), rows in sorted(abl.items()):
            d = [100.0 * (r[name] - r["default"]) / r["default"] for r in rows.values()]
            lines.append(f"| {name} | {group} | {cost} | {statistics.fmean(d):+.2f}% | {max(d):+.2f}% | "
                         f"{min(d):+.2f}% |")
    return "\n".join(lines)


def fits_cap(r: dict, sched: str) -> bool:
    """No device holds more than under ZB-H1 (the cap: min(p, m) microbatches per stage)."""
    cap, mine = r["peak_memory_mb"][REF], r["peak_memory_mb"][sched]
    return all(mine[d] <= cap[d] + 1e-6 for d in cap)


def summarize(results: dict) -> dict:
    """Per config: means, deltas vs ZB-H1, W/T/R, best built-in within the cap and overall, bound and gaps."""
    rows = {}
    for name, r in results.items():
        mean = {s: statistics.fmean(v) for s, v in r["makespan_ms"].items()}
        zb = mean[REF]
        fits = {s: fits_cap(r, s) for s in mean}
        vs = {}  # per proposed run: the best of its baselines within the cap and at any memory, and the gain
        for prop, pool in JUDGED_AGAINST.items():
            capped = min((s for s in pool if s in mean and fits[s]), key=lambda s: mean[s])
            anymem = min((s for s in pool if s in mean), key=lambda s: mean[s])
            vs[prop] = {"best_builtin": capped, "vs_best_builtin_pct": 100.0 * (mean[capped] - mean[prop]) / mean[capped],
                        "best_builtin_any_memory": anymem,
                        "vs_best_any_memory_pct": 100.0 * (mean[anymem] - mean[prop]) / mean[anymem]}
        delta = {s: 100.0 * (zb - mean[s]) / zb for s in mean}
        lbs = r["lower_bound_ms"].get(REF) or []  # the same for every one-chunk schedule at a seed
        lb = statistics.fmean(lbs) if lbs else None
        rows[name] = {
            "mean_ms": mean, "fits_cap": fits, "lower_bound_ms": lb, "memory_bound_ms": r.get("memory_bound_ms"),
            "delta_vs_zb_h1_pct": delta,
            "wtr": {s: "W" if delta[s] > TIE else "R" if delta[s] < -TIE else "T" for s in mean},
            **vs[PROPOSED], "vs": vs,
            "gap_pct": {s: 100.0 * (mean[s] - lb) / lb for s in mean
                        if s not in NO_BOUND and (s != PROPOSED or r["lower_bound_ms"].get(PROPOSED))} if lb else None,
            "seed_spread_pct": max(100.0 * (max(v) - min(v)) / min(v) for v in r["makespan_ms"].values()),
            "plan": r.get("plan"), "plan_pv": r.get("plan_pv"), "peak_in_flight": r["peak_in_flight"], "effective": r["effective"],
            "configure_s": r.get("configure_s", {}),
        }
    return rows


def headline(rows: dict, sched: str) -> dict:
    d = [r["delta_vs_zb_h1_pct"][sched] for r in rows.values() if sched in r["delta_vs_zb_h1_pct"]]
    return {"n": len(d), "wins": sum(x > TIE for x in d), "ties": sum(abs(x) <= TIE for x in d),
            "regressions": sum(x < -TIE for x in d), "mean_pct": statistics.fmean(d), "max_pct": max(d),
            "min_pct": min(d)}


# --------------------------------------------------------------------------- tables
def fmt(x, nd=1):
    return "n/a" if x is None else f"{x:.{nd}f}"


def table_makespans(rows: dict) -> str:
    head = ("| config | " + " | ".join(SCHEDULERS) + f" | {PROPOSED} Δ vs zb_h1 | W/T/R | "
            f"{PROPOSED} vs best barrier built-in within cap | vs best barrier built-in, any memory | "
            f"{PROPOSED_PV} vs best built-in within cap | vs best built-in, any memory |")
    sep = "|" + "---|" * (len(SCHEDULERS) + 7)
    lines = [head, sep]
    for name, r in rows.items():
        cells = [(fmt(r["mean_ms"][s]) + ("" if r["fits_cap"][s] else "*")) if s in r["mean_ms"] else "n/a"
                 for s in SCHEDULERS]
        lines.append(f"| {name} | " + " | ".join(cells) +
                     f" | {r['delta_vs_zb_h1_pct'][PROPOSED]:+.2f}% | {r['wtr'][PROPOSED]} | "
                     + " | ".join(f"{v['vs_best_builtin_pct']:+.2f}% ({v['best_builtin']}) | "
                                  f"{v['vs_best_any_memory_pct']:+.2f}% ({v['best_builtin_any_memory']})"
                                  for v in r["vs"].values()) + " |")
    return "\n".join(lines)


def seed_range(seeds) -> str:
    return f"{seeds[0]}-{seeds[-1]}" if len(seeds) > 3 else ", ".join(map(str, seeds))


def summary_lines(rows: dict, seeds) -> str:
    out = []
    for sched in [s for s in SCHEDULERS if s != REF]:
        h = headline(rows, sched)
        out.append(f"- **{sched} vs zb_h1** ({h['n']} configs): {h['wins']} wins (> +{TIE}%), {h['ties']} ties, "
                   f"{h['regressions']} regressions (< -{TIE}%); mean {h['mean_pct']:+.2f}%, "
                   f"max {h['max_pct']:+.2f}%, min {h['min_pct']:+.2f}%")
    for prop, which in ((PROPOSED, "barrier "), (PROPOSED_PV, "")):
        vb = [r["vs"][prop]["vs_best_builtin_pct"] for r in rows.values()]
        out.append(f"- **{prop} vs the best {which}built-in within the memory cap** (per config): mean "
                   f"{statistics.fmean(vb):+.2f}%, worst {min(vb):+.2f}%, best {max(vb):+.2f}%; regressions beyond "
                   f"{TIE}%: {sum(x < -TIE for x in vb)}; slower at all: {sum(x < -1e-9 for x in vb)}")
        va = [r["vs"][prop]["vs_best_any_memory_pct"] for r in rows.values()]
        out.append(f"- **{prop} vs the best {which}built-in at any memory** (zb_h2 / interleaved allowed; zb_v fits "
                   f"the cap): mean {statistics.fmean(va):+.2f}%, worst {min(va):+.2f}%; slower beyond {TIE}%: "
                   f"{sum(x < -TIE for x in va)}")
    for prop, key in ((PROPOSED, "plan"), (PROPOSED_PV, "plan_pv")):
        plans = [r[key] for r in rows.values() if r.get(key)]
        n = {where: sum(pl.get("placement") == where for pl in plans) for where in ("v", "loop", "one_chunk")}
        out.append(f"- **{prop}'s placement**: the V on {n['v']} of {len(plans)} configs, the loop on {n['loop']}, "
                   f"one chunk per stage on {n['one_chunk']}")
    if all(r["gap_pct"] for r in rows.values()):
        gaps = {}
        for s in SCHEDULERS:
            g = [r["gap_pct"][s] for r in rows.values() if s in r["gap_pct"]]
            if g:
                gaps[s] = (statistics.fmean(g), len(g))
        out.append("- **mean gap to the lower bound** (one-chunk runs only; the bound is not valid for chunks): "
                   + ", ".join(f"{s} {g:.2f}%" + (f" ({n} configs)" if n != len(rows) else "")
                               for s, (g, n) in gaps.items()))
    spread = max(r["seed_spread_pct"] for r in rows.values())
    out.append(f"- **seeds**: largest spread of one scheduler's makespan across seeds {seed_range(seeds)}: "
               f"{spread:.3f}%")
    return "\n".join(out)


def targets(rows: dict) -> dict:
    """hetero_search: no regression against the best barrier built-in within the cap, and +3 % over
    zb_h1 on average; hetero_search_pv: no regression against the best built-in within the cap,
    barrier or post-validated (the ``pv_`` keys)."""
    h = headline(rows, PROPOSED)
    vb = [r["vs"][PROPOSED]["vs_best_builtin_pct"] for r in rows.values()]
    pv = [r["vs"][PROPOSED_PV]["vs_best_builtin_pct"] for r in rows.values()]
    return {"no_regression_vs_best_builtin": min(vb) >= -TIE, "worst_vs_best_builtin_pct": min(vb),
            "regressions": sum(x < -TIE for x in vb),
            "pv_no_regression_vs_best_builtin": min(pv) >= -TIE, "pv_worst_vs_best_builtin_pct": min(pv),
            "pv_regressions": sum(x < -TIE for x in pv),
            "mean_improvement_vs_zb_h1_pct": h["mean_pct"], "mean_improvement_target_met": h["mean_pct"] >= 3.0}


def first_seeds(raw_cell: dict, k: int) -> dict:
    """The cell's runs as if only its first k evaluation seeds had run."""
    return {n: {**r, "makespan_ms": {s: v[:k] for s, v in r["makespan_ms"].items()}} for n, r in raw_cell.items()}


def table_targets(t_by: dict, t_first: dict) -> str:
    """Both targets per cell; where a cell ran more seeds than 101-103, also on those three alone."""
    lines = ["| configs | split cost | jitter | seeds | hetero_search: 0 regressions > 0.5% vs best barrier built-in "
             "within cap (count, worst) | hetero_search_pv: 0 regressions > 0.5% vs best built-in within cap, barrier "
             "or post-validated (count, worst) | hetero_search: mean vs zb_h1 ≥ +3% | the same on seeds "
             f"{seed_range(SEEDS['j0'])} only |", "|---|---|---|---|---|---|---|---|"]
    ok = lambda b: "met" if b else "MISSED"  # noqa: E731
    cell = lambda t: (f"{ok(t['no_regression_vs_best_builtin'])} ({t['regressions']}, "  # noqa: E731
                      f"{t['worst_vs_best_builtin_pct']:+.2f}%) | {ok(t['pv_no_regression_vs_best_builtin'])} "
                      f"({t['pv_regressions']}, {t['pv_worst_vs_best_builtin_pct']:+.2f}%) | "
                      f"{ok(t['mean_improvement_target_met'])} "
                      f"({t['mean_improvement_vs_zb_h1_pct']:+.2f}%)")
    for (group, cost, jit), t in t_by.items():
        first = t_first.get((group, cost, jit))
        lines.append(f"| {group} | {cost} | {jit} | {seed_range(SEEDS[jit])} | {cell(t)} | "
                     + (cell(first).replace(" | ", "; ") if first else "(the same seeds)") + " |")
    return "\n".join(lines)


def table_placement(cases: list[dict]) -> str:
    lines = ["| device set | group | layers | uniform samples/s | FLOPs-prop. samples/s | best uniform samples/s | "
             "planned samples/s | gain vs uniform | vs FLOPs-prop. | vs best uniform | order changed | "
             "planned order (layers) | s |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    mark = lambda x: f"{x['samples_per_s']:.2f}" + ("" if x["fits"] else " (OOM)")  # noqa: E731
    for c in cases:
        p = c["planned"]
        order = ", ".join(f"{d}({n})" for d, n in zip(p["order"], p["layers"]))
        lines.append(f"| {c['name']} | {c['group']} | {c['layers']} | {mark(c['uniform'])} | "
                     f"{mark(c['flops_proportional'])} | {mark(c['best_uniform'])} | {mark(p)} | "
                     f"{c['gain_pct']:+.1f}% | {c['gain_vs_flops_pct']:+.1f}% | {c['gain_vs_best_uniform_pct']:+.1f}% | "
                     f"{'yes' if c['order_changed'] else 'no'} | {order} | {c['seconds']:.1f} |")
    g = [c for c in cases if c["flops_proportional"]["fits"]]
    if g:
        lines.append("")
        lines.append(f"Mean gain of the planner where the alternative fits: vs FLOPs-proportional "
                     f"{statistics.fmean(c['gain_vs_flops_pct'] for c in g):+.1f}% ({len(g)} sets), vs best uniform "
                     f"{statistics.fmean(c['gain_vs_best_uniform_pct'] for c in cases if c['best_uniform']['fits']):+.1f}%;"
                     f" the planner reorders devices in {sum(c['order_changed'] for c in cases)} of {len(cases)} sets.")
    return "\n".join(lines)


# --------------------------------------------------------------------------- charts
def charts(rows_by: dict, placement_cases: list[dict], out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    colors = {"gpipe": "#9e9e9e", "1f1b": "#1f77b4", "zb_h1": "#ff7f0e", "zb_h2": "#ffbb78", "zb_1p": "#bcbd22",
              "zb_v": "#8c564b", "interleaved_1f1b": "#9467bd", "interleaved_zb": "#17becf", "hops_hetero": "#2ca02c",
              PROPOSED: "#d62728", PROPOSED_PV: "#ff9896"}
    paths = []
    panels = [(g, "share", j) for g in ("reference", "own") for j in JITTERS]

    # 1. improvement vs ZB-H1 (hatched: holds more activation memory than ZB-H1)
    fig, axes = plt.subplots(len(panels), 1, figsize=(18, 4.2 * len(panels)))
    for ax, key in zip(axes, panels):
        rows = rows_by[key]
        names = list(rows)
        x = np.arange(len(names))
        shown = ["1f1b", "zb_h2", "zb_1p", "zb_v", "interleaved_1f1b", "interleaved_zb", "hops_hetero", PROPOSED,
                 PROPOSED_PV]
        wdt = 0.8 / len(shown)
        for i, s in enumerate(shown):
            vals = [rows[n]["delta_vs_zb_h1_pct"].get(s, np.nan) for n in names]
            bars = ax.bar(x + (i - (len(shown) - 1) / 2) * wdt, vals, wdt, label=s, color=colors[s])
            for bar, n in zip(bars, names):
                if s in rows[n]["fits_cap"] and not rows[n]["fits_cap"][s]:
                    bar.set_hatch("//")
        ax.axhspan(-TIE, TIE, color="#cccccc", alpha=0.5, lw=0, label="tie band ±0.5%")
        ax.axhline(0, color="black", lw=0.8)
        ax.set_xticks(x)
        ax.set_xticklabels(names, rotation=25, ha="right", fontsize=8)
        ax.set_ylabel("makespan improvement\nvs zb_h1 (%)")
        ax.set_title(f"{key[0]} configs, compute jitter {int(100 * JITTERS[key[2]])} %, split shares the fused "
                     "floor (hatched: more activation memory than ZB-H1)", fontsize=10)
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.005, 1.0))
    fig.tight_layout()
    p = out / "delta_vs_zb_h1.png"
    fig.savefig(p, dpi=100)
    plt.close(fig)
    paths.append(p)

    # 3. placement
    if not placement_cases:
        return paths
    fig, ax = plt.subplots(figsize=(15, 5))
    names = [c["name"] for c in placement_cases]
    x = np.arange(len(names))
    ax.bar(x - 0.2, [c["uniform"]["samples_per_s"] for c in placement_cases], 0.4, label="uniform partition",
           color="#9e9e9e")
    ax.bar(x + 0.2, [c["planned"]["samples_per_s"] for c in placement_cases], 0.4, label="planner", color="#d62728")
    for i, c in enumerate(placement_cases):
        ax.text(i + 0.2, c["planned"]["samples_per_s"], f"{c['gain_pct']:+.0f}%", ha="center", va="bottom",
                fontsize=7)
        if not c["uniform"]["fits"]:
            ax.text(i - 0.2, c["uniform"]["samples_per_s"], "OOM", ha="center", va="bottom", fontsize=7,
                    color="black")
    ax.set_xticks(x)
    ax.set_xticklabels(names, rotation=35, ha="right", fontsize=8)
    ax.set_ylabel(f"samples/s (simulated, {PROPOSED})")
    ax.set_title("Placement planner vs uniform partition (OOM: uniform exceeds a device's memory)", fontsize=11)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=9)
    fig.tight_layout()
    p = out / "placement.png"
    fig.savefig(p, dpi=110)
    plt.close(fig)
    paths.append(p)
    return paths


# --------------------------------------------------------------------------- provenance
def code_fingerprint() -> str:
    """Hash of the simulator's code and presets: the study is only meaningful if it did not
    change while the grid ran (the tree is shared with other work in progress)."""
    import hashlib

    h = hashlib.sha256()
    for path in sorted((ROOT / "hops").rglob("*")):
        if path.suffix in (".py", ".yaml") and "__pycache__" not in path.parts:
            h.update(path.relative_to(ROOT).as_posix().encode())
            h.update(path.read_bytes())
    return h.hexdigest()[:16]


def git_head() -> str:
    import subprocess

    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "hops"], cwd=ROOT, capture_output=True,
                               text=True, check=True).stdout.split("\n")
        dirty = [d[3:] for d in dirty if d.strip()]
        return head + (f" + uncommitted: {', '.join(dirty)}" if dirty else "")
    except Exception:  # noqa: BLE001  (no git: provenance is best effort)
        return "unknown"


# --------------------------------------------------------------------------- main
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m experiments.hetero_scheduler", description=__doc__.split("\n")[0])
    ap.add_argument("--json", type=Path, default=None, help="also write the results.json contract here")
    ap.add_argument("--out", type=Path, default=HERE, help="output folder (default: experiments/hetero_scheduler)")
    ap.add_argument("--reference", type=Path, default=Path(os.environ.get("HOPS_HETERO_BENCH", DEFAULT_REFERENCE)))
    ap.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1))
    ap.add_argument("--no-placement", action="store_true")
    args = ap.parse_args(argv)
    t_start = time.perf_counter()
    fp_start, head = code_fingerprint(), git_head()
    reference = sorted(args.reference.glob("*.yaml"))
    own = sorted((HERE / "configs").glob("*.yaml"))
    if len(reference) == 0:
        print(f"error: no reference configs in {args.reference}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)

    jobs = [(group, path, cost, jit) for group, paths in (("own", own), ("reference", reference))
            for path in paths for cost in FACTORS for jit in JITTERS]
    raw: dict = {}
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        futs = {pool.submit(run_config, str(path), FACTORS[cost], JITTERS[jit], SEEDS[jit]):
                (group, path.stem, cost, jit) for group, path, cost, jit in jobs}
        for fut, (group, name, cost, jit) in tqdm(futs.items(), desc="grid", unit="config", delay=2.0,
                                                  disable=None):
            raw.setdefault((group, cost, jit), {})[name] = fut.result()
            tqdm.write(f"  {group:9s} {cost:5s} {jit:3s} {name:30s} {raw[(group, cost, jit)][name]['seconds']:5.1f}s")
    keys = [(g, c, j) for g in ("reference", "own") for c in FACTORS for j in JITTERS]
    rows_by = {key: summarize(dict(sorted(raw[key].items()))) for key in keys}
    t_grid = time.perf_counter() - t_start
    abl: dict = {}
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        futs = {pool.submit(run_ablation, str(path), FACTORS[cost]): (group, path.stem, cost)
                for group, path, cost, jit in jobs if jit == "j0"}
        for fut, (group, name, cost) in tqdm(futs.items(), desc="ablations", unit="config", delay=2.0,
                                             disable=None):
            abl.setdefault((group, cost), {})[name] = fut.result()

    placement_cases = []
    if not args.no_placement:
        from .placement import cases, plan_case

        catalog = study_catalog({}, FACTORS["share"])
        with ProcessPoolExecutor(max_workers=args.jobs) as pool:
            futs = [pool.submit(plan_case, *c[:6], PROPOSED, catalog, c[6]) for c in cases(reference, own, catalog)]
            placement_cases = [f.result() for f in tqdm(futs, desc="placement", unit="case", delay=2.0, disable=None)]
    t_total = time.perf_counter() - t_start
    fp_end = code_fingerprint()
    if fp_end != fp_start:
        print("warning: hops/ changed while the study ran; rerun for consistent numbers", file=sys.stderr)

    default = rows_by[("reference", "share", "j0")]  # the JSON contract: default model, jitter 0, reference configs
    contract = {"configs": {n: dict(r["mean_ms"]) for n, r in default.items()},
                "lower_bound_ms": {n: r["lower_bound_ms"] for n, r in default.items()},
                "proposed": PROPOSED}
    (args.out / "results.json").write_text(json.dumps(contract, indent=2, sort_keys=True) + "\n")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(contract, indent=2, sort_keys=True) + "\n")
    tg = {key: targets(rows) for key, rows in rows_by.items()}
    n_first = len(SEEDS["j0"])
    t_first = {key: targets(summarize(first_seeds(dict(sorted(raw[key].items())), n_first))) for key in keys
               if len(SEEDS[key[2]]) > n_first}
    full = {"proposed": PROPOSED, "reference_schedule": REF, "seeds": SEEDS, "split_floor_factor": FACTORS,
            "jitter": JITTERS, "virtual_stages": VIRTUAL, "tie_pct": TIE,
            "tables": {"/".join(k): rows for k, rows in rows_by.items()},
            "headline": {"/".join(k): {s: headline(rows, s) for s in SCHEDULERS if s != REF}
                         for k, rows in rows_by.items()},
            "targets": {"/".join(k): t for k, t in tg.items()},
            "targets_first_seeds": {"/".join(k): t for k, t in t_first.items()},
            "makespans_ms": {"/".join(k): {n: r["makespan_ms"] for n, r in sorted(raw[k].items())} for k in keys},
            "ablations": {f"{g}/{c}": rows for (g, c), rows in abl.items()},
            "placement": placement_cases, "runtime_s": {"grid": t_grid, "total": t_total, "jobs": args.jobs},
            "provenance": {"git": head, "code_fingerprint": fp_start, "stable": fp_end == fp_start}}
    (args.out / "results_full.json").write_text(json.dumps(full, indent=2, sort_keys=True, default=str) + "\n")
    pngs = charts(rows_by, placement_cases, args.out)

    sections = {}
    for (g, c, j), rows in rows_by.items():
        seeds = seed_range(SEEDS[j])
        sections[f"{g}_{c}_{j}"] = (f"**Makespan (ms, mean of seeds {seeds}; * = more activation memory than "
                                    f"ZB-H1)**\n\n{table_makespans(rows)}\n\n**Summary**\n\n{summary_lines(rows, SEEDS[j])}")
    violations = [v for key in keys for r in raw[key].values() for v in r["bound_violations"]]
    full["bound_violations"] = violations
    (args.out / "results_full.json").write_text(json.dumps(full, indent=2, sort_keys=True, default=str) + "\n")
    if violations:
        print(f"warning: {len(violations)} runs beat the lower bound (a bug in the bound or the engine):",
              *violations[:10], sep="\n  ", file=sys.stderr)
    sections["bound_violations"] = ("none" if not violations else
                                    f"**{len(violations)} runs beat the lower bound**, so the bound (or the "
                                    "engine) has a bug under the current compute model:\n\n" +
                                    "\n".join(f"- {v}" for v in violations))
    sections["targets"] = table_targets(tg, t_first)
    sections["ablations"] = table_ablations(abl)
    sections["placement"] = table_placement(placement_cases) if placement_cases else "(skipped)"
    sections["provenance"] = (f"git {head}; hops code fingerprint {fp_start}"
                              + ("" if fp_end == fp_start else " (WARNING: hops/ changed during the run)"))
    sections["runtime"] = (f"{t_total:.0f} s wall for the whole study ({t_grid:.0f} s grid, {len(jobs)} jobs x "
                           f"{len(SCHEDULERS)} schedulers x {len(SEEDS['j0'])} or {len(SEEDS['j10'])} seeds; {args.jobs} worker "
                           f"processes; load "
                           f"average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores at the end)")
    text = (HERE / "narrative.md").read_text()
    for key, body in sections.items():
        text = text.replace(f"<!-- {key} -->", body)
    (args.out / "RESULTS.md").write_text(text)
    for key in keys:
        print(f"\n== {key[0]} configs, split cost {key[1]}, jitter {key[2]}\n{summary_lines(rows_by[key], SEEDS[key[2]])}")
    print(f"\n{table_targets(tg, t_first)}\n\nwrote {args.out / 'RESULTS.md'}, results.json, results_full.json"
          + "".join(f", {p.name}" for p in pngs) + f"\n{sections['runtime']}")
    return 0
