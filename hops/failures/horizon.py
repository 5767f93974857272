"""Long-horizon failure model: weeks of training in iteration units, event by event.

The detailed engine simulates a few steady-state iterations once; its iteration
time (``iteration_ms``, fault-free) is the unit of progress here. Every fault
process is drawn up front over the whole horizon, each from its own Generator
(same seed, same fault sequence), and the job is then advanced from one fault
event to the next in closed form: whole checkpoint cycles (``every`` iterations
plus one blocking write) are skipped arithmetically, so the cost grows with the
number of fault events, not with the number of iterations or GPUs.

Job model (synchronous data/pipeline-parallel training: any rank stopping stops all):

* restart failures (devices, nodes, job-level software faults, links with
  ``effect: restart``): the job loses the iterations since its last committed
  checkpoint (a checkpoint being written is lost too) and is down for
  detection + restart (+ replace, for hardware failures with no free hot spare).
  A failure while already down restarts the recovery clock.
* stall failures (the ``links`` section, components with ``effect: stall``):
  progress freezes until repair, nothing is lost.
* planned interruptions: the job writes a checkpoint, then is down for
  restart + extra; nothing is lost.
* slowdowns, as time-weighted multipliers of the iteration time (the
  approximation: no detailed re-simulation per episode):
  - stragglers (fixed or drawn per device): a synchronous job runs at its
    slowest rank, so the factor is the largest one in the cluster (or what
    the caller measured with the engine, ``straggler_slowdown``);
  - throttling episodes: while at least one device is throttled, iteration
    time x ``factor`` (the throttled stage sits on the critical path);
  - link degradation: while at least one link is degraded, iteration time x
    ``1 + comm_fraction * (1 / bandwidth_factor - 1)``, where ``comm_fraction``
    is the share of the iteration that scales with that link's bandwidth.
  Overlapping episodes of one kind do not compound (the worst one dominates);
  the kinds multiply.

Wall-clock accounting is exact: horizon = useful + lost + slowdown + downtime +
checkpoint overhead, where useful/lost are measured in fault-free iteration
time and slowdown is the extra compute time spent at reduced speed.
goodput_ratio = useful / horizon (the "effective training time" ratio).
"""
from __future__ import annotations

import math
import zlib
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np

from hops.model import physical
from hops.failures.config import Component, FailureConfig

MS_PER_HOUR = 3_600_000.0
MS_PER_MIN = 60_000.0
# Streams are grandchildren of the engine's "failure" child (index 3 of SeedSequence(seed).spawn)
# under a tag of our own, one per fault kind (and per named component), so adding a component or
# changing one rate never shifts the draws of another.
_STREAM_ROOT = (3, 0x46414C54)
STREAMS = {"device": 1, "component": 2, "planned": 3, "link_failure": 4, "link_degradation": 5,
           "throttling": 6, "stragglers": 7}
INTERRUPT_KINDS = ("device_failure", "job_failure", "link_failure", "planned")
_KIND_OF_UNIT = {"gpu": "device_failure", "node": "device_failure", "link": "link_failure", "job": "job_failure"}


def fault_rng(seed: int, stream: str, name: str | None = None) -> np.random.Generator:
    """The Generator for one fault stream (and one named component) of a scenario seed."""
    key = _STREAM_ROOT + (STREAMS[stream],) + ((zlib.crc32(name.encode()),) if name else ())
    return np.random.default_rng(np.random.SeedSequence(entropy=int(seed), spawn_key=key))


# --------------------------------------------------------------------------- results
@dataclass(frozen=True)
class FaultEvent:
    """One interruption (failure or planned stop) as it hit the job."""

    t_ms: float
    kind: str          # device_failure | job_failure | link_failure | planned
    component: str
    hardware: bool
    effect: str        # restart | stall | planned
    lost_ms: float     # work rolled back, in fault-free iteration time
    iteration: float   # training progress (iterations) just before the event


@dataclass(frozen=True)
class HorizonResult:
    horizon_ms: float
    iteration_ms: float
    checkpoint_every: int            # iterations between checkpoints
    straggler_slowdown: float
    events: tuple[FaultEvent, ...]
    counts_by_kind: Mapping[str, int]
    counts_by_component: Mapping[str, int]
    downtime_ms: float
    downtime_by_kind: Mapping[str, float]
    lost_work_ms: float
    checkpoint_overhead_ms: float
    checkpoints: int
    slowdown_ms: float
    useful_ms: float
    iterations: float                # completed (useful) iterations at the end of the horizon
    iterations_without_faults: float
    job_mtbf_hours: float            # mean time between unexpected restart failures (inf if none)
    progress_t_hours: np.ndarray = field(repr=False)
    progress_iterations: np.ndarray = field(repr=False)
    samples_per_iteration: float | None = None

    @property
    def goodput_ratio(self) -> float:
        return min(1.0, self.useful_ms / self.horizon_ms)  # useful == horizon may round a hair above it

    @property
    def failure_count(self) -> int:
        return sum(n for k, n in self.counts_by_kind.items() if k.endswith("_failure"))

    @property
    def throughput_without_faults(self) -> float:
        """Iterations per second with no faults (the detailed engine's steady state)."""
        return 1000.0 / self.iteration_ms

    @property
    def throughput_with_faults(self) -> float:
        return self.iterations / (self.horizon_ms / 1000.0)


# --------------------------------------------------------------------------- fault processes
def _arrivals(rng: np.random.Generator, rate_per_ms: float, horizon_ms: float) -> np.ndarray:
    """Poisson process times in [0, horizon) (drawn in blocks; deterministic per Generator)."""
    if rate_per_ms <= 0:
        return np.zeros(0)
    mean = rate_per_ms * horizon_ms
    out, t = [], 0.0
    while t < horizon_ms:
        block = t + np.cumsum(rng.exponential(1.0 / rate_per_ms, size=int(mean + 6 * math.sqrt(mean) + 16)))
        out.append(block)
        t = float(block[-1])
    times = np.concatenate(out)
    return times[times < horizon_ms]


def _failure_times(rng, mtbf_hours: np.ndarray, dist: str, shape: float, horizon_ms: float):
    """Failure times (ms) and unit index for independent units, each renewed on failure."""
    mtbf_ms = np.asarray(mtbf_hours, dtype=np.float64) * MS_PER_HOUR
    n = len(mtbf_ms)
    if n == 0:
        return np.zeros(0), np.zeros(0, dtype=np.int64)
    if dist == "exponential":
        rates = 1.0 / mtbf_ms
        times = _arrivals(rng, float(rates.sum()), horizon_ms)
        if np.all(mtbf_ms == mtbf_ms[0]):
            units = rng.integers(n, size=len(times))
        else:
            units = rng.choice(n, size=len(times), p=rates / rates.sum())
        return times, units
    scale = mtbf_ms / math.gamma(1.0 + 1.0 / shape)
    nxt = scale * rng.weibull(shape, size=n)
    times, units = [], []
    live = np.flatnonzero(nxt < horizon_ms)
    while len(live):
        times.append(nxt[live])
        units.append(live)
        nxt[live] += scale[live] * rng.weibull(shape, size=len(live))
        live = live[nxt[live] < horizon_ms]
    if not times:
        return np.zeros(0), np.zeros(0, dtype=np.int64)
    t, u = np.concatenate(times), np.concatenate(units)
    order = np.argsort(t, kind="stable")
    return t[order], u[order]


def cluster_units(cfg: FailureConfig, n_devices: int) -> dict[str, int]:
    """How many units each `per` refers to: GPUs, nodes, links, and the job itself."""
    gpus = cfg.devices.count or int(n_devices)
    return {"gpu": gpus, "node": -(-gpus // cfg.devices.per_node), "link": cfg.links.count or gpus, "job": 1}


def _device_mtbf(cfg: FailureConfig, gpus: int, device_mtbf_hours) -> np.ndarray | None:
    """Per-GPU MTBF for the whole-device process, tiled over the cluster (DP replicas of the pipeline)."""
    if device_mtbf_hours is not None:
        base = np.asarray(device_mtbf_hours, dtype=np.float64).ravel()
        if len(base) == 0 or np.any(base <= 0):
            raise ValueError("device_mtbf_hours must be a non-empty array of positive hours")
        return np.resize(base, gpus)
    m = cfg.devices.mtbf_hours
    if m is None:
        return None
    if isinstance(m, (int, float)):
        return np.full(gpus, float(m))
    raise ValueError("failure.devices.mtbf_hours is per preset/device: pass device_mtbf_hours "
                     "(see resolve_device_mtbf)")


def resolve_device_mtbf(cfg: FailureConfig, devices: Sequence[tuple[str, str]],
                        preset_mtbf_hours: Mapping[str, float]) -> np.ndarray:
    """MTBF per pipeline device from (device id, gpu type) pairs: device id key, then gpu type key,
    then ``default``, then the hardware preset's ``mtbf_hours``."""
    m = cfg.devices.mtbf_hours
    out = []
    for dev, gpu in devices:
        if isinstance(m, (int, float)):
            out.append(float(m))
        elif isinstance(m, Mapping) and dev in m:
            out.append(m[dev])
        elif isinstance(m, Mapping) and gpu in m:
            out.append(m[gpu])
        elif isinstance(m, Mapping) and "default" in m:
            out.append(m["default"])
        elif gpu in preset_mtbf_hours:
            out.append(float(preset_mtbf_hours[gpu]))
        else:
            from hops.errors import ScenarioError
            raise ScenarioError("failure.devices.mtbf_hours", f"no MTBF for device {dev!r} (gpu {gpu!r})")
    return np.asarray(out, dtype=np.float64)


def job_mtbf_hours(cfg: FailureConfig, n_devices: int, device_mtbf_hours=None) -> float:
    """Mean time between unexpected job restarts (renewal-mean rates summed over all units)."""
    units = cluster_units(cfg, n_devices)
    rate = 0.0
    dev = _device_mtbf(cfg, units["gpu"], device_mtbf_hours)
    if dev is not None:
        rate += float(np.sum(1.0 / dev))
    for c in cfg.components:
        if c.effect == "restart":
            rate += units[c.per] / c.mtbf_hours
    return 1.0 / rate if rate > 0 else math.inf


def young_daly_interval_minutes(write_minutes: float, mtbf_hours: float) -> float:
    """First-order optimal checkpoint interval sqrt(2 * write cost * MTBF) (Young 1974, Daly 2006)."""
    return math.sqrt(2.0 * write_minutes * mtbf_hours * 60.0)


def straggler_factors(cfg: FailureConfig, device_ids: Sequence[str],
                      rng: np.random.Generator | None = None, *, seed: int | None = None) -> dict[str, float]:
    """Per-device compute slowdown (>= 1) for the detailed engine: drawn stragglers, then fixed ones.

    Draws one uniform per device (in the given order) whether or not it becomes a straggler,
    so a device's factor does not depend on how many stragglers came before it.
    """
    from hops.errors import ScenarioError

    s = cfg.stragglers
    known = set(device_ids)
    for dev in s.fixed:
        if dev not in known:
            raise ScenarioError(f"failure.stragglers.fixed.{dev}",
                                f"unknown device; expected one of {', '.join(sorted(known))}")
    if rng is None:
        rng = fault_rng(0 if seed is None else seed, "stragglers")
    n = len(device_ids)
    hit = rng.random(n) < s.probability
    draw = rng.uniform(s.factor_range[0], s.factor_range[1], size=n)
    out = {d: (float(draw[i]) if hit[i] else 1.0) for i, d in enumerate(device_ids)}
    out.update({d: float(f) for d, f in s.fixed.items()})
    return out


def replica_stragglers(cfg: FailureConfig, device_ids: Sequence[str], replicas: int,
                       rng: np.random.Generator) -> dict[str, float]:
    """Per-device slowdown of the simulated pipeline when it stands for `replicas` data-parallel
    copies of itself: each copy's GPUs draw their own stragglers, and each pipeline GPU runs at
    the slowest of its copies.

    Why: the replicas meet at every iteration's gradient reduction, so a straggler in any of them
    sets the job's pace; drawing over one replica's GPUs alone would make a larger job no more
    likely to hold a straggler. Taking the slowest copy per position is exact while at most one
    replica holds drawn stragglers (the usual case at small probabilities) and an upper bound
    when stragglers in different replicas sit at different stages.

    The pipeline's own copy draws exactly as straggler_factors does (fixed stragglers name its
    devices), so adding replicas only ever slows a GPU. The other copies of a GPU are drawn in
    closed form, in O(devices) whatever the degree: k of them straggle, k ~ Binomial(replicas - 1,
    probability), and the slowest of k uniform factors on [lo, hi] is lo + (hi - lo) U^(1/k)."""
    own = straggler_factors(cfg, device_ids, rng)
    if replicas <= 1:
        return own
    s = cfg.stragglers
    n = len(device_ids)
    k = rng.binomial(replicas - 1, s.probability, size=n) if s.probability > 0 else np.zeros(n, dtype=np.int64)
    u = rng.random(n)
    lo, hi = s.factor_range
    others = np.where(k > 0, lo + (hi - lo) * u ** (1.0 / np.maximum(k, 1)), 1.0)
    return {d: max(own[d], float(others[i])) for i, d in enumerate(device_ids)}


def _cluster_straggler_slowdown(cfg: FailureConfig, gpus: int, rng: np.random.Generator) -> float:
    """Slowest rank of the whole cluster: max of the fixed factors and of the drawn ones."""
    s = cfg.stragglers
    worst = max([1.0, *s.fixed.values()])
    k = int(rng.binomial(gpus, s.probability)) if s.probability > 0 else 0
    if k:
        worst = max(worst, float(rng.uniform(s.factor_range[0], s.factor_range[1], size=k).max()))
    return worst


# --------------------------------------------------------------------------- the job
class _Job:
    """Job state between fault events; `advance` moves it forward in closed form."""

    def __init__(self, iteration_ms, every, write_ms, base_slow, throttle_factor, degrade_factor):
        self.iter_ms, self.every, self.write_ms = iteration_ms, every, write_ms
        self.base_slow, self.thr_f, self.deg_f = base_slow, throttle_factor, degrade_factor
        self.t = 0.0
        self.committed = 0.0      # iterations in the last committed checkpoint
        self.since = 0.0          # iterations computed since then
        self.write_left = 0.0     # ms left of a checkpoint write in progress
        self.pending_down = 0.0   # downtime to start when the current write commits (planned stop)
        self.down_until = 0.0
        self.down_kind = ""
        self.stall_until = 0.0
        self.n_thr = self.n_deg = 0
        self.compute_ms = self.ckpt_ms = self.stall_ms = 0.0
        self.down_ms: dict[str, float] = {}
        self.lost_iters = 0.0
        self.n_ckpt = 0
        self.pts_t, self.pts_i = [0.0], [0.0]

    @property
    def progress(self) -> float:
        return self.committed + self.since

    def point(self):
        self.pts_t.append(self.t)
        self.pts_i.append(self.progress)

    def slow(self) -> float:
        return self.base_slow * (self.thr_f if self.n_thr else 1.0) * (self.deg_f if self.n_deg else 1.0)

    def _commit(self):
        self.committed += self.since
        self.since = 0.0
        self.write_left = 0.0
        self.n_ckpt += 1
        if self.pending_down > 0:
            self.down_until = max(self.down_until, self.t + self.pending_down)
            self.down_kind = "planned"
            self.pending_down = 0.0
            self.point()

    def advance(self, t_to: float) -> None:
        while self.t < t_to:
            blocked = max(self.down_until, self.stall_until)
            if self.t < blocked:
                end = min(blocked, t_to)
                if self.t < self.down_until:
                    end = min(end, self.down_until)
                    self.down_ms[self.down_kind] = self.down_ms.get(self.down_kind, 0.0) + (end - self.t)
                else:
                    self.stall_ms += end - self.t
                self.t = end
                if end == blocked:
                    self.point()
                continue
            if self.write_left > 0:
                dt = min(self.write_left, t_to - self.t)
                self.ckpt_ms += dt
                self.t += dt
                self.write_left -= dt
                if self.write_left <= 1e-9:
                    self._commit()
                continue
            if self.since == 0.0:
                self.fast_forward(t_to)
            ims = self.iter_ms * self.slow()
            room = t_to - self.t
            need = (self.every - self.since) * ims if self.every else math.inf
            if need > room:
                self.since += room / ims
                self.compute_ms += room
                self.t = t_to
                continue
            self.t += need
            self.compute_ms += need
            self.since = float(self.every)
            if self.write_ms > 0:
                self.write_left = self.write_ms
                continue
            self._commit()


    def fast_forward(self, t_to: float) -> None:
        """Skip whole (compute `every` iterations, write) cycles that fit before t_to."""
        if (self.every is None or self.since != 0.0 or self.write_left > 0 or self.pending_down > 0
                or self.t < max(self.down_until, self.stall_until)):
            return
        ims = self.iter_ms * self.slow()
        cycle = self.every * ims + self.write_ms
        n = math.floor((t_to - self.t) / cycle) - 1
        if n > 0:
            self.t += n * cycle
            self.compute_ms += n * self.every * ims
            self.ckpt_ms += n * self.write_ms
            self.committed += n * self.every
            self.n_ckpt += n


def simulate_horizon(cfg: FailureConfig, *, iteration_ms: float, n_devices: int, seed: int,
                     straggler_slowdown: float | None = None, comm_fraction: float = 0.1,
                     device_mtbf_hours=None, samples_per_iteration: float | None = None,
                     checkpoint_interval_minutes: float | None = None) -> HorizonResult:
    """Advance a training job over cfg.horizon_hours of wall clock, fault event by fault event.

    iteration_ms: fault-free steady-state iteration time (from the detailed engine).
    n_devices: GPUs in the job when cfg.devices.count is not given (the pipeline's devices).
    straggler_slowdown: measured slowed/clean iteration ratio; None draws the cluster's stragglers.
    comm_fraction: share of an iteration that scales with one link's bandwidth (degradation).
    device_mtbf_hours: per-device MTBF (pipeline devices, tiled over the cluster), for
        ``mtbf_hours: preset`` or per-device mappings (see resolve_device_mtbf).
    checkpoint_interval_minutes: overrides cfg.checkpoint.interval_minutes (for sweeps).
    """
    if not iteration_ms > 0:
        raise ValueError(f"iteration_ms must be > 0, got {iteration_ms!r}")
    if not 0.0 <= comm_fraction <= 1.0:
        raise ValueError(f"comm_fraction must be in [0, 1], got {comm_fraction!r}")
    H = cfg.horizon_hours * MS_PER_HOUR
    units = cluster_units(cfg, n_devices)
    ck = cfg.checkpoint
    interval = ck.interval_minutes if checkpoint_interval_minutes is None else checkpoint_interval_minutes
    if not interval > 0:
        raise ValueError(f"checkpoint interval must be > 0, got {interval!r}")
    dev = _device_mtbf(cfg, units["gpu"], device_mtbf_hours)
    physical.check_horizon(cfg, units, dev, interval)
    every = max(1, round(interval * MS_PER_MIN / iteration_ms))

    # ---- draw every fault process up front, each from its own stream
    # (t_ms, order, kind, component, hardware, effect, duration_ms)
    ev: list[tuple] = []
    if dev is not None:
        t, _ = _failure_times(fault_rng(seed, "device"), dev, cfg.devices.distribution,
                              cfg.devices.weibull_shape, H)
        ev += [(x, 0, "device_failure", "device", True, "restart", 0.0) for x in t.tolist()]
    for c in cfg.components:
        t, _ = _failure_times(fault_rng(seed, "component", c.name), np.full(units[c.per], c.mtbf_hours),
                              c.distribution, c.weibull_shape, H)
        ev += [(x, 0, _KIND_OF_UNIT[c.per], c.name, c.hardware, c.effect, c.repair_minutes * MS_PER_MIN)
               for x in t.tolist()]
    lk = cfg.links
    if lk.mtbf_hours is not None:
        t, _ = _failure_times(fault_rng(seed, "link_failure"), np.full(units["link"], lk.mtbf_hours),
                              "exponential", 1.0, H)
        ev += [(x, 0, "link_failure", "link", True, "stall", lk.repair_minutes * MS_PER_MIN) for x in t.tolist()]
    pl = cfg.planned
    if pl.count:
        t = np.sort(fault_rng(seed, "planned").uniform(0.0, H, size=pl.count))
        ev += [(x, 0, "planned", "planned", False, "planned", 0.0) for x in t.tolist()]
    elif pl.interval_hours:
        step = pl.interval_hours * MS_PER_HOUR
        ev += [(k * step, 0, "planned", "planned", False, "planned", 0.0) for k in range(1, int(H // step) + 1)
               if k * step < H]
    episodes = {"link_degradation": 0, "throttling": 0}
    dg = lk.degradation
    if dg.rate_per_hour > 0 and dg.duration_minutes > 0:
        t = _arrivals(fault_rng(seed, "link_degradation"), dg.rate_per_hour * units["link"] / MS_PER_HOUR, H)
        episodes["link_degradation"] = len(t)
        d = dg.duration_minutes * MS_PER_MIN
        ev += [(x, 1, "link_degradation", "link", True, "slow+", 0.0) for x in t.tolist()]
        ev += [(x + d, -1, "link_degradation", "link", True, "slow-", 0.0) for x in t.tolist() if x + d < H]
    th = cfg.stragglers.throttling
    if th.rate_per_hour > 0 and th.duration_minutes > 0 and th.factor > 1:
        t = _arrivals(fault_rng(seed, "throttling"), th.rate_per_hour * units["gpu"] / MS_PER_HOUR, H)
        episodes["throttling"] = len(t)
        d = th.duration_minutes * MS_PER_MIN
        ev += [(x, 1, "throttling", "device", True, "slow+", 0.0) for x in t.tolist()]
        ev += [(x + d, -1, "throttling", "device", True, "slow-", 0.0) for x in t.tolist() if x + d < H]
    ev.sort(key=lambda e: (e[0], e[1]))  # at equal times episode ends (-1) come before starts

    if straggler_slowdown is None:
        straggler_slowdown = _cluster_straggler_slowdown(cfg, units["gpu"], fault_rng(seed, "stragglers"))
    if straggler_slowdown < 1.0:
        raise ValueError(f"straggler_slowdown must be >= 1, got {straggler_slowdown!r}")
    deg_f = 1.0 + comm_fraction * (1.0 / dg.bandwidth_factor - 1.0)

    # ---- run the job through the events
    job = _Job(iteration_ms, every, ck.write_minutes * MS_PER_MIN, straggler_slowdown, th.factor, deg_f)
    restart_ms = ck.restart_minutes * MS_PER_MIN
    detect_ms = ck.detection_minutes * MS_PER_MIN
    replace_ms = ck.replace_minutes * MS_PER_MIN
    spares = [0.0] * ck.hot_spares
    planned_ms = restart_ms + pl.extra_minutes * MS_PER_MIN
    out_events: list[FaultEvent] = []
    by_kind: dict[str, int] = {}
    by_comp: dict[str, int] = {}
    for t, order, kind, comp, hw, effect, dur in ev:
        job.advance(t)
        if effect == "slow+" or effect == "slow-":
            if kind == "throttling":
                job.n_thr += order
            else:
                job.n_deg += order
            continue
        by_kind[kind] = by_kind.get(kind, 0) + 1
        by_comp[comp] = by_comp.get(comp, 0) + 1
        before = job.progress
        lost = 0.0
        job.point()
        if effect == "restart":
            lost = job.since
            job.lost_iters += lost
            job.since = job.write_left = job.pending_down = 0.0
            extra = 0.0
            if hw and replace_ms > 0:
                free = next((k for k, at in enumerate(spares) if at <= t), None)
                if free is None:
                    extra = replace_ms
                else:
                    spares[free] = t + ck.spare_repair_hours * MS_PER_HOUR
            until = t + detect_ms + restart_ms + extra
            if until > job.down_until:
                job.down_until, job.down_kind = until, "unexpected"
        elif effect == "stall":
            job.stall_until = max(job.stall_until, t + dur)
        else:  # planned: checkpoint, then stop for maintenance
            if t < job.down_until:
                job.down_until = max(job.down_until, t + planned_ms)
            elif job.write_left > 0 or job.write_ms > 0:
                job.pending_down = planned_ms
                if job.write_left == 0:
                    job.write_left = job.write_ms
            else:
                job.pending_down = planned_ms
                job._commit()
        job.point()
        out_events.append(FaultEvent(t, kind, comp, hw, effect, lost * iteration_ms, before))
    job.advance(H)
    job.point()

    for k, n in episodes.items():
        if n:
            by_kind[k] = n
    total_iters = job.progress + job.lost_iters
    return HorizonResult(
        horizon_ms=H, iteration_ms=float(iteration_ms), checkpoint_every=every,
        straggler_slowdown=float(straggler_slowdown), events=tuple(out_events),
        counts_by_kind=dict(sorted(by_kind.items())), counts_by_component=dict(sorted(by_comp.items())),
        downtime_ms=sum(job.down_ms.values()) + job.stall_ms,
        downtime_by_kind={**{k: v for k, v in sorted(job.down_ms.items()) if k}, "stall": job.stall_ms},
        lost_work_ms=job.lost_iters * iteration_ms, checkpoint_overhead_ms=job.ckpt_ms, checkpoints=job.n_ckpt,
        slowdown_ms=max(0.0, job.compute_ms - total_iters * iteration_ms),
        useful_ms=job.progress * iteration_ms, iterations=job.progress,
        iterations_without_faults=H / iteration_ms,
        job_mtbf_hours=job_mtbf_hours(cfg, n_devices, device_mtbf_hours),
        progress_t_hours=np.asarray(job.pts_t) / MS_PER_HOUR, progress_iterations=np.asarray(job.pts_i),
        samples_per_iteration=samples_per_iteration,
    )


def summary_block(result: HorizonResult) -> dict:
    """The "failures" block of summary.json (JSON-ready, deterministic key order)."""
    r = result
    ev = r.events
    unexpected = [e for e in ev if e.effect == "restart"]
    planned = [e for e in ev if e.kind == "planned"]
    hw = sum(1 for e in unexpected if e.hardware)
    thr = {"iterations_per_s_without_faults": r.throughput_without_faults,
           "iterations_per_s_with_faults": r.throughput_with_faults}
    if r.samples_per_iteration:
        thr["samples_per_s_without_faults"] = r.throughput_without_faults * r.samples_per_iteration
        thr["samples_per_s_with_faults"] = r.throughput_with_faults * r.samples_per_iteration
    return {
        "count": r.failure_count,
        "by_kind": dict(r.counts_by_kind),
        "by_component": dict(r.counts_by_component),
        "interruptions": {"total": len(unexpected) + len(planned), "planned": len(planned),
                          "unexpected": len(unexpected), "hardware": hw,
                          "hardware_share_of_unexpected": hw / len(unexpected) if unexpected else 0.0},
        "downtime_ms": r.downtime_ms,
        "downtime_by_kind": dict(r.downtime_by_kind),
        "lost_work_ms": r.lost_work_ms,
        "checkpoint_overhead_ms": r.checkpoint_overhead_ms,
        "checkpoints": r.checkpoints,
        "slowdown_ms": r.slowdown_ms,
        "useful_ms": r.useful_ms,
        "horizon_ms": r.horizon_ms,
        "goodput_ratio": r.goodput_ratio,
        "iteration_ms": r.iteration_ms,
        "checkpoint_interval_iterations": r.checkpoint_every,
        "straggler_slowdown": r.straggler_slowdown,
        "iterations": {"completed": r.iterations, "without_faults": r.iterations_without_faults,
                       "lost": r.lost_work_ms / r.iteration_ms},
        "throughput": thr,
        "job_mtbf_hours": r.job_mtbf_hours if math.isfinite(r.job_mtbf_hours) else None,
    }
