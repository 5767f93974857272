"""HeteroSearch: choose, per stage and per microbatch, fused or split backward, by search.

Why: splitting backward into B (activation gradient) and W (weight gradient) pays off only
where B sits on the critical path and the stage has idle time to absorb W. On a saturated
stage the split costs time (an extra launch, and in the seed's model an extra dispatch
floor), so ZeroBubble's all-or-nothing split loses there; 1F1B's all-fused never collects
the gain where it exists. The seed's HopsHetero picks between the two for the whole
pipeline; here the choice is made per stage and per microbatch.

How (configure time, from the expected per-stage F/B/W/BW and transfer times only):
a small event simulation that mirrors the engine (hops.schedulers.replay: one task per device,
FIFO links) runs candidate policies and keeps the shortest. A policy is a greedy list schedule (B first,
then F under the activation cap, then a deferred W) plus, for every stage, how many of the
first (``head``) and last (``tail``) microbatches run split; the rest run fused. The
candidates always include the built-in static schedules that fit the cap (1F1B, GPipe,
ZB-H1, ZB-H2) and the all-split greedy, so the search never predicts worse than them, and
a coordinate descent over (head, tail) per stage finds where splits pay. The activation cap
is the ZB-H1 level (min(p, m) microbatches on every stage, 1F1B's peak) unless
``max_in_flight`` (one cap for every stage) or ``extra_in_flight`` (min(p, m) + extra) say
otherwise, so by default no stage holds more activations than 1F1B's stage 0.

The V placement (ZB-V's: device d holds chunks d and 2p - 1 - d, embedding and LM head both
on device 0, split backward). Where heterogeneity makes the V worth it (a heavy head stage:
the LM head moves to device 0; deep mixed pipelines: a fill of p - 1 chunk units; a slow
link between the model's ends: no tied-embedding all-reduce) the search also plans over it:
zb_v's 8 list-schedule orders (its rules at unit and at expected times, both tie-breaks, both
W policies) replayed here under the engine's rules, then the same fused-or-split choice as
above, per device (first ``head`` / last ``tail`` microbatches split, the rest fused),
busiest devices first, within the budget. Fusing only ever frees an activation earlier, so
every V plan holds at most 2 min(p, m) chunk activations of half a stage per device, the
same cap.

The loop placement (interleaved 1F1B's: chunk c of device d is virtual stage c p + d, the LM
head on the last device) runs interleaved_zb's order (PyTorch's interleaved zero bubble), not
searched: where a straggler sits mid-pipeline it halves the fill ahead of it without moving
the LM head, and it holds 2p chunk activations of half a stage (the cap) where m is a
multiple of p, or fewer than p.

The placement is chosen per config by simulated makespan at the expected times, end to end
(each placement's tied-embedding all-reduce and slowest optimizer step, PipelineMeta.flush_ms,
added to its one-iteration makespan): one chunk, then the V, then the loop, each challenging
the plan so far, which it replaces only by predicting MIN_GAIN better, since two chunks send
twice the pipeline messages (slow links: the one-chunk plan wins). The engine gives the
scheduler each placement's meta (PipelineMeta.layout_for) and lays the run out as
``chosen_placement`` says. With ``pipeline.virtual_stages: 2`` only the V is searched. A chunk
holds whole layers, as hops.scenario requires of virtual stages: where a stage derived from the
architecture has an odd layer count (PipelineMeta.stage_layers), the V and the loop would each
run half a layer, so they are not candidates, and asking for one by name is a scenario error.

Under jitter (the compute times vary: compute_jitter, measured distributions) the expected
times are not enough: a plan's margin at the expected times can be smaller than what the
spread does to a fixed order (a fused backward leaves no W to fill a late input; two chunks send
twice the messages). The search then draws JITTER_DRAWS iterations of compute times from its
own stream (the run's "search" stream of ``search_seed``, default the scenario seed; never the
stream the run's times come from, PipelineMeta.draw_times) and judges its finalists -- the
built-ins and the rule orders it had as candidates, zb_v's own order among them, and its own
winners -- by their mean makespan over those draws, with the rules the expected times use:
a searched order must beat the best built-in of its placement by MIN_GAIN. A plan that ties
zb_v's order therefore runs zb_v's order. The placements are then compared on their own draws,
as many as it takes to resolve the difference (leads_under_draws): a challenger replaces the
plan so far when it leads by more than two standard errors, which can be less than MIN_GAIN,
since the replays on draws are the engine's rules and what is left of their error is the
sampling error the draws measure.

Under optimizer post-validation (``optimizer.post_validation: true``: no barrier between
iterations, each device starts its next one when its own optimizer step is done) one
iteration's makespan is the wrong measure, unless the run has only one (iterations_of): an
order whose devices finish in the order they start overlaps the next iteration, and zb_v's
building-block rule reaches zero steady-state bubble that way. So the finalists (the built-ins,
zb_v's rule orders and -- planned over two iterations with that rule among its candidates, ZBV
configured with the same meta -- zb_v's post-validated order as the V's built-in, and the
search's winners) are judged as zb_v judges its candidates there: their fixed orders replayed
over two iterations back to back (iterations_of, back_to_back), at the expected times or, under
jitter, on the mean of draws of two iterations' times; the V's fused-or-split descent replays
two iterations too and may start from zb_v's order. The one-chunk greedy descent still plans
one iteration (its policy knows no iterations); its winner is one finalist among the others.
With the barrier nothing of this runs, and the plans are the one-iteration ones.

Options: max_in_flight, extra_in_flight, search_passes (coordinate-descent passes, 2),
search_budget (simulated tasks, 2e5 for each placement, so a 16 x 64 pipeline configures in
under 1 s at jitter 0: benchmarks/scheduler_bench.py), per_microbatch (False: each stage
all-fused or all-split, an ablation), placement ("auto", the default; "one_chunk"; "v"; "loop"),
search_seed (the seed of the draws above) and jitter_draws (how many, JITTER_DRAWS).

The winner is replayed as a fixed per-stage task order (StaticOrderScheduler semantics; a
two-chunk plan as a fixed per-device order over the device's chunks, DeviceOrderScheduler's):
with deterministic times the run reproduces the prediction exactly (the internal simulation
asks the policy at the same moments the engine does, and a non-idling greedy schedule is
reproduced by its own order); with jitter the order stays deadlock-free because it came from
a feasible execution. Replaying the greedy policy itself instead was tried and was worse
under compute jitter (see the study's research log).

This follows the published idea of ZeroBubble's automatic scheduling (Qi et al., "Zero
Bubble Pipeline Parallelism", ICLR 2024: a heuristic search over schedules given profiled
F/B/W times under a memory limit), extended with the fused-or-split choice; it is written
from that description, not from its code.
"""
from __future__ import annotations

from statistics import fmean, stdev
from typing import Sequence

import numpy as np

from hops.errors import ScenarioError
from hops.schedulers.base import (PipelineMeta, Scheduler, SchedulerState, StaticOrderScheduler, Task, device_maps, whole_option,
                   next_in_device_order)
from hops.schedulers.classic import GPipe, OneFOneB
from hops.schedulers.interleaved_zb import InterleavedZeroBubble, check_rounds, rounds_divide
from hops.schedulers.replay import (back_to_back, iterations_of, repeat_orders, replay_device_orders,
                                    simulate_policy)
from hops.schedulers.zb_v import ZBV, expected_times, list_schedule, stage_orders, v_placement
from hops.schedulers.zero_bubble import ZBH1, ZBH2

_CACHE: dict[tuple, "Plan"] = {}
_CACHE_MAX = 256
MIN_GAIN = 0.003  # predicted fraction a searched plan must beat the best fitting built-in by
# Draws of one iteration's compute times the finalists are judged on when times vary: at 10 %
# jitter one draw's makespan spreads about 1 %, so 64 draws pin a mean to about 0.13 %, inside
# MIN_GAIN (16 draws erred 0.4 %). The choice between placements starts from as many.
JITTER_DRAWS = 64
# The most draws the choice between two placements takes to resolve a difference (leads_under_draws):
# at 10 % jitter, 1024 per placement resolve about 0.09 % (two standard errors)
MAX_DRAWS = 1024
PLACEMENTS = ("one_chunk", "v", "loop")  # one chunk per stage, ZB-V's V, interleaved 1F1B's loop
LABEL = {"v": "V: ", "loop": "loop: "}  # a two-chunk plan's label starts with its placement


class Plan:
    """The chosen schedule: per-stage task orders, the engine's split modes, and how it was found."""

    __slots__ = ("orders", "modes", "makespan", "label", "evaluated", "baselines", "params", "placement",
                 "device_orders", "alternatives", "candidates")

    def __init__(self, orders, makespan, label, evaluated, baselines, params=None, placement=None,
                 device_orders=None):
        self.params = params  # (head, tail, f_first) of the winning greedy policy, None for a built-in
        self.placement = placement  # None: one chunk per stage; else (stage, chunk) per virtual stage (V or loop)
        self.device_orders = device_orders  # two chunks only: per device, (virtual stage, phase, microbatch)
        self.alternatives = {}  # predicted makespan of the best plan per placement (PLACEMENTS)
        # label -> orders (per stage; per device for two chunks) of the finalists the jitter draws decide
        # between (choose_under_draws); a built-in's label starts with "built-in", the V's rule orders' with "zb_v"
        self.candidates = {}
        self.orders = orders
        self.makespan = makespan
        self.label = label
        self.evaluated = evaluated
        self.baselines = baselines
        modes = []
        for order in orders:
            kinds = {ph for ph, _ in order if ph in ("B", "BW")}
            modes.append("either" if kinds == {"B", "BW"} else kinds == {"B"})
        self.modes = modes

    @property
    def placement_name(self) -> str:
        """One of PLACEMENTS."""
        if self.placement is None:
            return "one_chunk"
        return "v" if list(self.placement) == v_placement(len(self.placement) // 2) else "loop"


# --------------------------------------------------------------------------- policies the replays run
def static_policy(orders: Sequence[Sequence[Task]]):
    """Run fixed per-stage orders: a stage waits until the next task in its order is ready."""

    def choose(state: SchedulerState):
        s = state.stage
        order = orders[s]
        pos = state.started[s]
        if pos >= len(order):
            return None
        phase, j = order[pos]
        ready = state.f_ready if phase == "F" else state.w_ready if phase == "W" else state.b_ready
        return order[pos] if ready[s][j] else None

    return choose


def greedy_policy(m: int, caps: Sequence[int], head: Sequence[int], tail: Sequence[int], f_first: bool = False):
    """Greedy list schedule: ready backward first (split iff the microbatch is among the first
    ``head[s]`` or last ``tail[s]``), then the next forward if the stage holds fewer than
    ``caps[s]`` activations, then the oldest deferred W. ``f_first`` swaps the first two."""
    split_mb = []
    for h, t in zip(head, tail):
        h = min(h, m)
        t = min(t, m - h)
        flags = bytearray(m)
        for j in list(range(h)) + list(range(m - t, m)):
            flags[j] = 1
        split_mb.append((flags, [j for j in range(m) if flags[j]]))

    def choose(state: SchedulerState):
        s = state.stage
        nb, nf = state.n_b[s], state.n_f[s]
        flags, wlist = split_mb[s]
        b_ok = nb < m and state.b_ready[s][nb]
        f_ok = nf < m and state.f_ready[s][nf] and state.in_flight[s] < caps[s]
        if b_ok and not (f_first and f_ok):
            return ("B" if flags[nb] else "BW", nb)
        if f_ok:
            return ("F", nf)
        nw = state.n_w[s]
        if nw < len(wlist) and state.w_ready[s][wlist[nw]]:
            return ("W", wlist[nw])
        return None

    return choose


# The static built-ins the search replays as baselines (imported here, not looked up in the
# registry: the registry in schedulers/__init__ imports this module).
_STATIC_BUILTINS = {cls.name: cls for cls in (OneFOneB, GPipe, ZBH1, ZBH2)}


def builtin_orders(name: str, p: int, m: int) -> list[list[Task]]:
    """A built-in static schedule's per-stage orders, from the built-in itself (one definition)."""
    cls = _STATIC_BUILTINS[name]
    return [cls().stage_order(s, p, m) for s in range(p)]


def peak_in_flight(order: Sequence[Task]) -> int:
    """Most microbatches an order holds at once (a forward until its BW or W)."""
    held = peak = 0
    for phase, _ in order:
        if phase == "F":
            held += 1
            peak = max(peak, held)
        elif phase in ("BW", "W"):
            held -= 1
    return peak


def peak_held(order, weight: Sequence[float] | None = None) -> float:
    """What memory charges an order of (virtual stage, phase, microbatch) at its peak, in
    stashes, counted as the engine's peak_held counts it (hops.engine.events): a microbatch
    between its B and its W on virtual stage s weighs ``weight[s]``, the others 1; None: the
    plain count, peak_in_flight.

    Why: under full recomputation a deferred W needs its GEMMs' inputs and output gradients
    (hops.model.memory.pending_w_weights), several stashes' worth, so counting it as one stash
    would call a placement feasible that the run's peak memory overruns."""
    if weight is None:
        return peak_in_flight([task[-2:] for task in order])
    held = 0
    pending: dict[int, int] = {}
    peak = 0.0
    for s, phase, _ in order:
        if phase == "F":
            held += 1
        elif phase == "B":
            pending[s] = pending.get(s, 0) + 1
        else:  # BW or W: the microbatch is released
            held -= 1
            if phase == "W":
                pending[s] -= 1
            continue
        peak = max(peak, held + sum((weight[k] - 1.0) * pending[k] for k in sorted(pending)))
    return peak


# --------------------------------------------------------------------------- search
BASELINES = tuple(_STATIC_BUILTINS)


def search(meta: PipelineMeta, caps: Sequence[int], max_passes: int = 2, budget: float = 2e5,
           per_microbatch: bool = True) -> Plan:
    """Best schedule found for this pipeline (memoized on the expected times and settings).

    ``budget`` caps the simulated tasks spent (deterministic, so a rerun finds the same plan);
    the baselines and seeds always run, the descent stops when the budget is spent.
    ``per_microbatch=False`` restricts every stage to all-fused or all-split (an ablation).
    """
    key = (meta.n_stages, meta.n_microbatches, tuple(meta.f), tuple(meta.b), tuple(meta.w), tuple(meta.bw),
           tuple(meta.devices), tuple(meta.transfer_ms), tuple(caps), max_passes, budget, per_microbatch)
    hit = _CACHE.get(key)
    if hit is not None:
        return hit
    p, m = meta.n_stages, meta.n_microbatches
    evaluated = 0

    def run(policy):
        nonlocal evaluated
        evaluated += 1
        return simulate_policy(meta, policy)[0]

    # The built-ins, as they would run here, each only if its activations fit the caps; the
    # greedy all-split policy (the old zero_bubble) is a baseline too.
    baselines, builtin = {}, {}
    for name in BASELINES:
        orders = builtin_orders(name, p, m)
        if all(peak_in_flight(o) <= c for o, c in zip(orders, caps)):
            builtin[name] = orders
            baselines[name] = run(static_policy(orders))
    baselines["greedy_split"] = run(greedy_policy(m, caps, [0] * p, [m] * p))
    best_label = min(baselines, key=baselines.get)
    best_t, best_x = baselines[best_label], None

    def consider(x) -> float:
        nonlocal best_t, best_x
        t = run(greedy_policy(m, caps, *x))
        if t < best_t - 1e-9:
            best_t, best_x = t, (list(x[0]), list(x[1]), x[2])
        return t

    # Seeds: all fused (a greedy 1F1B), split of the last p - s (ZB-H1's deferred W's), all split.
    seeds = [[0] * p, [m] * p] + ([[min(p - s, m) for s in range(p)]] if per_microbatch else [])
    starts = []
    for f_first in (False, True):
        for tail in seeds:
            starts.append((consider(([0] * p, tail, f_first)), tail, f_first))
    cur, tail, f_first = min(starts, key=lambda z: z[0])
    head, tail = [0] * p, list(tail)
    # Coordinate descent over (head, tail) per stage, stages with the most slack first (that is
    # where a split is most likely to be free).
    totals = [meta.f[s] + meta.bw[s] for s in range(p)]
    order = sorted(range(p), key=lambda s: totals[s])
    spent = evaluated * p * m * 3
    for _ in range(max_passes):
        improved = False
        for s in order:
            if per_microbatch:
                moves = (("tail", (0, 1, 2, 4, p - s, m)), ("head", (0, 1, 2, p - s)))
            else:
                moves = (("tail", (0, m)),)
            for which, values in moves:
                vec = tail if which == "tail" else head
                for v in sorted(set(min(max(x, 0), m) for x in values)):
                    if v == vec[s] or spent > budget:
                        continue
                    old, vec[s] = vec[s], v
                    t = consider((head, tail, f_first))
                    spent += p * m * 3
                    if t < cur - 1e-9:
                        cur, improved = t, True
                    else:
                        vec[s] = old
        if not improved or spent > budget:
            break

    # The internal simulation is not the engine (one iteration, backward hops priced as forward
    # ones): a searched plan replaces the best built-in only when it predicts more than
    # MIN_GAIN, else a model error smaller than its margin could make it the slower one.
    ref = min((baselines[b] for b in builtin), default=float("inf"))
    searched = best_x
    if best_x is not None and best_t > ref * (1.0 - MIN_GAIN):
        best_x, best_label, best_t = None, min(builtin, key=baselines.get), ref
    if best_x is None and best_label in builtin:
        orders, label = builtin[best_label], f"built-in {best_label}"
    else:
        x = best_x or ([0] * p, [m] * p, False)
        orders = simulate_policy(meta, greedy_policy(m, caps, *x), record=True)[1]
        label = "searched" if best_x else "greedy_split"
    plan = Plan(orders, best_t, label, evaluated, baselines, best_x)
    plan.candidates = {f"built-in {name}": builtin[name] for name in builtin}
    plan.candidates["greedy_split"] = simulate_policy(meta, greedy_policy(m, caps, [0] * p, [m] * p), record=True)[1]
    if searched is not None:
        plan.candidates["searched"] = simulate_policy(meta, greedy_policy(m, caps, *searched), record=True)[1]
    if len(_CACHE) >= _CACHE_MAX:
        _CACHE.clear()
    _CACHE[key] = plan
    return plan

# --------------------------------------------------------------------------- the V placement
def device_policy(orders: Sequence[Sequence[tuple[int, str, int]]], device_of: Sequence[int],
                  hosted: Sequence[Sequence[int]]):
    """Run fixed per-device orders of (virtual stage, phase, microbatch), DeviceOrderScheduler's
    semantics: a device starts its next task when that task's stage is asked and it is ready."""

    def choose(state: SchedulerState):
        s = state.stage
        d = device_of[s]
        started = state.started
        pos = 0
        for k in hosted[d]:
            pos += started[k]
        order = orders[d]
        if pos >= len(order):
            return None
        k, phase, j = order[pos]
        if k != s:
            return None
        ready = state.f_ready if phase == "F" else state.w_ready if phase == "W" else state.b_ready
        return (phase, j) if ready[s][j] else None

    return choose


def fuse_orders(orders, split_of):
    """Device orders with some split backwards fused: (k, j) whose ``split_of[k][j]`` is 0 runs BW
    where its B ran, and its W is dropped. The order stays feasible (every task's inputs come from
    tasks that still run, no later than before) and holds activations no longer than before."""
    out = []
    for order in orders:
        new = []
        for k, ph, j in order:
            if split_of[k][j]:
                new.append((k, ph, j))
            elif ph == "B":
                new.append((k, "BW", j))
            elif ph != "W":
                new.append((k, ph, j))
        out.append(new)
    return out


def v_peak_chunks(orders) -> list[int]:
    """Most chunk activations each device holds at once under its order."""
    out = []
    for order in orders:
        held = peak = 0
        for _, ph, _ in order:
            if ph == "F":
                held += 1
                peak = max(peak, held)
            elif ph in ("W", "BW"):
                held -= 1
        out.append(peak)
    return out


def search_v(meta: PipelineMeta, cap_chunks: int, max_passes: int = 2, budget: float = 2e5):
    """Best V order found for the V meta (2p virtual stages, device d holds d and 2p-1-d).

    Candidates: ZB-V's list-schedule rules (hops.schedulers.zb_v) at unit and at the expected
    times, both B tie-breaks and both W policies (8 of the orders zb_v chooses from; zb_v's own
    pick, labelled "built-in zb_v", joins them), each replayed
    here under the engine's rules (FIFO links included). Then the same fused-or-split choice
    the one-chunk search makes: per device, a coordinate descent over which microbatches'
    backwards run fused (first ``head`` and last ``tail`` split, the rest fused), busiest
    devices first (where a W's extra launch costs the most). Returns (makespan, device orders,
    label, evaluated, candidates: label -> device orders of every rule order and of the fused
    winner) or None when no candidate fits ``cap_chunks``.
    """
    n, m = meta.n_stages, meta.n_microbatches
    p = n // 2
    expected = expected_times(meta)
    device_of, hosted = device_maps(v_placement(p))
    evaluated = 0
    its, meta_e = iterations_of(meta), back_to_back(meta)

    def run(orders) -> float:
        nonlocal evaluated
        evaluated += 1
        return replay_device_orders(meta_e, repeat_orders(orders, m, its), device_of)

    best = None
    seen = set()
    candidates = {}
    for times in (None, expected):
        for w_first in (False, True):
            for b_first in (1, 0):
                r = list_schedule(p, m, times, b_first, w_first=w_first)
                if r is None or max(r[1]) > cap_chunks:
                    continue
                orders = stage_orders(r[2])
                key = tuple(tuple(o) for o in orders)
                if key in seen:
                    continue
                seen.add(key)
                t = run(orders)
                name = f"zb_v rules ({'unit' if times is None else 'expected'} times)"
                candidates[f"{name}, b_first {b_first}, w_first {w_first}"] = orders
                if best is None or t < best[0] - 1e-9:
                    best = (t, orders, name)
    if best is None:
        return None
    # zb_v's own order is the V's built-in: under jitter another order must beat it by MIN_GAIN
    # (choose_under_draws). It need not be one of the rule orders above (zb_v also has its
    # building-block rule, and under post-validation plans over two iterations), so the descent
    # may start from it too.
    zbv = ZBV()
    zbv.configure(meta)
    if max(v_peak_chunks(zbv.order)) <= cap_chunks:
        own = tuple(tuple(o) for o in zbv.order)
        candidates = {label: o for label, o in candidates.items() if tuple(tuple(x) for x in o) != own}
        candidates["built-in zb_v"] = zbv.order
        t = run(zbv.order)
        if t < best[0] - 1e-9:
            best = (t, zbv.order, "zb_v's post-validated order" if meta.post_validation else "zb_v's building-block order")
    best_t, base, label = best
    # Fused-or-split per device: a coordinate descent from all-split, busiest devices first.
    split_of = [bytearray(b"\x01" * m) for _ in range(n)]
    ht = [[m, 0] for _ in range(p)]  # (head, tail) split counts per device; (m, 0) = all split
    load = [meta.f[d] + meta.bw[d] + meta.f[n - 1 - d] + meta.bw[n - 1 - d] for d in range(p)]
    spent = evaluated * 3 * n * m
    improved_any = False
    for _ in range(max_passes):
        improved = False
        for d in sorted(range(p), key=lambda d: -load[d]):
            for h, t in ((0, 0), (0, 1), (0, 2), (0, min(p, m)), (min(p - d, m), 0), (1, 1), (m, 0)):
                if [h, t] == ht[d] or spent > budget:
                    continue
                trial = [bytearray(x) for x in split_of]
                for k in hosted[d]:
                    flags = bytearray(m)
                    for j in list(range(min(h, m))) + list(range(m - min(t, m), m)):
                        flags[j] = 1
                    trial[k] = flags
                orders = fuse_orders(base, trial)
                t_ms = run(orders)
                spent += 3 * n * m
                if t_ms < best_t - 1e-9:
                    best_t, split_of, ht[d], improved = t_ms, trial, [h, t], True
                    improved_any = True
        if not improved or spent > budget:
            break
    orders = fuse_orders(base, split_of) if improved_any else base
    label += ", fused where it pays" if improved_any else ""
    if improved_any:
        candidates[label] = orders
    return best_t, orders, label, evaluated, candidates


# --------------------------------------------------------------------------- under jitter
def jitter_draws(meta: PipelineMeta, seed: int, n: int):
    """n draws of one iteration's compute times per (virtual) stage, in stage_times' layout, from
    the "search" stream of ``seed`` (PipelineMeta.draw_times); None when the times do not vary (no
    jitter, constant distributions: then the expected times are the times)."""
    if meta.draw_times is None:
        return None
    m = meta.n_microbatches
    raw = meta.draw_times(seed, n * m)
    if not any(np.ptp(a) > 0 for st in raw for a in st.values()):
        return None
    return [[tuple(st[ph][i * m:(i + 1) * m].tolist() for ph in ("F", "B", "W", "BW")) for st in raw]
            for i in range(n)]


def makespans_under_draws(meta: PipelineMeta, orders, draws, placement=None) -> list[float]:
    """Makespan of fixed orders on each draw, run as the engine runs them (per device over the
    placement's chunks, or per stage when there is none: one chunk per stage)."""
    n = meta.n_stages
    if placement is not None:
        device_of = device_maps(placement)[0]
        return [replay_device_orders(meta, orders, device_of, d) for d in draws]
    if len(set(meta.devices)) == n:  # one stage per device: the heap-free replay is exact
        dev = [[(s, ph, j) for ph, j in o] for s, o in enumerate(orders)]
        return [replay_device_orders(meta, dev, range(n), d) for d in draws]
    return [simulate_policy(meta, static_policy(orders), times=d)[0] for d in draws]


def mean_under_draws(meta: PipelineMeta, orders, draws, placement=None) -> float:
    """Mean makespan of fixed orders over the draws (makespans_under_draws)."""
    return fmean(makespans_under_draws(meta, orders, draws, placement))


def plan_orders(plan: Plan):
    """The orders a plan runs: per stage for one chunk per stage, per device over two chunks."""
    return plan.orders if plan.placement is None else plan.device_orders


def leads_under_draws(meta: PipelineMeta, plan: Plan, meta_b: PipelineMeta, plan_b: Plan, seed: int,
                      n_draws: int) -> bool | None:
    """Under jitter: does plan_b (another placement's plan, with its meta) run shorter than
    ``plan`` on average, end to end (each placement's flush added), by more than the draws' own
    uncertainty? None without jitter.

    Why not MIN_GAIN here: that margin stands for the error of a model of the engine, and what
    judges two placements' plans is the engine's own rules replayed on draws of the run's law
    (test_under_jitter_the_search_draws_estimate_what_the_engine_runs_with_each_placement), so
    the error left is the draws' sampling error, which they measure. Two placements' draws are
    independent (a chunk is half a stage), so a lead of a few tenths of a percent sits inside 64
    draws' noise (about 0.17 % on the difference at 10 % jitter): the draws double, up to
    MAX_DRAWS, until the difference is outside two standard errors. A difference still inside
    them is a tie, and a tie is left to ``plan``, the placement tried first (one chunk, then the
    V: fewer messages first). Memoized on the plans and the draws' seed."""
    its = iterations_of(meta)
    m = meta.n_microbatches
    first = [jitter_draws(back_to_back(mt), seed, n_draws) for mt in (meta, meta_b)]
    if None in first:
        return None
    key = ("lead", its, tuple(meta.f), tuple(meta.b), tuple(meta.w), tuple(meta.bw), tuple(meta.devices),
           tuple(meta.transfer_ms), tuple(meta_b.transfer_ms), meta.blocking_send, meta.flush_ms, meta_b.flush_ms,
           plan.placement_name, tuple(map(tuple, plan_orders(plan))), plan_b.placement_name,
           tuple(map(tuple, plan_orders(plan_b))),
           hash(tuple(x for draws in first for d in draws for st in d for ph in st for x in ph)))
    if key in _CACHE:
        return _CACHE[key]
    runs = [(mt, repeat_orders(plan_orders(pl), m, its), pl.placement) for mt, pl in ((meta, plan), (meta_b, plan_b))]
    n = n_draws
    while True:
        stats = []
        for k, (mt, orders, placement) in enumerate(runs):
            draws = first[k] if n == n_draws else jitter_draws(back_to_back(mt), seed, n)
            x = makespans_under_draws(back_to_back(mt), orders, draws, placement)
            stats.append((fmean(x) + its * mt.flush_ms, stdev(x) ** 2 / n if n > 1 else float("inf")))
        (mean_a, var_a), (mean_b, var_b) = stats
        diff, se = mean_a - mean_b, (var_a + var_b) ** 0.5
        lead = diff > 2 * se
        if abs(diff) > 2 * se or n >= max(MAX_DRAWS, n_draws):
            break
        n *= 2
    if len(_CACHE) >= _CACHE_MAX:
        _CACHE.clear()
    _CACHE[key] = lead
    return lead


def choose_under_draws(meta: PipelineMeta, plan: Plan, draws) -> Plan:
    """Under jitter: the finalist whose fixed orders run shortest on average over the draws.
    Under post-validation: the finalist whose orders run shortest over two iterations back to
    back (iterations_of; on average over the draws, each then two iterations' times, under jitter).

    Why: the search plans at the expected times, where a plan's margin can be smaller than what
    jitter does to a fixed order (a fused backward leaves no W to fill a late input; a V sends
    twice the messages). The finalists are every order the expected-time search had as a
    built-in or rule order (1F1B, GPipe, ZB-H1, ZB-H2; zb_v's rule orders for the V) and its own
    winners; the same rule then applies to their mean over the draws as to their makespan at the
    expected times (a searched one-chunk order must beat the best built-in by MIN_GAIN). The
    draws come from the search's own stream (jitter_draws), never from the run's: the run's
    times are drawn after the plan is fixed. Memoized on the finalists and the draws.
    """
    its = iterations_of(meta)
    if draws is None and its == 1:
        return plan
    key = ("draws", its, plan.placement_name, meta.n_stages, meta.n_microbatches, tuple(meta.f), tuple(meta.b),
           tuple(meta.w), tuple(meta.bw), tuple(meta.devices), tuple(meta.transfer_ms), meta.blocking_send,
           tuple((label, tuple(map(tuple, o))) for label, o in plan.candidates.items()),
           None if draws is None else hash(tuple(x for d in draws for st in d for ph in st for x in ph)))
    hit = _CACHE.get(key)
    if hit is not None:
        return hit
    m = meta.n_microbatches
    runs = [None] if draws is None else draws  # None: the expected times
    means = {label: mean_under_draws(back_to_back(meta), repeat_orders(o, m, its), runs, plan.placement)
             for label, o in plan.candidates.items()}
    best = min(means, key=means.get)
    builtins = [label for label in means if label.startswith("built-in")]
    if builtins and not best.startswith("built-in"):
        ref = min(builtins, key=means.get)
        if means[best] > means[ref] * (1.0 - MIN_GAIN):
            best = ref
    over = "" if its == 1 else " of two iterations back to back"
    label = (f"{best}, chosen on two iterations back to back" if draws is None
             else f"{best}, chosen on the mean of {len(draws)} jitter draws{over}")
    evaluated = plan.evaluated + len(means) * len(runs)
    if plan.placement is not None:
        out = device_plan(meta, means[best], plan.candidates[best], LABEL[plan.placement_name] + label, evaluated,
                          plan.placement)
    else:
        out = Plan(plan.candidates[best], means[best], label, evaluated, plan.baselines,
                   plan.params if best == "searched" else None)
    out.candidates = plan.candidates
    if len(_CACHE) >= _CACHE_MAX:
        _CACHE.clear()
    _CACHE[key] = out
    return out


def split_layer(meta: PipelineMeta, v: int) -> int | None:
    """The first scenario stage whose layers v chunks per stage would split, or None."""
    return next((i for i, n in enumerate(meta.stage_layers) if n is not None and n % v), None)


def fits(meta: PipelineMeta, orders) -> bool:
    """Orders (per stage, or per device over its chunks: plan_orders) keep every device within
    its memory under the meta's placement, as the run's peak memory will count them (True when the
    meta cannot tell)."""
    if meta.fits_memory is None:
        return True
    return meta.fits_memory([peak_held([task if len(task) == 3 else (i, *task) for task in o], meta.pending_weight)
                             for i, o in enumerate(orders)])


class HeteroSearch(StaticOrderScheduler):
    """Searched schedule, replayed as a static order: per-stage, per-microbatch fused-or-split
    over one chunk per stage, or a searched order over ZB-V's V placement, whichever the
    simulation at the expected times finds shorter within the activation cap."""

    name = "hetero_search"
    post_validation = True  # under it, plans are judged over two iterations back to back (iterations_of)
    option_names = ("extra_in_flight", "jitter_draws", "max_in_flight", "per_microbatch", "placement",
                    "search_budget", "search_passes", "search_seed")

    @classmethod
    def placement(cls, p: int, v: int) -> list[tuple[int, int]]:
        if v == 2:  # the V only (virtual_stages: 2); with 1 (the default) the search picks
            return v_placement(p)
        return super().placement(p, v)

    def configure(self, meta: PipelineMeta) -> None:
        Scheduler.configure(self, meta)  # the orders come from the search, not from stage_order
        self.chosen_placement, self.device_orders = None, None
        v = meta.virtual_stages
        p = meta.n_stages // v
        m = meta.n_microbatches
        mode = str(self.options.get("placement", "auto"))
        if mode not in ("auto", *PLACEMENTS):
            raise ScenarioError("pipeline.scheduler_options.placement", f"{mode!r}: expected auto, "
                                + ", ".join(PLACEMENTS[:-1]) + f" or {PLACEMENTS[-1]}")
        if v == 2 and mode not in ("auto", "v"):
            raise ScenarioError("pipeline.scheduler_options.placement", f"{mode!r} with pipeline.virtual_stages: 2, "
                                "which lays out the V; expected auto or v, or virtual_stages: 1 to let hetero_search "
                                "lay itself out")
        split = split_layer(meta, 2)
        if split is not None and mode in ("v", "loop"):
            raise ScenarioError(f"pipeline.stages[{split}].layers", f"got {meta.stage_layers[split]:g}; placement "
                                f"{mode} runs 2 model chunks per stage, each of whole layers: expected a multiple of "
                                "2, or placement auto or one_chunk")
        if mode == "loop":
            check_rounds(p, m)
        cap = whole_option(self.options, "max_in_flight", 1)
        cap = cap if cap is not None else min(p, m) + (whole_option(self.options, "extra_in_flight", 0) or 0)
        passes = whole_option(self.options, "search_passes", 0)
        passes = 2 if passes is None else passes
        budget = self.options.get("search_budget", 2e5)
        if isinstance(budget, bool) or not isinstance(budget, (int, float)) or not budget > 0:
            raise ScenarioError("pipeline.scheduler_options.search_budget", f"got {budget!r}; expected a positive "
                                "number of simulated tasks")
        seed = whole_option(self.options, "search_seed", 0)
        seed = meta.seed if seed is None else seed
        n_draws = whole_option(self.options, "jitter_draws", 1) or JITTER_DRAWS
        plan = None
        if v == 1 and mode in ("auto", "one_chunk"):
            plan = search(meta, [cap] * p, passes, budget, bool(self.options.get("per_microbatch", True)))
            plan = choose_under_draws(meta, plan, jitter_draws(back_to_back(meta), seed, n_draws))
        # The placements, in the order they challenge the plan so far: one chunk, the V, the loop.
        tried = [] if plan is None else [(meta, plan)]
        meta_v = meta if v == 2 else (meta.layout_for(v_placement(p)) if meta.layout_for and mode in ("auto", "v")
                                      and p > 1 and split is None else None)
        if meta_v is not None:
            vplan = search_v_cached(meta_v, 2 * cap, passes, budget)
            if vplan is not None:
                tried.append((meta_v, choose_under_draws(meta_v, vplan, jitter_draws(back_to_back(meta_v), seed,
                                                                                     n_draws))))
        if v == 1 and mode in ("auto", "loop") and meta.layout_for and p > 1 and split is None and rounds_divide(p, m):
            meta_l = meta.layout_for(InterleavedZeroBubble.placement(p, 2))
            lplan = loop_plan(meta_l, 2 * cap)
            if lplan is not None:
                tried.append((meta_l, lplan))
        plan = self.choose_placement(meta, tried, seed, n_draws)
        if plan is None and mode == "loop" and meta.layout_for and p > 1:
            r = m // max(1, m // p)
            raise ScenarioError("pipeline.scheduler_options.max_in_flight", f"the loop holds {min(r + p, 2 * m)} chunk "
                                f"activations per device ({m} microbatches in rounds of {r}), above the cap of "
                                f"{2 * cap}; raise max_in_flight to {(min(r + p, 2 * m) + 1) // 2} or use placement "
                                "auto")
        if plan is None:
            raise ScenarioError("pipeline.scheduler_options.max_in_flight", f"hetero_search found no schedule within "
                                f"{cap} activations per stage")
        self.plan = plan
        self.order = plan.orders
        if v == 1 and plan.placement is not None:
            self.chosen_placement = plan.placement
        if plan.device_orders is not None:
            self.device_orders = plan.device_orders
            self.device_of, self.hosted = device_maps(plan.placement)
        modes = plan.modes
        self.split_backward = modes[0] if len(set(map(str, modes))) == 1 and modes[0] != "either" else modes

    @staticmethod
    def choose_placement(meta: PipelineMeta, tried, seed: int, n_draws: int) -> Plan | None:
        """The plan that survives the placements' challenges, each against the plan so far, end
        to end (each placement's tied-embedding all-reduce and slowest optimizer step,
        meta.flush_ms, added; under post-validation the makespans are of two iterations, so two
        flushes). A placement that overruns a device's memory loses to one that fits, whatever
        its time. Between two that fit, or two that do not, the challenger must predict MIN_GAIN
        better at the expected times (two chunks send twice the messages of one, so a tie is
        left to the plan so far), or under jitter lead by what the draws resolve
        (leads_under_draws)."""
        its = iterations_of(meta)
        alts = dict.fromkeys(PLACEMENTS, float("inf"))
        best = None
        for mt, pl in tried:
            t = pl.makespan + its * mt.flush_ms
            alts[pl.placement_name] = t
            fit = fits(mt, plan_orders(pl))
            if best is not None:
                meta_b, plan_b, t_b, fit_b = best
                faster = t < t_b * (1.0 - MIN_GAIN)
                if fit and fit_b:
                    under_draws = leads_under_draws(meta_b, plan_b, mt, pl, seed, n_draws)
                    faster = faster if under_draws is None else under_draws
                if not (fit and not fit_b or fit == fit_b and faster):
                    continue
            best = (mt, pl, t, fit)
        if best is None:
            return None
        best[1].alternatives = alts
        return best[1]

    def next_tasks(self, state: SchedulerState) -> list[Task]:
        if self.device_orders is None:
            return StaticOrderScheduler.next_tasks(self, state)
        return next_in_device_order(state, self.device_orders, self.device_of, self.hosted)


def device_plan(meta: PipelineMeta, makespan: float, dev_orders, label: str, evaluated: int, placement) -> Plan:
    """A Plan over a two-chunk placement (the V, the loop) from its per-device orders."""
    per_stage = [[] for _ in range(meta.n_stages)]
    for order in dev_orders:
        for k, ph, j in order:
            per_stage[k].append((ph, j))
    return Plan(per_stage, makespan, label, evaluated, {}, None, placement, dev_orders)


def loop_plan(meta: PipelineMeta, cap_chunks: int) -> Plan | None:
    """interleaved_zb's order over the loop placement, replayed as the engine runs it (over two
    iterations back to back under post-validation), or None when it holds more than cap_chunks."""
    izb = InterleavedZeroBubble()
    izb.configure(meta)
    orders, placement = izb.order, izb.placement(meta.n_stages // 2, 2)
    if max(v_peak_chunks(orders)) > cap_chunks:
        return None
    its = iterations_of(meta)
    t = replay_device_orders(back_to_back(meta), repeat_orders(orders, meta.n_microbatches, its), izb.device_of)
    plan = device_plan(meta, t, orders, LABEL["loop"] + "built-in interleaved_zb", 1, placement)
    plan.candidates = {"built-in interleaved_zb": orders}
    return plan


def search_v_cached(meta: PipelineMeta, cap_chunks: int, max_passes: int, budget: float) -> Plan | None:
    """search_v as a Plan over the V placement (memoized like search)."""
    key = ("v", meta.n_stages, meta.n_microbatches, tuple(meta.f), tuple(meta.b), tuple(meta.w), tuple(meta.bw),
           tuple(meta.devices), tuple(meta.transfer_ms), cap_chunks, max_passes, budget, meta.post_validation,
           iterations_of(meta))
    if key in _CACHE:
        return _CACHE[key]
    r = search_v(meta, cap_chunks, max_passes, budget)
    plan = None
    if r is not None:
        t, dev_orders, label, evaluated, candidates = r
        plan = device_plan(meta, t, dev_orders, "V: " + label, evaluated, v_placement(meta.n_stages // 2))
        plan.candidates = candidates
    if len(_CACHE) >= _CACHE_MAX:
        _CACHE.clear()
    _CACHE[key] = plan
    return plan
