"""The MLflow runs and jsonl records of a calibration iteration, shared by the commands that open,
gate and close one (commands.py) and by the human rebaseline (rebaseline.py).

Apart from commands.py because rebaseline.py writes the same runs and records and commands.py
dispatches to it: kept in commands.py, the two would import each other.
"""
from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from hops.errors import HopsError

from . import ledger


def run_name(iteration, command: str) -> str:
    """What a person reads in the runs table: `it12 gate: host NIC caps`."""
    if iteration is None:
        return command
    t = iteration.data.tags
    return f"it{t.get('iteration')} {command}: {t.get('title') or short_title(t.get('hypothesis', ''))}"


def short_title(text: str, limit: int = 48) -> str:
    first = text.strip().split(". ")[0].split("\n")[0]
    return first if len(first) <= limit else first[: limit - 1].rsplit(" ", 1)[0] + "…"


def snapshot_or_none(keep_out=()) -> str | None:
    from . import worktree

    try:
        return worktree.snapshot(keep_out) if worktree.is_repo() else None
    except worktree.TreeError:
        return None


UNTRACKED = "untracked_at_open"
_CHUNK = 6000  # chars per tag value, under MLflow's 8000


def untracked_tags(paths: list[str]) -> dict[str, str]:
    """The untracked paths present when an iteration opened, as tags (JSON lists, split to fit a tag value)."""
    chunks, cur, size = [], [], 2
    for p in paths:
        n = len(json.dumps(p)) + 2  # the quoted path and its ", "
        if cur and size + n > _CHUNK:
            chunks.append(cur)
            cur, size = [], 2
        cur.append(p)
        size += n
    chunks.append(cur)
    return {UNTRACKED if i == 0 else f"{UNTRACKED}.{i}": json.dumps(c) for i, c in enumerate(chunks)}


def untracked_at_open(run) -> list[str]:
    """The paths `untracked_tags` recorded on an iteration run (none for runs opened before they were recorded)."""
    t = run.data.tags
    keys = sorted((k for k in t if k == UNTRACKED or k.startswith(UNTRACKED + ".")),
                  key=lambda k: int(k.rpartition(".")[2]) if k != UNTRACKED else 0)
    return [p for k in keys for p in json.loads(t[k])]


def log_gate(result, run_type: str, book: ledger.Ledger | None = None, iteration=None, *, finish: bool = True) -> str:
    """One run per gate evaluation; while an iteration is open it also becomes the iteration's "after".

    A what-if gate (--set) counts as evidence too (search proposals are judged that way before any
    file changes); the what-if is recorded next to the numbers so the log says which model they are.
    The tree the gate judged is recorded, so `park` can tell whether the patch it saves is that tree.
    The verdict tag and FINISHED come last, once the numbers are logged: a killed gate leaves a
    RUNNING run without a verdict (`repair` closes it). ``finish=False``: the caller finishes the run
    when its effect is durable (admit, in its journal).
    """
    from .gate import render

    book = book or ledger.Ledger()
    if iteration is None:
        iteration = book.open_iteration()
    cfg = result.cfg
    run = book.start_run(ledger.CALIBRATION, run_name(iteration, run_type), run_type=run_type,
                         params=ledger.provenance(cfg.split, cfg.variants, result.overrides),
                         tags={**(ledger.iteration_tags(iteration) if iteration else {}),
                               "whatif": str(bool(result.overrides))})
    ledger.crash_point(f"{run_type}:created")
    metrics = {"gate.violations": len(result.violations)}
    if result.report is not None:
        metrics |= ledger.aggregate_metrics(result.report.aggregates())
        metrics |= ledger.group_metrics(result.report.groups())
    if result.diagnostic is not None:
        metrics |= ledger.aggregate_metrics(result.diagnostic.aggregates(), prefix=f"{cfg.diagnostic_split}.")
    book.log(run, metrics=metrics)
    text = render(result, max_worse=20)
    if result.report is not None:
        with tempfile.TemporaryDirectory() as tmp:
            d = ledger.write_report_artifacts(result.report, Path(tmp), title=f"{run_type} {cfg.split}",
                                              sections=["## Gate", "", "```", text, "```"])
            book.log_artifacts(run, d)
    if iteration is not None and result.report is not None:
        aggs = {v: {m: now for m, (_, now) in per.items()} for v, per in result.comparison.aggregates.items()} \
            if result.comparison.aggregates else \
            {v: a for v, a in result.report.aggregates().items() if v in cfg.gated_variants}
        whatif = " ".join(f"{k}={v}" for k, v in result.overrides.items())
        book.log(iteration.info.run_id, metrics=ledger.aggregate_metrics(aggs, prefix="after."),
                 tags={"last_gate_run": run, "last_gate_status": "pass" if result.passed else "fail",
                       "last_gate_violations": "\n".join(result.violations), "last_gate_whatif": whatif or "none",
                       "last_gate_tree": snapshot_or_none(untracked_at_open(iteration)) or "unknown",
                       "last_gate_report": text})
    book.log(run, tags={"gate": "pass" if result.passed else "fail", "violations": "\n".join(result.violations)})
    if finish:
        book.finish(run)
    return run


def replay_unfinished(book=None) -> None:
    """Finish whatever a killed admit / revert / park left half done, before doing anything else."""
    from .journal import replay

    done = replay(book)
    if done:
        print(f"autoresearch: {done}", file=sys.stderr)


def open_refusal(current) -> HopsError:
    t = current.data.tags
    return HopsError(f"iteration {t['iteration']} is open ({t.get('hypothesis', '')[:60]!r}); close it first "
                     f"with `python -m autoresearch admit`, `park`, `revert --reason ...` or "
                     f"`revert --blocked --reason ...`")


def elsewhere_note(o: dict) -> str:
    """Where an iteration open in another MLflow ledger of this state is, and how to close it there."""
    return (f"iteration {o['iteration']} is open on this state ({ledger.state_dir()}) in another MLflow ledger, "
            f"{o['ledger']} (run {str(o.get('run_id'))[:8]}); close it there first, e.g. "
            f"`MLFLOW_TRACKING_URI={o['ledger']} python -m autoresearch revert --reason ...` (or admit / park)")


def refuse_if_open(book: ledger.Ledger) -> None:
    """One iteration at a time per state directory: refuse while one is open in this ledger or another."""
    current = book.open_iteration()
    if current is not None:
        raise open_refusal(current)
    elsewhere = book.open_elsewhere()
    if elsewhere is not None:
        raise HopsError(elsewhere_note(elsewhere))


def close_record(run, outcome: str, *, after, before=None, regressions=(), worse=(), reason: str = "",
            prov: dict | None = None, **extra) -> dict:
    """The durable jsonl record of an iteration closing with `outcome`."""
    from .research_log import from_run
    from .validate import _nan_to_none

    rec = from_run(run)
    t = run.data.tags
    prov = prov or {"git_commit": ledger.git_commit(), "git_diff_hash": ledger.git_diff_hash(),
                    "model_fingerprint": ledger.model_fingerprint()}
    rec.update(outcome=outcome, closed=ledger.now(), reason=reason, after=after, regressions=list(regressions),
               worse_within_tolerance=list(worse), opened=t.get("opened", ""),
               **{k: prov[k] for k in ("git_commit", "git_diff_hash", "model_fingerprint")}, **extra)
    if before is not None:
        rec["before"] = before
    return _nan_to_none(rec)


def close_effect(rec: dict, outcome: str, *, artifacts: dict | None = None) -> dict:
    metrics = ledger.aggregate_metrics(rec.get("before") or {}, prefix="before.")
    if rec.get("after"):
        metrics |= ledger.aggregate_metrics(rec["after"], prefix="after.")
    tags = {"closed": rec["closed"], "reason": rec.get("reason", "")}
    if rec.get("patch"):
        tags["patch"] = rec["patch"]
    return {"kind": "mlflow", "run_id": rec["run_id"], "metrics": metrics, "tags": tags, "outcome": outcome,
            "status": "FINISHED" if outcome in ledger.LANDED else "KILLED", "artifacts": artifacts or {}}
