"""interleaved_zb: PyTorch's ScheduleInterleavedZeroBubble, ZB-H1's split backward on interleaved
1F1B's looping placement, against ZB-H1 and the bubble arithmetic both schedules share."""
import numpy as np
import pytest

import hops
from hops.schedulers.interleaved_zb import device_order
from hops.schedulers.zero_bubble import ZBH1
from builders import pipeline


def looped(p, m, v, schedule="interleaved_zb", **kw):
    """F = B = W = 1 ms per whole stage (1/v per chunk), every pair of devices on a free link."""
    sc = pipeline(p, m, f=1.0, b=2.0, split=0.5, schedule=schedule, **kw)
    sc["pipeline"]["virtual_stages"] = v
    sc["overrides"]["links"] = [{"src": f"g{i}", "dst": f"g{j}", "latency_ms": 0.0, "bandwidth_gbps": 1e12}
                                for i in range(p) for j in range(p) if i != j]
    return sc


PMV = [(2, 4, 2), (4, 8, 2), (4, 16, 2), (4, 16, 4), (8, 8, 2), (8, 16, 4), (4, 4, 2), (4, 12, 2)]


@pytest.mark.parametrize("p,m", [(2, 1), (2, 4), (4, 3), (4, 16), (8, 8), (8, 13)])
def test_with_one_chunk_the_order_is_zb_h1s(p, m):
    """PyTorch's rules at v = 1: 1F1B's p - 1 - d warm-up forwards and W's d steps late: ZB-H1."""
    for d in range(p):
        assert [(phase, j) for _, phase, j in device_order(d, p, 1, m)] == ZBH1().stage_order(d, p, m)


@pytest.mark.parametrize("p,m,v", PMV)
def test_its_bubble_is_a_third_of_interleaved_1f1bs_at_unit_times(p, m, v):
    """ZB-H1's bubble (p - 1)(F + B - W) against 1F1B's (p - 1)(F + B + W), each divided by the v
    chunks a microbatch loops over: 3m + (p - 1)/v against 3m + 3(p - 1)/v."""
    zb = hops.simulate(looped(p, m, v)).summary["makespan_ms"]
    assert zb == pytest.approx(3 * m + (p - 1) / v, abs=1e-6)
    if m % p == 0:  # Megatron's interleaved 1F1B needs m a multiple of p
        one = hops.simulate(looped(p, m, v, schedule="interleaved_1f1b")).summary["makespan_ms"]
        assert one - 3 * m == pytest.approx(3 * (zb - 3 * m), abs=1e-6)


@pytest.mark.parametrize("p,m,v", PMV)
def test_every_device_holds_v_p_chunk_activations_at_most(p, m, v):
    """Device d's warm-up, (v - 1)r + p - 1 - d forwards (r = m / max(1, m div p) per round),
    plus one, plus the d W's it owes: v p chunk activations on every device once the warm-up fits,
    where interleaved 1F1B's device 0 holds (v - 1)p + 2(p - 1) + 1."""
    s = hops.simulate(looped(p, m, v)).summary
    r = m // max(1, m // p)
    assert s["peak_in_flight"] == [min((v - 1) * r + p, m * v)] * p


@pytest.mark.parametrize("p,m,v", [(4, 8, 2), (8, 16, 4)])
def test_device_d_runs_its_warm_up_and_one_more_forward_before_its_first_backward(p, m, v):
    """Each step after the warm-up is a forward, then a backward: (v - 1)p + p - 1 - d + 1 forwards
    come first, one hop's worth per device fewer than interleaved 1F1B's 2(p - 1 - d)."""
    tl = hops.simulate(looped(p, m, v)).timeline
    for d in range(p):
        mine = (tl.kind == "compute") & (tl.device == f"g{d}")
        phases = tl.phase[mine][np.argsort(tl.start_ms[mine], kind="stable")]
        first_b = list(phases).index("B")
        assert first_b == min((v - 1) * p + p - d, m * v)


def test_one_chunk_per_stage_is_an_error_naming_the_field():
    with pytest.raises(hops.HopsError) as err:
        hops.simulate(looped(4, 8, 1))
    assert str(err.value) == ("pipeline.virtual_stages: interleaved_zb needs at least 2 model chunks per stage "
                              "(got 1); set pipeline.virtual_stages: 2 or more, or use schedule zb_h1")


def test_microbatches_that_do_not_fill_equal_rounds_are_an_error_naming_the_field():
    """PyTorch runs m microbatches in max(1, m div p) equal rounds and refuses an m they do not divide."""
    with pytest.raises(hops.HopsError, match=r"^simulation.microbatches: 9 microbatches; interleaved_zb .* 2 equal "
                                             r"rounds on 4 stages, which 9 does not divide into$"):
        hops.simulate(looped(4, 9, 2))


def test_post_validation_is_refused_as_for_any_schedule_that_keeps_the_barrier():
    sc = looped(4, 8, 2)
    sc["optimizer"] = {"enabled": True, "post_validation": True}
    with pytest.raises(hops.HopsError, match=r"optimizer.post_validation: schedule 'interleaved_zb' ignores it"):
        hops.simulate(sc)
