"""Where the calibration loop's repo-local state lives, for source checkouts and wheels alike.

The state (``golden/``, ``iterations.jsonl``, ``checkpoints.json``, ``citations.yaml``,
``LOG.md``) belongs to a repository, not to an installed package: a wheel in a virtualenv
has no golden file of its own. In order of precedence it is

1. the directory named by ``--state DIR`` (``python -m autoresearch --state DIR ...``),
   which sets ``HOPS_AUTORESEARCH_STATE`` for this process and its workers;
2. ``HOPS_AUTORESEARCH_STATE`` (tests and what-if sessions use it to keep the repo's
   copies untouched);
3. the package directory itself when it runs from a source checkout (editable install):
   its own state, or where a fresh clone bootstraps it;
4. ``autoresearch/`` of the checkout containing the working directory (a wheel used from
   inside a clone).

When none applies, the commands that need the state (gate, propose, admit, park, revert,
rebaseline, checkpoint, log, repair) stop with one line saying so, before any work; the
scoring commands (validate, observe, search) need none and log runs that belong to no iteration.
Configuration that ships with the package (``gate.yaml``, ``search_space.yaml``) is read
from the state directory when it has its own copy, else from the package.

The repository the state belongs to (`repo_root`: git provenance, iteration diffs, the default
MLflow and Optuna stores under ``mlruns/``) follows the state directory, not the working
directory: the same state always meets the same ledger and the same working tree.
"""
from __future__ import annotations

import os
from pathlib import Path

from hops.errors import HopsError

ENV = "HOPS_AUTORESEARCH_STATE"
PACKAGE = Path(__file__).resolve().parent
MARKERS = ("golden", "iterations.jsonl")  # either one makes a directory a state directory


class StateError(HopsError):
    """No autoresearch state directory could be found."""


def _has_state(d: Path) -> bool:
    return any((d / m).exists() for m in MARKERS)


def _checkout_state(start: Path) -> Path | None:
    for d in (start, *start.parents):
        if _has_state(d / "autoresearch"):
            return d / "autoresearch"
    return None


def use(path: str | os.PathLike) -> Path:
    """Make `path` the state directory of this process (and of the workers it starts)."""
    d = Path(path).expanduser().resolve()
    if not d.exists():  # a mistyped path, not a state to bootstrap: nothing may be written there
        where = "" if str(path) == str(d) else f" ({d})"
        raise StateError(f"--state {path}: no such directory{where}; check the path, or create it to start a new state")
    if not d.is_dir():
        raise StateError(f"--state {path}: not a directory")
    os.environ[ENV] = str(d)
    return d


def state_dir() -> Path:
    explicit = os.environ.get(ENV)
    if explicit:
        return Path(explicit)
    if _has_state(PACKAGE) or _is_checkout():  # a fresh checkout bootstraps its state here
        return PACKAGE
    found = _checkout_state(Path.cwd())
    if found is not None:
        return found
    raise StateError(f"no autoresearch state (golden/, iterations.jsonl) in {Path.cwd()} or its parents: run "
                     f"inside the repository checkout, or pass --state DIR (or set {ENV}=DIR)")


def config_path(name: str) -> Path:
    """A shipped configuration file: the state directory's own copy if it has one, else the package's."""
    try:
        own = state_dir() / name
    except StateError:
        return PACKAGE / name
    return own if own.is_file() else PACKAGE / name


def _is_checkout() -> bool:
    """The package runs from its source tree (editable install or PYTHONPATH), not from a wheel."""
    return (PACKAGE.parent / "pyproject.toml").is_file()


def _enclosing_checkout(d: Path) -> Path | None:
    """The git checkout of HOPS holding directory `d` (a `.git` beside `hops/`), if any."""
    for top in (d, *d.parents):
        if (top / ".git").exists():
            return top if (top / "hops").is_dir() else None
    return None


def repo_root() -> Path:
    """The checkout the state belongs to (MLflow store under mlruns/, git provenance, iteration diffs).

    An explicit state directory (``--state DIR`` / ``HOPS_AUTORESEARCH_STATE``) inside a checkout names
    that checkout, wherever the command runs from: `--state clone/autoresearch` from another directory
    must reach the same ledger (clone/mlruns) and the same working tree as a command run inside the
    clone, else two ledgers share one state and hand out the same iteration number. A state directory
    outside any checkout (tests, what-if sessions) belongs to the checkout the package runs from, and
    with a wheel to the directory holding it (its mlruns/ beside it), never to the working directory.
    """
    explicit = os.environ.get(ENV)
    if explicit:
        d = Path(explicit).expanduser().resolve()
        found = _enclosing_checkout(d)
        if found is not None:
            return found
        return PACKAGE.parent if _is_checkout() else d.parent
    if _is_checkout():
        return PACKAGE.parent
    found = _checkout_state(Path.cwd())
    return found.parent if found is not None else Path.cwd()
