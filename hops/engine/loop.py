"""Discrete-event engine: runs a scheduler over a pipeline and records a Timeline.

This module sets a run up (layout, links, drawn durations, the scheduler) and loops over
iterations; the event steps themselves (compute end, transfer arrival, iteration end) are
in hops.engine.events, each a small method over explicit state. An event touches at most the
stage it concerns (or the stages sharing its device), and setup is one pass over stages and
the links actually used, so time and memory grow linearly with tasks, stages and links.
All randomness is drawn up front, per component, from Generators spawned from the scenario
seed: the same seed gives the same bytes out, independent of event interleaving.

Link policy: each directed link is a FIFO resource; a transfer that finds its link busy
waits (serialization), and the wait is counted as contention. Forward activations and
backward gradients travel on opposite directions and do not contend (full duplex).

Iterations end as Megatron ends them: after the pipeline flush each stage runs its
data-parallel all-reduce (if any), the first and last stage all-reduce their tied
embedding gradients, all stages meet at a barrier (the gradient-norm collective), the
per-iteration host/framework overhead elapses, every stage steps its optimizer, and the
next iteration starts when the slowest step is done. The overhead sits
before the optimizer, where the traces show it, so the last iteration's overhead falls
inside the measured window as it does for a trace. Under optimizer post-validation
(``optimizer.post_validation``, the Zero Bubble schedules only) there is no barrier: each
device starts its next iteration when its own step is done (engine_core.end_iteration_post_validated).

Size ceiling (refused up front, before anything is drawn): at most MAX_STAGES stages and
MAX_TASKS compute tasks per run. benchmarks/engine_bench.py measures about 10^5 tasks/s and
~1 KB per task, so the ceiling is a run of a few minutes and a few GB, not a hang.
"""
from __future__ import annotations

from typing import Callable

from collections import Counter
from dataclasses import dataclass, field
from itertools import chain

import numpy as np

from hops.model import physical
from hops.model.architecture import vocab_matrices
from hops.model.collectives import data_parallel_ms, iteration_end_stall_ms, tied_embedding_sync_ms
from hops.model.compute import ComputeModel, chunk_times, draw, lognormal_unit, sample_chunks
from hops.engine.events import (_B, _BW, PHASE_CODES, Iteration, Layout, Links, Record, SchedulerError, end_iteration,
                          end_iteration_post_validated)
from hops.errors import HopsError, ScenarioError
from hops.model.hardware import Catalog, Topology, p2p_overlaps
from hops.model.memory import memory_summary, optimizer_state_per_weight_byte, pending_w_weights
from hops.schema.fields import MAX_TASKS
from hops.schedulers import PipelineMeta, Scheduler, resolve_scheduler
from hops.timeline import Timeline

# RNG streams: one child of the scenario seed per component, in this fixed order ("search": what
# a scheduler may draw while it plans, PipelineMeta.draw_times; appended, so the others keep their draws).
STREAMS = ("compute", "comm", "host", "failure", "straggler", "search")
SPLIT_NEVER, SPLIT_ALWAYS, SPLIT_EITHER = range(3)  # per-stage backward modes (see split_modes)
MAX_STAGES = 16384


class EngineSizeError(ScenarioError):
    """The run is beyond the engine's documented ceiling (refused before any work is done)."""


@dataclass
class EngineResult:
    timeline: Timeline
    expected: list
    scheduler: Scheduler
    peak_in_flight: list[int]
    # what memory charges: peak_in_flight, or under full recomputation its weighted peak, where a
    # microbatch waiting for its W weighs what that W needs (hops.model.memory.pending_w_weights)
    peak_held: list
    link_stats: dict
    extras: dict = field(default_factory=dict)


def check_size(scenario, chunks: int | None = None) -> None:
    """Refuse a run above the ceiling up front, naming the field and the bound.

    ``chunks``: model chunks per stage when a scheduler chose them at configure time
    (hetero_search's V runs two), else the scenario's virtual_stages.
    """
    p = scenario.n_stages * (scenario.virtual_stages if chunks is None else chunks)
    m, iters = scenario.microbatches, scenario.batches
    if p > MAX_STAGES:
        raise EngineSizeError("pipeline.stages", f"{p} stages; the engine runs at most {MAX_STAGES}")
    tasks = 3 * p * m * iters
    if tasks > MAX_TASKS:
        raise EngineSizeError("simulation.microbatches", f"{p} stages x {m} microbatches x {iters} batches is up to "
                              f"{tasks:,} compute tasks; the engine runs at most {MAX_TASKS:,} "
                              "(lower microbatches or batches)")


def rng_streams(seed: int) -> dict[str, np.random.Generator]:
    """One Generator per component, named as in STREAMS, each made when first asked for."""
    return _Streams(seed)


class _Streams(dict):
    """Child i of SeedSequence(seed).spawn(len(STREAMS)) is SeedSequence(seed, spawn_key=(i,)),
    so a stream made alone draws what it would have drawn from the spawned set. Making only
    the streams a run uses (two, without host noise or failures) saves most of the ~0.15 ms
    that spawning and seeding all five cost, a few % of a small scenario."""

    def __init__(self, seed: int):
        super().__init__()
        self.seed = seed

    def __missing__(self, name: str) -> np.random.Generator:
        seq = np.random.SeedSequence(self.seed, spawn_key=(STREAMS.index(name),))
        gen = self[name] = np.random.default_rng(seq)
        return gen


def activation_mb(scenario, catalog: Catalog) -> float:
    """What each GPU of a stage sends to the next: given, or micro-batch x seq x hidden x bytes
    per element. Every rank of a tensor-parallel group holds the whole activation and sends it
    over its own link, unless sequence parallelism shards it along the sequence: then each rank
    sends its 1/t (Korthikanti et al. 2022, sec. 4.2.2: the layer boundary is sequence-parallel)."""
    if scenario.activation_mb is not None:
        return scenario.activation_mb
    if scenario.hidden_dim and scenario.seq_len:
        nbytes = catalog.model["bytes_per_element"][scenario.precision]
        full = scenario.micro_batch_size * scenario.seq_len * scenario.hidden_dim * nbytes / 1e6
        if catalog.stack(scenario)["sequence_parallel"]:
            return full / min(st.tp for st in scenario.stages)  # unequal groups: the larger shard
        return full
    return 0.0


def run(scenario, catalog: Catalog, seed: int | None = None, *, topology: Topology | None = None,
        on_iteration: Callable[[int, int], None] | None = None) -> EngineResult:
    """Simulate every iteration of the scenario; the steps live in hops.engine.events.

    ``on_iteration(done, total)`` is called after each iteration (a progress line counts them)."""
    seed = scenario.seed if seed is None else int(seed)
    check_size(scenario)
    sched_cls = resolve_scheduler(scenario.schedule)
    try:  # virtual stages: the schedule says where each model chunk runs
        placement = sched_cls.placement(scenario.n_stages, scenario.virtual_stages)
    except ValueError as exc:
        raise ScenarioError("pipeline.virtual_stages", str(exc)) from None
    topo = topology or Topology(scenario, catalog)
    compute = ComputeModel(scenario, topo, catalog)
    rngs = rng_streams(seed)
    m, iters = scenario.microbatches, scenario.batches
    msg_mb = activation_mb(scenario, catalog)

    sched = sched_cls(**scenario.scheduler_options)
    ctx = _Context(scenario, catalog, topo, compute, msg_mb, seed, bool(sched.megatron_interleaved))
    laid = lay_out(ctx, placement)
    sched.configure(laid.meta)
    chosen = getattr(sched, "chosen_placement", None)  # a scheduler may pick its placement at configure time
    if chosen is not None and list(chosen) != list(placement):
        placement = list(chosen)
        laid = lay_out(ctx, placement)
    p, phys, stage_dev, dev_ids, sdev = laid.p, laid.phys, laid.stage_dev, laid.dev_ids, laid.sdev
    links, fwd_link, bwd_link, exp = laid.links, laid.fwd_link, laid.bwd_link, laid.exp
    v_eff = p // scenario.n_stages
    if v_eff != scenario.virtual_stages:
        check_size(scenario, v_eff)
    smode = split_modes(sched.split_backward, p, sched.name)
    split = bool(smode[0]) if len(set(smode)) == 1 and smode[0] != SPLIT_EITHER else \
        ["either" if v == SPLIT_EITHER else bool(v) for v in smode]

    n_total = iters * m
    samples = sample_chunks(compute, placement, exp, rngs["compute"], n_total)
    stragglers = {}
    if scenario.failure is not None:  # per-device slowdowns (fixed or drawn) stretch that device's compute
        from hops.failures import replica_stragglers

        # a tensor-parallel group runs at its slowest GPU's pace
        group_of = {st.device: st.gpus for st in scenario.stages}
        gpus = list(dict.fromkeys(g for d in dev_ids for g in group_of[d]))
        stragglers = replica_stragglers(scenario.failure, gpus, scenario.dp_degree, rngs["straggler"])
        for s in range(p):
            factor = max(stragglers.get(g, 1.0) for g in group_of[stage_dev[s]])
            if factor != 1.0:
                samples[s] = {ph: arr * factor for ph, arr in samples[s].items()}
    physical.check_samples(scenario, compute.devices, phys, samples)
    pending_weight = laid.meta.pending_weight  # what the scheduler's memory check weighed too
    layout = Layout(
        n_stages=p, n_microbatches=m, sdev=sdev, stages_on_dev=laid.stages_on_dev, fwd_link=fwd_link,
        bwd_link=bwd_link, dur=[[samples[s][ph].tolist() for ph in PHASE_CODES] for s in range(p)],
        bwd_codes=[({"BW": _BW}, {"B": _B}, {"B": _B, "BW": _BW})[v] for v in smode],
        either=[v == SPLIT_EITHER for v in smode], tasks_per_stage=[m * (3 if v else 2) for v in smode],
        phys=phys, blocking_send=laid.meta.blocking_send, pending_weight=pending_weight)
    uses = Counter(k for k in chain(fwd_link, bwd_link) if k is not None)
    links_state = Links([lp.transfer_ms(msg_mb) for lp in links],
                        [lognormal_unit(rngs["comm"], lp.jitter, uses[k] * n_total).tolist() if lp.jitter > 0
                         else None for k, lp in enumerate(links)])
    # Per-iteration host/framework time outside the schedule (scalar grad-norm and inf checks
    # across the pipeline, zero_grad, timers, the data-loader handoff): the scenario's own
    # distribution when it gives one (a measured one already holds any stalls), else the model
    # constant plus the expected iteration-end stall of the hosts the final exchanges join.
    host = (draw(scenario.host_overhead, rngs["host"], iters).tolist() if scenario.host_overhead is not None
            else [float(catalog.stack(scenario)["iteration_overhead_ms"]) + iteration_end_stall_ms(scenario, catalog, topo)]
            * iters)
    opt_ms, sync_ms = laid.opt_ms, laid.sync_ms
    ar_ms = data_parallel_ms(scenario, catalog, topo, backward_ms=[e.bw for e in compute.expected],
                             forward_ms=[e.f for e in compute.expected])
    physical.check_iteration_end(scenario, ar_ms, host)

    n_phys = scenario.n_stages
    record = Record(n_phys)
    t_iter = 0.0
    release = None  # post-validation: when each device may start the next iteration
    state_ms = _state_message_ms(scenario, topo) if scenario.post_validation else None
    for it in range(iters):
        stage_end = Iteration(layout, links_state, record, sched, it, t_iter).run(t_iter, release)
        if p != n_phys:  # a stage is done when its last chunk is
            ends = [t_iter] * n_phys
            for k, t in enumerate(stage_end):
                ends[phys[k]] = max(ends[phys[k]], t)
            stage_end = ends
        if state_ms is None:
            t_iter = end_iteration(record, it, t_iter, stage_end, ar_ms, sync_ms, host[it], opt_ms)
        else:
            ready = end_iteration_post_validated(record, it, stage_end, ar_ms, sync_ms, host[it], opt_ms, state_ms)
            release = [max(t for t, st in zip(ready, scenario.stages) if st.device == d) for d in dev_ids]
            t_iter = min(ready)
        if on_iteration is not None:
            on_iteration(it + 1, iters)

    other = record.other + _tensor_parallel_rows(record.compute, exp, placement)
    tl = _build_timeline(scenario, record.compute, record.transfer, other, links, stage_dev, placement, v_eff)
    link_stats = {lp.name: {"transfers": links_state.count[k], "contended": links_state.contended[k],
                            "wait_ms": links_state.wait[k]} for k, lp in enumerate(links)}
    peak_held = record.peak_in_flight if pending_weight is None else record.peak_weighted
    return EngineResult(tl, compute.expected, sched, record.peak_in_flight, peak_held, link_stats,
                        {"activation_mb": msg_mb, "host_overhead_ms": host, "split_backward": split,
                         "links": links, "stragglers": stragglers, "virtual_stages": v_eff,
                         "chunks": exp if p != n_phys else None, "placement": list(placement),
                         "model_ends": (phys[0], phys[-1])})


@dataclass(frozen=True)
class _Context:
    """What a placement is laid out against: the scenario and its hardware, compute model and message size."""
    scenario: object
    catalog: Catalog
    topo: Topology
    compute: ComputeModel
    msg_mb: float
    seed: int  # the run's seed (a planning scheduler's own draws come from its "search" stream)
    megatron_interleaved: bool = False  # the schedule is Megatron's interleaved 1F1B (p2p_overlap: interleaved)


@dataclass(frozen=True)
class Placed:
    """Everything that follows from where the model chunks run (``placement``: (stage, chunk)
    per virtual stage): the device of each virtual stage, the links between neighbours in both
    directions (fwd_link[s] is s -> s+1, bwd_link[s] is s -> s-1; None within a device), the
    expected chunk times, the iteration-end work the placement decides, and the PipelineMeta a
    scheduler plans from."""
    p: int  # virtual stages
    phys: list  # scenario stage of each virtual stage
    stage_dev: list
    dev_ids: list  # devices in order of first use
    sdev: list  # device index of each virtual stage
    stages_on_dev: list
    links: list
    fwd_link: list
    bwd_link: list
    exp: list
    opt_ms: list  # each stage's optimizer step (the LM head's follows the last chunk)
    sync_ms: float  # the tied-embedding all-reduce between the first and the last chunk's devices
    meta: PipelineMeta


def lay_out(ctx: _Context, placement) -> Placed:
    """Placed for this placement; hops.engine.loop.run lays out the schedule's, then the scheduler's choice."""
    sc = ctx.scenario
    p = len(placement)
    phys = [i for i, _ in placement]
    stage_dev = [sc.stages[i].device for i in phys]
    dev_ids = list(dict.fromkeys(stage_dev))
    dev_index = {d: k for k, d in enumerate(dev_ids)}
    sdev = [dev_index[d] for d in stage_dev]
    stages_on_dev: list[list[int]] = [[] for _ in dev_ids]
    for s, k in enumerate(sdev):
        stages_on_dev[k].append(s)
    links, link_index = [], {}

    def link_id(a: int, b: int):
        if stage_dev[a] == stage_dev[b]:
            return None
        lp = ctx.topo.link(stage_dev[a], stage_dev[b])
        if lp is None:
            raise HopsError(f"no link from {stage_dev[a]} to {stage_dev[b]}")
        if lp.name not in link_index:
            link_index[lp.name] = len(links)
            links.append(lp)
        return link_index[lp.name]

    fwd_link = [link_id(s, s + 1) if s < p - 1 else None for s in range(p)]
    bwd_link = [link_id(s, s - 1) if s > 0 else None for s in range(p)]
    exp = chunk_times(ctx.compute, placement)
    opt_ms = _optimizer_ms(sc, ctx.compute, ctx.catalog, ends=(phys[0], phys[-1]))
    sync_ms = tied_embedding_sync_ms(sc, ctx.catalog, ctx.topo, stage_dev[0], stage_dev[-1])
    physical.check_layout(sc, ctx.compute.devices, phys, exp, opt_ms, sync_ms, links, ctx.msg_mb)
    meta = PipelineMeta(
        n_stages=p, n_microbatches=sc.microbatches, f=[e.f for e in exp], b=[e.b for e in exp],
        w=[e.w for e in exp], bw=[e.bw for e in exp], devices=stage_dev,
        transfer_ms=[links[fwd_link[s]].transfer_ms(ctx.msg_mb) if fwd_link[s] is not None else 0.0
                     for s in range(p)],
        options=dict(sc.scheduler_options), stage_of=phys, virtual_stages=p // sc.n_stages,
        post_validation=sc.post_validation, iterations=sc.batches,
        blocking_send=not p2p_overlaps(ctx.catalog.stack(sc), ctx.megatron_interleaved),
        # what hetero_search weighs placements by: the part of the iteration after the flush
        # that the placement decides (the all-reduce, then the slowest optimizer step)
        layout_for=lambda other: lay_out(ctx, list(other)).meta, flush_ms=sync_ms + max(opt_ms, default=0.0),
        seed=ctx.seed, pending_weight=pending_w_weights(sc, ctx.catalog, placement),
        draw_times=lambda seed, n: sample_chunks(ctx.compute, placement, exp, rng_streams(seed)["search"], n),
        fits_memory=lambda held: not memory_summary(
            sc, ctx.topo, ctx.catalog, held, ctx.msg_mb, ends=(phys[0], phys[-1]),
            virtual_stages=p // sc.n_stages)["memory_over_capacity"],
        stage_layers=[st.layers if st.compute_derived else None for st in sc.stages])
    return Placed(p, phys, stage_dev, dev_ids, sdev, stages_on_dev, links, fwd_link, bwd_link, exp, opt_ms, sync_ms,
                  meta)


def _state_message_ms(scenario, topo: Topology) -> list[float]:
    """Post-validation's partially reduced state (a few scalars) from scenario stage s - 1 to s:
    the link's latency, nothing within a device."""
    out = [0.0]
    for a, b in zip(scenario.stages, scenario.stages[1:]):
        lp = topo.link(a.device, b.device) if a.device != b.device else None
        out.append(lp.transfer_ms(0.0) if lp is not None else 0.0)
    return out


def split_modes(value, p: int, name: str = "?") -> list[int]:
    """A scheduler's ``split_backward`` as one mode per stage.

    A bool applies to every stage (the original contract). A sequence gives one entry per
    stage: False (fused BW only), True (B then W only) or "either" (the scheduler decides per
    microbatch by returning "BW" or "B"), so a schedule can fuse where a split would cost a
    saturated stage time and split only where the shorter B shortens the critical path.
    """
    if isinstance(value, str) or not hasattr(value, "__len__"):
        value = [value] * p
    if len(value) != p:
        raise SchedulerError(f"scheduler {name!r}: split_backward has {len(value)} entries for {p} stages")
    out = []
    for v in value:
        if isinstance(v, str):
            if v != "either":
                raise SchedulerError(f"scheduler {name!r}: split_backward entry {v!r}; expected a bool or 'either'")
            out.append(SPLIT_EITHER)
        else:
            out.append(SPLIT_ALWAYS if v else SPLIT_NEVER)
    return out


def _optimizer_ms(scenario, compute: ComputeModel, catalog, ends=None) -> list[float]:
    """Optimizer step per stage: given, or the step's HBM traffic over memory bandwidth, plus
    the wait at the gradient-norm all-reduce.

    The traffic comes from the stage's parameter count when the model shape is known
    (transformer layers, plus the word embeddings on the stage that runs the first model
    chunk and the LM head on the one that runs the last: the first and last stage, or only
    the first under ZB-V's V placement, which then holds both unless they are tied), at
    `optimizer_step_bytes_per_param`; otherwise
    from weights_mb. A GPU steps its share of the stage (tensor-parallel group, sharded optimizer).

    Megatron clips gradients by their global norm before the update: each rank walks its
    parameter list on the host (`optimizer_step_layer_host_ms` per transformer layer) and
    reduces its fp32 grads on the GPU (`optimizer_grad_norm_bytes_per_param` of the step's
    bytes), then all-reduces the partial norm over the model-parallel group, which spans every
    pipeline stage. So each stage's step holds the slowest stage's pre-norm part, then its own
    rest. Under optimizer post-validation (Qi et al., ICLR 2024) there is no such all-reduce:
    each stage steps on its own pre-norm part.
    """
    ends = (0, scenario.n_stages - 1) if ends is None else ends
    if not scenario.optimizer_enabled:
        return [0.0] * scenario.n_stages
    if scenario.optimizer_step_ms is not None:
        return list(scenario.optimizer_step_ms)
    m = catalog.scenario_constants(scenario)
    arch = scenario.architecture
    matrices = vocab_matrices(scenario.n_stages, ends, scenario.embeddings_tied(m))
    pre, rest = [], []
    for i, (st, dev, e) in enumerate(zip(scenario.stages, compute.devices, compute.expected)):
        # each GPU of a tensor-parallel group steps its 1/t; a sharded optimizer (zero1, fsdp) its 1/d of that
        shards = st.tp * (scenario.dp_degree if scenario.dp_sharding != "none" else 1)
        if scenario.hidden_dim and e.layers:
            h = scenario.hidden_dim
            params = e.layers * (arch.layer_params() if arch is not None else 12 * h * h)
            params += matrices[i] * (scenario.vocab_size or m["vocab_size"]) * h
            ms_per_byte_per_param = params / 1e6 / shards / dev.memory_bandwidth_gbps
            norm = m["optimizer_grad_norm_bytes_per_param"]
            pre.append(e.layers * m["optimizer_step_layer_host_ms"] + norm * ms_per_byte_per_param)
            rest.append((m["optimizer_step_bytes_per_param"] - norm) * ms_per_byte_per_param + m["optimizer_step_fixed_ms"])
        else:
            k = optimizer_state_per_weight_byte(m, scenario.precision)
            traffic_mb = st.weights_mb * (2.0 + 2.0 * k)  # read grads + weights, read/write states, write weights
            pre.append(0.0)
            rest.append(traffic_mb / shards / dev.memory_bandwidth_gbps + m["optimizer_step_fixed_ms"])
    if scenario.post_validation:
        return [a + b for a, b in zip(pre, rest)]
    wait = max(pre)
    return [wait + b for b in rest]


def _tensor_parallel_rows(comp_rows, exp, placement) -> list[tuple]:
    """A `collective` row for the tensor-parallel collectives a pass leaves exposed (inside its
    compute row, which includes them, as a measured trace's kernel span would), drawn at the
    pass's end; nothing when no stage is a tensor-parallel group. Not busy time of its own: the
    compute row around it already counts (hops.metrics.busy_mask)."""
    exposed = [(e.tp_f, e.tp_b, 0.0, e.tp_bw) for e in exp]
    if not any(any(x) for x in exposed):
        return []
    rows = []
    for s, _, code, start, end, it in comp_rows:
        t = exposed[s][code]
        if t > 0:
            rows.append(("collective", placement[s][0], PHASE_CODES[code], max(end - t, start), end, it))
    return rows


def _build_timeline(scenario, comp_rows, xfer_rows, other_rows, links, stage_dev, placement, v=None) -> Timeline:
    """Columns straight from the row tuples with vectorized lookups (no per-row Python work).

    Rows carry virtual stages; the Timeline records the scenario stage that ran them and,
    so that a plot can tell a stage's chunks apart, the chunk (-1 on rows of no chunk)."""
    phases = np.array(PHASE_CODES)
    devs = np.array(stage_dev)
    to_phys = np.array([s for s, _ in placement], dtype=np.int64)
    to_chunk = np.array([c for _, c in placement], dtype=np.int64)
    c = np.fromiter(chain.from_iterable(comp_rows), np.float64, len(comp_rows) * 6).reshape(-1, 6)
    x = np.fromiter(chain.from_iterable(xfer_rows), np.float64, len(xfer_rows) * 7).reshape(-1, 7)
    lk = x[:, 0].astype(np.int64)
    srcs = np.array([lp.src for lp in links] or [""])[lk]
    dsts = np.array([lp.dst for lp in links] or [""])[lk]
    o_kind = np.array([r[0] for r in other_rows] or [""])[: len(other_rows)]
    o_stage = np.array([r[1] for r in other_rows], dtype=np.int64)
    o_phase = np.array([r[2] for r in other_rows] or [""])[: len(other_rows)]
    o_times = np.array([(r[3], r[4], r[5]) for r in other_rows], dtype=np.float64).reshape(-1, 3)
    nc, nx, no = len(c), len(x), len(other_rows)
    cs = c[:, 0].astype(np.int64)
    cols = {
        "kind": np.concatenate([np.full(nc, "compute"), np.full(nx, "transfer"), o_kind]),
        "stage": np.concatenate([to_phys[cs], to_phys[x[:, 1].astype(np.int64)], o_stage]),
        "device": np.concatenate([devs[cs], srcs, devs[o_stage]]),
        "microbatch": np.concatenate([c[:, 1], x[:, 2], np.full(no, -1.0)]).astype(np.int64),
        "phase": np.concatenate([phases[c[:, 2].astype(np.int64)], phases[x[:, 3].astype(np.int64)], o_phase]),
        "start_ms": np.concatenate([c[:, 3], x[:, 4], o_times[:, 0]]),
        "end_ms": np.concatenate([c[:, 4], x[:, 5], o_times[:, 1]]),
        "src": np.concatenate([np.full(nc, ""), srcs, np.full(no, "")]),
        "dst": np.concatenate([np.full(nc, ""), dsts, np.full(no, "")]),
        "iteration": np.concatenate([c[:, 5], x[:, 6], o_times[:, 2]]).astype(np.int64),
        "chunk": np.concatenate([to_chunk[cs], to_chunk[x[:, 1].astype(np.int64)], np.full(no, -1)]),
    }
    return Timeline.from_rows(cols, stage_devices=[st.device for st in scenario.stages],
                              microbatches_per_iteration=scenario.microbatches,
                              samples_per_microbatch=scenario.micro_batch_size * scenario.dp_degree,
                              meta={"source": "simulation", "schedule": scenario.schedule,
                                    **({"virtual_stages": v or scenario.virtual_stages}
                                       if (v or scenario.virtual_stages) > 1 else {})})
