"""Per-stage compute latency: the roofline model under the scenario's training stack, or
user-given distributions.

A pass's GPU work is the sum of its kernels' times (GEMMs compute-bound at the stack's
efficiency, element-wise kernels memory-bound, the attention core by the stack's kernel:
unfused, its s x s scores pass through HBM where they do not fit in L2; flash, its FLOPs run at
the kernel's own efficiency). A forward waits only on the traffic L2 cannot hold: its kernels hand
tensors straight on and its stash for the backward is written back behind the GEMMs; the backward
reads that stash from HBM. How the host's dispatch meets that work is the stack's too:
    sync_launch (the fixtures' fit):  t = max(L * k_floor, GPU work) + t_launch (+ host costs)
    async (the host runs ahead):      t = max(L * k_floor + t_launch + host costs, GPU work)
L (transformer layers on the stage) is given, or estimated from the stage's FLOPs. Backward
scales the compute and memory terms by ``backward_factor``; its floor is the stack's
per-layer backward figure for the GPU. The last stage also runs the LM head (2*s*h*V FLOPs,
the h*V weights, the fp32 logits traffic of the loss, and the loss's own host-side cost);
the first stage pays the embedding overhead forward and a pass over the dense V*h
word-embedding gradient backward. A split backward shares the fused floor between B and W
by the kernels each launches (split_floors). Constants come from ``presets/stacks.yaml``
(the scenario's stack) over ``presets/model.yaml`` via the Catalog.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hops.model.backward_split import GEMM_ONLY_FRACTION, gemm_activation_grad_fraction
from hops.model.collectives import expert_parallel_ms
from hops.scenario_types import Distribution, Scenario


@dataclass(frozen=True)
class StageTimes:
    """Expected per-microbatch times (ms): forward, split backward (B, W) and fused backward."""

    f: float
    b: float
    w: float
    bw: float
    layers: float
    # tensor-parallel collectives each pass leaves exposed (already inside f, b, w, bw): the
    # timeline draws them at the end of the pass
    tp_f: float = 0.0
    tp_b: float = 0.0
    tp_bw: float = 0.0


def stage_layers(scenario: Scenario, stage, model) -> float:
    """Layers on a stage: given, or estimated as FLOPs / (coeff * s * h^2 * micro-batch)."""
    if stage.layers is not None:
        return stage.layers
    if stage.compute.mode != "analytical" or not scenario.hidden_dim or not scenario.seq_len:
        return 0.0
    per_layer = model["flops_per_layer_token_coeff"] * scenario.seq_len * scenario.hidden_dim ** 2
    return stage.compute.tflop * 1e12 / (per_layer * scenario.micro_batch_size)


# Share of a transformer layer's backward kernel launches that are weight-gradient GEMMs.
# A GPT layer has four linear layers (QKV, attention projection, MLP up, MLP down); its
# backward launches, per layer, 4 input-gradient GEMMs, 4 weight-gradient GEMMs, 4 batched
# matmul gradients of the attention core (QK^T and attention x V, two inputs each), and about
# 8 element-wise kernels (softmax, dropout x 3, GeLU, two layer norms, residual adds): 4 of
# ~20 launches, 0.2, are W's. Read from the stack preset when it carries it.
W_KERNEL_SHARE = 0.2


def split_floors(floor: float, model) -> tuple[float, float]:
    """Dispatch floors of B and W when backward is split, from the fused backward's floor.

    Each pass pays the floor of the kernels it launches: W the weight-gradient GEMMs (share
    ``backward_w_kernel_share``), B the rest, so at ``backward_split_floor_factor`` = 1 (the
    default) B and W together pay the fused floor once. The factor scales both: 2 charges the
    split twice the fused floor (the seed's choice was the full floor on each of B and W).
    The split's own extra invocation is charged separately, as W's launch overhead.
    """
    factor = model["backward_split_floor_factor"]
    share = model.get("backward_w_kernel_share", W_KERNEL_SHARE)
    if share is None:  # the seed's charge (each half pays the full floor), until iteration 19 lands
        return floor * factor, floor * factor
    share = float(share)
    return floor * (1.0 - share) * factor, floor * share * factor


def l2_miss(footprint_mb: float, l2_cache_mb: float) -> float:
    """Share of a chain of kernels' traffic over `footprint_mb` of tensors that reaches HBM.

    Kernels that hand tensors one to the next hit the L2 cache while those tensors fit; past
    it, the part that does not fit streams through HBM on every pass. A GPU without an L2
    figure (0) sends everything to memory, as the model did before L2 was modelled.
    """
    if l2_cache_mb <= 0 or footprint_mb <= 0:
        return 1.0
    return max(0.0, 1.0 - l2_cache_mb / footprint_mb)


def score_l2_miss(scores_per_layer: float, model, precision: str, l2_cache_mb: float) -> float:
    """Share of unfused attention's per-score passes that reach HBM rather than the L2 cache.

    A layer's attention core runs its score kernels (QK^T, softmax, dropout, the value product,
    and their gradients) one after another over score-sized tensors: the scores in the run's
    precision plus what the core stashes for its backward (softmax output, dropout mask and
    output: ``activation_score_bytes``, Korthikanti et al. 2022). While that footprint fits in
    L2, the passes between kernels hit the cache; past it, the part that does not fit streams
    through HBM on every pass.
    """
    per_score = model["bytes_per_element"][precision] + model["activation_score_bytes"]
    return l2_miss(scores_per_layer * per_score / 2**20, l2_cache_mb)


def mlp_handover_l2_miss(scenario: Scenario, model, l2_cache_mb: float, tp: int = 1) -> float:
    """Share of a forward pass's element-wise traffic that waits on HBM rather than L2.

    A forward's element-wise kernels (bias, activation function, dropout, residual, layer norm)
    hand each activation straight to the next kernel. The widest hand-over is the MLP's: the
    activation function reads fc1's ffn-wide output (gate and up outputs when gated) and writes
    the ffn-wide tensor fc2 reads, in the run's precision, on each rank's ffn / t columns
    (2 x 4h x 2 B = 16 B per token and hidden unit for a bf16 GPT). While that fits in L2 the
    chain does not wait on HBM, and the stash the forward leaves for its backward is written
    back from L2 behind the compute-bound GEMMs that follow. The backward reads the stash from
    HBM whatever L2 holds, so only the forward uses this.
    """
    if not scenario.hidden_dim or not scenario.seq_len:
        return 1.0
    arch = scenario.architecture
    ffn = arch.ffn_dim if arch is not None else 4 * scenario.hidden_dim
    tensors = 3 if arch is not None and arch.ffn_gated else 2
    tokens = scenario.seq_len * scenario.micro_batch_size
    footprint = tensors * tokens * ffn / tp * model["bytes_per_element"][scenario.precision]
    return l2_miss(footprint / 2**20, l2_cache_mb)


class ComputeModel:
    """Resolves every stage to expected F/B/W/BW times and draws jittered samples from them."""

    def __init__(self, scenario: Scenario, topology, catalog):
        self.scenario = scenario
        self.model = catalog.scenario_constants(scenario)
        self.catalog = catalog
        self.devices = [topology.devices[s.device] for s in scenario.stages]
        self.topology = topology
        self.expected = [self._expected(i) for i in range(scenario.n_stages)]

    def _expected(self, i: int, share: float = 1.0, first: bool | None = None, last: bool | None = None) -> StageTimes:
        """Stage i's times; for one of its model chunks, ``share`` of its layers, and the
        embedding / LM head only where the chunk is first / last in the pipeline."""
        s, st, dev, m = self.scenario, self.scenario.stages[i], self.devices[i], self.model
        layers = stage_layers(s, st, m) * share
        if st.compute.mode == "distribution":
            c = st.compute
            f = c.forward.mean_ms
            bw = c.backward.mean_ms if c.backward else c.backward_b.mean_ms + c.backward_w.mean_ms
            b = c.backward_b.mean_ms if c.backward_b else bw * s.activation_grad_fraction
            w = c.backward_w.mean_ms if c.backward_w else bw - b
            sd = dev.slowdown * share
            return StageTimes(f * sd, b * sd, w * sd, bw * sd, layers)

        peak = dev.peak(s.precision, bool(m["tf32_matmul"]))
        peak_other = dev.peak_unquantized(s.precision, bool(m["tf32_matmul"]))  # attention core, LM head
        tp = st.tp  # a tensor-parallel group splits every GEMM, head and weight of the stage t ways
        t_c = st.compute.tflop / peak * 1000.0 * m["compute_time_coefficient"] * share / tp
        t_m = st.compute.memory_mb / dev.memory_bandwidth_gbps * share
        if tp > 1:  # the element-wise kernels run on each rank's share of the activations: the
            # heads' and the MLP's split t ways, the norms and dropouts whole unless sequence-parallel
            arch = s.architecture
            t_m *= arch.activation_bytes(tp, bool(m["sequence_parallel"])) / arch.activation_bytes()
        t_m_f = t_m * mlp_handover_l2_miss(s, m, dev.l2_cache_mb, tp)  # the forward's share that waits on HBM
        flash = m["attention"] == "flash"
        # The attention core of a stage derived from the architecture: a fused (flash) kernel runs
        # its FLOPs at the kernel's own efficiency, skipping the masked half under a causal mask,
        # and recomputes the scores in the backward; unfused, it is GEMMs like the rest.
        attn = st.compute.attention_tflop * share / tp
        t_fa_f = t_fa_b = t_core = 0.0
        a = s.activation_grad_fraction  # B's share of the fused backward (hops.model.backward_split)
        if flash:
            attn *= m["flash_causal_flop_share"]
            t_fa_f = attn / peak_other * 1000.0 / m["flash_efficiency_forward"]
            t_fa_b = attn * m["flash_backward_flop_factor"] / peak_other * 1000.0 / m["flash_efficiency_backward"]
            if attn > 0:  # t_c holds the weight GEMMs alone: B's share of them without the
                # core's backward, 1/2 at the default
                a = gemm_activation_grad_fraction(a, s.architecture.dense_flops(), s.architecture.attention_flops())
        else:
            t_core = attn / peak_other * 1000.0 * m["compute_time_coefficient"]
            t_c += t_core
        # Unfused attention materializes each head's s x s scores: forward writes them, softmax
        # reads and rewrites them, the value product reads them again; the backward walks them
        # more times. Those passes reach HBM when a layer's scores do not fit in L2
        # (score_l2_miss); at long sequences this traffic, not the FLOPs, sets the time. The
        # forward's stash (softmax output, dropout mask and output) is written back from L2
        # behind the GEMMs that follow, so the forward pays only the passes that miss; the
        # backward reads the stash back from HBM (written a pipeline round earlier) whatever L2
        # holds. A flash kernel keeps the scores on chip: no such traffic.
        scores = 0.0
        if not flash and s.hidden_dim and s.seq_len:
            if s.architecture is not None:
                scores = layers * s.architecture.scores() * s.micro_batch_size / tp
            elif m["attention_head_dim"]:
                scores = layers * s.hidden_dim / m["attention_head_dim"] * s.seq_len ** 2 * s.micro_batch_size
        miss = score_l2_miss(scores / layers if layers else 0.0, m, s.precision, dev.l2_cache_mb)
        stash = m["activation_score_bytes"]
        bytes_f = m.get("attention_bytes_forward", 0.0) * miss
        bytes_b = stash + (m.get("attention_bytes_backward", 0.0) - stash) * miss
        t_attn_f = t_fa_f + scores * bytes_f / 1e6 / dev.memory_bandwidth_gbps
        t_attn_b = t_fa_b + scores * bytes_b / 1e6 / dev.memory_bandwidth_gbps
        k = s.backward_factor
        if m["recompute"] == "full":  # the backward reruns the layer's whole forward first
            t_attn_b += t_attn_f + t_c + t_m_f
        elif m["recompute"] == "selective" and not flash:  # ... only the attention core (Korthikanti et al. 2022):
            t_attn_b += t_attn_f + t_core  # its score passes and its two batched GEMMs
        last = i == s.n_stages - 1 if last is None else last
        first = i == 0 if first is None else first
        lm = lm_logits_f = lm_logits_b = loss_fixed = 0.0  # LM head on the last stage (seed iteration 4, + logits)
        if last and m["lm_head"] and s.hidden_dim and s.seq_len:
            vocab = s.vocab_size or m["vocab_size"]
            # the head and its loss are vocabulary-parallel: each rank holds V / t columns
            lm_flops = 2.0 * s.seq_len * s.hidden_dim * vocab * s.micro_batch_size / tp
            lm_bytes = s.hidden_dim * vocab * m["bytes_per_element"][s.precision] / tp
            lm = (lm_flops / (peak_other * 1e12) * 1000.0 * m["compute_time_coefficient"]
                  + lm_bytes / 1e6 / dev.memory_bandwidth_gbps)
            # The s x V logits, not the weights, dominate the head: the loss casts them to fp32
            # and passes over them several times (softmax max/exp/sum, log, target gather) in
            # the forward, and again to form the gradient in the backward, all memory-bound.
            logits = s.seq_len * vocab * s.micro_batch_size / tp
            lm_logits_f = logits * m["logits_bytes_forward"] / 1e6 / dev.memory_bandwidth_gbps
            lm_logits_b = logits * m["logits_bytes_backward"] / 1e6 / dev.memory_bandwidth_gbps
            loss_fixed = m["loss_fixed_ms"]
        floor = layers * dev.k_floor_ms
        floor_bw = layers * dev.k_floor_backward_ms
        launch = dev.launch_overhead_ms
        embed = embed_b = 0.0
        if first and s.hidden_dim and s.seq_len:
            embed = m["embedding_overhead_ms"]
            # The word embedding's weight gradient is a dense V x h tensor every microbatch (zero
            # fill, scatter of the token rows), which the gradient hook then adds into the fp32
            # main grad: a pass over V*h elements whatever the batch, memory-bound.
            vocab = s.vocab_size or m["vocab_size"]
            embed_b = vocab * s.hidden_dim * m["embedding_backward_bytes_per_element"] / 1e6 / dev.memory_bandwidth_gbps / tp
        floor_b, floor_w = split_floors(floor_bw, m)
        tp_f = tp_b = tp_bw = 0.0
        if tp > 1:
            tp_f, tp_b, tp_bw = self._tensor_parallel_ms(i, layers, first, last, t_c, k, a)
        # the expert-parallel all-to-alls (none without it) wait like the tensor-parallel collectives
        a2a = expert_parallel_ms(s, self.catalog, dev, layers, tp)
        a2a_b = a2a * (2 if m["recompute"] == "full" else 1)  # full recomputation reruns the forward's
        comm_f, comm_b, comm_bw = tp_f + a2a, tp_b + a2a_b, tp_bw + a2a_b
        # (GPU work, host cost outside the floor) of each pass. W forms weight gradients only, the
        # weight GEMMs' share (1 - a) and the embedding's; B keeps the score gradients and every
        # element-wise backward (norms, activation function, dropout, residual: their few weight
        # gradients are reduced inside the same kernels), as zero-bubble implementations defer
        # only the weight-gradient GEMMs. The LM head is one GEMM with weights: its backward
        # splits in halves whatever the layers' share.
        head_b = GEMM_ONLY_FRACTION
        gpu_f, host_f = t_c + t_m_f + t_attn_f + lm + lm_logits_f + comm_f, embed + loss_fixed
        gpu_bw = k * t_c + k * t_m + t_attn_b + k * lm + lm_logits_b + embed_b + comm_bw
        gpu_b = a * k * t_c + k * t_m + t_attn_b + head_b * k * lm + lm_logits_b + comm_b
        gpu_w = (1 - a) * k * t_c + (1 - head_b) * k * lm + embed_b
        if m["dispatch"] == "async":  # the host runs ahead: its dispatch hides behind longer GPU work
            f = max(gpu_f, floor + launch + host_f)
            bw, b, w = (max(g, fl + launch) for g, fl in ((gpu_bw, floor_bw), (gpu_b, floor_b), (gpu_w, floor_w)))
        else:  # sync_launch, the fixture fit: the floor overlaps the kernels, the launch and host costs add
            f = max(t_c + t_m_f + t_attn_f + comm_f, floor) + launch + embed + lm + lm_logits_f + loss_fixed
            bw = max(k * t_c + k * t_m + t_attn_b + comm_bw, floor_bw) + launch + k * lm + lm_logits_b + embed_b
            b = max(a * k * t_c + k * t_m + t_attn_b + comm_b, floor_b) + launch + head_b * k * lm + lm_logits_b
            w = max((1 - a) * k * t_c, floor_w) + launch + (1 - head_b) * k * lm + embed_b
        sd = dev.slowdown
        if tp > 1:
            return StageTimes(f * sd, b * sd, w * sd, bw * sd, layers, tp_f * sd, tp_b * sd, tp_bw * sd)
        return StageTimes(f * sd, b * sd, w * sd, bw * sd, layers)

    def _tensor_parallel_ms(self, i: int, layers: float, first: bool, last: bool, t_gemm: float, k: float,
                            a: float) -> tuple[float, float, float]:
        """Exposed time of the tensor-parallel collectives in F, in a split B, and in a fused BW.

        Megatron's tensor parallelism (Shoeybi et al. 2019, sec. 3; Korthikanti et al. 2022,
        sec. 4.2.2) runs, per transformer layer, 2 all-reduces of the b x s x h activation in
        the forward (after the attention's and the MLP's row-parallel GEMM) and 2 in the
        backward (the input gradients of the column-parallel QKV and MLP-up GEMMs); with
        sequence parallelism each all-reduce becomes an all-gather plus a reduce-scatter, the
        same bytes on the wire (hops.model.collectives.tensor_parallel_ms). The vocabulary-parallel
        embedding adds one reduction to the first stage's forward, the LM head's copy of its
        input one to the last stage's backward; full recomputation reruns the layers' forward
        reductions in the backward (it checkpoints the transformer layers, not the embedding).
        The stack says what hides them (``tensor_parallel_overlap``): `none`; `backward`,
        Megatron's default asynchronous all-reduce of a column-parallel layer's input gradient
        alongside its weight-gradient GEMM (hidden up to those GEMMs' time, and only in a fused
        backward: a split schedule runs W later); `all`, the collectives pipelined with the
        neighbouring GEMMs in both passes (--tp-comm-overlap).
        """
        from hops.model.collectives import tensor_parallel_ms

        s, st, m = self.scenario, self.scenario.stages[i], self.model
        group = st.gpus
        link = self.topology.link(group[0], group[1])
        nbytes = m["bytes_per_element"][s.precision]
        msg_mb = s.micro_batch_size * s.seq_len * s.hidden_dim * nbytes / 1e6
        one = tensor_parallel_ms(msg_mb, st.tp, link.bandwidth_gbps, link.latency_ms)
        per_pass = 2 * layers * one
        comm_f = per_pass + (one if first else 0.0)
        comm_b = per_pass + (one if last else 0.0) + (per_pass if m["recompute"] == "full" else 0.0)
        overlap = m["tensor_parallel_overlap"]
        if overlap == "none":
            return comm_f, comm_b, comm_b
        arch = s.architecture
        column = (arch.hidden * arch.hidden * (1 + 2 * arch.kv_share) + (arch.ffn_matrices - 1) * arch.hidden
                  * arch.ffn_dim) / arch.layer_params()  # the column-parallel GEMMs' share of the weights
        window_bw = (1 - a) * k * t_gemm * column
        if overlap == "backward":
            return comm_f, comm_b, max(comm_b - window_bw, 0.0)
        return max(comm_f - t_gemm, 0.0), max(comm_b - a * k * t_gemm, 0.0), max(comm_b - k * t_gemm, 0.0)

    def sample(self, rng: np.random.Generator, n: int) -> list[dict[str, np.ndarray]]:
        """n draws per stage and phase, in a fixed order so a seed gives the same bytes."""
        out = []
        jitter = self.scenario.compute_jitter
        for i, st in enumerate(self.scenario.stages):
            e = self.expected[i]
            c = st.compute
            if c.mode == "distribution":
                sd = self.devices[i].slowdown
                f = draw(c.forward, rng, n) * sd
                if c.backward is not None:
                    bw = draw(c.backward, rng, n) * sd
                    b = draw(c.backward_b, rng, n) * sd if c.backward_b else bw * (e.b / e.bw)
                    w = draw(c.backward_w, rng, n) * sd if c.backward_w else bw - b
                else:
                    b = draw(c.backward_b, rng, n) * sd
                    w = draw(c.backward_w, rng, n) * sd
                    bw = b + w
            else:
                f, b, w, bw = (np.full(n, v) for v in (e.f, e.b, e.w, e.bw))
                cv = jitter if st.compute_jitter is None else st.compute_jitter  # per-stage value wins
                if cv > 0:
                    f, b, w, bw = (x * lognormal_unit(rng, cv, n) for x in (f, b, w, bw))
            out.append({"F": f, "B": b, "W": w, "BW": bw})
        return out


def chunk_times(compute: ComputeModel, placement) -> list[StageTimes]:
    """Expected times per virtual stage: placement[k] = (stage, chunk) of virtual stage k.

    Each chunk carries 1/v of its stage's layers (v = chunks per stage); the embedding runs on
    virtual stage 0 and the LM head on the last, wherever the schedule placed them.
    """
    n = len(placement)
    if n == compute.scenario.n_stages:
        return list(compute.expected)
    v = n // compute.scenario.n_stages
    return [compute._expected(i, 1.0 / v, k == 0, k == n - 1) for k, (i, _) in enumerate(placement)]


def sample_chunks(compute: ComputeModel, placement, times, rng: np.random.Generator, n: int):
    """n draws per virtual stage and phase (sample() when every stage is one chunk)."""
    if len(placement) == compute.scenario.n_stages:
        return compute.sample(rng, n)
    jitter, v = compute.scenario.compute_jitter, len(placement) // compute.scenario.n_stages
    out = []
    for (i, _), e in zip(placement, times):
        c = compute.scenario.stages[i].compute
        if c.mode == "distribution":  # the stage's measured times, one v-th per chunk
            sd = compute.devices[i].slowdown / v
            f = draw(c.forward, rng, n) * sd
            if c.backward is not None:  # as sample(): the split halves' own draws when given
                bw = draw(c.backward, rng, n) * sd
                b = draw(c.backward_b, rng, n) * sd if c.backward_b else bw * (e.b / e.bw)
                w = draw(c.backward_w, rng, n) * sd if c.backward_w else bw - b
            else:
                b, w = draw(c.backward_b, rng, n) * sd, draw(c.backward_w, rng, n) * sd
                bw = b + w
        else:
            f, b, w, bw = (np.full(n, x) for x in (e.f, e.b, e.w, e.bw))
            st_cv = compute.scenario.stages[i].compute_jitter
            cv = jitter if st_cv is None else st_cv  # per-stage value wins, as in sample()
            if cv > 0:
                f, b, w, bw = (x * lognormal_unit(rng, cv, n) for x in (f, b, w, bw))
        out.append({"F": f, "B": b, "W": w, "BW": bw})
    return out


def lognormal_unit(rng: np.random.Generator, cv: float, n: int) -> np.ndarray:
    """Multiplicative noise with mean 1 and coefficient of variation cv."""
    sigma2 = np.log1p(cv * cv)
    return rng.lognormal(-sigma2 / 2.0, np.sqrt(sigma2), n)


def draw(dist: Distribution, rng: np.random.Generator, n: int) -> np.ndarray:
    p = dist.params
    if dist.kind == "constant":
        return np.full(n, p["ms"])
    if dist.kind == "normal":
        return np.clip(rng.normal(p["mean_ms"], p["std_ms"], n), 0.0, None)
    if dist.kind == "lognormal":
        return p["mean_ms"] * lognormal_unit(rng, p["cv"], n)
    if dist.kind == "pareto":
        # Lomax-shifted Pareto with the requested mean: x_m * (1 + Lomax(shape)), x_m = mean*(shape-1)/shape
        shape = p["shape"]
        x_m = p["mean_ms"] * (shape - 1.0) / shape
        return x_m * (1.0 + rng.pareto(shape, n))
    raise ValueError(dist.kind)
