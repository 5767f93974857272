"""One table per sweep: every job's overrides next to its headline metrics.

`SweepTable` is a Hydra callback (conf/config.yaml, hydra.callbacks.sweep_table). When a
`-m` run ends it reads each job's `.hydra/overrides.yaml` and `summary.json` from disk,
so it works whatever launcher ran the jobs (joblib worker processes, submitit, Ray),
and writes `<sweep dir>/sweep_results.csv`. Rebuild a table by hand (e.g. after a Slurm
sweep where some jobs failed, or one that was killed) with:

    python -m hops.run.sweep multirun/2025-01-01/12-00-00

A job's status is `ok` only if its summary.json exists: hops.run writes it last (hops.outputs.files).
A job directory without one is `interrupted`, and so is a job of the sweep's job list
(multirun.yaml) that never got a directory; both make the sweep exit with code 2.
While a sweep runs on a terminal, a progress line on stderr counts finished jobs (hops.run.progress:
shown past 2 s, erased before the sweep table's line is printed).

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

from hops.errors import HopsError
from hops.outputs.files import slowest_stage

try:  # the callback base class; the table writer itself works without Hydra
    from hydra.experimental.callback import Callback
except ImportError:  # pragma: no cover
    Callback = object  # type: ignore[misc,assignment]

METRICS = ("samples_per_s", "microbatches_per_s", "iterations_per_s", "bubble_ratio", "makespan_ms",
           "latency_p50_ms", "latency_p99_ms", "peak_memory_max_mb", "peak_memory_device", "memory_over_capacity",
           "slowest_stage", "schedule", "scheduler_effective", "virtual_stages", "post_validation", "seed")


class SweepError(HopsError):
    """Some jobs of a sweep failed on a user error; the table says which."""


FAILED_SWEEPS: list[str] = []  # messages for sweeps (in this process) with failed jobs


class SweepTable(Callback):
    """Hydra callback: write <sweep dir>/<filename> when a multirun ends.

    Launchers pickle the callbacks to send them to the jobs (joblib, submitit, Ray), so the
    progress line of the launching process lives outside the pickled state.
    """

    def __init__(self, filename: str = "sweep_results.csv") -> None:
        self.filename = filename
        self._started: float | None = None
        self._progress: JobsDone | None = None

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_progress": None}

    def on_multirun_start(self, config, **kwargs: Any) -> None:
        self._started = time.time()
        from hops.run.progress import Progress

        jobs = _job_list(config.hydra)
        self._progress = JobsDone(Path(str(config.hydra.sweep.dir)), self._started,
                                  Progress(total=len(jobs) if jobs is not None else None, desc="sweep", unit="job"))

    def on_multirun_end(self, config, **kwargs: Any) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
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


class JobsDone:
    """Finished jobs of a running sweep, counted on disk (so under any launcher) by a thread."""

    POLL_S = 0.5

    def __init__(self, sweep_dir: Path, since: float, progress) -> None:
        import threading

        self.sweep_dir, self.since, self.progress = sweep_dir, since, progress
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._poll, name="hops-sweep-progress", daemon=True)
        if progress.enabled:  # off a terminal there is nothing to count for
            self.thread.start()

    def finished(self) -> int:
        return sum(1 for d in job_dirs(self.sweep_dir, self.since)
                   if (d / "summary.json").is_file() or (d / "error.txt").is_file())

    def _poll(self) -> None:
        while not self.done.wait(self.POLL_S):
            self.progress.set_count(self.finished())

    def stop(self) -> None:
        self.done.set()
        if self.thread.is_alive():
            self.thread.join()
        self.progress.close()


def _job_list(hydra_cfg) -> list[list[str]] | None:
    """Every job's overrides, in job order, as Hydra's basic sweeper launches them; None for other sweepers."""
    try:
        if not str(hydra_cfg.sweeper._target_).endswith("BasicSweeper"):
            return None
        from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
        from hydra.core.override_parser.overrides_parser import OverridesParser

        params = [f"{k}={v}" for k, v in (hydra_cfg.sweeper.get("params") or {}).items()]
        parsed = OverridesParser.create().parse_overrides([*params, *hydra_cfg.overrides.task])
        return BasicSweeper.split_arguments(parsed, None)[0]
    except Exception:  # noqa: BLE001 - without a job list, only started jobs are reported
        return None


def expected_jobs(sweep_dir: Path) -> list[list[str]] | None:
    """The sweep's job list from <sweep dir>/multirun.yaml (written before any job starts)."""
    path = Path(sweep_dir) / "multirun.yaml"
    if not path.is_file():
        return None
    try:
        from omegaconf import OmegaConf

        return _job_list(OmegaConf.load(path).hydra)
    except Exception:  # noqa: BLE001 - an unreadable multirun.yaml: report what is on disk
        return None


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
        "virtual_stages": summary.get("virtual_stages"),
        "post_validation": summary.get("post_validation"),
        "seed": summary.get("seed"),
    }


def collect(sweep_dir: Path, since: float | None = None) -> tuple[list[dict], list[str]]:
    """Rows (one per job, in job order) and the override keys seen, in first-seen order."""
    rows, keys = [], []
    for job_dir in job_dirs(sweep_dir, since):
        overrides = yaml.safe_load((job_dir / ".hydra" / "overrides.yaml").read_text()) or []
        row: dict[str, Any] = {"job": _job_num(job_dir)}
        _add_overrides(row, overrides, keys)
        summary_path = job_dir / "summary.json"  # hops.outputs.files.SUMMARY: written last, so present = complete
        error_path = job_dir / "error.txt"  # hops.run.ERROR_FILE
        if error_path.is_file():
            row["status"] = "error: " + error_path.read_text().strip()
        elif summary_path.is_file():
            try:
                summary = json.loads(summary_path.read_text())
                row.update(headline(summary))
                row["status"] = "ok"
            except (ValueError, KeyError, TypeError, AttributeError) as exc:  # edited or damaged by hand
                row["status"] = f"damaged: summary.json does not read as a run's summary ({type(exc).__name__})"
        else:
            row["status"] = "interrupted: no summary.json (killed, or still running)"
        row["dir"] = str(job_dir.relative_to(sweep_dir))
        rows.append(row)
    seen = {r["job"] for r in rows}
    for num, overrides in enumerate(expected_jobs(sweep_dir) or []):
        if num in seen:
            continue
        row = {"job": num, "status": "interrupted: never started (no job directory)", "dir": None}
        _add_overrides(row, overrides, keys)
        rows.append(row)
    rows.sort(key=lambda r: (r["job"] is None, r["job"] if r["job"] is not None else 0, r["dir"]))
    return rows, keys


def _add_overrides(row: dict, overrides, keys: list) -> None:
    """A job's Hydra overrides as columns (`+`/`~` prefixes dropped), first-seen column order."""
    from hops.run.file_deletions import as_typed

    for item in overrides:
        key, _, value = as_typed(str(item)).partition("=")
        key = key.lstrip("+~")
        if key not in keys:
            keys.append(key)
        row[key] = value


def write_sweep_table(sweep_dir: Path, filename: str = "sweep_results.csv", since: float | None = None) -> Path | None:
    """Write the sweep table CSV; None when the directory holds no jobs."""
    rows, keys = collect(Path(sweep_dir), since)
    if not rows:
        return None
    import pandas as pd

    columns = ["job", *keys, "status", *METRICS, "dir"]
    frame = pd.DataFrame(rows).reindex(columns=columns)
    for col in ("job", "seed", "virtual_stages"):  # integers, even when a failed job leaves a hole
        frame[col] = pd.to_numeric(frame[col], errors="coerce").astype("Int64")
    path = Path(sweep_dir) / filename
    frame.to_csv(path, index=False)
    return path


def failed_jobs(table: Path) -> list[tuple[Any, str]]:
    import csv

    with open(table, newline="") as fh:
        return [(r["job"], r["status"]) for r in csv.DictReader(fh) if r.get("status") != "ok"]


def main(argv: list[str] | None = None, prog: str = "python -m hops.run.sweep") -> int:
    """`prog`: the command as the user typed it (`hops sweep` from the console script)."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or args[0].startswith("-"):
        print(f"usage: {prog} SWEEP_DIR", file=sys.stderr)
        return 2
    if not Path(args[0]).is_dir():
        print(f"error: sweep directory not found: {args[0]}", file=sys.stderr)
        return 2
    if (Path(args[0]) / ".hydra").is_dir() and not (Path(args[0]) / "multirun.yaml").is_file():
        print(f"error: {args[0]} is one run's directory, not a sweep's (a -m run's directory holds multirun.yaml "
              f"and a directory per job)", file=sys.stderr)
        return 2
    path = write_sweep_table(Path(args[0]))
    if path is None:
        print(f"error: no Hydra jobs under {args[0]}", file=sys.stderr)
        return 2
    print(path)
    bad = failed_jobs(path)
    if bad:
        interrupted = sum(1 for _, status in bad if status.startswith("interrupted"))
        print(f"error: {len(bad)} of the sweep's jobs did not finish ({interrupted} interrupted, "
              f"{len(bad) - interrupted} failed); job {bad[0][0]}: {bad[0][1].removeprefix('error: ')}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
