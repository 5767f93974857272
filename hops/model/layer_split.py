"""`layers: auto`: a stage split planned from the architecture, in the scenario's device order.

Separate from hops.planner, which also searches the order of the devices and weighs memory
for a GPT described by per-stage work; this split runs inside load_scenario for a model
described by its architecture, on the scenario's own stack and hosts.
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
    keeps the stages' order and does not weigh memory (the run's memory summary reports it).
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
                t = times[i - 1][n]
                cand = (max(prev[0], t), prev[1] + t)
                if cand < best[i][used]:
                    best[i][used], choice[i][used] = cand, n
    split, used = [], total
    for i in range(p, 0, -1):
        split.append(choice[i][used])
        used -= choice[i][used]
    return [units * v for units in split[::-1]]
