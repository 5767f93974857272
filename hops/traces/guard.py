"""The held-out split guard, kept in the core so the importer can enforce it.

Numbers measured on the test split are honest only while no modeling,
calibration or search code has ever read it. The guard therefore sits at the
two doors such code goes through: listing a split (autoresearch) and parsing a
trace (``hops.traces.load_trace``). It lives here, not in autoresearch, so the
simulator core can refuse a test trace without importing the calibration loop.

The only way through is a :class:`CheckpointToken`, which is minted by
:func:`issue_checkpoint_token` for the human-confirmed checkpoint command.
This stops accidents (a glob over ``ROOT/*``, a ``--split test`` typo, a
symlink into the test tree), not a determined adversary: anyone can still
``open()`` the files, but no HOPS code path will do it for them.
"""
from __future__ import annotations

from pathlib import Path

from ..errors import HopsError

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


def check_split(split: str, token: object = None) -> None:
    """Refuse a held-out split name unless a checkpoint token is presented."""
    if split in HELD_OUT_SPLITS and not is_token(token):
        raise SplitGuardError()


def held_out_split_of(fixture_dir: str | Path) -> str | None:
    """The held-out split a fixture directory lives in (``<root>/<split>/cluster_results/<id>``), if any.

    Both the path as given and its symlink-resolved target are checked, so a
    link from a scratch directory into the test tree is still recognised.
    """
    path = Path(fixture_dir)
    for candidate in (path.absolute(), path.resolve()):
        parent = candidate.parent
        if parent.name == "cluster_results" and parent.parent.name in HELD_OUT_SPLITS:
            return parent.parent.name
    return None


def check_fixture_dir(fixture_dir: str | Path, token: object = None) -> None:
    """Refuse to read a fixture of a held-out split unless a checkpoint token is presented."""
    if held_out_split_of(fixture_dir) is not None and not is_token(token):
        raise SplitGuardError()
