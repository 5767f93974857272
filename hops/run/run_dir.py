"""A `hops.run` owns its output directory for the whole run: one run per directory at a time.

Two runs into the same `hydra.run.dir` used to interleave: both wrote the same temporary
names and renamed them into place, so a directory could hold A's summary.json next to B's
timeline.png, or a dashboard.png made of B's PNG followed by the tail of A's, and still look
like a finished run. Now the first run takes an exclusive lock on `<dir>/.hops.lock` before
Hydra writes anything there (its .hydra/ configs, the job log), holds it until the process
is done, and a second run into the busy directory is refused with one line. A run that
starts in a directory a finished run used removes that run's outputs first, so what the
directory holds afterwards comes from one run only. A -m sweep locks its sweep directory the
same way (its jobs already get distinct job directories).

The lock is an OS lock (filelock: flock on POSIX), released by the OS when the holder dies,
so a killed run never leaves a directory locked.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

from hops.errors import EXIT_USER_ERROR, HopsError

try:  # the callback base class (Hydra is there whenever this callback is configured)
    from hydra.experimental.callback import Callback
except ImportError:  # pragma: no cover
    Callback = object  # type: ignore[misc,assignment]

LOCK = ".hops.lock"
OWNER = ".hops.owner"  # the holder's pid, for the refusal message (the lock file itself is truncated by contenders)
# Every file hops.run.write_outputs and hops.run.task write into a run directory
# (tests/test_run_dir.py checks a full run writes nothing else).
RUN_OUTPUTS = ("summary.json", "events.csv", "scenario.yaml", "timeline.png", "dashboard.png", "progress.png",
               "trace.json", "trace.json.gz", "error.txt")

_held: list[FileLock] = []


class DirectoryBusy(HopsError):
    """Another run holds the directory."""


def own(directory: str | Path, what: str = "hydra.run.dir") -> None:
    """Lock `directory` for this process until release(), or raise DirectoryBusy naming its holder."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    lock = FileLock(directory / LOCK, timeout=0)
    try:
        lock.acquire()
    except Timeout:
        try:
            holder = f" (pid {int((directory / OWNER).read_text())})"
        except (OSError, ValueError):
            holder = ""
        raise DirectoryBusy(f"{what}={directory} is in use by another hops run{holder}; wait for it to finish or "
                            f"pass another {what}") from None
    _held.append(lock)
    (directory / OWNER).write_text(f"{os.getpid()}\n")


def clear_previous(directory: str | Path) -> None:
    """Remove the outputs (and interrupted temporaries) of an earlier run into this directory."""
    directory = Path(directory)
    for name in RUN_OUTPUTS:
        (directory / name).unlink(missing_ok=True)
        stem, _, suffix = name.partition(".")
        for tmp in directory.glob(f".{stem}.*tmp*"):
            tmp.unlink(missing_ok=True)


def cannot_write(exc: OSError, where: str = "hydra.run.dir / hydra.sweep.dir") -> str:
    """The one line for an output that cannot be written. A failed rename names its
    destination second: that is the output the user knows, not the temporary written first."""
    return f"cannot write {exc.filename2 or exc.filename}: {exc.strerror or exc} (choose another {where})"


def release() -> None:
    """Give up every directory this process holds (the OS does the same if it dies first)."""
    while _held:
        _held.pop().release()


class OwnRunDir(Callback):
    """Hydra callback: the run (or the sweep) takes its directory before Hydra writes into it.

    Hydra turns an exception in a callback into a warning and carries on, so a refusal
    ends the process here the way hops.run.task ends on a user error: one line, exit code 2.
    """

    def on_run_start(self, config, **kwargs: Any) -> None:
        directory = Path(str(config.hydra.run.dir)).absolute()
        if _or_exit(own, directory, "hydra.run.dir"):
            try:
                clear_previous(directory)
            except OSError as exc:  # e.g. a directory where an output goes
                print(f"error: {cannot_write(exc, 'hydra.run.dir')}", file=sys.stderr)
                raise SystemExit(EXIT_USER_ERROR) from None

    def on_run_end(self, config, **kwargs: Any) -> None:
        release()

    def on_multirun_start(self, config, **kwargs: Any) -> None:
        _or_exit(own, Path(str(config.hydra.sweep.dir)).absolute(), "hydra.sweep.dir")

    def on_multirun_end(self, config, **kwargs: Any) -> None:
        release()


def _or_exit(fn, *args) -> bool:
    """True once the directory is ours; False if it cannot be created (Hydra's own mkdir then
    fails next, and hops.run reports that as its one line: "cannot write DIR")."""
    try:
        fn(*args)
    except DirectoryBusy as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(EXIT_USER_ERROR) from None
    except OSError:
        return False
    return True
