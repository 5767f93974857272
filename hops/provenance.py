"""Which files are the model, and the one fingerprint of a model: code + the catalog values it runs with.

`MODEL_FILES` is the single declared list of what can move a prediction: the
simulator's code, the presets, and the scoring code that turns a trace and a
simulation into the numbers the gate compares. The fingerprint (summary.json,
every MLflow run, the golden file, the test checkpoint), the pre-commit hook
and the gate's "model changed" report all derive from it, so a file cannot be
in one and missing from another (tests/test_provenance.py imports the model
and checks that every module it loads is declared).

The fingerprint hashes what the interpreter executes, not the bytes on disk:
each Python file as its AST with docstrings dropped (comments never reach the
AST), and the catalog as the values the model reads (presets with any
overrides applied; YAML comments and formatting never reach them). A comment
edit therefore cannot buy a second test-split checkpoint, while any change to
code or a constant gives a new fingerprint. The code part is cached per
process and re-read only when a file's size or mtime changes.
"""
from __future__ import annotations

import ast
import fnmatch
import hashlib
import json
import os
from functools import lru_cache
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]  # the repository (or install) root holding hops/

MODEL_FILES = (
    "hops/api.py", "hops/architecture.py", "hops/collectives.py", "hops/compute.py", "hops/engine.py", "hops/engine_core.py",
    "hops/hardware.py", "hops/layer_split.py", "hops/memory.py", "hops/metrics.py", "hops/scenario.py", "hops/timeline.py",
    "hops/failures/*.py", "hops/schedulers/*.py", "hops/traces/*.py", "hops/schema/*.py",
    "hops/presets/*.yaml",
    # scoring: how a trace and a simulation become the compared numbers (absent in a bare hops install)
    "autoresearch/fixtures.py", "autoresearch/scoring.py", "autoresearch/validate.py", "autoresearch/variants.py",
)


def is_model_file(path: str) -> bool:
    """`path` (repo-relative, forward slashes) is declared in MODEL_FILES; `*` does not cross directories."""
    return any(fnmatch.fnmatchcase(path, pat) and path.count("/") == pat.count("/") for pat in MODEL_FILES)


def model_files(root: Path = ROOT) -> list[Path]:
    return sorted({p for pattern in MODEL_FILES for p in root.glob(pattern) if p.is_file()})


def _strip_docstrings(tree: ast.AST) -> ast.AST:
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                node.body = body[1:] or [ast.Pass()]
    return tree


def code_digest(path: Path) -> bytes:
    """What the interpreter runs: the AST without docstrings for .py (comments are not in it), bytes otherwise."""
    text = path.read_bytes()
    if path.suffix == ".py":
        try:
            return ast.dump(_strip_docstrings(ast.parse(text, filename=str(path)))).encode()
        except SyntaxError:
            return text  # a broken file still fingerprints (and fails loudly when imported)
    return text


@lru_cache(maxsize=8)
def _code_hash(root: Path, stamp: tuple) -> str:
    h = hashlib.sha256()
    for rel, *_ in stamp:
        h.update(rel.encode() + b"\0" + code_digest(root / rel) + b"\0")
    return h.hexdigest()


_PY_FILES: dict[Path, tuple[tuple, list[tuple[str, str]]]] = {}


@lru_cache(maxsize=8)
def _glob_dirs(root: Path) -> tuple[str, ...]:
    """The directories MODEL_FILES globs in, under root: names only (a constant per root),
    which took half of the fingerprint's time to rebuild from the patterns every call."""
    return tuple(sorted({str((root / pattern).parent) for pattern in MODEL_FILES}))


def _model_py_files(root: Path) -> list[tuple[str, str]]:
    """(repo-relative, absolute) of the model's .py files; globbed again only when a directory
    they are globbed from changes (adding or removing a file changes its directory's mtime).

    Every hops.simulate asks for the fingerprint: globbing each time cost ~1.5 ms, a sixth
    of a small scenario's simulation.
    """
    key = []
    for d in _glob_dirs(root):
        try:
            key.append(os.stat(d).st_mtime_ns)
        except OSError:  # autoresearch/ is absent from a bare hops install
            key.append(None)
    cached = _PY_FILES.get(root)
    if cached is None or cached[0] != tuple(key):
        files = [(p.relative_to(root).as_posix(), str(p)) for p in model_files(root) if p.suffix == ".py"]
        cached = _PY_FILES[root] = (tuple(key), files)
    return cached[1]


def code_fingerprint(root: Path = ROOT) -> str:
    stamp = []
    for rel, path in _model_py_files(root):  # presets count through the catalog values, below
        st = os.stat(path)
        stamp.append((rel, st.st_mtime_ns, st.st_size))
    return _code_hash(root, tuple(stamp))


def model_fingerprint(catalog_overrides: Any = None) -> str:
    """Hash of the model code and the catalog values it runs with: equal fingerprints, identical predictions.

    `catalog_overrides` is a `Catalog` (the one a run used) or catalog overrides
    (`{"stacks.fixture_megatron.k_floor_ms.default": 1.2}`, `["stacks.fixture_megatron.k_floor_ms.default=1.2"]`) applied to the presets.
    """
    from .hardware import Catalog

    catalog = catalog_overrides if isinstance(catalog_overrides, Catalog) else Catalog.load(catalog_overrides)
    values = catalog.values_json()
    return hashlib.sha256((code_fingerprint() + "\0" + values).encode()).hexdigest()[:16]
