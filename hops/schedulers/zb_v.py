"""ZB-V (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024, Section 6; the V-ZB
schedule of "Pipeline Parallelism with Controllable Memory", NeurIPS 2024).

The model is cut into 2p chunks and device d holds chunks d and 2p - 1 - d, so a microbatch's
forward runs down the devices and back up (a V), and its backward does the same in reverse;
the first and the last chunk, embedding and LM head, both sit on device 0. Backward is split
into B and W as in ZB-H1. The paper's claims, in chunk units (one chunk's F = B = W = 1, no
communication cost): every device holds at most 2p chunk activations of half a stage each,
i.e. 1F1B's p whole-stage microbatches, on every device rather than only on the first; each
microbatch crosses 4(p - 1) device boundaries, twice 1F1B's; and once m >= 2p there is no
bubble in the steady state. Under Megatron's per-iteration flush, which HOPS models, one
iteration cannot take less than 6m + p - 1: device p - 1 receives its first input after
p - 1 chunk forwards and then has 6m units of work.

Why a configure-time list schedule rather than a closed-form order: the paper draws ZB-V for
one (p, m) and states its rules, not a formula for every p. HOPS runs those rules as a list
schedule -- each device, whenever idle: a ready B; else the returning (second) chunk's forward
if the device holds fewer than 2p chunk activations; else a W or a new microbatch's first-chunk
forward, in one of two orders (a new forward first, or the W's first so some are left to fill
the drain) -- with both tie-breaks between two ready B's, once at unit times, the paper's
setting, and once at the pipeline's expected chunk and message times, since a V over unequal
devices or slow links needs another order. It keeps the order that replays shortest at the
expected times under the engine's rules (hops.schedulers.replay: the list schedule's own links
never queue and its sends never hold the device, while the engine's links are FIFOs and both
stacks' sends block; judged by the list schedule, zb_v picked orders that ran up to 15 % longer
than the engine-judged pick on the train fixtures' clusters, and on 8 A100 over ethernet a
post-validated one 9 % longer than its own barrier pick) and hands it to the engine, which runs
it under real, jittered times like any fixed-order schedule. The activation cap is a property
of the order, so it holds under any times. At unit times (tests/test_virtual_stages.py) this
reaches 6m + p - 1 whenever p divides m, at every depth tested (up to 16), and at every m >= 2p
for p = 1-4 and 8; otherwise it is 1 to 4 units above it, a constant that does not grow with m
-- short of the paper's hand-drawn order, which is not written down for general p and m.

The same rules are also planned at the expected chunk times with every message delivered the
moment it is sent (on_arrival), and those orders judged like the others, at the real message
times. Why: a list schedule never waits. At the expected times a device that frees up just
before an input lands starts whatever is ready, a W or a new microbatch, and the B or the
returning forward it then holds up is on the V's critical path, which at B > F is the chain of
2p B's. Planned with messages on arrival, the device keeps its place for the input in flight
and the replay charges the wait. At B = 1.2 F, W = 0.95 F (a model without recomputation) this
takes the bubble below ZB-H1's. At B = 2.2 F (full recomputation) at p 8 only a fixed
preference (PRIORITIES) does (tests/test_virtual_stages.py holds both). These candidates lose
every tie to the others, so wherever they do not replay shorter the order is what it was (the
ZB table's zero at unit times among them). Known gap: under post-validation the judge replays
two iterations without the optimizer step between them, so it can pick an order that overlaps
iterations less than another would once the step is in (+0.75 % on Llama-2-13B, 8 H800, m 16).

Post-validation (``optimizer.post_validation: true``) removes the barrier between iterations,
so a device starts its next iteration when its own optimizer step is done; the candidates are
then planned over two iterations back to back (one if the run has only one) and judged by how
long two replay, the barrier's candidates (planned over one) among them: removing the barrier
delays no task of a fixed order, so the pick replays no longer than the barrier's pick would
(tests/test_post_validation.py runs it against the barrier on the study's configs). The ZB
repository lists ZB-V at zero bubble with 1F1B's activation memory. At unit times that means
one iteration is a parallelogram: device d busy without a gap over [d, 6m + d), so the next
iteration's start on device 0 fills device p - 1's drain and N iterations take 6mN + p - 1. The
list rules above miss it at the 2p-chunk cap: device 0, which both starts and ends the V,
finishes each iteration last, and N iterations take N(6m + p - 1).

The building-block rule reaches it. "Pipeline Parallelism with Controllable Memory" builds its
V schedules by repeating one microbatch's F/B/W block at a fixed interval (6 units per device
here), the activation memory being set by how long each chunk's activation lives in the block.
In the V the returning chunk's activation is short-lived (on device 0 the last chunk's F, B and
W can run back to back) while the first chunk's lives for the microbatch's trip to the last
chunk and back, about 4p - 2d units on device d, longest on device 0; so the rule bounds the
two separately. Each device, whenever idle, runs the returning chunk's forward (under the 2p
cap), else a ready B (the returning chunk's first), else a new microbatch's first-chunk forward
if it holds fewer than 2p - 1 - d first-chunk activations (F done, W not), else a W (the
returning chunk's first). It came from trying such per-chunk bounds and tie-breaks against the
target above, with an integer program's orders
(``python -m experiments.literature.zbv_order P M``) as ground truth; like those, its orders
for (2, 4) and (3, 6) run the microbatches in waves of p. Wherever p divides m >= 2p it builds
the parallelogram: checked for every p <= 8 at m = 2p to 5p and at (12, 24), (16, 32), (16, 80)
and (32, 64) (tests/test_zb_table.py); (32, 320) planned over two iterations takes about a
second. It is one more candidate in the replay choice, with the barrier too, and loses every
tie, so it is used only where it replays shorter. With the barrier it shortened zb_v on 15 of
the 16 reference configs of the hetero_scheduler study (split cost "share", expected times: by
0.02 to 2.7 %) and at unit times at (6, 17) and (6, 29), by one unit.
Where p does not divide m it misses the parallelogram: post-validated it is sometimes the
shorter candidate (two iterations at (5, 14): 175 against the rules' 178 and the bound's 173),
often not, and the steady state keeps a bubble (orders at 2p with zero bubble exist there too,
e.g. at (2, 5) and (3, 7) by the integer program; no rule here builds them). With
``scheduler_options: {max_in_flight: 3p - 1}`` (chunk activations per device, about 1.5x 1F1B's
memory) the list rules reach zero steady-state bubble at every (p, m) tried with p <= 4 and at
(5, 11) and (8, 32). ``max_in_flight`` below 2p is refused: the rules stall there.
"""
from __future__ import annotations

import heapq

from hops.schedulers.base import DeviceOrderScheduler, PipelineMeta, device_maps, whole_option
from hops.schedulers.replay import back_to_back, iterations_of, repeat_orders, replay_device_orders


def v_placement(p: int) -> list[tuple[int, int]]:
    """(device, chunk) of each of the 2p model chunks: down the devices, then back up."""
    return [(k, 0) for k in range(p)] + [(p - 1 - k, 1) for k in range(p)]


def dev_of(k: int, p: int) -> int:
    """The device that runs chunk k of 2p."""
    return k if k < p else 2 * p - 1 - k


def expected_times(meta: PipelineMeta):
    """list_schedule's ``times`` at the pipeline's expected chunk and message times."""
    n = meta.n_stages
    xfer = [meta.transfer_ms[k] if k < n - 1 else 0.0 for k in range(n)]
    return list(meta.f), list(meta.b), list(meta.w), xfer


def on_arrival(times):
    """``times`` with every message delivered the moment it is sent: the rules planned this way
    wait for an input in flight instead of starting other work (see the module docstring)."""
    f, b, w, xfer = times
    return f, b, w, [0.0] * len(xfer)


# Fixed preferences a device runs whenever idle, the first ready task of: F1 the returning
# chunk's forward, F0 a new microbatch's first-chunk forward, B1 / B0 and W1 / W0 a ready B or
# pending W of the returning / first chunk. BLOCK is the building-block rule's (which also bounds
# first-chunk activations, see the module docstring). PRIORITIES came from running all 720
# orders of the six kinds, unbounded, at unit chunk times over p 4-16, m 2p-4p and F : B : W
# from 1 : 1 : 1 to 1 : 2.2 : 0.86, under the flush, and keeping greedily the order that shortened
# the sum of those cases most over the rules above, then the one that did most on top of it (at
# 1 : 2.2 : 0.86, p 8, m 32 the second takes the V's idle from 34.8 to 25.4 chunk units, under
# ZB-H1's 32.8; at 1 : 1.2 : 0.95, p 8 the first from 9.9 to 8.4). Which order suits which times
# has no rule we know of, so they are candidates judged like the others.
BLOCK = ("F1", "B1", "B0", "F0", "W1", "W0")
RAISED_CAP_TOLERANCE = 1e-3  # a raised max_in_flight is held only for the time it buys beyond this share

PRIORITIES = (("F1", "B1", "B0", "W0", "F0", "W1"), ("F1", "W1", "B0", "F0", "B1", "W0"))


def rule_plans(its: int, times_set) -> list:
    """(iterations planned over, rank, (times, list_schedule rule)) of every candidate at each of
    ``times_set``: both tie-breaks and both W policies (rank 0), then the building-block rule
    (1), then the fixed preferences (PRIORITIES, 2); a later rank loses ties. Under
    post-validation each is also planned over one iteration, as the barrier plans it, so the
    pick never replays longer than the barrier's would."""
    rules = [(times, dict(b_first=b_first, w_first=w_first))
             for times in times_set for w_first in (False, True) for b_first in (1, 0)]
    blocks = [(times, dict(block=True)) for times in times_set]
    fixed = [(times, dict(priority=order)) for times in times_set for order in PRIORITIES]
    over = (its, 1) if its > 1 else (its,)
    return [(n, rank, rule) for rank, group in enumerate((rules, blocks, fixed)) for n in over for rule in group]


def stage_orders(chunk_orders) -> list[list[tuple[int, str, int]]]:
    """list_schedule's per-device (chunk 0 or 1, phase, j) orders as (virtual stage, phase, j):
    device d's chunks are stages d and 2p - 1 - d, as the replays and the engine number them."""
    n = 2 * len(chunk_orders)
    return [[(d if c == 0 else n - 1 - d, ph, j) for c, ph, j in o] for d, o in enumerate(chunk_orders)]


def list_schedule(p: int, m: int, times=None, b_first: int = 1, orders=None, w_first: bool = False,
                  cap: int | None = None, iterations: int = 1, block: bool = False,
                  priority: tuple[str, ...] | None = None):
    """The rule above as an event-driven list schedule over the V, or a replay of fixed orders.

    ``times``: (f, b, w, xfer) per virtual stage (xfer[k]: message time from chunk k to its
    neighbours), default unit compute and free messages. ``b_first`` is the chunk whose ready
    B wins when both are ready; ``w_first`` puts pending W's before starting a new microbatch
    (a first-chunk forward), which keeps the W's that fill the drain. ``cap``: chunk
    activations a device may hold (default 2p, 1F1B's). ``iterations`` > 1 plans that many
    iterations back to back as post-validation runs them (a device starts an iteration's work
    once it has finished all of its previous one; microbatch g belongs to iteration g div m).
    ``block`` runs the building-block rule instead (see the module docstring): the returning
    chunk's forward, then a ready B (returning chunk first), then a new microbatch while device
    d holds fewer than 2p - 1 - d first-chunk activations, then a W (returning chunk first);
    ``b_first`` and ``w_first`` do not apply to it. ``priority`` runs a fixed preference instead
    (PRIORITIES), without the building-block rule's bound on first-chunk activations.
    With ``orders`` each device runs its given order instead of choosing. Returns (makespan,
    per-device peak chunk activations, per-device orders of (chunk, phase, microbatch) of the
    last iteration, microbatches numbered within it), or None if the rule stalls.
    """
    n, never = 2 * p, float("inf")
    cap = 2 * p if cap is None else cap
    per_iter, m_iter, m = 6 * m, m, m * iterations
    f, b, w, xfer = times if times is not None else ([1.0] * n, [1.0] * n, [1.0] * n, [0.0] * n)
    f_at = [[never] * m for _ in range(n)]  # forward input available
    b_at = [[never] * m for _ in range(n)]  # output gradient available (last chunk: its F done)
    w_at = [[never] * m for _ in range(n)]  # B done
    for j in range(m):
        f_at[0][j] = 0.0
    nf, nb, nw = [0] * n, [0] * n, [0] * n
    held, peak, busy = [0] * p, [0] * p, [False] * p
    done = [0] * p  # tasks a device has finished: it may start iteration i's once it has done i * 6m
    pos = [0] * p
    out: list[list[tuple[int, str, int]]] = [[] for _ in range(p)]
    heap: list = []
    seq = 0
    left, now = 3 * n * m, 0.0

    def open_for(d: int, j: int) -> bool:
        return done[d] >= (j // m_iter) * per_iter

    def chunk_k(d: int, c: int) -> int:
        return d if c == 0 else n - 1 - d

    def pick(d: int, t: float):
        if orders is not None:
            if pos[d] >= len(orders[d]):
                return None
            c, ph, j = orders[d][pos[d]]
            k = chunk_k(d, c)
            ready = f_at if ph == "F" else b_at if ph == "B" else w_at
            return (c, ph, j) if ready[k][j] <= t else None
        if block or priority:
            return pick_in_order(d, t, BLOCK if block else priority, block)
        for c in (b_first, 1 - b_first):
            k = chunk_k(d, c)
            if nb[k] < m and b_at[k][nb[k]] <= t and open_for(d, nb[k]):
                return c, "B", nb[k]
        k = chunk_k(d, 1)  # the returning chunk's forward first: it unblocks the loss and the backward
        if held[d] < cap and nf[k] < m and f_at[k][nf[k]] <= t and open_for(d, nf[k]):
            return 1, "F", nf[k]
        k = chunk_k(d, 0)
        new = held[d] < cap and nf[k] < m and f_at[k][nf[k]] <= t and open_for(d, nf[k])
        if new and not w_first:
            return 0, "F", nf[k]
        best = None
        for c in (0, 1):  # the oldest finished B's W; with w_first, the first chunk's W first
            k = chunk_k(d, c)
            j = nw[k]
            if j < nb[k] and w_at[k][j] <= t and (best is None or (not w_first and w_at[k][j] < best[0])):
                best = (w_at[k][j], c, j)
        if best is not None:
            return best[1], "W", best[2]
        return (0, "F", nf[chunk_k(d, 0)]) if new else None

    def pick_in_order(d: int, t: float, order: tuple[str, ...], bounded: bool):
        for kind in order:
            phase, c = kind[0], int(kind[1])
            k = chunk_k(d, c)
            if phase == "F":
                j = nf[k]
                ready = (held[d] < cap and j < m and f_at[k][j] <= t and open_for(d, j)
                         and not (bounded and c == 0 and j - nw[k] >= n - 1 - d))
            elif phase == "B":
                j = nb[k]
                ready = j < m and b_at[k][j] <= t and open_for(d, j)
            else:
                j = nw[k]
                ready = j < nb[k] and w_at[k][j] <= t
            if ready:
                return c, phase, j
        return None

    def start(d: int, t: float) -> None:
        nonlocal seq
        task = pick(d, t)
        if task is None:
            return
        c, ph, j = task
        k = chunk_k(d, c)
        out[d].append(task)
        pos[d] += 1
        busy[d] = True
        if ph == "F":
            nf[k] += 1
            held[d] += 1
            peak[d] = max(peak[d], held[d])
            dur = f[k]
        elif ph == "B":
            nb[k] += 1
            dur = b[k]
        else:
            nw[k] += 1
            dur = w[k]
        seq += 1
        heapq.heappush(heap, (t + dur, seq, d, (k, ph, j)))

    for d in range(p):
        start(d, 0.0)
    while heap:
        now = heap[0][0]
        wake = set()
        while heap and heap[0][0] == now:  # every event at this instant lands before anyone chooses
            _, _, d, task = heapq.heappop(heap)
            if task is None:
                wake.add(d)
                continue
            k, ph, j = task
            busy[d] = False
            left -= 1
            done[d] += 1
            wake.add(d)
            if ph == "F":
                if k == n - 1:
                    b_at[k][j] = now
                else:
                    f_at[k + 1][j] = now + xfer[k]
                    seq += 1
                    heapq.heappush(heap, (now + xfer[k], seq, dev_of(k + 1, p), None))
            elif ph == "B":
                w_at[k][j] = now
                if k > 0:
                    b_at[k - 1][j] = now + xfer[k - 1]
                    seq += 1
                    heapq.heappush(heap, (now + xfer[k - 1], seq, dev_of(k - 1, p), None))
            else:
                held[d] -= 1
        for d in sorted(wake):
            if not busy[d]:
                start(d, now)
    if left:
        return None
    last = (iterations - 1) * m_iter
    return now, peak, [[(c, ph, j - last) for c, ph, j in o if j >= last] for o in out]


class ZBV(DeviceOrderScheduler):
    """ZB-V: 1F1B's activation memory on every device, for twice the pipeline messages."""

    name = "zb_v"
    default_virtual_stages = 2
    option_names = ("max_in_flight",)
    split_backward = True
    post_validation = True

    @classmethod
    def placement(cls, p: int, v: int) -> list[tuple[int, int]]:
        if v != 2:
            raise ValueError(f"schedule 'zb_v' runs 2 model chunks per stage in a V; set pipeline.virtual_stages: 2 "
                             f"(got {v})")
        return v_placement(p)

    def configure(self, meta: PipelineMeta) -> None:
        p, m = meta.n_stages // 2, meta.n_microbatches
        n = 2 * p
        cap = whole_option(self.options, "max_in_flight", n, f" (2p chunk activations per device, 1F1B's memory, "
                                                              "below which the V's rules stall)")
        expected = expected_times(meta)
        # Under post-validation iterations overlap, so the order is planned over two of them
        # back to back and judged by how long two take; otherwise, or when the run has only one
        # iteration, over one (iterations_of).
        its, meta_e = iterations_of(meta), back_to_back(meta)
        device_of = device_maps(v_placement(p))[0]
        # The rule at unit times (the paper's setting) and at the pipeline's expected times (a
        # heterogeneous or communication-bound V needs a different order); keep whichever runs
        # shorter at the expected times. All hold at most ``cap`` chunk activations per device.
        # The building-block rule (made for the post-validated steady state, and often shorter
        # with the barrier too) loses every tie, so it is kept only when it replays shorter.
        # Each candidate is judged as the engine runs it (hops.schedulers.replay: FIFO links,
        # blocking sends), not by the list schedule's own replay, whose links never queue and
        # whose sends never hold the device: that ranked the orders wrongly. Then the same
        # rules at the expected times with messages delivered on sending (on_arrival), which
        # lose every tie to all of the above.
        tiers = [rule_plans(its, (None, expected))]
        if any(expected[3]):
            tiers.append(rule_plans(its, (on_arrival(expected),)))
        # A cap above 2p is a limit, not a target: the orders at 2p run too, and those planned
        # at the raised cap win only where they replay more than 0.1 % shorter. The winning rule
        # is then planned again at the least cap at which it replays within 0.1 % of its time
        # (caps tried upward from 2p + 1: the replay is not monotone in the cap), so a raised
        # cap holds no more than that rule needs for the time it buys. (Another rule may need
        # less; searching every rule at every cap costs too much at large m.) At the default
        # cap ties fall as above.
        def planned(times, rule, over, limit):
            r = list_schedule(p, m, times, cap=limit, iterations=over, **rule)
            if r is None:
                return None
            return replay_device_orders(meta_e, repeat_orders(stage_orders(r[2]), m, its), device_of), r

        def best_at(limit):
            candidates = []
            for tier, plans in enumerate(tiers):
                for over, rank, (times, rule) in plans:
                    got = planned(times, rule, over, limit)
                    if got is not None:
                        replay, r = got
                        candidates.append((replay, tier, rank, max(r[1]), len(candidates), r[2], (times, rule, over)))
            return min(candidates)

        best = best_at(n)
        orders = best[5]
        if cap is not None and cap > n:
            raised = best_at(cap)
            if raised[0] < best[0] * (1 - RAISED_CAP_TOLERANCE):
                orders = raised[5]
                for limit in range(n + 1, raised[3]):  # a cap at the order's own peak plans the same order
                    got = planned(*raised[6], limit)
                    if got is not None and got[0] <= raised[0] * (1 + RAISED_CAP_TOLERANCE):
                        orders = got[1][2]
                        break
        self._orders = orders
        super().configure(meta)

    def device_order(self, d: int, p: int, v: int, m: int) -> list[tuple[int, str, int]]:
        return self._orders[d]
