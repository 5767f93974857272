"""The engine reproduces textbook pipeline arithmetic exactly when times are constant."""
import copy

import pytest

import hops
from hops.model.hardware import Catalog
from builders import pipeline


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("p,m", [(2, 1), (3, 5), (4, 8), (6, 2), (8, 32)])
def test_identical_stages_makespan_and_bubble(schedule, p, m):
    f, b = 2.0, 4.0
    s = hops.simulate(pipeline(p, m, f=f, b=b, schedule=schedule)).summary
    assert s["makespan_ms"] == pytest.approx((m + p - 1) * (f + b), rel=1e-9)
    assert s["bubble_ratio"] == pytest.approx((p - 1) / (m + p - 1), rel=1e-9)


@pytest.mark.parametrize("p,m,c", [(2, 4, 0.5), (4, 8, 1.0), (5, 3, 2.0)])
def test_gpipe_with_overlapped_sends_pays_each_hop_twice_on_the_critical_path(p, m, c):
    f, b = 2.0, 4.0
    overlapped = Catalog.load({"stacks.megatron_core.p2p_overlap": True})  # Megatron with --overlap-p2p-comm
    s = hops.simulate(pipeline(p, m, f=f, b=b, schedule="gpipe", hop_ms=c), catalog=overlapped).summary
    assert s["makespan_ms"] == pytest.approx((m + p - 1) * (f + b) + 2 * (p - 1) * c, rel=1e-9)


@pytest.mark.parametrize("p,m,c", [(2, 4, 0.5), (4, 8, 1.0), (5, 3, 2.0)])
def test_gpipe_with_blocking_sends_pays_a_hop_after_every_pass_that_sends(p, m, c):
    """A blocking send holds its stage until delivered, so each pass that sends costs f + c (or b + c):
    stage 0 emits forward i at (i + 1)(f + c), the last stage's backwards start after
    (m + p - 2)(f + c) + f and reach stage 0 after m + p - 2 more (b + c), which then runs its last b."""
    f, b = 2.0, 4.0
    assert Catalog.load().stacks["megatron_core"]["p2p_overlap"] == "interleaved", "one chunk: the sends block"
    s = hops.simulate(pipeline(p, m, f=f, b=b, schedule="gpipe", hop_ms=c)).summary
    assert s["makespan_ms"] == pytest.approx((m + p - 1) * (f + b) + 2 * (m + p - 2) * c, rel=1e-9)


@pytest.mark.parametrize("schedule,virtual,options,overlapped", [
    ("1f1b", 1, {}, False), ("interleaved_1f1b", 2, {}, True), ("interleaved_1f1b", 2, {"warmup": "pytorch"}, False),
    ("zb_v", 2, {}, False), ("zb_h1", 1, {}, False)])
def test_megatron_core_overlaps_p2p_only_under_megatrons_interleaved_schedule(schedule, virtual, options, overlapped):
    """Megatron's default (`p2p_overlap: interleaved`): its interleaved 1F1B overlaps its sends
    with the next chunk; its other schedules, and chunked ones that are not Megatron's (ZB-V,
    PyTorch's interleaved order), wait for theirs."""
    d = pipeline(4, 8, schedule=schedule, hop_ms=0.5, split=0.5)
    d["pipeline"]["virtual_stages"] = virtual
    d["pipeline"]["scheduler_options"] = options
    if schedule == "zb_v":
        d["optimizer"]["post_validation"] = True
    runs = {}
    for option in (None, False, True):
        doc = copy.deepcopy(d)
        doc["pipeline"]["stack_options"] = {"p2p_overlap": option}
        runs[option] = hops.simulate(doc).summary["makespan_ms"]
    assert runs[None] == runs[overlapped]
    assert runs[True] < runs[False]


def test_throughput_counts_microbatches_over_the_window():
    p, m = 4, 8
    s = hops.simulate(pipeline(p, m, schedule="gpipe")).summary
    assert s["throughput"]["microbatches_per_s"] == pytest.approx(m / ((m + p - 1) * 6.0 / 1000.0), rel=1e-9)


def test_latency_of_a_single_microbatch_is_the_round_trip():
    p = 4
    s = hops.simulate(pipeline(p, 1, f=2.0, b=4.0, schedule="1f1b", hop_ms=0.5)).summary
    assert s["latency_ms"]["p50"] == pytest.approx(p * 6.0 + 2 * (p - 1) * 0.5, rel=1e-9)


def test_iterations_are_separated_by_flush_optimizer_and_host_overhead():
    sc = pipeline(2, 2, f=1.0, b=2.0, schedule="gpipe", batches=3)
    sc["optimizer"] = {"enabled": True, "step_ms": 5.0}
    sc["pipeline"]["host_overhead"] = {"kind": "constant", "ms": 10.0}
    r = hops.simulate(sc)
    per_iter = (2 + 2 - 1) * 3.0 + 5.0 + 10.0
    starts = sorted({float(r.timeline.start_ms[r.timeline.iteration == i].min()) for i in range(3)})
    assert starts == pytest.approx([0.0, per_iter, 2 * per_iter])
    assert (r.timeline.kind == "optimizer").sum() == 2 * 3


def test_zero_bubble_fills_the_cooldown_with_weight_gradients():
    """Split backward with W deferred beats fused 1F1B on a uniform pipeline (ZB-H1's claim)."""
    fused = hops.simulate(pipeline(4, 16, schedule="1f1b")).summary
    split = hops.simulate(pipeline(4, 16, schedule="zero_bubble", split=0.5)).summary
    assert split["makespan_ms"] < fused["makespan_ms"]
    assert split["bubble_ratio"] < fused["bubble_ratio"]


def test_shared_link_transfers_serialize_and_count_contention():
    """Two stages on one node sending to the same remote device share one directed link."""
    sc = pipeline(3, 4, f=1.0, b=1.0, schedule="gpipe")
    sc["pipeline"]["stages"][2]["device"] = "g0"  # stage 1 -> stage 2 goes g1 -> g0, stage 0 -> 1 is g0 -> g1
    sc["overrides"]["links"] = [{"src": "g0", "dst": "g1", "latency_ms": 0.0, "bandwidth_gbps": 0.1},
                                {"src": "g1", "dst": "g0", "latency_ms": 0.0, "bandwidth_gbps": 0.1}]
    r = hops.simulate(sc)
    stats = r.summary["link_contention"]
    assert stats["g0->g1"]["transfers"] == 4 + 4  # activations 0->1 and gradients 2->1 both go g0 -> g1
    tl = r.timeline
    xfer = tl.select((tl.kind == "transfer") & (tl.src == "g0"))
    order = xfer.start_ms.argsort()
    assert (xfer.start_ms[order][1:] >= xfer.end_ms[order][:-1] - 1e-9).all()  # FIFO: never overlap


def test_an_optimizer_step_counts_as_busy_and_the_idle_splits_at_the_flush():
    """Bubble = idle share, where F/B/W/BW and optimizer steps are busy (megatron_summary's rule).
    The idle splits into pipeline idle (before the flush) and iteration-end idle (after it),
    and per stage the four parts add up to the iteration wall."""
    sc = pipeline(4, 8, schedule="1f1b", batches=3)
    sc["optimizer"] = {"enabled": True, "step_ms": [5.0, 6.0, 7.0, 8.0]}
    s = hops.simulate(sc, catalog=Catalog.load({"stacks.megatron_core.iteration_overhead_ms": 0.0})).summary
    wall = s["makespan_ms"] / s["window"]["iterations"]
    parts = s["time_breakdown_ms_per_iteration"]
    assert len(parts) == 4
    for row in parts:
        assert row["compute_ms"] + row["optimizer_ms"] + row["iteration_end_ms"] + row["pipeline_idle_ms"] == \
            pytest.approx(wall, rel=1e-9)
    busy = sum(r["compute_ms"] + r["optimizer_ms"] for r in parts)
    assert s["bubble_ratio"] == pytest.approx(1.0 - busy / (4 * wall), rel=1e-9)
    assert s["idle_breakdown"]["pipeline"] + s["idle_breakdown"]["iteration_end"] == pytest.approx(s["bubble_ratio"])
    assert [r["optimizer_ms"] for r in parts] == pytest.approx([5.0, 6.0, 7.0, 8.0])
    # 1F1B at constant times: the pipeline idle is the textbook (p - 1)(f + b) per stage
    assert [r["pipeline_idle_ms"] for r in parts] == pytest.approx([3 * 6.0] * 4)
    # after the flush every stage waits for the slowest optimizer step (8 ms) to finish
    assert [r["iteration_end_ms"] for r in parts] == pytest.approx([3.0, 2.0, 1.0, 0.0])
