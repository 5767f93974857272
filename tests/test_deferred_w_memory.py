"""Under full recomputation a microbatch waiting for its W holds its GEMMs' inputs and output gradients.

Full recomputation stashes only each layer's input (2 s h bytes in bf16) until the backward.
A split backward (the zero-bubble schedules) reruns the forward in B, and its deferred W then
needs, for every weight GEMM, the input X and output gradient dY of dW = X^T dY (Qi et al.,
ICLR 2024, sec. 2-3). Peak memory is the peak over time of, per stage, the microbatches before
their B times the stash plus those between B and W times that W-set. The LM head is one more
weight GEMM: the chunk that runs it also keeps its input and the s x V logits gradient.
"""
import copy

import numpy as np
import pytest

import hops
from hops.errors import ScenarioError
from hops.model.architecture import Architecture
from hops.model.hardware import Catalog
from tests.test_tensor_data_parallel import groups_doc

H, S, FFN, LAYERS = 2048, 2048, 8192, 2  # GPT-shaped: heads = kv heads, an ungated FFN of 4h
V = 32000  # groups_doc's vocabulary


def doc(schedule, tp, recompute="full", sequence_parallel=False, virtual_stages=1):
    d = groups_doc(tp, hidden=H, heads=16, seq=S, layers_per_stage=LAYERS, microbatches=8)
    d["pipeline"].update(schedule=schedule, virtual_stages=virtual_stages,
                         stack_options={"recompute": recompute, "sequence_parallel": sequence_parallel})
    return d


def gemm_operands_per_token(tp, sp):
    """Each weight GEMM's X and dY on one GPU of the group: column-parallel layers split dY t ways,
    row-parallel ones X; the other operand is whole on every GPU unless sequence-parallel."""
    whole = 1 / tp if sp else 1
    qkv = H * whole + 3 * H / tp
    projection = H / tp + H * whole
    mlp_up = H * whole + FFN / tp
    mlp_down = FFN / tp + H * whole
    return qkv + projection + mlp_up + mlp_down


def head_operands_per_token(tp, sp):
    """The LM head's W: its input (whole unless sequence-parallel) and the logits' gradient (V / t)."""
    return H / (tp if sp else 1) + V / tp


def peak_activation_mb(tl, stage, stash_mb, w_set_mb, v, head_chunk=None, head_mb=0.0):
    """Walk stage's timeline: F start takes the stash, B end trades it for the W-set, W (or BW) end
    frees it. On the chunk that runs the LM head the W-set also holds the head's head_mb (a
    chunk-microbatch is 1/v of the stage's stash and layers' W-set, but the whole head)."""
    rows = (tl.kind == "compute") & (tl.stage == stage)
    chunks = tl.chunk[rows] if tl.chunk is not None else np.zeros(rows.sum(), dtype=int)
    steps = []
    for phase, chunk, start, end in zip(tl.phase[rows], chunks, tl.start_ms[rows], tl.end_ms[rows]):
        w_set = w_set_mb + (head_mb * v if chunk == head_chunk else 0.0)
        if phase == "F":
            steps.append((start, 1, stash_mb))
        elif phase == "B":
            steps.append((end, 0, w_set - stash_mb))
        elif phase == "W":
            steps.append((end, 0, -w_set))
        elif phase == "BW":
            steps.append((end, 0, -stash_mb))
    held = peak = 0.0
    for _, _, mb in sorted(steps, key=lambda x: x[:2]):  # a task ends before the next one starts
        held += mb
        peak = max(peak, held)
    return peak / v


def without_activations(d, catalog=None):
    d = copy.deepcopy(d)
    for st in d["pipeline"]["stages"]:
        st["activation_memory_mb"] = 0
    return hops.simulate(d, catalog=catalog).summary["peak_memory_mb"]


@pytest.mark.parametrize("schedule,v", [("zb_h1", 1), ("zb_h2", 1), ("zb_v", 2), ("1f1b", 1)])
@pytest.mark.parametrize("tp,sp", [(1, False), (4, False), (4, True)])
def test_under_full_recomputation_a_microbatch_waiting_for_its_w_holds_its_gemms_inputs_and_output_gradients(
        schedule, v, tp, sp):
    d = doc(schedule, tp, sequence_parallel=sp, virtual_stages=v)
    res = hops.simulate(d)
    stash_mb = LAYERS * 2 * S * H / (tp if sp else 1) / 1e6  # the layers' inputs, bf16
    w_set_mb = LAYERS * 2 * S * gemm_operands_per_token(tp, sp) / 1e6
    head_mb = 2 * S * head_operands_per_token(tp, sp) / 1e6
    head_stage, head_chunk = (0, 1) if schedule == "zb_v" else (2, 0)  # the V runs the last chunk on stage 0
    base = without_activations(d)
    for stage in range(3):
        gpu = f"n{stage}g0"
        want = base[gpu] + peak_activation_mb(res.timeline, stage, stash_mb, w_set_mb, v,
                                              head_chunk if stage == head_stage else None, head_mb)
        assert res.summary["peak_memory_mb"][gpu] == pytest.approx(want, rel=1e-12), stage
    if schedule != "1f1b":  # the last stage holds several B-done microbatches at its peak
        assert res.summary["peak_memory_mb"]["n2g0"] > base["n2g0"] + 2 * w_set_mb / v


def test_fused_backward_schedules_charge_the_stash_alone_as_before():
    """1F1B never defers a W: its peak is the in-flight count times the layers' inputs."""
    d = doc("1f1b", 1)
    res = hops.simulate(d)
    base = without_activations(d)
    stash_mb = LAYERS * 2 * S * H / 1e6
    got = [res.summary["peak_memory_mb"][f"n{i}g0"] - base[f"n{i}g0"] for i in range(3)]
    assert got == pytest.approx([n * stash_mb for n in res.summary["peak_in_flight"]], rel=1e-12)


@pytest.mark.parametrize("recompute", ["none", "selective"])
def test_without_full_recomputation_a_waiting_microbatch_keeps_its_stash(recompute):
    """The stash already holds the GEMMs' inputs: the peak stays the in-flight count times it."""
    d = doc("zb_h1", 4, recompute=recompute)
    res = hops.simulate(d)
    base = without_activations(d)
    one = hops.simulate(doc("1f1b", 4, recompute=recompute)).summary
    per_mb = (one["peak_memory_mb"]["n2g0"] - base["n2g0"]) / one["peak_in_flight"][2]
    got = np.array([res.summary["peak_memory_mb"][f"n{i}g0"] - base[f"n{i}g0"] for i in range(3)])
    assert got == pytest.approx(np.array(res.summary["peak_in_flight"]) * per_mb, rel=1e-12)


# ----------------------------------------------------------------------------- the formula
GPT = dict(layers=None, hidden=1024, heads=16, kv_heads=16, ffn_dim=4096, ffn_gated=False, seq_len=2048,
           vocab=50304, tied=True)


@pytest.mark.parametrize("t", [1, 2, 8])
def test_a_gpt_layer_keeps_16_h_per_token_for_its_w_4_of_them_whole_on_every_tensor_parallel_rank(t):
    a = Architecture(**GPT)
    s, h = a.seq_len, a.hidden
    assert a.weight_gradient_operands(t) == pytest.approx(s * (4 * h + 12 * h / t))
    assert a.weight_gradient_operands(t, sequence_parallel=True) == pytest.approx(16 * s * h / t)


def test_grouped_kv_heads_and_a_gated_ffn_narrow_the_qkv_gradient_and_widen_the_mlp_ones():
    a = Architecture(**{**GPT, "kv_heads": 4, "ffn_dim": 2816, "ffn_gated": True})
    s, h, f = a.seq_len, a.hidden, a.ffn_dim
    qkv, projection = h + h * (1 + 2 * 4 / 16), 2 * h
    gate_up, down = h + 2 * f, f + h
    assert a.weight_gradient_operands() == pytest.approx(s * (qkv + projection + gate_up + down))


def test_each_routed_copy_of_a_token_keeps_its_experts_operands():
    """MoE: top_k expert rows per token, each with its input, inner tensors and output gradient;
    the shared experts as one FFN of their summed width."""
    a = Architecture(**{**GPT, "experts": 8, "top_k": 2, "expert_ffn": 1024, "shared_experts": 1})
    s, h, ef = a.seq_len, a.hidden, a.expert_ffn
    attention = 2 * h + h * 3 + h
    routed = 2 * (h + ef + ef + h)
    shared = h + ef + ef + h
    assert a.weight_gradient_operands() == pytest.approx(s * (attention + routed + shared))


# ----------------------------------------------------------------------------- the LM head
@pytest.mark.parametrize("tp,sp", [(1, False), (4, False), (4, True)])
def test_the_stage_running_the_lm_head_also_keeps_its_input_and_the_logits_gradient_for_its_w(tp, sp):
    """One microbatch: each stage's peak is its W-set, held from B's end to W's. The head's W
    needs X (s x h, split only under sequence parallelism) and dY (s x V, vocabulary-parallel),
    2 bytes each in bf16, on the last stage alone."""
    d = doc("zb_h1", tp, sequence_parallel=sp)
    d["simulation"]["microbatches"] = 1
    res = hops.simulate(d)
    base = without_activations(d)
    layers_mb = LAYERS * 2 * S * gemm_operands_per_token(tp, sp) / 1e6
    head_mb = 2 * S * head_operands_per_token(tp, sp) / 1e6
    got = [res.summary["peak_memory_mb"][f"n{i}g0"] - base[f"n{i}g0"] for i in range(3)]
    assert got == pytest.approx([layers_mb, layers_mb, layers_mb + head_mb], rel=1e-12)


def test_a_model_without_an_lm_head_keeps_no_logits_gradient():
    d = doc("zb_h1", 1)
    d["simulation"]["microbatches"] = 1
    cat = Catalog.load({"model.lm_head": False})
    res = hops.simulate(d, catalog=cat)
    base = without_activations(d, cat)
    got = res.summary["peak_memory_mb"]["n2g0"] - base["n2g0"]
    assert got == pytest.approx(LAYERS * 2 * S * gemm_operands_per_token(1, False) / 1e6, rel=1e-12)


# ----------------------------------------------------------------------------- ZB-1p's memory limit
def activation_levels(d):
    """Per GPU, the activation memory at the peak in units of one microbatch's stash."""
    res = hops.simulate(d)
    base = without_activations(d)
    stash_mb = LAYERS * 2 * S * H / 1e6  # without sequence parallelism every GPU of a group holds it whole
    return {g: (res.summary["peak_memory_mb"][g] - base[g]) / stash_mb for g in base}


def test_zb_1p_under_full_recomputation_stays_within_1f1b_s_activation_memory():
    """At TP 8 a waiting W weighs 5.5 stashes (7 with the LM head): ZB-1p fits under 1F1B's p = 8
    only by running few microbatches past their B at a time, which its limit now makes it do."""
    d = groups_doc(8, stages=8, hidden=H, heads=16, seq=S, layers_per_stage=LAYERS, microbatches=16)
    d["pipeline"]["stack_options"] = {"recompute": "full"}
    one = activation_levels({**d, "pipeline": {**d["pipeline"], "schedule": "1f1b"}})
    assert max(one.values()) == pytest.approx(8)
    zb = activation_levels({**d, "pipeline": {**d["pipeline"], "schedule": "zb_1p"}})
    assert max(zb.values()) <= max(one.values()) + 1e-9


def test_zb_auto_keeps_its_stated_limit_counting_a_waiting_w_by_what_it_holds():
    d = doc("zb_auto", 1)
    d["pipeline"]["scheduler_options"] = {"memory_limit": 30}
    assert max(activation_levels(d).values()) <= 30 + 1e-9


def test_zb_1p_refuses_a_pipeline_where_one_waiting_w_outweighs_1f1b_s_memory():
    """At TP 1 one microbatch between its B and its W holds 16 stashes, more than p = 3."""
    with pytest.raises(ScenarioError, match="pipeline.schedule: zb_1p keeps at most 3"):
        hops.simulate(doc("zb_1p", 1))
