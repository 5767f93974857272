"""A mixture-of-experts model: FLOPs follow the experts a token runs, weights the experts a
rank holds, and expert parallelism costs two all-to-alls per pass and layer."""
import copy

import pytest

import hops
from hops.errors import HopsError
from hops.model.architecture import Architecture
from hops.model.collectives import data_parallel_ms, ring_allreduce_ms
from hops.model.hardware import Catalog, Topology
from hops.scenario import load_scenario

H, S, F, E = 1024, 2048, 3584, 8


def arch(**moe) -> Architecture:
    return Architecture(layers=8, hidden=H, heads=16, kv_heads=4, ffn_dim=F, ffn_gated=True, seq_len=S, vocab=32000,
                        tied=False, **moe)


def doc(*, experts=E, top_k=2, ep=1, dp=1, shared=0, p=2, schedule="1f1b") -> dict:
    model = {"layers": 4 * p, "hidden_dim": H, "heads": 16, "kv_heads": 4, "ffn_dim": F, "ffn_gated": True,
             "seq_len": S, "vocab_size": 32000, "tied_embeddings": False,
             "moe": {"experts": experts, "top_k": top_k, "expert_parallel": ep, "shared_experts": shared}}
    return {"simulation": {"microbatches": 4, "batches": 1},
            "pipeline": {"schedule": schedule, "model": model,
                         "stages": [{"device": f"g{i}", "layers": 4} for i in range(p)]},
            "hardware": {"devices": [{"id": f"g{i}", "gpu": "h100_sxm", "node": "n"} for i in range(p)],
                         "interconnect": {"same_node": "nvlink"}},
            "optimizer": {"enabled": True, "data_parallel": {"degree": dp, "interconnect": "infiniband"}}}


def stage_times(d: dict) -> dict:
    return hops.simulate(d).summary["stages"][1]["expected_ms"]


def test_a_token_multiplies_by_its_top_k_experts_and_the_shared_ones_only():
    """A layer of 8 experts, top-2, one shared, costs what a dense layer with an FFN three experts
    wide costs, plus the router's h x E."""
    moe = arch(experts=E, top_k=2, expert_ffn=F, shared_experts=1)
    dense_as_wide = arch()
    dense_as_wide = Architecture(**{**dense_as_wide.__dict__, "ffn_dim": 3 * F})
    assert moe.dense_flops() == pytest.approx(dense_as_wide.dense_flops() + 2 * S * H * E, rel=1e-12)


@pytest.mark.parametrize("ep", [1, 2, 8])
def test_a_rank_holds_the_attention_the_router_the_shared_experts_and_its_share_of_the_routed(ep):
    a = arch(experts=E, top_k=2, expert_ffn=F, shared_experts=1, expert_parallel=ep)
    attention = H * H * (2 + 2 * 4 / 16)
    assert a.layer_params() == pytest.approx(attention + H * E + (1 + E / ep) * 3 * H * F, rel=1e-12)


@pytest.mark.parametrize("ep", [2, 4])
def test_expert_parallelism_adds_two_all_to_alls_to_each_pass_of_each_layer(ep):
    """Forward and backward each wait for 2 per layer: (e - 1) latencies plus the (e - 1)/e of
    the s x top_k x h bf16 values that leave the rank, over the data-parallel link."""
    ib = Catalog.load().interconnects["infiniband"]
    one = (ep - 1) * ib["latency_ms"] + S * 2 * H * 2 / 1e6 * (ep - 1) / ep / ib["bandwidth_gbps"]
    local, spread = stage_times(doc(ep=1, dp=ep)), stage_times(doc(ep=ep, dp=ep))
    assert spread["F"] - local["F"] == pytest.approx(2 * 4 * one, rel=1e-9)
    assert spread["B"] - local["B"] == pytest.approx(2 * 4 * one, rel=1e-9)
    assert spread["W"] == local["W"]


def test_routed_expert_gradients_reduce_only_over_the_replicas_that_hold_them():
    """With e = d every rank holds its own experts: only the rest of the stage's gradients
    (fp32, 4 B per parameter) are all-reduced at the iteration's end."""
    d = 4
    s = load_scenario(doc(ep=d, dp=d))
    catalog = Catalog.load()
    a, ib = s.architecture, catalog.interconnects["infiniband"]
    got = data_parallel_ms(s, catalog, Topology(s, catalog))
    for st, ms in zip(s.stages, got):
        rest_params = st.weights_mb / 2 * 1e6 - st.layers * a.routed_expert_params()
        assert ms == pytest.approx(ring_allreduce_ms(rest_params * 4 / 1e6, d, ib["bandwidth_gbps"], ib["latency_ms"]),
                                   rel=1e-9)


def test_a_zero_bubble_schedule_runs_an_moe_pipeline():
    summary = hops.simulate(doc(ep=2, dp=2, schedule="zb_h1")).summary
    assert summary["throughput"]["samples_per_s"] > 0


@pytest.mark.parametrize("change,message", [
    (lambda d: d["pipeline"]["model"]["moe"].update(top_k=9), "pipeline.model.moe.top_k: got 9; expected at most "
                                                              "experts (8)"),
    (lambda d: d["pipeline"]["model"]["moe"].update(expert_parallel=3), "pipeline.model.moe.expert_parallel: got 3; "
                                                                        "expected a divisor of experts (8)"),
    (lambda d: d["pipeline"]["model"]["moe"].update(expert_parallel=4), "pipeline.model.moe.expert_parallel: got 4; "
                                                                        "expected a divisor of "
                                                                        "optimizer.data_parallel.degree (2)"),
    (lambda d: [d["pipeline"]["model"].pop(k) for k in ("heads", "kv_heads")],
     "pipeline.model.heads: missing; moe describes the architecture"),
])
def test_an_moe_that_cannot_be_placed_is_a_one_line_error_naming_the_field(change, message):
    d = doc(dp=2)
    if "heads" in message:
        for st in d["pipeline"]["stages"]:
            st["compute"] = {"tflop": 1.0}
            del st["layers"]
    change(d)
    with pytest.raises(HopsError) as exc:
        load_scenario(copy.deepcopy(d))
    assert str(exc.value).startswith(message) and "\n" not in str(exc.value)


def test_a_distributed_optimizer_shards_a_ranks_experts_only_over_the_replicas_that_hold_them():
    """ZeRO-1 over d = 4 replicas with e = 4: the non-expert state shards 4 ways, the routed
    experts' state (held by one replica each) not at all. Adam mixed precision: 6 B of state per
    weight byte."""
    plain, sharded = doc(ep=4, dp=4), doc(ep=4, dp=4)
    sharded["optimizer"]["data_parallel"]["sharding"] = "zero1"
    s = load_scenario(plain)
    peak = [hops.simulate(d).summary["peak_memory_mb"]["g1"] for d in (plain, sharded)]
    saved = peak[0] - peak[1]
    st = s.stages[1]
    experts_mb = st.layers * s.architecture.routed_expert_params() * 2 / 1e6
    assert saved == pytest.approx((st.weights_mb - experts_mb) * 6 * (1 - 1 / 4), rel=1e-9)
