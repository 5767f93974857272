"""The held-out split guard, kept in the core so the importer can enforce it.

Numbers measured on the test split are honest only while no modeling,
calibration or search code has ever read it. The guard therefore sits at every
door such code goes through, and answers before the door opens (from path names
and ``stat`` only, nothing under the test split is opened, listed or hashed):
naming a split (``check_split``: ``test``, ``./test``, ``train/../test``) and
reading any path of a fixture (``check_path``: as given, normalised, and with
symlinks resolved), which ``list_fixtures``, the trace and link-bench importers,
``predict`` and scenario loading all call. It lives here, not in autoresearch,
so the simulator core can refuse a test trace without importing the calibration loop.

The only way through is a :class:`CheckpointToken`, which is minted by
:func:`issue_checkpoint_token` for the human-confirmed checkpoint command.
This stops accidents (a glob over ``ROOT/*``, a ``--split test`` typo, a
symlink into the test tree), not a determined adversary: anyone can still
``open()`` the files, but no HOPS code path will do it for them.
"""
from __future__ import annotations

import os
import posixpath
from pathlib import Path

from hops.errors import HopsError

HELD_OUT_SPLITS = frozenset({"test"})
REFUSAL = ("the test split is held out: only `python -m autoresearch checkpoint --split test "
           "--confirm-human ...` may read it")

_KEY = object()  # module-private: only this module can construct tokens


class SplitGuardError(HopsError, PermissionError):
    """Something asked to read the held-out split without a checkpoint token."""

    def __init__(self, message: str = REFUSAL):
        super().__init__(message)


class CheckpointToken:
    """Proof that the caller is the human-confirmed checkpoint, passed explicitly.

    Explicit passing (rather than a global switch or an environment variable)
    means every function that reads held-out data says so in its call, and a
    token cannot leak into unrelated code by being "on".
    """

    __slots__ = ("purpose",)

    def __init__(self, purpose: str, *, _key: object = None):
        if _key is not _KEY:
            raise TypeError("CheckpointToken is minted only by hops.traces.guard.issue_checkpoint_token")
        self.purpose = purpose

    def __reduce__(self):
        # Process pools pickle their arguments; a token must survive that trip intact.
        return (_reissue, (self.purpose,))

    def __repr__(self) -> str:
        return f"CheckpointToken({self.purpose!r})"


def _reissue(purpose: str) -> CheckpointToken:
    return CheckpointToken(purpose, _key=_KEY)


def issue_checkpoint_token(*, confirm_human: bool, purpose: str) -> CheckpointToken:
    """Mint a token; only the checkpoint command should call this, after a human confirmed."""
    if confirm_human is not True:
        raise SplitGuardError(REFUSAL + " (a human must confirm the checkpoint)")
    if not purpose:
        raise SplitGuardError("a checkpoint token needs a purpose (it is recorded with the checkpoint)")
    return CheckpointToken(purpose, _key=_KEY)


def is_token(token: object) -> bool:
    return isinstance(token, CheckpointToken)


def _split_parts(split: str) -> list[str]:
    """Every directory name a split argument walks through, before and after normalising it."""
    raw = str(split).replace("\\", "/")
    return raw.split("/") + posixpath.normpath(raw or ".").split("/")


def names_held_out_split(split: str) -> bool:
    """Does this split argument lead into a held-out split (``test``, ``test/``, ``./test``, ``x/../test``)?

    Decided from the string alone, so the answer never depends on (or reveals)
    what exists on disk. Case is ignored: on a case-insensitive file system
    ``TEST`` is the test split.
    """
    return any(part.casefold() in HELD_OUT_SPLITS for part in _split_parts(split))


def check_split(split: str, token: object = None) -> None:
    """Refuse a split argument that leads into a held-out split unless a checkpoint token is presented."""
    if names_held_out_split(split) and not is_token(token):
        raise SplitGuardError()


def _candidates(path: Path) -> tuple[Path, ...]:
    # Lexically normalised (collapses train/../test without touching the disk) and
    # symlink-resolved (a link from a scratch directory into the test tree).
    return Path(os.path.normpath(path.absolute())), path.resolve()


def held_out_split_of(path: str | Path) -> str | None:
    """The held-out split a path lies in, if any: a fixture dir, a file inside one, or a split dir.

    The layout is ``<root>/<split>/cluster_results/<id>/...``, so a path is held out when
    it passes through ``<held-out name>/cluster_results`` or names a held-out split
    directory that has a ``cluster_results`` inside. Both the path as given and its
    symlink-resolved target are checked. Only path names and ``stat`` are used: nothing
    under the held-out split is opened or listed.
    """
    for candidate in _candidates(Path(path)):
        parts = candidate.parts
        for i, part in enumerate(parts[:-1]):
            if part.casefold() in HELD_OUT_SPLITS and parts[i + 1] == "cluster_results":
                return part
        if candidate.name.casefold() in HELD_OUT_SPLITS and (candidate / "cluster_results").is_dir():
            return candidate.name
    return None


def check_path(path: str | Path, token: object = None) -> None:
    """Refuse to read anything inside a held-out split unless a checkpoint token is presented."""
    if held_out_split_of(path) is not None and not is_token(token):
        raise SplitGuardError(f"{path}: {REFUSAL}")


def check_fixture_dir(fixture_dir: str | Path, token: object = None) -> None:
    """Refuse to read a fixture of a held-out split unless a checkpoint token is presented."""
    check_path(fixture_dir, token)
