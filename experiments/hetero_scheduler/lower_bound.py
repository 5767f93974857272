"""Makespan lower bound from per-stage work, valid for every schedule the engine can run.

Per iteration and for every stage k (the bound is the max over k):

    LB_k = fill_k + min_{n=0..m} [ m F_k + (m-n) BW_k + n (B_k + W_k) + max(0, D_k - n W_k) ]
           (the n = 0 term reads m (F_k + BW_k) + D_k)

    fill_k = sum_{j<k} (F_j + x_j)          forward path of the first microbatch to reach k
    D_k    = sum_{0<j<k} min(B_j, BW_j) + min(BW_0, B_0 + W_0) + sum_{0<j<=k} x'_j   (D_0 = 0)

Why each term is unavoidable: stage k can start nothing before some forward input has
crossed stages 0..k-1 (fill). It then runs m forwards and m backwards, n of them split into
B + W and the rest fused (any mix per microbatch). After its last activation-gradient task
(B or BW) that microbatch's gradient still has to cross stages k-1..1 (each at least its
cheaper gradient task) and finish on stage 0 (fused, or B then W), which is D_k; the only
work stage k may overlap with that drain is its trailing W's, at most n of them. The
minimum over n makes the bound hold whether a schedule fuses, splits or mixes on stage k.

Times: F, B, W, BW are the compute model's expected per-stage times (summary stages
expected_ms), exact when compute_jitter is 0 (all configs here). Transfers x (forward,
j -> j+1) and x' (gradient, j -> j-1) are the shortest draw the run made on that directed
link in the iteration. Each directed link serves one stage pair and carries exactly m
messages per iteration, and its noise is drawn per use in order, so that set of draws is
the same for every schedule at a given seed; taking its minimum keeps the bound valid for
any order of messages. Between iterations the window also holds the host overhead and the
slowest optimizer step (both recorded in the run); the data-parallel all-reduce is left out
(the bound stays valid, only looser).

Tied embeddings: the engine all-reduces the embedding gradients between the first and the
last stage once both are done, before the optimizer. So the iteration also lasts at least
max(LB_0, LB_last, E) + sync: LB_0 is stage 0's own end, LB_last (the bound above for the
last stage) is at most when both the last stage and, after the drain, stage 0 are done, and
E = max over middle k of fill_k + m (F_k + min(BW_k, B_k)) + D_k is the earliest stage 0 can
be done behind stage k (k's last gradient task with all its W's deferred, then the drain).
"""
from __future__ import annotations

import numpy as np


def stage_bound(f, b, w, bw, m: int, xf, xb, sync_ms: float = 0.0, caps=None) -> tuple[float, int]:
    """Per-iteration bound and the stage k that sets it, from per-stage times and transfer lower
    bounds xf[j] (j -> j+1) and xb[j] (j -> j-1, xb[0] unused); sync_ms is the tied-embedding
    all-reduce that starts once both the first and the last stage are done. With ``caps``
    (activations a stage may hold) it is the memory-limited bound of ``memory_bound``."""
    p = len(f)
    per_stage, first_done = [], 0.0
    fill = 0.0
    for k in range(p):
        if k > 0:
            fill += f[k - 1] + xf[k - 1]
        if k == 0:
            drain = 0.0
        else:
            drain = min(bw[0], b[0] + w[0]) + sum(min(b[j], bw[j]) for j in range(1, k)) + sum(xb[1:k + 1])
        c = m if caps is None else caps[k]
        work = min(m * f[k] + (m - n) * bw[k] + n * (b[k] + w[k]) + max(0.0, drain - min(n, c) * w[k]) if n else
                   m * (f[k] + bw[k]) + drain for n in range(m + 1))
        end = fill + work
        if caps is not None:  # one of c slots serves ceil(m / c) microbatches, each for a round trip
            rt = f[k] + min(bw[k], b[k] + w[k]) + sum(xf[j - 1] + f[j] + min(b[j], bw[j]) + xb[j]
                                                      for j in range(k + 1, p))
            end = max(end, fill + -(-m // c) * rt)
        per_stage.append(end)
        if 0 < k < p - 1:  # stage 0 is done no earlier than k's last gradient task plus the drain
            first_done = max(first_done, fill + m * (f[k] + min(bw[k], b[k])) + drain)
    best = max(per_stage)
    arg = per_stage.index(best)
    if sync_ms > 0 and p > 1:
        # per_stage[0] is stage 0's own end; per_stage[-1] bounds when both the last stage and
        # (through the drain) stage 0 are done.
        best = max(best, max(per_stage[0], per_stage[-1], first_done) + sync_ms)
    return best, arg


def expected_times(summary: dict):
    st = summary["stages"]
    return ([s["expected_ms"]["F"] for s in st], [s["expected_ms"]["B"] for s in st],
            [s["expected_ms"]["W"] for s in st], [s["expected_ms"]["BW"] for s in st])


def sync_ms(result, catalog=None) -> float:
    """The run's tied-embedding all-reduce between first and last stage (0 if the model has none)."""
    try:
        from hops.model.collectives import tied_embedding_sync_ms
    except ImportError:
        return 0.0
    from hops.model.hardware import Catalog, Topology

    catalog = catalog or Catalog.load()
    return tied_embedding_sync_ms(result.scenario, catalog, Topology(result.scenario, catalog))


def run_bound(result, catalog=None) -> dict:
    """Lower bound on ``summary['makespan_ms']`` for this run's scenario, seed and model (pass
    the catalog the run used)."""
    summary, tl = result.summary, result.timeline
    sync = sync_ms(result, catalog)
    f, b, w, bw = expected_times(summary)
    p = len(f)
    m = tl.microbatches_per_iteration
    t0, t1 = summary["window"]["start_ms"], summary["window"]["end_ms"]
    its = np.unique(tl.iteration[(tl.iteration >= 0) & (tl.start_ms >= t0 - 1e-9) & (tl.end_ms <= t1 + 1e-9)])
    host = list(result.extras.get("host_overhead_ms", [0.0] * (int(its.max()) + 1 if len(its) else 0)))
    xfer = tl.kind == "transfer"
    dur = tl.end_ms - tl.start_ms
    total, per_iter, stage = 0.0, [], 0
    for it in its.tolist():
        xf, xb = [0.0] * p, [0.0] * p
        sel = xfer & (tl.iteration == it)
        for j in range(p):
            fw = sel & (tl.stage == j) & (tl.phase == "F")
            bk = sel & (tl.stage == j) & (tl.phase != "F")
            xf[j] = float(dur[fw].min()) if fw.any() else 0.0
            xb[j] = float(dur[bk].min()) if bk.any() else 0.0
        lb, stage = stage_bound(f, b, w, bw, m, xf, xb, sync)
        opt = (tl.kind == "optimizer") & (tl.iteration == it)
        # the host overhead sits before the optimizer: it is inside the window unless it closes
        # the last iteration with no step after it
        in_window = it < len(host) and (opt.any() or it != its[-1])
        lb += (host[it] if in_window else 0.0) + (float(dur[opt].max()) if opt.any() else 0.0)
        per_iter.append(lb)
        total += lb
    return {"lower_bound_ms": total, "per_iteration_ms": per_iter, "bottleneck_stage": stage, "sync_ms": sync,
            "transfer_lb_ms": (xf, xb)}


def expected_bound(summary: dict, transfer_ms, m: int, iterations: int) -> float:
    """The same bound from expected transfer times (a planning figure; not a guarantee under jitter)."""
    f, b, w, bw = expected_times(summary)
    xb = [0.0] + list(transfer_ms[:-1])
    return iterations * stage_bound(f, b, w, bw, m, list(transfer_ms), xb)[0]


def memory_bound(f, b, w, bw, m: int, xf, xb, caps, sync_ms: float = 0.0) -> float:
    """Diagnostic bound for schedules that hold at most caps[k] activations on stage k.

    Two additions to stage_bound: at the last gradient task at most caps[k] W's can still be
    pending (each holds its activations), and a microbatch occupies one of the caps[k] slots
    from its forward until its backward ends, which takes at least the round trip R_k through
    the stages after k; interval graphs with at most c overlapping intervals split into c
    chains, so one slot serves ceil(m / c) microbatches one after another.
    """
    return stage_bound(f, b, w, bw, m, xf, xb, sync_ms, caps)[0]
