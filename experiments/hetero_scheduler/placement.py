"""Placement study: hops.planner against three partitions that need no planner, per device set.

- uniform: the same layers on every device, in the given device order;
- best uniform: the same layers on every device, in the best device order the planner
  enumerates (ranked by its event-simulation estimate, the top three simulated);
- FLOPs-proportional: layers proportional to each device's peak bf16 TFLOP/s (over its
  slowdown), in the given order, largest-remainder rounding, at least one layer each.

Device sets: those of the 16 reference configs and of our own configs (model = the
config's hidden size, sequence, micro-batch and microbatch count, with its total layer
count), plus memory-tight sets where the uniform partition does not fit. Planned and
uniform partitions are both simulated with the proposed scheduler.
"""
from __future__ import annotations

import time
from pathlib import Path

from hops.model.compute import stage_layers
from hops.model.hardware import Catalog
from hops.planner import Device, ModelSpec, Planner
from hops.scenario import load_scenario

# Sets where memory decides: a 13B-class model (h 5120, 40 layers, seq 2048; 629 MB of
# bf16 weights per layer, x7 with Adam state) cannot sit uniformly on 24 GB cards.
MEMORY_TIGHT = [
    ("mem_13b_4xa100_4xl4", "4 A100-80GB + 4 L4-24GB, 13B-class model (40 x h5120)",
     ["a100"] * 4 + ["l4"] * 4, ModelSpec(layers=40, hidden=5120, seq=2048, microbatches=32), 4),
    ("mem_13b_2xh100_6xa10g", "2 H100-80GB + 6 A10G-24GB, 13B-class model (40 x h5120)",
     ["a10g"] * 3 + ["h100"] * 2 + ["a10g"] * 3, ModelSpec(layers=40, hidden=5120, seq=2048, microbatches=32), 1),
]


def config_case(path: Path, catalog: Catalog):
    sc = load_scenario(path, catalog)
    # whole layers, at least one per stage: the compute model's FLOPs-per-layer estimate (fitted at
    # s = h) can put a config written at 24 s h^2 per layer a little under one layer a stage
    total = sum(max(1, round(stage_layers(sc, st, catalog.model))) for st in sc.stages)
    devices = [Device(d.id, d.gpu, d.node, dict(sc.device_overrides.get(d.id, {}))) for d in sc.devices]
    model = ModelSpec(layers=total, hidden=sc.hidden_dim, seq=sc.seq_len, micro_batch=sc.micro_batch_size,
                      microbatches=sc.microbatches, vocab=sc.vocab_size or catalog.model["vocab_size"],
                      precision=sc.precision)
    return devices, model, sc.same_node or "nvlink", sc.cross_node or sc.same_node or "infiniband"


def flops_split(planner: Planner, order, catalog: Catalog) -> list[int]:
    speed = [catalog.devices[d.gpu]["peak_tflops"] / float(d.overrides.get("slowdown", 1.0)) for d in order]
    total = planner.model.layers
    raw = [total * x / sum(speed) for x in speed]
    layers = [max(1, int(r)) for r in raw]
    for k in sorted(range(len(raw)), key=lambda k: raw[k] - int(raw[k]), reverse=True):
        if sum(layers) >= total:
            break
        layers[k] += 1
    while sum(layers) > total:  # the minimum of one layer each overshot: take from the largest
        layers[layers.index(max(layers))] -= 1
    return layers


def summary(pl) -> dict:
    return {"order": pl.order, "layers": pl.layers, "samples_per_s": pl.samples_per_s,
            "iteration_ms": pl.simulated_ms, "fits": not pl.over_capacity, "over_capacity": pl.over_capacity}


def plan_case(name: str, group: str, devices, model, same_node, cross_node, schedule: str, catalog: Catalog,
              note: str = "") -> dict:
    t0 = time.perf_counter()
    planner = Planner(devices, model, catalog=catalog, same_node=same_node, cross_node=cross_node)
    try:  # splits sized at the schedule's own activation level; where none fits there, at 1F1B's
        res, level = planner.plan(schedule=schedule), "schedule"
    except ValueError:
        res, level = planner.plan(schedule=schedule, memory_level="1f1b"), "1f1b"
    b, u = res.best, res.uniform
    flops = planner.simulate(planner.placement(devices, flops_split(planner, devices, catalog)), schedule)
    orders, _ = planner.orders(120)
    lay = u.layers
    ranked = sorted(orders, key=lambda o: planner.quick_ms(o, lay))[:3]
    unis = [planner.simulate(planner.placement(o, lay), schedule) for o in ranked] + [u]
    fitting = [x for x in unis if not x.over_capacity] or unis
    best_uni = max(fitting, key=lambda x: x.samples_per_s)
    return {
        "flops_proportional": summary(flops), "best_uniform": summary(best_uni),
        "gain_vs_flops_pct": 100.0 * (b.samples_per_s / flops.samples_per_s - 1.0),
        "gain_vs_best_uniform_pct": 100.0 * (b.samples_per_s / best_uni.samples_per_s - 1.0),
        "order_changed": list(b.order) != [d.id for d in devices],
        "name": name, "group": group, "note": note, "devices": len(devices), "layers": model.layers,
        "microbatches": model.microbatches,
        "uniform": {"order": u.order, "layers": u.layers, "samples_per_s": u.samples_per_s,
                    "iteration_ms": u.simulated_ms, "fits": not u.over_capacity, "over_capacity": u.over_capacity,
                    "memory_mb": u.memory_mb},
        "planned": {"order": b.order, "layers": b.layers, "samples_per_s": b.samples_per_s,
                    "iteration_ms": b.simulated_ms, "fits": not b.over_capacity, "over_capacity": b.over_capacity,
                    "memory_mb": b.memory_mb, "capacity_mb": b.capacity_mb},
        "gain_pct": 100.0 * (b.samples_per_s / u.samples_per_s - 1.0),
        "orders_considered": res.orders_considered, "memory_level": level,
        "seconds": time.perf_counter() - t0,
    }


def cases(reference: list[Path], own: list[Path], catalog: Catalog):
    out = []
    for group, paths in (("reference", reference), ("own", own)):
        for path in paths:
            devices, model, same, cross = config_case(path, catalog)
            out.append((path.stem, group, devices, model, same, cross, ""))
    for name, note, gpus, model, per_node in MEMORY_TIGHT:
        devices = [Device(f"{g}_{i}", g, f"n{i // per_node}") for i, g in enumerate(gpus)]
        out.append((name, "memory-tight", devices, model, "nvlink", "infiniband", note))
    return out
