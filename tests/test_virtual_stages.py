"""Virtual stages (pipeline.virtual_stages): interleaved 1F1B against Megatron's formulas, and the
chunks through scenario, compute model and memory accounting."""
import pytest

import hops
from hops.model.hardware import Catalog, per_gpu
from builders import pipeline


def interleaved(p, m, v, f=1.0, b=2.0, **kw):
    sc = pipeline(p, m, f=f, b=b, schedule="interleaved_1f1b", **kw)
    sc["pipeline"]["virtual_stages"] = v
    # a microbatch loops over the devices v times: every pair of devices gets a free link
    sc["overrides"]["links"] = [{"src": f"g{i}", "dst": f"g{j}", "latency_ms": 0.0, "bandwidth_gbps": 1e12}
                                for i in range(p) for j in range(p) if i != j]
    return sc


PMV = [(2, 4, 2), (4, 8, 2), (4, 16, 2), (4, 16, 4), (8, 32, 2), (8, 16, 4), (4, 4, 2)]


@pytest.mark.parametrize("p,m,v", PMV)
def test_interleaved_bubble_is_p_minus_1_over_v_m_at_unit_times(p, m, v):
    s = hops.simulate(interleaved(p, m, v)).summary  # F = 1, BW = 2 per whole stage
    ideal = 3 * m
    bubble = 3 * (p - 1) / v
    assert s["makespan_ms"] == pytest.approx(ideal + bubble, abs=1e-6)
    assert bubble / ideal == pytest.approx((p - 1) / (v * m))  # Megatron's bubble fraction
    one = hops.simulate(pipeline(p, m, f=1.0, b=2.0, schedule="1f1b")).summary["makespan_ms"]
    assert one - ideal == pytest.approx(v * bubble, abs=1e-6)  # v times 1F1B's


@pytest.mark.parametrize("p,m,v", PMV)
def test_interleaved_holds_megatrons_warm_up_plus_one_chunks(p, m, v):
    s = hops.simulate(interleaved(p, m, v)).summary
    total = m * v
    warm = [total if m == p else min(2 * (p - d - 1) + (v - 1) * p, total) for d in range(p)]
    assert s["peak_in_flight"] == [min(w + 1, total) for w in warm]


@pytest.mark.parametrize("p,m,v", [(4, 4, 2), (8, 8, 2), (4, 8, 2), (4, 4, 4)])
def test_pytorchs_warm_up_has_no_all_forward_case_at_m_equal_p(p, m, v):
    """torch.distributed.pipelining's ScheduleInterleaved1F1B: (v - 1)p + 2(p - d - 1) warm-up
    forwards capped at mv, at m = p too; elsewhere it is Megatron's order. At unit times the
    time is the same: (p - 1)/(v m) bubble either way."""
    sc = interleaved(p, m, v)
    sc["pipeline"]["scheduler_options"] = {"warmup": "pytorch"}
    s = hops.simulate(sc).summary
    total = m * v
    warm = [min(2 * (p - d - 1) + (v - 1) * p, total) for d in range(p)]
    assert s["peak_in_flight"] == [min(w + 1, total) for w in warm]
    assert s["makespan_ms"] == pytest.approx(hops.simulate(interleaved(p, m, v)).summary["makespan_ms"])


def test_an_unknown_interleaved_warm_up_is_an_error_naming_the_option():
    sc = interleaved(4, 8, 2)
    sc["pipeline"]["scheduler_options"] = {"warmup": "torch"}
    with pytest.raises(hops.HopsError) as err:
        hops.simulate(sc)
    assert str(err.value) == "pipeline.scheduler_options.warmup: got 'torch'; expected one of megatron, pytorch"


def test_every_chunk_runs_each_phase_once_per_microbatch():
    p, m, v = 4, 8, 2
    tl = hops.simulate(interleaved(p, m, v)).timeline
    comp = tl.kind == "compute"
    for phase in ("F", "BW"):
        sel = comp & (tl.phase == phase)
        keys = list(zip(tl.stage[sel].tolist(), tl.microbatch[sel].tolist()))
        assert len(keys) == p * m * v and all(keys.count(k) == v for k in set(keys))
    # the loop back: the last device sends chunk 0's output to device 0
    xfer = tl.kind == "transfer"
    assert {(str(a), str(b)) for a, b in zip(tl.src[xfer], tl.dst[xfer])} >= {("g3", "g0")}


def test_megatron_constraint_on_microbatches_is_an_error_naming_the_field():
    with pytest.raises(hops.HopsError, match=r"simulation.microbatches: 6 microbatches; interleaved 1F1B .* multiple"):
        hops.simulate(interleaved(4, 6, 2))


def test_interleaved_with_one_chunk_per_stage_is_an_error_naming_the_field():
    """With one chunk Megatron runs 1F1B; the interleaved order would double 1F1B's warm-up."""
    with pytest.raises(hops.HopsError) as err:
        hops.simulate(interleaved(4, 8, 1))
    assert str(err.value) == ("pipeline.virtual_stages: interleaved_1f1b needs at least 2 model chunks per stage "
                              "(got 1); set pipeline.virtual_stages: 2 or more, or use schedule 1f1b")


def test_virtual_stages_with_a_one_chunk_schedule_is_an_error_naming_the_field():
    sc = pipeline(4, 8, schedule="1f1b")
    sc["pipeline"]["virtual_stages"] = 2
    with pytest.raises(hops.HopsError, match=r"pipeline.virtual_stages: schedule '1f1b' runs one model chunk"):
        hops.simulate(sc)


@pytest.mark.parametrize("schedule,chunks", [("1f1b", 1), ("zb_h1", 1), ("zb_v", 2), ("interleaved_1f1b", 2),
                                             ("interleaved_zb", 2)])
def test_without_virtual_stages_each_schedule_runs_its_own_chunks_and_the_summary_says_so(schedule, chunks):
    """The default `auto`: one sweep over schedules of one and of two chunks needs no per-job setting."""
    sc = pipeline(4, 8, schedule=schedule)
    sc["overrides"]["links"] = [{"src": f"g{i}", "dst": f"g{j}", "latency_ms": 0.0, "bandwidth_gbps": 1e12}
                                for i in range(4) for j in range(4) if i != j]
    assert "virtual_stages" not in sc["pipeline"]
    auto = hops.simulate(sc)
    assert auto.summary["virtual_stages"] == chunks
    sc["pipeline"]["virtual_stages"] = chunks
    assert hops.simulate(sc).timeline.end_ms.max() == auto.timeline.end_ms.max()


@pytest.mark.parametrize("value", ["automatic", 0, -1, 1.5, True, "2"])
def test_virtual_stages_is_an_integer_or_auto_and_says_so(value):
    sc = pipeline(4, 8, schedule="1f1b")
    sc["pipeline"]["virtual_stages"] = value
    with pytest.raises(hops.HopsError) as err:
        hops.simulate(sc)
    assert str(err.value).startswith("pipeline.virtual_stages: expected an integer >= 1 or auto, got ")
    assert "\n" not in str(err.value)


# The analytical cases run on the fixtures' stack, whose launch adds to every chunk and whose
# embedding overhead marks the chunk that runs the embedding.
STACK = "fixture_megatron"
FIXTURE = Catalog.load().stacks[STACK]


def analytical(v):
    """Two A100 stages; v chunks each under interleaved 1F1B, or one under 1F1B (v = 1)."""
    sc = {"simulation": {"batches": 1, "microbatches": 4},
          "pipeline": {"schedule": "interleaved_1f1b" if v > 1 else "1f1b", "virtual_stages": v, "stack": STACK,
                       "model": {"hidden_dim": 2048, "seq_len": 2048},
                       "stages": [{"device": f"g{i}", "weights_mb": 1000,
                                   "compute": {"mode": "analytical", "tflop": 4.0, "memory_mb": 1000}}
                                  for i in range(2)]},
          "hardware": {"devices": [{"id": f"g{i}", "gpu": "a100", "node": "n0"} for i in range(2)],
                       "interconnect": {"same_node": "nvlink"}}}
    return hops.simulate(sc)


def test_chunks_carry_1_over_v_of_the_layers_and_the_head_and_embedding_on_the_right_chunk():
    one, two = analytical(1), analytical(2)
    full = one.summary["stages"]
    chunks = two.extras["chunks"]  # virtual stages: (g0, c0), (g1, c0), (g0, c1), (g1, c1)
    assert [c.layers for c in chunks] == pytest.approx([full[0]["layers"] / 2] * 4)
    mid = chunks[1]  # no embedding, no LM head
    launch = per_gpu(FIXTURE, "launch_overhead_ms", "a100")  # every chunk is its own invocation
    embed = FIXTURE["embedding_overhead_ms"]
    # compute-bound stages: the chunk's forward is half the stage's, less embedding and launch
    assert chunks[0].f - mid.f == pytest.approx(embed)  # embedding overhead on virtual stage 0 only
    assert chunks[2].f == pytest.approx(mid.f) and chunks[3].f > mid.f  # LM head: the last chunk of g1
    assert 2 * (mid.f - launch) == pytest.approx(full[0]["expected_ms"]["F"] - launch - embed)


def test_activation_memory_counts_chunks_at_1_over_v_of_the_stage():
    one, two = analytical(1), analytical(2)
    layers = one.summary["stages"][0]["layers"]
    act = layers * 2048 * 2048 * 34 / 1e6  # a whole stage's stash per microbatch (model preset: 34 B)
    for i, dev in enumerate(("g0", "g1")):
        fixed = one.summary["peak_memory_mb"][dev] - one.summary["peak_in_flight"][i] * act
        held = two.summary["peak_in_flight"][i] * act / 2  # chunk-microbatches, half a stage each
        assert two.summary["peak_memory_mb"][dev] == pytest.approx(fixed + held)


# ----------------------------------------------------------------------------- ZB-V
def zbv(p, m, f=1.0, b=1.0, w=1.0, **kw):
    """ZB-V at chunk times F = f, B = b, W = w: the whole stage (two chunks) takes twice that."""
    sc = pipeline(p, m, f=2 * f, b=2 * (b + w), split=b / (b + w), schedule="zb_v", **kw)
    sc["pipeline"]["virtual_stages"] = 2
    return sc


# the flush bound is reached at every depth when p divides m, and at any m >= 2p for p = 1-4, 8
EXACT = [(1, 3), (2, 4), (2, 7), (3, 6), (3, 11), (4, 8), (4, 9), (4, 16), (8, 16), (8, 21), (8, 32),
         (5, 5), (5, 10), (6, 18), (7, 14), (9, 27), (12, 24), (16, 16), (16, 32)]


@pytest.mark.parametrize("p,m", EXACT)
def test_zb_v_takes_6m_plus_p_minus_1_chunk_units_at_unit_times(p, m):
    """Each device has 2 chunks x m microbatches x (F, B, W) = 6m units; under the flush the
    last device receives its first input after p - 1 chunk forwards, so one iteration cannot
    beat 6m + p - 1. 1F1B on the same whole stages (2 units per phase) takes 2 x 3(m + p - 1)
    and ZB-H1 2(3m + p - 1)."""
    s = hops.simulate(zbv(p, m)).summary
    assert s["makespan_ms"] == pytest.approx(6 * m + p - 1, abs=1e-6)
    assert s["bubble_ratio"] == pytest.approx((p - 1) / (6 * m + p - 1), abs=1e-9)
    if p > 1:
        zb_h1 = hops.simulate(pipeline(p, m, f=2.0, b=4.0, split=0.5, schedule="zb_h1")).summary["makespan_ms"]
        assert zb_h1 == pytest.approx(2 * (3 * m + p - 1), abs=1e-6)


@pytest.mark.parametrize("p", [5, 6, 7, 9, 10, 12, 16])
def test_zb_v_stays_within_4_units_of_the_flush_bound_when_p_does_not_divide_m(p):
    """There the unit-time rules miss 6m + p - 1 by a few chunk units, a constant that does
    not grow with m (the paper's hand-drawn order is exact; see zb_v.py)."""
    for m in (2 * p + 1, 3 * p - 1, 4 * p + 3):
        span = hops.simulate(zbv(p, m)).summary["makespan_ms"]
        assert 6 * m + p - 1 - 1e-6 <= span <= 6 * m + p - 1 + 4 + 1e-6


@pytest.mark.parametrize("p,m", EXACT + [(5, 11), (6, 13), (16, 37), (4, 3), (8, 5)])
def test_zb_v_holds_1f1b_peak_activations_on_every_device(p, m):
    """2p chunk activations of half a stage each = 1F1B's p whole-stage microbatches (its
    first stage's peak), on every device; fewer when m < p."""
    zb = hops.simulate(zbv(p, m)).summary["peak_in_flight"]  # chunk-microbatches
    ofob = hops.simulate(pipeline(p, m, schedule="1f1b")).summary["peak_in_flight"]  # whole-stage microbatches
    assert max(zb) == 2 * max(ofob) == 2 * min(p, m) or m < p
    assert all(peak <= 2 * p for peak in zb)
    if m >= p:
        assert zb == [2 * p] * p


@pytest.mark.parametrize("seed", range(6))
def test_zb_v_runs_every_weight_gradient_exactly_once_under_jitter(seed):
    import numpy as np
    rng = np.random.default_rng(seed)
    p, m = int(rng.integers(2, 7)), int(rng.integers(1, 20))
    per = [(float(rng.uniform(0.5, 5)), float(rng.uniform(0.5, 10))) for _ in range(p)]
    sc = pipeline(p, m, schedule="zb_v", per_stage=per, hop_ms=float(rng.uniform(0, 1)), jitter=0.2, batches=2,
                  seed=seed, split=0.5)
    sc["pipeline"]["virtual_stages"] = 2
    r = hops.simulate(sc)
    tl = r.timeline
    comp = tl.kind == "compute"
    for phase in ("F", "B", "W"):
        sel = comp & (tl.phase == phase)
        keys = list(zip(tl.stage[sel].tolist(), tl.microbatch[sel].tolist()))
        assert len(keys) == 2 * p * 2 * m and all(keys.count(k) == 2 for k in set(keys))  # once per chunk
    assert not (comp & (tl.phase == "BW")).any()
    assert all(peak <= 2 * p for peak in r.summary["peak_in_flight"])
    for s in range(p):  # one task at a time per device
        sel = comp & (tl.stage == s)
        order = np.argsort(tl.start_ms[sel], kind="stable")
        assert (tl.start_ms[sel][order][1:] >= tl.end_ms[sel][order][:-1] - 1e-9).all()


@pytest.mark.parametrize("p,m", [(3, 6), (4, 9)])
def test_zb_v_runs_each_microbatch_down_and_back_up_the_devices(p, m):
    """Chunk k of 2p runs on device k for k < p, else on device 2p - 1 - k: a microbatch's
    forwards visit devices 0..p-1 then p-1..0 (chunks 0..2p-1); its B's the reverse chunks,
    which is the same device sequence; each W after its own B."""
    tl = hops.simulate(zbv(p, m, b=1.3, w=0.7)).timeline
    comp = tl.kind == "compute"
    v = list(range(p)) + list(range(p - 1, -1, -1))
    for j in range(m):
        for phase in ("F", "B"):
            sel = comp & (tl.microbatch == j) & (tl.phase == phase)
            order = tl.stage[sel][tl.start_ms[sel].argsort(kind="stable")].tolist()
            assert order == v
        b_sel = comp & (tl.microbatch == j) & (tl.phase == "B")
        f_sel = comp & (tl.microbatch == j) & (tl.phase == "F")
        assert tl.start_ms[b_sel].min() >= tl.end_ms[f_sel].max() - 1e-9  # the last chunk's F before any B


def zbv_excess(p, m, f, b, w, post_validation=False):
    """Time one iteration takes beyond a device's work 2m(F + B + W), in a run of one under the
    flush, or in the steady state of post-validated iterations (what the fourth adds to three)."""
    def span(batches):
        sc = zbv(p, m, f, b, w, batches=batches)
        sc["optimizer"]["post_validation"] = post_validation
        s = hops.simulate(sc).summary
        assert max(s["peak_in_flight"]) == 2 * p  # 1F1B's memory: 2p chunk activations of half a stage
        return s["makespan_ms"]

    period = span(4) - span(3) if post_validation else span(1)
    return period - 2 * m * (f + b + w)


@pytest.mark.parametrize("post_validation", [False, True])
@pytest.mark.parametrize("p", [4, 8])
def test_zb_v_at_real_models_ratios_idles_at_most_half_a_fill_beyond_the_fill(p, post_validation):
    """At F : B : W = 1 : 1.2 : 0.95 chunk units (a model without recomputation: B above F, W
    below), free links, m = 4p: under the flush no order avoids the fill, p - 1 chunk
    forwards before device p - 1 gets its first input; the order costs at most half a fill
    more, within 1F1B's memory, and post-validated iterations no more than that either.
    Planned only at the expected times, where a message of next to no time lands just after
    a device has chosen, the V idled 1.7 fills at p 4 and 2 at p 8, with or without the
    flush (a W started while the B it then delayed was all but there)."""
    f, b, w = 1.0, 1.2, 0.95
    assert zbv_excess(p, 4 * p, f, b, w, post_validation) <= 1.5 * (p - 1) * f + 1e-6


@pytest.mark.parametrize("p", [4, 8])
def test_zb_v_at_the_full_recomputation_ratio_idles_less_than_zb_h1(p):
    """At F : B : W = 1 : 2.2 : 0.86 (full recomputation: B carries a second forward), m 4p,
    free links, the V idles less per iteration than ZB-H1 on the same whole stages, whose
    bubble is (p - 1)(F + B - W) of a whole stage, here 2(p - 1)(F + B - W) chunk units: 10.3
    against 14.0 at p 4 (it was 15.8), 25.4 against 32.8 at p 8 (it was 34.8 before the fixed
    preferences of hops.schedulers.zb_v.PRIORITIES)."""
    m, f, b, w = 4 * p, 1.0, 2.2, 0.86
    zb_h1 = hops.simulate(pipeline(p, m, f=2 * f, b=2 * (b + w), split=b / (b + w), schedule="zb_h1")).summary
    assert zb_h1["makespan_ms"] - 2 * m * (f + b + w) == pytest.approx(2 * (p - 1) * (f + b - w), abs=1e-6)
    assert zbv_excess(p, m, f, b, w) < 2 * (p - 1) * (f + b - w)


@pytest.mark.parametrize("p,m", [(2, 4), (4, 8), (8, 16)])
def test_zb_v_sends_twice_1f1bs_pipeline_messages(p, m):
    """2p - 1 chunk boundaries, one of them (chunk p-1 -> p) inside device p - 1: 2(p - 1)
    messages each way per microbatch, against 1F1B's p - 1."""
    tl = hops.simulate(zbv(p, m)).timeline
    ofob = hops.simulate(pipeline(p, m, schedule="1f1b")).timeline
    n, n1 = int((tl.kind == "transfer").sum()), int((ofob.kind == "transfer").sum())
    assert n1 == 2 * (p - 1) * m
    assert n == 2 * n1 == 4 * (p - 1) * m


def test_zb_v_needs_two_chunks_per_stage_and_says_which_field():
    sc = zbv(4, 8)
    sc["pipeline"]["virtual_stages"] = 1
    with pytest.raises(hops.HopsError, match=r"pipeline.virtual_stages: schedule 'zb_v' runs 2 model chunks"):
        hops.simulate(sc)


def analytical_doc(schedule, *, p=3, hidden_dim=2048, tied=None, **stage):
    """p A100s on separate nodes, each stage 1000 MB of weights and 4 TFLOP, optimizer on;
    ``stage`` adds keys to every stage (e.g. activation_memory_mb)."""
    v = 2 if schedule in ("zb_v", "interleaved_1f1b", "interleaved_zb") else 1
    return {"simulation": {"batches": 1, "microbatches": 2 * p},
            "pipeline": {"schedule": schedule, "virtual_stages": v, "precision": "bf16", "stack": STACK,
                         "model": {"hidden_dim": hidden_dim, "seq_len": 2048, "vocab_size": 50304,
                                   **({} if tied is None else {"tied_embeddings": tied})},
                         "stages": [{"device": f"g{i}", "weights_mb": 1000, **stage,
                                     "compute": {"mode": "analytical", "tflop": 4.0, "memory_mb": 1000}}
                                    for i in range(p)]},
            "hardware": {"devices": [{"id": f"g{i}", "gpu": "a100", "node": f"n{i}"} for i in range(p)],
                         "interconnect": {"same_node": "nvlink", "cross_node": "infiniband"}},
            "optimizer": {"enabled": True}}


def analytical_v(schedule, p=3):
    return hops.simulate(analytical_doc(schedule, p=p))


def test_zb_v_puts_embedding_and_lm_head_on_device_0_and_needs_no_tied_embedding_all_reduce():
    v, one = analytical_v("zb_v"), analytical_v("zb_h1")
    chunks = v.extras["chunks"]  # V order: (g0,c0) (g1,c0) (g2,c0) (g2,c1) (g1,c1) (g0,c1)
    mid = chunks[1]
    assert chunks[0].f - mid.f == pytest.approx(FIXTURE["embedding_overhead_ms"])  # embedding: the first chunk, on g0
    assert chunks[-1].f > chunks[0].f  # LM head: the last chunk, also on g0
    assert all(c.f == pytest.approx(mid.f) for c in chunks[1:-1])  # g1 and g2 carry neither
    ar = lambda r: r.timeline.kind == "allreduce"
    assert ar(one).any() and not ar(v).any()  # tied embedding and head share g0: nothing to all-reduce
    opt = lambda r, s: float(r.timeline.end_ms[(r.timeline.phase == "OPT") & (r.timeline.stage == s)][0]
                             - r.timeline.start_ms[(r.timeline.phase == "OPT") & (r.timeline.stage == s)][0])
    assert opt(v, 0) == pytest.approx(opt(one, 0))  # g0 steps the (tied) vocabulary matrix
    assert opt(v, 2) < opt(one, 2) and opt(v, 2) == pytest.approx(opt(one, 1))  # g2 no longer does


# ----------------------------------------------------------------------------- chunks in the timeline
def forward_path(tl, j):
    """(stage, chunk) of microbatch j's forwards, in the order they ran."""
    sel = (tl.kind == "compute") & (tl.microbatch == j) & (tl.phase == "F")
    order = tl.start_ms[sel].argsort(kind="stable")
    return list(zip(tl.stage[sel][order].tolist(), tl.chunk[sel][order].tolist()))


@pytest.mark.parametrize("p,m", [(3, 6), (4, 8)])
def test_zb_v_timeline_gives_every_device_both_chunks_in_each_phase(p, m):
    """The stage column alone cannot tell a device's two chunks apart; the chunk column can:
    each device runs F, B and W of chunk 0 (going down) and of chunk 1 (coming back up)."""
    tl = hops.simulate(zbv(p, m, b=1.3, w=0.7)).timeline
    comp = tl.kind == "compute"
    for s in range(p):
        for phase in ("F", "B", "W"):
            sel = comp & (tl.stage == s) & (tl.phase == phase)
            assert sorted(tl.chunk[sel].tolist()) == [0] * m + [1] * m
    for j in range(m):
        assert forward_path(tl, j) == [(d, 0) for d in range(p)] + [(d, 1) for d in reversed(range(p))]
    assert tl.n_chunks == 2


def test_interleaved_timeline_loops_each_microbatch_over_the_devices_chunk_by_chunk():
    p, m, v = 4, 8, 2
    tl = hops.simulate(interleaved(p, m, v)).timeline
    for j in range(m):
        assert forward_path(tl, j) == [(d, c) for c in range(v) for d in range(p)]
    xfer = tl.kind == "transfer"  # a transfer carries the chunk of the stage that sent it
    assert set(tl.chunk[xfer].tolist()) == {0, 1} and tl.n_chunks == v


def test_one_chunk_timeline_is_chunk_0_and_rows_of_no_chunk_are_minus_1():
    sc = pipeline(3, 6, schedule="1f1b")
    sc["optimizer"] = {"enabled": True, "step_ms": [1.0, 1.0, 1.0]}
    tl = hops.simulate(sc).timeline
    task = (tl.kind == "compute") | (tl.kind == "transfer")
    assert (tl.chunk[task] == 0).all() and (tl.chunk[~task] == -1).all() and (~task).any()
    assert tl.n_chunks == 1


# ----------------------------------------------------------------------------- LM head weights under ZB-V
def weights_only(schedule, *, tied=None, p=3, hidden_dim=2048):
    """Peak memory per device with no activations held: weights + optimizer state only."""
    doc = analytical_doc(schedule, p=p, hidden_dim=hidden_dim, tied=tied, activation_memory_mb=0)
    return hops.simulate(doc).summary["peak_memory_mb"]


ADAM = 1 + 2 + 6.0  # per bf16 weight byte: the weight, its fp32 main grad (4 B per 2) and Adam's fp32 master, m and v (12 B per 2)
HEAD_MB = 2048 * 50304 * 2 / 1e6  # the h x V matrix in bf16


def test_zb_v_puts_the_lm_head_weights_and_optimizer_state_on_device_0_and_never_lowers_a_stated_figure():
    """ZB-V runs the last chunk on device 0. Tied (the default), the head is the embedding device 0
    already holds: nothing changes. Untied, device 0 gains the h x V matrix and its optimizer
    state. The last device keeps its stated weights_mb, since the scenario may never have counted
    the head there (layer-only figures are the common case); the devices between are unchanged."""
    one = weights_only("zb_h1")
    assert one == pytest.approx({"g0": 1000 * ADAM, "g1": 1000 * ADAM, "g2": 1000 * ADAM})
    assert weights_only("zb_v") == pytest.approx(one)
    untied = weights_only("zb_v", tied=False)
    assert untied == pytest.approx({"g0": (1000 + HEAD_MB) * ADAM, "g1": 1000 * ADAM, "g2": 1000 * ADAM})
    assert weights_only("zb_h1", tied=False) == pytest.approx(one)  # one chunk per stage: nothing moves


def test_a_layer_only_weights_figure_smaller_than_the_head_is_kept_as_stated():
    """A last stage stating fewer MB than the head matrix cannot have counted it: it is not driven down."""
    assert weights_only("zb_v", tied=False, hidden_dim=8192)["g2"] == pytest.approx(1000 * ADAM)


@pytest.mark.parametrize("schedule", ["interleaved_1f1b", "interleaved_zb"])
def test_interleaved_keeps_the_lm_head_on_the_last_device(schedule):
    """The looping placement's last chunk runs on the last device, as with one chunk per stage."""
    assert weights_only(schedule, tied=False) == pytest.approx(weights_only("zb_h1", tied=False))


def test_without_the_model_shape_the_head_cannot_be_sized_and_nothing_moves():
    assert weights_only("zb_v", hidden_dim=None) == pytest.approx(weights_only("zb_h1", hidden_dim=None))


LLAMA3_8B = {"layers": 32, "hidden_dim": 4096, "heads": 32, "kv_heads": 8, "ffn_dim": 14336, "ffn_gated": True,
             "seq_len": 4096, "vocab_size": 128256, "tied_embeddings": False}


def four_h100(schedule, v):
    return {"simulation": {"microbatches": 16, "batches": 1},
            "pipeline": {"schedule": schedule, "virtual_stages": v, "model": dict(LLAMA3_8B),
                         "stages": [{"device": f"g{i}", "layers": 8} for i in range(4)]},
            "hardware": {"host": "dgx_h100", "devices": [{"id": f"g{i}", "gpu": "h100_sxm", "node": "n0"}
                                                         for i in range(4)]}}


@pytest.mark.parametrize("schedule,v,head", [("1f1b", 1, "g3"), ("zb_h1", 1, "g3"), ("zb_v", 2, "g0")])
def test_each_stages_expected_times_are_those_of_the_work_its_device_ran(schedule, v, head):
    """summary.json's per-stage times sum the stage's chunks as the schedule placed them: ZB-V's V
    ends on device 0, so the LM head's time is there, where the timeline runs it."""
    r = hops.simulate(four_h100(schedule, v))
    tl = r.timeline
    for st in r.summary["stages"]:
        ran = (tl.kind == "compute") & (tl.device == st["device"]) & (tl.phase == "F")
        assert st["expected_ms"]["F"] == pytest.approx(float((tl.end_ms - tl.start_ms)[ran].sum()) / 16)
        assert st["backward"] == ("fused" if schedule == "1f1b" else "split")
    heaviest = max(r.summary["stages"], key=lambda st: st["expected_ms"]["F"])
    assert heaviest["device"] == head


def zb_v_capped(model, cap):
    doc = four_h100("zb_v", 2)
    doc["pipeline"]["model"] = dict(model)
    doc["simulation"]["batches"] = 2
    doc["optimizer"] = {"enabled": True}
    if cap is not None:
        doc["pipeline"]["scheduler_options"] = {"max_in_flight": cap}
    return hops.simulate(doc).summary


LLAMA2_7B = {"layers": 32, "hidden_dim": 4096, "heads": 32, "ffn_dim": 11008, "ffn_gated": True, "seq_len": 4096,
             "vocab_size": 32000, "tied_embeddings": False}


@pytest.mark.parametrize("cap", [11, 24, 1000])
def test_a_raised_zb_v_cap_that_buys_no_time_holds_1f1bs_activations(cap):
    default = zb_v_capped(LLAMA3_8B, None)
    raised = zb_v_capped(LLAMA3_8B, cap)
    assert raised["makespan_ms"] == default["makespan_ms"]
    assert raised["peak_in_flight"] == default["peak_in_flight"] == [8, 8, 8, 8]  # 2p chunk activations


def test_a_raised_zb_v_cap_holds_only_what_the_time_it_buys_needs():
    """On Llama-2-7B a cap of 11 shortens the run; a cap of 1000 buys no more, and holds what the
    winning order needs at the least cap that keeps its time, not the whole cap."""
    default, eleven, huge = (zb_v_capped(LLAMA2_7B, cap) for cap in (None, 11, 1000))
    assert eleven["makespan_ms"] < default["makespan_ms"] * 0.99
    assert huge["makespan_ms"] <= eleven["makespan_ms"] * 1.001
    assert max(huge["peak_in_flight"]) < 2 * 16  # below the 2m chunk activations an uncapped order would hold
