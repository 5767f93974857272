"""ZB-1p, ZB-2p: the Zero Bubble paper's automatic scheduling (Qi et al., "Zero Bubble
Pipeline Parallelism", ICLR 2024, Section 3, "automatic pipeline scheduling").

Why a search and not a fixed order: the handcrafted ZB-H1 and ZB-H2 assume F = B = W. The
paper builds the order from the measured F, B, W and message times under a memory limit
instead; its ZB-1p (limit p M_B, 1F1B's peak) and ZB-2p (2p M_B) are the schedules its
measurements report. M_B, one microbatch's activations on a stage, is counted here as HOPS
holds it: from the microbatch's F to the end of its W (SchedulerState.in_flight,
summary.json's peak_in_flight). In the paper's memory model (its ILP's memory increments, as
recalled: +M_B at F, M_W - M_B at B, -M_W at W) B already frees all but M_W, so a limit
here is at least as tight as the paper's, and a stage reaches it sooner.

Under full recomputation the inequality turns: M_B is only the layers' inputs, while a
microbatch between its B and its W holds every weight GEMM's input and output gradient, M_W
= w M_B with w the engine's pending weight (hops.model.memory.pending_w_weights; ~16 per layer
at GPT's shape, more on the stage running the LM head). The limit then counts a microbatch w
times from its B to its W, the peak the engine charges (peak_held), so ZB-1p stays within
1F1B's memory, which never defers a W. A B now takes memory too, so a stage admits an F only
while it could still run the next B after its W's, and runs a W when the B would pass the
limit. Where one microbatch's B to W alone outweighs the limit on some stage (w > limit) no
order of split backwards keeps it, and the schedule is refused rather than run over it.

The heuristic, as the paper's Section 3.1 states it (in our words; written from the text, not
from the authors' code), planned for all stages together over the expected times:

- Warm-up: forwards, as many as the memory limit allows, but only while they keep the stage
  free when its first B's input can arrive (the bubble before the first B is kept small). One
  hyperparameter (``extra_warmup``) allows the one further forward that starts before that
  moment and may delay the first B by less than an F.
- Then F and B alternate. A W goes into any wait for the next F or B that is at least T_W
  long; into a shorter wait too when idling there would make this stage's cumulative bubble
  the largest of all stages; and whenever the memory limit blocks the next F (a W frees a
  microbatch's activations).
- Until its last F, stage i keeps at least one F ahead of stage i + 1. Where it is two or more
  ahead, the second hyperparameter (``skip_f``) lets it take a B that is ready now instead of
  the F, when that leaves no gap.
- When F and B run out, the remaining W's run back to back.

The text leaves open what a stage does when the alternation's next F or B has not arrived
but the other one has. Read literally it waits (``late = "wait"``); on uneven pipelines that
lets a microbatch's B wait at every stage for a forward the memory limit holds back upstream,
and one iteration of the paper's 28.3B model at p = 32 took about 12 times ZB-H1's. HOPS therefore
also tries running the other one when it ends before the alternation's task can start
(``"fits"``) and when it arrives first (``"first"``), as a third hyperparameter of its own.

The paper grid-searches its two binary hyperparameters; HOPS searches the 2 x 2 x 3 grid the
same way: each order is replayed under the engine's rules at the expected times
(hops.schedulers.replay: FIFO links, blocking sends), over two iterations back to back under
optimizer post-validation (as zb_v and hetero_search judge orders there) or one under the
flush, and the shortest is kept (ties: the earlier candidate).

The paper then refines the heuristic's order with an integer linear program (the heuristic's
order as its starting point, under a time limit). HOPS does not: scipy's HiGHS takes no
starting solution, the program for the paper's larger settings (p = 32, m = 96: some 9,000
passes, with ordering binaries for every pair on a stage) is far beyond what it solves here,
and a time limit would make the schedule depend on the machine's speed. The program's optimum
is, though, no longer than any order that keeps the memory limit, and the handcrafted ZB-H1
(peak p) and ZB-H2 (peak 2p - 1) are such orders; so HOPS's ZB-1p and ZB-2p are the shortest
of the heuristic's orders and the handcrafted ones within the limit. On uneven stages the
heuristic alone fell up to 3 % short of the handcrafted orders on the ZB paper case's models
(python -m experiments.literature); the ILP would recover that and may find more, which HOPS
does not model. At F = B = W they reach ZB-H1's and ZB-H2's makespans (tests/test_zb_auto.py).
"""
from __future__ import annotations

import math
from itertools import product
from typing import Sequence

from hops.errors import ScenarioError
from hops.schedulers.base import PipelineMeta, StaticOrderScheduler, Task, whole_option
from hops.schedulers.hetero_search import builtin_orders, peak_held, static_policy
from hops.schedulers.replay import back_to_back, iterations_of, pipeline_links, repeat_orders, simulate_policy

_EPS = 1e-9
LATE = ("wait", "fits", "first")  # what a stage does while the alternation's next F or B has not arrived


def heuristic_orders(p: int, m: int, limit: int, times, extra_warmup: bool = False, skip_f: bool = False,
                     late: str = "wait", blocking: bool = False,
                     weight: Sequence[float] | None = None) -> list[list[Task]] | None:
    """Per-stage (phase, microbatch) orders from the Section 3.1 rules above, or None if no
    stage can start anything (a guard: not seen on any pipeline tried).

    ``times`` = (f, b, w, xf, xb) per stage: compute times and the message times to the next
    (xf) and previous (xb) stage. ``limit``: microbatches a stage may hold (F started, W not
    ended), one between its B and its W counting ``weight[s]`` (None: 1; module docstring).
    ``blocking``: a stage stays busy until its message is delivered.

    Stages are planned together in order of when each becomes free. A stage whose next F or B
    depends on a neighbour that has not planned it yet waits for that decision, unless even the
    earliest that input could arrive leaves room for a W; the W is then planned at the moment
    the stage became free, which nothing else depends on. When every stage waits so, the one
    free earliest runs whichever of its tasks can start first (``fallback``), so the planning
    always ends.
    """
    f, b, w, xf, xb = times
    arrive = [0.0] * p  # microbatch 0's forward input on each stage, with nothing in its way
    for s in range(1, p):
        arrive[s] = arrive[s - 1] + f[s - 1] + xf[s - 1]
    first_b = [0.0] * p  # ... and its output gradient
    first_b[p - 1] = arrive[p - 1] + f[p - 1]
    for s in range(p - 2, -1, -1):
        first_b[s] = first_b[s + 1] + b[s + 1] + xb[s + 1]
    free = [0.0] * p
    nf, nb, nw = [0] * p, [0] * p, [0] * p
    warm, last, bubble = [True] * p, [""] * p, [0.0] * p
    f_end = [[-1.0] * m for _ in range(p)]
    b_end = [[-1.0] * m for _ in range(p)]
    orders: list[list[Task]] = [[] for _ in range(p)]

    def f_fits(s: int) -> bool:
        """An F keeps stage s within the limit, and (B's taking memory too) able to run a B after its W's."""
        held = nf[s] - nw[s]
        if weight is None:
            return held < limit
        pending, extra = nb[s] - nw[s], weight[s] - 1.0
        return held + 1 + extra * max(pending, 1 if extra > 0 else 0) <= limit + _EPS

    def b_fits(s: int) -> bool:
        """A B keeps stage s within the limit: from its end the microbatch weighs weight[s]."""
        return weight is None or nf[s] - nw[s] + (weight[s] - 1.0) * (nb[s] - nw[s] + 1) <= limit + _EPS

    def ready(s: int, ph: str, j: int) -> float | None:
        """When the input of (ph, j) reaches stage s, or None if the neighbour has not planned it."""
        if ph == "F":
            if s == 0:
                return 0.0
            e = f_end[s - 1][j]
            return None if e < 0 else e + xf[s - 1]
        if s == p - 1:
            return f_end[s][j]
        e = b_end[s + 1][j]
        return None if e < 0 else e + xb[s + 1]

    def earliest(s: int, ph: str) -> float:
        """A lower bound on an input the neighbour has not planned: it starts it when next free."""
        return free[s - 1] + f[s - 1] + xf[s - 1] if ph == "F" else free[s + 1] + b[s + 1] + xb[s + 1]

    def decide(s: int) -> tuple[str, int, float] | None:
        t = free[s]
        if nb[s] == m:
            return "W", nw[s], t
        w_free = nw[s] < nb[s]
        full = not f_fits(s)
        if warm[s]:
            if nf[s] < m and not full:
                r = ready(s, "F", nf[s])
                if r is None:
                    return None
                start = max(t, r)
                fits = start < first_b[s] - _EPS if extra_warmup else start + f[s] <= first_b[s] + _EPS
                if nf[s] == 0 or fits:
                    return "F", nf[s], start
            warm[s] = False
        can_f, can_b = nf[s] < m and not full, nb[s] < nf[s] and b_fits(s)
        want = "F" if last[s] == "B" else "B"
        if want == "F" and nf[s] < m and full and w_free:
            return "W", nw[s], t  # the limit blocks the F: a W frees a microbatch's activations
        if want == "B" and nb[s] < nf[s] and not can_b and w_free:
            return "W", nw[s], t  # ... or the B, whose microbatch would weigh more from its end
        if s < p - 1 and nf[s] < m:
            ahead = nf[s] - nf[s + 1]
            if want == "B" and can_f and ahead == 0:
                want = "F"  # keep one F ahead of the next stage
            elif want == "F" and skip_f and can_b and ahead >= 2:
                r = ready(s, "B", nb[s])
                if r is not None and r <= t + _EPS:
                    want = "B"
        if want == "F" and not can_f:
            want = "B" if can_b else ""
        elif want == "B" and not can_b:
            want = "F" if can_f else ""
        if not want:
            return ("W", nw[s], t) if w_free else None
        j = nf[s] if want == "F" else nb[s]
        r = ready(s, want, j)
        if late != "wait" and (can_b if want == "F" else can_f):
            other = "B" if want == "F" else "F"
            k = nb[s] if other == "B" else nf[s]
            ro = ready(s, other, k)
            due = earliest(s, want) if r is None else r  # the pattern's task starts no earlier
            soon = max(t, earliest(s, other) if ro is None else ro)  # nor the other one
            if late == "fits":  # the other one ends before the pattern's task can start
                if soon + (b[s] if other == "B" else f[s]) <= due + _EPS:
                    return None if ro is None else (other, k, soon)  # wait to know when it comes
            elif soon < due - _EPS:  # "first": the other one arrives first
                if ro is None:
                    return None
                want, j, r = other, k, ro
        if r is None:
            return ("W", nw[s], t) if w_free and earliest(s, want) - t >= w[s] - _EPS else None
        gap = r - t
        if gap <= _EPS:
            return want, j, t
        if w_free and (gap >= w[s] - _EPS or bubble[s] + gap > max(bubble) + _EPS):
            return "W", nw[s], t
        return want, j, r

    def fallback(s: int) -> tuple[str, int, float] | None:
        """When every stage waits on another: any task of s whose input is known, earliest first."""
        options = []
        if nb[s] < nf[s] and b_fits(s) and (r := ready(s, "B", nb[s])) is not None:
            options.append((max(r, free[s]), "B", nb[s]))
        if nf[s] < m and f_fits(s) and (r := ready(s, "F", nf[s])) is not None:
            options.append((max(r, free[s]), "F", nf[s]))
        if nw[s] < nb[s]:
            options.append((free[s], "W", nw[s]))
        if not options:
            return None
        start, ph, j = min(options)
        return ph, j, start

    def apply(s: int, ph: str, j: int, start: float) -> None:
        if orders[s]:
            bubble[s] += start - free[s]
        end = start + (f[s] if ph == "F" else b[s] if ph == "B" else w[s])
        held = end
        if ph == "F":
            nf[s] += 1
            f_end[s][j] = end
            if blocking and s < p - 1:
                held += xf[s]
        elif ph == "B":
            nb[s] += 1
            b_end[s][j] = end
            if blocking and s > 0:
                held += xb[s]
        else:
            nw[s] += 1
        if ph != "W":
            last[s] = ph
            warm[s] = warm[s] and ph == "F"
        orders[s].append((ph, j))
        free[s] = held

    left = 3 * p * m
    while left:
        waiting = sorted((s for s in range(p) if nw[s] < m), key=lambda s: (free[s], s))
        for s in waiting:
            task = decide(s)
            if task is not None:
                break
        else:
            for s in waiting:
                task = fallback(s)
                if task is not None:
                    break
            else:
                return None
        apply(s, *task)
        left -= 1
    return orders


class ZBAuto(StaticOrderScheduler):
    """The paper's automatic schedule under a memory limit (option ``memory_limit``: microbatch
    activations per stage, default p, 1F1B's peak). The unit is what one microbatch holds from
    its F to its B; between its B and its W it counts the engine's pending weight, more than 1
    under full recomputation (module docstring), so the limit bounds the peak memory charges.

    The paper's integer-program refinement of the order is not implemented; the handcrafted
    ZB-H1 / ZB-H2 orders within the limit stand among the heuristic's candidates instead, so
    HOPS's ZB-1p / ZB-2p are never slower than them at the expected times, but can be slower
    than the program's optimum (module docstring)."""

    name = "zb_auto"
    option_names: tuple[str, ...] = ("memory_limit",)
    split_backward = True
    post_validation = True
    memory_factor = 1  # the default limit, in multiples of p microbatch activations

    def memory_limit(self, p: int) -> int:
        limit = whole_option(self.options, "memory_limit", 1, " (microbatch activations a stage may hold)")
        return self.memory_factor * p if limit is None else limit

    def configure(self, meta: PipelineMeta) -> None:
        limit = self.memory_limit(meta.n_stages)
        weight = meta.pending_weight
        if weight is not None and max(weight) > limit + _EPS:
            s = max(range(len(weight)), key=lambda k: weight[k])
            raise ScenarioError("pipeline.schedule", f"{self.name} keeps at most {limit} microbatch activations per "
                                f"stage, but under full recomputation one microbatch between its B and its W holds "
                                f"{weight[s]:.1f} on stage {s} (its weight GEMMs' inputs and output gradients): no "
                                f"split backward fits; use zb_auto with scheduler_options.memory_limit of at least "
                                f"{math.ceil(max(weight) - _EPS)}, or a fused backward (1f1b)")
        self._orders = plan(meta, limit)
        super().configure(meta)

    def stage_order(self, s: int, p: int, m: int) -> list[Task]:
        return self._orders[s]


class ZB1P(ZBAuto):
    """ZB-1p: the automatic schedule at 1F1B's activation memory, p M_B per stage."""

    name = "zb_1p"
    option_names = ()


class ZB2P(ZBAuto):
    """ZB-2p: the automatic schedule at twice 1F1B's activation memory, 2p M_B per stage."""

    name = "zb_2p"
    option_names = ()
    memory_factor = 2


# Plans by what they are planned from (the expected times and the layout, never a run's draws):
# a sweep over seeds plans once (as hetero_search memoizes its searches)
_PLANS: dict = {}
_PLANS_MAX = 256


def plan(meta: PipelineMeta, limit: int) -> list[list[Task]]:
    """The grid search over the heuristic's hyperparameters (the paper's two and HOPS's ``late``):
    the order that replays shortest."""
    key = (meta.n_stages, meta.n_microbatches, tuple(meta.f), tuple(meta.b), tuple(meta.w), tuple(meta.bw),
           tuple(meta.devices), tuple(meta.transfer_ms), meta.blocking_send, iterations_of(meta), limit,
           None if meta.pending_weight is None else tuple(meta.pending_weight))
    if key not in _PLANS:
        if len(_PLANS) >= _PLANS_MAX:
            _PLANS.clear()
        _PLANS[key] = _plan(meta, limit)
    return _PLANS[key]


def _plan(meta: PipelineMeta, limit: int) -> list[list[Task]]:
    p, m = meta.n_stages, meta.n_microbatches
    its, longer = iterations_of(meta), back_to_back(meta)
    best = None
    for orders in _candidates(meta, limit):
        makespan, _ = simulate_policy(longer, static_policy(repeat_orders(orders, m, its)))
        if best is None or makespan < best[0] - _EPS:
            best = (makespan, orders)
    if best is None:
        raise RuntimeError(f"zb_auto: the heuristic found no order for p {p}, m {m}, memory limit {limit}")
    return best[1]


def _candidates(meta: PipelineMeta, limit: int):
    """The heuristic's order at every point of the grid, then the handcrafted orders within the
    limit: the ILP's optimum is no longer than any order that keeps the memory limit, ZB-H1 and
    ZB-H2 among them, so HOPS, without the ILP, keeps them as candidates too (its ZB-1p / ZB-2p
    are never slower than the handcrafted order of the same memory). Ties go to the earlier."""
    p, m = meta.n_stages, meta.n_microbatches
    _, _, xf, xb, _ = pipeline_links(meta)
    times = (list(meta.f), list(meta.b), list(meta.w), xf, xb)
    weight = meta.pending_weight
    for extra_warmup, skip_f, late in product((False, True), (False, True), LATE):
        orders = heuristic_orders(p, m, limit, times, extra_warmup, skip_f, late, meta.blocking_send, weight)
        if orders is not None:
            yield orders
    for name in ("zb_h1", "zb_h2") if m >= 2 * p - 1 else ("zb_h1",):  # ZB-H2's warm-up needs 2p - 1
        orders = builtin_orders(name, p, m)
        if all(peak_held([(0, *t) for t in o], None if weight is None else [x]) <= limit + _EPS
               for o, x in zip(orders, weight or [1.0] * p)):
            yield orders
