"""Reading a scenario YAML file: strict where YAML itself is lenient.

PyYAML keeps the last of two equal keys, reads any bytes it can decode and lets a few
lines of anchors and aliases expand into billions of nodes (the "billion laughs"); the
API never expands them, but anything that copies the document (OmegaConf in hops.run)
does, for minutes and gigabytes. Here a duplicate key is an error naming it, a non-UTF-8
file is an error naming the byte, and a document whose aliases would expand past
MAX_NODES is refused before anything copies it.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from hops.errors import ScenarioError, echo
from hops.safe_yaml import SafeLoader

MAX_NODES = 1_000_000  # a PP64 x 1024 scenario is a few hundred nodes; 1e6 is far past any real one


class StrictLoader(SafeLoader):
    """Safe loader (YAML 1.2 floats: hops.safe_yaml) that refuses duplicate mapping keys."""


def _construct_mapping(loader, node, deep=False):
    loader.flatten_mapping(node)
    seen = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=True)
        try:
            duplicate = key in seen
        except TypeError:  # an unhashable key: SafeConstructor reports it
            continue
        if duplicate:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {echo(key)} (first on line {seen[key] + 1})", key_node.start_mark)
        seen[key] = key_node.start_mark.line
    return yaml.SafeLoader.construct_mapping(loader, node, deep=deep)


StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def _expanded_size(node, memo: dict, limit: int) -> int:
    """Nodes the document has once every alias is expanded (shared subtrees counted each time)."""
    key = id(node)
    if key in memo:
        return memo[key]
    memo[key] = 1  # a recursive alias counts once; the constructor handles recursion itself
    if isinstance(node, yaml.MappingNode):
        total = 1 + sum(_expanded_size(k, memo, limit) + _expanded_size(v, memo, limit) for k, v in node.value)
    elif isinstance(node, yaml.SequenceNode):
        total = 1 + sum(_expanded_size(v, memo, limit) for v in node.value)
    else:
        total = 1
    memo[key] = total = min(total, limit + 1)
    return total


def parse_yaml(text: str, source: str) -> Any:
    """YAML text to Python data, as yaml.safe_load would, with the checks above."""
    loader = StrictLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        if _expanded_size(node, {}, MAX_NODES) > MAX_NODES:
            raise ScenarioError("scenario", f"YAML aliases expand to more than {MAX_NODES:,} nodes (an alias bomb?); "
                                            f"write the values out", source)
        return loader.construct_document(node)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        where = f"line {mark.line + 1}" if mark else "?"
        problem = getattr(exc, "problem", None) or str(exc)
        raise ScenarioError(where, f"invalid YAML ({problem})", source) from None
    finally:
        loader.dispose()


def read_yaml_file(path: str | Path) -> Any:
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ScenarioError("scenario", f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[:exc.start].count(b"\n") + 1
        raise ScenarioError(f"line {line}", f"not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start}); "
                                            f"save the file as UTF-8", str(path)) from None
    return parse_yaml(text, str(path))
