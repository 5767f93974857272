"""Virtual stages (pipeline.virtual_stages): interleaved 1F1B against Megatron's formulas, and the
chunks through scenario, compute model and memory accounting."""
import pytest

import hops
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


def test_virtual_stages_with_a_one_chunk_schedule_is_an_error_naming_the_field():
    sc = pipeline(4, 8, schedule="1f1b")
    sc["pipeline"]["virtual_stages"] = 2
    with pytest.raises(hops.HopsError, match=r"pipeline.virtual_stages: schedule '1f1b' runs one model chunk"):
        hops.simulate(sc)


def analytical(v):
    sc = {"simulation": {"batches": 1, "microbatches": 4},
          "pipeline": {"schedule": "interleaved_1f1b", "virtual_stages": v,
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
    launch = 1.5  # a100 preset: every chunk is its own invocation
    # compute-bound stages: the chunk's forward is half the stage's, less embedding and launch
    assert chunks[0].f - mid.f == pytest.approx(2.0)  # embedding overhead on virtual stage 0 only
    assert chunks[2].f == pytest.approx(mid.f) and chunks[3].f > mid.f  # LM head: the last chunk of g1
    assert 2 * (mid.f - launch) == pytest.approx(full[0]["expected_ms"]["F"] - launch - 2.0)


def test_activation_memory_counts_chunks_at_1_over_v_of_the_stage():
    one, two = analytical(1), analytical(2)
    layers = one.summary["stages"][0]["layers"]
    act = layers * 2048 * 2048 * 34 / 1e6  # a whole stage's stash per microbatch (model preset: 34 B)
    for i, dev in enumerate(("g0", "g1")):
        fixed = one.summary["peak_memory_mb"][dev] - one.summary["peak_in_flight"][i] * act
        held = two.summary["peak_in_flight"][i] * act / 2  # chunk-microbatches, half a stage each
        assert two.summary["peak_memory_mb"][dev] == pytest.approx(fixed + held)
