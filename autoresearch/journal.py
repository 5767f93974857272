"""Closing an iteration as one transaction: a journal of idempotent effects, replayed after a kill.

admit, revert and park each change several things (golden file, patch file,
iterations.jsonl, the MLflow runs, LOG.md, the working tree). A kill between
two of them used to leave a state no command could explain, e.g. a new golden
file under an iteration still open. Now the command first decides everything,
writes the list of effects to `<state>/.pending.json` (atomically), then
applies them in order and deletes the journal. Every effect is idempotent, so
the next autoresearch command that finds a journal simply replays it: an
interrupted admit completes as the admit it was, never half of one.
"""
from __future__ import annotations

import json
from pathlib import Path

from . import ledger

KINDS = ("write", "append", "mlflow", "log", "restore")


def journal_path() -> Path:
    return ledger.state_dir() / ".pending.json"


def pending() -> dict | None:
    path = journal_path()
    if not path.exists():
        return None
    try:
        doc = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ledger.LedgerError(f"{path}: unreadable journal of an interrupted command ({exc}); run "
                                 f"`python -m autoresearch repair --drop-journal` after checking the state") from None
    return doc


def run(op: str, effects: list[dict], *, summary: str = "", book=None) -> None:
    """Record `effects`, apply them, forget them. Call under ledger.state_lock()."""
    with ledger.state_lock():
        ledger.atomic_write(journal_path(), json.dumps({"op": op, "summary": summary, "effects": effects},
                                                       sort_keys=True, allow_nan=False, default=str))
        ledger.crash_point(f"{op}:journal")
        _apply(op, effects, book)
        journal_path().unlink(missing_ok=True)


def sweep_temp_files() -> None:
    """Remove temp files a killed atomic write left behind (their writer's pid is gone)."""
    for tmp in ledger.state_dir().rglob(".*.tmp-*"):
        pid = tmp.name.rsplit("-", 1)[-1]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            tmp.unlink(missing_ok=True)


def replay(book=None) -> str | None:
    """Finish an interrupted admit / revert / park, if any; returns what was completed."""
    with ledger.state_lock():
        sweep_temp_files()
        doc = pending()
        if doc is None:
            return None
        _apply(doc["op"], doc["effects"], book)
        journal_path().unlink(missing_ok=True)
        return f"completed an interrupted `{doc['op']}`" + (f" ({doc['summary']})" if doc.get("summary") else "")


def _apply(op: str, effects: list[dict], book) -> None:
    for e in effects:
        kind = e["kind"]
        ledger.crash_point(f"{op}:{kind}")
        if kind == "write":
            path = ledger.state_dir() / e["path"]
            if not path.exists() or path.read_text() != e["text"]:
                ledger.atomic_write(path, e["text"])
        elif kind == "append":
            ledger.append_iteration(e["record"])
        elif kind == "mlflow":
            book = book or ledger.Ledger()
            _mlflow(book, e)
        elif kind == "log":
            from .research_log import write_log

            write_log(book)
        elif kind == "restore":
            from . import worktree

            # the tree is still the one judged: safe to restore (the user's untracked files, kept out, stay)
            if worktree.snapshot(e.get("keep_out") or ()) == e["tree"]:
                worktree.restore(e["tree"])
        else:
            raise ledger.LedgerError(f"journal: unknown effect {kind!r}")
    ledger.crash_point(f"{op}:end")


def _mlflow(book, e: dict) -> None:
    """Outcome on the iteration run and every run logged under it; metrics, tags, text artifacts; status."""
    try:
        run = book.get_run(e["run_id"])
    except Exception:  # noqa: BLE001 - recorded on another machine: the jsonl line is the record
        return
    book.log(run.info.run_id, metrics=e.get("metrics") or {}, tags=e.get("tags") or {})
    for name, text in (e.get("artifacts") or {}).items():
        import tempfile

        with tempfile.TemporaryDirectory() as tmp:
            (Path(tmp) / name).write_text(text)
            book.log_artifacts(run.info.run_id, tmp)
    if e.get("outcome"):
        book.tag_iteration(run.info.run_id, {"outcome": e["outcome"]})
    if e.get("status"):
        book.finish(run.info.run_id, e["status"])
