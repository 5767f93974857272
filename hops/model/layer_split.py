"""`layers: auto`: a stage split planned from the architecture, in the scenario's device order.

Separate from hops.planner, which also searches the order of the devices for a GPT described by
per-stage work; this split runs inside load_scenario for a model described by its architecture,
on the scenario's own stack and hosts. Both keep each stage within its GPUs' memory where a
split can.
"""
from __future__ import annotations

import dataclasses
import math

from hops.model.compute import ComputeModel
from hops.model.hardware import Catalog, Topology
from hops.scenario_types import derived_compute
from hops.schedulers import resolve_scheduler


def split_layers(scenario, catalog: Catalog) -> list[int]:
    """`layers: auto`: the contiguous split of the architecture's layers over the stages, in the
    scenario's device order, that minimises the slowest stage's forward + backward per
    microbatch (the pace of 1F1B's steady state), with at least one layer per stage; with v
    chunks per stage, in whole chunks: a multiple of v layers per stage (hops.scenario checks
    that pipeline.model.layers allows it).

    Stage times come from hops.model.compute for the scenario's own stack and devices, so the
    embedding and the LM head count where the schedule places the first and the last model
    chunk (ZB-V's V runs both on the first stage). Exact by dynamic
    programming over (stage, layers so far); ties go to the smaller total. Unlike hops.planner.plan, it
    keeps the stages' order.

    Memory: a stage may hold n layers only where its GPUs' peak fits their memory
    (hops.model.memory.memory_summary: weights, gradients, optimizer state and the activations
    the schedule holds at its peak, held_levels, read from the engine). Why: the fastest split puts the most layers on
    the fastest GPUs, which can overfill them where a slower split fits. Where no split fits, the
    fastest one is kept and the run's memory summary flags it.
    """
    arch, p, v = scenario.architecture, scenario.n_stages, scenario.virtual_stages
    topo = Topology(scenario, catalog)
    try:
        placement = resolve_scheduler(scenario.schedule).placement(p, v)
    except ValueError:  # the engine names the field when it runs; plan as one chunk per stage meanwhile
        placement, v = [(i, 0) for i in range(p)], 1
    total = int(arch.layers) // v  # in units of v layers: one layer per chunk of the stage
    chunks = [[k for k, (stage, _) in enumerate(placement) if stage == i] for i in range(p)]

    def pace(i: int, units: int) -> float:
        n = units * v
        st = dataclasses.replace(scenario.stages[i], layers=float(n),
                                 compute=derived_compute(arch, n, scenario.micro_batch_size))
        model = ComputeModel(dataclasses.replace(scenario, stages=(st,)), topo, catalog)
        times = [model._expected(0, 1.0 / v, first=k == 0, last=k == len(placement) - 1) for k in chunks[i]]
        return sum(e.f + e.bw for e in times)

    times = [[0.0] + [pace(i, n) for n in range(1, total - p + 2)] for i in range(p)]
    fastest = _min_max_split(times, total, p, None)
    held = held_levels(scenario, catalog, topo, [units * v for units in fastest])
    split = _min_max_split(times, total, p, fitting(scenario, catalog, topo, placement, v, total - p + 1, held))
    return [units * v for units in (fastest if split is None else split)]  # none fits: the run flags it


def _min_max_split(times, total: int, p: int, fits) -> list[int] | None:
    """The contiguous split (in units) minimising (slowest stage, sum), only stage sizes
    fits[i][n] allows (all when fits is None); None when no split is allowed."""
    inf = (math.inf, math.inf)
    best = [[inf] * (total + 1) for _ in range(p + 1)]  # best[i][l]: (max, sum) of i stages holding l layers
    choice = [[0] * (total + 1) for _ in range(p + 1)]
    best[0][0] = (0.0, 0.0)
    for i in range(1, p + 1):
        for used in range(i, total - (p - i) + 1):
            for n in range(1, used - (i - 1) + 1):
                prev = best[i - 1][used - n]
                if prev == inf:
                    continue
                if fits is not None and not fits[i - 1][n]:
                    continue
                t = times[i - 1][n]
                cand = (max(prev[0], t), prev[1] + t)
                if cand < best[i][used]:
                    best[i][used], choice[i][used] = cand, n
    if best[p][total] == inf:
        return None
    split, used = [], total
    for i in range(p, 0, -1):
        split.append(choice[i][used])
        used -= choice[i][used]
    return split[::-1]


def held_levels(scenario, catalog: Catalog, topo: Topology, split: list[int]) -> list[float]:
    """What each stage holds at its peak, in chunk-microbatches each weighed as memory charges it
    (the engine's peak_held: under full recomputation a microbatch waiting for its W weighs what
    that W keeps), from one iteration of the schedule on `split` (layers per stage): 1F1B's
    p - k on stage k, ZB-H1's p everywhere, GPipe's m. The fixed orders hold the same on every
    split; a schedule planned from the stage times (zb_1p, hetero_search) may hold a little
    otherwise, which the run's own memory summary then reports. A schedule that refuses the
    pipeline is taken at 1F1B's count, and the run names the field."""
    from hops.engine import loop as engine
    from hops.errors import HopsError

    p, m = scenario.n_stages, scenario.microbatches
    stages = tuple(dataclasses.replace(st, layers=float(n), compute=derived_compute(scenario.architecture, n,
                                                                                     scenario.micro_batch_size))
                   for st, n in zip(scenario.stages, split))
    try:
        res = engine.run(dataclasses.replace(scenario, batches=1, stages=stages), catalog, topology=topo)
    except HopsError:
        return [float(min(p - k, m) * scenario.virtual_stages) for k in range(p)]
    return [float(h) for h in res.peak_held]


def fitting(scenario, catalog: Catalog, topo: Topology, placement, v: int, most: int,
            held: list[float]) -> list[list[bool]]:
    """fits[i][n]: stage i holding n units (n v layers) stays within its GPUs' memory at its
    held level. A stage's peak depends only on its own layers (and on the vocabulary matrices
    the placement puts on it), so each is sized alone; more layers only hold more."""
    from hops.model.memory import memory_summary

    ends = (placement[0][0], placement[-1][0])

    def sized(st, layers: int):
        return dataclasses.replace(st, layers=float(layers), compute=derived_compute(scenario.architecture, layers,
                                                                                     scenario.micro_batch_size))

    base = [sized(s, v) for s in scenario.stages]  # the others at one unit: only stage i's own peak is read
    fits = []
    for i, st in enumerate(scenario.stages):
        gpus = st.gpus if st.tp > 1 else (st.device,)
        row = [True]
        for n in range(1, most + 1):
            stages = tuple(base[:i] + [sized(st, n * v)] + base[i + 1:])
            mem = memory_summary(dataclasses.replace(scenario, stages=stages), topo, catalog, held, 0.0, ends, v)
            row.append(all(mem["peak_memory_mb"][g] <= mem["memory_capacity_mb"][g] for g in gpus))
            if not row[-1]:
                row += [False] * (most - n)
                break
        fits.append(row)
    return fits
