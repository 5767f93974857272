"""Placement planner: stage order and layers per stage for a device list and a model.

Why: on a mixed cluster the uniform partition (same layers on every device, devices in the
order given) leaves the fast devices waiting on the slow ones, and the last stage also
carries the LM head. The planner picks the order of devices along the pipeline and an
uneven contiguous split of the layers so that the slowest stage is as fast as possible,
within each device's memory, then checks its best candidates with the simulator.

Model of a candidate (same equations as the simulator, so the ranking agrees with it):
- stage times F and BW for (device, layers, first/last) come from hops.model.compute through
  tiny scenarios (cached), so embedding, LM head, dispatch floor and launch overhead count;
- memory per stage = weights (12 h^2 bytes per layer, plus the h x V embedding on the
  first stage and the LM head's copy of it on the last) x (1 + optimizer bytes per weight byte)
  + in-flight activations (the planned schedule's own peak on stage s, from a run of it at
  unit times, Planner.in_flight_levels: 1F1B's p - s, ZB-H1's p; each layers x s x h x
  micro-batch x activation bytes), the accounting hops.api reports;
- iteration estimate = max_k [ sum_{j<k} (F_j + x_j) + m (F_k + BW_k) + sum_{j<k} (BW_j + x_j) ]:
  the forward path fills stage k, k runs all m microbatches, the gradients drain back (the
  fused form of the study's lower bound), or m transfers if a link is the bottleneck.

Search: for a fixed order the min-max partition is exact by binary search over the
attainable stage times with a greedy packing test (stage times and memory grow with layers,
so packing each stage as full as allowed is optimal for feasibility). Orders are all the
distinct orders up to swapping identical devices when there are at most ``max_orders``,
else a pairwise-swap hill climb from several starts, ranked by that min-max estimate. For
the best few orders, candidate splits (the min-max one, and per bottleneck threshold near
it the DP split minimizing the summed stage times, since min-max leaves fill and drain
free) are ranked by a quick 1F1B event simulation under expected times, which sees the
warm-up and drain idling the closed form misses, and polished by moving single layers
between neighbours. The top few, plus the uniform split when it fits, are simulated with
hops.simulate (optimizer enabled, since its state is in the memory budget) and the best
simulated one wins, so a plan is never slower than the uniform split.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping, Sequence

from hops.model.compute import ComputeModel
from hops.model.hardware import Catalog, Topology
from hops.model.memory import optimizer_state_per_weight_byte
from hops.scenario import load_scenario


@dataclass(frozen=True)
class ModelSpec:
    layers: int
    hidden: int
    seq: int
    micro_batch: int = 1
    microbatches: int = 16
    vocab: int = 50304
    precision: str = "bf16"


@dataclass(frozen=True)
class Device:
    id: str
    gpu: str
    node: str
    overrides: Mapping[str, float] = field(default_factory=dict)

    @property
    def kind(self) -> tuple:
        return (self.gpu, tuple(sorted(self.overrides.items())))


@dataclass
class Placement:
    order: list[str]
    layers: list[int]
    estimate_ms: float                 # the planner's iteration estimate
    memory_mb: list[float]
    capacity_mb: list[float]
    simulated_ms: float | None = None  # makespan of one iteration in the simulator
    samples_per_s: float | None = None
    over_capacity: list[str] = field(default_factory=list)

    @property
    def fits(self) -> bool:
        return all(u <= c for u, c in zip(self.memory_mb, self.capacity_mb))


@dataclass
class PlanResult:
    best: Placement
    uniform: Placement
    candidates: list[Placement]
    orders_considered: int


class _Tables:
    """Stage times and memory per (device kind, layers, position) from the compute model."""

    def __init__(self, model: ModelSpec, devices: Sequence[Device], catalog: Catalog, same_node: str,
                 cross_node: str):
        self.model, self.catalog = model, catalog
        self.same_node, self.cross_node = same_node, cross_node
        m = catalog.model
        nbytes = m["bytes_per_element"][model.precision]
        self.layer_weight_mb = 12 * model.hidden ** 2 * nbytes / 1e6
        self.embed_mb = model.hidden * model.vocab * nbytes / 1e6
        # weights, their fp32 gradients and Adam's state per weight byte (hops.model.memory.memory_summary)
        self.opt_factor = (1.0 + m["embedding_grad_bytes_per_element"] / nbytes
                           + optimizer_state_per_weight_byte(m, model.precision))
        self.act_layer_mb = model.seq * model.hidden * model.micro_batch * m["activation_bytes_per_token_hidden"] / 1e6
        self.msg_mb = model.micro_batch * model.seq * model.hidden * nbytes / 1e6
        self.layer_tflop = 24 * model.seq * model.hidden ** 2 * model.micro_batch / 1e12
        self.capacity = {}
        for d in devices:
            gb = d.overrides.get("memory_gb", catalog.devices[d.gpu]["memory_gb"])
            self.capacity[d.kind] = float(gb) * 1000.0
        self._times: dict[tuple, tuple[float, float]] = {}
        self._filled: set = set()
        self.in_flight: list[float] | None = None  # microbatches each stage holds (Planner.plan sets it)

    def held(self, stage: int, p: int) -> float:
        """Microbatches of activations stage `stage` of p holds at its peak: the planned schedule's
        own level once Planner.plan has read it, 1F1B's min(p - stage, m) before."""
        if self.in_flight is not None and len(self.in_flight) == p:
            return self.in_flight[stage]
        return min(p - stage, self.model.microbatches)

    def stage_dict(self, device: str, layers: int, first: bool, last: bool) -> dict:
        weights = layers * self.layer_weight_mb + (self.embed_mb if first else 0.0) + (self.embed_mb if last else 0.0)
        return {"device": device, "weights_mb": round(weights, 3), "layers": float(layers),
                "compute": {"mode": "analytical", "tflop": layers * self.layer_tflop,
                            "memory_mb": layers * self.layer_weight_mb}}

    def scenario(self, devs: Sequence[Device], layers: Sequence[int], schedule: str = "1f1b",
                 batches: int = 1) -> dict:
        p = len(devs)
        doc = {
            "simulation": {"batches": batches, "microbatches": self.model.microbatches, "seed": 42,
                           "micro_batch_size": self.model.micro_batch},
            "pipeline": {"schedule": schedule, "precision": self.model.precision,
                         "model": {"hidden_dim": self.model.hidden, "seq_len": self.model.seq,
                                   "vocab_size": self.model.vocab},
                         "stages": [self.stage_dict(d.id, n, i == 0, i == p - 1)
                                    for i, (d, n) in enumerate(zip(devs, layers))]},
            "hardware": {"devices": [{"id": d.id, "gpu": d.gpu, "node": d.node} for d in devs],
                         "interconnect": {"same_node": self.same_node, "cross_node": self.cross_node}},
            "optimizer": {"enabled": True}, "failure": {"enabled": False}, "output": {},
        }
        over = {d.id: dict(d.overrides) for d in devs if d.overrides}
        if over:
            doc["overrides"] = {"devices": over}
        return doc

    def _fill(self, dev: Device, lmax: int) -> None:
        """Compute F + BW for this device kind at every layer count, in three positions."""
        twin = [Device(f"{dev.id}__{k}", dev.gpu, f"{dev.node}__{k}", dev.overrides) for k in range(lmax + 2)]
        mids = self._expected([twin[0]] + twin[1:lmax + 1] + [twin[lmax + 1]], [1] + list(range(1, lmax + 1)) + [1])
        for n in range(1, lmax + 1):
            self._times[(dev.kind, n, "mid")] = mids[n]
        for n in range(1, lmax + 1):
            pair = self._expected(twin[:2], [n, n])
            self._times[(dev.kind, n, "first")] = pair[0]
            self._times[(dev.kind, n, "last")] = pair[1]
        self._filled.add((dev.kind, lmax))

    def _expected(self, devs, layers):
        sc = load_scenario(self.scenario(devs, layers), self.catalog)
        cm = ComputeModel(sc, Topology(sc, self.catalog), self.catalog)
        return [(e.f, e.b, e.w, e.bw) for e in cm.expected]

    def fbwb(self, dev: Device, n: int, pos: str) -> tuple[float, float, float, float]:
        """Expected (F, B, W, BW) ms of a stage with n layers of this device at this position."""
        key = (dev.kind, n, pos)
        if key not in self._times:
            self._fill(dev, max(n, self.model.layers))
        return self._times[key]

    def time(self, dev: Device, n: int, pos: str) -> float:
        f, _, _, bw = self.fbwb(dev, n, pos)
        return f + bw

    def memory(self, dev: Device, n: int, stage: int, p: int) -> float:
        first, last = stage == 0, stage == p - 1
        weights = n * self.layer_weight_mb + (self.embed_mb if first else 0.0) + (self.embed_mb if last else 0.0)
        return weights * self.opt_factor + self.held(stage, p) * n * self.act_layer_mb

    def max_layers_by_memory(self, dev: Device, stage: int, p: int, reserve_mb: float) -> int:
        cap = self.capacity[dev.kind] - reserve_mb
        first, last = stage == 0, stage == p - 1
        fixed = ((self.embed_mb if first else 0.0) + (self.embed_mb if last else 0.0)) * self.opt_factor
        per = self.layer_weight_mb * self.opt_factor + self.held(stage, p) * self.act_layer_mb
        return max(0, int(math.floor((cap - fixed) / per + 1e-9)))

    def transfer(self, a: Device, b: Device) -> float:
        preset = self.same_node if a.node == b.node else self.cross_node
        link = self.catalog.interconnects[preset]
        return float(link["latency_ms"]) + self.msg_mb / float(link["bandwidth_gbps"])


def _multiset_permutations(items):
    """Distinct orderings of a multiset, each once (itertools.permutations would repeat them)."""
    counts: dict = {}
    for it in items:
        counts[it] = counts.get(it, 0) + 1
    keys = list(counts)
    n = len(items)
    seq: list = []

    def rec():
        if len(seq) == n:
            yield tuple(seq)
            return
        for k in keys:
            if counts[k]:
                counts[k] -= 1
                seq.append(k)
                yield from rec()
                seq.pop()
                counts[k] += 1

    return rec()


def _pos(k: int, p: int) -> str:
    return "first" if k == 0 else "last" if k == p - 1 else "mid"


class Planner:
    def __init__(self, devices: Sequence[Device], model: ModelSpec, *, catalog: Catalog | None = None,
                 same_node: str = "nvlink", cross_node: str = "infiniband", reserve_mb: float = 0.0):
        if len(devices) < 2:
            raise ValueError("the planner needs at least two devices")
        if model.layers < len(devices):
            raise ValueError(f"{model.layers} layers cannot fill {len(devices)} stages")
        self.devices = list(devices)
        self.model = model
        self.catalog = catalog or Catalog.load()
        self.reserve_mb = reserve_mb
        self.t = _Tables(model, devices, self.catalog, same_node, cross_node)
        self._quick: dict = {}

    # ------------------------------------------------------------------ one order
    def _limits(self, order):
        p = len(order)
        lmax = []
        for k, d in enumerate(order):
            lmax.append(min(self.model.layers - (p - 1), self.t.max_layers_by_memory(d, k, p, self.reserve_mb)))
        return lmax

    def _pack(self, order, theta, lmax):
        """Greedy feasibility: each stage takes as many layers as fit under theta (and memory)."""
        p, left = len(order), self.model.layers
        out = []
        for k, d in enumerate(order):
            room = min(lmax[k], left - (p - k - 1))
            n = 0
            while n < room and self.t.time(d, n + 1, _pos(k, p)) <= theta + 1e-9:
                n += 1
            if n == 0:
                return None
            out.append(n)
            left -= n
        if left > 0:
            return None
        return out

    def _estimate(self, order, layers) -> float:
        """max over stages k of fill_k + m (F_k + BW_k) + drain_k: the fused-backward form of the
        study's lower bound, which the schedules here come close to."""
        p, m = len(order), self.model.microbatches
        fb = [self.t.fbwb(d, n, _pos(k, p)) for k, (d, n) in enumerate(zip(order, layers))]
        xs = [self.t.transfer(order[k], order[k + 1]) for k in range(p - 1)]
        best, fill, drain = m * max(xs, default=0.0), 0.0, 0.0
        for k in range(p):
            best = max(best, fill + m * (fb[k][0] + fb[k][3]) + drain)
            if k < p - 1:
                fill += fb[k][0] + xs[k]
                drain += fb[k][3] + xs[k]
        return best

    def quick_ms(self, order, layers) -> float:
        """One iteration of 1F1B under expected times in the schedulers' event simulation: it
        sees the warm-up and drain idling the closed-form estimate misses, in ~1 ms."""
        from hops.schedulers.base import PipelineMeta
        from hops.schedulers.hetero_search import builtin_orders, static_policy
        from hops.schedulers.replay import simulate_policy

        key = (tuple(d.id for d in order), tuple(layers))
        hit = self._quick.get(key)
        if hit is not None:
            return hit
        p, m = len(order), self.model.microbatches
        t = [self.t.fbwb(d, n, _pos(k, p)) for k, (d, n) in enumerate(zip(order, layers))]
        meta = PipelineMeta(p, m, [x[0] for x in t], [x[1] for x in t], [x[2] for x in t], [x[3] for x in t],
                            [d.id for d in order], [self.t.transfer(order[k], order[k + 1]) for k in range(p - 1)]
                            + [0.0])
        ms = simulate_policy(meta, static_policy(builtin_orders("1f1b", p, m)))[0]
        self._quick[key] = ms
        return ms

    def minmax(self, order):
        """Exact min-max partition for this order (None if memory makes it infeasible)."""
        p = len(order)
        lmax = self._limits(order)
        if min(lmax) < 1 or sum(lmax) < self.model.layers:
            return None
        values = sorted({self.t.time(d, n, _pos(k, p)) for k, d in enumerate(order) for n in range(1, lmax[k] + 1)})
        lo, hi = 0, len(values) - 1
        if self._pack(order, values[hi], lmax) is None:
            return None
        while lo < hi:
            mid = (lo + hi) // 2
            if self._pack(order, values[mid], lmax) is not None:
                hi = mid
            else:
                lo = mid + 1
        layers = self._pack(order, values[lo], lmax)
        return layers, self._estimate(order, layers), values, lo

    def splits(self, order, span: int = 24) -> list[list[int]]:
        """Candidate splits for one order: the min-max one, and for each bottleneck threshold
        from the min-max one up, the DP split minimizing the sum of stage times under it (the
        fill and drain the min-max split ignores)."""
        base = self.minmax(order)
        if base is None:
            return []
        layers, _, values, lo = base
        p, total = len(order), self.model.layers
        lmax = self._limits(order)
        tab = [[0.0] + [self.t.time(d, n, _pos(k, p)) for n in range(1, lmax[k] + 1)] for k, d in enumerate(order)]
        out = [layers]
        for theta in values[lo:lo + span]:
            inf = float("inf")
            dp = [0.0] + [inf] * total     # dp[l]: min sum of times, l layers on the stages so far
            choice = []
            for k in range(p):
                new = [inf] * (total + 1)
                arg = [0] * (total + 1)
                row = tab[k]
                for l0 in range(total + 1):
                    if dp[l0] == inf:
                        continue
                    for n in range(1, min(lmax[k], total - l0) + 1):
                        t = row[n]
                        if t > theta + 1e-9:
                            break
                        v = dp[l0] + t
                        if v < new[l0 + n]:
                            new[l0 + n], arg[l0 + n] = v, n
                dp = new
                choice.append(arg)
            if dp[total] == inf:
                continue
            split, l = [], total
            for k in range(p - 1, -1, -1):
                n = choice[k][l]
                split.append(n)
                l -= n
            split.reverse()
            if split not in out:
                out.append(split)
        return out

    def polish(self, order, layers, rounds: int = 20) -> list[int]:
        """Hill climb on the quick simulation: move one layer between neighbouring stages."""
        p = len(order)
        lmax = self._limits(order)
        cur, best = list(layers), self.quick_ms(order, layers)
        for _ in range(rounds):
            step = None
            for k in range(p - 1):
                for a, b in ((k, k + 1), (k + 1, k)):
                    if cur[a] <= 1 or cur[b] >= lmax[b]:
                        continue
                    cand = list(cur)
                    cand[a] -= 1
                    cand[b] += 1
                    ms = self.quick_ms(order, cand)
                    if ms < best - 1e-9:
                        best, step = ms, cand
            if step is None:
                break
            cur = step
        return cur

    # ------------------------------------------------------------------ orders
    def orders(self, max_orders: int) -> tuple[list[list[Device]], int]:
        """Distinct orders up to swapping identical devices, or a hill climb if too many."""
        kinds = [d.kind for d in self.devices]
        counts: dict = {}
        for k in kinds:
            counts[k] = counts.get(k, 0) + 1
        n_distinct = math.factorial(len(kinds))
        for c in counts.values():
            n_distinct //= math.factorial(c)
        pools = {}
        for d in self.devices:  # devices of one kind in the given order: keeps node neighbours together
            pools.setdefault(d.kind, []).append(d)

        def realize(seq):
            used = {k: 0 for k in pools}
            out = []
            for k in seq:
                out.append(pools[k][used[k]])
                used[k] += 1
            return out

        if n_distinct <= max_orders:
            seqs = list(_multiset_permutations(kinds))
            return [realize(s) for s in seqs], len(seqs)
        return self._climb(realize, kinds)

    def _score(self, order) -> float:
        r = self.minmax(order)
        return r[1] if r is not None else float("inf")

    def _climb(self, realize, kinds):
        speed = {k: self.t.time(next(d for d in self.devices if d.kind == k), 1, "mid") for k in set(kinds)}
        starts = [list(kinds), sorted(kinds, key=lambda k: speed[k]), sorted(kinds, key=lambda k: -speed[k])]
        seen, found = 0, {}
        for seq in starts:
            cur = self._score(realize(seq))
            seen += 1
            while True:
                best = (cur, None)
                for i in range(len(seq)):
                    for j in range(i + 1, len(seq)):
                        if seq[i] == seq[j]:
                            continue
                        cand = list(seq)
                        cand[i], cand[j] = cand[j], cand[i]
                        sc = self._score(realize(cand))
                        seen += 1
                        if sc < best[0] - 1e-9:
                            best = (sc, cand)
                if best[1] is None:
                    break
                cur, seq = best
            found[tuple(seq)] = cur
        return [realize(list(s)) for s in sorted(found, key=found.get)], seen

    # ------------------------------------------------------------------ plan
    def placement(self, order, layers, estimate=None) -> Placement:
        p = len(order)
        mem = [self.t.memory(d, n, k, p) for k, (d, n) in enumerate(zip(order, layers))]
        cap = [self.t.capacity[d.kind] for d in order]
        est = self._estimate(order, layers) if estimate is None else estimate
        return Placement([d.id for d in order], list(layers), est, mem, cap,
                         over_capacity=[d.id for d, u, c in zip(order, mem, cap) if u > c])

    def uniform(self) -> Placement:
        p, total = len(self.devices), self.model.layers
        layers = [total // p + (1 if k < total % p else 0) for k in range(p)]
        return self.placement(self.devices, layers)

    def simulate(self, placement: Placement, schedule: str, batches: int = 1) -> Placement:
        from hops.api import simulate

        by_id = {d.id: d for d in self.devices}
        doc = self.t.scenario([by_id[i] for i in placement.order], placement.layers, schedule, batches)
        r = simulate(doc, catalog=self.catalog)
        placement.simulated_ms = r.summary["makespan_ms"] / r.summary["window"]["iterations"]
        placement.samples_per_s = r.summary["throughput"]["samples_per_s"]
        placement.over_capacity = list(r.summary["memory_over_capacity"])
        return placement

    def scenario(self, placement: Placement, schedule: str = "1f1b", batches: int = 1) -> dict:
        by_id = {d.id: d for d in self.devices}
        return self.t.scenario([by_id[i] for i in placement.order], placement.layers, schedule, batches)

    def in_flight_levels(self, schedule: str) -> list[float]:
        """Microbatches of activations each stage holds at its peak under `schedule`, read from a
        run of it at unit times (F = B = W = 1 ms, free links, 1 MB per microbatch, no weights):
        1F1B's p - k on stage k, ZB-H1's p on every stage, GPipe's m, or whatever the schedule's
        order holds. A split sized at 1F1B's level overruns the later stages of a schedule that
        holds more there."""
        from hops.api import simulate

        p = len(self.devices)
        unit = {"kind": "constant", "ms": 1.0}
        ids = [f"u{k}" for k in range(p)]
        doc = {"simulation": {"batches": 1, "microbatches": self.model.microbatches, "seed": 0},
               "pipeline": {"schedule": schedule, "activation_mb": 1.0,
                            "stages": [{"device": i, "weights_mb": 0.0, "compute": {
                                "mode": "distribution", "forward": unit, "backward_b": unit, "backward_w": unit}}
                                for i in ids]},
               "hardware": {"devices": [{"id": i, "gpu": self.devices[0].gpu, "node": "n"} for i in ids]},
               "overrides": {"links": [{"src": a, "dst": b, "latency_ms": 0.0, "bandwidth_gbps": 1e12}
                                       for a in ids for b in ids if a != b]},
               "optimizer": {"enabled": False}, "failure": {"enabled": False}}
        peak = simulate(doc, catalog=self.catalog).summary["peak_memory_mb"]
        return [float(peak[i]) for i in ids]

    def plan(self, *, schedule: str = "1f1b", top_orders: int = 6, verify_top: int = 3, max_orders: int = 720,
             verify: bool = True, memory_level: str = "schedule") -> PlanResult:
        """The best placement for `schedule`. Splits are sized within each GPU's memory at the
        schedule's own activation level (`memory_level="schedule"`), or at 1F1B's ("1f1b")."""
        if memory_level not in ("schedule", "1f1b"):
            raise ValueError(f"memory_level: expected schedule or 1f1b, got {memory_level!r}")
        self.t.in_flight = self.in_flight_levels(schedule) if memory_level == "schedule" else None
        orders, n_seen = self.orders(max_orders)
        scored = []
        for order in orders:
            r = self.minmax(order)
            if r is not None:
                scored.append((r[1], order))
        if not scored:
            raise ValueError("no order fits the model in the devices' memory")
        scored.sort(key=lambda z: z[0])
        uni = self.uniform()
        cands, seen = [], set()

        def add(order, layers):
            key = (tuple(d.id for d in order), tuple(layers))
            if key in seen:
                return
            seen.add(key)
            pl = self.placement(order, layers)
            if all(u <= c - self.reserve_mb for u, c in zip(pl.memory_mb, pl.capacity_mb)):
                cands.append((self.quick_ms(order, layers), pl))

        for _, order in scored[:top_orders]:
            best = min(self.splits(order), key=lambda sp: self.quick_ms(order, sp))
            add(order, self.polish(order, best))
        cands.sort(key=lambda z: z[0])
        top = [pl for _, pl in cands[:verify_top]]
        if uni.fits and all((pl.order, pl.layers) != (uni.order, uni.layers) for pl in top):
            top.append(uni)  # never plan worse than the uniform split when it fits
        if not top:
            raise ValueError("no candidate fits the model in the devices' memory")
        if verify:
            for c in top:
                self.simulate(c, schedule)
            if uni not in top:
                self.simulate(uni, schedule)
            best = min(top, key=lambda c: (c.simulated_ms, c.estimate_ms))
        else:
            best = top[0]
        return PlanResult(best, uni, top, n_seen)


def plan(devices: Sequence[Device], model: ModelSpec, **kwargs) -> PlanResult:
    """Convenience wrapper: Planner(devices, model, catalog=..., same_node=..., cross_node=...,
    reserve_mb=...).plan(schedule=..., top_k=..., max_orders=..., verify=...)."""
    init = {k: kwargs.pop(k) for k in ("catalog", "same_node", "cross_node", "reserve_mb") if k in kwargs}
    return Planner(devices, model, **init).plan(**kwargs)


# =========================================================================== the 3D planner
# Tensor x pipeline x data parallelism on an inventory of node pools (issue 23).
#
# Search space, stated so that the brute-force test can enumerate it independently:
# - a plan runs `dp` identical replicas of one pipeline (replicas built from different GPU
#   types are a design only: docs/parallelism.md);
# - each pool (identical nodes of one GPU type) is either unused or wholly used at one
#   tensor-parallel degree tp (a power of two dividing the node's GPUs, the heads and the
#   key/value heads; tp > 1 needs the host's gpu_link), giving gpus / (dp x tp) stages to
#   each replica;
# - the stages' order along the pipeline is any distinct sequence of the pools' stages when
#   there are at most `max_orders` of them, else the pools in blocks (every block order);
# - layers are split contiguously, at least one per stage, within each GPU's memory at the
#   1F1B activation level (stage k holds min(p - k, m) microbatches); a schedule that splits
#   the backward, or GPipe, is sized at its own order's level instead (ZB-H1: p on every stage,
#   GPipe: m), where,
#   under full recomputation, a microbatch waiting for its W weighs its deferred operands
#   (Planner3D.held);
# - the microbatches per replica are global_batch / (dp x micro_batch_size).
# A plan's estimate is (m - 1) max_k t_k + sum_k t_k + sum of the neighbours' transfers
# (forward and back) + max_k e_k, t_k = F + BW of stage k per microbatch, e_k its exposed
# data-parallel reduction plus its optimizer step: 1F1B's fill, steady state and drain, then
# the iteration end. For a fixed stage sequence the split minimising it is exact: over every
# pair of thresholds (theta on t, phi on e) a dynamic program minimises sum_k t_k subject to
# t_k <= theta and e_k <= phi. Large cases scan `span` thresholds from the min-max split up
# and leave phi free (exact_limit). The best estimates are then simulated (hops.simulate)
# under each schedule asked for, and the simulated throughput decides.


@dataclass(frozen=True)
class Pool:
    """`nodes` identical hosts of `gpus_per_node` GPUs of one type."""
    gpu: str
    nodes: int
    gpus_per_node: int = 8
    host: str | None = None
    price_per_gpu_hour: float | None = None

    @property
    def name(self) -> str:
        return f"{self.gpu}@{self.host}" if self.host else self.gpu

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node


@dataclass
class Plan3D:
    dp: int
    stages: tuple  # (pool index, tp) per pipeline stage
    layers: list[int]
    microbatches: int
    estimate_ms: float
    memory_mb: list[float]  # peak per GPU of each stage (estimate)
    capacity_mb: list[float]
    pools: tuple  # the planner's pools, for naming
    schedule: str = "1f1b"
    simulated_ms: float | None = None  # iteration time in the simulator
    over_capacity: list[str] = field(default_factory=list)
    micro_batch_size: int = 1
    schedules: tuple = ()  # the schedules asked for whose memory level its split was sized at (empty: 1F1B's)

    @property
    def gpus(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for k, tp in self.stages:
            out[self.pools[k].name] = out.get(self.pools[k].name, 0) + tp * self.dp
        return out

    @property
    def samples_per_iteration(self) -> int:
        return self.dp * self.microbatches * self.micro_batch_size

    @property
    def samples_per_s(self) -> float:
        """Simulated when the plan was simulated, else estimated; all replicas together."""
        ms = self.simulated_ms if self.simulated_ms is not None else self.estimate_ms
        return self.samples_per_iteration / ms * 1000.0

    @property
    def cost_per_sample(self) -> float | None:
        """GPU-hours priced per pool over samples per hour; None when a used pool has no price."""
        price = 0.0
        for k, tp in self.stages:
            if self.pools[k].price_per_gpu_hour is None:
                return None
            price += self.pools[k].price_per_gpu_hour * tp * self.dp
        return price / 3600.0 / self.samples_per_s

    def describe(self) -> str:
        runs = []
        for (k, tp), n in zip(self.stages, self.layers):
            label = f"{self.pools[k].gpu}x{tp}"
            if runs and runs[-1][0] == label:
                runs[-1][1].append(n)
            else:
                runs.append((label, [n]))
        pipe = " | ".join(f"{label}:{','.join(map(str, ls))}" for label, ls in runs)
        return f"DP {self.dp} x PP {len(self.stages)} [{pipe}] m={self.microbatches} {self.schedule}"


@dataclass
class Plan3DResult:
    best: Plan3D
    candidates: list[Plan3D]  # the simulated plans, best first
    uniform: Plan3D | None  # the best plan's stages with the layers split evenly
    single_type: dict[str, Plan3D]  # per pool: the best plan on that pool alone
    configurations: int  # (dp, tp per pool, stage order) combinations the search split


class _GroupTable:
    """Per-microbatch stage times, iteration-end costs and memory of a tensor-parallel group of
    one pool at every layer count and pipeline position, from hops.model.compute, hops.model.memory and
    hops.model.collectives on a one-stage scenario: the same equations a plan's simulation runs."""

    POSITIONS = ("first", "mid", "last", "only")

    def __init__(self, planner: "Planner3D", k: int, tp: int):
        from hops.scenario import derived_compute

        pool, self.planner = planner.pools[k], planner
        self.derived_compute = derived_compute
        ids = [f"t{i}" for i in range(tp)]
        doc = planner.base_doc()
        doc["pipeline"]["stages"] = [{"devices": ids} if tp > 1 else {"device": ids[0]}]
        doc["pipeline"]["stages"][0]["layers"] = planner.arch.layers
        doc["hardware"]["devices"] = [{"id": d, "gpu": pool.gpu, "node": "n", **({"host": pool.host} if pool.host
                                                                                  else {})} for d in ids]
        self.sc = load_scenario(doc, planner.catalog)
        self.topo = Topology(self.sc, planner.catalog)
        self.capacity = self.topo.devices[ids[0]].memory_gb * 1000.0
        self._rows: dict = {}

    def row(self, n: int, pos: str):
        """(F, BW, scenario of this one stage, compute model) at n layers in this position."""
        import dataclasses

        key = (n, pos)
        hit = self._rows.get(key)
        if hit is None:
            pl = self.planner
            first, last = pos in ("first", "only"), pos in ("last", "only")
            matrices = (1 if first else 0) + (1 if last and not (first and pl.arch.tied) else 0)
            st = dataclasses.replace(self.sc.stages[0], layers=float(n),
                                     compute=self.derived_compute(pl.arch, n, pl.micro_batch_size),
                                     weights_mb=pl.arch.stage_weights_mb(n, matrices, pl.nbytes), weights_derived=False)
            sc = dataclasses.replace(self.sc, stages=(st,), optimizer_enabled=True)
            cm = ComputeModel(sc, self.topo, pl.catalog)
            e = cm._expected(0, 1.0, first, last)
            cm.expected = [e]
            hit = self._rows[key] = (e.f, e.bw, sc, cm, (0 if first else -1, 0 if last else -1))
        return hit

    def time(self, n: int, pos: str) -> float:
        f, bw, *_ = self.row(n, pos)
        return f + bw

    def end_cost(self, n: int, pos: str, dp: int) -> float:
        """Exposed data-parallel reduction plus the optimizer step, ms."""
        import dataclasses

        from hops.model.collectives import data_parallel_ms
        from hops.engine.loop import _optimizer_ms

        key = ("end", n, pos, dp)
        hit = self._rows.get(key)
        if hit is None:
            f, bw, sc, cm, ends = self.row(n, pos)
            sc = dataclasses.replace(sc, dp_degree=dp, dp_sharding=self.planner.sharding)
            hit = self._rows[key] = (data_parallel_ms(sc, self.planner.catalog, self.topo, [bw], [f])[0]
                                     + _optimizer_ms(sc, cm, self.planner.catalog, ends)[0])
        return hit

    def pending_weight(self, n: int, pos: str) -> float:
        """What a microbatch waiting for its W weighs at n layers in this position, the LM head's
        operands included on the last stage (hops.model.memory.stage_pending_w_weight)."""
        from hops.model.memory import stage_pending_w_weight

        key = ("w", n, pos)
        hit = self._rows.get(key)
        if hit is None:
            _, _, sc, _, _ = self.row(n, pos)
            hit = self._rows[key] = stage_pending_w_weight(sc, self.planner.catalog, sc.stages[0],
                                                           head=pos in ("last", "only"))
        return hit

    def memory(self, n: int, pos: str, dp: int, in_flight: float) -> float:
        """Peak MB on each GPU of the group (hops.model.memory.memory_summary on the one-stage scenario)."""
        import dataclasses

        from hops.model.memory import memory_summary

        key = ("mem", n, pos, dp)
        hit = self._rows.get(key)
        if hit is None:
            _, _, sc, _, _ = self.row(n, pos)
            sc = dataclasses.replace(sc, dp_degree=dp, dp_sharding=self.planner.sharding)
            base = next(iter(memory_summary(sc, self.topo, self.planner.catalog, [0], 0.0)["peak_memory_mb"].values()))
            one = next(iter(memory_summary(sc, self.topo, self.planner.catalog, [1], 0.0)["peak_memory_mb"].values()))
            hit = self._rows[key] = (base, one - base)
        return hit[0] + in_flight * hit[1]


class Planner3D:
    """Chooses TP per stage, PP depth, DP degree, layer split and schedule for an inventory."""

    def __init__(self, model: Mapping, pools: Sequence[Pool], *, global_batch: int, micro_batch_size: int = 1,
                 stack: str | None = None, stack_options: Mapping | None = None, sharding: str = "none",
                 cross_node: str = "infiniband", max_pipeline: int = 16, catalog: Catalog | None = None,
                 max_orders: int = 64, span: int = 16, exact_limit: int = 400):
        from hops.schema.scenario import DEFAULT_STACK

        self.catalog = catalog or Catalog.load()
        self.model, self.pools = dict(model), tuple(pools)
        self.global_batch, self.micro_batch_size = global_batch, micro_batch_size
        self.stack, self.sharding, self.cross_node = stack or DEFAULT_STACK, sharding, cross_node
        self.stack_options = dict(stack_options or {})
        self.max_pipeline, self.max_orders, self.span, self.exact_limit = max_pipeline, max_orders, span, exact_limit
        # a mixture of experts spread over e data-parallel replicas: only multiples of e are plans
        self.expert_parallel = int((self.model.get("moe") or {}).get("expert_parallel") or 1)
        self._check()
        probe = self.base_doc()
        probe["pipeline"]["stages"] = [{"device": "p", "layers": self.model["layers"]}]
        probe["hardware"]["devices"] = [{"id": "p", "gpu": self.pools[0].gpu, "node": "n"}]
        sc = load_scenario(probe, self.catalog)
        self.arch = sc.architecture
        self.nbytes = self.catalog.model["bytes_per_element"]["bf16"]
        self._tables: dict = {}
        self._levels: dict = {}
        self._topology = None

    # ------------------------------------------------------------------ inputs
    def _check(self) -> None:
        from hops.errors import ScenarioError

        for i, pool in enumerate(self.pools):
            if pool.gpu not in self.catalog.devices:
                raise ScenarioError(f"inventory[{i}].gpu", f"got {pool.gpu!r}; expected one of "
                                                           f"{', '.join(self.catalog.devices)}")
            if pool.host is not None and pool.host not in self.catalog.hosts:
                raise ScenarioError(f"inventory[{i}].host", f"got {pool.host!r}; expected one of "
                                                            f"{', '.join(self.catalog.hosts)}")
        if not self.pools:
            raise ScenarioError("inventory", "expected at least one pool of nodes")
        for key in ("layers", "hidden_dim", "heads", "seq_len"):
            if not self.model.get(key):
                raise ScenarioError(f"model.{key}", "missing; the planner needs the architecture's layers, "
                                                     "hidden_dim, heads and seq_len")
        if self.stack not in self.catalog.stacks:
            raise ScenarioError("training.stack", f"got {self.stack!r}; expected one of {', '.join(self.catalog.stacks)}")
        if self.cross_node not in self.catalog.interconnects:
            raise ScenarioError("training.cross_node", f"got {self.cross_node!r}; expected one of "
                                                       f"{', '.join(self.catalog.interconnects)}")

    def base_doc(self) -> dict:
        return {"simulation": {"batches": 2, "microbatches": 1, "micro_batch_size": self.micro_batch_size, "seed": 0},
                "pipeline": {"schedule": "1f1b", "stack": self.stack, "stack_options": dict(self.stack_options),
                             "model": dict(self.model), "stages": []},
                "hardware": {"devices": [], "interconnect": {"cross_node": self.cross_node}},
                "optimizer": {"enabled": True, "data_parallel": {"degree": self.expert_parallel,
                                                                 "sharding": self.sharding}}}

    def tp_options(self, k: int) -> list[int]:
        pool = self.pools[k]
        heads, kv = self.model["heads"], self.model.get("kv_heads") or self.model["heads"]
        link = pool.host is not None and self.catalog.hosts[pool.host].get("gpu_link")
        out, t = [], 1
        while t <= pool.gpus_per_node:
            if pool.gpus_per_node % t == 0 and heads % t == 0 and kv % t == 0 and (t == 1 or link):
                out.append(t)
            t *= 2
        return out

    def dp_options(self, dp: int | None = None) -> list[int]:
        """Degrees that split the batch into whole microbatches, that some pool can host, and that
        a mixture of experts' expert parallelism divides."""
        from hops.errors import ScenarioError

        rows = self.global_batch // self.micro_batch_size
        most = max(p.gpus for p in self.pools)
        e = self.expert_parallel
        if dp is not None and dp % e:
            raise ScenarioError("training.data_parallel", f"degree {dp}: expected a multiple of "
                                                          f"model.moe.expert_parallel ({e})")
        if dp is not None:
            if dp > most or self.global_batch % self.micro_batch_size or rows % dp:
                have = ", ".join(f"{p.gpus} x {p.gpu}" for p in self.pools)
                raise ScenarioError("training.data_parallel",
                                    f"degree {dp}: the inventory ({have}) cannot supply {dp} replicas of one pipeline "
                                    f"of {rows} micro-batches per step; expected a degree of at most {most} that "
                                    f"divides global_batch / micro_batch_size")
            return [dp]
        return [d for d in range(e, most + 1, e) if rows % d == 0 and self.global_batch % self.micro_batch_size == 0]

    def table(self, k: int, tp: int) -> _GroupTable:
        key = (k, tp)
        if key not in self._tables:
            self._tables[key] = _GroupTable(self, k, tp)
        return self._tables[key]

    # ------------------------------------------------------------------ layout of a replica
    def device_ids(self, stages) -> list[list[str]]:
        """GPU ids of replica 0's stages: each pool's groups fill its nodes in order."""
        used, out = {}, []
        for k, tp in stages:
            j = used.get(k, 0)
            used[k] = j + 1
            per_node = self.pools[k].gpus_per_node // tp
            node = j // per_node
            slot = (j % per_node) * tp
            out.append([f"p{k}n{node}g{slot + i}" for i in range(tp)])
        return out

    def topology(self) -> Topology:
        """One Topology over the whole inventory (hops.model.hardware's link rules, host caps included);
        a host without a gpu_link joins its GPUs over PCIe."""
        if self._topology is None:
            from types import SimpleNamespace

            from hops.scenario import DeviceSpec, LinkOverride

            devices, links = [], []
            pcie = dict(self.catalog.interconnects["pcie"])
            for k, pool in enumerate(self.pools):
                has_link = pool.host is not None and self.catalog.hosts[pool.host].get("gpu_link")
                for n in range(pool.nodes):
                    ids = [f"p{k}n{n}g{g}" for g in range(pool.gpus_per_node)]
                    devices += [DeviceSpec(d, pool.gpu, f"p{k}n{n}", 0, pool.host) for d in ids]
                    if not has_link:
                        links += [LinkOverride(a, b, pcie) for a in ids for b in ids if a != b]
            fake = SimpleNamespace(devices=devices, stack=self.stack, stack_options=self.stack_options,
                                   device_overrides={}, same_node=None, cross_node=self.cross_node, links=links)
            self._topology = Topology(fake, self.catalog)
        return self._topology

    def transfers_ms(self, stages) -> float:
        """Forward and backward messages between neighbouring stages of a sequence, one microbatch each."""
        ids = self.device_ids(stages)
        msg = self.micro_batch_size * self.arch.seq_len * self.arch.hidden * self.nbytes / 1e6
        topo = self.topology()
        total = 0.0
        for a, b in zip(ids, ids[1:]):
            total += topo.link(a[0], b[0]).transfer_ms(msg) + topo.link(b[0], a[0]).transfer_ms(msg)
        return total

    @staticmethod
    def check_schedules(schedules: Sequence[str]) -> None:
        """One line naming `training.schedules` for a name no scheduler has, or for a schedule
        that runs several model chunks per stage (zb_v, interleaved_1f1b, interleaved_zb): the
        search sizes and splits one chunk per stage, so such a plan would first fail inside the
        simulation of its own scenario, under a field the request does not have."""
        from hops.errors import ScenarioError
        from hops.schedulers import resolve_scheduler

        if not schedules:
            raise ScenarioError("training.schedules", "expected at least one schedule")
        for i, name in enumerate(schedules):
            try:
                cls = resolve_scheduler(name)
            except KeyError as exc:
                raise ScenarioError(f"training.schedules[{i}]", str(exc.args[0])) from None
            v = getattr(cls, "default_virtual_stages", 1)
            if v > 1:
                raise ScenarioError(f"training.schedules[{i}]", f"{name} runs {v} model chunks per stage, and the "
                                    f"planner plans one; plan with 1f1b or zb_h1, write the plan with --scenario "
                                    f"and run it with pipeline.schedule={name} (each stage's layers a multiple of {v})")

    # ------------------------------------------------------------------ memory levels
    def memory_key(self, schedule: str) -> str | None:
        """What a split for `schedule` is sized at: None, the plain level (held()), or the schedule
        itself where its order holds more than 1F1B's count: where it splits the backward, since
        its microbatches wait for their W, and GPipe, whose stages all hold every microbatch. One
        whose split is decided at configure time (hetero_search), or that is unknown (the
        simulation refuses it), keeps the plain level."""
        from hops.schedulers import resolve_scheduler
        from hops.schedulers.classic import GPipe

        try:
            cls = resolve_scheduler(schedule)
        except KeyError:
            return None
        return schedule if cls.split_backward is True or issubclass(cls, GPipe) else None

    def states(self, key: str, p: int, m: int) -> list | None:
        """Per stage, (the (held, pending) counts at the peaks of the schedule's order, the most it
        may hold): read from a static order (ZB-H1's stage k holds p, k + 1 of them past their
        B), or, for zb_1p / zb_2p / zb_auto, their memory limit, which they keep under the run's
        weights or refuse, and which fewer microbatches than the limit, all waiting for their W,
        may not reach. None where the order is known only at run time. Only the counts no other
        count dominates are kept: a pending microbatch weighs at least 1."""
        from hops.schedulers import StaticOrderScheduler, resolve_scheduler
        from hops.schedulers.zb_auto import ZBAuto

        if (key, p, m) not in self._levels:
            cls = resolve_scheduler(key)
            if issubclass(cls, ZBAuto):
                hit = [([(m, m)], cls().memory_limit(p))] * p
            elif issubclass(cls, StaticOrderScheduler):
                hit = []
                for s in range(p):
                    held = pending = 0
                    seen = set()
                    for phase, _ in cls().stage_order(s, p, m):
                        held += (phase == "F") - (phase in ("W", "BW"))
                        pending += (phase == "B") - (phase == "W")
                        seen.add((held, pending))
                    top = [a for a in seen if not any(b != a and b[0] >= a[0] and b[1] >= a[1] for b in seen)]
                    hit.append((sorted(top), math.inf))
            else:
                hit = None
            self._levels[(key, p, m)] = hit
        return self._levels[(key, p, m)]

    def held(self, key: str | None, tab: "_GroupTable", n: int, pos: str, i: int, p: int, m: int) -> float:
        """Microbatch activations stage i of p holds at its peak, n layers in this position.

        At the plain level, 1F1B's min(p - i, m) (the level the search space states). A
        split-backward schedule holds more on its later stages (ZB-H1 p on every one, zb_1p /
        zb_2p / zb_auto up to their limit), and under full recomputation its deferred W's keep
        ~16 times a microbatch's stash and the LM head's logits gradient on the last stage, so
        sizing it at 1F1B's count let the search keep splits its own simulation puts over
        capacity and spend the verified places on them; its order's peak is taken instead, each
        microbatch between its B and its W weighing what W keeps (the engine's peak_held: its
        stash alone without full recomputation), inf where it refuses."""
        states = None if key is None else self.states(key, p, m)
        if states is None:
            return min(p - i, m)
        top, most = states[i]
        w = tab.pending_weight(n, pos)
        if w > most + 1e-9:
            return math.inf
        return min(most, max(c + (w - 1.0) * k for c, k in top))

    # ------------------------------------------------------------------ the split
    def split(self, stages, dp: int, m: int, key: str | None = None):
        """(layers, estimate ms, memory per GPU, capacity) of the best split for this stage
        sequence, or None when the model does not fit. ``key``: the memory level (memory_key)."""
        import numpy as np

        p, total = len(stages), self.arch.layers
        if p > total:
            return None
        tabs = [self.table(k, tp) for k, tp in stages]
        pos = ["only"] if p == 1 else ["first"] + ["mid"] * (p - 2) + ["last"]
        t = np.full((p, total + 1), np.inf)
        e = np.full((p, total + 1), np.inf)
        for i, (tab, ps) in enumerate(zip(tabs, pos)):
            for n in range(1, total - (p - 1) + 1):
                if tab.memory(n, ps, dp, self.held(key, tab, n, ps, i, p, m)) > tab.capacity:
                    break
                t[i, n], e[i, n] = tab.time(n, ps), tab.end_cost(n, ps, dp)
        if not np.isfinite(t[:, 1]).all():
            return None
        thetas = np.unique(t[np.isfinite(t)])
        phis = np.unique(e[np.isfinite(e)])
        exact = len(thetas) * len(phis) <= self.exact_limit
        if not exact:  # the min-max split's threshold by bisection (feasibility grows with theta), then span above it
            lo, hi = 0, len(thetas) - 1
            if self._min_sum(t, e, thetas[hi], np.inf)[0] == np.inf:
                return None
            while lo < hi:
                mid = (lo + hi) // 2
                if self._min_sum(t, e, thetas[mid], np.inf)[0] < np.inf:
                    hi = mid
                else:
                    lo = mid + 1
            thetas, phis = thetas[lo:lo + self.span], np.array([np.inf])
        best = None
        for th in thetas:
            for ph in phis:
                s, split = self._min_sum(t, e, th, ph)
                if s == np.inf:
                    continue
                ts = [t[i, n] for i, n in enumerate(split)]
                est = (m - 1) * max(ts) + s + max(e[i, n] for i, n in enumerate(split))
                if best is None or est < best[1] - 1e-12:
                    best = (split, est)
        if best is None:
            return None
        split, est = best
        mem = [tab.memory(n, ps, dp, self.held(key, tab, n, ps, i, p, m))
               for i, (tab, ps, n) in enumerate(zip(tabs, pos, split))]
        return split, est + self.transfers_ms(stages), mem, [tab.capacity for tab in tabs]

    @staticmethod
    def _min_sum(t, e, theta, phi):
        """min sum_k t[k, n_k] over contiguous splits with every t <= theta and e <= phi (a DP over
        the layers used so far, one stage at a time, vectorised over the stage's layer counts)."""
        import numpy as np

        p, width = t.shape
        total = width - 1
        ok = (t <= theta) & (e <= phi)
        used = np.arange(width)
        dp = np.full(width, np.inf)
        dp[0] = 0.0
        choices = []
        for i in range(p):
            ns = np.nonzero(ok[i])[0]
            if not len(ns):
                return np.inf, None
            before = used[None, :] - ns[:, None]  # layers used before this stage, per (n, layers after)
            cand = np.where(before >= 0, dp[np.maximum(before, 0)], np.inf) + t[i, ns][:, None]
            pick = cand.argmin(axis=0)
            dp = cand[pick, used]
            choices.append(ns[pick])
        if not np.isfinite(dp[total]):
            return np.inf, None
        split, left = [], total
        for i in range(p - 1, -1, -1):
            n = int(choices[i][left])
            split.append(n)
            left -= n
        return float(dp[total]), split[::-1]

    # ------------------------------------------------------------------ the search
    def configurations(self, dp: int | None = None):
        """(dp, stage sequence) of the search space (see the section comment)."""
        import itertools

        for d in self.dp_options(dp):
            options = []
            for k, pool in enumerate(self.pools):
                opts = [None] + [tp for tp in self.tp_options(k) if pool.gpus % (d * tp) == 0]
                options.append(opts)
            for choice in itertools.product(*options):
                counts = [(k, tp, self.pools[k].gpus // (d * tp)) for k, tp in enumerate(choice) if tp is not None]
                p = sum(c for _, _, c in counts)
                if not counts or p > min(self.max_pipeline, self.arch.layers):
                    continue
                kinds = [(k, tp) for k, tp, c in counts for _ in range(c)]
                n_orders = math.factorial(p)
                for _, _, c in counts:
                    n_orders //= math.factorial(c)
                if n_orders <= self.max_orders:
                    seqs = _multiset_permutations(kinds)
                else:
                    seqs = (tuple(x for blk in order for x in [blk[:2]] * blk[2])
                            for order in itertools.permutations(counts))
                for seq in seqs:
                    yield d, tuple(seq)

    def candidate(self, d: int, seq, key: str | None = None) -> Plan3D | None:
        m = self.global_batch // (self.micro_batch_size * d)
        r = self.split(seq, d, m, key)
        if r is None:
            return None
        layers, est, mem, cap = r
        return Plan3D(d, tuple(seq), list(layers), m, est, mem, cap, self.pools,
                      micro_batch_size=self.micro_batch_size)

    def scenario(self, plan: Plan3D, schedule: str = "1f1b", batches: int = 2) -> dict:
        """The scenario of one replica (the simulator runs one pipeline; DP is its degree)."""
        doc = self.base_doc()
        doc["simulation"].update(batches=batches, microbatches=plan.microbatches)
        doc["pipeline"]["schedule"] = schedule
        ids = self.device_ids(plan.stages)
        doc["pipeline"]["stages"] = [({"devices": g} if len(g) > 1 else {"device": g[0]}) | {"layers": n}
                                     for g, n in zip(ids, plan.layers)]
        pools = {}
        for (k, _), g in zip(plan.stages, ids):
            for d in g:
                pools[d] = k
        doc["hardware"]["devices"] = [{"id": d, "gpu": self.pools[k].gpu, "node": d.rsplit("g", 1)[0],
                                       **({"host": self.pools[k].host} if self.pools[k].host else {})}
                                      for d, k in pools.items()]
        links = []
        for a, b in zip(ids, ids[1:]):  # neighbours in a node without a gpu_link: PCIe, as topology() has it
            if self.topology().link(a[0], b[0]).kind == "measured":
                links += [{"src": a[0], "dst": b[0], "type": "pcie"}, {"src": b[0], "dst": a[0], "type": "pcie"}]
        if links:
            doc["hardware"]["links"] = links
        doc["optimizer"]["data_parallel"]["degree"] = plan.dp
        return doc

    def simulate(self, plan: Plan3D, schedule: str) -> Plan3D:
        import copy

        from hops.api import simulate

        r = simulate(self.scenario(plan, schedule), catalog=self.catalog)
        out = copy.copy(plan)
        out.schedule = schedule
        out.simulated_ms = r.summary["makespan_ms"] / r.summary["window"]["iterations"]
        out.over_capacity = list(r.summary["memory_over_capacity"])
        out.memory_mb = [r.summary["peak_memory_mb"][g[0]] for g in self.device_ids(plan.stages)]
        return out

    def plan(self, *, schedules: Sequence[str] = ("1f1b", "zb_h1"), dp: int | None = None, verify_top: int = 3,
             verify: bool = True) -> Plan3DResult:
        from hops.errors import HopsError

        self.check_schedules(schedules)
        # each schedule's split is sized at its own memory level; schedules that share one share
        # the search, and a split found at several levels is simulated under all their schedules
        groups: dict = {}
        for s in schedules:
            groups.setdefault(self.memory_key(s), []).append(s)
        found, n = {}, 0
        for d, seq in self.configurations(dp):
            n += 1
            for key, names in groups.items():
                c = self.candidate(d, seq, key)
                if c is None:
                    continue
                same = found.get((d, seq, tuple(c.layers)))
                if same is None:
                    c.schedules = tuple(names)
                    found[(d, seq, tuple(c.layers))] = c
                else:
                    same.schedules = tuple(x for x in schedules if x in same.schedules or x in names)
        cands = list(found.values())
        if not cands:
            raise HopsError("no plan fits the model in the inventory's memory (every pool, TP degree and DP "
                            "degree tried)")
        cands.sort(key=lambda c: c.estimate_ms / c.samples_per_iteration)
        single: dict[str, Plan3D] = {}
        for c in cands:  # estimates, best first
            used = {k for k, _ in c.stages}
            if len(used) == 1:
                single.setdefault(self.pools[used.pop()].name, c)
        top = cands[:verify_top]
        uniform = self.uniform(top[0])
        if not verify:
            return Plan3DResult(top[0], top, uniform, single, n)

        def best_run(plan):
            runs = [self.simulate(plan, s) for s in plan.schedules or schedules]
            fits = [r for r in runs if not r.over_capacity] or runs
            return max(fits, key=lambda r: r.samples_per_s)

        verified = sorted((best_run(c) for c in top), key=lambda r: (bool(r.over_capacity), -r.samples_per_s))
        best = verified[0]
        uniform = self.uniform(best)
        if uniform is not None:
            uniform = best_run(uniform)
        single = {name: best_run(c) for name, c in single.items()}
        return Plan3DResult(best, verified, uniform, single, n)

    def uniform(self, plan: Plan3D) -> Plan3D | None:
        """The plan's stages with the layers split evenly (the first stages take the remainder)."""
        p, total = len(plan.stages), self.arch.layers
        layers = [total // p + (1 if k < total % p else 0) for k in range(p)]
        pos = ["only"] if p == 1 else ["first"] + ["mid"] * (p - 2) + ["last"]
        tabs = [self.table(k, tp) for k, tp in plan.stages]
        ts = [tab.time(n, ps) for tab, n, ps in zip(tabs, layers, pos)]
        es = [tab.end_cost(n, ps, plan.dp) for tab, n, ps in zip(tabs, layers, pos)]
        est = (plan.microbatches - 1) * max(ts) + sum(ts) + max(es) + self.transfers_ms(plan.stages)
        keys = {self.memory_key(s) for s in plan.schedules} or {None}  # each stage at its most demanding
        mem = [max(tab.memory(n, ps, plan.dp, self.held(key, tab, n, ps, i, p, plan.microbatches)) for key in keys)
               for i, (tab, n, ps) in enumerate(zip(tabs, layers, pos))]
        return Plan3D(plan.dp, plan.stages, layers, plan.microbatches, est, mem, [t.capacity for t in tabs],
                      self.pools, plan.schedule, micro_batch_size=self.micro_batch_size, schedules=plan.schedules)


def plan_3d(model: Mapping, pools: Sequence[Pool], *, schedules=("1f1b", "zb_h1"), dp: int | None = None,
            verify_top: int = 3, verify: bool = True, **kwargs) -> Plan3DResult:
    """Planner3D(model, pools, **kwargs).plan(schedules=..., dp=..., verify_top=..., verify=...)."""
    return Planner3D(model, pools, **kwargs).plan(schedules=schedules, dp=dp, verify_top=verify_top, verify=verify)
