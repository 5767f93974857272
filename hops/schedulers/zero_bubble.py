"""Zero-bubble family: backward split into B (activation gradient) and W (weight gradient).

B sits on the critical path (the previous stage waits for its gradient); W does not, so
it is deferred into time the stage would otherwise idle. Activation memory is capped at
the 1F1B level (p - s microbatches held on stage s), as in the ZB-H1 schedule.
"""
from __future__ import annotations

from .base import Scheduler, SchedulerState, Task


class ZeroBubble(Scheduler):
    """Greedy ZB-H1: run a ready B first, else a ready F within the memory cap, else a deferred W."""

    name = "zero_bubble"
    option_names = ("max_in_flight",)
    split_backward = True

    def configure(self, meta) -> None:
        super().configure(meta)
        p = meta.n_stages
        cap = self.options.get("max_in_flight")
        self.cap = [cap if cap else p - s for s in range(p)]

    def next_tasks(self, state: SchedulerState) -> list[Task]:
        s = state.stage
        m = state.n_microbatches
        nb = state.n_b[s]
        if nb < m and state.b_ready[s][nb]:
            return [("B", nb)]
        nf = state.n_f[s]
        if nf < m and state.f_ready[s][nf] and state.in_flight[s] < self.cap[s]:
            return [("F", nf)]
        nw = state.n_w[s]
        if nw < nb:
            return [("W", nw)]
        return []
