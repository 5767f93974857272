"""One table per sweep: every job's overrides next to its headline metrics.

`SweepTable` is a Hydra callback (conf/config.yaml, hydra.callbacks.sweep_table). When a
`-m` run ends it reads each job's `.hydra/overrides.yaml` and `summary.json` from disk,
so it works whatever launcher ran the jobs (joblib worker processes, submitit, Ray),
and writes `<sweep dir>/sweep_results.csv`. Rebuild a table by hand (e.g. after a Slurm
sweep where some jobs failed) with:

    python -m hops.sweep multirun/2025-01-01/12-00-00

Importing this module is cheap (Hydra instantiates callbacks on every run); pandas is
imported only when a table is written.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from .errors import HopsError

try:  # the callback base class; the table writer itself works without Hydra
    from hydra.experimental.callback import Callback
except ImportError:  # pragma: no cover
    Callback = object  # type: ignore[misc,assignment]

METRICS = ("samples_per_s", "microbatches_per_s", "iterations_per_s", "bubble_ratio", "makespan_ms",
           "latency_p50_ms", "latency_p99_ms", "peak_memory_max_mb", "peak_memory_device", "memory_over_capacity",
           "slowest_stage", "schedule", "scheduler_effective", "seed")


class SweepError(HopsError):
    """Some jobs of a sweep failed on a user error; the table says which."""


FAILED_SWEEPS: list[str] = []  # messages for sweeps (in this process) with failed jobs


class SweepTable(Callback):
    """Hydra callback: write <sweep dir>/<filename> when a multirun ends."""

    def __init__(self, filename: str = "sweep_results.csv") -> None:
        self.filename = filename
        self._started: float | None = None

    def on_multirun_start(self, config, **kwargs: Any) -> None:
        self._started = time.time()

    def on_multirun_end(self, config, **kwargs: Any) -> None:
        sweep_dir = Path(str(config.hydra.sweep.dir))
        path = write_sweep_table(sweep_dir, self.filename, since=self._started)
        if path is None:
            return
        print(f"sweep table: {path.resolve()}", flush=True)
        failed = failed_jobs(path)
        if failed:
            # Hydra turns exceptions raised by callbacks into warnings, so the verdict is left
            # for hops.run.main(), which prints it as one line and exits with code 2.
            job, status = failed[0]
            FAILED_SWEEPS.append(f"{len(failed)} sweep job(s) failed (see {path}); job {job}: "
                                 f"{status.removeprefix('error: ')}")


def job_dirs(sweep_dir: Path, since: float | None = None) -> list[Path]:
    """Job directories under a sweep dir (those with .hydra/overrides.yaml).

    `since` (a time.time()) skips jobs left over from an earlier sweep into the same
    directory; one second of slack covers coarse filesystem timestamps.
    """
    out = []
    for ov in sweep_dir.glob("**/.hydra/overrides.yaml"):
        if since is not None and ov.stat().st_mtime < since - 1.0:
            continue
        out.append(ov.parent.parent)
    return out


def _job_num(job_dir: Path) -> int | None:
    try:
        loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
        data = yaml.load((job_dir / ".hydra" / "hydra.yaml").read_text(), Loader=loader)
        return int(data["hydra"]["job"]["num"])
    except Exception:  # noqa: BLE001 - fall back to the directory name
        return int(job_dir.name) if job_dir.name.isdigit() else None


def headline(summary: dict) -> dict:
    """The metrics a sweep is compared on, flat, from one summary.json."""
    from .run import slowest_stage  # light: run.py imports Hydra only inside functions

    tp = summary.get("throughput", {})
    lat = summary.get("latency_ms", {})
    peak = summary.get("peak_memory_mb") or {}
    worst = slowest_stage(summary)
    dev = max(peak, key=peak.get) if peak else None
    return {
        "samples_per_s": tp.get("samples_per_s"),
        "microbatches_per_s": tp.get("microbatches_per_s"),
        "iterations_per_s": tp.get("iterations_per_s"),
        "bubble_ratio": summary.get("bubble_ratio"),
        "makespan_ms": summary.get("makespan_ms"),
        "latency_p50_ms": lat.get("p50"),
        "latency_p99_ms": lat.get("p99"),
        "peak_memory_max_mb": peak.get(dev) if dev else None,
        "peak_memory_device": dev,
        "memory_over_capacity": ";".join(summary.get("memory_over_capacity") or []),
        "slowest_stage": f"{worst['stage']}:{worst['device']}" if worst else None,
        "schedule": summary.get("schedule"),
        "scheduler_effective": summary.get("scheduler_effective"),
        "seed": summary.get("seed"),
    }


def collect(sweep_dir: Path, since: float | None = None) -> tuple[list[dict], list[str]]:
    """Rows (one per job, in job order) and the override keys seen, in first-seen order."""
    rows, keys = [], []
    for job_dir in job_dirs(sweep_dir, since):
        overrides = yaml.safe_load((job_dir / ".hydra" / "overrides.yaml").read_text()) or []
        row: dict[str, Any] = {"job": _job_num(job_dir)}
        for item in overrides:
            key, _, value = str(item).partition("=")
            key = key.lstrip("+~")
            if key not in keys:
                keys.append(key)
            row[key] = value
        summary_path = job_dir / "summary.json"
        error_path = job_dir / "error.txt"  # hops.run.ERROR_FILE
        if error_path.is_file():
            row["status"] = "error: " + error_path.read_text().strip()
        elif summary_path.is_file():
            row["status"] = "ok"
            row.update(headline(json.loads(summary_path.read_text())))
        else:
            row["status"] = "no summary.json"
        row["dir"] = str(job_dir.relative_to(sweep_dir))
        rows.append(row)
    rows.sort(key=lambda r: (r["job"] is None, r["job"] if r["job"] is not None else 0, r["dir"]))
    return rows, keys


def write_sweep_table(sweep_dir: Path, filename: str = "sweep_results.csv", since: float | None = None) -> Path | None:
    """Write the sweep table CSV; None when the directory holds no jobs."""
    rows, keys = collect(Path(sweep_dir), since)
    if not rows:
        return None
    import pandas as pd

    columns = ["job", *keys, "status", *METRICS, "dir"]
    frame = pd.DataFrame(rows).reindex(columns=columns)
    for col in ("job", "seed"):  # integers, even when a failed job leaves a hole
        frame[col] = pd.to_numeric(frame[col], errors="coerce").astype("Int64")
    path = Path(sweep_dir) / filename
    frame.to_csv(path, index=False)
    return path


def failed_jobs(table: Path) -> list[tuple[Any, str]]:
    import csv

    with open(table, newline="") as fh:
        return [(r["job"], r["status"]) for r in csv.DictReader(fh) if r.get("status") != "ok"]


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or not Path(args[0]).is_dir():
        print("usage: python -m hops.sweep SWEEP_DIR", file=sys.stderr)
        return 2
    path = write_sweep_table(Path(args[0]))
    if path is None:
        print(f"error: no Hydra jobs under {args[0]}", file=sys.stderr)
        return 2
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
