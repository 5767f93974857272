"""A model described by its architecture: stages derive FLOPs, weights and activations from it.

Formulas: Megatron's per-layer forward FLOPs 24 s h^2 + 4 s^2 h (Narayanan et al. 2021) for a
GPT layer with FFN 4h, generalised to grouped-query K/V and any (gated) FFN; the LM head's
2 s h V; Korthikanti et al.'s 34 s b h bytes of stashed activations (+ 5 a s^2 b of scores).
"""
import itertools

import pytest

import hops
from hops.model.architecture import Architecture
from hops.errors import HopsError
from hops.model.hardware import Catalog
from hops.scenario import load_scenario

GPT = dict(layers=None, hidden=1024, heads=16, kv_heads=16, ffn_dim=4096, ffn_gated=False, seq_len=2048,
           vocab=50304, tied=True)


def test_a_gpt_layer_forward_is_24_s_h2_plus_4_s2_h():
    a = Architecture(**GPT)
    s, h = a.seq_len, a.hidden
    assert a.dense_flops() + a.attention_flops() == pytest.approx(24 * s * h * h + 4 * s * s * h)
    assert a.layer_params() == pytest.approx(12 * h * h)


@pytest.mark.parametrize("kv,ffn,gated", [(4, 3000, False), (2, 11008, True), (16, 4096, True)])
def test_grouped_kv_heads_and_the_ffn_size_enter_the_weights_and_flops(kv, ffn, gated):
    a = Architecture(**{**GPT, "kv_heads": kv, "ffn_dim": ffn, "ffn_gated": gated})
    h, s = a.hidden, a.seq_len
    # Q and the output projection are h x h; K and V are h x (h kv / heads); the FFN has 2 or 3 h x ffn matrices
    params = 2 * h * h + 2 * h * h * kv / 16 + (3 if gated else 2) * h * ffn
    assert a.layer_params() == pytest.approx(params)
    assert a.dense_flops() == pytest.approx(2 * s * params)
    assert a.attention_flops() == pytest.approx(4 * s * s * h)  # the core does not depend on kv heads


def test_a_gpt_layer_stashes_34_s_h_bytes_plus_5_bytes_per_unfused_score():
    a = Architecture(**GPT)
    assert a.activation_bytes() == pytest.approx(34 * a.seq_len * a.hidden)
    assert a.scores() == pytest.approx(16 * a.seq_len ** 2)


def doc(stages, *, model=None, stack=None, schedule="1f1b", microbatches=4, mbs=1, gpu="h100_sxm"):
    model = model or {"layers": 8, "hidden_dim": 1024, "heads": 16, "seq_len": 2048}
    d = {"simulation": {"microbatches": microbatches, "micro_batch_size": mbs, "batches": 1},
         "pipeline": {"schedule": schedule, "model": model, "stages": stages,
                      "virtual_stages": 2 if schedule in ("zb_v", "interleaved_1f1b") else 1},
         "hardware": {"devices": [{"id": f"g{i}", "gpu": gpu, "node": "n0"} for i in range(len(stages))],
                      "interconnect": {"same_node": "nvlink"}},
         "optimizer": {"enabled": False}}
    if stack:
        d["pipeline"]["stack"] = stack
    return d


def test_a_stage_with_only_device_and_layers_derives_its_work_and_weights():
    sc = load_scenario(doc([{"device": "g0", "layers": 3}, {"device": "g1", "layers": 3},
                            {"device": "g2", "layers": 2}], mbs=2))
    a = sc.architecture
    for st in sc.stages:
        assert st.compute.tflop == pytest.approx(st.layers * 2 * a.dense_flops() / 1e12)
        assert st.compute.attention_tflop == pytest.approx(st.layers * 2 * 4 * 2048 ** 2 * 1024 / 1e12)
    vh = 50304 * 1024 * 2 / 1e6  # the embedding on the first stage, the LM head (a copy when tied) on the last
    assert [st.weights_mb for st in sc.stages] == pytest.approx(
        [3 * 12 * 1024 ** 2 * 2 / 1e6 + vh, 3 * 12 * 1024 ** 2 * 2 / 1e6, 2 * 12 * 1024 ** 2 * 2 / 1e6 + vh])


def test_the_last_stage_pays_the_lm_head_2_s_h_v_and_its_logits():
    """Same layers on every stage, an async stack and big GPU work: the last stage's forward
    exceeds a middle one's by exactly the head's GEMM, its weights and the loss's logits traffic."""
    cat = Catalog.load()
    sc = doc([{"device": f"g{i}", "layers": 2} for i in range(3)], model={
        "layers": 6, "hidden_dim": 4096, "heads": 32, "seq_len": 4096, "vocab_size": 32000})
    s = hops.simulate(sc).summary["stages"]
    m, dev = cat.constants("megatron_core"), cat.devices["h100_sxm"]
    s_, h, v = 4096, 4096, 32000
    bw = dev["memory_bandwidth_gbps"]
    head = 2 * s_ * h * v / (dev["peak_tflops"] * 1e12) * 1000 * m["compute_time_coefficient"] \
        + h * v * 2 / 1e6 / bw + s_ * v * m["logits_bytes_forward"] / 1e6 / bw
    assert s[2]["expected_ms"]["F"] - s[1]["expected_ms"]["F"] == pytest.approx(head, rel=1e-9)


def peak_activation_mb(stack, layers=4):
    d = doc([{"device": "g0", "layers": layers}], model={"layers": layers, "hidden_dim": 1024, "heads": 16,
                                                         "seq_len": 2048}, stack=stack, microbatches=1)
    d["pipeline"]["stages"][0]["weights_mb"] = 0.0
    return hops.simulate(d).summary["peak_memory_mb"]["g0"]


def test_activation_memory_follows_the_attention_kernel():
    s, h, heads = 2048, 1024, 16
    assert peak_activation_mb("megatron_core") == pytest.approx(4 * 34 * s * h / 1e6)  # flash: no scores stashed
    assert peak_activation_mb("fixture_megatron") == pytest.approx(4 * (34 * s * h + 5 * heads * s * s) / 1e6)


def test_full_recomputation_stashes_only_each_layers_input():
    cat = Catalog.load(["stacks.megatron_core.recompute=full"])
    d = doc([{"device": "g0", "layers": 4, "weights_mb": 0.0}], microbatches=1,
            model={"layers": 4, "hidden_dim": 1024, "heads": 16, "seq_len": 2048})
    assert hops.simulate(d, catalog=cat).summary["peak_memory_mb"]["g0"] == pytest.approx(4 * 2 * 2048 * 1024 / 1e6)


def test_layers_auto_is_the_best_contiguous_split_by_brute_force():
    """Three identical GPUs, 10 layers, the LM head and embedding at the ends: `auto` reaches
    the smallest slowest-stage F + BW of all 36 splits."""
    model = {"layers": 10, "hidden_dim": 2048, "heads": 16, "seq_len": 2048, "vocab_size": 128000}

    def slowest(split):
        sc = doc([{"device": f"g{i}", "layers": n} for i, n in enumerate(split)], model=model)
        return max(st["expected_ms"]["F"] + st["expected_ms"]["BW"] for st in hops.simulate(sc).summary["stages"])

    auto = load_scenario(doc([{"device": f"g{i}", "layers": "auto"} for i in range(3)], model=model))
    split = [int(st.layers) for st in auto.stages]
    assert sum(split) == 10
    best = min(slowest(c) for c in ([a, b, 10 - a - b] for a, b in itertools.product(range(1, 9), repeat=2))
               if c[2] >= 1)
    assert slowest(split) == pytest.approx(best)
    assert split[0] >= split[-1]  # the LM head is heavier than the embedding


LLAMA3_8B = {"layers": 32, "hidden_dim": 4096, "heads": 32, "kv_heads": 8, "ffn_dim": 14336, "ffn_gated": True,
             "vocab_size": 128256, "tied_embeddings": False, "seq_len": 4096}


def two_h100_two_a100(schedule: str, split) -> dict:
    """Llama-3-8B on 2 H100 then 2 A100 (80 GB each), 8 microbatches: the fastest split loads
    the H100s past their memory."""
    gpus = ["h100_sxm", "h100_sxm", "a100", "a100"]
    return {"simulation": {"batches": 1, "microbatches": 8, "micro_batch_size": 1, "seed": 0},
            "pipeline": {"schedule": schedule, "model": LLAMA3_8B,
                         "stages": [{"device": f"g{i}", "layers": n} for i, n in enumerate(split)]},
            "hardware": {"devices": [{"id": f"g{i}", "gpu": g, "node": f"n{i}",
                                      "host": "dgx_h100" if g == "h100_sxm" else "dgx_a100"}
                                     for i, g in enumerate(gpus)],
                         "interconnect": {"cross_node": "infiniband"}},
            "optimizer": {"enabled": True}}


def slowest_stage_ms(summary: dict) -> float:
    return max(st["expected_ms"]["F"] + st["expected_ms"]["BW"] for st in summary["stages"])


@pytest.mark.parametrize("schedule", ["1f1b", "zb_h1", "gpipe"])
def test_layers_auto_keeps_every_stage_within_its_gpus_memory_where_a_split_can(schedule):
    """The split that minimises the slowest stage alone (13 / 13 / 4 / 2 under 1F1B) overfills
    the H100s; `auto` weighs each stage's peak at the schedule's own level (GPipe holds all 8
    microbatches, ZB-H1 p on every stage) and finds a split that fits. No split one layer away
    that also fits has a faster slowest stage."""
    assert hops.simulate(two_h100_two_a100(schedule, [13, 13, 4, 2])).summary["memory_over_capacity"]
    run = hops.simulate(two_h100_two_a100(schedule, ["auto"] * 4)).summary
    assert run["memory_over_capacity"] == []
    split = [int(st["layers"]) for st in run["stages"]]
    for a, b in itertools.permutations(range(4), 2):
        if split[a] > 1:
            moved = list(split)
            moved[a], moved[b] = moved[a] - 1, moved[b] + 1
            other = hops.simulate(two_h100_two_a100(schedule, moved)).summary
            assert other["memory_over_capacity"] or slowest_stage_ms(other) >= slowest_stage_ms(run) - 1e-9, moved


def test_where_no_split_fits_layers_auto_keeps_the_fastest_and_the_run_flags_it():
    d = two_h100_two_a100("1f1b", ["auto"] * 4)
    d["hardware"]["devices"] = [{"id": f"g{i}", "gpu": "l4", "node": f"n{i}"} for i in range(4)]
    assert hops.simulate(d).summary["memory_over_capacity"]
    roomy = Catalog.load({"devices.l4.memory_gb": 1e6})  # where every split fits, auto is the fastest
    assert [st.layers for st in load_scenario(d).stages] == [st.layers for st in load_scenario(d, roomy).stages]


@pytest.mark.parametrize("change,needle", [
    (lambda d: d["pipeline"]["model"].update(heads=12), "pipeline.model.heads: got 12; expected a divisor of "
                                                        "hidden_dim (1024)"),
    (lambda d: d["pipeline"]["model"].update(kv_heads=5), "pipeline.model.kv_heads: got 5; expected a divisor of "
                                                          "heads (16)"),
    (lambda d: d["pipeline"]["stages"][1].update(layers=5), "pipeline.stages: layers add up to 9; expected "
                                                            "pipeline.model.layers = 8"),
    (lambda d: d["pipeline"]["stages"][1].pop("layers"), "pipeline.stages[1]: expected compute, or layers"),
    (lambda d: d["pipeline"]["stages"][0].update(layers=3.5) or d["pipeline"]["stages"][1].update(layers=4.5),
     "pipeline.stages[0].layers: got 3.5; expected a whole number"),
    (lambda d: d["pipeline"]["model"].pop("heads"), "pipeline.model.heads: missing; pipeline.stages[0] gives "
                                                    "layers without compute"),
    (lambda d: d["pipeline"]["model"].pop("seq_len"), "pipeline.model.seq_len: missing"),
    (lambda d: d["pipeline"]["stages"][0].update(layers="auto"), "pipeline.stages[1].layers: expected auto"),
    (lambda d: d["pipeline"].update(stack="deepspeed"), "pipeline.stack: got 'deepspeed'; expected one of "),
    (lambda d: d["hardware"].update(host="aws_p4"), "hardware.host: got 'aws_p4'; expected one of "),
    (lambda d: d["hardware"]["devices"][1].update(host="dgx"), "hardware.devices[1].host: got 'dgx'"),
    (lambda d: [x.update(host="dgx_h100") for x in d["hardware"]["devices"]] and d["hardware"].update(host="dgx_h200"),
     "hardware.host: got 'dgx_h200'; expected one of "),
])
def test_bad_architecture_input_is_one_line_naming_the_field(change, needle):
    d = doc([{"device": "g0", "layers": 4}, {"device": "g1", "layers": 4}])
    change(d)
    with pytest.raises(HopsError) as exc:
        load_scenario(d)
    msg = str(exc.value)
    assert needle in msg and "\n" not in msg, msg


def test_auto_needs_the_models_layer_count():
    d = doc([{"device": "g0", "layers": "auto"}, {"device": "g1", "layers": "auto"}],
            model={"hidden_dim": 1024, "heads": 16, "seq_len": 2048})
    with pytest.raises(HopsError, match=r"pipeline.model.layers: missing; layers: auto splits"):
        load_scenario(d)


@pytest.mark.parametrize("schedule,v", [("interleaved_1f1b", 2), ("interleaved_1f1b", 4), ("zb_v", 2)])
def test_a_model_chunk_holds_whole_layers(schedule, v):
    """With v chunks per stage, a stage derived from the architecture holds a multiple of v
    layers, as Megatron-LM requires of its virtual pipeline size: 5 layers in 4 chunks is refused
    on one line naming the stage; `layers: auto` plans in whole chunks."""
    stages = [{"device": "g0", "layers": 2 * v + 1}, {"device": "g1", "layers": 2 * v - 1}]
    d = doc(stages, schedule=schedule, microbatches=4, model={"layers": 4 * v, "hidden_dim": 1024, "heads": 16,
                                                              "seq_len": 2048})
    d["pipeline"]["virtual_stages"] = v
    with pytest.raises(HopsError) as exc:
        load_scenario(d)
    assert str(exc.value).startswith(f"pipeline.stages[0].layers: got {2 * v + 1}; {v} model chunks per stage")
    assert "\n" not in str(exc.value) and f"expected a multiple of {v}" in str(exc.value)
    d["pipeline"]["stages"] = [{"device": f"g{i}", "layers": "auto"} for i in range(2)]
    split = [int(st.layers) for st in load_scenario(d).stages]
    assert sum(split) == 4 * v and all(n % v == 0 and n >= v for n in split)
    d["pipeline"]["model"]["layers"] = 4 * v + 1
    with pytest.raises(HopsError, match=rf"pipeline.model.layers: got {4 * v + 1}; .* a multiple of {v}"):
        load_scenario(d)


def test_the_per_stage_compute_form_still_loads_and_ignores_the_architecture_for_its_flops():
    d = doc([{"device": "g0", "layers": 4, "compute": {"tflop": 1.0, "memory_mb": 10.0}},
             {"device": "g1", "layers": 4}])
    sc = load_scenario(d)
    assert sc.stages[0].compute.tflop == 1.0 and sc.stages[0].compute.attention_tflop == 0.0
    assert sc.stages[1].compute.attention_tflop > 0


@pytest.mark.parametrize("tied,counts", [(False, [2, 0, 0]), (True, [1, 0, 0])])
def test_derived_weights_follow_the_schedules_placement_of_the_vocabulary_matrices(tied, counts):
    """ZB-V runs the first and the last chunk on stage 0: it holds the embedding and the LM head
    (one matrix when tied), and the last stage holds only its layers."""
    from hops.model.memory import placed_weights_mb

    model = {"layers": 6, "hidden_dim": 1024, "heads": 16, "seq_len": 2048, "tied_embeddings": tied}
    sc = load_scenario(doc([{"device": f"g{i}", "layers": 2} for i in range(3)], model=model, schedule="zb_v"))
    layer, matrix = 2 * 12 * 1024 ** 2 * 2 / 1e6, 50304 * 1024 * 2 / 1e6
    assert placed_weights_mb(sc, Catalog.load(), (0, 0)) == pytest.approx([layer + k * matrix for k in counts])
