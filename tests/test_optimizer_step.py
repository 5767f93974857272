"""The optimizer step: streamed parameters over HBM when the model shape is known."""
import pytest

import hops
from builders import pipeline


def gpt(p=3, step_ms=None, schedule="1f1b", **optimizer):
    sc = pipeline(p, 4, batches=2, schedule=schedule)
    sc["pipeline"]["model"] = {"hidden_dim": 1024, "seq_len": 1024, "tied_embeddings": False}
    for st in sc["pipeline"]["stages"]:
        st["compute"] = {"mode": "analytical", "tflop": 0.06, "memory_mb": 128}
    sc["optimizer"] = {"enabled": True, **optimizer} if step_ms is None else {"enabled": True, "step_ms": step_ms}
    return sc


def step_times(sc):
    tl = hops.simulate(sc).timeline
    opt = tl.select((tl.kind == "optimizer") & (tl.iteration == 0))
    return dict(zip(opt.stage.tolist(), (opt.end_ms - opt.start_ms).tolist()))


def stage_parts():
    """The default stack's step parts on the a100 pipeline above: each stage's work before the
    gradient norm's all-reduce, and its update after it (HBM traffic + its own dispatch)."""
    catalog = hops.Catalog.load()
    m = catalog.constants("megatron_core")
    layers = 0.06e12 / (m["flops_per_layer_token_coeff"] * 1024 * 1024 ** 2)
    middle = layers * 12 * 1024 ** 2
    params = [middle + m["vocab_size"] * 1024, middle, middle + m["vocab_size"] * 1024]  # embedding, -, LM head
    mb_per_byte = [n / 1e6 / catalog.devices["a100"]["memory_bandwidth_gbps"] for n in params]
    norm = m["optimizer_grad_norm_bytes_per_param"]
    pre = [layers * m["optimizer_step_layer_host_ms"] + norm * x for x in mb_per_byte]
    rest = [(m["optimizer_step_bytes_per_param"] - norm) * x + m["optimizer_step_fixed_ms"] for x in mb_per_byte]
    return pre, rest


def test_step_time_follows_parameters_and_hbm_bandwidth():
    steps = step_times(gpt())
    pre, rest = stage_parts()
    assert steps[0] > steps[1] and steps[2] > steps[1]  # embedding and LM-head stages carry V*h more
    assert steps[0] == pytest.approx(max(pre) + rest[0])


def test_every_stage_waits_at_the_norm_all_reduce_for_the_slowest_pre_norm_part():
    steps = step_times(gpt())
    pre, rest = stage_parts()
    assert pre[1] < max(pre)  # the middle stage reaches the all-reduce first ...
    assert steps[1] == pytest.approx(max(pre) + rest[1])  # ... and waits there for the end stages


def test_post_validation_steps_each_stage_on_its_own_norm():
    steps = step_times(gpt(schedule="zb_h1", post_validation=True))
    pre, rest = stage_parts()
    assert steps[1] == pytest.approx(pre[1] + rest[1])


def test_explicit_step_times_win_per_stage():
    assert step_times(gpt(step_ms=[1.0, 2.0, 3.0])) == pytest.approx({0: 1.0, 1: 2.0, 2: 3.0})
    with pytest.raises(hops.ScenarioError, match=r"optimizer.step_ms: got 2 values; expected one per stage \(3\)"):
        hops.load_scenario(gpt(step_ms=[1.0, 2.0]))


@pytest.mark.parametrize("tied,matrices", [(False, 2), (True, 1)])
def test_the_stage_running_both_ends_steps_both_untied_vocabulary_matrices(tied, matrices):
    """ZB-V runs the first and the last model chunk on stage 0: with untied embeddings it holds
    (and steps) the word embedding and the LM head, two V x h matrices; tied, one shared matrix
    (hops.model.architecture.vocab_matrices, the count its weights follow)."""
    sc = gpt(schedule="zb_v")
    sc["pipeline"]["model"]["tied_embeddings"] = tied
    steps = step_times(sc)
    catalog = hops.Catalog.load()
    m = catalog.constants("megatron_core")
    layers = 0.06e12 / (m["flops_per_layer_token_coeff"] * 1024 * 1024 ** 2)
    params = layers * 12 * 1024 ** 2 + matrices * m["vocab_size"] * 1024
    x = params / 1e6 / catalog.devices["a100"]["memory_bandwidth_gbps"]
    norm = m["optimizer_grad_norm_bytes_per_param"]
    pre = layers * m["optimizer_step_layer_host_ms"] + norm * x  # the slowest pre-norm part: the others hold no matrix
    assert steps[0] == pytest.approx(pre + (m["optimizer_step_bytes_per_param"] - norm) * x
                                     + m["optimizer_step_fixed_ms"])
