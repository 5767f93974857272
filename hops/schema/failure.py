"""The `failure` section's schema (docs/failures.md): types, defaults and bounds, validated once."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import BeforeValidator, Field, WithJsonSchema, model_validator
from pydantic_core import PydanticCustomError

from hops.errors import echo
from hops.schema.fields import (MAX_COUNT, MAX_HORIZON_HOURS, Bool, DictOf, Int, ListOf, Num, Section, Str, check_number,
                     fail, section_defaults, show)

DISTRIBUTIONS = ("exponential", "weibull")
UNITS = ("gpu", "node", "link", "job")
EFFECTS = ("restart", "stall")

Hours = Num(gt=0)


def _mtbf(v: Any):
    """A number > 0, "preset", or a mapping of device id / gpu type / default -> hours."""
    if isinstance(v, str):
        if v != "preset":
            raise fail(f"got {echo(v)}; expected a number > 0, 'preset' or a mapping")
        return v
    if isinstance(v, Mapping):
        if not v:
            raise fail("expected a non-empty mapping of device id / gpu type -> hours")
        out = {}
        for key, hours in v.items():
            try:
                out[str(key)] = check_number(hours, gt=0)
            except PydanticCustomError as exc:  # re-raised naming the key
                raise fail(exc.context["msg"], key=str(key)) from None
        return out
    return check_number(v, gt=0)


_HOURS_SCHEMA = {"type": "number", "exclusiveMinimum": 0}
Mtbf = Annotated[Any, BeforeValidator(_mtbf), WithJsonSchema({
    "description": "MTBF per device in hours: a number, 'preset' (the hardware preset's mtbf_hours), or a "
                   "mapping {default: h, <gpu type>: h, <device id>: h}",
    "anyOf": [_HOURS_SCHEMA, {"const": "preset"},
              {"type": "object", "additionalProperties": _HOURS_SCHEMA, "minProperties": 1}]})]


class _Distributed(Section):
    distribution: Str(DISTRIBUTIONS) = "exponential"
    weibull_shape: Num(gt=0) = 1.0

    @model_validator(mode="after")
    def _shape_only_for_weibull(self):
        if self.distribution == "exponential" and "weibull_shape" in self.model_fields_set and self.weibull_shape != 1:
            raise fail("only used with distribution: weibull", key="weibull_shape")
        return self


class DevicesModel(_Distributed):
    count: Int(ge=1, cap=MAX_COUNT) | None = None
    per_node: Int(ge=1, cap=MAX_COUNT) = 8
    mtbf_hours: Mtbf | None = None


class ComponentModel(_Distributed):
    name: Str(nonempty=True)
    per: Str(UNITS) = "gpu"
    mtbf_hours: Hours
    hardware: Bool = True
    effect: Str(EFFECTS) = "restart"
    repair_minutes: Num(ge=0) = 0.0

    @model_validator(mode="after")
    def _repair_only_for_stall(self):
        if self.effect == "restart" and self.repair_minutes:
            raise fail("only used with effect: stall", key="repair_minutes")
        return self


class PlannedModel(Section):
    count: Int(ge=0, cap=MAX_COUNT) | None = None
    interval_hours: Num(gt=0) | None = None
    extra_minutes: Num(ge=0) = 0.0

    @model_validator(mode="after")
    def _one_of(self):
        if self.count is not None and self.interval_hours is not None:
            raise fail("give either count or interval_hours, not both", key="interval_hours")
        return self


class DegradationModel(Section):
    rate_per_hour: Num(ge=0) = 0.0
    bandwidth_factor: Num(gt=0, le=1) = 0.5
    duration_minutes: Num(ge=0) = 10.0


class LinksModel(Section):
    count: Int(ge=1, cap=MAX_COUNT) | None = None
    mtbf_hours: Num(gt=0) | None = None
    repair_minutes: Num(ge=0) = 30.0
    degradation: DegradationModel = section_defaults()


def _pair(v: Any):
    if not isinstance(v, (list, tuple)) or len(v) != 2:
        raise fail(f"expected [low, high], got {show(v)}")
    return tuple(v)


class DrawnModel(Section):
    probability: Num(ge=0, le=1) = 0.0
    factor_range: Annotated[tuple[Num(ge=1), Num(ge=1)], BeforeValidator(_pair)] = (1.05, 1.3)

    @model_validator(mode="after")
    def _ordered(self):
        lo, hi = self.factor_range
        if hi < lo:
            raise fail(f"got [{lo:g}, {hi:g}]; expected low <= high", key="factor_range")
        return self


class ThrottlingModel(Section):
    rate_per_hour: Num(ge=0) = 0.0
    factor: Num(ge=1) = 1.5
    duration_minutes: Num(ge=0) = 5.0


class StragglersModel(Section):
    fixed: DictOf(Num(ge=1)) = Field(default_factory=dict)
    drawn: DrawnModel = section_defaults()
    throttling: ThrottlingModel = section_defaults()


class CheckpointModel(Section):
    interval_minutes: Num(gt=0) = 60.0
    write_minutes: Num(ge=0) = 0.0
    restart_minutes: Num(ge=0) = 10.0
    detection_minutes: Num(ge=0) = 5.0
    replace_minutes: Num(ge=0) = 0.0
    hot_spares: Int(ge=0, cap=MAX_COUNT) = 0
    spare_repair_hours: Num(gt=0) = 24.0


class FailureModel(Section):
    """Device, component, link and planned interruptions, stragglers, checkpoint/restart costs."""

    enabled: Bool = True
    horizon_hours: Num(gt=0, cap=MAX_HORIZON_HOURS) = 168.0
    devices: DevicesModel = section_defaults()
    components: ListOf(ComponentModel) = Field(default_factory=list)
    planned: PlannedModel = section_defaults()
    links: LinksModel = section_defaults()
    stragglers: StragglersModel = section_defaults()
    checkpoint: CheckpointModel = section_defaults()

    @model_validator(mode="after")
    def _unique_names(self):
        seen = set()
        for i, c in enumerate(self.components):
            if c.name in seen or c.name in ("device", "link"):
                raise fail(f"got {echo(c.name)}; names must be unique and not 'device' or 'link'",
                           key=f"components[{i}].name")
            seen.add(c.name)
        return self
