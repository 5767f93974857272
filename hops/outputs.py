"""How run outputs reach the disk: complete or not at all, in a stable, readable order.

Every file is written to a temporary name in the same directory and renamed into
place, so a killed run never leaves a half-written file under its final name, and
summary.json is written last: a run directory with a summary.json is a complete run
(hops.sweep relies on this to tell finished jobs from interrupted ones).
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

SUMMARY = "summary.json"


def natural_key(text: str) -> list:
    """h100_2 before h100_10; stage "9" before "10"."""
    return [(0, int(t), "") if t.isdigit() else (1, 0, t) for t in re.split(r"(\d+)", str(text)) if t]


def naturally_ordered(obj):
    """Mappings with their keys in natural order, recursively (json.dump keeps insertion order)."""
    if isinstance(obj, dict):
        return {k: naturally_ordered(obj[k]) for k in sorted(obj, key=natural_key)}
    if isinstance(obj, (list, tuple)):
        return [naturally_ordered(v) for v in obj]
    return obj


def summary_json(summary: dict) -> str:
    return json.dumps(naturally_ordered(summary), indent=2) + "\n"


def schedule_text(summary: dict) -> str:
    """The schedule asked for, and what an adaptive one (hops_hetero) picked: "hops_hetero (chose 1f1b)"."""
    sched = summary.get("schedule", "?")
    eff = summary.get("scheduler_effective")
    try:
        from .schedulers import resolve_scheduler

        own_name = resolve_scheduler(sched).name
    except Exception:  # noqa: BLE001 - display only
        own_name = sched
    return sched if not eff or eff == own_name else f"{sched} (chose {eff})"


def scenario_label(summary: dict) -> str | None:
    """The scenario's name as summary.json records it (name, else the file's name)."""
    prov = summary.get("provenance") or {}
    if prov.get("scenario"):
        return str(prov["scenario"])
    f = prov.get("scenario_file")
    return (Path(f).parent.name if Path(f).name == "hops.base.yaml" else Path(f).stem) if f else None


def tmp_path(path: Path) -> Path:
    """A hidden sibling that keeps the extension (matplotlib and gzip go by it): .trace.tmp.json"""
    return path.with_name(f".{path.stem}.tmp{path.suffix}")


def commit(tmp: Path, path: Path, *, sync: bool = False) -> Path:
    """Rename a fully written temporary into place (fsync first when asked: the completion marker)."""
    if sync:
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
    os.replace(tmp, path)
    return path


def write_text(path: str | Path, text: str, *, sync: bool = False) -> Path:
    path = Path(path)
    tmp = tmp_path(path)
    tmp.write_text(text)
    return commit(tmp, path, sync=sync)


def write_with(path: str | Path, writer, *, sync: bool = False) -> Path:
    """`writer(tmp)` writes the file at a temporary path; it is renamed to `path` only once done."""
    path = Path(path)
    tmp = tmp_path(path)
    writer(tmp)
    return commit(tmp, path, sync=sync)
