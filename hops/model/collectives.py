"""Collectives: the data-parallel gradient reduction and the tied-embedding gradient
all-reduce at the end of an iteration, and the ring times of the tensor-parallel reductions
inside a pass (hops.model.compute adds those to the stage's times).

Megatron-style GPT training keeps a copy of the word embeddings on the last stage for the
LM head (tied input/output embeddings). After every pipeline flush the two copies' gradients
are all-reduced in full precision, so each iteration pays V*h*bytes over the path between
the first and the last stage's hosts before the optimizer may step (the gradient-norm
collective inside the step makes every stage wait for it).
"""
from __future__ import annotations


def ring_allreduce_ms(size_mb: float, ranks: int, bandwidth_gbps: float, latency_ms: float) -> float:
    """Ring all-reduce: 2(n-1) steps, each moving size/n over every link (MB / (GB/s) = ms)."""
    if ranks <= 1 or size_mb <= 0:
        return 0.0
    return 2 * (ranks - 1) * latency_ms + 2 * (ranks - 1) / ranks * size_mb / bandwidth_gbps


def ring_half_ms(size_mb: float, ranks: int, bandwidth_gbps: float, latency_ms: float) -> float:
    """Ring reduce-scatter or all-gather of a `size_mb` tensor: n-1 steps of size/n, half an all-reduce."""
    if ranks <= 1 or size_mb <= 0:
        return 0.0
    return (ranks - 1) * latency_ms + (ranks - 1) / ranks * size_mb / bandwidth_gbps


def tensor_parallel_ms(size_mb: float, ranks: int, bandwidth_gbps: float, latency_ms: float) -> float:
    """One of Megatron's tensor-parallel reductions of a b x s x h activation inside a node.

    Without sequence parallelism it is a ring all-reduce; with it (Korthikanti et al. 2022,
    sec. 4.2.2) the all-reduce splits into an all-gather before the parallel GEMM and a
    reduce-scatter after it, together the same 2(t-1)/t of the bytes and 2(t-1) steps, so
    the time is the same; what sequence parallelism changes is the activation memory
    (hops.model.memory.layer_activation_bytes)."""
    return ring_allreduce_ms(size_mb, ranks, bandwidth_gbps, latency_ms)


def data_parallel_link(scenario, catalog, device) -> tuple[float, float]:
    """(GB/s, ms) of a data-parallel ring through `device`: the scenario's
    `optimizer.data_parallel.interconnect` when given (as is: the user says where the replicas
    sit), else the replicas sit on other hosts of the same type (one pipeline per set of nodes,
    Megatron's rank order puts the data-parallel dimension outside the tensor- and pipeline-
    parallel ones), over the cross-node preset capped by the host's network interface."""
    if scenario.dp_interconnect:
        link = catalog.interconnects[scenario.dp_interconnect]
        return float(link["bandwidth_gbps"]), float(link["latency_ms"])
    preset = scenario.cross_node or scenario.same_node
    if preset is None:
        from hops.errors import ScenarioError

        raise ScenarioError("optimizer.data_parallel.interconnect", "missing; the replicas need a link: give it "
                                                                    "or hardware.interconnect.cross_node")
    link = catalog.interconnects[preset]
    bw = float(link["bandwidth_gbps"])
    if scenario.cross_node and device.host_network_gbps:
        bw = min(bw, device.host_network_gbps)
    return bw, float(link["latency_ms"])


def expert_parallel_ms(scenario, catalog, device, layers: float, tp: int) -> float:
    """One pass's exposed expert-parallel all-to-alls on a stage of `layers` MoE layers.

    Each MoE layer sends every token's top_k routed copies to the ranks holding their experts
    and brings the results back: two all-to-alls in the forward, two (of the gradients) in the
    backward. A rank sends the (e - 1)/e of its copies that leave it, h values each, over the
    data-parallel link (the expert-parallel group is carved from the data-parallel replicas), and
    pays a latency per peer. Its tokens are the micro-batch's s b, split t ways under sequence
    parallelism. Assumptions: balanced routing, and nothing hides the all-to-alls (Megatron's
    default; DeepSeek-V3's DualPipe overlaps them, which HOPS does not model).
    """
    arch, e = scenario.architecture, scenario.expert_parallel
    if e <= 1:
        return 0.0
    m = catalog.scenario_constants(scenario)
    tokens = scenario.micro_batch_size * arch.seq_len / (tp if m["sequence_parallel"] else 1)
    sent_mb = tokens * arch.top_k * arch.hidden * m["bytes_per_element"][scenario.precision] / 1e6 * (e - 1) / e
    bw, lat = data_parallel_link(scenario, catalog, device)
    return 2 * layers * ((e - 1) * lat + sent_mb / bw)


def data_parallel_ms(scenario, catalog, topology, backward_ms=None, forward_ms=None) -> list[float]:
    """Per stage, the exposed time of its data-parallel gradient reduction at the iteration's end.

    Each GPU of a stage's tensor-parallel group reduces its 1/t of the stage's gradients with
    the same GPU of the other `optimizer.data_parallel.degree` - 1 replicas, t rings side by
    side (hops.model.collectives.data_parallel_link). Gradients travel as Megatron keeps them, in
    fp32 main-grad buffers (`embedding_grad_bytes_per_element`, 4 B per parameter under bf16).
    `optimizer.data_parallel.sharding`:
      none   a ring all-reduce of the gradients;
      zero1  Megatron's distributed optimizer (ZeRO-1; Rajbhandari et al. 2020): a
             reduce-scatter of the gradients, each rank steps its 1/d, then an all-gather of
             the updated bf16 weights;
      fsdp   ZeRO-3 under pipelining (torchtitan keeps the gathered weights from the first
             microbatch's forward to the last one's backward): the same all-gather and
             reduce-scatter once per iteration; it differs from zero1 in memory, not time.
    With the stack's `dp_overlap_grad_reduce` (Megatron --overlap-grad-reduce and
    --overlap-param-gather, FSDP's prefetch), the gradient reduction runs behind the stage's
    last backward (``backward_ms``) and the weight all-gather behind its first forward
    (``forward_ms``); only the excess is exposed. The all-gather is counted before the step
    rather than after it: the iteration's length is the same. `algorithm: naive` keeps the
    all-reduce through one root, 2(d - 1) full messages. Under expert parallelism e, a rank's
    routed experts exist on d / e replicas only, so their gradients reduce over those.
    """
    d, p = scenario.dp_degree, scenario.n_stages
    if d <= 1 or not scenario.optimizer_enabled:
        return [0.0] * p
    m = catalog.scenario_constants(scenario)
    nbytes = m["bytes_per_element"][scenario.precision]
    overlap = bool(m["dp_overlap_grad_reduce"])
    e = scenario.expert_parallel
    out = []
    for i, st in enumerate(scenario.stages):
        bw, lat = data_parallel_link(scenario, catalog, topology.devices[st.device])
        weights_mb = st.weights_mb / st.tp  # one GPU's share of the stage
        parts = [(weights_mb, d)]
        if e > 1 and st.layers:
            experts_mb = scenario.architecture.routed_experts_mb(st.layers, nbytes, st.weights_mb) / st.tp
            parts = [(weights_mb - experts_mb, d), (experts_mb, d // e)]
        reduce = gather = 0.0
        for mb, n in parts:
            grads_mb = mb / nbytes * m["embedding_grad_bytes_per_element"]
            if n <= 1:
                continue
            if scenario.dp_algorithm == "naive":
                reduce += 2 * (n - 1) * (lat + grads_mb / bw)
            elif scenario.dp_sharding == "none":
                reduce += ring_allreduce_ms(grads_mb, n, bw, lat)
            else:
                reduce += ring_half_ms(grads_mb, n, bw, lat)
                gather += ring_half_ms(mb, n, bw, lat)
        if scenario.dp_algorithm == "naive":
            out.append(reduce)
            continue
        if overlap:
            reduce = max(reduce - (backward_ms[i] if backward_ms else 0.0), 0.0)
            gather = max(gather - (forward_ms[i] if forward_ms else 0.0), 0.0)
        out.append(reduce + gather)
    return out


def tied_embedding_sync_ms(scenario, catalog, topology, first: str | None = None, last: str | None = None) -> float:
    """Time of the first<->last stage embedding-gradient all-reduce, 0 when it does not happen.

    It happens when the pipeline has more than one stage on different devices, the model
    shape is known and the embeddings are tied (scenario `pipeline.model.tied_embeddings`,
    else the model constant `tied_embeddings`). ``first`` / ``last``: the devices that run the
    first and the last model chunk when the schedule places them (ZB-V puts both on the
    first stage's device, so the tied weights need no all-reduce); default the first and last
    stage's devices. Under tensor parallelism each rank holds V / t rows of the vocabulary-parallel
    embedding and all-reduces them with its counterpart on the other end, the t pairs at once
    over their own links: each moves V h / t.
    """
    tied = scenario.embeddings_tied(catalog.model)
    first = scenario.stages[0].device if first is None else first
    last = scenario.stages[-1].device if last is None else last
    if not tied or scenario.n_stages < 2 or first == last or not scenario.hidden_dim:
        return 0.0
    vocab = scenario.vocab_size or catalog.model["vocab_size"]
    tp = max(scenario.stages[0].tp, scenario.stages[-1].tp)  # Megatron runs one t on every stage
    size_mb = vocab * scenario.hidden_dim * catalog.model["embedding_grad_bytes_per_element"] / 1e6 / tp
    link = topology.link(first, last)
    if link is None:
        return 0.0
    bw = link.bandwidth_gbps
    a, b = topology.devices[first], topology.devices[last]
    if a.gpu == b.gpu and a.node != b.node and a.same_type_allreduce_gbps:
        # An all-reduce sends and receives at once; between two hosts of some types that
        # two-way traffic runs well below the one-way rate a p2p benchmark reports.
        bw = min(bw, a.same_type_allreduce_gbps)
    return ring_allreduce_ms(size_mb, 2, bw, link.latency_ms)


def iteration_end_stall_ms(scenario, catalog, topology) -> float:
    """Expected stall of an iteration's end when its final exchanges join two hosts of one type.

    The iteration ends when stage 0 has received the last gradient from stage 1 and has
    all-reduced the tied embedding gradients with the last stage; the optimizer waits for
    both. On the train traces, whenever one of those final exchanges joins two AWS p5 hosts,
    some iterations wait 150-230 ms longer between flush and step, on every stage at once
    (51 of 318 iterations); runs whose p5 pair sits elsewhere in the pipeline (reverse order)
    or whose first stage talks to other host types show none. The size is that of Linux's
    200 ms minimum TCP retransmission timeout, which is what a lost tail segment of a message
    followed by silence on the connection costs. The model adds its expectation (rate x
    size), not a draw: a prediction of the mean must not depend on which iterations a short
    simulation happens to hit.
    """
    p = scenario.n_stages
    if p < 2:
        return 0.0
    dev = [st.device for st in scenario.stages]
    partners = [dev[1]]
    tied = scenario.embeddings_tied(catalog.model)
    if tied and scenario.hidden_dim:
        partners.append(dev[-1])
    a = topology.devices[dev[0]]
    if not a.same_type_stall_ms or not a.same_type_stall_rate:
        return 0.0
    for other in partners:
        b = topology.devices[other]
        if b.gpu == a.gpu and b.node != a.node:
            return a.same_type_stall_rate * a.same_type_stall_ms
    return 0.0
