"""Specifications for the calibration commands' process pool: a Ctrl-C ends it at once."""
import signal
import time

import pytest

from autoresearch.workers import interruptible_pool


def _sleep(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


def test_an_interrupt_ends_the_pool_at_once_and_leaves_no_worker_behind():
    t0 = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        with interruptible_pool(2) as pool:
            futures = [pool.submit(_sleep, 60.0) for _ in range(4)]
            futures[0].running() or time.sleep(0.5)
            workers = list(pool._processes.values())
            raise KeyboardInterrupt
    assert time.monotonic() - t0 < 10, "the workers' minute of sleep is not waited for"
    # the pool's own thread may reap a killed worker a moment after our join returns: allow it that moment
    deadline = time.monotonic() + 5
    while any(w.is_alive() for w in workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert workers and not any(w.is_alive() for w in workers)
    assert all(w.exitcode == -signal.SIGKILL for w in workers)


def test_the_workers_ignore_sigint_so_only_the_parent_acts_on_a_ctrl_c():
    with interruptible_pool(1) as pool:
        assert pool.submit(signal.getsignal, signal.SIGINT).result() == signal.SIG_IGN


def test_a_pool_that_ends_normally_returns_every_result():
    with interruptible_pool(2) as pool:
        assert sorted(f.result() for f in [pool.submit(_sleep, 0.01 * k) for k in range(4)]) == [0.0, 0.01, 0.02, 0.03]
