"""Configure-time replays of a schedule under the engine's rules, for schedulers that choose
between candidate orders by how long they run.

Why a module of its own: a candidate is judged by how the engine will run it, and the engine
puts every directed link behind a FIFO, holds a device until a blocking send is delivered and,
under optimizer post-validation, runs iterations back to back without the barrier. Both replays
here mirror hops.engine.loop in that at the expected (or given) times: simulate_policy asks a
policy at the moments the engine asks a scheduler, replay_device_orders runs fixed per-device
orders without the event heap (the same makespan, tests/test_hetero_scheduler.py). The optimizer
step and the flush are not replayed: under the barrier every order of one placement pays the
same; under post-validation leaving out each device's step between iterations is an approximation.
"""
from __future__ import annotations

import heapq
from dataclasses import replace
from typing import Callable, Sequence

from hops.schedulers.base import PipelineMeta, SchedulerState, Task

_F, _B, _W, _BW = 0, 1, 2, 3


def pipeline_links(meta: PipelineMeta):
    """Per (virtual) stage: forward and backward link ids (-1 within a device), their transfer
    times, and the number of distinct directed links, numbered as the engine's FIFOs are.

    The backward hop s -> s-1 is taken to cost what s-1 -> s costs (PipelineMeta carries
    forward transfer times only)."""
    n, devs = meta.n_stages, meta.devices
    link_key: dict[tuple, int] = {}

    def lid(a, c):
        if devs[a] == devs[c]:
            return -1
        return link_key.setdefault((devs[a], devs[c]), len(link_key))

    fwd = [lid(k, k + 1) if k < n - 1 else -1 for k in range(n)]
    bwd = [lid(k, k - 1) if k > 0 else -1 for k in range(n)]
    xf = [meta.transfer_ms[k] if k < n - 1 else 0.0 for k in range(n)]
    xb = [meta.transfer_ms[k - 1] if k > 0 else 0.0 for k in range(n)]
    return fwd, bwd, xf, xb, len(link_key)


def simulate_policy(meta: PipelineMeta, policy: Callable[[SchedulerState], Task | None],
                    record: bool = False, times=None):
    """One iteration under expected times (or ``times``, see stage_times), with the engine's rules;
    returns (makespan, orders).

    Mirrors hops.engine.loop: a device runs one task at a time (held until its send is delivered when
    sends block), each directed link is a FIFO, events at equal times resolve in creation order,
    and only the stage an event concerns is asked for work. Backward hops cost what pipeline_links says.
    """
    p, m = meta.n_stages, meta.n_microbatches
    dur = stage_times(meta) if times is None else times
    devs = list(meta.devices)
    dev_ids = {d: k for k, d in enumerate(dict.fromkeys(devs))}
    sdev = [dev_ids[d] for d in devs]
    by_dev: list[list[int]] = [[] for _ in dev_ids]
    for s2, k in enumerate(sdev):
        by_dev[k].append(s2)
    on_dev = [by_dev[k] for k in sdev]
    shared = len(dev_ids) < p
    blocking = meta.blocking_send
    fwd, bwd, xf, xb, n_links = pipeline_links(meta)
    link_free = [0.0] * n_links

    st = SchedulerState(p, m, 0)
    f_ready, b_ready, w_ready = st.f_ready, st.b_ready, st.w_ready
    n_f, n_b, n_w, started, in_flight = st.n_f, st.n_b, st.n_w, st.started, st.in_flight
    for j in range(m):
        f_ready[0][j] = 1
    busy = [False] * len(dev_ids)
    orders = [[] for _ in range(p)] if record else None
    heap: list = []
    seq = 0
    end_max = 0.0
    push, pop = heapq.heappush, heapq.heappop

    def start(s: int, now: float) -> None:
        nonlocal seq
        st.stage = s
        st.now = now
        task = policy(st)
        if task is None:
            return
        phase, j = task
        if phase == "F":
            f_ready[s][j] = 0
            n_f[s] += 1
            in_flight[s] += 1
            code = _F
        elif phase == "W":
            w_ready[s][j] = 0
            n_w[s] += 1
            code = _W
        else:
            b_ready[s][j] = 0
            n_b[s] += 1
            code = _B if phase == "B" else _BW
        started[s] += 1
        busy[sdev[s]] = True
        if record:
            orders[s].append(task)
        seq += 1
        push(heap, (now + dur[s][code][j], seq, 0, s, j, code))

    def send(lk: int, t_ms: float, dst: int, j: int, direction: int, now: float) -> float:
        nonlocal seq
        if lk < 0:
            arrive = now
        else:
            t0 = link_free[lk] if link_free[lk] > now else now
            arrive = t0 + t_ms
            link_free[lk] = arrive
        seq += 1
        push(heap, (arrive, seq, 1, dst, j, direction))
        return arrive

    for s in range(p):
        start(s, 0.0)
    while heap:
        now, _, etype, s, j, code = pop(heap)
        if etype == 0:
            if now > end_max:
                end_max = now
            sent = now
            if code == _F:
                if s < p - 1:
                    sent = send(fwd[s], xf[s], s + 1, j, 1, now)
                else:
                    b_ready[s][j] = 1
            else:
                if code != _W and s > 0:
                    sent = send(bwd[s], xb[s], s - 1, j, -1, now)
                if code == _B:
                    w_ready[s][j] = 1
                else:
                    in_flight[s] -= 1
            if blocking and sent > now:  # the device stays taken until its message is delivered
                seq += 1
                push(heap, (sent, seq, 2, s, j, code))
                continue
            busy[sdev[s]] = False
            if shared:
                for s2 in on_dev[s]:
                    if not busy[sdev[s2]]:
                        start(s2, now)
            else:
                start(s, now)
        elif etype == 2:  # a blocking send was delivered
            if now > end_max:
                end_max = now
            busy[sdev[s]] = False
            for s2 in (on_dev[s] if shared else (s,)):
                if not busy[sdev[s2]]:
                    start(s2, now)
        else:
            if code > 0:
                f_ready[s][j] = 1
            else:
                b_ready[s][j] = 1
            if not busy[sdev[s]]:
                start(s, now)
    done = sum(n_f) == p * m and sum(n_b) == p * m
    if not done:
        return float("inf"), orders
    return end_max, orders


def stage_times(meta: PipelineMeta):
    """Per (virtual) stage: F, B, W and BW durations of each microbatch, at the expected times."""
    m = meta.n_microbatches
    return [tuple([x] * m for x in (meta.f[k], meta.b[k], meta.w[k], meta.bw[k])) for k in range(meta.n_stages)]


def iterations_of(meta: PipelineMeta) -> int:
    """Iterations a plan is judged over: under optimizer post-validation two back to back, as
    zb_v plans them (no barrier, so the next iteration's start fills this one's drain and an
    order that ends early on the devices that start first gains); else one (the flush). A run of
    one iteration has no next one to overlap, so it is planned over one under either: an order
    chosen for two can run one longer than the barrier's pick (zb_v on d8_mix4_balanced, by 0.2 %)."""
    if not meta.post_validation:
        return 1
    return 2 if meta.iterations is None else min(2, meta.iterations)


def back_to_back(meta: PipelineMeta) -> PipelineMeta:
    """The meta of iterations_of(meta) iterations run as one (microbatch j of iteration i numbered
    i m + j), so the replays here time them; the meta itself when that is one."""
    its = iterations_of(meta)
    return meta if its == 1 else replace(meta, n_microbatches=meta.n_microbatches * its)


def repeat_orders(orders, m: int, iterations: int):
    """Per-stage (phase, j) or per-device (stage, phase, j) orders run ``iterations`` times in a
    row, microbatches renumbered as back_to_back numbers them: what the engine runs without the
    barrier, each device starting its next iteration's order when it has finished this one's."""
    if iterations == 1:
        return orders
    return [[t[:-1] + (t[-1] + i * m,) for i in range(iterations) for t in o] for o in orders]


def replay_device_orders(meta: PipelineMeta, orders, device_of: Sequence[int], times=None) -> float:
    """Makespan of fixed per-device orders at the expected times (or ``times``, as stage_times
    gives them): what simulate_policy with device_policy returns, computed without the event heap.

    A fixed order runs each task at max(device free, input ready), and each directed link is
    fed by one device only (its source), so the link's FIFO serves messages in that device's
    task order; sweeping the devices until none can advance gives the same times as the
    event simulation. Returns inf if the orders deadlock.
    """
    n, m = meta.n_stages, meta.n_microbatches
    inf = float("inf")
    f, b, w, bw = zip(*(stage_times(meta) if times is None else times))
    blocking = meta.blocking_send
    fwd, bwd, xf, xb, n_links = pipeline_links(meta)
    link_free = [0.0] * n_links
    f_at = [[inf] * m for _ in range(n)]
    b_at = [[inf] * m for _ in range(n)]
    w_at = [[inf] * m for _ in range(n)]
    f_at[0] = [0.0] * m
    n_dev = len(orders)
    pos = [0] * n_dev
    free = [0.0] * n_dev
    end = 0.0
    left = sum(len(o) for o in orders)
    progress = True
    while progress and left:
        progress = False
        for d in range(n_dev):
            order = orders[d]
            i, t_free = pos[d], free[d]
            while i < len(order):
                k, ph, j = order[i]
                if ph == "F":
                    r = f_at[k][j]
                elif ph == "W":
                    r = w_at[k][j]
                else:
                    r = b_at[k][j]
                if r == inf:
                    break
                t0 = r if r > t_free else t_free
                if ph == "F":
                    t_free = t0 + f[k][j]
                    if k < n - 1:
                        lk = fwd[k]
                        if lk < 0:
                            f_at[k + 1][j] = t_free
                        else:
                            a = link_free[lk] if link_free[lk] > t_free else t_free
                            link_free[lk] = f_at[k + 1][j] = a + xf[k]
                            if blocking:
                                t_free = f_at[k + 1][j]
                    else:
                        b_at[k][j] = t_free
                elif ph == "W":
                    t_free = t0 + w[k][j]
                else:
                    t_free = t0 + (b[k][j] if ph == "B" else bw[k][j])
                    if ph == "B":
                        w_at[k][j] = t_free
                    if k > 0:
                        lk = bwd[k]
                        if lk < 0:
                            b_at[k - 1][j] = t_free
                        else:
                            a = link_free[lk] if link_free[lk] > t_free else t_free
                            link_free[lk] = b_at[k - 1][j] = a + xb[k]
                            if blocking:
                                t_free = b_at[k - 1][j]
                i += 1
                left -= 1
                progress = True
            pos[d], free[d] = i, t_free
            if t_free > end:
                end = t_free
    return inf if left else end
