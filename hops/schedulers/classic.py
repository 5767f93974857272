"""GPipe and 1F1B: the two fused-backward schedules every pipeline paper starts from."""
from __future__ import annotations

from hops.schedulers.base import StaticOrderScheduler, Task


class GPipe(StaticOrderScheduler):
    """All forwards, then all backwards (flush per iteration): simplest, most activation memory."""

    name = "gpipe"
    option_names = ()

    def stage_order(self, s: int, p: int, m: int) -> list[Task]:
        return [("F", j) for j in range(m)] + [("BW", j) for j in range(m)]


class OneFOneB(StaticOrderScheduler):
    """PipeDream-flush 1F1B: p-s-1 warm-up forwards, then alternate, so stage s holds at most p-s activations."""

    name = "1f1b"
    option_names = ()

    def stage_order(self, s: int, p: int, m: int) -> list[Task]:
        warm = min(p - s - 1, m)
        order: list[Task] = [("F", j) for j in range(warm)]
        for i in range(m - warm):
            order += [("F", warm + i), ("BW", i)]
        order += [("BW", j) for j in range(m - warm, m)]
        return order
