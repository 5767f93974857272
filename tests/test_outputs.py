"""What a run leaves on disk: the same bytes as before, in a readable order, and never a
run that looks complete when it was interrupted.

The kill tests run `hops.run` in a real subprocess, hold it at a chosen write point
(a wrapper blocks inside that writer, half a file already on disk), SIGKILL it, and
inspect what is left. Every run goes to a tmp dir.
"""
from __future__ import annotations

import csv
import json
import math
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import yaml

from hops import simulate
from hops.outputs.files import natural_key
from hops.timeline import EVENTS_CSV_HEADER, Timeline

REPO = Path(__file__).resolve().parent.parent
COLUMNS = (*EVENTS_CSV_HEADER, "iteration")


def row_by_row_csv(tl: Timeline, path: Path) -> None:
    """The events.csv writer as it was (one csv.writer call per row): the byte contract."""
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh, lineterminator="\n")
        w.writerow(EVENTS_CSV_HEADER)
        for i in range(len(tl)):
            w.writerow((tl.kind[i], int(tl.stage[i]), tl.device[i], int(tl.microbatch[i]), tl.phase[i],
                        f"{tl.start_ms[i]:.6f}", f"{tl.end_ms[i]:.6f}", tl.src[i], tl.dst[i]))


def odd_timeline() -> Timeline:
    """Names csv must quote (comma, quote, newline, leading space, unicode), odd floats, -1 ids."""
    rows = {c: [] for c in COLUMNS}
    for vals in (("compute", 0, "gpu,0", 0, "F", 0.0, 1 / 3, "", "", 0),
                 ("transfer", 0, 'gpu"0"', 0, "F", 1 / 3, 2.5e-7, "gpu,0", 'gpu"1"', 0),
                 ("compute", 1, "gpu\n1", 0, "B", 1e9 + 0.1234565, 1e9 + 1, "", "", 0),
                 ("failure", -1, " h100_é", -1, "", -0.0, math.nan, "", "", -1),
                 ("optimizer", 1, "", -1, "OPT", 123.4567894, math.inf, "", "", 0)):
        for c, v in zip(COLUMNS, vals):
            rows[c].append(v)
    return Timeline.from_rows(rows, stage_devices=["gpu,0", "gpu\n1"], microbatches_per_iteration=1)


def small_scenario(stages: int = 3, microbatches: int = 6) -> dict:
    return {"simulation": {"batches": 2, "microbatches": microbatches, "seed": 5},
            "pipeline": {"schedule": "1f1b", "compute_jitter": 0.05,
                         "stages": [{"device": f"h100_{i}", "weights_mb": 500,
                                     "compute": {"mode": "analytical", "tflop": 0.05, "memory_mb": 64}}
                                    for i in range(stages)]},
            "hardware": {"devices": [{"id": f"h100_{i}", "gpu": "h100", "node": f"n{i}"} for i in range(stages)],
                         "interconnect": {"same_node": "nvlink", "cross_node": "infiniband"}}}


# --------------------------------------------------------------------------- events.csv bytes
def odd_finite_timeline() -> Timeline:
    """As odd_timeline, with every time finite and in range: what the block writer prints itself."""
    rows = {c: [] for c in COLUMNS}
    for vals in (("compute", 0, "gpu,0", 0, "F", 0.0, 1 / 3, "", "", 0),
                 ("transfer", 0, 'gpu"0"', 0, "F", 1 / 3, 2.5e-7, "gpu,0", 'gpu"1"', 0),
                 ("compute", 1, "gpu\n1", 0, "B", 1e9 + 0.1234565, 1e9 + 1, "", "", 0),
                 ("failure", -1, " h100_é", -1, "", -0.0, 0.0078125, "", "", -1),
                 ("allreduce", 1, "", -1, "", -2.5e-7, -123.4567895, "a", "", 0),
                 ("optimizer", 1, "", -1, "OPT", 123.4567894, 5e9, "", "", 0)):
        for c, v in zip(COLUMNS, vals):
            rows[c].append(v)
    return Timeline.from_rows(rows, stage_devices=["gpu,0", "gpu\n1"], microbatches_per_iteration=1)


@pytest.mark.parametrize("case", ["simulated", "odd", "odd_finite", "empty"])
def test_events_csv_bytes_are_those_of_the_row_by_row_writer(tmp_path, monkeypatch, case):
    """Both writers: Timeline.write_csv (the library's) and hops.outputs.files.write_events_csv (hops.run's)."""
    from hops.outputs.files import write_events_csv

    if case == "simulated":
        tl = simulate(small_scenario()).timeline
    elif case == "odd":
        tl = odd_timeline()
    elif case == "odd_finite":
        tl = odd_finite_timeline()
    else:
        tl = Timeline.from_rows({c: [] for c in COLUMNS}, stage_devices=["a"], microbatches_per_iteration=1)
    row_by_row_csv(tl, tmp_path / "reference.csv")
    tl.write_csv(tmp_path / "events.csv")
    if case in ("simulated", "odd_finite"):  # printed by the block formatter, not handed back to write_csv
        monkeypatch.setattr(Timeline, "write_csv", None)
    write_events_csv(tl, tmp_path / "blocks.csv")
    assert (tmp_path / "events.csv").read_bytes() == (tmp_path / "reference.csv").read_bytes()
    assert (tmp_path / "blocks.csv").read_bytes() == (tmp_path / "reference.csv").read_bytes()


# --------------------------------------------------------------------------- summary.json
def test_summary_lists_devices_in_natural_order(tmp_path):
    result = simulate(small_scenario(stages=12, microbatches=4))
    result.write(tmp_path)
    text = (tmp_path / "summary.json").read_text()
    doc = json.loads(text)
    expected = [f"h100_{i}" for i in range(12)]
    assert list(doc["peak_memory_mb"]) == expected == list(doc["memory_capacity_mb"])
    assert list(doc["utilization"]["per_device"]) == expected
    assert list(doc["utilization"]["per_stage"]) == [str(i) for i in range(12)]
    assert text.index('"h100_2"') < text.index('"h100_10"')
    assert sorted(["h100_10", "h100_2", "a10g_1"], key=natural_key) == ["a10g_1", "h100_2", "h100_10"]


def test_summary_carries_its_provenance(tmp_path):
    path = REPO / "conf" / "scenario" / "h100_pair.yaml"
    simulate(path).write(tmp_path)
    prov = json.loads((tmp_path / "summary.json").read_text())["provenance"]
    assert prov["scenario_file"] == str(path)
    from importlib.metadata import version

    assert prov["hops_version"] == version("hops")
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True)
    if head.returncode == 0:  # a checkout (CI clones one)
        assert prov["git_commit"] == head.stdout.strip()
    assert simulate(small_scenario()).summary["provenance"]["scenario_file"] is None
    assert simulate(path).summary == simulate(yaml.safe_load(path.read_text())).summary, \
        "in memory, a file and the same dict give the same summary"


# --------------------------------------------------------------------------- kill safety
WRAPPER = textwrap.dedent('''
    """Run hops.run, but block at one write point (after writing half a file) until killed."""
    import os, pathlib, sys, time

    point, flag = os.environ["HOPS_TEST_POINT"], pathlib.Path(os.environ["HOPS_TEST_FLAG"])
    only = os.environ.get("HOPS_TEST_JOB_DIR")  # block only in this job's directory (sweeps)

    def hold(path):
        path = pathlib.Path(path)
        if only and path.parent.name != only:
            return
        path.write_text("half a file")
        flag.write_text(str(path))
        time.sleep(600)

    import hops.outputs.chrome_trace, hops.outputs.files, hops.outputs.plots, hops.timeline

    if point == "summary":  # the last step: summary.json written to its temporary, not yet renamed
        orig = hops.outputs.files.write_text
        def blocked(path, text, **kw):
            if pathlib.Path(path).name == "summary.json":
                hold(hops.outputs.files.tmp_path(pathlib.Path(path)))
            return orig(path, text, **kw)
        hops.outputs.files.write_text = blocked
    else:
        owner, name = {"events": (hops.outputs.files, "write_events_csv"),
                       "dashboard": (hops.outputs.plots, "plot_dashboard"),
                       "trace": (hops.outputs.chrome_trace, "write_chrome_trace")}[point]
        orig = getattr(owner, name)
        def blocked(*args, _orig=orig, **kwargs):
            hold(args[-1])  # the path argument
            return _orig(*args, **kwargs)
        setattr(owner, name, blocked)
    from hops.run.app import main
    main(sys.argv[1:])
''')


def start_held(tmp_path: Path, point: str, *args: str, job_dir: str | None = None) -> tuple[subprocess.Popen, Path]:
    script = tmp_path / "held_run.py"
    script.write_text(WRAPPER)
    flag = tmp_path / f"held-{point}"
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    env.update(HOPS_TEST_POINT=point, HOPS_TEST_FLAG=str(flag), MPLBACKEND="Agg")
    if job_dir is not None:
        env["HOPS_TEST_JOB_DIR"] = job_dir
    proc = subprocess.Popen([sys.executable, str(script), *args], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 180
    while not flag.exists():
        if proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail(f"the run ended before reaching {point}: {err[-2000:]}")
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"the run never reached {point}")
        time.sleep(0.05)
    return proc, Path(flag.read_text())


def kill(proc: subprocess.Popen) -> None:
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL


@pytest.mark.parametrize("point", ["events", "dashboard", "trace", "summary"])
def test_a_run_killed_while_writing_never_looks_complete(tmp_path, point):
    out = tmp_path / "run"
    (out).mkdir()
    (out / "summary.json").write_text('{"stale": "from an earlier run into the same directory"}')
    plots = "output.plots=true" if point == "dashboard" else "output.plots=false"
    proc, held = start_held(tmp_path, point, plots, f"hydra.run.dir={out}")
    assert held.parent == out and held.name.startswith("."), f"{held}: written under a temporary name"
    kill(proc)
    assert not (out / "summary.json").exists(), "an interrupted run must not have a summary.json"
    final = {"events": "events.csv", "dashboard": "dashboard.png", "trace": "trace.json"}.get(point)
    if final:
        assert not (out / final).exists(), f"half-written {final} under its final name"
    for f in out.iterdir():  # whatever did get its final name is complete
        if f.name == "events.csv":
            assert f.read_text().count("\n") > 10
        if f.name == "scenario.yaml":
            assert "pipeline:" in f.read_text()


def test_python_m_hops_sweep_reports_a_killed_sweep_as_interrupted(tmp_path):
    sweep = tmp_path / "sweep"
    # basic launcher: jobs run one after another in this process; job 1 is held and killed
    proc, held = start_held(tmp_path, "trace", "-m", "hydra/launcher=basic", "simulation.seed=1,2,3",
                            "output.plots=false", f"hydra.sweep.dir={sweep}", job_dir="1")
    assert held.parent == sweep / "1"
    kill(proc)
    assert not (sweep / "sweep_results.csv").exists()
    table = subprocess.run([sys.executable, "-m", "hops.run.sweep", str(sweep)], cwd=REPO, capture_output=True,
                           text=True, timeout=120)
    assert table.returncode == 2, table.stderr
    assert "2 of the sweep's jobs did not finish (2 interrupted" in table.stderr
    with open(sweep / "sweep_results.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert [(r["job"], r["simulation.seed"], r["status"].split(":")[0]) for r in rows] == [
        ("0", "1", "ok"), ("1", "2", "interrupted"), ("2", "3", "interrupted")]
    assert "no summary.json" in rows[1]["status"] and "never started" in rows[2]["status"]
    assert float(rows[0]["samples_per_s"]) > 0 and rows[1]["samples_per_s"] == ""


def test_a_writer_that_fails_leaves_no_temporary_and_its_error_names_the_output(tmp_path):
    """A full disk half-way through a writer: the temporary is removed, and the OSError carries
    the output's own name second, as a failed rename does, for the one-line error."""
    import errno

    from hops.outputs import files
    from hops.run.run_dir import cannot_write

    def fills_the_disk(tmp):
        Path(tmp).write_bytes(b"half")
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp))

    with pytest.raises(OSError) as exc:
        files.write_with(tmp_path / "timeline.png", fills_the_disk)
    assert list(tmp_path.iterdir()) == []
    assert cannot_write(exc.value).startswith(f"cannot write {tmp_path / 'timeline.png'}: No space left on device")
