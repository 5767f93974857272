"""Field types of the scenario schema: one place that decides what a valid number, count or
name is, what the error says when it is not, and what the JSON Schema publishes about it.

pydantic's own messages ("Input should be greater than 0") do not name the value or the
allowed range the way HOPS errors always have ("got 0; expected a number > 0"), so every
field validates in a before-validator that raises a `hops` error with the final text;
`WithJsonSchema` publishes the same bounds to editors.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Annotated, Any, Union

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, WithJsonSchema, model_validator
from pydantic_core import PydanticCustomError

from hops.errors import ECHO_CHARS, echo
from hops.model.hardware import choices_text, is_choice

# Sizes above these are refused up front (docs/legacy_scenarios.md#bounds): they are far
# beyond any real job, and values like 1e300 or 1e9 microbatches would otherwise overflow
# or run for hours before failing.
MAX_COUNT = 10**7          # devices, failure device counts, links, planned interruptions
MAX_MICROBATCHES = 10**6
MAX_BATCHES = 10**6
MAX_MODEL_DIM = 10**7      # hidden_dim, seq_len, vocab_size
MAX_HORIZON_HOURS = 10 * 8766.0   # ten years of wall clock
# compute tasks (an F, B and W per stage, microbatch and iteration) of one run: a few minutes at
# the 1-2.5e5 tasks/s benchmarks/engine_bench.py measures (PP64 x 1024 x 4 is 786,432 of them)
MAX_TASKS = 20_000_000


def fail(message: str, key: str | None = None) -> PydanticCustomError:
    """A validation error whose text is final; `key` extends the path (cross-field checks)."""
    ctx = {"msg": message}
    if key is not None:
        ctx["key"] = key
    return PydanticCustomError("hops", "{msg}", ctx)


def show(v: Any) -> str:
    return echo(v) if isinstance(v, (int, float, str, bool)) or v is None else type(v).__name__


def _range_text(gt, ge, lt, le, what: str) -> str:
    lo = f"> {gt:g}" if gt is not None else f">= {ge:g}" if ge is not None else None
    hi = f"< {lt:g}" if lt is not None else f"<= {le:g}" if le is not None else None
    if lo and hi:
        left = "(" if gt is not None else "["
        right = ")" if lt is not None else "]"
        a = gt if gt is not None else ge
        b = lt if lt is not None else le
        return f"{what} in {left}{a:g}, {b:g}{right}"
    return f"{what} {lo or hi}"


def _bounds_schema(gt, ge, lt, le) -> dict:
    out = {}
    if gt is not None:
        out["exclusiveMinimum"] = gt
    if ge is not None:
        out["minimum"] = ge
    if lt is not None:
        out["exclusiveMaximum"] = lt
    if le is not None:
        out["maximum"] = le
    return out


def check_number(v: Any, *, gt=None, ge=None, lt=None, le=None, integer=False, cap=None):
    what = "an integer" if integer else "a number"
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise fail(f"expected {what}, got {show(v)}")
    if isinstance(v, float) and not math.isfinite(v):
        raise fail(f"expected a finite number, got {echo(v)}")
    if integer:
        if isinstance(v, float) and not v.is_integer():
            raise fail(f"expected an integer, got {echo(v)}")
        v = int(v)
    else:
        v = float(v)
    if ((gt is not None and not v > gt) or (ge is not None and not v >= ge)
            or (lt is not None and not v < lt) or (le is not None and not v <= le)):
        raise fail(f"got {echo(v)}; expected {_range_text(gt, ge, lt, le, 'a number')}")
    if cap is not None and v > cap:
        raise fail(f"got {v:g}; expected at most {cap:,g} (HOPS's size bound, see docs/legacy_scenarios.md#bounds)")
    return v


def Num(*, gt=None, ge=None, lt=None, le=None, cap=None, description: str | None = None):
    """A finite float (ints accepted), optionally bounded; `cap` is a size bound."""
    schema = {"type": "number", **_bounds_schema(gt, ge, lt, le if cap is None else cap)}
    if description:
        schema["description"] = description
    return Annotated[float, BeforeValidator(lambda v: check_number(v, gt=gt, ge=ge, lt=lt, le=le, cap=cap)),
                     WithJsonSchema(schema)]


def Int(*, gt=None, ge=None, lt=None, le=None, cap=None, description: str | None = None):
    """An integer (integral floats accepted: YAML 1e3 is a float), optionally bounded; `cap` is a size bound."""
    schema = {"type": "integer", **_bounds_schema(gt, ge, lt, le if cap is None else cap)}
    if description:
        schema["description"] = description
    return Annotated[int, BeforeValidator(lambda v: check_number(v, gt=gt, ge=ge, lt=lt, le=le, integer=True,
                                                                 cap=cap)),
                     WithJsonSchema(schema)]


def check_str(v: Any, choices=None, *, nonempty=False):
    if not isinstance(v, str) or (nonempty and not v):
        raise fail(f"expected {'a non-empty' if nonempty else 'a'} string, got {show(v)}")
    if choices is not None and v not in choices:
        raise fail(f"got {echo(v)}; expected one of {', '.join(choices)}")
    return v


def Str(choices: tuple[str, ...] | None = None, *, nonempty=False, description: str | None = None):
    schema: dict = {"type": "string"}
    if choices:
        schema["enum"] = list(choices)
    if nonempty:
        schema["minLength"] = 1
    if description:
        schema["description"] = description
    return Annotated[str, BeforeValidator(lambda v: check_str(v, choices, nonempty=nonempty)),
                     WithJsonSchema(schema)]


def Choice(choices: tuple, *, description: str | None = None):
    """One of a few values that mix true/false with names (`p2p_overlap: interleaved`)."""
    def check(v):
        if not is_choice(v, choices):
            raise fail(f"got {show(v)}; expected one of {choices_text(choices)}")
        return v
    schema: dict = {"enum": list(choices)}
    if description:
        schema["description"] = description
    return Annotated[Union[bool, str], BeforeValidator(check), WithJsonSchema(schema)]


def OrAuto(check, schema: dict, description: str):
    """A value `check` accepts, or the word `auto`: the run decides (a planned layer split, the
    schedule's own chunks or post-validation), so one sweep can span cases a fixed value cannot."""
    return Annotated[Any, BeforeValidator(lambda v: v if v == "auto" else check(v)),
                     WithJsonSchema({"description": description, "anyOf": [schema, {"const": "auto"}]})]


def _check_bool(v: Any):
    if not isinstance(v, bool):
        raise fail(f"expected true or false, got {show(v)}")
    return v


Bool = Annotated[bool, BeforeValidator(_check_bool), WithJsonSchema({"type": "boolean"})]


def _check_list(v: Any):
    if not isinstance(v, (list, tuple)):
        raise fail(f"expected a list, got {show(v)}")
    return list(v)


def _check_dict(v: Any):
    if not isinstance(v, Mapping):
        raise fail(f"expected a mapping, got {show(v)}")
    return {str(k): x for k, x in v.items()}  # YAML reads `1:` as an int; ids and names are strings


def ListOf(item):
    return Annotated[list[item], BeforeValidator(_check_list)]


def DictOf(item):
    return Annotated[dict[str, item], BeforeValidator(_check_dict)]


class Section(BaseModel):
    """A mapping with a closed set of keys: an unknown key is an error listing the known ones.

    ``null`` for the whole mapping or for any key means "not given" (the default applies),
    as it always has for HOPS scenarios.
    """

    # defer_build: only the validators actually used (the whole scenario, the failure section) are
    # compiled, on first use, instead of one per nested model at import (import time halves).
    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)

    @model_validator(mode="before")
    @classmethod
    def _closed_mapping(cls, data: Any):
        return closed_mapping(data, cls.model_fields)


def section_defaults():
    """The default of a sub-section that may be left out: `{}`, validated by the enclosing model.

    A default_factory of the section's class would instantiate it on its own, so pydantic
    would compile a validator for each such class at a process's first run (with
    `defer_build`) on top of the document's, which already holds them; this default is
    validated inside the document's validator. The published JSON Schema is the same.
    """
    return Field(default_factory=dict, validate_default=True)


def closed_mapping(data: Any, known) -> dict:
    """`data` as a dict without null values, or an error naming the first key not in `known`."""
    if data is None:
        return {}
    if not isinstance(data, Mapping):
        raise fail(f"expected a mapping, got {show(data)}")
    for key in data:
        if key not in known:
            name = str(key) if len(str(key)) <= ECHO_CHARS else echo(key)  # a path, not a page
            raise fail(f"unknown key; expected one of {', '.join(sorted(known))}", key=name)
    return {k: v for k, v in data.items() if v is not None}
