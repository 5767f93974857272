"""Collectives at the end of an iteration: the data-parallel gradient all-reduce and the
tied-embedding gradient all-reduce between the first and the last pipeline stage.

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


def data_parallel_allreduce_ms(scenario, catalog) -> list[float]:
    """Per-stage gradient all-reduce across data-parallel replicas (ring, or naive through one root)."""
    d = scenario.dp_degree
    if d <= 1 or not scenario.optimizer_enabled:
        return [0.0] * scenario.n_stages
    preset = scenario.dp_interconnect or scenario.cross_node or scenario.same_node
    link = catalog.interconnects[preset]
    bw, lat = float(link["bandwidth_gbps"]), float(link["latency_ms"])
    if scenario.dp_algorithm == "ring":
        return [ring_allreduce_ms(st.weights_mb, d, bw, lat) for st in scenario.stages]
    return [2 * (d - 1) * (lat + st.weights_mb / bw) for st in scenario.stages]


def tied_embedding_sync_ms(scenario, catalog, topology, first: str | None = None, last: str | None = None) -> float:
    """Time of the first<->last stage embedding-gradient all-reduce, 0 when it does not happen.

    It happens when the pipeline has more than one stage on different devices, the model
    shape is known and the embeddings are tied (scenario `pipeline.model.tied_embeddings`,
    else the model constant `tied_embeddings`). ``first`` / ``last``: the devices that run the
    first and the last model chunk when the schedule places them (ZB-V puts both on the
    first stage's device, so the tied weights need no all-reduce); default the first and last
    stage's devices.
    """
    tied = scenario.tied_embeddings if scenario.tied_embeddings is not None else catalog.model["tied_embeddings"]
    first = scenario.stages[0].device if first is None else first
    last = scenario.stages[-1].device if last is None else last
    if not tied or scenario.n_stages < 2 or first == last or not scenario.hidden_dim:
        return 0.0
    vocab = scenario.vocab_size or catalog.model["vocab_size"]
    size_mb = vocab * scenario.hidden_dim * catalog.model["embedding_grad_bytes_per_element"] / 1e6
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
    tied = scenario.tied_embeddings if scenario.tied_embeddings is not None else catalog.model["tied_embeddings"]
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
