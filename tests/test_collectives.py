"""Iteration-end collectives: the tied-embedding gradient all-reduce between first and last stage."""
import pytest

import hops
from builders import pipeline


def gpt_pipeline(tied=None, p=3):
    sc = pipeline(p, 4, batches=2)
    sc["pipeline"]["model"] = {"hidden_dim": 1024, "seq_len": 1024}
    if tied is not None:
        sc["pipeline"]["model"]["tied_embeddings"] = tied
    sc["overrides"]["links"].append({"src": "g0", "dst": f"g{p - 1}", "latency_ms": 0.5, "bandwidth_gbps": 2.0})
    return sc


def test_first_and_last_stage_all_reduce_the_embedding_grads_every_iteration():
    r = hops.simulate(gpt_pipeline())
    tl = r.timeline
    sync = tl.select(tl.kind == "allreduce")
    assert sorted(set(sync.stage.tolist())) == [0, 2]
    assert len(sync) == 2 * 2  # two stages x two iterations
    size_mb = 50304 * 1024 * 4 / 1e6  # vocab x hidden x fp32 grads
    expected = size_mb / 2.0 + 2 * 0.5  # two-rank ring: size / bandwidth + 2 latencies
    assert (sync.end_ms - sync.start_ms) == pytest.approx([expected] * 4)


def test_the_optimizer_waits_for_the_embedding_sync():
    sc = gpt_pipeline()
    sc["optimizer"] = {"enabled": True, "step_ms": 1.0}
    tl = hops.simulate(sc).timeline
    for it in (0, 1):
        sync_end = tl.end_ms[(tl.kind == "allreduce") & (tl.iteration == it)].max()
        assert tl.start_ms[(tl.kind == "optimizer") & (tl.iteration == it)].min() >= sync_end


def test_untied_embeddings_or_unknown_model_shape_pay_nothing():
    untied = hops.simulate(gpt_pipeline(tied=False))
    assert not (untied.timeline.kind == "allreduce").any()
    tied = hops.simulate(gpt_pipeline())
    assert tied.summary["makespan_ms"] > untied.summary["makespan_ms"]
    no_shape = hops.simulate(pipeline(3, 4, batches=2))
    assert not (no_shape.timeline.kind == "allreduce").any()
