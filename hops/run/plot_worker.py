"""A big run's PNGs drawn by a second process while this one writes events.csv and the trace.

Why a second process: at PP64 x 1024 x 4 the simulation takes ~4 s on one core; after it,
writing events.csv and trace.json takes ~1.2 s and drawing timeline.png and dashboard.png
another ~1.3 s, plus ~0.3 s to import matplotlib. One after the other, `python -m hops.run`
cost ~2.2x the simulation. The two halves are independent and the machine has a second core,
but threads do not overlap them: matplotlib draws holding the GIL (measured, the two halves
in two threads: 2.1-2.3 s instead of 2.6 s). So a second process draws.

How, and why so:
- It is started before the simulation (`PlotWorker()` submits matplotlib's import at once),
  so its interpreter start and imports (~0.7 s) overlap the simulation instead of the writers.
- `spawn`, not fork: a forked copy of a process that runs threads (the progress line's,
  MLflow's) can inherit a lock one of them holds and hang. ProcessPoolExecutor, with one
  worker, carries the call and any exception back, and reports a worker that died
  (BrokenProcessPool) instead of waiting for it: that becomes one line (`drawn`).
- The worker returns PNG bytes and never touches the run directory. This process writes them
  like every other output (a temporary name renamed into place, summary.json last), so a run
  that fails or is killed leaves nothing of the worker's behind.
- The worker ignores Ctrl-C, which the run's own process handles, and exits when that process
  is gone, also when it was killed (`_exit_with`).
- Only for a single run of at least MIN_PASSES stage-microbatch passes (`wanted`): below that
  drawing in process is cheaper than starting an interpreter (~0.5 s of CPU), and a sweep's
  jobs already run side by side on the cores.
- Only when a core is spare (`spare_core`): the worker costs ~1 s of CPU more than drawing in
  process (0.6-1.3 s measured: its interpreter, `import hops`, ~140 MB of Timeline through a
  pipe), a loss when other work keeps every core busy. Measured on the shared 2-core box at
  PP64 x 1024 x 4, runs of the tree before and after alternated (medians of 4-5): at load
  0.6-1.3 the worker made a 7.4-7.9 s run 6.9-7.1 s; at load 1.2-2.3, 8.0 s against 7.1 s.

Like any program that starts processes with spawn, a script that calls hops.run.app.main()
must do it under `if __name__ == "__main__":` (the worker imports the script's module).
"""
from __future__ import annotations

import io
import os
from concurrent.futures import Future
from typing import Any, Callable, NamedTuple

from hops.errors import HopsError

MIN_PASSES = 50_000  # stages x microbatches x iterations: ~0.7 s of simulation, ~0.3 s of drawing


class Plot(NamedTuple):
    """A PNG writer as data, so it can be sent to the worker (a lambda cannot be pickled):
    `draw(*args, path, **kwargs)`, where path is a file name or a binary file."""

    draw: Callable
    args: tuple
    kwargs: dict

    def __call__(self, path) -> Any:
        return self.draw(*self.args, path, **self.kwargs)


def wanted(doc: dict, multirun: bool) -> bool:
    """Whether this run's plots are worth a second process (the scenario as composed, before it runs)."""
    if multirun or not (doc.get("output") or {}).get("plots", True):
        return False
    sim, pipe = doc.get("simulation") or {}, doc.get("pipeline") or {}
    try:
        passes = len(pipe.get("stages") or []) * int(sim.get("microbatches") or 0) * int(sim.get("batches") or 1)
    except (TypeError, ValueError):  # not a number: the scenario's validation says so
        return False
    return passes >= MIN_PASSES and spare_core()


def spare_core() -> bool:
    """Whether a core is free for the worker, by the measure `make -l` uses: the load average
    (last minute) at least one below the cores this process may run on."""
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):  # no load average on this system: draw in process
        return False
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return load <= cores - 1


class PlotWorker:
    """One spawned process that draws Plots into memory; `close()` it whatever happens."""

    def __init__(self) -> None:
        from concurrent.futures import ProcessPoolExecutor
        from multiprocessing import get_context

        context = get_context("spawn")
        self._received = context.Event()
        self._pool = ProcessPoolExecutor(max_workers=1, mp_context=context, initializer=_start,
                                         initargs=(self._received, os.getpid()))
        self._pool.submit(_import_matplotlib)  # starts the process now, while the simulation runs

    def draw(self, plots: dict[str, Plot]) -> Future:
        """Start drawing, once the worker has the plots' data: the future's result is {file name: PNG bytes}.

        Why wait: the pool's feeder thread streams the data (~140 MB at PP64 x 1024 x 4) through
        a pipe 64 kB at a time, taking the GIL back after each write. While this thread writes
        events.csv it holds the GIL, so each write waited for a switch: the worker got its data
        and finished ~1 s later than when this thread waits (~0.2 s) and then writes.
        """
        future = self._pool.submit(_render, plots)
        while not self._received.wait(0.1):
            if future.done():  # failed or died before it got there: the future says why
                break
        return future

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def drawn(future: Future, names: list[str]) -> dict[str, bytes]:
    """The PNGs of `PlotWorker.draw`; a worker that died is one line naming the files."""
    from concurrent.futures.process import BrokenProcessPool

    try:
        return future.result()
    except BrokenProcessPool:
        raise HopsError(f"{', '.join(names)}: the process drawing them ended before it finished (killed, or out "
                        f"of memory?); run again, or with output.plots=false to skip the plots") from None


# --------------------------------------------------------------------------- in the worker
_received = None  # set once _render has its arguments


def _start(received, parent: int) -> None:
    import signal
    import threading

    global _received
    _received = received
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.Thread(target=_exit_with, args=(parent,), name="hops-parent-watch", daemon=True).start()


def _exit_with(parent: int) -> None:
    """End this worker once the run's process is gone (killed): the pool's result pipe has this
    process at both ends, so a result written for nobody would block it forever."""
    import time

    while os.getppid() == parent:
        time.sleep(0.5)
    os._exit(1)


def _import_matplotlib() -> None:
    import matplotlib.backends.backend_agg  # noqa: F401
    import matplotlib.figure  # noqa: F401

    import hops.outputs.plots  # noqa: F401


def _render(plots: dict[str, Plot]) -> dict[str, bytes]:
    _received.set()
    out = {}
    for name, plot in plots.items():
        buf = io.BytesIO()
        plot(buf)
        out[name] = buf.getvalue()
    return out
