"""The scheduler plug-in contract.

A scheduler sees the pipeline once, before the first microbatch (`configure`), and is then
asked by the engine what an idle stage should start now (`next_tasks`). The engine asks
only for stages whose situation changed (they became idle or received an input), so a
scheduler that answers in O(1) keeps the whole simulation linear in the number of tasks.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

from hops.errors import ScenarioError


@dataclass(frozen=True)
class PipelineMeta:
    """What a scheduler may know before the run: layout and expected per-stage times (ms)."""

    n_stages: int
    n_microbatches: int
    f: Sequence[float]
    b: Sequence[float]
    w: Sequence[float]
    bw: Sequence[float]
    devices: Sequence[str]
    transfer_ms: Sequence[float]  # expected activation transfer time stage i -> i+1
    options: dict = field(default_factory=dict)
    # With virtual stages the stages above are virtual (model chunks, in pipeline order):
    # stage_of[k] is the scenario stage (the device's position) that runs virtual stage k.
    stage_of: Sequence[int] = ()
    virtual_stages: int = 1
    # optimizer.post_validation: a stage starts the next iteration when its own optimizer step is
    # done, so iterations overlap (only schedules with ``post_validation = True`` see it set)
    post_validation: bool = False
    # the run's iterations (simulation.batches): under post-validation a scheduler plans over as
    # many as run back to back, up to two (hops.schedulers.replay.iterations_of); None: not known
    iterations: Optional[int] = None
    # a stage waits for its p2p send to be delivered before its next task (Megatron without
    # --overlap-p2p-comm): a scheduler that replays the engine must hold the device that long too
    blocking_send: bool = False
    # The same pipeline under another placement (a list of (stage, chunk) per virtual stage,
    # as Scheduler.placement returns): a scheduler that picks its placement at configure time
    # (hetero_search) compares candidates with it and sets ``chosen_placement``; the engine then
    # lays the run out that way. None where nobody can build one (a hand-made meta).
    # Per-iteration time after the flush that depends on the placement (the tied-embedding
    # all-reduce and the slowest optimizer step), so placements can be compared end to end.
    flush_ms: float = 0.0
    layout_for: Optional[Callable[[Sequence[tuple[int, int]]], "PipelineMeta"]] = field(default=None, compare=False,
                                                                                          repr=False)
    # Whether every device stays within its memory under this placement when each scenario
    # stage holds the given peak of chunk-microbatches, weighed as the engine's peak_held weighs
    # them (pending_weight below; weights, optimizer state and activations, as summary.json's
    # peak_memory_mb counts them). None: not known (a hand-made meta).
    fits_memory: Optional[Callable[[Sequence[float]], bool]] = field(default=None, compare=False, repr=False)
    # Per scenario stage, its layer count where its work is derived from the architecture, None
    # where its compute is given: v chunks per stage split no layer only where each such count is
    # a multiple of v (hops.scenario refuses the others). () where nobody knows (a hand-made meta).
    stage_layers: Sequence[Optional[float]] = ()
    # The run's seed, and n draws of every virtual stage's F/B/W/BW compute times as the run draws
    # them (jitter, measured distributions), from the "search" stream of a given seed, never from
    # the stream the run's own times come from: a scheduler that plans for the spread, not only the
    # expected times, draws here (hetero_search). None where nobody can draw (a hand-made meta).
    seed: int = 0
    draw_times: Optional[Callable[[int, int], list]] = field(default=None, compare=False, repr=False)
    # Per virtual stage, what a microbatch between its B and its W holds in units of what it held
    # before its B (hops.model.memory.pending_w_weights: more than 1 under full recomputation,
    # where the deferred W keeps every weight GEMM's operands); None: 1 everywhere. The engine
    # weighs its memory peak by it, and a scheduler that plans under a memory limit must too.
    pending_weight: Optional[Sequence[float]] = None


class SchedulerState:
    """Engine-owned view of one iteration. Schedulers read it and never write it.

    For stage s and local microbatch j: ``f_ready[s][j]`` the forward input has arrived,
    ``b_ready[s][j]`` the output gradient has arrived (last stage: its forward is done),
    ``w_ready[s][j]`` the activation-gradient B is done so W may run. ``n_f``, ``n_b``,
    ``n_w`` count tasks started per phase (fused backward counts in ``n_b``), ``started``
    counts all tasks started on the stage, ``in_flight`` counts microbatches whose forward
    started and whose activations are still held (until BW or W finishes).
    """

    __slots__ = ("stage", "now", "iteration", "f_ready", "b_ready", "w_ready", "n_f", "n_b", "n_w",
                 "started", "in_flight", "n_stages", "n_microbatches")

    def __init__(self, n_stages: int, n_microbatches: int, iteration: int):
        self.stage = 0
        self.now = 0.0
        self.iteration = iteration
        self.n_stages, self.n_microbatches = n_stages, n_microbatches
        self.f_ready = [bytearray(n_microbatches) for _ in range(n_stages)]
        self.b_ready = [bytearray(n_microbatches) for _ in range(n_stages)]
        self.w_ready = [bytearray(n_microbatches) for _ in range(n_stages)]
        self.n_f = [0] * n_stages
        self.n_b = [0] * n_stages
        self.n_w = [0] * n_stages
        self.started = [0] * n_stages
        self.in_flight = [0] * n_stages


Task = tuple[str, int]  # (phase "F" | "B" | "W" | "BW", local microbatch index)


class Scheduler:
    """Base class: subclasses set `name`, maybe `split_backward`, and implement next_tasks."""

    name = "base"
    # Keys of pipeline.scheduler_options this scheduler reads; the scenario refuses any other.
    # None (a plug-in that does not declare them): any key is passed through unchecked.
    option_names: tuple[str, ...] | None = None
    # True: backward runs as B then W (zero-bubble family). May also be a per-stage sequence
    # of False / True / "either" (the scheduler picks "BW" or "B" per microbatch); the engine
    # reads it after configure, so a scheduler may decide it from the pipeline's times.
    split_backward = False
    # True: the schedule runs under optimizer post-validation (optimizer.post_validation), which
    # lets each stage start its next iteration when its own optimizer step is done. The Zero
    # Bubble schedules set it, as the ZB paper's implementation runs them; Megatron's gpipe, 1F1B
    # and interleaved 1F1B keep its barrier, and schedules that plan around the flush (hops_hetero,
    # hetero_search) would plan for the wrong iteration end. The scenario refuses it elsewhere.
    post_validation = False
    # True only for Megatron's interleaved 1F1B: the stack's `p2p_overlap: interleaved` (Megatron's
    # default) overlaps its p2p with the next chunk and no other schedule's.
    megatron_interleaved = False
    # What `pipeline.virtual_stages: auto` (the default) runs: the fewest model chunks per stage
    # the schedule takes, so that a sweep over schedules of one and of two chunks needs no
    # per-job setting. An explicit number is the user's and is checked by `placement`.
    default_virtual_stages = 1

    def __init__(self, **options: Any):
        self.options = options

    @classmethod
    def placement(cls, p: int, v: int) -> list[tuple[int, int]]:
        """(stage, chunk) of each virtual stage in pipeline order, for p stages of v chunks.

        The default is one chunk per stage; schedules that run model chunks (interleaved
        1F1B, ZB-V) override it, so the engine never knows a placement by name.
        """
        if v != 1:
            raise ValueError(f"schedule {cls.name!r} runs one model chunk per stage; "
                             "use interleaved_1f1b or interleaved_zb (or zb_v, 2 chunks) for virtual stages")
        return [(s, 0) for s in range(p)]

    def configure(self, meta: PipelineMeta) -> None:
        self.meta = meta

    def next_tasks(self, state: SchedulerState) -> list[Task]:
        raise NotImplementedError


def whole_option(options: dict, key: str, lowest: int, why: str = "") -> int | None:
    """A scheduler option that counts something (None when absent): a user's 0, 2.5 or "x" is
    refused in one line naming it, never truncated or replaced by the default."""
    value = options.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < lowest:
        raise ScenarioError(f"pipeline.scheduler_options.{key}", f"got {value!r}; expected a whole number of at "
                            f"least {lowest}{why}")
    return value


class DeviceOrderScheduler(Scheduler):
    """A fixed task order per device over the virtual stages it hosts.

    ``device_order(d, p, v, m)`` lists (chunk, phase, microbatch) for scenario stage d. A
    virtual stage starts the device's next task when that task is its own and ready; the
    position is the number of tasks the device's virtual stages have started.
    """

    def configure(self, meta: PipelineMeta) -> None:
        super().configure(meta)
        v = meta.virtual_stages
        p = meta.n_stages // v
        place = self.placement(p, v)
        vstage = {pc: k for k, pc in enumerate(place)}
        self.device_of, self.hosted = device_maps(place)
        self.order = [[(vstage[(d, c)], ph, j) for c, ph, j in self.device_order(d, p, v, meta.n_microbatches)]
                      for d in range(p)]

    def device_order(self, d: int, p: int, v: int, m: int) -> list[tuple[int, str, int]]:
        raise NotImplementedError

    def next_tasks(self, state: SchedulerState) -> list[Task]:
        return next_in_device_order(state, self.order, self.device_of, self.hosted)


def device_maps(placement) -> tuple[list[int], list[list[int]]]:
    """From (stage, chunk) per virtual stage: the device (scenario stage) of each virtual stage,
    and each device's virtual stages in chunk order."""
    device_of = [d for d, _ in placement]
    hosted: list[list[int]] = [[] for _ in range(max(device_of) + 1)]
    for k, (d, c) in sorted(enumerate(placement), key=lambda kc: kc[1][1]):
        hosted[d].append(k)
    return device_of, hosted


def next_in_device_order(state: SchedulerState, orders, device_of, hosted) -> list[Task]:
    """The next task of the asking stage's device, if it is this stage's and ready.

    A device running several chunks keeps one order over all of them: its position is the
    count of tasks its chunks have started, so a chunk waits while the device's next task
    belongs to another of its chunks.
    """
    s = state.stage
    d = device_of[s]
    pos = sum(state.started[k] for k in hosted[d])
    order = orders[d]
    if pos >= len(order):
        return []
    k, phase, mb = order[pos]
    if k != s:
        return []
    ready = state.f_ready if phase == "F" else state.w_ready if phase == "W" else state.b_ready
    return [(phase, mb)] if ready[s][mb] else []


class StaticOrderScheduler(Scheduler):
    """A fixed per-stage task order; a stage waits until the next task in its order is ready."""

    def configure(self, meta: PipelineMeta) -> None:
        super().configure(meta)
        self.order = [self.stage_order(s, meta.n_stages, meta.n_microbatches) for s in range(meta.n_stages)]

    def stage_order(self, s: int, p: int, m: int) -> list[Task]:
        raise NotImplementedError

    def next_tasks(self, state: SchedulerState) -> list[Task]:
        s = state.stage
        pos = state.started[s]
        order = self.order[s]
        if pos >= len(order):
            return []
        phase, mb = order[pos]
        ready = state.f_ready if phase == "F" else state.w_ready if phase == "W" else state.b_ready
        return [order[pos]] if ready[s][mb] else []
