"""The ledger: every calibration evaluation as an MLflow run, plus the provenance it is judged by.

Two records exist on purpose. MLflow (default: sqlite under ``<repo>/mlruns``,
``MLFLOW_TRACKING_URI`` overrides it) is the rich, per-machine view with plots
and side-by-side comparison. The committed files under the state directory
(``iterations.jsonl``, ``checkpoints.json``, ``golden/``) are the durable record
that survives a fresh clone; ``HOPS_AUTORESEARCH_STATE`` relocates them so tests
and what-if sessions never touch the repo's copies.

All MLflow access goes through :class:`Ledger` using ``MlflowClient`` with
explicit run ids (no fluent "active run" globals), so nested runs and several
processes writing one sqlite file stay well defined. SQLite serialises writers;
a writer that loses the race sees "database is locked", so every call is
retried with jittered backoff, and first-time schema creation is serialised by
a lock file because concurrent alembic migrations of one file corrupt it.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import os
import random
import subprocess
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from filelock import FileLock, Timeout

from hops.errors import HopsError
from hops import provenance as model_provenance

from . import state

REPO = Path(__file__).resolve().parents[1]
PACKAGE = Path(__file__).resolve().parent
CALIBRATION, CHECKPOINTS = "calibration", "checkpoints"
OUTCOMES = ("open", "landed", "rebaselined", "reverted", "blocked", "parked", "void")
LANDED = ("landed", "rebaselined")  # rebaselined: landed by a recorded human decision (autoresearch/rebaseline.py)
CLOSED = (*LANDED, "reverted", "blocked", "parked")  # void: a run opened by a propose race, closed by `repair`
ITERATION_TAGS = ("iteration", "title", "hypothesis", "change_site", "expected_effect", "outcome", "stack_on")

# What can move a prediction is declared once, in hops.provenance.MODEL_FILES; the fingerprint, the
# pre-commit hook (`python -m autoresearch precommit`) and the gate's "model changed" note derive from it.
MODEL_FILES = model_provenance.MODEL_FILES


class LedgerError(HopsError):
    """The ledger cannot do what was asked (e.g. no open iteration to close)."""


# --------------------------------------------------------------------------- locations
def state_dir() -> Path:
    return state.state_dir()  # --state / HOPS_AUTORESEARCH_STATE / checkout (autoresearch/state.py)


def tracking_uri() -> str:
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{state.repo_root() / 'mlruns' / 'mlflow.db'}"


def _sqlite_path(uri: str) -> Path | None:
    return Path(uri[len("sqlite:///"):]) if uri.startswith("sqlite:///") else None


def artifact_location(uri: str, experiment: str) -> str | None:
    """Next to the sqlite file (else MLflow would default to ./mlartifacts of whatever cwd); servers decide."""
    db = _sqlite_path(uri)
    return (db.parent / "artifacts" / experiment).absolute().as_uri() if db else None


def now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


# --------------------------------------------------------------------------- provenance
def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=state.repo_root(), capture_output=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.decode(errors="replace") if out.returncode == 0 else None


def git_commit() -> str:
    out = _git("rev-parse", "HEAD")
    return out.strip() if out else "unknown"


def git_diff_hash() -> str:
    """Hash of uncommitted changes (tracked diff + untracked file names); 'clean' when there are none."""
    diff, untracked = _git("diff", "HEAD", "--binary"), _git("ls-files", "--others", "--exclude-standard")
    if diff is None or untracked is None:
        return "unknown"
    if not diff and not untracked.strip():
        return "clean"
    return hashlib.sha256((diff + "\0" + untracked).encode()).hexdigest()[:16]


def model_files() -> list[Path]:
    return model_provenance.model_files(REPO)


def model_fingerprint(overrides: Mapping[str, Any] | Iterable[str] | None = None) -> str:
    """hops.provenance.model_fingerprint: the same value summary.json carries for the same catalog."""
    return model_provenance.model_fingerprint(normalize_overrides(overrides) or None)


def normalize_overrides(overrides) -> dict:
    from hops.model.hardware import _normalize_overrides

    return dict(_normalize_overrides(overrides))


def provenance(split: str, variants: Iterable[str], overrides=None) -> dict[str, str]:
    """The params every evaluating run carries (issue: commit, diff hash, fingerprint, split, variants, overrides)."""
    ov = normalize_overrides(overrides)
    return {"git_commit": git_commit(), "git_diff_hash": git_diff_hash(), "model_fingerprint": model_fingerprint(ov),
            "split": split, "variants": ",".join(variants),
            "overrides": ",".join(f"{k}={v}" for k, v in sorted(ov.items())) or "none"}


# --------------------------------------------------------------------------- retries
def _is_transient(exc: BaseException) -> bool:
    text = str(exc).lower()
    return "database is locked" in text or "database is busy" in text


def retry(fn: Callable, *args, attempts: int = 12, **kwargs):
    """Call fn, retrying transient sqlite lock errors with jittered exponential backoff (~30 s worst case)."""
    for k in range(attempts):
        try:
            return fn(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - MLflow wraps sqlite errors in several types
            if not _is_transient(exc) or k == attempts - 1:
                raise
            time.sleep(min(0.05 * 2 ** k, 4.0) * (0.5 + random.random()))


# --------------------------------------------------------------------------- kill safety
WRITER = "writer"  # host:pid of the process that created a run


def writer() -> str:
    import socket

    return f"{socket.gethostname()}:{os.getpid()}"


def writer_alive(tag: str | None) -> bool | None:
    """Whether the process named by a WRITER tag still runs; None when this host cannot tell (another
    host, or a run from before the tag existed)."""
    import socket

    host, _, pid = (tag or "").rpartition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return None
    return Path(f"/proc/{pid}").exists()


def crash_point(name: str) -> None:
    """Test hook: `HOPS_AUTORESEARCH_KILL_AT=name` SIGKILLs the process here (between two writes)."""
    if os.environ.get("HOPS_AUTORESEARCH_KILL_AT") == name:
        import signal

        os.kill(os.getpid(), signal.SIGKILL)


def atomic_write(path: Path, text: str) -> Path:
    """Temp file in the same directory, fsync, rename, fsync the directory: old or new bytes, never half."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    crash_point(f"write:{path.name}")
    os.replace(tmp, path)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return path


STATE_LOCK = ".state.lock"  # in the state directory; .gitignore keeps it out of diffs and git_diff_hash


@contextlib.contextmanager
def state_lock(timeout_s: float = 600.0):
    """Exclusive lock over the calibration state (numbering, the one-open-iteration rule, every state write).

    A lock file in the state directory and, for a sqlite ledger, one beside the database, so two state
    dirs sharing one ledger are serialised too. OS locks (filelock: flock on POSIX), so a killed holder
    never leaves the state locked. Re-entrant per process (one lock object per file, its count shared by
    threads). A tracking server shared by several machines is not covered: one machine's lock cannot see
    another's.
    """
    d = state_dir()
    d.mkdir(parents=True, exist_ok=True)
    paths = [d / STATE_LOCK]
    db = _sqlite_path(tracking_uri())
    if db is not None:
        db.parent.mkdir(parents=True, exist_ok=True)
        paths.append(db.with_name(db.name + ".state.lock"))
    deadline = time.monotonic() + timeout_s
    with contextlib.ExitStack() as held:
        for path in paths:
            lock = FileLock(path, is_singleton=True, thread_local=False)
            try:
                held.enter_context(lock.acquire(timeout=max(0.0, deadline - time.monotonic())))
            except Timeout:
                raise LedgerError(f"the calibration state under {d} stayed locked for {timeout_s:.0f} s "
                                  f"(another autoresearch command is running)") from None
        yield


# --------------------------------------------------------------------------- metrics
def clean_metrics(metrics: Mapping[str, float]) -> dict[str, float]:
    """Drop NaN/None: a missing metric reads better in the UI than a NaN that breaks sorting."""
    return {k: float(v) for k, v in metrics.items()
            if v is not None and not isinstance(v, bool) and math.isfinite(float(v))}


def aggregate_metrics(aggregates: Mapping[str, Mapping[str, float]], prefix: str = "") -> dict[str, float]:
    """{variant: aggregate} as flat metric names, e.g. link_calibrated.mape (same names in every run type)."""
    return clean_metrics({f"{prefix}{v}.{m}": a.get(m) for v, a in aggregates.items() for m in a})


def group_metrics(groups: Mapping, prefix: str = "group.") -> dict[str, float]:
    return clean_metrics({f"{prefix}{g}.{label}.{v}.{m}": a[m]
                          for g, labels in groups.items() for label, per in labels.items()
                          for v, a in per.items() for m in ("mape", "bubble_mae_pp")})


# --------------------------------------------------------------------------- the ledger
class Ledger:
    """Thin, retrying wrapper over MlflowClient for the runs autoresearch writes."""

    def __init__(self, uri: str | None = None):
        from hops.run.tracking import check_reachable

        self.uri = uri or tracking_uri()
        check_reachable(self.uri)  # a server that is not there: one line now, not minutes of retries
        for name in ("alembic", "mlflow.store.db.utils", "mlflow.store.db"):
            logging.getLogger(name).setLevel(logging.WARNING)
        from mlflow import MlflowClient

        db = _sqlite_path(self.uri)
        ready = db.with_name(db.name + ".ready") if db else None
        if ready is None or (ready.exists() and db.exists()):
            self.client = retry(MlflowClient, self.uri)
        else:
            with FileLock(db.with_name(db.name + ".init.lock")):  # first client migrates the schema
                self.client = retry(MlflowClient, self.uri)
                retry(self.client.search_experiments, max_results=1)
                ready.touch()
        self._experiments: dict[str, str] = {}

    def experiment_id(self, name: str) -> str:
        if name not in self._experiments:
            exp = retry(self.client.get_experiment_by_name, name)
            if exp is None:
                try:
                    eid = retry(self.client.create_experiment, name,
                                artifact_location=artifact_location(self.uri, name))
                except Exception:  # noqa: BLE001 - another process created it first
                    exp = retry(self.client.get_experiment_by_name, name)
                    if exp is None:
                        raise
                    eid = exp.experiment_id
            else:
                eid = exp.experiment_id
            self._dress(eid, exp.tags if exp is not None else {})
            self._experiments[name] = eid
        return self._experiments[name]

    def _dress(self, eid: str, tags: Mapping[str, str]) -> None:
        """Tags for the MLflow UI: experiment kind, headline view, description linking it (unchanged: not rewritten)."""
        for key, value in experiment_tags(eid, tags).items():
            if tags.get(key) != value:
                retry(self.client.set_experiment_tag, eid, key, value)

    def start_run(self, experiment: str, name: str, *, run_type: str, params: Mapping[str, Any] | None = None,
                  tags: Mapping[str, Any] | None = None, parent: str | None = None) -> str:
        """A RUNNING run; the command finishes it once what it records is durable (`repair` closes a
        run whose writer died first, found by the WRITER tag)."""
        all_tags = {"run_type": run_type, WRITER: writer(), **{k: str(v) for k, v in (tags or {}).items()}}
        if run_type != "iteration" and "iteration" in all_tags and not name.startswith("it"):
            name = f"it{all_tags['iteration']} {name}: {all_tags.get('title') or all_tags.get('hypothesis', '')[:48]}"
        if parent:
            all_tags["mlflow.parentRunId"] = parent
        run = retry(self.client.create_run, self.experiment_id(experiment), tags=all_tags, run_name=name)
        if params:
            self.log(run.info.run_id, params=params)
        return run.info.run_id

    def log(self, run_id: str, *, metrics: Mapping[str, float] | None = None,
            params: Mapping[str, Any] | None = None, tags: Mapping[str, Any] | None = None) -> None:
        """One batch per call (one sqlite transaction), split at MLflow's per-batch limits."""
        from mlflow.entities import Metric, Param, RunTag

        ts = int(time.time() * 1000)
        ms = [Metric(k, v, ts, 0) for k, v in clean_metrics(metrics or {}).items()]
        ps = [Param(k, _clip(v, 6000)) for k, v in (params or {}).items()]
        ts_ = [RunTag(k, _clip(v, 7000)) for k, v in (tags or {}).items()]
        while ms or ps or ts_:
            retry(self.client.log_batch, run_id, metrics=ms[:900], params=ps[:90], tags=ts_[:90])
            ms, ps, ts_ = ms[900:], ps[90:], ts_[90:]

    def log_artifacts(self, run_id: str, directory: str | os.PathLike) -> None:
        retry(self.client.log_artifacts, run_id, str(directory))

    def finish(self, run_id: str, status: str = "FINISHED") -> None:
        retry(self.client.set_terminated, run_id, status)

    def runs(self, experiment: str, filter_string: str = "", order_by: list[str] | None = None) -> list:
        eid = self.experiment_id(experiment)
        out, token = [], None
        while True:
            page = retry(self.client.search_runs, [eid], filter_string=filter_string, max_results=1000,
                         order_by=order_by, page_token=token)
            out.extend(page)
            token = page.token
            if not token:
                return out

    def get_run(self, run_id: str):
        return retry(self.client.get_run, run_id)

    # ----------------------------------------------------------------------- iterations
    def iteration_runs(self) -> list:
        runs = self.runs(CALIBRATION, "tags.run_type = 'iteration'")
        return sorted(runs, key=lambda r: (int(r.data.tags.get("iteration", 0)), r.info.start_time))

    def open_runs(self) -> list:
        """Iteration runs still open here and not closed in the committed record (a kill can leave both)."""
        closed = {r.get("run_id") for r in read_iterations() if r.get("outcome") in CLOSED}
        return [r for r in self.iteration_runs()
                if r.data.tags.get("outcome") == "open" and r.info.run_id not in closed]

    def open_iteration(self):
        """The open iteration run, or None. More than one open (a race) is reported, not guessed."""
        open_runs = self.open_runs()
        if len(open_runs) > 1:
            nums = ", ".join(r.data.tags["iteration"] for r in open_runs)
            raise LedgerError(f"iterations {nums} are all open (a race between two proposers); keep one with "
                              f"`python -m autoresearch repair --keep N` (the others are closed as void)")
        return open_runs[0] if open_runs else None

    def next_iteration(self) -> int:
        """Max over this ledger, the committed jsonl (so a fresh clone continues the numbering) and the
        last number this state directory issued (so a second MLflow ledger on the same state cannot
        issue it again). Call under state_lock(), and record the number with `mark_open`."""
        known = [int(r.data.tags.get("iteration", 0)) for r in self.iteration_runs()]
        known += [int(rec.get("iteration", 0)) for rec in read_iterations()]
        known.append(int(read_open_marker().get("last_issued", 0)))
        return max(known, default=0) + 1

    def open_elsewhere(self) -> dict | None:
        """The iteration this state's marker holds open in another MLflow ledger, or None.

        An iteration opened with another tracking store (another MLFLOW_TRACKING_URI, or a command run
        before the store followed the state) is invisible to this ledger's runs; the state directory
        remembers it until the jsonl records it closed, or that store holds it no longer open (closed,
        void, gone with its sqlite file). A store that cannot be asked counts it as open.
        """
        from hops.run.tracking import redact

        o = read_open_marker().get("open")
        if not isinstance(o, dict) or not o.get("ledger") or o["ledger"] == redact(self.uri):
            return None
        if any(r.get("run_id") == o.get("run_id") and r.get("outcome") in CLOSED for r in read_iterations()):
            return None
        db = _sqlite_path(o["ledger"])
        if db is not None and not db.exists():
            return None  # that ledger is gone: nothing can close the iteration there
        try:
            run = Ledger(o["ledger"]).get_run(o["run_id"])
        except Exception as exc:  # noqa: BLE001 - unreachable (still open, as far as anyone knows) or no such run
            return None if "RESOURCE_DOES_NOT_EXIST" in f"{getattr(exc, 'error_code', '')} {exc}" else o
        return o if run.data.tags.get("outcome") == "open" else None

    def tag_iteration(self, run_id: str, tags: Mapping[str, str]) -> None:
        """Set tags (e.g. the final outcome) on an iteration run and every run logged under it."""
        self.log(run_id, tags=tags)
        for run in self.runs(CALIBRATION, f"tags.iteration_run = '{run_id}'"):
            self.log(run.info.run_id, tags=tags)


HEADLINE_METRICS = ("link_calibrated.mape", "link_calibrated.bubble_mae_pp", "link_calibrated.rho_mean", "spec.mape",
                    "spec.bubble_mae_pp", "spec.rho_mean", "replay.mape", "gate.violations")
HEADLINE_TAGS = ("iteration", "outcome", "run_type", "gate")
VIEW = "headline"
VIEW_TAG = f"mlflow.sharedViewState.{VIEW}"


def view_link(eid: str) -> str:
    """The runs table of experiment `eid` in the model training UI, opened with the headline view.

    It names the `runs` tab: MLflow 3.17's `/experiments/<id>` redirects to a tab and keeps only
    startTime*/endTime/workflowType/workspace, so `viewStateShareKey` on it is dropped. `workflowType` picks
    the UI's GenAI / Model training switch, which otherwise comes from the browser (default GenAI).
    """
    return f"#/experiments/{eid}/runs?workflowType=machine_learning&viewStateShareKey={VIEW}"


def _envelope(value: str | None) -> dict | None:
    """A saved-view envelope as MLflow 3.17's UI accepts it (string name, number createdAt, string state), or None."""
    try:
        env = json.loads(value or "")
    except ValueError:
        return None
    ok = (isinstance(env, dict) and isinstance(env.get("name"), str) and isinstance(env.get("state"), str)
          and isinstance(env.get("createdAt"), (int, float)) and not isinstance(env.get("createdAt"), bool))
    return env if ok else None


def experiment_tags(eid: str, current: Mapping[str, str] | None = None) -> dict[str, str]:
    """`mlflow.experimentKind`, the shared view with the headline columns, and a description linking it.

    The view tag is what MLflow 3.17's UI writes for a saved view (listed under "Views" above the runs table):
    an envelope `{name, createdAt, updatedAt, state}` whose `state` is the JSON of the view. Its fields are
    repeated at the top level for older UIs, which read the tag as the view itself. `current` (the
    experiment's tags) keeps the timestamps of an unchanged view, so re-dressing writes nothing.

    MLflow's runs table has no server-side default column set (its default is Source / Models / Dataset), and
    3.17 takes GenAI vs model training from the browser, not from `mlflow.experimentKind` (older 3.x read it).
    """
    columns = [*(f"metrics.`{m}`" for m in HEADLINE_METRICS), *(f"tags.`{t}`" for t in HEADLINE_TAGS)]
    # Order and widths are keyed by the grid's column ids (3.17: the canonical key, "runDateAndNestInfo" for
    # Created, "duration"); wide enough that `link_calibrated.bubble_mae_pp` is not cut to `link_calibrated.`.
    order = ["attributes.`Run Name`", "runDateAndNestInfo", "duration", *columns]
    widths = {c: max(90, 7 * len(c.split("`")[1]) + 40) for c in columns}
    view = {"selectedColumns": ["attributes.`Duration`", *columns], "columnOrder": order, "columnWidths": widths,
            "orderByKey": "attributes.start_time", "orderByAsc": False, "runsHiddenMode": "SHOW_ALL"}
    state = json.dumps(view, sort_keys=True)
    old = _envelope((current or {}).get(VIEW_TAG))
    stamp = int(time.time() * 1000)
    created = old["createdAt"] if old else stamp
    updated = old.get("updatedAt", created) if old and old["state"] == state else stamp
    envelope = {"name": VIEW, "createdAt": created, "updatedAt": updated, "state": state, **view}
    note = (f"HOPS calibration ledger (autoresearch/README.md). Open the runs table with the headline columns "
            f"(train MAPE, bubble MAE, rho per variant, gate violations, outcome): "
            f"[headline view]({view_link(eid)}).")
    return {"mlflow.experimentKind": "custom_model_development",
            VIEW_TAG: json.dumps(envelope, sort_keys=True), "mlflow.note.content": note}


def open_iteration_if_any(book: Ledger):
    """The open iteration, or None where there is no calibration state to hold one.

    Scoring (validate, observe, search) needs no golden file: a wheel outside a checkout scores
    fixtures too, and its runs simply belong to no iteration.
    """
    try:
        state.state_dir()
    except state.StateError:
        return None
    return book.open_iteration()


def iteration_tags(run) -> dict[str, str]:
    """The tags an iteration lends to every run logged while it is open."""
    return {k: run.data.tags[k] for k in ITERATION_TAGS if k in run.data.tags} | {"iteration_run": run.info.run_id}


def _clip(value: Any, limit: int) -> str:
    text = str(value)
    return text if len(text) <= limit else text[: limit - 20] + " ...[truncated]"


# --------------------------------------------------------------------------- committed records
def iterations_path() -> Path:
    return state_dir() / "iterations.jsonl"


OPEN_MARKER = ".open-iteration.json"  # local to the state dir (gitignored): numbers issued, the open iteration


def read_open_marker() -> dict:
    """{"last_issued": N, "open": {iteration, run_id, ledger, opened}} as `mark_open` wrote it ({} if none)."""
    try:
        doc = json.loads((state_dir() / OPEN_MARKER).read_text())
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def mark_open(n: int, run_id: str, uri: str | None = None) -> None:
    """Record in the state directory that iteration `n` was issued and is open as `run_id` (under state_lock).

    The numbering and the one-open-iteration rule then hold per state directory, whatever MLflow
    store each command of it logs to (see Ledger.next_iteration / open_elsewhere).
    """
    from hops.run.tracking import redact

    last = max(int(read_open_marker().get("last_issued", 0)), int(n))
    doc = {"last_issued": last, "open": {"iteration": int(n), "run_id": run_id,
                                         "ledger": redact(uri or tracking_uri()), "opened": now()}}
    atomic_write(state_dir() / OPEN_MARKER, json.dumps(doc, sort_keys=True) + "\n")


def read_iterations() -> list[dict]:
    path = iterations_path()
    if not path.exists():
        return []
    out = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if line.strip():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                raise LedgerError(f"{path}:{n}: not a JSON line (resolve the merge conflict?)") from None
    return out


def _record_key(rec: Mapping[str, Any]) -> tuple:
    return (rec.get("run_id") or f"it{rec.get('iteration')}-{rec.get('hypothesis')}", rec.get("outcome"))


def append_iteration(record: Mapping[str, Any]) -> bool:
    """Add one line per closed iteration (concurrent branches merge as a union of lines).

    Idempotent: a record whose (run_id, outcome) is already there is not added again, so a command re-run
    after a kill cannot duplicate lines. The file is rewritten atomically under the state lock.
    Returns whether a line was added.
    """
    with state_lock():
        existing = read_iterations()
        key = _record_key(record)
        if any(_record_key(r) == key for r in existing):
            return False
        path = iterations_path()
        text = path.read_text() if path.exists() else ""
        if text and not text.endswith("\n"):
            text += "\n"
        atomic_write(path, text + json.dumps(record, sort_keys=True, allow_nan=False, default=str) + "\n")
        return True


def latest_records() -> dict[int, dict]:
    """The last record per iteration number (a parked iteration that later landed shows as landed)."""
    out: dict[int, dict] = {}
    for rec in read_iterations():
        out[int(rec.get("iteration", 0))] = rec
    return out


# --------------------------------------------------------------------------- run artifacts
def md_table(headers: list[str], rows: Iterable[Iterable[Any]]) -> str:
    """A GitHub markdown table (pandas.to_markdown needs tabulate, which we do not depend on)."""
    def cell(v):
        if isinstance(v, float):
            return "" if math.isnan(v) else f"{v:.2f}"
        return str(v).replace("|", "\\|")

    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def aggregates_md(aggregates: Mapping[str, Mapping[str, float]]) -> str:
    return md_table(["variant", "MAPE %", "bubble MAE pp", "rho mean", "n"],
                    [[v, a["mape"], a["bubble_mae_pp"], a["rho_mean"], int(a["n"])] for v, a in aggregates.items()])


def log_evaluation(report, command: str, *, overrides=None, sections: Iterable[str] = (),
                   extra: Callable[[Path], None] | None = None) -> str:
    """One run for a scoring command (validate, observe): provenance params, aggregate and group metrics,
    the report artifacts (plus what `extra(dir)` writes), tagged with the open iteration if any. Its id."""
    import tempfile

    book = Ledger()
    it = open_iteration_if_any(book)
    scored = {k: str(report.extras[k])[:500] for k in ("fixtures_root", "fixture_set") if k in report.extras}
    run = book.start_run(CALIBRATION, command, run_type=command,
                         params={**provenance(report.split, report.variants, overrides), **scored},
                         tags=iteration_tags(it) if it else {})
    book.log(run, metrics={**aggregate_metrics(report.aggregates()), **group_metrics(report.groups())})
    with tempfile.TemporaryDirectory() as tmp:
        d = write_report_artifacts(report, Path(tmp), title=f"{command} {report.split}", sections=sections)
        if extra is not None:
            extra(d)
        book.log_artifacts(run, d)
    book.finish(run)
    return run


def write_report_artifacts(report, directory: Path, *, title: str, sections: Iterable[str] = ()) -> Path:
    """Per-fixture CSV, markdown report, predicted-vs-measured scatter and error-by-group bars."""
    directory.mkdir(parents=True, exist_ok=True)
    table = report.table()
    table.to_csv(directory / "fixtures.csv", index=False)
    groups = report.groups()
    group_rows = [[g, label, v, a["mape"], a["bubble_mae_pp"], int(a["n"])]
                  for g, labels in groups.items() for label, per in labels.items() for v, a in per.items()]
    md = [f"# {title}", "", f"split `{report.split}`, {table['id'].nunique() if len(table) else 0} fixtures, "
          f"model {report.model_fingerprint}, catalog {report.catalog_fingerprint}", "", *sections, "", "## Aggregates", "", aggregates_md(report.aggregates()),
          "", "## Groups", "", md_table(["group", "label", "variant", "MAPE %", "bubble MAE pp", "n"], group_rows),
          "", "Per-fixture scores: fixtures.csv. Plots: scatter.png, groups.png.", ""]
    (directory / "report.md").write_text("\n".join(md))
    if len(table):
        _plot_scatter(table, directory / "scatter.png")
        _plot_groups(groups, report.variants, directory / "groups.png")
    return directory


def _plot_scatter(table, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter

    variants = list(dict.fromkeys(table["variant"]))
    fig, axes = plt.subplots(1, len(variants), figsize=(4.2 * len(variants), 4.2), squeeze=False)
    for ax, v in zip(axes[0], variants):
        d = table[table["variant"] == v]
        m, p = d["measured_throughput_per_s"], d["predicted_throughput_per_s"]
        ax.scatter(m, p, s=18, alpha=0.8)
        ok = (m > 0) & (p > 0)
        lo = float(min(m[ok].min(), p[ok].min())) * 0.8 if ok.any() else 0.1
        hi = float(max(m[ok].max(), p[ok].max())) * 1.25 if ok.any() else 10.0
        ax.plot([lo, hi], [lo, hi], "k--", lw=1, label="y = x")
        ax.set(xscale="log", yscale="log", xlim=(lo, hi), ylim=(lo, hi),
               title=f"{v} (MAPE {d['throughput_error_pct'].abs().mean():.1f}%)",
               xlabel="measured microbatches/s", ylabel="predicted microbatches/s")
        ticks = log_ticks(lo, hi)
        for axis in (ax.xaxis, ax.yaxis):  # matplotlib labels a narrow log range with one tick, or with overlaps
            axis.set_major_locator(FixedLocator(ticks))
            axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
            axis.set_minor_formatter(NullFormatter())
        ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def log_ticks(lo: float, hi: float, most: int = 8) -> list[float]:
    """Ticks for a log axis from lo to hi, at least three labelled: per decade 1-2-5 or 1 to 9 (the
    densest with at most `most` ticks), else, for a range narrower than that, evenly spaced round values."""
    import math

    from matplotlib.ticker import MaxNLocator

    decades = range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + 1)
    for mantissas in (tuple(range(1, 10)), (1, 2, 5), (1,)):
        ticks = [t for t in (round(m * 10.0 ** e, 12) for e in decades for m in mantissas) if lo <= t <= hi]
        if 3 <= len(ticks) <= most or (mantissas == (1,) and len(ticks) > most):
            return ticks
    return [float(t) for t in MaxNLocator(nbins=5).tick_values(lo, hi) if lo <= t <= hi]


def _plot_groups(groups: Mapping, variants: Iterable[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    variants = list(variants)
    fig, axes = plt.subplots(1, len(groups), figsize=(4.5 * len(groups), 3.8), squeeze=False)
    width = 0.8 / max(len(variants), 1)
    for ax, (g, labels) in zip(axes[0], groups.items()):
        x = np.arange(len(labels))
        for k, v in enumerate(variants):
            ax.bar(x + k * width, [per.get(v, {}).get("mape", np.nan) for per in labels.values()], width, label=v)
        ax.set_xticks(x + width * (len(variants) - 1) / 2, list(labels), rotation=45, ha="right", fontsize=8)
        ax.set(title=g, ylabel="MAPE %")
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
