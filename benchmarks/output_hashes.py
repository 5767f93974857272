"""Fingerprint the simulator's outputs, to prove a refactor changes no byte.

For every conf/scenario/*.yaml and every train fixture's hops.base.yaml (under
$HOPS_FIXTURES), under its own schedule and under each schedule named on the command line,
prints one line: <scenario> <schedule or -> <sha256 of events.csv + summary.json, 16 hex>.
Run before and after a change and diff the two outputs:
    python benchmarks/output_hashes.py gpipe 1f1b zero_bubble hops_hetero hetero_search > before.txt
"""
from __future__ import annotations

import hashlib
import os
import sys
import tempfile
from pathlib import Path

import yaml

import hops

ROOT = Path(__file__).resolve().parent.parent


def scenario_files() -> list[Path]:
    files = sorted((ROOT / "conf" / "scenario").glob("*.yaml"))
    fixtures = os.environ.get("HOPS_FIXTURES")
    if fixtures:
        files += sorted(Path(fixtures, "train", "cluster_results").glob("*/hops.base.yaml"))
    return files


def fingerprint(doc: dict) -> str:
    res = hops.simulate(doc)
    res.summary.pop("provenance", None)  # version and git commit: what ran, not what it computed
    res.summary.pop("model_fingerprint", None)  # hashes the model's code: any refactor changes it
    h = hashlib.sha256()
    with tempfile.TemporaryDirectory() as d:
        res.write(d)
        for name in ("events.csv", "summary.json"):
            if (Path(d) / name).exists():
                h.update((Path(d) / name).read_bytes())
    return h.hexdigest()[:16]


def main(schedules: list[str]) -> None:
    for path in scenario_files():
        label = f"{path.parent.name}/{path.name}"
        for sched in [None] + schedules:
            doc = yaml.safe_load(path.read_text())
            if sched:
                doc.setdefault("pipeline", {})["schedule"] = sched
            try:
                print(label, sched or "-", fingerprint(doc), flush=True)
            except hops.HopsError as exc:
                print(label, sched or "-", f"error: {exc}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
