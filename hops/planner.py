"""Placement planner: stage order and layers per stage for a device list and a model.

Why: on a mixed cluster the uniform partition (same layers on every device, devices in the
order given) leaves the fast devices waiting on the slow ones, and the last stage also
carries the LM head. The planner picks the order of devices along the pipeline and an
uneven contiguous split of the layers so that the slowest stage is as fast as possible,
within each device's memory, then checks its best candidates with the simulator.

Model of a candidate (same equations as the simulator, so the ranking agrees with it):
- stage times F and BW for (device, layers, first/last) come from hops.compute through
  tiny scenarios (cached), so embedding, LM head, dispatch floor and launch overhead count;
- memory per stage = weights (12 h^2 bytes per layer, plus the h x V embedding on the
  first stage and the LM head's copy of it on the last) x (1 + optimizer bytes per weight byte)
  + in-flight activations (p - s microbatches on stage s, the 1F1B / ZB-H1 level, each
  layers x s x h x micro-batch x activation bytes), the accounting hops.api reports;
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

from .compute import ComputeModel
from .hardware import Catalog, Topology
from .scenario import load_scenario


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
        self.opt_factor = 1.0 + m["optimizer_bytes_per_weight_byte"]
        self.act_layer_mb = model.seq * model.hidden * model.micro_batch * m["activation_bytes_per_token_hidden"] / 1e6
        self.msg_mb = model.micro_batch * model.seq * model.hidden * nbytes / 1e6
        self.layer_tflop = 24 * model.seq * model.hidden ** 2 * model.micro_batch / 1e12
        self.capacity = {}
        for d in devices:
            gb = d.overrides.get("memory_gb", catalog.devices[d.gpu]["memory_gb"])
            self.capacity[d.kind] = float(gb) * 1000.0
        self._times: dict[tuple, tuple[float, float]] = {}
        self._filled: set = set()

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
        in_flight = min(p - stage, self.model.microbatches)
        return weights * self.opt_factor + in_flight * n * self.act_layer_mb

    def max_layers_by_memory(self, dev: Device, stage: int, p: int, reserve_mb: float) -> int:
        cap = self.capacity[dev.kind] - reserve_mb
        first, last = stage == 0, stage == p - 1
        fixed = ((self.embed_mb if first else 0.0) + (self.embed_mb if last else 0.0)) * self.opt_factor
        per = self.layer_weight_mb * self.opt_factor + min(p - stage, self.model.microbatches) * self.act_layer_mb
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
        from .schedulers.base import PipelineMeta
        from .schedulers.hetero_search import builtin_orders, simulate_policy, static_policy

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
        from .api import simulate

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

    def plan(self, *, schedule: str = "1f1b", top_orders: int = 6, verify_top: int = 3, max_orders: int = 720,
             verify: bool = True) -> PlanResult:
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
