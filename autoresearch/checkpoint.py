"""`checkpoint`: the one human-confirmed look at the held-out test split, once per model.

A test number is honest only while nothing learned from the test fixtures can
flow back into modeling. So the checkpoint releases suite-level aggregates per
variant (MAPE, bubble MAE, mean rho, n) and nothing else: no ids, groups,
phase breakdowns or per-fixture files on stdout, in MLflow or on disk (parsed
traces are cached in a temporary directory that is deleted; errors are
reported without their messages, which name fixtures). And it runs once per
model fingerprint: the fingerprint is refused if it appears in the committed
`checkpoints.json` (so a fresh clone refuses too) or in the ledger's
`checkpoints` experiment (so an uncommitted checkpoint counts as well).
"""
from __future__ import annotations

import contextlib
import io
import json
import tempfile
import warnings
from pathlib import Path

from hops.errors import HopsError
from hops.traces.guard import HELD_OUT_SPLITS, issue_checkpoint_token

from . import ledger
from .fixtures import resolve_root
from .scoring import METRICS


class CheckpointError(HopsError):
    """The checkpoint was refused or could not be taken (message never names a held-out fixture)."""


def checkpoints_path() -> Path:
    return ledger.state_dir() / "checkpoints.json"


def read_checkpoints() -> list[dict]:
    path = checkpoints_path()
    if not path.exists() or not path.read_text().strip():
        return []
    try:
        records = json.loads(path.read_text())
    except json.JSONDecodeError:
        raise CheckpointError(f"{path}: not valid JSON (resolve the merge conflict)") from None
    return records if isinstance(records, list) else []


def _record(entry: dict) -> None:
    """Read-modify-write under the state lock, written atomically: a kill leaves the old list or the new one."""
    with ledger.state_lock():
        records = read_checkpoints()
        records.append(entry)
        ledger.atomic_write(checkpoints_path(), json.dumps(records, indent=1, sort_keys=True, allow_nan=False) + "\n")


def previous(fingerprint: str, book: ledger.Ledger) -> dict | None:
    for rec in read_checkpoints():
        if rec.get("model_fingerprint") == fingerprint:
            return rec
    runs = book.runs(ledger.CHECKPOINTS, f"params.model_fingerprint = '{fingerprint}'")
    if runs:
        r = runs[0]
        return {"date": r.data.tags.get("date", "?"), "reason": r.data.params.get("reason", "?"), "where": "ledger"}
    return None


def checkpoint(split: str, reason: str, *, root=None, jobs: int = 1) -> str:
    if split not in HELD_OUT_SPLITS:
        raise CheckpointError(f"checkpoint is only for the held-out split (--split test); score {split!r} with "
                              f"`python -m autoresearch validate --split {split}`")
    if not (reason or "").strip():
        raise CheckpointError("--confirm-human needs the reason for this checkpoint (it is recorded)")
    root = resolve_root(root)
    if not (root / split / "cluster_results").is_dir():
        raise CheckpointError(f"no {split} split under {root}")
    fingerprint = ledger.model_fingerprint()
    book = ledger.Ledger()
    prior = previous(fingerprint, book)
    if prior:
        raise CheckpointError(f"model {fingerprint} already had its test checkpoint ({prior.get('date')}: "
                              f"{prior.get('reason')}); the test split is read once per model: change the model "
                              f"(and admit it) before the next checkpoint")
    aggregates = _evaluate(split, root, reason, jobs)
    entry = {"model_fingerprint": fingerprint, "date": ledger.now(), "reason": reason.strip(),
             "git_commit": ledger.git_commit(), "git_diff_hash": ledger.git_diff_hash(), "split": split,
             "aggregates": aggregates}
    _record(entry)
    run = book.start_run(ledger.CHECKPOINTS, f"checkpoint {fingerprint}", run_type="checkpoint",
                         params={k: entry[k] for k in ("model_fingerprint", "git_commit", "git_diff_hash", "split",
                                                       "reason")} | {"variants": ",".join(aggregates)},
                         tags={"date": entry["date"]})
    book.log(run, metrics=ledger.aggregate_metrics(aggregates))
    book.finish(run)
    return render(entry)


def _evaluate(split: str, root: Path, reason: str, jobs: int) -> dict:
    """Suite aggregates only; the Report (which holds ids) never leaves this function."""
    from .validate import validate

    token = issue_checkpoint_token(confirm_human=True, purpose=reason.strip())
    sink = io.StringIO()  # discarded: nothing a library prints during the run may reach the terminal
    with tempfile.TemporaryDirectory(prefix="hops-checkpoint-") as cache, warnings.catch_warnings(), \
            contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
        warnings.simplefilter("ignore")
        try:
            report = validate(split, root=root, token=token, cache_dir=cache, progress=False, jobs=jobs)
            aggs = report.aggregates()
        except Exception as exc:  # noqa: BLE001 - any message may name a held-out fixture
            raise CheckpointError(f"the checkpoint evaluation failed ({type(exc).__name__}; details withheld "
                                  f"because they may name held-out fixtures). Nothing was recorded: reproduce "
                                  f"the failure on train or diagnostic") from None
    return {v: {m: _num(a[m], m) for m in METRICS} for v, a in aggs.items()}


def _num(x, metric: str):
    if metric == "n":
        return int(x)
    return None if x is None or x != x else float(x)  # NaN (e.g. rho undefined everywhere) -> null


def render(entry: dict) -> str:
    lines = [f"checkpoint {entry['split']}: model {entry['model_fingerprint']} at {entry['git_commit'][:12]} "
             f"({entry['date']}); suite aggregates only, recorded in {checkpoints_path().name} and the ledger",
             f"{'variant':<16} {'MAPE %':>8} {'bubble MAE pp':>14} {'rho mean':>9} {'n':>4}"]
    for v, a in entry["aggregates"].items():
        cells = [f"{a[m]:.2f}" if a[m] is not None else "n/a" for m in ("mape", "bubble_mae_pp", "rho_mean")]
        lines.append(f"{v:<16} {cells[0]:>8} {cells[1]:>14} {cells[2]:>9} {a['n']:>4d}")
    return "\n".join(lines)
