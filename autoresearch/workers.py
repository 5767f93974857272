"""A process pool that a Ctrl-C ends at once.

A terminal's Ctrl-C reaches the whole process group. With a bare ProcessPoolExecutor the
workers take the KeyboardInterrupt too, in the middle of a read from the call queue or with
one of its locks held, and the parent's exit then waits on them for good. Here the workers
ignore SIGINT, so only the parent acts on it: it cancels what has not started and kills
the workers, which hold nothing a later command needs (their results go nowhere else).
"""
from __future__ import annotations

import signal
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@contextmanager
def interruptible_pool(max_workers: int, **kwargs):
    pool = ProcessPoolExecutor(max_workers, initializer=_ignore_sigint, **kwargs)
    try:
        yield pool
    except BaseException:
        workers = list((getattr(pool, "_processes", None) or {}).values())  # before shutdown forgets them
        pool.shutdown(wait=False, cancel_futures=True)
        for proc in workers:
            proc.kill()  # SIGKILL: a worker has nothing to save, and nothing can delay it
        for proc in workers:
            proc.join(timeout=5)
        raise
    pool.shutdown(wait=True)
