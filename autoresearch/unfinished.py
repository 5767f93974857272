"""Runs a killed command left looking like records: found and closed by `python -m autoresearch repair`.

A command marks a run complete (FINISHED, an iteration `open`) only once what the run records
is durable, so a kill leaves an honest trace: a RUNNING run whose writer process is gone
(a gate killed after creating its run; an admit killed before its journal landed), or an
iteration run born `void` whose propose died before recording the baseline. Older ledgers
can also hold the states this replaced: an open iteration without a baseline. Repair closes
the first kind as KILLED and tags it `incomplete`, and gives the second its baseline from the
golden file when that is provably the baseline, else tags it `baseline_missing` (it stays open:
voiding someone's open work is not a repair), so no record claims what did not happen.
"""
from __future__ import annotations

import time

from . import ledger

INCOMPLETE = "its command was killed before it finished; not a result (closed by repair)"
NO_BASELINE = "baseline_missing"
LEGACY_AGE_S = 24 * 3600  # a RUNNING run without a writer tag (older code) is stale after a day


def repair(book: ledger.Ledger) -> list[str]:
    """What was repaired, one phrase each (call under ledger.state_lock())."""
    return [*_close_dead_runs(book), *_restore_baselines(book)]


def _dead(run) -> bool:
    alive = ledger.writer_alive(run.data.tags.get(ledger.WRITER))
    if alive is not None:
        return not alive
    if ledger.WRITER in run.data.tags:
        return False  # written on another host: only that host can tell
    return time.time() * 1000 - run.info.start_time > LEGACY_AGE_S * 1000


def _close_dead_runs(book: ledger.Ledger) -> list[str]:
    done = []
    for run in book.runs(ledger.CALIBRATION, "attributes.status = 'RUNNING'"):
        t = run.data.tags
        if t.get("run_type") == "iteration" and t.get("outcome") != "void":
            continue  # an open iteration runs until it closes; a closed one is the jsonl's to settle
        if not _dead(run):
            continue
        gate_run = "gate" in t or "whatif" in t  # commands.log_gate tags whatif at creation, the verdict last
        tags = {"incomplete": INCOMPLETE, **({"gate": "incomplete"} if gate_run else {})}
        book.log(run.info.run_id, tags=tags)
        book.finish(run.info.run_id, "KILLED")
        what = (f"iteration {t.get('iteration')} (void: {t.get('reason') or 'never opened'})"
                if t.get("run_type") == "iteration" else f"{t.get('run_type', 'a')} run")
        done.append(f"{what} {run.info.run_id[:8]}: killed before it finished; closed as KILLED, tagged incomplete")
    return done


def _restore_baselines(book: ledger.Ledger) -> list[str]:
    """An open iteration without `before.*` metrics (a propose killed before the fix above)."""
    from .gate import GateConfig, read_golden

    done = []
    for run in book.open_runs():
        if any(k.startswith("before.") for k in run.data.metrics):
            continue
        t = run.data.tags
        n = int(t.get("iteration", 0))
        golden = read_golden()
        admitted = (golden.get("admitted") or {}).get("iteration")
        if not t.get("stack_on") and isinstance(admitted, int) and admitted < n:
            # nothing lands while an iteration is open, so the golden file is still its baseline
            cfg = GateConfig.load()
            before = {v: golden["aggregates"][v] for v in cfg.gated_variants if v in golden["aggregates"]}
            book.log(run.info.run_id, metrics=ledger.aggregate_metrics(before, prefix="before."))
            done.append(f"iteration {n}: had no baseline; recorded the golden file's (iteration {admitted})")
        elif run.data.tags.get(NO_BASELINE) is None:
            book.log(run.info.run_id, tags={NO_BASELINE: "its propose was killed before recording the baseline, "
                                                         "and the golden file may not be it"})
            done.append(f"iteration {n}: open without a baseline that can be recovered; tagged {NO_BASELINE} "
                        f"(revert it and propose again for a before -> after)")
    return done
