"""`output.mlflow=true`: each `hops.run` run, or each job of a `-m` sweep, as an MLflow run.

A Hydra callback of the run app (conf/config.yaml, `hydra.callbacks.mlflow_runs`), so the
simulator library stays free of MLflow: mlflow is imported only when a run asked for it.
It logs from the launching process once the jobs have finished, reading each job's files
from disk as `hops.run.sweep.SweepTable` does. That works for every launcher (joblib worker
processes, submitit, Ray), and the tracking store sees one writer per sweep (a sqlite
store does not take many concurrent writers well).

Where: `MLFLOW_TRACKING_URI` when set (e.g. a team's tracking server), else the sqlite
store under mlruns/ that autoresearch uses too; experiment `runs`. A sweep becomes one
parent run (`run_type=sweep`) with one nested run per job, so the UI compares the jobs.
Per run: params = the composed config (dotted keys; lists as JSON), metrics = the
headline numbers of summary.json (the sweep table's columns), artifacts = summary.json,
scenario.yaml and the PNGs. A job that failed on a user error is a FAILED run whose
`error` tag says why.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import yaml

from hops.model.hardware import dotted_items
from hops.run.sweep import _job_num, headline, job_dirs
from hops.run.tracking import TrackingServerError

try:  # the callback base class (Hydra is there whenever this callback is configured)
    from hydra.experimental.callback import Callback
except ImportError:  # pragma: no cover
    Callback = object  # type: ignore[misc,assignment]

EXPERIMENT = "runs"
REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = ("summary.json", "scenario.yaml", "timeline.png", "dashboard.png", "progress.png")


FAILED: list[str] = []  # logging failures in this process; hops.run.main() reports them (exit code 2)


class MlflowRuns(Callback):
    """Hydra callback: log the run (on_run_end) or every sweep job (on_multirun_end) when output.mlflow is true."""

    def __init__(self, experiment: str = EXPERIMENT) -> None:
        self.experiment = experiment

    def on_run_end(self, config, **kwargs: Any) -> None:
        job_dir = Path(str(config.hydra.runtime.output_dir))
        if _enabled(config) and (job_dir / "summary.json").is_file():
            self._report(lambda: f"run {log_jobs([job_dir], self.experiment)[0]}")

    def on_multirun_end(self, config, **kwargs: Any) -> None:
        sweep_dir = Path(str(config.hydra.sweep.dir))
        jobs = [d for d in sorted(job_dirs(sweep_dir), key=lambda d: (_job_num(d) is None, _job_num(d) or 0))
                if _enabled(_job_config(d))]
        if jobs:
            self._report(lambda: f"sweep run {log_sweep(sweep_dir, jobs, self.experiment)} with {len(jobs)} "
                                 f"job run(s)")

    def _report(self, log) -> None:
        # Hydra turns a callback's exception into a warning; a requested log that did not happen
        # must not pass silently, so main() turns this into one error line and exit code 2.
        try:
            what = log()
        except TrackingServerError as exc:  # says which server and what to do
            FAILED.append(f"output.mlflow: {exc}")
            return
        except Exception as exc:  # noqa: BLE001 - any failure of the tracking store
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            FAILED.append(f"output.mlflow: could not log to {redacted_uri()}: {first}")
            return
        print(f"mlflow: {what} in experiment {self.experiment!r} at {redacted_uri()}", flush=True)


# --------------------------------------------------------------------------- what a run carries
def _enabled(config) -> bool:
    try:
        return bool((config or {}).get("output", {}).get("mlflow", False))
    except AttributeError:
        return False


def _job_config(job_dir: Path) -> dict:
    path = job_dir / ".hydra" / "config.yaml"
    return (yaml.safe_load(path.read_text()) or {}) if path.is_file() else {}


def config_params(config: dict) -> dict[str, str]:
    """The composed config as flat params: mappings walked to dotted keys, lists kept whole as JSON."""
    flat = dotted_items({k: v for k, v in config.items() if k != "hydra"})
    return {k: v if isinstance(v, str) else json.dumps(v, sort_keys=True, default=str) for k, v in flat.items()}


def job_record(job_dir: Path) -> dict:
    """params / metrics / tags / artifacts / status of one job directory, read from its files."""
    from hops.run.file_deletions import as_typed

    overrides = yaml.safe_load((job_dir / ".hydra" / "overrides.yaml").read_text()) or [] \
        if (job_dir / ".hydra" / "overrides.yaml").is_file() else []
    overrides = [as_typed(str(o)) for o in overrides]
    tags = {"run_type": "hops.run", "job_dir": str(job_dir.resolve()), "overrides": " ".join(map(str, overrides))}
    num = _job_num(job_dir)
    if num is not None:
        tags["job"] = str(num)
    error, summary = job_dir / "error.txt", job_dir / "summary.json"
    metrics: dict[str, float] = {}
    if error.is_file():
        status, tags["error"] = "FAILED", error.read_text().strip()
    elif summary.is_file():
        status = "FINISHED"
        metrics = {k: float(v) for k, v in headline(json.loads(summary.read_text())).items()
                   if isinstance(v, (int, float)) and not isinstance(v, bool)}
    else:
        status, tags["error"] = "FAILED", "no summary.json"
    return {"params": config_params(_job_config(job_dir)), "metrics": metrics, "tags": tags, "status": status,
            "artifacts": [job_dir / a for a in ARTIFACTS if (job_dir / a).is_file()],
            "name": " ".join(str(o).lstrip("+") for o in overrides) or "(defaults)"}


# --------------------------------------------------------------------------- MLflow
def tracking_uri() -> str:
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{REPO / 'mlruns' / 'mlflow.db'}"


def redacted_uri() -> str:
    from hops.run.tracking import redact

    return redact(tracking_uri())


def _client():
    import logging

    from hops.run.tracking import check_reachable

    check_reachable(tracking_uri())  # before MLflow's minutes of retries against a server that is not there

    for name in ("alembic", "mlflow.store.db.utils", "mlflow.store.db"):
        logging.getLogger(name).setLevel(logging.WARNING)
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri())


def _experiment_id(client, name: str) -> str:
    exp = client.get_experiment_by_name(name)
    if exp is not None:
        return exp.experiment_id
    uri = tracking_uri()
    location = None  # a tracking server decides where artifacts go; next to a sqlite file otherwise
    if uri.startswith("sqlite:///"):
        location = (Path(uri[len("sqlite:///"):]).parent / "artifacts" / name).absolute().as_uri()
    try:
        return client.create_experiment(name, artifact_location=location)
    except Exception:  # noqa: BLE001 - created meanwhile by another process
        exp = client.get_experiment_by_name(name)
        if exp is None:
            raise
        return exp.experiment_id


def _log(client, run_id: str, record: dict) -> None:
    from mlflow.entities import Metric, Param, RunTag

    import time

    ts = int(time.time() * 1000)
    ms = [Metric(k, v, ts, 0) for k, v in record["metrics"].items()]
    ps = [Param(k, str(v)[:6000]) for k, v in record["params"].items()]
    tg = [RunTag(k, str(v)[:7000]) for k, v in record["tags"].items()]
    while ms or ps or tg:  # MLflow's per-batch limits
        client.log_batch(run_id, metrics=ms[:900], params=ps[:90], tags=tg[:90])
        ms, ps, tg = ms[900:], ps[90:], tg[90:]
    for path in record["artifacts"]:
        client.log_artifact(run_id, str(path))
    client.set_terminated(run_id, record["status"])


def log_jobs(job_dirs_: list[Path], experiment: str = EXPERIMENT, parent: str | None = None,
             client=None) -> list[str]:
    """One MLflow run per job directory (nested under `parent` if given); their run ids."""
    client = client or _client()
    eid = _experiment_id(client, experiment)
    ids = []
    for job_dir in job_dirs_:
        record = job_record(job_dir)
        tags = {"mlflow.parentRunId": parent} if parent else {}
        run = client.create_run(eid, run_name=record["name"], tags=tags)
        _log(client, run.info.run_id, record)
        ids.append(run.info.run_id)
    return ids


def log_sweep(sweep_dir: Path, job_dirs_: list[Path], experiment: str = EXPERIMENT) -> str:
    """A parent run for the sweep (its table as an artifact) and a nested run per job; the parent's id."""
    client = _client()
    eid = _experiment_id(client, experiment)
    parent = client.create_run(eid, run_name=f"sweep {sweep_dir.name}",
                               tags={"run_type": "sweep", "sweep_dir": str(sweep_dir.resolve())}).info.run_id
    log_jobs(job_dirs_, experiment, parent, client)
    table = sweep_dir / "sweep_results.csv"
    if table.is_file():
        client.log_artifact(parent, str(table))
    client.set_terminated(parent, "FINISHED")
    return parent
