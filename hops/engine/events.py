"""The engine's event core: explicit state, and one small step per event kind.

Why this shape: every schedule the engine runs (fused or split backward, several stages per
device for virtual stages or a V placement) must go through the same few rules, and each
rule must be testable on its own. So the state is spelled out in three objects, and each
event kind is one method over them, in the style of SimPy's event core:

- ``Layout``    what does not change during a run (stage -> device, links, drawn durations,
                 which backward phases each stage accepts);
- ``Links``     the directed FIFO links, whose queues carry over from one iteration to the
                 next (a transfer that finds its link busy waits, and that wait is counted);
- ``Iteration`` one iteration's bookkeeping: the scheduler's view (SchedulerState), which
                 devices are busy, the event heap.

Steps: ``Iteration.compute_end`` (a task finished: free the device, ship the activation or
gradient, mark W ready, release the activation), ``Iteration.arrival`` (an activation or a
gradient reached its stage), ``Iteration.device_free`` (a device taken by a blocking send, or
by its previous iteration, takes work again), and ``end_iteration`` (flush -> all-reduce ->
barrier -> host overhead -> optimizer step) or, under the Zero Bubble paper's optimizer
post-validation, ``end_iteration_post_validated`` (each stage steps on its own, no barrier).
``Iteration.start`` asks the scheduler for an idle stage's next task and checks it;
``Iteration.step`` pops one event and dispatches it.

An event touches at most the stage it concerns (or the stages sharing its device), so the
cost per task stays flat as pipelines grow. Events at equal times resolve in creation order
(a sequence number), which keeps the output byte-identical for the same draws.
"""
from __future__ import annotations

from heapq import heappop, heappush
from dataclasses import dataclass

from hops.errors import HopsError
from hops.schedulers import Scheduler, SchedulerState

PHASE_CODES = ("F", "B", "W", "BW")
_F, _B, _W, _BW = range(4)
COMPUTE_END, ARRIVAL, DEVICE_FREE = 0, 1, 2  # event kinds in the heap; iteration end is the heap running dry


class SchedulerError(HopsError, RuntimeError):
    """A scheduler asked for something impossible (a task that is not ready, or two at once)."""


@dataclass
class Layout:
    """The run's fixed facts, indexed by stage (s) and device index (k).

    ``dur[s][code][g]`` is the drawn duration of phase ``code`` for global microbatch g.
    ``bwd_codes[s]`` maps the backward phases stage s accepts ("BW", "B") to phase codes;
    ``either[s]`` says the scheduler picks fused or split per microbatch there.
    """

    n_stages: int
    n_microbatches: int
    sdev: list
    stages_on_dev: list
    fwd_link: list
    bwd_link: list
    dur: list
    bwd_codes: list
    either: list
    tasks_per_stage: list  # tasks a stage runs per iteration (an "either" stage: -1 per fused BW)
    phys: list = None  # scenario stage of each (virtual) stage; None: the same index
    blocking_send: bool = False  # a stage waits for its p2p send to be delivered before its next task
    # per (virtual) stage, what a microbatch between its B and its W weighs against one before
    # its B (hops.model.memory.pending_w_weights: the chunk running the LM head weighs more);
    # None: 1 everywhere, the plain count
    pending_weight: list = None

    @property
    def shared_devices(self) -> bool:
        return len(self.stages_on_dev) < self.n_stages


class Links:
    """Directed FIFO links: when each is free, and what it carried (counts, contention, waits)."""

    __slots__ = ("free", "count", "contended", "wait", "base_ms", "noise")

    def __init__(self, base_ms: list, noise: list):
        n = len(base_ms)
        self.base_ms, self.noise = base_ms, noise  # noise[k]: per-use multipliers, or None (no jitter)
        self.free = [0.0] * n
        self.count = [0] * n  # messages sent so far, which is also the index of the next noise draw
        self.contended = [0] * n
        self.wait = [0.0] * n

    def transmit(self, lk: int, now: float) -> tuple[float, float]:
        """Queue one message on link lk at time now; (start, arrival)."""
        free = self.free[lk]
        if free > now:
            start = free
            self.contended[lk] += 1
            self.wait[lk] += free - now
        else:
            start = now
        n = self.count[lk]
        nz = self.noise[lk]
        arrive = start + (self.base_ms[lk] * nz[n] if nz is not None else self.base_ms[lk])
        self.free[lk] = arrive
        self.count[lk] = n + 1
        return start, arrive


class Record:
    """What the run produced, as row tuples (the Timeline is built from them once, at the end)."""

    __slots__ = ("compute", "transfer", "other", "peak_in_flight", "peak_weighted")

    def __init__(self, n_stages: int):
        self.compute: list[tuple] = []   # (stage, global mb, phase code, start, end, iteration)
        self.transfer: list[tuple] = []  # (link, stage, global mb, phase code, start, end, iteration)
        self.other: list[tuple] = []     # (kind, stage, phase, start, end, iteration)
        self.peak_in_flight = [0] * n_stages
        self.peak_weighted = [0.0] * n_stages  # the same peak with Layout.pending_weight applied, when given


class Iteration:
    """One iteration between two optimizer steps: from t0 until the event heap runs dry.

    An event costs a few microseconds, so the event steps read the lists they index through
    attributes bound once here (``sdev``, ``dur``, ``rows``, ``peak``, ``shared``) rather
    than through the layout and the record on every event.
    """

    __slots__ = ("layout", "links", "record", "sched", "next_tasks", "state", "it", "off", "dev_busy",
                 "remaining", "stage_end", "heap", "seq", "phys", "held", "sdev", "dur", "rows", "shared", "peak",
                 "weight", "pending", "chunks")

    def __init__(self, layout: Layout, links: Links, record: Record, sched: Scheduler, it: int, t0: float):
        p, m = layout.n_stages, layout.n_microbatches
        self.layout, self.links, self.record, self.sched = layout, links, record, sched
        self.next_tasks = sched.next_tasks
        self.state = SchedulerState(p, m, it)
        f0 = self.state.f_ready[0]
        for j in range(m):
            f0[j] = 1
        self.it, self.off = it, it * m
        self.dev_busy = [False] * len(layout.stages_on_dev)
        self.remaining = list(layout.tasks_per_stage)
        self.stage_end = [t0] * p
        self.heap: list = []
        self.seq = 0
        self.phys = layout.phys or range(p)
        self.held = [0] * len(record.peak_in_flight)  # chunk-microbatches whose activations a stage holds
        self.sdev, self.dur, self.rows, self.peak = layout.sdev, layout.dur, record.compute, record.peak_in_flight
        self.shared = layout.shared_devices
        # under a pending weight, chunk-microbatches each (virtual) stage holds between their B and
        # their W, and the virtual stages of each scenario stage, whose pending ones it weighs
        self.weight = layout.pending_weight
        self.pending = None if self.weight is None else [0] * p
        self.chunks = None if self.weight is None else [[s for s in range(p) if self.phys[s] == i]
                                                        for i in range(len(self.held))]

    # ------------------------------------------------------------------ starting work
    def start(self, s: int, now: float) -> None:
        """Ask the scheduler what idle stage s starts now; check it is ready; run it."""
        st = self.state
        st.stage = s
        st.now = now
        tasks = self.next_tasks(st)
        if not tasks:
            return
        if len(tasks) > 1:
            raise self._refused(f"returned {len(tasks)} tasks for stage {s}; a stage runs one task at a time")
        phase, j = tasks[0]
        if phase == "F":
            ready = st.f_ready[s]
            if not ready[j]:
                raise self._refused(f"started F{j} on stage {s} before its input")
            ready[j] = 0
            st.n_f[s] += 1
            st.in_flight[s] += 1
            i = self.phys[s]
            held = self.held[i] + 1
            self.held[i] = held
            if held > self.peak[i]:
                self.peak[i] = held
            if self.weight is not None:
                self._weigh(i)
            code = _F
        elif phase == "W":
            ready = st.w_ready[s]
            if not ready[j]:  # set only when this microbatch's B finished
                raise self._refused(f"started W{j} on stage {s} before its B")
            ready[j] = 0
            st.n_w[s] += 1
            code = _W
        else:
            code = self.layout.bwd_codes[s].get(phase)
            ready = st.b_ready[s]
            if code is None or not ready[j]:
                want = " or ".join(self.layout.bwd_codes[s])
                raise self._refused(f"started {phase}{j} on stage {s}: expected {want} after its gradient arrived")
            if code == _BW and self.layout.either[s]:
                self.remaining[s] -= 1  # fused: no W will follow for this microbatch
            ready[j] = 0
            st.n_b[s] += 1
        st.started[s] += 1
        self.dev_busy[self.sdev[s]] = True
        g = self.off + j
        end = now + self.dur[s][code][g]
        self.rows.append((s, g, code, now, end, self.it))
        self.seq = seq = self.seq + 1
        heappush(self.heap, (end, seq, COMPUTE_END, s, j, code))

    def _weigh(self, i: int) -> None:
        """Raise stage i's weighted peak to what it holds now: a microbatch pending on its virtual
        stage s weighs weight[s], the others 1. Recomputed from the counts, so no rounding
        accumulates."""
        w, n = self.weight, self.pending
        now = self.held[i] + sum((w[s] - 1.0) * n[s] for s in self.chunks[i])
        if now > self.record.peak_weighted[i]:
            self.record.peak_weighted[i] = now

    def _refused(self, what: str) -> SchedulerError:
        """The error for a task the scheduler should not have started (the name is read only then)."""
        return SchedulerError(f"scheduler {self.sched.name!r} {what}")

    def send(self, s: int, lk, j: int, direction: int, label: int, now: float) -> float:
        """Ship an activation (direction +1) or gradient (-1) from stage s; schedule its arrival, return its time.

        ``label`` is the phase code of the task that produced it (F, B or BW); ``lk`` None
        means both stages share a device and the message arrives at once."""
        if lk is None:
            arrive = now
        else:
            start, arrive = self.links.transmit(lk, now)
            self.record.transfer.append((lk, s, self.off + j, label, start, arrive, self.it))
        self.seq = seq = self.seq + 1
        heappush(self.heap, (arrive, seq, ARRIVAL, s + direction, j, direction))
        return arrive

    def wake(self, s: int, now: float) -> None:
        """Stage s's device went idle: ask every stage on it (in stage order) for work."""
        if self.shared:
            busy = self.dev_busy
            k = self.sdev[s]
            for s2 in self.layout.stages_on_dev[k]:
                if not busy[k]:
                    self.start(s2, now)
        else:
            self.start(s, now)

    # ------------------------------------------------------------------ the event steps
    def compute_end(self, now: float, s: int, j: int, code: int) -> None:
        """A task finished on stage s: free its device, pass its output on, ask for new work."""
        lay = self.layout
        left = self.remaining[s] - 1
        self.remaining[s] = left
        if left == 0:
            self.stage_end[s] = now
        sent = None
        if code == _F:
            if s < lay.n_stages - 1:
                sent = self.send(s, lay.fwd_link[s], j, 1, _F, now)
            else:
                self.state.b_ready[s][j] = 1  # the last stage's backward needs only its own forward
        else:
            if code != _W and s > 0:
                sent = self.send(s, lay.bwd_link[s], j, -1, code, now)
            if code == _B:
                self.state.w_ready[s][j] = 1
                if self.pending is not None:  # from now it holds what its W needs
                    self.pending[s] += 1
                    self._weigh(self.phys[s])
            else:
                self.state.in_flight[s] -= 1  # BW or W: the activations are released
                i = self.phys[s]
                self.held[i] -= 1
                if code == _W and self.pending is not None:
                    self.pending[s] -= 1
        if sent is not None and sent > now and lay.blocking_send:
            # Megatron's schedules wait on each p2p send before the next compute: the stage's
            # device stays taken (idle, not busy) until its message is delivered
            if left == 0:
                self.stage_end[s] = sent
            self.seq = seq = self.seq + 1
            heappush(self.heap, (sent, seq, DEVICE_FREE, s, j, 0))
            return
        self.dev_busy[self.sdev[s]] = False
        if self.shared:
            self.wake(s, now)
        else:  # the device runs stage s alone: wake() would ask only s
            self.start(s, now)

    def device_free(self, now: float, s: int) -> None:
        """Stage s's device takes work again: its blocking send was delivered, or (post-validation)
        its previous iteration's optimizer step is done."""
        self.dev_busy[self.sdev[s]] = False
        self.wake(s, now)

    def arrival(self, now: float, s: int, j: int, direction: int) -> None:
        """An activation (direction > 0) or a gradient reached stage s."""
        st = self.state
        if direction > 0:
            st.f_ready[s][j] = 1
        else:
            st.b_ready[s][j] = 1
        if not self.dev_busy[self.sdev[s]]:
            self.start(s, now)

    def step(self) -> bool:
        """Pop the earliest event and apply it; False when nothing is left."""
        if not self.heap:
            return False
        now, _, kind, s, j, code = heappop(self.heap)
        if kind == COMPUTE_END:
            self.compute_end(now, s, j, code)
        elif kind == ARRIVAL:
            self.arrival(now, s, j, code)
        else:
            self.device_free(now, s)
        return True

    def run(self, t0: float, release: list | None = None) -> list:
        """Start every stage at t0 and apply events until none is left; per-stage end times.

        ``release[k]``: the time device k may start this iteration (post-validation: when its
        own previous optimizer step ends); None: every device at t0, after the barrier.
        """
        if release is None:
            for s in range(self.layout.n_stages):
                self.start(s, t0)
        else:
            busy = self.dev_busy
            for k, t in enumerate(release):
                if t > t0:  # taken until then; arrivals before it only mark inputs ready
                    busy[k] = True
                    first = self.layout.stages_on_dev[k][0]
                    self.seq = seq = self.seq + 1
                    heappush(self.heap, (t, seq, DEVICE_FREE, first, 0, 0))
                    for s in self.layout.stages_on_dev[k]:
                        self.stage_end[s] = t
            for s in range(self.layout.n_stages):
                if not busy[self.sdev[s]]:
                    self.start(s, t0)
        heap, pop = self.heap, heappop
        compute_end, arrival = self.compute_end, self.arrival
        while heap:
            now, _, kind, s, j, code = pop(heap)
            if kind == COMPUTE_END:
                compute_end(now, s, j, code)
            elif kind == ARRIVAL:
                arrival(now, s, j, code)
            else:
                self.device_free(now, s)
        stuck = [s for s, left in enumerate(self.remaining) if left]
        if stuck:
            raise SchedulerError(f"scheduler {self.sched.name!r} stalled in iteration {self.it}: stage {stuck[0]} "
                                 f"has {self.remaining[stuck[0]]} tasks never started (deadlock)")
        return self.stage_end


def _data_parallel_reduced(rows: list, it: int, stage_end: list, ar_ms: list) -> list:
    """When each stage's gradients are reduced: its flush plus its data-parallel all-reduce (recorded)."""
    done = []
    for s, t in enumerate(stage_end):
        if ar_ms[s] > 0:
            rows.append(("allreduce", s, "", t, t + ar_ms[s], it))
            t += ar_ms[s]
        done.append(t)
    return done


def end_iteration(record: Record, it: int, t_iter: float, stage_end: list, ar_ms: list, sync_ms: float,
                  host_ms: float, opt_ms: list) -> float:
    """Close iteration ``it`` as Megatron does; returns when the next one starts.

    After the flush each stage runs its data-parallel all-reduce, the first and last stage
    all-reduce their tied embedding gradients, everyone meets at the gradient-norm barrier,
    the host overhead elapses, and every stage steps its optimizer; the next iteration starts
    when the slowest step is done.
    """
    p = len(stage_end)
    rows = record.other
    done = _data_parallel_reduced(rows, it, stage_end, ar_ms)
    barrier = max([t_iter] + done)
    if sync_ms > 0:  # first and last stage all-reduce the tied embedding grads; the step waits for it
        t = max(done[0], done[-1])
        for s in (0, p - 1):
            rows.append(("allreduce", s, "", t, t + sync_ms, it))
        barrier = max(barrier, t + sync_ms)
    step_start = barrier + host_ms
    t_next = step_start
    for s in range(p):
        if opt_ms[s] > 0:
            rows.append(("optimizer", s, "OPT", step_start, step_start + opt_ms[s], it))
            t_next = max(t_next, step_start + opt_ms[s])
    return t_next


def end_iteration_post_validated(record: Record, it: int, stage_end: list, ar_ms: list, sync_ms: float,
                                 host_ms: float, opt_ms: list, state_ms: list) -> list:
    """Close iteration ``it`` under optimizer post-validation (Qi et al., ICLR 2024, "bypassing
    optimizer synchronizations"); returns when each stage may start the next one.

    There is no cross-stage barrier: stage s steps its optimizer once its own gradients are
    reduced (its data-parallel all-reduce; the first and last stage also their tied embedding
    all-reduce) and the partially reduced global state (gradient norm, inf/NaN flags) has come
    from stage s - 1, which passes it on when it steps (``state_ms[s]``: that scalar message's
    time from stage s - 1). The stage's own host/framework overhead elapses before its step,
    as on the barrier path. The validation of the step against the fully reduced state travels
    back during the next iteration's warm-up and costs nothing unless it rolls a step back,
    which HOPS does not model.
    """
    p = len(stage_end)
    rows = record.other
    done = _data_parallel_reduced(rows, it, stage_end, ar_ms)
    if sync_ms > 0:
        t = max(done[0], done[-1])
        for s in (0, p - 1):
            rows.append(("allreduce", s, "", t, t + sync_ms, it))
        done[0] = done[-1] = t + sync_ms
    release, ready = [], 0.0
    for s in range(p):
        ready = max(done[s], ready + state_ms[s]) if s else done[s]
        step_start = ready + host_ms
        if opt_ms[s] > 0:
            rows.append(("optimizer", s, "OPT", step_start, step_start + opt_ms[s], it))
        release.append(step_start + opt_ms[s])
    return release
