"""Peak memory per device: weights, optimizer state and the activations a schedule holds.

Lives apart from hops.api so that the engine can ask whether a placement fits the devices
before it runs (hetero_search chooses between placements at configure time).
"""
from __future__ import annotations

from hops.outputs import files as outputs
from hops.model.architecture import vocab_matrices
from hops.model.compute import stage_layers
from hops.model.hardware import Catalog, Topology
from hops.scenario_types import Scenario


def optimizer_state_per_weight_byte(m: dict, precision: str) -> float:
    """Adam's state per byte of weight: its fp32 moments (8 B per parameter) and, where the
    weights are kept below fp32, their fp32 master copy (4 B): 12 B over a 2 B weight under
    mixed precision, 8 B over a 4 B weight in an fp32 run, whose weights are their own master."""
    nbytes = m["bytes_per_element"][precision]
    master = m["master_weight_bytes_per_param"] if nbytes < 4 else 0
    return (m["adam_state_bytes_per_param"] + master) / nbytes


def memory_summary(sc: Scenario, topo: Topology, catalog: Catalog, peak_held, msg_mb: float,
                   ends: tuple[int, int] | None = None, virtual_stages: int | None = None) -> dict:
    """Peak memory per device: weights + gradients + optimizer state + activations the schedule
    held at its peak.

    ``peak_held[i]``: stage i's peak of the chunk-microbatches it held, each weighed by what it
    held then in units of its stash (the engine's peak_held: a microbatch waiting for its W
    weighs pending_w_weights(); otherwise the plain count, peak_in_flight).

    Per parameter, Megatron's mixed precision holds the bf16 weight (2 B), its fp32 main grad
    (4 B, ``embedding_grad_bytes_per_element``) and Adam's fp32 master weight, m and v (12 B,
    ``optimizer_state_per_weight_byte`` x 2 B): 18 B, of which a distributed optimizer (ZeRO-1)
    shards the 12 over the d replicas, 6 + 12/d (Megatron-LM's distributed-optimizer notes; ZeRO,
    Rajbhandari et al. 2020, sec. 3.1, counts 2 + 2 + 12 = 16 with fp16 gradients). The gradient
    buffer stays whole on every replica: Megatron's reduce-scatter writes into it and an FSDP
    stage under pipelining keeps its gradients unsharded until the last backward. A scenario that
    leaves the optimizer out (optimizer.enabled: false) counts neither the state nor the gradient
    buffers it would consume, as it runs no gradient reduction (hops.model.collectives).

    ``ends``: the stages that run the first and the last model chunk (default the first and
    last stage); the LM head's weights and optimizer state follow it (see placed_weights_mb).
    ``virtual_stages``: chunks per stage the run used (default the scenario's; a schedule that
    picks its placement, hetero_search, may run 2 under a scenario that says 1).
    """
    m = catalog.model
    weights = placed_weights_mb(sc, catalog, ends)
    v = virtual_stages or sc.virtual_stages
    # a distributed optimizer (ZeRO-1) or FSDP shards the optimizer state over the replicas; FSDP
    # under pipelining keeps the stage's weights gathered from the first forward to the last
    # backward, so at the peak it holds what ZeRO-1 holds (hops.model.collectives.data_parallel_ms)
    state_share = sc.dp_degree if sc.dp_sharding != "none" else 1
    # ... and a rank's routed experts over the d / e replicas that hold them
    e = sc.expert_parallel
    expert_share = state_share // e if state_share > 1 else 1
    nbytes = m["bytes_per_element"][sc.precision]
    state_per_byte = optimizer_state_per_weight_byte(m, sc.precision)
    peak: dict[str, float] = {}
    for i, st in enumerate(sc.stages):
        if st.activation_memory_mb is not None:
            act = st.activation_memory_mb
        else:
            layers = stage_layers(sc, st, m)
            if layers and sc.architecture is not None:
                act = layers * layer_activation_bytes(sc, catalog, st.tp) * sc.micro_batch_size / 1e6
            elif layers and sc.hidden_dim and sc.seq_len:
                act = layers * sc.seq_len * sc.hidden_dim * sc.micro_batch_size * \
                    m["activation_bytes_per_token_hidden"] / 1e6
            else:
                act = msg_mb
        experts = sc.architecture.routed_experts_mb(st.layers, nbytes, weights[i]) if e > 1 and st.layers else 0.0
        opt = ((weights[i] - experts) / state_share + experts / expert_share) * state_per_byte \
            if sc.optimizer_enabled else 0.0
        grads = weights[i] / nbytes * m["embedding_grad_bytes_per_element"] if sc.optimizer_enabled else 0.0
        held = peak_held[i] * act / v  # in chunk-microbatches: 1/v of the stage each
        if st.tp == 1:
            peak[st.device] = peak.get(st.device, 0.0) + weights[i] + grads + opt + held
        else:  # every GPU of a tensor-parallel group holds 1/t of the weights and its share of the activations
            for gpu in st.gpus:
                peak[gpu] = peak.get(gpu, 0.0) + (weights[i] + grads + opt) / st.tp + held
    capacity = {d: topo.devices[d].memory_gb * 1000.0 for d in peak}
    order = sorted(peak, key=outputs.natural_key)
    return {"peak_memory_mb": {d: peak[d] for d in order}, "memory_capacity_mb": {d: capacity[d] for d in order},
            "memory_over_capacity": [d for d in order if peak[d] > capacity[d]]}


def layer_activation_bytes(sc: Scenario, catalog: Catalog, tp: int = 1) -> float:
    """Bytes one layer stashes per micro-batch row for its backward on each GPU of a
    tensor-parallel group of `tp`, from the architecture and the stack.

    Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer Models",
    sec. 4-5), per layer: s b h (34 + 5 a s / h) without tensor parallelism; with it,
    s b h (10 + 24/t + 5 a s / (h t)); with sequence parallelism too, s b h / t (34 + 5 a s / h);
    selective recomputation drops the 5 a s / h term (the scores), and so does a flash kernel,
    which never stashes them. The 34 (and its split) is generalised to grouped-query attention
    and gated FFNs in hops.model.architecture. Full recomputation stashes only the layer's input
    (2 s b h bytes in bf16, split t ways under sequence parallelism).
    """
    arch, stack = sc.architecture, catalog.stack(sc)
    sp = bool(stack["sequence_parallel"])
    if stack["recompute"] == "full":
        return arch.seq_len * arch.hidden * catalog.model["bytes_per_element"][sc.precision] / (tp if sp else 1)
    stashed = arch.activation_bytes(tp, sp)
    if stack["attention"] == "unfused" and stack["recompute"] == "none":
        stashed += arch.scores() * catalog.model["activation_score_bytes"] / tp
    return stashed


def layer_deferred_w_bytes(sc: Scenario, catalog: Catalog, tp: int = 1) -> float:
    """Bytes one layer keeps per micro-batch row on each GPU of a tensor-parallel group of `tp`
    while its W waits after B under full recomputation: each weight GEMM's input and output
    gradient (Architecture.weight_gradient_operands), in the run's precision."""
    sp = bool(catalog.stack(sc)["sequence_parallel"])
    return sc.architecture.weight_gradient_operands(tp, sp) * catalog.model["bytes_per_element"][sc.precision]


def head_deferred_w_bytes(sc: Scenario, catalog: Catalog, tp: int = 1) -> float:
    """Bytes the LM head keeps per micro-batch row on each GPU of a tensor-parallel group of `tp`
    while its W waits after B: its input and the logits' gradient
    (Architecture.head_weight_gradient_operands), in the run's precision; 0 where the model
    runs no head (the model constant lm_head, as hops.model.compute charges its time)."""
    if not catalog.model["lm_head"]:
        return 0.0
    sp = bool(catalog.stack(sc)["sequence_parallel"])
    return sc.architecture.head_weight_gradient_operands(tp, sp) * catalog.model["bytes_per_element"][sc.precision]


def pending_w_weights(sc: Scenario, catalog: Catalog, placement=None) -> list[float] | None:
    """Per virtual stage (``placement``: the (stage, chunk) of each, as Scheduler.placement gives
    it; default one chunk per stage), what a microbatch whose B has run and whose W waits holds,
    over what it held before its B (layer_deferred_w_bytes / layer_activation_bytes); None when
    that is 1 everywhere, so the engine keeps its plain count.

    It differs only under full recomputation, where the stash is the layer inputs while B's
    rerun forward leaves W the GEMMs' inputs and output gradients (~16 h per token against 1 h).
    Without it the stash already holds the GEMMs' inputs, and memory keeps charging it until W
    as before. The chunk that runs the LM head (the last virtual stage, wherever the schedule put
    it) also holds the head's operands (head_deferred_w_bytes), its s x V logits gradient above
    all, against the stash of the chunk's own layers (1/v of its stage's, as the engine charges a
    chunk-microbatch). A stage whose activation memory is stated, or that has no layers, keeps 1.
    """
    if sc.architecture is None or catalog.stack(sc)["recompute"] != "full":
        return None
    n = sc.n_stages
    placement = [(i, 0) for i in range(n)] if placement is None else placement
    last = len(placement) - 1
    weights = [stage_pending_w_weight(sc, catalog, sc.stages[i], len(placement) // n, k == last)
               for k, (i, _) in enumerate(placement)]
    return weights if any(w != 1.0 for w in weights) else None


def stage_pending_w_weight(sc: Scenario, catalog: Catalog, st, chunks: int = 1, head: bool = False) -> float:
    """pending_w_weights' figure for one of `chunks` chunks of stage `st`, the one running the LM
    head or another (the 3D planner weighs a stage of a one-stage scenario at each position)."""
    layers = stage_layers(sc, st, catalog.model)
    if sc.architecture is None or catalog.stack(sc)["recompute"] != "full" or st.activation_memory_mb is not None \
            or not layers:
        return 1.0
    stash = layer_activation_bytes(sc, catalog, st.tp)
    w = layer_deferred_w_bytes(sc, catalog, st.tp) / stash
    if head:
        w += head_deferred_w_bytes(sc, catalog, st.tp) / (layers / chunks * stash)
    return w


def placed_weights_mb(sc: Scenario, catalog: Catalog, ends: tuple[int, int] | None = None) -> list[float]:
    """Each stage's weights once the schedule has placed the model's first and last chunk.

    A schedule that runs the last chunk somewhere other than the last stage (ZB-V's V runs it
    on the first) puts the LM head's h x V matrix there too, with its optimizer state, the
    placement the optimizer step and the tied-embedding all-reduce follow (hops.engine.loop).
    That stage gains the matrix unless it already holds it: tied embeddings share the first
    stage's. The stage that no longer runs the head keeps its stated ``weights_mb``:
    scenarios state layer weights as often as layer + head weights (every shipped one and
    every Megatron fixture gives all stages the same figure), so taking the matrix away
    could count a head that was never there; memory errs on the high side instead. Weights
    derived from the architecture are known exactly: each stage holds its layers and the
    matrices placed on it. Needs the model shape (hidden_dim); interleaved 1F1B keeps the
    ends, so nothing moves.
    """
    weights = [st.weights_mb for st in sc.stages]
    n = sc.n_stages
    ends = (0, n - 1) if ends is None else tuple(ends)
    if sc.architecture is not None and all(st.weights_derived for st in sc.stages):
        # weights derived from the architecture: each stage holds exactly its layers and the
        # matrices of the chunks the schedule placed on it
        nbytes = catalog.model["bytes_per_element"][sc.precision]
        counts = vocab_matrices(n, ends, sc.architecture.tied)
        return [sc.architecture.stage_weights_mb(st.layers, k, nbytes) for st, k in zip(sc.stages, counts)]
    if ends == (0, n - 1) or not sc.hidden_dim:
        return weights
    m = catalog.model
    tied = sc.embeddings_tied(m)
    matrix_mb = sc.hidden_dim * (sc.vocab_size or m["vocab_size"]) * m["bytes_per_element"][sc.precision] / 1e6
    gained = [max(a - b, 0) for a, b in zip(vocab_matrices(n, ends, tied), vocab_matrices(n, (0, n - 1), tied))]
    return [w + k * matrix_mb for w, k in zip(weights, gained)]
