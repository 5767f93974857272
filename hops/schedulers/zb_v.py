"""ZB-V (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024, Section 6; the V-ZB
schedule of "Pipeline Parallelism with Controllable Memory", NeurIPS 2024).

The model is cut into 2p chunks and device d holds chunks d and 2p - 1 - d, so a microbatch's
forward runs down the devices and back up (a V), and its backward does the same in reverse;
the first and the last chunk, embedding and LM head, both sit on device 0. Backward is split
into B and W as in ZB-H1. The paper's claims, in chunk units (one chunk's F = B = W = 1, no
communication cost): every device holds at most 2p chunk activations of half a stage each,
i.e. 1F1B's p whole-stage microbatches, on every device rather than only on the first; each
microbatch crosses 4(p - 1) device boundaries, twice 1F1B's; and once m >= 2p there is no
bubble in the steady state. Under Megatron's per-iteration flush, which HOPS models, one
iteration cannot take less than 6m + p - 1: device p - 1 receives its first input after
p - 1 chunk forwards and then has 6m units of work.

Why a configure-time list schedule rather than a closed-form order: the paper draws ZB-V for
one (p, m) and states its rules, not a formula for every p. HOPS follows those rules at unit
times (each device, whenever idle: a ready B, else a forward if it holds fewer than 2p chunk
activations, the returning chunk's first, else the W of the oldest finished B) and hands the
resulting per-device order to the engine, which then runs it under real, jittered times like
any fixed-order schedule. The activation cap is a property of the order, so it holds under
any times. Two tie-breaks between ready B's are tried and the shorter one kept. What this
reaches is checked in tests/test_virtual_stages.py: 6m + p - 1 exactly at p = 1, 2, 3, 4 and
8 (m from 2p), and 1 to 4 units above it at the other depths up to 16, a constant that does
not grow with m -- not the paper's exact zero bubble at every depth, which needs its
hand-drawn order (not written down for general p).
"""
from __future__ import annotations

from .base import DeviceOrderScheduler, PipelineMeta


def v_placement(p: int) -> list[tuple[int, int]]:
    """(device, chunk) of each of the 2p model chunks: down the devices, then back up."""
    return [(k, 0) for k in range(p)] + [(p - 1 - k, 1) for k in range(p)]


def unit_time_orders(p: int, m: int, b_first: int) -> tuple[int, list, list] | None:
    """Per-device (chunk, phase, microbatch) orders of the rule above at unit times.

    ``b_first`` is the chunk whose ready B wins when both are ready. Returns (makespan,
    per-device peak chunk activations, orders), or None if the rule stalls.
    """
    n, cap, never = 2 * p, 2 * p, 1 << 60
    f_end = [[never] * m for _ in range(n)]
    b_end = [[never] * m for _ in range(n)]
    nf, nb, nw = [0] * n, [0] * n, [0] * n
    held, peak = [0] * p, [0] * p
    orders: list[list[tuple[int, str, int]]] = [[] for _ in range(p)]
    left, t = 3 * n * m, 0
    while left:
        started = []
        for d in range(p):
            ks = (d, n - 1 - d)  # chunk 0, chunk 1
            task = None
            for c in (b_first, 1 - b_first):
                k = ks[c]
                j = nb[k]
                if j < m and f_end[k][j] <= t and (k == n - 1 or b_end[k + 1][j] <= t):
                    task = (c, "B", j)
                    break
            if task is None and held[d] < cap:
                for c in (1, 0):  # the returning chunk first: it unblocks the loss and the backward
                    k = ks[c]
                    j = nf[k]
                    if j < m and (k == 0 or f_end[k - 1][j] <= t):
                        task = (c, "F", j)
                        break
            if task is None:
                best = None
                for c in (0, 1):
                    k = ks[c]
                    j = nw[k]
                    if j < nb[k] and b_end[k][j] <= t and (best is None or b_end[k][j] < best[0]):
                        best = (b_end[k][j], c, j)
                if best is not None:
                    task = (best[1], "W", best[2])
            if task is not None:
                started.append((d, task))
        if not started:
            if t > 6 * m * p + 4 * p:  # nothing can ever start again
                return None
            t += 1
            continue
        for d, (c, ph, j) in started:
            k = d if c == 0 else n - 1 - d
            orders[d].append((c, ph, j))
            left -= 1
            if ph == "F":
                f_end[k][j] = t + 1
                nf[k] += 1
                held[d] += 1
                peak[d] = max(peak[d], held[d])
            elif ph == "B":
                b_end[k][j] = t + 1
                nb[k] += 1
            else:
                nw[k] += 1
        for d, (_, ph, _) in started:
            if ph == "W":  # released when the W ends, i.e. before the next step's forwards
                held[d] -= 1
        t += 1
    return t, peak, orders


class ZBV(DeviceOrderScheduler):
    """ZB-V: 1F1B's activation memory on every device, for twice the pipeline messages."""

    name = "zb_v"
    option_names = ()
    split_backward = True

    @classmethod
    def placement(cls, p: int, v: int) -> list[tuple[int, int]]:
        if v != 2:
            raise ValueError(f"schedule 'zb_v' runs 2 model chunks per stage in a V; set pipeline.virtual_stages: 2 "
                             f"(got {v})")
        return v_placement(p)

    def configure(self, meta: PipelineMeta) -> None:
        p, m = meta.n_stages // 2, meta.n_microbatches
        runs = [r for r in (unit_time_orders(p, m, 1), unit_time_orders(p, m, 0)) if r is not None]
        self.unit_makespan, self.unit_peak, self._orders = min(runs, key=lambda r: (r[0], max(r[1])))
        super().configure(meta)

    def device_order(self, d: int, p: int, v: int, m: int) -> list[tuple[int, str, int]]:
        return self._orders[d]
