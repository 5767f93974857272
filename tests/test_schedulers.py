"""Scheduler invariants on random heterogeneous pipelines with jitter."""
import numpy as np
import pytest

import hops
from builders import pipeline
from hops.schedulers import Scheduler, register


def random_pipeline(seed, schedule):
    rng = np.random.default_rng(seed)
    p = int(rng.integers(2, 9))
    m = int(rng.integers(1, 20))
    if schedule == "zb_h2":  # its warm-up needs 2p - 1 microbatches (fewer is refused)
        m = max(m, 2 * p - 1)
    per = [(float(rng.uniform(0.5, 5)), float(rng.uniform(0.5, 10))) for _ in range(p)]
    split = 0.5 if schedule in SPLIT else None
    sc = pipeline(p, m, schedule=schedule, per_stage=per, hop_ms=float(rng.uniform(0, 1)), jitter=0.2,
                  batches=2, seed=seed, split=split)
    return sc, p, m


SPLIT = ("zero_bubble", "zb_h1", "zb_h2", "zb_1p", "zb_2p", "zb_auto", "hops_hetero")
SCHEDULES = ["gpipe", "1f1b", "zero_bubble", "zb_h1", "zb_h2", "zb_1p", "zb_2p", "hops_hetero"]


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("seed", range(8))
def test_dependencies_and_exclusivity_hold(schedule, seed):
    sc, p, m = random_pipeline(seed, schedule)
    r = hops.simulate(sc)
    tl = r.timeline
    comp = tl.kind == "compute"
    ends = {}
    for s, mb, ph, a, b in zip(tl.stage[comp], tl.microbatch[comp], tl.phase[comp], tl.start_ms[comp],
                               tl.end_ms[comp]):
        ends[(int(s), int(mb), str(ph))] = (a, b)
    arrivals = {}
    for s, mb, ph, b, dst in zip(tl.stage[tl.kind == "transfer"], tl.microbatch[tl.kind == "transfer"],
                                 tl.phase[tl.kind == "transfer"], tl.end_ms[tl.kind == "transfer"],
                                 tl.dst[tl.kind == "transfer"]):
        arrivals[(int(s), int(mb), "fwd" if ph == "F" else "bwd")] = b
    bwd = "BW" if not r.extras["split_backward"] else "B"
    n_mb = 2 * m
    for mb in range(n_mb):
        for s in range(p):
            fs, fe = ends[(s, mb, "F")]
            if s > 0:
                assert fs >= arrivals[(s - 1, mb, "fwd")] - 1e-9 >= ends[(s - 1, mb, "F")][1] - 1e-9
            bs, be = ends[(s, mb, bwd)]
            assert bs >= fe - 1e-9
            if s < p - 1:
                assert bs >= arrivals[(s + 1, mb, "bwd")] - 1e-9 >= ends[(s + 1, mb, bwd)][1] - 1e-9
            if bwd == "B":
                assert ends[(s, mb, "W")][0] >= be - 1e-9
    for s in range(p):
        mask = comp & (tl.stage == s)
        order = np.argsort(tl.start_ms[mask])
        assert (tl.start_ms[mask][order][1:] >= tl.end_ms[mask][order][:-1] - 1e-9).all(), "one task at a time"


@pytest.mark.parametrize("seed", range(8))
def test_1f1b_holds_at_most_p_minus_s_activations(seed):
    sc, p, m = random_pipeline(seed, "1f1b")
    r = hops.simulate(sc)
    for s, peak in enumerate(r.summary["peak_in_flight"]):
        assert peak <= min(p - s, m)


@pytest.mark.parametrize("schedule", ["zero_bubble", "zb_h1", "zb_h2"])
@pytest.mark.parametrize("seed", range(8))
def test_zero_bubble_runs_every_weight_gradient_exactly_once(schedule, seed):
    sc, p, m = random_pipeline(seed, schedule)
    tl = hops.simulate(sc).timeline
    w = (tl.kind == "compute") & (tl.phase == "W")
    keys = list(zip(tl.stage[w].tolist(), tl.microbatch[w].tolist()))
    assert len(keys) == len(set(keys)) == p * 2 * m


def test_hops_hetero_picks_1f1b_when_the_last_stage_is_the_bottleneck():
    slow_tail = pipeline(4, 8, per_stage=[(1, 2)] * 3 + [(3, 6)], schedule="hops_hetero", split=0.5)
    assert hops.simulate(slow_tail).summary["scheduler_effective"] == "1f1b"
    slow_head = pipeline(4, 8, per_stage=[(3, 6)] + [(1, 2)] * 3, schedule="hops_hetero", split=0.5)
    assert hops.simulate(slow_head).summary["scheduler_effective"] == "zb_h1"


def unit(p, m, schedule, f=1.0, b=1.0, w=1.0):
    """Every stage F = f, B = b, W = w (BW = b + w), free links: the setting of the papers' formulas."""
    return hops.simulate(pipeline(p, m, f=f, b=b + w, split=b / (b + w), schedule=schedule)).summary


PM = [(2, 2), (3, 5), (4, 4), (4, 16), (6, 13), (8, 8), (8, 32), (16, 64)]


@pytest.mark.parametrize("p,m", PM)
def test_zb_h1_makespan_is_3m_plus_p_minus_1_at_unit_times(p, m):
    s = unit(p, m, "zb_h1")
    assert s["makespan_ms"] == pytest.approx(3 * m + p - 1, abs=1e-6)
    # bubble (p - 1)(F + B - W) per stage: a third of 1F1B's (p - 1)(F + B + W)
    assert s["bubble_ratio"] == pytest.approx((p - 1) / (3 * m + p - 1), abs=1e-9)
    assert unit(p, m, "1f1b")["makespan_ms"] == pytest.approx(3 * m + 3 * (p - 1), abs=1e-6)


@pytest.mark.parametrize("p,m", PM)
def test_zb_h1_holds_the_1f1b_peak_of_activations(p, m):
    zb, ofob = unit(p, m, "zb_h1")["peak_in_flight"], unit(p, m, "1f1b")["peak_in_flight"]
    assert ofob == [min(p - s, m) for s in range(p)]
    assert zb == [min(p, m)] * p  # stage s defers s W's: p - s + s held, never above stage 0's 1F1B peak
    assert max(zb) == max(ofob)


@pytest.mark.parametrize("f,b,w", [(1.0, 2.0, 1.0), (2.0, 1.0, 1.0), (1.0, 1.0, 0.5)])
def test_zb_h1_bubble_is_p_minus_1_times_f_plus_b_minus_w(f, b, w):
    p, m = 4, 16  # the paper's bubble formula holds while W <= F + B (its Table 2 setting)
    assert unit(p, m, "zb_h1", f, b, w)["makespan_ms"] == pytest.approx(m * (f + b + w) + (p - 1) * (f + b - w),
                                                                       abs=1e-6)


def test_zero_bubble_is_zb_h1():
    """`zero_bubble` names the paper's ZB-H1 (the greedy it used to name took 54 here). The
    traces' zero-bubble runs are scored as the 1F1B their Megatron job ran, so the alias moves
    no fixture."""
    assert unit(4, 16, "zero_bubble")["makespan_ms"] == pytest.approx(3 * 16 + 4 - 1)  # 51
    a = hops.simulate(pipeline(5, 9, per_stage=[(1, 3), (2, 2), (1.5, 4), (1, 1), (3, 2)], split=0.4, jitter=0.1,
                               hop_ms=0.3, batches=2, schedule="zero_bubble")).timeline
    b = hops.simulate(pipeline(5, 9, per_stage=[(1, 3), (2, 2), (1.5, 4), (1, 1), (3, 2)], split=0.4, jitter=0.1,
                               hop_ms=0.3, batches=2, schedule="zb_h1")).timeline
    assert (a.start_ms == b.start_ms).all() and (a.phase == b.phase).all() and (a.stage == b.stage).all()


@pytest.mark.parametrize("p,m", [(2, 3), (4, 7), (4, 16), (8, 15), (8, 32)])
def test_zb_h2_holds_2p_minus_1_and_matches_the_flush_bound_at_unit_times(p, m):
    s = unit(p, m, "zb_h2")
    assert s["peak_in_flight"] == [2 * p - 1] * p
    # with Megatron's per-iteration flush one iteration cannot beat 3m + p - 1 (the last stage
    # starts at p - 1 and has 3m of work); ZB-H2 reaches it
    assert s["makespan_ms"] == pytest.approx(3 * m + p - 1, abs=1e-6)


def test_zb_h2_gains_over_zb_h1_when_w_is_short():
    assert unit(8, 32, "zb_h2", w=0.5)["makespan_ms"] < unit(8, 32, "zb_h1", w=0.5)["makespan_ms"] - 1


@pytest.mark.parametrize("p,m", [(4, 6), (2, 2), (8, 14)])
def test_zb_h2_with_fewer_than_2p_minus_1_microbatches_is_an_error_naming_the_field(p, m):
    with pytest.raises(hops.HopsError) as err:
        unit(p, m, "zb_h2")
    assert str(err.value) == (f"simulation.microbatches: {m} microbatches; zb_h2 needs at least 2p - 1 = {2 * p - 1} "
                              f"for its warm-up on {p} stages (use zb_h1)")


def test_schedules_without_options_refuse_one():
    sc = pipeline(4, 8, schedule="zb_h2")
    sc["pipeline"]["scheduler_options"] = {"max_in_flight": 3}
    with pytest.raises(hops.ScenarioError, match=r"^pipeline.scheduler_options.max_in_flight: scheduler "
                                                 r"'zb_h2' takes no options"):
        hops.simulate(sc)


def test_interleaved_refuses_an_option_other_than_its_warm_up():
    sc = pipeline(4, 8, schedule="interleaved_1f1b")
    sc["pipeline"]["virtual_stages"] = 2
    sc["pipeline"]["scheduler_options"] = {"max_in_flight": 3}
    with pytest.raises(hops.ScenarioError, match=r"^pipeline.scheduler_options.max_in_flight: unknown option for "
                                                 r"scheduler 'interleaved_1f1b'; expected one of warmup"):
        hops.simulate(sc)


class Reverse1F1B(Scheduler):
    """A user scheduler: forwards in order, backwards as soon as any gradient is ready."""

    name = "test_greedy"

    def next_tasks(self, state):
        s = state.stage
        j = state.n_b[s]
        if j < state.n_microbatches and state.b_ready[s][j]:
            return [("BW", j)]
        k = state.n_f[s]
        if k < state.n_microbatches and state.f_ready[s][k]:
            return [("F", k)]
        return []


def test_user_scheduler_by_registered_name_and_by_dotted_path(monkeypatch):
    from hops.schedulers import _REGISTRY

    monkeypatch.setitem(_REGISTRY, "test_greedy", Reverse1F1B)
    assert register(Reverse1F1B) is Reverse1F1B
    by_name = hops.simulate(pipeline(3, 4, schedule="test_greedy")).summary
    by_path = hops.simulate(pipeline(3, 4, schedule="test_schedulers.Reverse1F1B")).summary
    assert by_name["makespan_ms"] == by_path["makespan_ms"] > 0


class Impatient(Scheduler):
    name = "impatient"

    def next_tasks(self, state):
        return [("BW", 0)]


def test_a_scheduler_that_breaks_dependencies_is_stopped_with_a_clear_error():
    with pytest.raises(hops.HopsError, match="impatient"):
        hops.simulate(pipeline(3, 2, schedule="test_schedulers.Impatient"))


@pytest.mark.parametrize("schedule,options,message", [
    ("hetero_search", {"max_in_flight": 0}, "max_in_flight: got 0; expected a whole number of at least 1"),
    ("hetero_search", {"max_in_flight": 2.5}, "max_in_flight: got 2.5; expected a whole number of at least 1"),
    ("hetero_search", {"max_in_flight": "x"}, "max_in_flight: got 'x'; expected a whole number of at least 1"),
    ("hetero_search", {"extra_in_flight": -1}, "extra_in_flight: got -1; expected a whole number of at least 0"),
    ("hetero_search", {"search_budget": 0}, "search_budget: got 0; expected a positive number of simulated tasks"),
    ("zb_v", {"max_in_flight": 7}, "max_in_flight: got 7; expected a whole number of at least 8 (2p chunk "
                                   "activations per device, 1F1B's memory, below which the V's rules stall)"),
])
def test_a_counting_option_out_of_range_is_refused_not_truncated_or_defaulted(schedule, options, message):
    sc = pipeline(4, 8, schedule=schedule, split=0.5)
    sc["pipeline"]["scheduler_options"] = options
    if schedule == "zb_v":
        sc["pipeline"]["virtual_stages"] = 2
    with pytest.raises(hops.ScenarioError) as err:
        hops.simulate(sc)
    assert str(err.value) == "pipeline.scheduler_options." + message
