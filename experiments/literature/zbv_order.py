"""python -m experiments.literature.zbv_order P M [CAP]: does a ZB-V order with zero steady-state bubble exist?

The ZB repository lists ZB-V at zero bubble with 1F1B's activation memory (2p chunk
activations of half a stage). Under optimizer post-validation a device starts its next
iteration as soon as its own is done, so the steady state has no bubble exactly when one
iteration is a parallelogram at unit chunk times: device d busy without a gap over
[d, 6m + d) (it cannot start before the first input reaches it at d, and has 6m units of
work). HOPS's list rules (hops/schedulers/zb_v.py) reach that only above 2p; this asks an
integer program (scipy's HiGHS) whether any order reaches it at CAP (default 2p), so the
gap is known to be the rules', not the schedule's. One binary per (task, time slot); the
constraints are the V's dependencies, one task per device and slot, and the activation cap
(a chunk activation is held from its F's start to its W's end). Small cases only: (4, 8)
takes a minute or two.
"""
from __future__ import annotations

import argparse
import sys

import numpy as np
import scipy.sparse as sparse
from scipy.optimize import Bounds, LinearConstraint, milp


def parallelogram_order(p: int, m: int, cap: int, time_limit: float = 300.0) -> list[list[str]] | None:
    """Per device, its tasks in slot order ("Fa3": F of its first chunk on microbatch 3, "c" the
    returning chunk), or None if no order exists (or none was found within time_limit)."""
    n, span = 2 * p, 6 * m
    dev = [k if k < p else n - 1 - k for k in range(n)]
    tasks = [(k, ph, j) for k in range(n) for ph in "FBW" for j in range(m)]
    tid = {t: i for i, t in enumerate(tasks)}
    col = {}
    for i, (k, _, _) in enumerate(tasks):
        for t in range(dev[k], dev[k] + span):
            col[(i, t)] = len(col)
    rows, cols, vals, lo, hi = [], [], [], [], []

    def add(entries, low, high):
        for c, v in entries:
            rows.append(len(lo))
            cols.append(c)
            vals.append(v)
        lo.append(low)
        hi.append(high)

    def slots(i):
        d = dev[tasks[i][0]]
        return range(d, d + span)

    def before(a, b):  # b starts at least one unit after a starts (unit tasks: after a ends)
        add([(col[(tid[b], t)], t) for t in slots(tid[b])] + [(col[(tid[a], t)], -t) for t in slots(tid[a])],
            1, np.inf)

    for i in range(len(tasks)):
        add([(col[(i, t)], 1) for t in slots(i)], 1, 1)
    for d in range(p):
        mine = [i for i, (k, _, _) in enumerate(tasks) if dev[k] == d]
        for t in range(d, d + span):
            add([(col[(i, t)], 1) for i in mine], 1, 1)
        for t in range(d, d + span):
            held = []
            for k in (d, n - 1 - d):
                for j in range(m):
                    held += [(col[(tid[(k, "F", j)], s)], 1) for s in range(d, t + 1)]
                    held += [(col[(tid[(k, "W", j)], s)], -1) for s in range(d, t)]
            add(held, -np.inf, cap)
    for j in range(m):
        for k in range(1, n):
            before((k - 1, "F", j), (k, "F", j))
            before((k, "B", j), (k - 1, "B", j))
        before((n - 1, "F", j), (n - 1, "B", j))
        for k in range(n):
            before((k, "B", j), (k, "W", j))
            if j + 1 < m:
                for ph in "FBW":
                    before((k, ph, j), (k, ph, j + 1))
    a = sparse.csr_matrix((vals, (rows, cols)), shape=(len(lo), len(col)))
    res = milp(np.zeros(len(col)), constraints=LinearConstraint(a, lo, hi), integrality=np.ones(len(col)),
               bounds=Bounds(0, 1), options={"time_limit": time_limit})
    if res.x is None:
        return None
    order = [[""] * span for _ in range(p)]
    for (i, t), c in col.items():
        if res.x[c] > 0.5:
            k, ph, j = tasks[i]
            order[dev[k]][t - dev[k]] = f"{ph}{'a' if k < p else 'c'}{j}"
    return order


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m experiments.literature.zbv_order", description=__doc__.splitlines()[0])
    ap.add_argument("p", type=int)
    ap.add_argument("m", type=int)
    ap.add_argument("cap", type=int, nargs="?", help="chunk activations per device (default 2p, 1F1B's memory)")
    ap.add_argument("--time-limit", type=float, default=300.0)
    args = ap.parse_args(argv)
    cap = args.cap or 2 * args.p
    order = parallelogram_order(args.p, args.m, cap, args.time_limit)
    if order is None:
        print(f"p {args.p}, m {args.m}, cap {cap}: no zero-bubble order found (infeasible or time limit)")
        return 1
    print(f"p {args.p}, m {args.m}, cap {cap}: a zero-bubble order exists (device d busy over [d, 6m + d))")
    for d, tasks in enumerate(order):
        print(f"  device {d} from {d}: {' '.join(tasks)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
