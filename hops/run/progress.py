"""Progress on a terminal for work that takes a while: one mechanism for every HOPS command.

A run, a sweep, `autoresearch validate`, `search` and cross-validation all report through
`Progress`, so they behave alike:

- it is drawn on stderr, and only when stderr is a terminal (logs and pipes stay clean);
- it appears only once the work has taken `DELAY_S` (a short run prints its summary and
  nothing else);
- it is erased, not left behind, when the work ends, so what is printed next starts on a
  clean line;
- a thread redraws it every `REDRAW_S`, so the elapsed time moves while one long step (a
  big simulation, a slow writer) runs without calling `update`.

tqdm draws it. Every redraw goes through `tqdm.update`, which honours tqdm's `delay`;
`set_description()` and `refresh()` do not (they draw at once and leave tqdm believing
nothing was shown, so `close()` would not erase it), which is why callers use `phase()`.

A Progress holds a lock and a thread, so it cannot be pickled; an object that launchers
pickle (a Hydra callback) must not keep one in its state (see hops.run.sweep.SweepTable).
"""
from __future__ import annotations

import sys
import threading
from typing import TextIO

DELAY_S = 2.0
REDRAW_S = 0.5
MIN_INTERVAL_S = 0.1  # at most this often drawn by update(): cheap for callers that count fine-grained work


class Progress:
    """A progress line: `update(n)` counts work done, `phase(text)` says what runs now.

    Use as a context manager (or call `close()`); disabled it costs one attribute check per call.
    `total=None` counts without a bar (the count is still shown).
    """

    def __init__(self, total: int | None = None, desc: str = "", unit: str = "it", *,
                 enabled: bool | None = None, delay: float | None = None, stream: TextIO | None = None,
                 bar_format: str | None = None) -> None:
        stream = stream or sys.stderr
        if enabled is None:
            enabled = _isatty(stream)
        self._bar = None
        if not enabled:
            return
        from tqdm import tqdm

        self._lock = threading.Lock()
        # miniters=0: a redraw without new work (the thread's update(0)) still draws
        self._bar = tqdm(total=total, desc=desc, unit=unit, delay=DELAY_S if delay is None else delay, leave=False,
                         file=stream, dynamic_ncols=True, miniters=0, mininterval=MIN_INTERVAL_S,
                         bar_format=bar_format)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._redraw, name="hops-progress", daemon=True)
        self._thread.start()

    @property
    def enabled(self) -> bool:
        return self._bar is not None

    @property
    def n(self) -> int:
        return int(self._bar.n) if self._bar is not None else 0

    def update(self, n: int = 1) -> None:
        if self._bar is not None:
            with self._lock:
                self._bar.update(n)

    def set_count(self, n: int) -> None:
        """Set the count to `n` (for work counted from outside, e.g. finished jobs on disk)."""
        if self._bar is not None:
            with self._lock:
                self._bar.update(n - self._bar.n)

    def phase(self, text: str, total: int | None = None, unit: str | None = None) -> None:
        """Say what runs now; with `total`, start a new count (0 of `total`, in `unit`)."""
        if self._bar is None:
            return
        with self._lock:
            bar = self._bar
            bar.desc = f"{text}: " if text else ""
            if total is not None:
                bar.total, bar.n, bar.last_print_n = total, 0, 0
            if unit is not None:
                bar.unit = unit
            bar.update(0)  # draws only if the delay has passed

    def note(self, text: str) -> None:
        """A short text after the count (e.g. the fixture or trial just finished)."""
        if self._bar is not None:
            with self._lock:
                self._bar.set_postfix_str(text, refresh=False)

    def write(self, text: str, file: TextIO | None = None) -> None:
        """Print a line (stderr by default) without gluing it to the progress line."""
        if self._bar is None:
            print(text, file=file or sys.stderr, flush=True)
            return
        with self._lock:
            self._bar.clear()
            print(text, file=file or sys.stderr, flush=True)
            self._bar.update(0)

    def close(self) -> None:
        """Erase the line (if it was ever drawn) and stop redrawing. Safe to call twice."""
        if self._bar is None:
            return
        self._stop.set()
        self._thread.join()
        with self._lock:
            self._bar.close()
        self._bar = None

    def _redraw(self) -> None:
        while not self._stop.wait(REDRAW_S):
            with self._lock:
                if self._bar is not None:
                    self._bar.update(0)

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _isatty(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


def each(items, desc: str, unit: str = "it", *, total: int | None = None, enabled: bool | None = None,
         label=None):
    """Iterate over `items` with a progress line counting them (per fold, per trial, per fixture).

        for fold in each(folds, "crossval", "fold", label=lambda f: f.name):
            ...

    `label(item)` names the item being worked on. The line is erased when the loop ends,
    also when it ends early (break, exception).
    """
    if total is None and hasattr(items, "__len__"):
        total = len(items)
    with Progress(total=total, desc=desc, unit=unit, enabled=enabled) as progress:
        for item in items:
            if label is not None:
                progress.note(str(label(item)))
            yield item
            progress.update()

