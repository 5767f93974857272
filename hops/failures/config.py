"""The `failure` section of a scenario: schema, defaults and strict validation.

Every mistake raises one ScenarioError whose path names the field
(``failure.checkpoint.interval_minutes: got 0.0; expected a number > 0``). The schema
itself (types, defaults, bounds) is hops.schema.failure, the same mechanism that validates
the rest of the scenario; this module turns the validated section into the frozen
dataclasses the horizon model reads.
A missing section, ``null`` or ``enabled: false`` means "no failure model" and
parses to None; a section with content and no ``enabled`` key is enabled.

Schema (all keys optional unless marked; times in the unit their name says)::

    failure:
      enabled: true
      horizon_hours: 168            # wall-clock span the long-horizon model covers
      devices:                      # the cluster, and whole-device failures
        count: 16384                # GPUs in the job (default: the pipeline's devices x data-parallel degree)
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

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Mapping

from hops.schema.failure import DISTRIBUTIONS, EFFECTS, UNITS  # noqa: F401 - re-exported


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


# --------------------------------------------------------------------------- from the schema
def parse_failure(section: Mapping | None, path: str = "failure") -> FailureConfig | None:
    """Validate a scenario's failure section; None when absent or disabled."""
    if section is None:
        return None
    from hops.schema import validate_failure

    model = validate_failure(section, path)
    return from_model(model) if model.enabled else None


def from_model(m) -> FailureConfig:
    """The horizon model's FailureConfig from a validated hops.schema.failure.FailureModel."""
    d, ln, s, c = m.devices, m.links, m.stragglers, m.checkpoint
    mtbf = d.mtbf_hours
    if isinstance(mtbf, Mapping):
        mtbf = MappingProxyType({str(k): float(v) for k, v in mtbf.items()})
    return FailureConfig(
        horizon_hours=m.horizon_hours,
        devices=Devices(count=d.count, per_node=d.per_node, mtbf_hours=mtbf, distribution=d.distribution,
                        weibull_shape=d.weibull_shape),
        components=tuple(Component(name=x.name, per=x.per, mtbf_hours=x.mtbf_hours, distribution=x.distribution,
                                   weibull_shape=x.weibull_shape, hardware=x.hardware, effect=x.effect,
                                   repair_minutes=x.repair_minutes) for x in m.components),
        planned=Planned(count=m.planned.count, interval_hours=m.planned.interval_hours,
                        extra_minutes=m.planned.extra_minutes),
        # dict(section) is a flat section's model_dump() without building a serializer for its class
        links=Links(count=ln.count, mtbf_hours=ln.mtbf_hours, repair_minutes=ln.repair_minutes,
                    degradation=Degradation(**dict(ln.degradation))),
        stragglers=Stragglers(fixed=MappingProxyType({str(k): float(v) for k, v in s.fixed.items()}),
                              probability=s.drawn.probability, factor_range=tuple(s.drawn.factor_range),
                              throttling=Throttling(**dict(s.throttling))),
        checkpoint=Checkpoint(**dict(c)),
    )
