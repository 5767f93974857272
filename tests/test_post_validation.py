"""Optimizer post-validation (optimizer.post_validation; Qi et al., "Zero Bubble Pipeline
Parallelism", ICLR 2024): no cross-stage barrier before the optimizer step, so each stage
starts its next iteration when its own step is done and iterations overlap."""
from pathlib import Path

import numpy as np
import pytest
import yaml

import hops
from builders import pipeline

ROOT = Path(__file__).resolve().parents[1]


def unit(p, m, schedule, batches, post_validation, **kw):
    """F = B = W = 1 on every stage, free links, no host overhead: the paper's setting."""
    sc = pipeline(p, m, f=1.0, b=2.0, split=0.5, schedule=schedule, batches=batches, **kw)
    sc["optimizer"]["post_validation"] = post_validation
    sc["pipeline"]["host_overhead"] = {"kind": "constant", "ms": 0.0}
    return sc


def makespan(sc):
    return hops.simulate(sc).summary["makespan_ms"]


def test_four_iterations_of_zb_h2_take_4_3m_plus_p_minus_1_instead_of_4_3m_plus_p_minus_1():
    """The issue's check: p 4, m 16: 195 post-validated, 204 = 4 (3m + p - 1) with the barrier."""
    assert makespan(unit(4, 16, "zb_h2", 4, True)) == pytest.approx(4 * 3 * 16 + 4 - 1)  # 195
    assert makespan(unit(4, 16, "zb_h2", 4, False)) == pytest.approx(4 * (3 * 16 + 4 - 1))  # 204


@pytest.mark.parametrize("p,m,n", [(2, 3, 3), (4, 7, 2), (8, 15, 3), (8, 32, 2), (3, 12, 5)])
def test_zb_h2_reaches_its_steady_state_zero_bubble(p, m, n):
    """Stage s ends each iteration at 3m + s, when the next iteration's first input reaches it,
    so only the first fill remains: n iterations take 3mn + p - 1."""
    assert makespan(unit(p, m, "zb_h2", n, True)) == pytest.approx(3 * m * n + p - 1)


@pytest.mark.parametrize("p,m", [(4, 16), (8, 8)])
def test_zb_h1_gains_nothing_at_unit_times(p, m):
    """Stage 0 both starts and ends a ZB-H1 iteration, so nothing can overlap."""
    assert makespan(unit(p, m, "zb_h1", 3, True)) == pytest.approx(makespan(unit(p, m, "zb_h1", 3, False)))


def timeline_rows(tl, kind):
    sel = tl.kind == kind
    return tl.stage[sel], tl.iteration[sel], tl.start_ms[sel], tl.end_ms[sel]


def test_each_stage_steps_alone_and_starts_its_next_iteration_after_its_own_step():
    sc = unit(4, 8, "zb_h2", 3, True)  # stage s ends its work at 3m + s: short steps leave room to overlap
    sc["optimizer"].update(enabled=True, step_ms=[0.3, 0.1, 0.4, 0.2])
    sc["pipeline"]["host_overhead"] = {"kind": "constant", "ms": 0.7}
    tl = hops.simulate(sc).timeline
    st, it, s0, s1 = timeline_rows(tl, "optimizer")
    cs, ci, c0, c1 = timeline_rows(tl, "compute")
    overlapped = False
    for k in range(2):
        for s in range(4):
            step = (st == s) & (it == k)
            assert step.sum() == 1
            own_last = c1[(cs == s) & (ci == k)].max()
            assert s0[step][0] >= own_last + 0.7 - 1e-9  # its own host overhead, then its own step
            nxt = c0[(cs == s) & (ci == k + 1)].min()
            assert nxt >= s1[step][0] - 1e-9  # the next iteration starts after its own step ...
        # ... but not after every stage's: some stage runs iteration k + 1 while another still runs k
        overlapped |= c0[ci == k + 1].min() < c1[ci == k].max()
    assert overlapped


def test_the_partially_reduced_state_travels_down_the_pipeline_before_each_step():
    """Stage s steps only after stage s - 1's partial state (gradient norm, inf flags) arrives:
    a scalar message, so one link latency apart at least."""
    hop = 3.0  # longer than any stage's lead, so the chain, not the stage's own work, decides
    sc = unit(4, 8, "zb_h2", 2, True, hop_ms=hop)
    sc["optimizer"].update(enabled=True, step_ms=0.1)
    tl = hops.simulate(sc).timeline
    st, it, s0, _ = timeline_rows(tl, "optimizer")
    starts = [s0[(st == s) & (it == 0)][0] for s in range(4)]
    assert all(b - a >= hop - 1e-9 for a, b in zip(starts, starts[1:]))


@pytest.mark.parametrize("seed", range(4))
def test_dependencies_and_one_task_at_a_time_hold_across_overlapping_iterations(seed):
    rng = np.random.default_rng(seed)
    p = int(rng.integers(2, 6))
    m = 2 * p - 1 + int(rng.integers(0, 6))
    per = [(float(rng.uniform(0.5, 3)), float(rng.uniform(1, 6))) for _ in range(p)]
    sc = pipeline(p, m, per_stage=per, split=0.5, schedule="zb_h2", batches=3, jitter=0.2, seed=seed,
                  hop_ms=float(rng.uniform(0, 0.5)))
    sc["optimizer"].update(post_validation=True, enabled=True)
    sc["pipeline"]["compute_jitter"] = 0.2
    r = hops.simulate(sc)
    tl = r.timeline
    busy = (tl.kind == "compute") | (tl.kind == "optimizer")
    for s in range(p):
        sel = busy & (tl.stage == s)
        order = np.argsort(tl.start_ms[sel], kind="stable")
        assert (tl.start_ms[sel][order][1:] >= tl.end_ms[sel][order][:-1] - 1e-9).all()
        assert (np.diff(tl.iteration[sel][order]) >= 0).all()  # a stage never goes back to an earlier iteration
    comp = tl.kind == "compute"
    done = {(int(s), int(j), str(ph)): (a, b) for s, j, ph, a, b in
            zip(tl.stage[comp], tl.microbatch[comp], tl.phase[comp], tl.start_ms[comp], tl.end_ms[comp])}
    for j in range(3 * m):
        for s in range(1, p):
            assert done[(s, j, "F")][0] >= done[(s - 1, j, "F")][1] - 1e-9
            assert done[(s - 1, j, "B")][0] >= done[(s, j, "B")][1] - 1e-9


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe", "hops_hetero"])
def test_a_schedule_that_keeps_the_barrier_refuses_post_validation_in_one_line(schedule):
    sc = pipeline(4, 8, schedule=schedule, split=0.5)
    sc["optimizer"]["post_validation"] = True
    with pytest.raises(hops.ScenarioError) as err:
        hops.simulate(sc)
    assert str(err.value) == (f"optimizer.post_validation: schedule {schedule!r} ignores it (it keeps the barrier "
                              "before the optimizer step); expected one of hetero_search, zb_1p, zb_2p, zb_auto, zb_h1, "
                              "zb_h2, zb_v, zero_bubble, or post_validation: false, or auto (only where a schedule "
                              "honours it)")


@pytest.mark.parametrize("schedule,honours", [("1f1b", False), ("gpipe", False), ("zb_h1", True), ("zb_v", True),
                                              ("interleaved_1f1b", False), ("hetero_search", True)])
def test_post_validation_auto_is_on_where_a_schedule_honours_it_and_the_barrier_elsewhere(schedule, honours):
    """So one sweep compares post-validated ZB schedules with the schedules that keep the barrier."""
    sc = pipeline(4, 8, schedule=schedule, split=0.5)
    sc["optimizer"]["post_validation"] = "auto"
    auto = hops.simulate(sc)
    sc["optimizer"]["post_validation"] = honours
    same = hops.simulate(sc)
    assert auto.scenario.post_validation is honours
    assert auto.timeline.end_ms.max() == same.timeline.end_ms.max()


@pytest.mark.parametrize("value", ["yes", 1, "on"])
def test_post_validation_is_true_false_or_auto_and_says_so(value):
    sc = pipeline(4, 8, schedule="zb_h1", split=0.5)
    sc["optimizer"]["post_validation"] = value
    with pytest.raises(hops.ScenarioError) as err:
        hops.simulate(sc)
    assert str(err.value).startswith("optimizer.post_validation: expected true, false or auto, got ")


def test_interleaved_refuses_post_validation_too():
    sc = pipeline(4, 8, schedule="interleaved_1f1b")
    sc["pipeline"]["virtual_stages"] = 2
    sc["optimizer"]["post_validation"] = True
    with pytest.raises(hops.ScenarioError, match=r"^optimizer.post_validation: schedule 'interleaved_1f1b' ignores"):
        hops.simulate(sc)


def zb_v_makespan(path, batches, post_validation):
    """The run at its expected times: every interconnect's jitter off (zb_v plans from expected
    times, so a near-tie between two orders may fall either way once each transfer is drawn)."""
    from hops.model.hardware import Catalog

    doc = yaml.safe_load((ROOT / path).read_text())
    doc["pipeline"].update(schedule="zb_v", virtual_stages=2)
    doc["simulation"]["batches"] = batches
    doc.setdefault("optimizer", {})["post_validation"] = post_validation
    no_jitter = {f"interconnects.{name}.jitter": 0.0 for name in Catalog.load().interconnects}
    return hops.simulate(doc, catalog=Catalog.load(no_jitter)).summary["makespan_ms"]


@pytest.mark.parametrize("path", [
    "experiments/hetero_scheduler/configs/d8_slow_links.yaml",  # ethernet between every pair: messages queue
    "experiments/hetero_scheduler/configs/d10_l4_tail_bottleneck.yaml",
    "experiments/hetero_scheduler/configs/d6_h100_a100_tail.yaml",
    "experiments/hetero_scheduler/configs/d8_mix4_balanced.yaml",  # an order for two iterations runs one longer
    "conf/scenario/hetero_pp4.yaml",  # with the optimizer step
])
@pytest.mark.parametrize("batches", [1, 2])
def test_post_validated_zb_v_is_never_slower_than_zb_v_with_the_barrier(path, batches):
    """Post-validation only removes a wait, and zb_v's post-validated candidates include the
    barrier's; so as long as it judges them as the engine runs them (FIFO links, sends that hold
    the device) over the iterations the run overlaps (none when it has one) it never picks an
    order that makes the user's run slower at the times it plans from (the expected ones)."""
    assert zb_v_makespan(path, batches, True) <= zb_v_makespan(path, batches, False) + 1e-9
