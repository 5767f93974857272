"""The scenario schema: typed models that validate a scenario document and publish a JSON Schema.

This is the one validation mechanism for scenario files: `validate` turns the first
problem into a one-line ScenarioError naming the field path and what was expected, and
`json_schema()` is what editors use (hops/schema/scenario.schema.json, regenerated with
``python -m hops.schema``). Legacy fields of the original simulator are translated
before validation (hops.schema.legacy).
"""
from __future__ import annotations

import json
import typing
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from hops.errors import ScenarioError
from hops.schema.failure import FailureModel
from hops.schema.scenario import ScenarioModel

SCHEMA_FILE = Path(__file__).with_name("scenario.schema.json")
SCHEMA_ID = "https://hops.invalid/schema/scenario.schema.json"


def validate(data: Any, source: str | None = None, model: type[BaseModel] = ScenarioModel,
             root: tuple = ()) -> BaseModel:
    """The document as typed models, or a ScenarioError for its first problem."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise to_scenario_error(exc, model, source, root) from None


def validate_failure(section: Any, path: str = "failure") -> FailureModel:
    return validate(section, None, FailureModel, tuple(path.split(".")))


def format_path(loc) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def to_scenario_error(exc: ValidationError, model, source: str | None, root: tuple = ()) -> ScenarioError:
    err = exc.errors(include_url=False)[0]
    loc = tuple(root) + tuple(err["loc"])
    ctx = err.get("ctx") or {}
    if err["type"] == "hops":
        message = ctx["msg"]
        key = ctx.get("key")
        if key:
            loc = loc + tuple(_split_key(key))
    elif err["type"] == "missing":
        if not root and len(loc) == 1:
            message = "missing section"
        else:
            message = f"missing; expected {_expected(model, err['loc'])}"
    else:  # a pydantic check without a HOPS message (should not happen; kept readable)
        message = err["msg"]
    return ScenarioError(format_path(loc), message, source)


def _split_key(key: str) -> list:
    """'components[0].name' -> ['components', 0, 'name']."""
    parts: list = []
    for chunk in key.replace("[", ".[").split("."):
        if not chunk:
            continue
        parts.append(int(chunk[1:-1]) if chunk.startswith("[") else chunk)
    return parts


_KIND_NAMES = {int: "an integer", float: "a number", str: "a string", bool: "true or false", list: "a list",
               dict: "a mapping"}


def _expected(model, loc) -> str:
    """What the field at `loc` holds, for a "missing" message ("an integer", "a mapping", ...)."""
    ann: Any = model
    for part in loc:
        ann = _unwrap(ann)
        if isinstance(part, int) or (typing.get_origin(ann) is dict):
            args = typing.get_args(ann)
            ann = args[-1] if args else Any
            continue
        if isinstance(ann, type) and issubclass(ann, BaseModel) and part in ann.model_fields:
            ann = ann.model_fields[part].annotation
        else:
            return "a value"
    ann = _unwrap(ann)
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return "a mapping"
    return _KIND_NAMES.get(typing.get_origin(ann) or ann, "a value")


def _unwrap(ann):
    while True:
        origin = typing.get_origin(ann)
        if origin is typing.Annotated:
            ann = typing.get_args(ann)[0]
        elif origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
            args = [a for a in typing.get_args(ann) if a is not type(None)]
            ann = args[0] if len(args) == 1 else ann
            if len(args) != 1:
                return ann
        else:
            return ann


def json_schema() -> dict:
    """The JSON Schema of a scenario file (draft 2020-12), as shipped in scenario.schema.json."""
    schema = ScenarioModel.model_json_schema()
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "$id": SCHEMA_ID, **schema}


def schema_text() -> str:
    return json.dumps(json_schema(), indent=2, sort_keys=True) + "\n"


__all__ = ["ScenarioModel", "FailureModel", "validate", "validate_failure", "json_schema", "schema_text",
           "SCHEMA_FILE", "format_path"]
