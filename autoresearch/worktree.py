"""The repository's working tree as git trees: an iteration's own diff, stacks of patches, restores.

An iteration's change is whatever the working tree holds beyond its base:
HEAD for a plain iteration, HEAD with the parked patches applied for a
stacked one. Both sides are written as git tree objects through a throw-away
index (GIT_INDEX_FILE), so untracked files count, the user's real index is
never touched, and the diff between two trees is exactly `git diff` output
that `git apply` takes back. The calibration state files (golden file,
iterations.jsonl, LOG.md, checkpoints.json, patches/) are never part of an
iteration's diff: they change through admit / revert / park, not by hand.

Untracked files that were there before an iteration opened (a user's scheduler
plug-in, a `--json` report) are the user's, not the change's: `propose` records
them (`untracked()`), and every snapshot of that iteration keeps them out
(`keep_out`), so its patch never holds them and restoring the tree never
deletes them. Files created after `propose` are the change's, as before.
"""
from __future__ import annotations

import os
import re
import subprocess
import tempfile
from pathlib import Path
from typing import Iterable

from hops.errors import HopsError

from . import ledger, state

# .state.lock and .open-iteration.json are gitignored (an exclude pathspec naming an ignored file fails `git add`)
STATE_ENTRIES = ("golden", "iterations.jsonl", "LOG.md", "checkpoints.json", "patches", ".pending.json")
EMPTY_TREE = "4b825dc642cb6eb9a060e54bf8d69288fbee4904"


class TreeError(HopsError):
    """A git operation on the working tree failed or was refused (message says which and why)."""


def repo() -> Path:
    """The checkout the calibration state belongs to (autoresearch/state.py repo_root), not the cwd's."""
    return state.repo_root()


def _run(*args: str, env: dict | None = None, input: bytes | None = None, cwd: Path | None = None) -> bytes:
    try:
        out = subprocess.run(["git", *args], cwd=cwd or repo(), capture_output=True, input=input, timeout=120,
                             env={**os.environ, **(env or {})})
    except (OSError, subprocess.SubprocessError) as exc:
        raise TreeError(f"git {args[0]}: could not run git ({exc})") from None
    if out.returncode != 0:
        msg = out.stderr.decode(errors="replace").strip().splitlines()
        raise TreeError(f"git {' '.join(args[:2])}: {msg[-1] if msg else 'failed'}")
    return out.stdout


def is_repo() -> bool:
    try:
        _run("rev-parse", "--git-dir")
        return True
    except TreeError:
        return False


def owns_tree() -> bool:
    """Tree edits (restore, applying patches) only when the calibration state lives in this repository.

    A relocated state dir (HOPS_AUTORESEARCH_STATE, as the tests and what-if sessions use) is not this
    checkout's calibration, so its commands may read the tree but never rewrite it.
    """
    return is_repo() and ledger.state_dir().resolve().is_relative_to(repo().resolve())


def excluded_paths() -> list[str]:
    """Repo-relative state paths kept out of every iteration diff (the default ones and a relocated state dir)."""
    out = {f"autoresearch/{e}" for e in STATE_ENTRIES}
    state = ledger.state_dir().resolve()
    if state.is_relative_to(repo().resolve()):
        rel = state.relative_to(repo().resolve()).as_posix()
        out |= {f"{rel}/{e}" if rel != "." else e for e in STATE_ENTRIES}
    return sorted(out)


def _pathspec(keep_out: Iterable[str] = ()) -> list[str]:
    return ["--", ".", *(f":(exclude){p}" for p in excluded_paths()), ":(exclude,glob)**/.*.tmp-*",
            *(f":(exclude,literal){p}" for p in keep_out)]


def untracked() -> list[str]:
    """Untracked, not ignored paths outside the state files; a wholly untracked directory is one entry."""
    out = _run("ls-files", "--others", "--exclude-standard", "--directory", "--no-empty-directory", "-z",
               *_pathspec()).decode(errors="surrogateescape")
    return sorted(p.rstrip("/") for p in out.split("\0") if p)


def head() -> str:
    return _run("rev-parse", "HEAD").decode().strip()


def head_tree() -> str:
    try:
        return _run("rev-parse", "HEAD^{tree}").decode().strip()
    except TreeError:
        return EMPTY_TREE


def _with_index(base: str, fn):
    with tempfile.TemporaryDirectory(prefix="hops-index-") as tmp:
        env = {"GIT_INDEX_FILE": str(Path(tmp) / "index")}
        _run("read-tree", base, env=env)
        fn(env)
        return _run("write-tree", env=env).decode().strip()


def snapshot(keep_out: Iterable[str] = ()) -> str:
    """The working tree (tracked + untracked, .gitignore respected, state files and `keep_out` as in HEAD)."""
    return _with_index(head_tree(), lambda env: _run("add", "-A", *_pathspec(keep_out), env=env))


def stacked(patches: list[Path], base: str | None = None) -> str:
    """`base` (default HEAD's tree) with `patches` applied in order, as a tree id; a conflict names the patch."""
    def apply(env):
        for p in patches:
            try:
                _run("apply", "--cached", "--binary", str(p), env=env)
            except TreeError as exc:
                raise TreeError(f"{p.name} does not apply on top of the patches below it ({exc})") from None

    return _with_index(base or head_tree(), apply)


def diff(a: str, b: str) -> str:
    return _run("diff", "--binary", "--full-index", "--no-renames", a, b).decode(errors="surrogateescape")


def changed(a: str, b: str) -> list[tuple[str, str]]:
    """(status A/M/D, path) between two trees."""
    out = _run("diff", "--name-status", "--no-renames", "-z", a, b).decode(errors="surrogateescape")
    parts = [x for x in out.split("\0") if x]
    return [(parts[i][0], parts[i + 1]) for i in range(0, len(parts) - 1, 2)]


def apply(patches: list[Path]) -> None:
    """Apply patches to the working tree, all or nothing (checked on a scratch index and the tree first)."""
    tree = stacked(patches)  # raises on the first patch that does not apply
    taken = [p for s, p in changed(head_tree(), tree) if s == "A" and os.path.lexists(repo() / p)]
    if taken:
        raise TreeError(f"the patches create {', '.join(taken[:5])}{', ...' if len(taken) > 5 else ''}, which "
                        f"already exist(s) untracked in the working tree: move them out of the way first")
    for p in patches:
        _run("apply", "--binary", str(p))


def restore(tree: str | None = None) -> list[str]:
    """Make the working tree equal HEAD again for every path in which `tree` (default: now) differs; returns them."""
    tree = tree or snapshot()
    base = head_tree()
    paths = changed(base, tree)
    keep = [p for s, p in paths if s != "A"]
    if keep:
        _run("checkout", "HEAD", "--", *keep)
    for s, p in paths:
        if s == "A":
            _run("rm", "--cached", "-q", "--ignore-unmatch", "--", p)
            f = repo() / p
            if f.is_file() or f.is_symlink():
                f.unlink()
            d = f.parent
            while d != repo() and d.is_dir() and not any(d.iterdir()):
                d.rmdir()
                d = d.parent
    return [p for _, p in paths]


def export(tree: str, dest: Path) -> Path:
    """Write `tree` into `dest` (a plain directory, no .git): what a subprocess evaluates."""
    dest.mkdir(parents=True, exist_ok=True)
    archive = _run("archive", "--format=tar", tree)
    try:
        subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True, capture_output=True, timeout=120)
    except (OSError, subprocess.SubprocessError) as exc:
        raise TreeError(f"cannot unpack tree {tree[:12]} into {dest} ({exc})") from None
    return dest


def slug(text: str, words: int = 6) -> str:
    s = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    return "-".join(s.split("-")[:words]) or "change"
