"""Fingerprint the simulator's outputs, to prove a refactor changes no byte.

For every conf/scenario/*.yaml and every train fixture's hops.base.yaml (under
$HOPS_FIXTURES), plus any --scenarios files, under its own schedule and under each schedule
named on the command line, prints one line: <scenario> <schedule or -> <sha256 of events.csv +
summary.json, 16 hex>. Run before and after a change and diff the two outputs:
    python benchmarks/output_hashes.py gpipe 1f1b zero_bubble hops_hetero hetero_search > before.txt
A schedule is NAME[/V][+pv]: /V sets pipeline.virtual_stages (zb_v runs only with /2), +pv
optimizer.post_validation: true, so the V and the post-validated orders are covered too:
    python benchmarks/output_hashes.py zb_v/2 zb_v/2+pv hetero_search+pv \\
        --scenarios experiments/hetero_scheduler/configs/*.yaml
"""
from __future__ import annotations

import argparse
import hashlib
import os
import re
import tempfile
from pathlib import Path

import yaml

import hops

ROOT = Path(__file__).resolve().parent.parent
SPEC = re.compile(r"^(?P<name>[\w.]+)(?:/(?P<v>\d+))?(?P<pv>\+pv)?$")


def scenario_files(extra=()) -> list[Path]:
    files = sorted((ROOT / "conf" / "scenario").glob("*.yaml"))
    fixtures = os.environ.get("HOPS_FIXTURES")
    if fixtures:
        files += sorted(Path(fixtures, "train", "cluster_results").glob("*/hops.base.yaml"))
    return files + [Path(p) for p in extra]


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


def schedule_spec(text: str) -> str:
    if not SPEC.match(text):
        raise argparse.ArgumentTypeError(f"{text!r}: expected NAME[/V][+pv], e.g. zb_v/2+pv")
    return text


def apply(doc: dict, spec: str) -> None:
    """Set the schedule a NAME[/V][+pv] spec names on the scenario document."""
    g = SPEC.match(spec)
    pipe = doc.setdefault("pipeline", {})
    pipe["schedule"] = g["name"]
    if g["v"]:
        pipe["virtual_stages"] = int(g["v"])
    if g["pv"]:
        doc.setdefault("optimizer", {})["post_validation"] = True


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("schedules", nargs="*", type=schedule_spec, help="NAME[/V][+pv], each run on every scenario")
    ap.add_argument("--scenarios", nargs="*", default=[], metavar="YAML", help="more scenario files to fingerprint")
    args = ap.parse_args(argv)
    for path in scenario_files(args.scenarios):
        label = f"{path.parent.name}/{path.name}"
        for spec in [None] + args.schedules:
            doc = yaml.safe_load(path.read_text())
            if spec:
                apply(doc, spec)
            try:
                print(label, spec or "-", fingerprint(doc), flush=True)
            except hops.HopsError as exc:
                print(label, spec or "-", f"error: {exc}", flush=True)


if __name__ == "__main__":
    main()
