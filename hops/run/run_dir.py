"""A `hops.run` owns its output directory for the whole run: one run per directory at a time.

Two runs into the same `hydra.run.dir` used to interleave: both wrote the same temporary
names and renamed them into place, so a directory could hold A's summary.json next to B's
timeline.png, or a dashboard.png made of B's PNG followed by the tail of A's, and still look
like a finished run. Now the first run takes an exclusive lock on `<dir>/.hops.lock` before
Hydra writes anything there (its .hydra/ configs, the job log), holds it until the process
is done, and a second run into the busy directory is refused with one line. A run that
starts in a directory a finished run used sets that run's files aside first (into
`.hops.previous/`), so what the directory holds afterwards comes from one run only; they are
deleted once the new run's outputs are complete, and put back when it ends without them (a
user error, an interrupt), so a typo never costs the last finished run. A -m sweep locks its
sweep directory the same way (its jobs already get distinct job directories); a sweep and a
single run never share a directory, nor two sweeps, since the second's job list may be shorter.

The lock is an OS lock (filelock: flock on POSIX), released by the OS when the holder dies,
so a killed run never leaves a directory locked.
"""
from __future__ import annotations

import os
import shutil
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

PREVIOUS = ".hops.previous"  # the last finished run's files while a new run in the directory is under way
HYDRA_FILES = (".hydra", "run.log")  # what Hydra writes into a run directory besides the outputs
SWEEP_FILES = ("multirun.yaml", "sweep_results.csv")  # what marks a directory as a sweep's

_held: list[FileLock] = []
_aside: list[Path] = []  # directories whose previous run this process set aside


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


def clear_previous(directory: str | Path, temporaries_only: bool = False) -> None:
    """Remove the outputs (and interrupted temporaries) of an earlier run into this directory."""
    directory = Path(directory)
    for name in RUN_OUTPUTS:
        if not temporaries_only:
            (directory / name).unlink(missing_ok=True)
        stem, _, suffix = name.partition(".")
        for tmp in directory.glob(f".{stem}.*tmp*"):
            tmp.unlink(missing_ok=True)


def set_aside(directory: str | Path, keep: Path | None = None) -> None:
    """Move the last finished run's files (its summary.json is there) into PREVIOUS, replacing
    an older set, and remove an interrupted run's leftovers. `keep` (the scenario file this run
    is about to read, when it is that run's scenario.yaml) is copied, not moved."""
    directory = Path(directory)
    previous = directory / PREVIOUS
    if (directory / "summary.json").is_file():
        shutil.rmtree(previous, ignore_errors=True)
        previous.mkdir()
        for name in (*RUN_OUTPUTS, *HYDRA_FILES):
            src = directory / name
            if src.exists():
                (shutil.copy2 if keep is not None and src.resolve() == keep else os.replace)(src, previous / name)
    for name in RUN_OUTPUTS:
        if keep is None or (directory / name).resolve() != keep:
            (directory / name).unlink(missing_ok=True)
    clear_previous(directory, temporaries_only=True)
    _aside.append(directory)


def finished(directory: str | Path) -> None:
    """The run's outputs are complete: the previous run's set-aside files go."""
    directory = Path(directory)
    shutil.rmtree(directory / PREVIOUS, ignore_errors=True)
    if directory in _aside:
        _aside.remove(directory)


def put_back() -> None:
    """A run that ended without its outputs leaves the directory as the last finished run left it."""
    while _aside:
        directory = _aside.pop()
        previous = directory / PREVIOUS
        if not previous.is_dir():
            continue
        clear_previous(directory)
        for item in previous.iterdir():
            dst = directory / item.name
            if dst.is_dir() and not dst.is_symlink():
                shutil.rmtree(dst)
            os.replace(item, dst)
        previous.rmdir()


def refuse_other_kind(directory: Path, sweep: bool) -> None:
    """A sweep into a directory holding a run's or an earlier sweep's results, or a run into a
    sweep's, would leave the two side by side (job directories the new job list does not reach,
    a summary.json beside job directories): one line instead."""
    what = "hydra.sweep.dir" if sweep else "hydra.run.dir"
    marks = [n for n in (*SWEEP_FILES, *(("summary.json",) if sweep else ())) if (directory / n).is_file()]
    if marks:
        holds = "an earlier sweep's" if marks[0] in SWEEP_FILES else "an earlier run's"
        raise DirectoryBusy(f"{what}={directory} holds {holds} results ({marks[0]}); pass another {what}, or "
                            f"remove them first")


def cannot_write(exc: OSError, where: str = "hydra.run.dir / hydra.sweep.dir") -> str:
    """The one line for an output that cannot be written. A failed rename names its
    destination second: that is the output the user knows, not the temporary written first."""
    return f"cannot write {exc.filename2 or exc.filename}: {exc.strerror or exc} (choose another {where})"


def release() -> None:
    """Give up every directory this process holds (the OS does the same if it dies first),
    putting back the previous run's files where this run did not finish (put_back)."""
    put_back()
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
            _or_exit(refuse_other_kind, directory, False)
            scenario_file = config.get("scenario_file")
            keep = Path(str(scenario_file)).absolute().resolve() if scenario_file else None
            try:
                set_aside(directory, keep)
            except OSError as exc:  # e.g. a directory where an output goes
                print(f"error: {cannot_write(exc, 'hydra.run.dir')}", file=sys.stderr)
                raise SystemExit(EXIT_USER_ERROR) from None

    def on_run_end(self, config, **kwargs: Any) -> None:
        release()

    def on_multirun_start(self, config, **kwargs: Any) -> None:
        directory = Path(str(config.hydra.sweep.dir)).absolute()
        if _or_exit(own, directory, "hydra.sweep.dir"):
            _or_exit(refuse_other_kind, directory, True)

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
