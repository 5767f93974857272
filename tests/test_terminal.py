"""The run app on a terminal, and progress: what a user at a shell sees.

Every other app test reads pipes, where progress is off; a multirun once crashed only on a
terminal (a launcher pickled the sweep callback, whose progress line held a thread lock).
So the app runs here on a pseudo-terminal (tests/terminal.py): a single run, and a multirun
under each launcher that runs on this machine (hops_joblib, hops_submitit_local; hops_ray
on a pty is in tests/test_servers.py, next to its Ray cluster; hops_slurm has no cluster
here, and submits through the same submitit executor code as hops_submitit_local).
`hops.run.progress` itself is specified with a fake terminal stream and short delays.
"""
from __future__ import annotations

import csv
import io
import json
import re
import sys
import time
from pathlib import Path

import pytest
import yaml

from builders import pipeline
from terminal import lines_as_shown, on_terminal

from hops.run.progress import Progress


def app(*args: str) -> list[str]:
    return [sys.executable, "-m", "hops.run", *args]


def rows(sweep: Path) -> list[dict]:
    with open(sweep / "sweep_results.csv", newline="") as fh:
        return list(csv.DictReader(fh))


# --------------------------------------------------------------------------- the app on a pty
def test_a_short_run_on_a_terminal_prints_its_summary_and_no_progress(tmp_path):
    code, out = on_terminal(app("output.plots=false", f"hydra.run.dir={tmp_path / 'run'}"))
    assert code == 0, out
    shown = lines_as_shown(out)
    assert shown[0].startswith("HOPS hetero_pp4 (default): 4 stages"), out  # nothing before the summary
    assert "hops:" not in out and "Traceback" not in out  # a sub-2-s run draws no progress at all
    assert (tmp_path / "run" / "summary.json").is_file()


def test_a_long_run_shows_what_it_does_then_erases_it_before_the_summary(tmp_path):
    scenario = tmp_path / "big.yaml"  # 64 stages x 512 microbatches x 4 iterations: several seconds
    scenario.write_text(yaml.safe_dump(pipeline(64, 512, batches=4)))
    code, out = on_terminal(app(f"scenario_file={scenario}", "output.plots=false", f"hydra.run.dir={tmp_path / 'run'}"))
    assert code == 0, out
    before, summary = out.split("HOPS big:", 1)
    frames = [f for f in before.split("\r") if f.startswith("hops: ")]
    assert frames, before  # past 2 s the run says what it does ...
    simulating = re.compile(r"hops: simulating 64 stages x 512 microbatches x 4 iterations"
                            r"(, [1-4] of 4 iterations done)?: \[00:")
    for frame in frames:  # ... the simulation (its size, then iterations done), then each writer
        assert simulating.match(frame) or frame.startswith("hops: writing "), frame
        if frame.startswith("hops: writing") and "summary.json" not in frame:
            assert " of 4 files, 520,192 events): [00:" in frame, frame
    shown = lines_as_shown(out)
    first = next(i for i, ln in enumerate(shown) if "HOPS big:" in ln)
    assert shown[first].startswith("HOPS big:") and not any(ln.strip() for ln in shown[:first]), shown[:first + 1]
    assert "hops:" not in summary  # erased, and not redrawn after the summary
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["seed"] == 1


@pytest.mark.parametrize("launcher", ["hops_joblib", "hops_submitit_local"])
def test_a_multirun_on_a_terminal_runs_every_job(tmp_path, launcher):
    if launcher == "hops_submitit_local":
        pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    sweep = tmp_path / "sweep"
    code, out = on_terminal(app("-m", f"hydra/launcher={launcher}", "pipeline.schedule=gpipe,1f1b,zb_h1",
                                "output.plots=false", f"hydra.sweep.dir={sweep}"))
    assert code == 0, out
    assert "Traceback" not in out and "PicklingError" not in out
    assert [(r["pipeline.schedule"], r["status"]) for r in rows(sweep)] == \
        [("gpipe", "ok"), ("1f1b", "ok"), ("zb_h1", "ok")]
    shown = lines_as_shown(out)
    table = [ln for ln in shown if "sweep table:" in ln]
    assert table == [f"sweep table: {(sweep / 'sweep_results.csv').resolve()}"]  # not glued to a progress line
    for line in shown:
        if "[job " in line:
            assert line.startswith("[job "), line  # each job's line starts at the margin


# --------------------------------------------------------------------------- hops.run.progress
class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_is_silent_off_a_terminal_and_before_its_delay():
    pipe = io.StringIO()
    with Progress(total=3, desc="x", stream=pipe) as p:  # not a terminal: off
        p.update(3)
    assert pipe.getvalue() == "" and not p.enabled
    term = FakeTerminal()
    with Progress(total=3, desc="x", stream=term, delay=5.0) as p:
        p.update(3)
        p.phase("y")
    assert term.getvalue() == ""  # finished before the delay: never drawn, nothing to erase


def test_progress_redraws_while_a_step_runs_and_is_erased_at_the_end():
    term = FakeTerminal()
    p = Progress(stream=term, delay=0.2, bar_format="{desc}[{elapsed}]")
    p.phase("hops: simulating")
    time.sleep(1.4)  # no update() from the caller: the redraw thread keeps the time moving
    p.close()
    frames = term.getvalue().split("\r")
    drawn = [f for f in frames if f.startswith("hops: simulating")]
    assert len(drawn) >= 2 and "[00:01]" in drawn[-1], frames
    assert frames[-1] == "" and frames[-2].strip() == ""  # the last frame blanks the line, cursor at column 0


def test_progress_counts_phases_and_a_line_written_during_it_stands_alone():
    term = FakeTerminal()
    with Progress(total=4, desc="trials", unit="trial", stream=term, delay=0.0) as p:
        p.update(2)
        time.sleep(0.7)  # redrawn within REDRAW_S
        p.write("note: something", file=term)
        p.phase("folds", total=3, unit="fold")
        p.update()
        time.sleep(0.7)
    text = term.getvalue()
    assert "2/4" in text and "1/3" in text and "fold" in text
    assert "\rnote: something\n" in text  # the progress line is cleared first


def test_each_counts_the_items_of_a_loop_and_erases_its_line_when_the_loop_ends_early(capsys, monkeypatch):
    """The helper for per-fold / per-trial loops (e.g. a cross-validation's folds)."""
    import hops.run.progress

    monkeypatch.setattr(hops.run.progress, "DELAY_S", 0.0)
    monkeypatch.setattr(hops.run.progress, "MIN_INTERVAL_S", 0.0)
    seen = []
    for fold in hops.run.progress.each(["a", "b", "c", "d"], "crossval", "fold", enabled=True, label=str.upper):
        seen.append(fold)
        if fold == "c":
            break
    err = capsys.readouterr().err
    assert seen == ["a", "b", "c"]
    assert "crossval:" in err and "2/4" in err and "fold" in err and "B]" in err
    assert err.endswith("\r") and err.split("\r")[-2].strip() == ""  # erased although the loop broke off


def test_a_sweep_counts_its_finished_jobs_on_disk(tmp_path):
    from hops.run.sweep import JobsDone

    term = FakeTerminal()
    done = JobsDone(tmp_path, time.time(), Progress(total=3, desc="sweep", unit="job", stream=term, delay=0.0))
    for job, marker in enumerate(("summary.json", "error.txt")):  # a failed job is finished too
        (tmp_path / str(job) / ".hydra").mkdir(parents=True)
        (tmp_path / str(job) / ".hydra" / "overrides.yaml").write_text(f"- a={job + 1}\n")
        (tmp_path / str(job) / marker).write_text("{}")
    (tmp_path / "2" / ".hydra").mkdir(parents=True)  # started, not finished
    (tmp_path / "2" / ".hydra" / "overrides.yaml").write_text("- a=3\n")
    assert done.finished() == 2
    deadline = time.monotonic() + 10
    while done.progress.n != 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(0.7)  # redrawn within REDRAW_S
    done.stop()
    assert "2/3" in term.getvalue()


def test_the_sweep_callback_pickles_without_its_progress(tmp_path):
    """Launchers pickle Hydra's callbacks to send them to the jobs."""
    import pickle

    from hops.run.sweep import JobsDone, SweepTable

    table = SweepTable("t.csv")
    table._progress = JobsDone(tmp_path, time.time(), Progress(stream=FakeTerminal()))  # a lock and threads
    try:
        copy = pickle.loads(pickle.dumps(table))
    finally:
        table._progress.stop()
    assert copy.filename == "t.csv" and copy._progress is None

