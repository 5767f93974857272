"""Each event kind of the engine is one step over explicit state, and behaves as specified on its own."""
import pytest

import hops
from builders import pipeline
from hops.engine import loop as engine
from hops.engine.events import (_B, _BW, _F, _W, ARRIVAL, COMPUTE_END, Iteration, Layout, Links, Record,
                              SchedulerError, end_iteration)
from hops.errors import ScenarioError
from hops.model.hardware import Catalog
from hops.schedulers import OneFOneB, PipelineMeta, Scheduler, ZeroBubble


def layout(p=2, m=2, f=1.0, b=2.0, w=0.5, split=False, shared=False, link=True):
    """p stages, constant durations; stage s on device s (or all on one device when shared)."""
    sdev = [0] * p if shared else list(range(p))
    on_dev = [list(range(p))] if shared else [[s] for s in range(p)]
    codes = {"B": _B} if split else {"BW": _BW}
    dur = [[[f] * m, [b] * m, [w] * m, [b + w] * m] for _ in range(p)]
    fwd = [(s if link and not shared else None) if s < p - 1 else None for s in range(p)]
    bwd = [(p - 1 + s if link and not shared else None) if s > 0 else None for s in range(p)]
    return Layout(p, m, sdev, on_dev, fwd, bwd, dur, [codes] * p, [False] * p, [m * (3 if split else 2)] * p)


def iteration(lay, sched, n_links=None, hop=0.25):
    n = n_links if n_links is not None else 2 * lay.n_stages
    sched.configure(PipelineMeta(lay.n_stages, lay.n_microbatches, [1.0] * lay.n_stages, [1.0] * lay.n_stages,
                                 [1.0] * lay.n_stages, [2.0] * lay.n_stages, [str(k) for k in lay.sdev],
                                 [hop] * lay.n_stages))
    return Iteration(lay, Links([hop] * n, [None] * n), Record(lay.n_stages), sched, 0, 0.0)


def test_start_asks_the_scheduler_and_schedules_the_compute_end():
    it = iteration(layout(), OneFOneB())
    it.start(0, 0.0)
    assert it.heap == [(1.0, 1, COMPUTE_END, 0, 0, _F)]
    assert it.dev_busy == [True, False]
    assert it.state.in_flight[0] == 1 and it.record.peak_in_flight[0] == 1
    assert it.record.compute == [(0, 0, _F, 0.0, 1.0, 0)]


def test_forward_end_ships_the_activation_over_the_link_and_frees_the_device():
    it = iteration(layout(), OneFOneB())
    it.start(0, 0.0)
    it.heap.clear()
    it.compute_end(1.0, 0, 0, _F)
    assert it.dev_busy == [True, False] and it.state.n_f[0] == 2  # woken again: 1F1B's stage 0 starts F1
    arrivals = [(e[0],) + e[2:] for e in it.heap if e[2] == ARRIVAL]
    assert arrivals == [(1.25, ARRIVAL, 1, 0, 1)]  # at stage 1, microbatch 0, forward direction
    assert it.record.transfer == [(0, 0, 0, _F, 1.0, 1.25, 0)]
    assert it.links.count[0] == 1


def test_a_busy_link_serializes_and_counts_the_wait():
    links = Links([1.0], [None])
    assert links.transmit(0, 0.0) == (0.0, 1.0)
    assert links.transmit(0, 0.5) == (1.0, 2.0)
    assert links.contended == [1] and links.wait == [0.5] and links.count == [2]


def test_arrival_marks_the_input_ready_and_wakes_an_idle_stage_only():
    it = iteration(layout(), OneFOneB())
    it.arrival(1.25, 1, 0, 1)
    assert it.state.f_ready[1][0] == 0 and it.state.n_f[1] == 1  # consumed by the F it started
    it2 = iteration(layout(), OneFOneB())
    it2.dev_busy[1] = True
    it2.arrival(1.25, 1, 0, 1)
    assert it2.state.f_ready[1][0] == 1 and it2.state.n_f[1] == 0 and not it2.heap


def test_split_backward_end_makes_w_ready_and_keeps_the_activation():
    it = iteration(layout(split=True), ZeroBubble())
    it.state.in_flight[1] = 1
    it.dev_busy[1] = True
    it.compute_end(5.0, 1, 0, _B)
    assert it.state.w_ready[1][0] == 1 and it.state.in_flight[1] == 1
    assert [e[2:] for e in it.heap if e[2] == ARRIVAL] == [(ARRIVAL, 0, 0, -1)]  # gradient to stage 0
    it.heap.clear()
    it.dev_busy[1] = True
    it.compute_end(6.0, 1, 0, _W)
    assert it.state.in_flight[1] == 0 and not [e for e in it.heap if e[2] == ARRIVAL]  # W sends nothing


def test_stages_sharing_a_device_run_one_task_at_a_time():
    it = iteration(layout(shared=True, link=False), OneFOneB(), n_links=0)
    it.run(0.0)
    rows = sorted(it.record.compute, key=lambda r: r[3])
    assert all(a[4] <= b[3] + 1e-12 for a, b in zip(rows, rows[1:]))  # no overlap on the one device
    assert it.record.transfer == []  # same device: no link traffic


def test_a_scheduler_that_starts_an_unready_task_is_named():
    class Eager(Scheduler):
        name = "eager"

        def next_tasks(self, state):
            return [("F", 1)]

    it = iteration(layout(), Eager())
    with pytest.raises(SchedulerError, match="'eager' started F1 on stage 1 before its input"):
        it.start(1, 0.0)


def test_a_schedule_that_never_finishes_is_reported_as_a_deadlock():
    class Idle(Scheduler):
        name = "idle"

        def next_tasks(self, state):
            return []

    with pytest.raises(SchedulerError, match="'idle' stalled in iteration 0: stage 0 has 4 tasks"):
        iteration(layout(), Idle()).run(0.0)


def test_iteration_end_is_flush_allreduce_barrier_overhead_then_optimizer():
    rec = Record(2)
    t = end_iteration(rec, 0, 0.0, [10.0, 12.0], [1.0, 0.0], 2.0, 5.0, [3.0, 4.0])
    # stage 0 all-reduce 10..11; tied embeddings sync max(11, 12)=12..14; host 14..19; optimizers 19..23
    assert rec.other == [("allreduce", 0, "", 10.0, 11.0, 0), ("allreduce", 0, "", 12.0, 14.0, 0),
                         ("allreduce", 1, "", 12.0, 14.0, 0), ("optimizer", 0, "OPT", 19.0, 22.0, 0),
                         ("optimizer", 1, "OPT", 19.0, 23.0, 0)]
    assert t == 23.0


def test_runs_above_the_ceiling_are_refused_before_any_work():
    sc = hops.load_scenario(pipeline(2, 4))
    object.__setattr__(sc, "microbatches", engine.MAX_TASKS)  # bypass validation: the engine guards itself
    with pytest.raises(ScenarioError, match="simulation.microbatches: .* the engine runs at most"):
        engine.run(sc, Catalog.load())


def test_the_ceiling_counts_the_chunks_a_scheduler_chose():
    """hetero_search may run the V (two chunks per stage): twice the tasks of the scenario's one."""
    sc = hops.load_scenario(pipeline(2, 4))
    per_chunk = 3 * 2 * 4 * sc.batches
    object.__setattr__(sc, "microbatches", 4 * (engine.MAX_TASKS // per_chunk))  # just under at one chunk
    engine.check_size(sc)
    with pytest.raises(ScenarioError, match="4 stages x .* the engine runs at most"):
        engine.check_size(sc, chunks=2)
