"""The physical default split of a fused backward into B and W (hops/model/backward_split.py)."""
import pytest

import hops
from builders import pipeline
from hops.model.backward_split import activation_grad_fraction
from hops.scenario import load_scenario


def layer_backward_flops_per_token(h, s):
    """(B, W) of one GPT layer (FFN 4h), counted GEMM by GEMM: every weight GEMM of the forward
    (2 x in x out FLOPs) costs the same again for its input gradient (B) and for its weight
    gradient (W); the attention core's QK^T and attention x V (2 s h each) have two activation
    operands, so both of their gradients are B."""
    weight_gemms = [(h, 3 * h), (h, h), (h, 4 * h), (4 * h, h)]  # QKV, projection, MLP up, MLP down
    gemm = sum(2 * a * b for a, b in weight_gemms)  # 24 h^2
    core = 2 * s * h + 2 * s * h  # QK^T, attention x V
    return gemm + 2 * core, gemm


@pytest.mark.parametrize("h,s", [(1024, 1024), (4096, 2048), (2048, 8192), (12288, 2048), (512, 16384)])
def test_b_share_is_the_activation_gradient_flops(h, s):
    b, w = layer_backward_flops_per_token(h, s)
    assert activation_grad_fraction(h, s) == pytest.approx(b / (b + w))
    assert activation_grad_fraction(h, s) == pytest.approx((3 * h + s) / (6 * h + s))


def test_b_equals_w_when_the_gemms_dominate_and_without_a_shape():
    assert activation_grad_fraction(65536, 1) == pytest.approx(0.5, abs=1e-5)
    assert activation_grad_fraction(None, 2048) == activation_grad_fraction(4096, None) == 0.5
    assert activation_grad_fraction(1024, 1024) == pytest.approx(4 / 7)


def with_model(split=None, **model):
    sc = pipeline(3, 4, schedule="zb_h1", split=None)
    sc["pipeline"]["model"] = model
    if split is not None:
        sc["pipeline"]["backward_split"] = {"activation_grad_fraction": split}
    return sc


def test_a_scenario_gets_the_physical_share_unless_it_states_one():
    assert load_scenario(with_model(hidden_dim=2048, seq_len=4096)).activation_grad_fraction == pytest.approx(
        (3 * 2048 + 4096) / (6 * 2048 + 4096))
    assert load_scenario(with_model()).activation_grad_fraction == 0.5
    assert load_scenario(with_model(split=0.3, hidden_dim=2048, seq_len=4096)).activation_grad_fraction == 0.3


def test_a_model_given_by_its_architecture_gets_its_own_gemm_and_core_flops_share():
    """Grouped-query K and V and a gated FFN change the weight GEMMs' FLOPs D, not the core's
    A = 4 s h per token: B / (B + W) = (D + 2A) / (2D + 2A), counted GEMM by GEMM (Llama-3-8B's
    shape: h 4096, 32 heads, 8 K/V heads, SwiGLU FFN 14336)."""
    h, s, kv, ffn = 4096, 8192, 8, 14336
    weight_gemms = [(h, h), (h, 2 * h * kv // 32), (h, h), (h, ffn), (h, ffn), (ffn, h)]  # Q, KV, proj, gate, up, down
    gemm = sum(2 * a * b for a, b in weight_gemms)
    core = 4 * s * h
    sc = load_scenario(with_model(hidden_dim=h, seq_len=s, heads=32, kv_heads=kv, ffn_dim=ffn, ffn_gated=True))
    assert sc.activation_grad_fraction == pytest.approx((gemm + 2 * core) / (2 * gemm + 2 * core), rel=1e-12)
    assert sc.activation_grad_fraction != pytest.approx(activation_grad_fraction(h, s), rel=1e-3)


def test_a_measured_fused_backward_is_split_by_that_share():
    """A stage given only its fused backward (4 ms) runs B = 4a and W = 4(1 - a) under a split schedule."""
    r = hops.simulate(with_model(hidden_dim=1024, seq_len=1024))
    tl = r.timeline
    comp = tl.kind == "compute"
    dur = tl.end_ms - tl.start_ms
    a = 4 / 7
    assert dur[comp & (tl.phase == "B")] == pytest.approx(4.0 * a)
    assert dur[comp & (tl.phase == "W")] == pytest.approx(4.0 * (1 - a))
