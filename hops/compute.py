"""Per-stage compute latency: the roofline model under the scenario's training stack, or
user-given distributions.

A pass's GPU work is the sum of its kernels' times (GEMMs compute-bound at the stack's
efficiency, element-wise kernels memory-bound, the attention core by the stack's kernel:
unfused, its s x s scores pass through HBM; flash, its FLOPs run at the kernel's own
efficiency). How the host's dispatch meets that work is the stack's too:
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

from .scenario_types import Distribution, Scenario


@dataclass(frozen=True)
class StageTimes:
    """Expected per-microbatch times (ms): forward, split backward (B, W) and fused backward."""

    f: float
    b: float
    w: float
    bw: float
    layers: float


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


class ComputeModel:
    """Resolves every stage to expected F/B/W/BW times and draws jittered samples from them."""

    def __init__(self, scenario: Scenario, topology, catalog):
        self.scenario = scenario
        self.model = catalog.constants(scenario.stack)
        self.devices = [topology.devices[s.device] for s in scenario.stages]
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

        peak = dev.peak_tflops
        t_c = st.compute.tflop / peak * 1000.0 * m["compute_time_coefficient"] * share
        t_m = st.compute.memory_mb / dev.memory_bandwidth_gbps * share
        flash = m["attention"] == "flash"
        # The attention core of a stage derived from the architecture: a fused (flash) kernel runs
        # its FLOPs at the kernel's own efficiency, skipping the masked half under a causal mask,
        # and recomputes the scores in the backward; unfused, it is GEMMs like the rest.
        attn = st.compute.attention_tflop * share
        t_fa_f = t_fa_b = 0.0
        if flash:
            attn *= m["flash_causal_flop_share"]
            t_fa_f = attn / peak * 1000.0 / m["flash_efficiency_forward"]
            t_fa_b = attn * m["flash_backward_flop_factor"] / peak * 1000.0 / m["flash_efficiency_backward"]
        else:
            t_c += attn / peak * 1000.0 * m["compute_time_coefficient"]
        # Unfused attention materializes each head's s x s scores in HBM: forward writes them,
        # softmax reads and rewrites them, the value product reads them again; the backward
        # walks them more times. At long sequences this traffic, not the FLOPs, sets the time.
        # A flash kernel keeps them on chip: no such traffic.
        scores = 0.0
        if not flash and s.hidden_dim and s.seq_len:
            if s.architecture is not None:
                scores = layers * s.architecture.scores() * s.micro_batch_size
            elif m["attention_head_dim"]:
                scores = layers * s.hidden_dim / m["attention_head_dim"] * s.seq_len ** 2 * s.micro_batch_size
        t_attn_f = t_fa_f + scores * m.get("attention_bytes_forward", 0.0) / 1e6 / dev.memory_bandwidth_gbps
        t_attn_b = t_fa_b + scores * m.get("attention_bytes_backward", 0.0) / 1e6 / dev.memory_bandwidth_gbps
        k = s.backward_factor
        if m["recompute"] == "full":  # the backward reruns the layer's forward first
            t_attn_b += t_attn_f + t_c / k + t_m / k
        elif m["recompute"] == "selective" and not flash:  # ... only the attention core (Korthikanti et al. 2022)
            t_attn_b += t_attn_f
        last = i == s.n_stages - 1 if last is None else last
        first = i == 0 if first is None else first
        lm = lm_logits_f = lm_logits_b = loss_fixed = 0.0  # LM head on the last stage (seed iteration 4, + logits)
        if last and m["lm_head"] and s.hidden_dim and s.seq_len:
            vocab = s.vocab_size or m["vocab_size"]
            lm_flops = 2.0 * s.seq_len * s.hidden_dim * vocab * s.micro_batch_size
            lm_bytes = s.hidden_dim * vocab * m["bytes_per_element"][s.precision]
            lm = (lm_flops / (peak * 1e12) * 1000.0 * m["compute_time_coefficient"]
                  + lm_bytes / 1e6 / dev.memory_bandwidth_gbps)
            # The s x V logits, not the weights, dominate the head: the loss casts them to fp32
            # and passes over them several times (softmax max/exp/sum, log, target gather) in
            # the forward, and again to form the gradient in the backward, all memory-bound.
            logits = s.seq_len * vocab * s.micro_batch_size
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
            embed_b = vocab * s.hidden_dim * m["embedding_backward_bytes_per_element"] / 1e6 / dev.memory_bandwidth_gbps
        a = s.activation_grad_fraction
        floor_b, floor_w = split_floors(floor_bw, m)
        # (GPU work, host cost outside the floor) of each pass; the score gradients are part of
        # the input gradient (B), W only forms weight gradients
        gpu_f, host_f = t_c + t_m + t_attn_f + lm + lm_logits_f, embed + loss_fixed
        gpu_bw = k * t_c + k * t_m + t_attn_b + k * lm + lm_logits_b + embed_b
        gpu_b = a * k * t_c + a * k * t_m + t_attn_b + a * k * lm + lm_logits_b
        gpu_w = (1 - a) * k * t_c + (1 - a) * k * t_m + (1 - a) * k * lm + embed_b
        if m["dispatch"] == "async":  # the host runs ahead: its dispatch hides behind longer GPU work
            f = max(gpu_f, floor + launch + host_f)
            bw, b, w = (max(g, fl + launch) for g, fl in ((gpu_bw, floor_bw), (gpu_b, floor_b), (gpu_w, floor_w)))
        else:  # sync_launch, the fixture fit: the floor overlaps the kernels, the launch and host costs add
            f = max(t_c + t_m + t_attn_f, floor) + launch + embed + lm + lm_logits_f + loss_fixed
            bw = max(k * t_c + k * t_m + t_attn_b, floor_bw) + launch + k * lm + lm_logits_b + embed_b
            b = max(a * k * t_c + a * k * t_m + t_attn_b, floor_b) + launch + a * k * lm + lm_logits_b
            w = max((1 - a) * k * t_c + (1 - a) * k * t_m, floor_w) + launch + (1 - a) * k * lm + embed_b
        sd = dev.slowdown
        return StageTimes(f * sd, b * sd, w * sd, bw * sd, layers)

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
