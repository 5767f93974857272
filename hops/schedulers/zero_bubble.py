"""Zero-bubble family (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024).

Backward is split into B (activation gradient, on the critical path: the previous stage
waits for it) and W (weight gradient, which nothing waits for), so W can be moved into time
the stage would otherwise idle. The activations of a microbatch are held until its W ends.
Both handcrafted schedules of the paper are fixed per-stage orders, written from the paper's
description (Section 3.1, Figure 3) and checked against its formulas in
tests/test_schedulers.py:

- ZB-H1: 1F1B's warm-up (p - s - 1 forwards on stage s), then 1F1B's F/B alternation with
  stage s starting its W's s steps late. Peak in-flight microbatches: p on every stage, the
  1F1B peak (stage 0's), so the pipeline's peak activation memory is 1F1B's. At unit times
  (F = B = W) the makespan is 3m + p - 1, a bubble of (p - 1)(F + B - W) per stage against
  1F1B's (p - 1)(F + B + W).
- ZB-H2: p - 1 - s extra warm-up forwards (2(p - s) - 1 in all) and W's 2s steps late: 2p - 1
  microbatches in flight on every stage, the paper's (2p - 1) M_B. Its "zero bubble" is a
  steady state across iterations that needs the paper's optimizer post-validation
  (``optimizer.post_validation: true``): stage s ends its iteration at 3m + s, exactly when
  the next iteration's first input reaches it, so N iterations at unit times take
  3mN + p - 1 (tests/test_post_validation.py). Under Megatron's flush and optimizer barrier
  (the default) one iteration still takes 3m + p - 1 (the last stage cannot start before
  p - 1), and ZB-H2 gains over ZB-H1 where W is shorter than B (tests/test_schedulers.py). Its warm-up needs m >= 2p - 1
  microbatches; fewer is refused (use zb_h1) rather than run as a truncated order that is
  neither schedule.

ZB-H1 gains nothing from post-validation at unit times (stage 0 both starts and ends each
iteration), only the barrier's wait. ``zero_bubble`` is an alias of ``zb_h1`` (the registry
maps the name).
"""
from __future__ import annotations

from hops.schedulers.base import PipelineMeta, StaticOrderScheduler, Task
from hops.errors import ScenarioError


class ZBH1(StaticOrderScheduler):
    """ZB-H1: 1F1B's memory peak, a third of 1F1B's bubble at unit times."""

    name = "zb_h1"
    option_names = ()
    split_backward = True
    post_validation = True

    def stage_order(self, s: int, p: int, m: int) -> list[Task]:
        warm = min(p - s - 1, m)
        order: list[Task] = [("F", j) for j in range(warm)]
        nw = 0
        for i in range(m):
            if warm + i < m:
                order.append(("F", warm + i))
            order.append(("B", i))
            if i >= s:
                order.append(("W", nw))
                nw += 1
        return order + [("W", j) for j in range(nw, m)]


class ZBH2(StaticOrderScheduler):
    """ZB-H2: about twice 1F1B's activation memory (2p - 1 microbatches) for extra warm-up forwards."""

    name = "zb_h2"
    option_names = ()
    split_backward = True
    post_validation = True

    def configure(self, meta: PipelineMeta) -> None:
        p, m = meta.n_stages, meta.n_microbatches
        if m < 2 * p - 1:
            raise ScenarioError("simulation.microbatches", f"{m} microbatches; zb_h2 needs at least 2p - 1 = "
                                f"{2 * p - 1} for its warm-up on {p} stages (use zb_h1)")
        super().configure(meta)

    def stage_order(self, s: int, p: int, m: int) -> list[Task]:
        warm = min(2 * (p - s) - 1, m)
        order: list[Task] = [("F", j) for j in range(warm)]
        nf, nw = warm, 0
        for i in range(m):
            order.append(("B", i))
            if i >= 2 * s:
                order.append(("W", nw))
                nw += 1
            if nf < m:
                order.append(("F", nf))
                nf += 1
        return order + [("W", j) for j in range(nw, m)]


ZeroBubble = ZBH1  # the historical name; `zero_bubble` resolves to ZB-H1
