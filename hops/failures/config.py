"""The `failure` section of a scenario: schema, defaults and strict validation.

Every mistake raises one ScenarioError whose path names the field
(``failure.checkpoint.interval_minutes: got 0; expected a number > 0``).
A missing section, ``null`` or ``enabled: false`` means "no failure model" and
parses to None; a section with content and no ``enabled`` key is enabled.

Schema (all keys optional unless marked; times in the unit their name says)::

    failure:
      enabled: true
      horizon_hours: 168            # wall-clock span the long-horizon model covers
      devices:                      # the cluster, and whole-device failures
        count: 16384                # GPUs in the job (default: the pipeline's devices)
        per_node: 8                 # GPUs per host, for `per: node` components
        mtbf_hours: 50000           # number | "preset" (hardware preset mtbf_hours)
                                    # | {default: h, <gpu type>: h, <device id>: h}
                                    # omitted: no whole-device failure process
        distribution: exponential   # exponential | weibull (time to failure per device)
        weibull_shape: 1.0          # k (k < 1 infant mortality, k > 1 wear-out)
      components:                   # finer per-component processes (each its own stream)
        - name: gpu_hbm             # required, unique
          per: gpu                  # gpu | node | link | job  (what one MTBF is per)
          mtbf_hours: 294912        # required, > 0, per unit
          distribution: exponential
          weibull_shape: 1.0
          hardware: true            # attribution (hardware vs software/unknown/maintenance)
          effect: restart           # restart (job restarts from checkpoint) | stall
          repair_minutes: 0         # stall only: how long transfers wait
      planned:                      # planned interruptions (maintenance, config pushes)
        count: 47                   # over the horizon, uniform random times
        interval_hours: null        # or: one every interval_hours (not both)
        extra_minutes: 0            # downtime on top of restart_minutes
      links:
        count: null                 # links in the job (default: one per GPU)
        mtbf_hours: null            # link failure: transfers stall until repaired
        repair_minutes: 30
        degradation:                # bandwidth drop episodes, per link
          rate_per_hour: 0.0
          bandwidth_factor: 0.5     # in (0, 1]: remaining fraction of bandwidth
          duration_minutes: 10
      stragglers:
        fixed: {dev0: 1.2}          # device id -> slowdown factor >= 1
        drawn: {probability: 0.0, factor_range: [1.05, 1.3]}
        throttling:                 # transient episodes, per device
          rate_per_hour: 0.0
          factor: 1.5               # >= 1
          duration_minutes: 5
      checkpoint:
        interval_minutes: 60        # > 0; rounded to whole iterations
        write_minutes: 0            # blocking write cost of one checkpoint
        restart_minutes: 10         # relaunch + reload after a failure
        detection_minutes: 5        # failure -> noticed (unexpected failures only)
        replace_minutes: 0          # extra for a hardware failure without a free hot spare
        hot_spares: 0               # standby nodes that skip replace_minutes
        spare_repair_hours: 24      # a used spare is back after this long
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Mapping

from ..errors import ScenarioError

DISTRIBUTIONS = ("exponential", "weibull")
UNITS = ("gpu", "node", "link", "job")
EFFECTS = ("restart", "stall")


@dataclass(frozen=True)
class Component:
    """One independent failure process: `mtbf_hours` per unit of `per`."""

    name: str
    per: str
    mtbf_hours: float
    distribution: str = "exponential"
    weibull_shape: float = 1.0
    hardware: bool = True
    effect: str = "restart"
    repair_minutes: float = 0.0


@dataclass(frozen=True)
class Devices:
    count: int | None = None
    per_node: int = 8
    mtbf_hours: Any = None  # None | float | "preset" | Mapping[str, float]
    distribution: str = "exponential"
    weibull_shape: float = 1.0


@dataclass(frozen=True)
class Planned:
    count: int | None = None
    interval_hours: float | None = None
    extra_minutes: float = 0.0


@dataclass(frozen=True)
class Degradation:
    rate_per_hour: float = 0.0
    bandwidth_factor: float = 0.5
    duration_minutes: float = 10.0


@dataclass(frozen=True)
class Links:
    count: int | None = None
    mtbf_hours: float | None = None
    repair_minutes: float = 30.0
    degradation: Degradation = field(default_factory=Degradation)


@dataclass(frozen=True)
class Throttling:
    rate_per_hour: float = 0.0
    factor: float = 1.5
    duration_minutes: float = 5.0


@dataclass(frozen=True)
class Stragglers:
    fixed: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))
    probability: float = 0.0
    factor_range: tuple[float, float] = (1.05, 1.3)
    throttling: Throttling = field(default_factory=Throttling)


@dataclass(frozen=True)
class Checkpoint:
    interval_minutes: float = 60.0
    write_minutes: float = 0.0
    restart_minutes: float = 10.0
    detection_minutes: float = 5.0
    replace_minutes: float = 0.0
    hot_spares: int = 0
    spare_repair_hours: float = 24.0


@dataclass(frozen=True)
class FailureConfig:
    horizon_hours: float = 168.0
    devices: Devices = field(default_factory=Devices)
    components: tuple[Component, ...] = ()
    planned: Planned = field(default_factory=Planned)
    links: Links = field(default_factory=Links)
    stragglers: Stragglers = field(default_factory=Stragglers)
    checkpoint: Checkpoint = field(default_factory=Checkpoint)


# --------------------------------------------------------------------------- reader
class _R:
    """Typed access to one mapping; every failure names the dotted path of the field."""

    def __init__(self, data: Any, path: str):
        self.path = path
        if data is None:
            data = {}
        if not isinstance(data, Mapping):
            raise ScenarioError(path, f"expected a mapping, got {_show(data)}")
        self.data = dict(data)

    def sub(self, key: str) -> str:
        return f"{self.path}.{key}"

    def keys(self, allowed) -> None:
        for key in self.data:
            if key not in allowed:
                raise ScenarioError(self.sub(str(key)), f"unknown key; expected one of {', '.join(sorted(allowed))}")

    def has(self, key) -> bool:
        return self.data.get(key) is not None

    def bool(self, key, default):
        v = self.data.get(key)
        if v is None:
            return default
        if not isinstance(v, bool):
            raise ScenarioError(self.sub(key), f"expected true or false, got {_show(v)}")
        return v

    def str(self, key, default=..., choices=None):
        v = self.data.get(key)
        if v is None:
            if default is ...:
                raise ScenarioError(self.sub(key), "missing; expected a string")
            return default
        if not isinstance(v, str) or not v:
            raise ScenarioError(self.sub(key), f"expected a non-empty string, got {_show(v)}")
        if choices and v not in choices:
            raise ScenarioError(self.sub(key), f"got {v!r}; expected one of {', '.join(choices)}")
        return v

    def num(self, key, default=..., *, gt=None, ge=None, le=None, integer=False):
        return _number(self.data.get(key), self.sub(key), default, gt=gt, ge=ge, le=le, integer=integer)

    def reader(self, key) -> "_R":
        return _R(self.data.get(key), self.sub(key))


def _show(v) -> str:
    return repr(v) if isinstance(v, (int, float, str, bool)) or v is None else type(v).__name__


def _number(v, path, default=..., *, gt=None, ge=None, le=None, integer=False):
    if v is None:
        if default is ...:
            raise ScenarioError(path, f"missing; expected {'an integer' if integer else 'a number'}")
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ScenarioError(path, f"expected {'an integer' if integer else 'a number'}, got {_show(v)}")
    if integer:
        if isinstance(v, float) and not v.is_integer():
            raise ScenarioError(path, f"expected an integer, got {v!r}")
        v = int(v)
    else:
        v = float(v)
        if not math.isfinite(v):
            raise ScenarioError(path, f"expected a finite number, got {v!r}")
    lo_txt = None
    if gt is not None and not v > gt:
        lo_txt = f"> {gt:g}"
    if ge is not None and not v >= ge:
        lo_txt = f">= {ge:g}"
    if lo_txt or (le is not None and not v <= le):
        if ge is not None and le is not None:
            want = f"a number in [{ge:g}, {le:g}]"
        elif gt is not None and le is not None:
            want = f"a number in ({gt:g}, {le:g}]"
        elif lo_txt:
            want = f"a number {lo_txt}"
        else:
            want = f"a number <= {le:g}"
        raise ScenarioError(path, f"got {v!r}; expected {want}")
    return v


def _mtbf(v, path):
    """The devices' MTBF: a number, "preset", or a mapping of device id / gpu type / default -> hours."""
    if isinstance(v, str):
        if v != "preset":
            raise ScenarioError(path, f"got {v!r}; expected a number > 0, 'preset' or a mapping")
        return v
    if isinstance(v, Mapping):
        if not v:
            raise ScenarioError(path, "expected a non-empty mapping of device id / gpu type -> hours")
        return MappingProxyType({str(k): _number(x, f"{path}.{k}", gt=0) for k, x in v.items()})
    return _number(v, path, None, gt=0)


def _distribution(r: _R) -> tuple[str, float]:
    dist = r.str("distribution", "exponential", DISTRIBUTIONS)
    shape = r.num("weibull_shape", 1.0, gt=0)
    if dist == "exponential" and r.has("weibull_shape") and shape != 1.0:
        raise ScenarioError(r.sub("weibull_shape"), "only used with distribution: weibull")
    return dist, shape


# --------------------------------------------------------------------------- sections
def parse_failure(section: Mapping | None, path: str = "failure") -> FailureConfig | None:
    """Validate a scenario's failure section; None when absent or disabled."""
    if section is None:
        return None
    r = _R(section, path)
    r.keys({"enabled", "horizon_hours", "devices", "components", "planned", "links", "stragglers", "checkpoint"})
    enabled = r.bool("enabled", True)
    cfg = FailureConfig(
        horizon_hours=r.num("horizon_hours", 168.0, gt=0),
        devices=_devices(r.reader("devices")),
        components=_components(r.data.get("components"), r.sub("components")),
        planned=_planned(r.reader("planned")),
        links=_links(r.reader("links")),
        stragglers=_stragglers(r.reader("stragglers")),
        checkpoint=_checkpoint(r.reader("checkpoint")),
    )
    return cfg if enabled else None


def _devices(r: _R) -> Devices:
    r.keys({"count", "per_node", "mtbf_hours", "distribution", "weibull_shape"})
    dist, shape = _distribution(r)
    return Devices(count=r.num("count", None, ge=1, integer=True), per_node=r.num("per_node", 8, ge=1, integer=True),
                   mtbf_hours=_mtbf(r.data.get("mtbf_hours"), r.sub("mtbf_hours")),
                   distribution=dist, weibull_shape=shape)


def _components(items, path) -> tuple[Component, ...]:
    if items is None:
        return ()
    if not isinstance(items, list):
        raise ScenarioError(path, f"expected a list of components, got {_show(items)}")
    out, seen = [], set()
    for i, item in enumerate(items):
        r = _R(item, f"{path}[{i}]")
        r.keys({"name", "per", "mtbf_hours", "distribution", "weibull_shape", "hardware", "effect", "repair_minutes"})
        name = r.str("name")
        if name in seen or name in ("device", "link"):
            raise ScenarioError(r.sub("name"), f"got {name!r}; names must be unique and not 'device' or 'link'")
        seen.add(name)
        dist, shape = _distribution(r)
        effect = r.str("effect", "restart", EFFECTS)
        repair = r.num("repair_minutes", 0.0, ge=0)
        if effect == "restart" and repair:
            raise ScenarioError(r.sub("repair_minutes"), "only used with effect: stall")
        out.append(Component(name=name, per=r.str("per", "gpu", UNITS), mtbf_hours=r.num("mtbf_hours", gt=0),
                             distribution=dist, weibull_shape=shape, hardware=r.bool("hardware", True),
                             effect=effect, repair_minutes=repair))
    return tuple(out)


def _planned(r: _R) -> Planned:
    r.keys({"count", "interval_hours", "extra_minutes"})
    if r.has("count") and r.has("interval_hours"):
        raise ScenarioError(r.sub("interval_hours"), "give either count or interval_hours, not both")
    return Planned(count=r.num("count", None, ge=0, integer=True),
                   interval_hours=r.num("interval_hours", None, gt=0),
                   extra_minutes=r.num("extra_minutes", 0.0, ge=0))


def _links(r: _R) -> Links:
    r.keys({"count", "mtbf_hours", "repair_minutes", "degradation"})
    d = r.reader("degradation")
    d.keys({"rate_per_hour", "bandwidth_factor", "duration_minutes"})
    return Links(count=r.num("count", None, ge=1, integer=True), mtbf_hours=r.num("mtbf_hours", None, gt=0),
                 repair_minutes=r.num("repair_minutes", 30.0, ge=0),
                 degradation=Degradation(rate_per_hour=d.num("rate_per_hour", 0.0, ge=0),
                                         bandwidth_factor=d.num("bandwidth_factor", 0.5, gt=0, le=1),
                                         duration_minutes=d.num("duration_minutes", 10.0, ge=0)))


def _stragglers(r: _R) -> Stragglers:
    r.keys({"fixed", "drawn", "throttling"})
    fixed = r.reader("fixed")
    factors = {str(k): fixed.num(k, ge=1) for k in fixed.data}
    d = r.reader("drawn")
    d.keys({"probability", "factor_range"})
    rng = d.data.get("factor_range")
    lo, hi = 1.05, 1.3
    if rng is not None:
        if not isinstance(rng, (list, tuple)) or len(rng) != 2:
            raise ScenarioError(d.sub("factor_range"), f"expected [low, high], got {_show(rng)}")
        lo = _number(rng[0], d.sub("factor_range") + "[0]", ge=1)
        hi = _number(rng[1], d.sub("factor_range") + "[1]", ge=1)
        if hi < lo:
            raise ScenarioError(d.sub("factor_range"), f"got [{lo:g}, {hi:g}]; expected low <= high")
    t = r.reader("throttling")
    t.keys({"rate_per_hour", "factor", "duration_minutes"})
    return Stragglers(fixed=MappingProxyType(factors), probability=d.num("probability", 0.0, ge=0, le=1),
                      factor_range=(lo, hi),
                      throttling=Throttling(rate_per_hour=t.num("rate_per_hour", 0.0, ge=0),
                                            factor=t.num("factor", 1.5, ge=1),
                                            duration_minutes=t.num("duration_minutes", 5.0, ge=0)))


def _checkpoint(r: _R) -> Checkpoint:
    r.keys({"interval_minutes", "write_minutes", "restart_minutes", "detection_minutes", "replace_minutes",
            "hot_spares", "spare_repair_hours"})
    return Checkpoint(interval_minutes=r.num("interval_minutes", 60.0, gt=0),
                      write_minutes=r.num("write_minutes", 0.0, ge=0),
                      restart_minutes=r.num("restart_minutes", 10.0, ge=0),
                      detection_minutes=r.num("detection_minutes", 5.0, ge=0),
                      replace_minutes=r.num("replace_minutes", 0.0, ge=0),
                      hot_spares=r.num("hot_spares", 0, ge=0, integer=True),
                      spare_repair_hours=r.num("spare_repair_hours", 24.0, gt=0))
