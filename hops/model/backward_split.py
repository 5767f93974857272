"""How a fused backward splits into B (activation gradients) and W (weight gradients).

Why this matters: zero-bubble schedules run B on the critical path and move W into idle
time, so the share of the backward that B keeps decides what they can gain.

The default share is physical, from the FLOPs of a GPT layer (FFN 4h, as the compute
model's 24 s h^2 layer estimate assumes). Per token, the forward runs 24 h^2 FLOPs of GEMMs
(QKV 6 h^2, attention projection 2 h^2, MLP 16 h^2) and 4 s h in the attention core (QK^T and
attention x V). The backward of a GEMM with weights costs the forward's FLOPs twice over:
once for the gradient of its input (B) and once for the gradient of its weights (W), so
B ~ W ~ F for the GEMM part. The attention core's two products have no weights: both of
their operands are activations, so their whole backward, 2 x 4 s h, belongs to B. Hence

    B = 24 h^2 + 8 s h,   W = 24 h^2,   B / (B + W) = (3h + s) / (6h + s),

which is 1/2 when s << h and grows with the sequence. Without the model shape the GEMM
limit 1/2 applies. A model given by its architecture (grouped-query K and V, a gated or wider
FFN, experts) has its own GEMM FLOPs D and core FLOPs A per token: B / (B + W) = (D + 2A) /
(2D + 2A), the same count. A scenario's ``pipeline.backward_split.activation_grad_fraction``
overrides it.

The share covers FLOPs. The element-wise backward (norms, activation function, dropout) forms
activation gradients and stays in B whole, and the LM head, one GEMM with weights, splits in
halves (hops.model.compute): zero-bubble implementations defer only the weight-gradient GEMMs.

A flash kernel runs the attention core apart from the GEMMs (hops.model.compute charges its
whole backward to B), so the share that applies to the GEMMs alone is what is left of B once
the core's 2A is taken out: (a (D + A) - A) / D, which is 1/2 at the default share.
"""
from __future__ import annotations

GEMM_ONLY_FRACTION = 0.5  # B ~ W for a GEMM with weights


def activation_grad_fraction(hidden_dim: int | None, seq_len: int | None) -> float:
    """B's share of the fused backward, (3h + s) / (6h + s), or 1/2 without h and s."""
    if not hidden_dim or not seq_len:
        return GEMM_ONLY_FRACTION
    return (3 * hidden_dim + seq_len) / (6 * hidden_dim + seq_len)


def layer_activation_grad_fraction(gemm_flops: float, core_flops: float) -> float:
    """B's share of a layer's fused backward from its forward FLOPs: (D + 2A) / (2D + 2A)."""
    return (gemm_flops + 2 * core_flops) / (2 * gemm_flops + 2 * core_flops)


def gemm_activation_grad_fraction(fraction: float, gemm_flops: float, core_flops: float) -> float:
    """B's share of the weight GEMMs' backward alone, when the attention core's backward (2A)
    is charged to B apart from them: (a (D + A) - A) / D, held within [0, 1]."""
    return min(max((fraction * (gemm_flops + core_flops) - core_flops) / gemm_flops, 0.0), 1.0)
