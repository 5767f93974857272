"""HopsHetero (the seed's rule): pick zero bubble (ZB-H1) or 1f1b once, at configure time.

With T_i = f_i + b_i + w_i, the last stage has slack max_i(T_i) - T_last per microbatch.
If that slack can absorb a deferred weight-gradient (>= w_last), zero-bubble's deferral is
free there and it wins; otherwise the last stage is the bottleneck and the split only adds
cost, so fused 1F1B is used.
"""
from __future__ import annotations

from hops.schedulers.base import Scheduler, SchedulerState, Task
from hops.schedulers.classic import OneFOneB
from hops.schedulers.zero_bubble import ZeroBubble


class HopsHetero(Scheduler):
    name = "hops_hetero"
    option_names = ()  # neither ZB-H1 nor 1F1B takes options

    def configure(self, meta) -> None:
        super().configure(meta)
        totals = [f + b + w for f, b, w in zip(meta.f, meta.b, meta.w)]
        slack = max(totals) - totals[-1]
        self.chosen = ZeroBubble(**self.options) if slack >= meta.w[-1] else OneFOneB(**self.options)
        self.split_backward = self.chosen.split_backward
        self.chosen.configure(meta)

    def next_tasks(self, state: SchedulerState) -> list[Task]:
        return self.chosen.next_tasks(state)
