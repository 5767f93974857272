"""The PNG charts drawn in a forked child while the run's own process writes the text outputs.

Why a fork: matplotlib holds the GIL while it draws, so a thread gains nothing, and a spawned
process must start an interpreter and `import hops` (tried in 48c5d21, reverted in 2a25299).
Why forked before the simulation (hops.run.app.task starts it): the child imports matplotlib
(~0.3 s) while the run simulates, on the second core, instead of after it; forked from the
small process that has not simulated yet, it also shares no Timeline pages copy-on-write with
the run. What it draws is sent once the run has it (`draw`): the writers pickled, the
Timeline's arrays out of band into an anonymous memory file the child maps without a copy
(benchmarks/run_bench.py times the whole). Where fork is missing or unsafe (anything but
Linux: macOS's system libraries do not survive a fork of a threaded process) or only one core
is usable, the caller draws them in turn, as before.

The child only draws and renames its files into place; it prints nothing, and reports back
through its socket what it wrote, or the error that stopped it: an OSError comes back as the
same errno, message and file, so a full disk reads as it does without the child.
"""
from __future__ import annotations

import json
import mmap
import os
import pickle
import signal
import socket
import sys
import traceback
from pathlib import Path
from typing import Callable, Sequence

ALIGN = 64  # each array's bytes start on a cache line in the memory file, as numpy's own allocations do


def supported() -> bool:
    """Whether this platform can run the chart process at all: Linux's fork and memory files."""
    return sys.platform == "linux" and hasattr(os, "fork") and hasattr(os, "memfd_create")


def available() -> bool:
    """Whether the charts are best drawn alongside: supported, and a second usable core."""
    return supported() and len(os.sched_getaffinity(0)) >= 2


class ChartProcess:
    """A forked child that imports the plotting code as it starts and then waits: `draw` sends
    it `jobs` ((key, writer) pairs; each writer picklable, returning the path it wrote), `join`
    returns {key: path} or raises what stopped the child, `stop` ends it unused or unjoined."""

    def __init__(self):
        ours, theirs = socket.socketpair()
        parent = os.getpid()
        pid = os.fork()
        if pid == 0:  # the child: never returns into the caller's code
            ours.close()
            _die_with(parent)
            quiet = os.open(os.devnull, os.O_WRONLY)  # the caller's stdout and stderr stay the caller's:
            os.dup2(quiet, 1)  # whoever reads them sees their end when the caller ends
            os.dup2(quiet, 2)
            try:
                _import_plotting()
                jobs = _receive(theirs)
                message = None if jobs is None else {"paths": [(key, str(writer())) for key, writer in jobs]}
            except OSError as exc:
                message = {"os_error": [exc.errno, exc.strerror, exc.filename, None, exc.filename2]}
            except BaseException:  # noqa: BLE001 - a bug, or an interrupt: reported, then exit
                message = {"error": traceback.format_exc()}
            try:
                if message is not None:
                    theirs.sendall(json.dumps(message).encode())
            finally:
                os._exit(0)  # no atexit handlers, no flush of the parent's buffered output
        theirs.close()
        self.pid, self._socket = pid, ours

    def draw(self, jobs: Sequence[tuple[str, Callable[[], Path]]]) -> None:
        """Send the child its jobs: the pickle, then every out-of-band buffer (the arrays), in
        one memory file passed with the message; the child maps it, so nothing is copied twice."""
        buffers: list[pickle.PickleBuffer] = []
        head = pickle.dumps(list(jobs), protocol=5, buffer_callback=buffers.append)
        fd = os.memfd_create("hops-charts", os.MFD_CLOEXEC)
        try:
            sizes = []
            with os.fdopen(os.dup(fd), "wb") as memory:
                for part in [head, *(b.raw() for b in buffers)]:
                    memory.write(bytes(-memory.tell() % ALIGN))
                    memory.write(part)
                    sizes.append(len(part))
            socket.send_fds(self._socket, [json.dumps(sizes).encode()], [fd])
            self._socket.shutdown(socket.SHUT_WR)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the child stopped before (matplotlib missing, say): `join` reports why
        finally:
            os.close(fd)

    def join(self) -> dict[str, Path]:
        with self._socket.makefile("rb") as pipe:
            text = pipe.read()
        _, status = os.waitpid(self.pid, 0)
        self.pid = None
        self._socket.close()
        if not text:
            raise RuntimeError(f"the chart process ended without a report (wait status {status})")
        message = json.loads(text)
        if "os_error" in message:
            raise OSError(*message["os_error"])
        if "error" in message:
            raise RuntimeError("drawing the charts failed in the chart process:\n" + message["error"])
        return {key: Path(path) for key, path in message["paths"]}

    def stop(self) -> None:
        """End the child if it was not joined (unused, or the parent failed first): nothing is left running."""
        if self.pid is not None:
            os.kill(self.pid, signal.SIGTERM)
            os.waitpid(self.pid, 0)
            self._socket.close()
            self.pid = None


def _import_plotting() -> None:
    """What every chart needs, imported before the run has anything to draw."""
    import matplotlib.backends.backend_agg  # noqa: F401
    import matplotlib.figure  # noqa: F401

    import hops.outputs.plots  # noqa: F401


def _receive(sock: socket.socket):
    """The jobs `draw` sent, or None when the run closed the socket without any."""
    data, fds, _, _ = socket.recv_fds(sock, 1 << 16, 1)
    if not fds:
        return None
    sizes = json.loads(data)
    memory = mmap.mmap(fds[0], 0, access=mmap.ACCESS_COPY)  # private: a chart may write to its arrays
    os.close(fds[0])  # the mapping stays (the arrays are views of it) until the child exits
    view, parts, at = memoryview(memory), [], 0
    for size in sizes:
        at += -at % ALIGN
        parts.append(view[at:at + size])
        at += size
    return pickle.loads(parts[0], buffers=parts[1:])


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
