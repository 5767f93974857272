"""The PNG charts drawn in a forked child while the run's own process writes the text outputs.

Why a fork: matplotlib holds the GIL while it draws, so a thread gains nothing, and a spawned
process must import matplotlib and be sent the Timeline (about 140 MB pickled at PP64 x 1024),
which cost more than it saved (tried in 48c5d21, reverted in 2a25299). A forked child shares
the Timeline and the imported modules copy-on-write, so with a second core the charts take no
wall time beyond the text writers' (benchmarks/run_bench.py). Where fork is missing or unsafe
(anything but Linux: macOS's system libraries do not survive a fork of a threaded process) or
only one core is usable, the caller draws them in turn, as before.

The child only draws and renames its files into place; it prints nothing, and reports back
through a pipe what it wrote, or the error that stopped it: an OSError comes back as the same
errno, message and file, so a full disk reads as it does without the child.
"""
from __future__ import annotations

import json
import os
import signal
import sys
import traceback
from pathlib import Path
from typing import Callable, Sequence


def available() -> bool:
    """Whether the charts can be drawn alongside: Linux, and a second usable core."""
    if sys.platform != "linux" or not hasattr(os, "fork"):
        return False
    return len(os.sched_getaffinity(0)) >= 2


class ChartProcess:
    """A forked child running ``jobs`` ((key, writer) pairs, each writer returning the path it
    wrote); ``join`` returns {key: path} or raises what stopped the child."""

    def __init__(self, jobs: Sequence[tuple[str, Callable[[], Path]]]):
        read, write = os.pipe()
        parent = os.getpid()
        pid = os.fork()
        if pid == 0:  # the child: never returns into the caller's code
            os.close(read)
            _die_with(parent)
            quiet = os.open(os.devnull, os.O_WRONLY)  # the caller's stdout and stderr stay the caller's:
            os.dup2(quiet, 1)  # whoever reads them sees their end when the caller ends
            os.dup2(quiet, 2)
            try:
                message = {"paths": [(key, str(writer())) for key, writer in jobs]}
            except OSError as exc:
                message = {"os_error": [exc.errno, exc.strerror, exc.filename, None, exc.filename2]}
            except BaseException:  # noqa: BLE001 - a bug, or an interrupt: reported, then exit
                message = {"error": traceback.format_exc()}
            try:
                with os.fdopen(write, "w") as pipe:
                    pipe.write(json.dumps(message))
            finally:
                os._exit(0)  # no atexit handlers, no flush of the parent's buffered output
        os.close(write)
        self.pid, self._read = pid, read

    def join(self) -> dict[str, Path]:
        with os.fdopen(self._read) as pipe:
            text = pipe.read()
        _, status = os.waitpid(self.pid, 0)
        self.pid = None
        if not text:
            raise RuntimeError(f"the chart process ended without a report (wait status {status})")
        message = json.loads(text)
        if "os_error" in message:
            raise OSError(*message["os_error"])
        if "error" in message:
            raise RuntimeError("drawing the charts failed in the chart process:\n" + message["error"])
        return {key: Path(path) for key, path in message["paths"]}

    def stop(self) -> None:
        """End the child if it was not joined (the parent failed first): nothing is left running."""
        if self.pid is not None:
            os.kill(self.pid, signal.SIGTERM)
            os.waitpid(self.pid, 0)
            os.close(self._read)
            self.pid = None


PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _die_with(parent: int) -> None:
    """The child is killed when the run's process dies (a SIGKILL, the OOM killer), so no chart
    is renamed into place after the run is gone and nothing outlives it."""
    import ctypes

    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # no prctl: the orphan finishes its charts and exits
        pass
    if os.getppid() != parent:  # the parent died before the request took effect
        os._exit(1)
