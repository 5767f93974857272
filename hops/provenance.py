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

Parsing and dumping the ASTs of the model's ~40 files took ~0.5 s, paid by every
process (every CLI run, every sweep job) for a value that changes only with the code.
So the code part is also cached on disk (`code_cache_dir()`), keyed on the files' exact
bytes: a key is the sha256 of every file's name and sha256, ~1 ms to compute for all
of them; any byte changed is a different key and the ASTs are parsed again. The cached
value is the same hash the parse gives (tests/test_provenance.py checks both ways); an
unreadable or unwritable cache only means parsing again.
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
    "hops/api.py", "hops/scenario.py", "hops/scenario_types.py", "hops/timeline.py", "hops/metrics.py",
    "hops/safe_yaml.py",  # how the presets' and scenarios' numbers are read
    "hops/model/*.py", "hops/engine/*.py",
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


def code_digest(path: Path, text: bytes | None = None) -> bytes:
    """What the interpreter runs: the AST without docstrings for .py (comments are not in it), bytes otherwise."""
    text = path.read_bytes() if text is None else text
    if path.suffix == ".py":
        try:
            return ast.dump(_strip_docstrings(ast.parse(text, filename=str(path)))).encode()
        except SyntaxError:
            return text  # a broken file still fingerprints (and fails loudly when imported)
    return text


@lru_cache(maxsize=8)
def _code_hash(root: Path, stamp: tuple) -> str:
    files = [(rel, (root / rel).read_bytes()) for rel, *_ in stamp]
    key = hashlib.sha256(b"".join(rel.encode() + b"\0" + hashlib.sha256(text).digest() for rel, text in files))
    cache = code_cache_dir() / f"{key.hexdigest()}.txt" if code_cache_dir() else None
    try:
        cached = cache.read_text() if cache else ""
    except OSError:
        cached = ""
    if len(cached) == 64:
        return cached
    h = hashlib.sha256()
    for rel, text in files:
        h.update(rel.encode() + b"\0" + code_digest(root / rel, text) + b"\0")
    value = h.hexdigest()
    if cache is not None:
        try:  # written whole under a temporary name, then renamed: a reader never sees half a value
            cache.parent.mkdir(parents=True, exist_ok=True)
            tmp = cache.with_name(f".{cache.name}.{os.getpid()}")
            tmp.write_text(value)
            os.replace(tmp, cache)
            _prune(cache.parent)
        except OSError:
            pass
    return value


CACHE_KEEP = 256  # tree states remembered (64 bytes each); the oldest go first


def _prune(directory: Path) -> None:
    entries = sorted(directory.glob("*.txt"), key=lambda p: p.stat().st_mtime_ns)
    for old in entries[:-CACHE_KEEP]:
        old.unlink(missing_ok=True)


CACHE_ENV = "HOPS_CACHE_DIR"


def code_cache_dir() -> Path | None:
    """Where code fingerprints are cached: $HOPS_CACHE_DIR, else $XDG_CACHE_HOME/hops, else ~/.cache/hops
    (subdirectory `fingerprints`); HOPS_CACHE_DIR set to an empty string turns the cache off."""
    env = os.environ.get(CACHE_ENV)
    if env is not None:
        return Path(env) / "fingerprints" if env else None
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "hops" / "fingerprints"


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
    from hops.model.hardware import Catalog

    catalog = catalog_overrides if isinstance(catalog_overrides, Catalog) else Catalog.load(catalog_overrides)
    values = catalog.values_json()
    return hashlib.sha256((code_fingerprint() + "\0" + values).encode()).hexdigest()[:16]
