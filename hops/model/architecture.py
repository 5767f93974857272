"""A transformer described by its shape, and the per-layer figures that shape implies.

A scenario that gives `pipeline.model` with `heads` (and `hidden_dim`, `seq_len`) lets a
stage say only `device` and `layers`: its FLOPs, its weights, its activations and its
element-wise memory traffic follow from the architecture here, so a user rebuilding a
published setup states the model as its paper does instead of working out per-stage TFLOP
by hand (and getting attention or grouped-query heads wrong).

A mixture-of-experts model (``pipeline.model.moe``) replaces every layer's FFN by `experts`
FFNs of `expert_ffn_dim`, `top_k` of them run per token (plus `shared_experts` every token
runs), spread over `expert_parallel` ranks of the data-parallel group (Fedus et al. 2022,
Switch Transformers; Megatron-Core's expert parallelism): a layer's FLOPs follow the experts a
token runs, its weights the experts a rank holds, and the tokens' trip to their experts and
back is two all-to-alls per pass (hops.model.collectives.expert_parallel_ms).

Counts are per sequence of ``seq_len`` tokens (one micro-batch row) and per layer, for the
forward pass, with Megatron's conventions (Narayanan et al. 2021, appendix; Korthikanti et
al. 2022, sec. 4.1): a multiply-add is 2 FLOPs, attention is counted over the full s x s
square (a causal kernel that skips the masked half is a property of the stack), biases and
norms (O(h) per layer) are left out.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Architecture:
    layers: int | None
    hidden: int
    heads: int
    kv_heads: int
    ffn_dim: int
    ffn_gated: bool  # SwiGLU / GeGLU: three h x ffn matrices (gate, up, down) instead of two
    seq_len: int
    vocab: int
    tied: bool
    experts: int = 0  # 0: a dense FFN; else the MoE layer's routed experts
    top_k: int = 0  # routed experts each token runs
    expert_ffn: int = 0  # one expert's FFN inner size
    shared_experts: int = 0  # experts every token runs besides its top_k (DeepSeekMoE)
    expert_parallel: int = 1  # ranks the routed experts are spread over

    @property
    def moe(self) -> bool:
        return self.experts > 0

    @property
    def kv_share(self) -> float:
        """K and V width over Q's: kv_heads / heads (grouped-query attention shares K and V heads)."""
        return self.kv_heads / self.heads

    @property
    def ffn_matrices(self) -> int:
        return 3 if self.ffn_gated else 2

    def attention_params(self) -> float:
        """Q, K, V (K and V at kv_share) and the output projection."""
        return self.hidden * self.hidden * (2 + 2 * self.kv_share)

    def expert_params(self) -> float:
        """One FFN of the MoE layer: ffn_matrices x h x expert_ffn."""
        return self.ffn_matrices * self.hidden * self.expert_ffn

    def routed_expert_params(self) -> float:
        """The routed experts one rank of the expert-parallel group holds, in one layer."""
        return self.experts / self.expert_parallel * self.expert_params() if self.moe else 0.0

    def layer_params(self) -> float:
        """Weights of one layer on a GPU (before tensor parallelism splits them): attention, and
        the FFN, or under MoE the router, the shared experts and this rank's routed experts."""
        if not self.moe:
            return self.attention_params() + self.ffn_matrices * self.hidden * self.ffn_dim
        return (self.attention_params() + self.hidden * self.experts + self.shared_experts * self.expert_params()
                + self.routed_expert_params())

    def active_params(self) -> float:
        """Weights one token's forward multiplies by: under MoE, its top_k routed experts and the
        shared ones, not the others."""
        if not self.moe:
            return self.layer_params()
        return (self.attention_params() + self.hidden * self.experts
                + (self.top_k + self.shared_experts) * self.expert_params())

    def dense_flops(self) -> float:
        """Forward GEMM FLOPs of one layer outside the attention core: 2 x tokens x active weights.

        At kv_heads = heads and a two-matrix FFN of 4h this is 24 s h^2, Megatron's figure.
        Assumption under MoE: balanced routing (every expert gets its share of tokens) and
        grouped expert GEMMs at the dense GEMMs' efficiency.
        """
        return 2.0 * self.seq_len * self.active_params()

    def attention_flops(self) -> float:
        """Forward FLOPs of the attention core of one layer: Q K^T and scores x V, 2 s^2 h each."""
        return 4.0 * self.seq_len ** 2 * self.hidden

    def scores(self) -> float:
        """Attention scores of one layer: heads x s x s."""
        return float(self.heads) * self.seq_len ** 2

    def activation_bytes(self, tp: int = 1, sequence_parallel: bool = False) -> float:
        """Bytes one layer stashes for its backward without recomputation, the scores excluded,
        on each GPU of a tensor-parallel group of `tp`.

        Korthikanti et al. (2022, sec. 4.1) count 34 s b h for a GPT layer: attention 11 (the
        QKV input 2, Q and K 4, V 2, the projection input 2, a dropout mask 1), MLP 19 (input
        2, the two 4h activations 8 + 8, a dropout mask 1), two layer norms 4. Generalised:
        K and V scale with kv_share, the MLP's inner activations with ffn_dim, and a gated FFN
        stashes a third inner tensor (gate and up outputs and their product).

        Under tensor parallelism (sec. 4.2.1) the heads' tensors and the MLP's inner ones split
        t ways while 10 s b h stay whole on every rank (the two layer norms' inputs 4, the
        attention's and the MLP's inputs 2 + 2, their two dropout masks 1 + 1): 34 becomes
        10 + 24/t. Sequence parallelism (sec. 4.2.2) splits those along the sequence too: 34/t.
        Under MoE the MLP keeps its input and dropout mask (3 h), and each of a token's top_k
        routed copies stashes its permuted input (2 h) and its expert's inner tensors, each
        shared expert its inner tensors.
        """
        h, f = self.hidden, self.ffn_dim
        attention = (7 + 4 * self.kv_share) * h
        inner = 6 if self.ffn_gated else 4
        mlp = 3 * h + inner * f
        if self.moe:  # each routed copy of a token stashes its expert input and inner tensors
            mlp = 3 * h + self.top_k * (2 * h + inner * self.expert_ffn) + self.shared_experts * inner * self.expert_ffn
        whole = self.seq_len * (attention + mlp + 4 * h)
        if tp == 1:
            return whole
        if sequence_parallel:
            return whole / tp
        replicated = 10 * self.seq_len * h
        return replicated + (whole - replicated) / tp

    def ffn_rows(self) -> tuple[tuple[int, int], ...]:
        """(rows per token, inner width) of each FFN a token runs: the dense FFN once; under MoE
        each of its top_k routed copies through an expert, and the shared experts as one FFN of
        shared_experts x expert_ffn (Megatron-Core's shared-expert MLP)."""
        if not self.moe:
            return ((1, self.ffn_dim),)
        shared = ((1, self.shared_experts * self.expert_ffn),) if self.shared_experts else ()
        return ((self.top_k, self.expert_ffn),) + shared

    def weight_gradient_operands(self, tp: int = 1, sequence_parallel: bool = False) -> float:
        """Elements one layer keeps per micro-batch row, on each GPU of a tensor-parallel group of
        `tp`, for a weight-gradient pass (W) deferred past its B under full recomputation.

        B reran the forward from the stashed layer input and drops the rest, but W computes each
        weight's gradient as dW = X^T dY, so until W runs every weight GEMM's input X and output
        gradient dY stay (what zero-bubble implementations keep for the deferred W; Qi et al.,
        ICLR 2024, sec. 2-3). Per token, in Megatron's split (Shoeybi et al. 2019, sec. 3):

        - column-parallel QKV: X the attention input, h, whole on every rank; dY the Q, K and V
          gradients, h (1 + 2 kv_share), split t ways;
        - row-parallel attention projection: X the attention output, h, split; dY h, whole;
        - column-parallel MLP up (and gate, one fused GEMM): X the MLP input, h, whole; dY
          (ffn_matrices - 1) ffn, split;
        - row-parallel MLP down: X the inner activation, ffn, split; dY h, whole.

        So 4 h whole and h (2 + 2 kv_share) + ffn_matrices ffn split, the latter layer_params() / h.
        At Megatron's GPT shape that is 16 h, 32 s h bytes in bf16, against the 34 s h a layer
        stashes without recomputation (Korthikanti et al. 2022, sec. 4.1), whose GEMM inputs are
        among them but not the output gradients. Sequence parallelism splits the whole operands
        along the sequence too (sec. 4.2.2). Under MoE each FFN row of ffn_rows() holds its own X
        and dY (h each) and its inner tensors, split as the dense FFN's (as activation_bytes splits
        the experts'); the router's h x experts GEMM, O(experts) per token, is left out like
        biases and norms.
        """
        h = self.hidden
        rows = sum(n for n, _ in self.ffn_rows())
        whole = 2 * h + 2 * h * rows
        split = h * (2 + 2 * self.kv_share) + self.ffn_matrices * sum(n * f for n, f in self.ffn_rows())
        return self.seq_len * (whole / (tp if sequence_parallel else 1) + split / tp)

    def head_weight_gradient_operands(self, tp: int = 1, sequence_parallel: bool = False) -> float:
        """Elements the LM head keeps per micro-batch row, on each GPU of a tensor-parallel group of
        `tp`, for its weight-gradient pass deferred past its B: the head is one more weight GEMM, so
        its dW = X^T dY holds its input X (h per token) and the logits' gradient dY (V per token)
        until W runs. The head is vocabulary-parallel (column-parallel in Megatron's split), so dY
        splits t ways and X stays whole unless sequence-parallel, as weight_gradient_operands splits
        a column-parallel layer's. At V >> h the s x V gradient dominates, several layers' worth."""
        return self.seq_len * (self.hidden / (tp if sequence_parallel else 1) + self.vocab / tp)

    def elementwise_bytes(self) -> float:
        """HBM traffic of one layer's forward outside the GEMMs' own operands (norms, activation
        function, dropout, residual adds). Assumption: each stashed tensor is written once by its
        producer and read once by a memory-bound consumer, so twice activation_bytes()."""
        return 2.0 * self.activation_bytes()

    def stage_work(self, layers: float, micro_batch: int) -> tuple[float, float, float]:
        """(GEMM TFLOP, attention-core TFLOP, element-wise MB) of `layers` layers' forward for one
        micro-batch. The LM head and the embedding are not here: hops.model.compute adds them to the
        stages that run them (the last and the first model chunk)."""
        b = layers * micro_batch
        return b * self.dense_flops() / 1e12, b * self.attention_flops() / 1e12, b * self.elementwise_bytes() / 1e6

    def routed_experts_mb(self, layers: float, bytes_per_element: float, weights_mb: float) -> float:
        """The routed experts' share of a stage's `weights_mb` on one rank of the expert-parallel
        group: what reduces and shards over only the replicas holding them. At most the whole
        figure, which a scenario may state smaller than the architecture's count."""
        return min(layers * self.routed_expert_params() * bytes_per_element / 1e6, weights_mb)

    def stage_weights_mb(self, layers: float, vocab_matrices: int, bytes_per_element: float) -> float:
        """Weights of a stage: its layers and the h x V matrices it holds (vocab_matrices())."""
        params = layers * self.layer_params() + vocab_matrices * self.vocab * self.hidden
        return params * bytes_per_element / 1e6


def vocab_matrices(n_stages: int, ends: tuple[int, int], tied: bool) -> list[int]:
    """h x V matrices per stage: the embedding where the first chunk runs, the LM head where
    the last runs, one matrix for both when they share a stage and are tied."""
    first, last = ends
    out = [0] * n_stages
    out[first] += 1
    if last != first or not tied:
        out[last] += 1
    return out

