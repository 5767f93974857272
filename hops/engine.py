"""Discrete-event engine: runs a scheduler over a pipeline and records a Timeline.

One heap of (time, seq, event) tuples drives the run. An event touches at most the stage
it concerns, and only that stage (or the stages sharing its device) is asked for new work,
so the cost per task stays flat as pipelines grow. All randomness is drawn up front, per
component, from Generators spawned from the scenario seed: the same seed gives the same
bytes out, independent of event interleaving.

Link policy: each directed link is a FIFO resource; a transfer that finds its link busy
waits (serialization), and the wait is counted as contention. Forward activations and
backward gradients travel on opposite directions and do not contend (full duplex).

Iterations end as Megatron ends them: after the pipeline flush each stage runs its
data-parallel all-reduce (if any), the first and last stage all-reduce their tied
embedding gradients, all stages meet at a barrier (the gradient-norm collective), the
per-iteration host/framework overhead elapses, every stage steps its optimizer, and the
next iteration starts when the slowest step is done. The overhead sits
before the optimizer, where the traces show it, so the last iteration's overhead falls
inside the measured window as it does for a trace.
"""
from __future__ import annotations

import heapq
from itertools import chain
from dataclasses import dataclass, field

import numpy as np

from .collectives import data_parallel_allreduce_ms, tied_embedding_sync_ms
from .compute import ComputeModel, draw, lognormal_unit
from .errors import HopsError
from .hardware import Catalog, Topology
from .schedulers import PipelineMeta, Scheduler, SchedulerState, resolve_scheduler
from .timeline import Timeline

# RNG streams: one child of the scenario seed per component, in this fixed order.
STREAMS = ("compute", "comm", "host", "failure", "straggler")
PHASE_CODES = ("F", "B", "W", "BW")
_F, _B, _W, _BW = range(4)
SPLIT_NEVER, SPLIT_ALWAYS, SPLIT_EITHER = range(3)  # per-stage backward modes (see split_modes)


class SchedulerError(HopsError, RuntimeError):
    """A scheduler asked for something impossible (a task that is not ready, or two at once)."""


@dataclass
class EngineResult:
    timeline: Timeline
    expected: list
    scheduler: Scheduler
    peak_in_flight: list[int]
    link_stats: dict
    extras: dict = field(default_factory=dict)


def rng_streams(seed: int) -> dict[str, np.random.Generator]:
    children = np.random.SeedSequence(seed).spawn(len(STREAMS))
    return {name: np.random.default_rng(child) for name, child in zip(STREAMS, children)}


def activation_mb(scenario, catalog: Catalog) -> float:
    """Message size between stages: given, or micro-batch x seq x hidden x bytes per element."""
    if scenario.activation_mb is not None:
        return scenario.activation_mb
    if scenario.hidden_dim and scenario.seq_len:
        nbytes = catalog.model["bytes_per_element"][scenario.precision]
        return scenario.micro_batch_size * scenario.seq_len * scenario.hidden_dim * nbytes / 1e6
    return 0.0


def run(scenario, catalog: Catalog, seed: int | None = None, *, topology: Topology | None = None) -> EngineResult:
    seed = scenario.seed if seed is None else int(seed)
    topo = topology or Topology(scenario, catalog)
    compute = ComputeModel(scenario, topo, catalog)
    rngs = rng_streams(seed)
    p, m, iters = scenario.n_stages, scenario.microbatches, scenario.batches
    stage_dev = [st.device for st in scenario.stages]
    dev_ids = sorted(set(stage_dev), key=stage_dev.index)
    dev_index = {d: k for k, d in enumerate(dev_ids)}
    sdev = [dev_index[d] for d in stage_dev]
    stages_on_dev = [[s for s in range(p) if sdev[s] == k] for k in range(len(dev_ids))]
    shared_devices = len(dev_ids) < p
    msg_mb = activation_mb(scenario, catalog)

    # Links along the pipeline, both directions: fwd[s] is s -> s+1, bwd[s] is s -> s-1.
    links, link_names = [], []

    def link_id(a: int, b: int):
        if stage_dev[a] == stage_dev[b]:
            return None
        lp = topo.link(stage_dev[a], stage_dev[b])
        if lp is None:
            raise HopsError(f"no link from {stage_dev[a]} to {stage_dev[b]}")
        if lp.name not in link_names:
            link_names.append(lp.name)
            links.append(lp)
        return link_names.index(lp.name)

    fwd_link = [link_id(s, s + 1) if s < p - 1 else None for s in range(p)]
    bwd_link = [link_id(s, s - 1) if s > 0 else None for s in range(p)]

    exp = compute.expected
    meta = PipelineMeta(
        n_stages=p, n_microbatches=m, f=[e.f for e in exp], b=[e.b for e in exp], w=[e.w for e in exp],
        bw=[e.bw for e in exp], devices=stage_dev,
        transfer_ms=[links[fwd_link[s]].transfer_ms(msg_mb) if fwd_link[s] is not None else 0.0 for s in range(p)],
        options=dict(scenario.scheduler_options))
    sched = resolve_scheduler(scenario.schedule)(**scenario.scheduler_options)
    sched.configure(meta)
    smode = split_modes(sched.split_backward, p, sched.name)
    split = bool(smode[0]) if len(set(smode)) == 1 and smode[0] != SPLIT_EITHER else \
        ["either" if v == SPLIT_EITHER else bool(v) for v in smode]
    bwd_codes = [({"BW": _BW}, {"B": _B}, {"B": _B, "BW": _BW})[v] for v in smode]  # accepted backward tasks
    either = [v == SPLIT_EITHER for v in smode]

    n_total = iters * m
    samples = compute.sample(rngs["compute"], n_total)
    stragglers = {}
    if scenario.failure is not None:  # per-device slowdowns (fixed or drawn) stretch that device's compute
        from .failures import straggler_factors

        stragglers = straggler_factors(scenario.failure, dev_ids, rngs["straggler"])
        for s in range(p):
            factor = stragglers.get(stage_dev[s], 1.0)
            if factor != 1.0:
                samples[s] = {ph: arr * factor for ph, arr in samples[s].items()}
    dur = [[samples[s][ph] for ph in PHASE_CODES] for s in range(p)]
    dur = [[arr.tolist() for arr in row] for row in dur]
    base_ms = [lp.transfer_ms(msg_mb) for lp in links]
    uses = [(fwd_link + bwd_link).count(k) * n_total for k in range(len(links))]
    noise = [lognormal_unit(rngs["comm"], lp.jitter, uses[k]).tolist() if lp.jitter > 0 else None
             for k, lp in enumerate(links)]
    noise_pos = [0] * len(links)
    host = (draw(scenario.host_overhead, rngs["host"], iters).tolist() if scenario.host_overhead is not None
            else [0.0] * iters)

    comp_rows: list[tuple] = []   # (stage, global mb, phase code, start, end, iteration)
    xfer_rows: list[tuple] = []   # (link, stage, global mb, phase code, start, end, iteration)
    other_rows: list[tuple] = []  # (kind, stage, phase, start, end, iteration)
    link_free = [0.0] * len(links)
    link_count = [0] * len(links)
    link_contended = [0] * len(links)
    link_wait = [0.0] * len(links)
    peak_in_flight = [0] * p
    opt_ms = _optimizer_ms(scenario, compute, catalog)
    ar_ms = data_parallel_allreduce_ms(scenario, catalog)
    sync_ms = tied_embedding_sync_ms(scenario, catalog, topo)

    heappush, heappop = heapq.heappush, heapq.heappop
    t_iter = 0.0
    for it in range(iters):
        st = SchedulerState(p, m, it)
        f_ready, b_ready, w_ready = st.f_ready, st.b_ready, st.w_ready
        n_f, n_b, n_w, started, in_flight = st.n_f, st.n_b, st.n_w, st.started, st.in_flight
        for j in range(m):
            f_ready[0][j] = 1
        dev_busy = [False] * len(dev_ids)
        remaining = [m * (3 if smode[s] else 2) for s in range(p)]  # "either" stages: -1 per fused BW
        stage_end = [t_iter] * p
        heap: list = []
        seq = 0
        off = it * m
        next_tasks = sched.next_tasks

        def try_start(s: int, now: float) -> None:
            nonlocal seq
            st.stage = s
            st.now = now
            tasks = next_tasks(st)
            if not tasks:
                return
            if len(tasks) > 1:
                raise SchedulerError(f"scheduler {sched.name!r} returned {len(tasks)} tasks for stage {s}; "
                                     "a stage runs one task at a time")
            phase, j = tasks[0]
            if phase == "F":
                if not f_ready[s][j]:
                    raise SchedulerError(f"scheduler {sched.name!r} started F{j} on stage {s} before its input")
                f_ready[s][j] = 0
                n_f[s] += 1
                in_flight[s] += 1
                if in_flight[s] > peak_in_flight[s]:
                    peak_in_flight[s] = in_flight[s]
                code = _F
            elif phase == "W":
                if not w_ready[s][j]:  # set only when this microbatch's B finished
                    raise SchedulerError(f"scheduler {sched.name!r} started W{j} on stage {s} before its B")
                w_ready[s][j] = 0
                n_w[s] += 1
                code = _W
            else:
                code = bwd_codes[s].get(phase)
                if code is None or not b_ready[s][j]:
                    want = " or ".join(bwd_codes[s])
                    raise SchedulerError(f"scheduler {sched.name!r} started {phase}{j} on stage {s}: expected "
                                         f"{want} after its gradient arrived")
                if either[s] and code == _BW:
                    remaining[s] -= 1  # fused: no W will follow for this microbatch
                b_ready[s][j] = 0
                n_b[s] += 1
            started[s] += 1
            dev_busy[sdev[s]] = True
            end = now + dur[s][code][off + j]
            comp_rows.append((s, off + j, code, now, end, it))
            seq += 1
            heappush(heap, (end, seq, 0, s, j, code))

        def send(s: int, lk, j: int, direction: int, label: int, now: float) -> None:
            """Ship an activation (direction +1) or gradient (-1) from stage s; schedule its arrival.

            ``label`` is the phase code of the task that produced it (F, B or BW)."""
            nonlocal seq
            dst = s + direction
            if lk is None:
                arrive = now
            else:
                start = now if link_free[lk] <= now else link_free[lk]
                if start > now:
                    link_contended[lk] += 1
                    link_wait[lk] += start - now
                nz = noise[lk]
                d = base_ms[lk] * nz[noise_pos[lk]] if nz is not None else base_ms[lk]
                noise_pos[lk] += 1
                arrive = start + d
                link_free[lk] = arrive
                link_count[lk] += 1
                xfer_rows.append((lk, s, off + j, label, start, arrive, it))
            seq += 1
            heappush(heap, (arrive, seq, 1, dst, j, direction))

        for s in range(p):
            try_start(s, t_iter)
        while heap:
            now, _, etype, s, j, code = heappop(heap)
            if etype == 0:  # compute done on stage s
                remaining[s] -= 1
                if remaining[s] == 0:
                    stage_end[s] = now
                dev_busy[sdev[s]] = False
                if code == _F:
                    if s < p - 1:
                        send(s, fwd_link[s], j, 1, _F, now)
                    else:
                        b_ready[s][j] = 1
                else:
                    if code != _W and s > 0:
                        send(s, bwd_link[s], j, -1, code, now)
                    if code == _B:
                        w_ready[s][j] = 1
                    else:
                        in_flight[s] -= 1
                if shared_devices:
                    for s2 in stages_on_dev[sdev[s]]:
                        if not dev_busy[sdev[s2]]:
                            try_start(s2, now)
                else:
                    try_start(s, now)
            else:  # arrival at stage s
                if code > 0:
                    f_ready[s][j] = 1
                else:
                    b_ready[s][j] = 1
                if not dev_busy[sdev[s]]:
                    try_start(s, now)
        stuck = [s for s in range(p) if remaining[s]]
        if stuck:
            raise SchedulerError(f"scheduler {sched.name!r} stalled in iteration {it}: stage {stuck[0]} has "
                                 f"{remaining[stuck[0]]} tasks never started (deadlock)")

        done = []
        for s in range(p):
            t = stage_end[s]
            if ar_ms[s] > 0:
                other_rows.append(("allreduce", s, "", t, t + ar_ms[s], it))
                t += ar_ms[s]
            done.append(t)
        barrier = max([t_iter] + done)
        if sync_ms > 0:  # first and last stage all-reduce the tied embedding grads; the step waits for it
            t = max(done[0], done[-1])
            for s in (0, p - 1):
                other_rows.append(("allreduce", s, "", t, t + sync_ms, it))
            barrier = max(barrier, t + sync_ms)
        step_start = barrier + host[it]
        t_iter = step_start
        for s in range(p):
            if opt_ms[s] > 0:
                other_rows.append(("optimizer", s, "OPT", step_start, step_start + opt_ms[s], it))
                t_iter = max(t_iter, step_start + opt_ms[s])

    tl = _build_timeline(scenario, comp_rows, xfer_rows, other_rows, links, stage_dev)
    link_stats = {lp.name: {"transfers": link_count[k], "contended": link_contended[k], "wait_ms": link_wait[k]}
                  for k, lp in enumerate(links)}
    return EngineResult(tl, exp, sched, peak_in_flight, link_stats,
                        {"activation_mb": msg_mb, "host_overhead_ms": host, "split_backward": split,
                         "links": links, "stragglers": stragglers})


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


def _optimizer_ms(scenario, compute: ComputeModel, catalog) -> list[float]:
    """Optimizer step per stage: given, or the step's HBM traffic over memory bandwidth.

    The traffic comes from the stage's parameter count when the model shape is known
    (transformer layers, plus the word embeddings on the first stage and the LM head on
    the last), at `optimizer_step_bytes_per_param`; otherwise from weights_mb.
    """
    if not scenario.optimizer_enabled:
        return [0.0] * scenario.n_stages
    if scenario.optimizer_step_ms is not None:
        return list(scenario.optimizer_step_ms)
    m = catalog.model
    out = []
    for i, (st, dev, e) in enumerate(zip(scenario.stages, compute.devices, compute.expected)):
        if scenario.hidden_dim and e.layers:
            h = scenario.hidden_dim
            params = e.layers * 12 * h * h
            if i in (0, scenario.n_stages - 1):
                params += (scenario.vocab_size or m["vocab_size"]) * h
            traffic_mb = params * m["optimizer_step_bytes_per_param"] / 1e6
        else:
            k = m["optimizer_bytes_per_weight_byte"]
            traffic_mb = st.weights_mb * (2.0 + 2.0 * k)  # read grads + weights, read/write states, write weights
        out.append(traffic_mb / dev.memory_bandwidth_gbps + dev.launch_overhead_ms)
    return out


def _build_timeline(scenario, comp_rows, xfer_rows, other_rows, links, stage_dev) -> Timeline:
    """Columns straight from the row tuples with vectorized lookups (no per-row Python work)."""
    phases = np.array(PHASE_CODES)
    devs = np.array(stage_dev)
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
        "stage": np.concatenate([cs, x[:, 1].astype(np.int64), o_stage]),
        "device": np.concatenate([devs[cs], srcs, devs[o_stage]]),
        "microbatch": np.concatenate([c[:, 1], x[:, 2], np.full(no, -1.0)]).astype(np.int64),
        "phase": np.concatenate([phases[c[:, 2].astype(np.int64)], phases[x[:, 3].astype(np.int64)], o_phase]),
        "start_ms": np.concatenate([c[:, 3], x[:, 4], o_times[:, 0]]),
        "end_ms": np.concatenate([c[:, 4], x[:, 5], o_times[:, 1]]),
        "src": np.concatenate([np.full(nc, ""), srcs, np.full(no, "")]),
        "dst": np.concatenate([np.full(nc, ""), dsts, np.full(no, "")]),
        "iteration": np.concatenate([c[:, 5], x[:, 6], o_times[:, 2]]).astype(np.int64),
    }
    return Timeline.from_rows(cols, stage_devices=stage_dev, microbatches_per_iteration=scenario.microbatches,
                              samples_per_microbatch=scenario.micro_batch_size,
                              meta={"source": "simulation", "schedule": scenario.schedule})
