"""A big single run draws its PNGs in a second process (hops.run.plot_worker) while it writes the rest.

What the run's directory gets must not depend on where the pictures were drawn: the same
bytes, the same atomic writes, summary.json last. A worker that fails or dies is the run's
failure, said in one line, never a hang and never a run that looks complete.
"""
from __future__ import annotations

import io
import os
from pathlib import Path

import pytest
import yaml

from builders import pipeline

import hops
from hops.outputs.plots import plot_dashboard, plot_timeline
from hops.run import plot_worker
from hops.run.app import main

PNGS = ("timeline.png", "dashboard.png")


@pytest.fixture(autouse=True)
def _no_full_error(monkeypatch):
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)


def scenario_file(tmp_path: Path, p: int = 4, m: int = 16) -> Path:
    path = tmp_path / "pp.yaml"
    path.write_text(yaml.safe_dump(pipeline(p, m, batches=2, jitter=0.1)))
    return path


def run(tmp_path: Path, name: str, *args: str) -> Path:
    out = tmp_path / name
    main([f"scenario_file={scenario_file(tmp_path)}", f"hydra.run.dir={out}", *args])
    return out


def spy_on_the_worker(monkeypatch) -> list[list[str]]:
    """Every run from now on draws in a worker; returns the list of what each worker was asked to draw."""
    monkeypatch.setattr(plot_worker, "MIN_PASSES", 0)
    monkeypatch.setattr(plot_worker, "spare_core", lambda: True)
    asked: list[list[str]] = []
    draw = plot_worker.PlotWorker.draw

    def recording(self, plots):
        asked.append(list(plots))
        return draw(self, plots)

    monkeypatch.setattr(plot_worker.PlotWorker, "draw", recording)
    return asked


# Run in the worker: the spawned process imports this module by name to find them.
def crash(*args, **kwargs):
    os._exit(3)


def bug(*args, **kwargs):
    raise ZeroDivisionError("a bug in a plot")


# --------------------------------------------------------------------------- when
def test_only_a_big_single_run_with_plots_and_a_spare_core_starts_a_worker(monkeypatch):
    monkeypatch.setattr(plot_worker, "spare_core", lambda: True)
    big = pipeline(64, 1024, batches=4)  # 262,144 stage-microbatch passes
    assert plot_worker.wanted(big, multirun=False)
    assert not plot_worker.wanted(big, multirun=True), "a sweep's jobs already share the cores"
    assert not plot_worker.wanted({**big, "output": {"plots": False}}, multirun=False)
    small = pipeline(4, plot_worker.MIN_PASSES // 4 - 1)
    assert not plot_worker.wanted(small, multirun=False), "below MIN_PASSES drawing here is cheaper"
    assert plot_worker.wanted(pipeline(4, plot_worker.MIN_PASSES // 4), multirun=False)
    monkeypatch.setattr(plot_worker, "spare_core", lambda: False)
    assert not plot_worker.wanted(big, multirun=False), "every core busy: the worker's start-up would cost"


def test_a_core_is_spare_while_the_load_average_leaves_one_idle(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    for load, spare in ((0.2, True), (1.0, True), (1.3, False), (3.9, False)):
        monkeypatch.setattr(os, "getloadavg", lambda load=load: (load, 0.0, 0.0))
        assert plot_worker.spare_core() is spare, load


# --------------------------------------------------------------------------- what it writes
def test_the_worker_s_pngs_are_the_bytes_drawn_in_process(tmp_path, monkeypatch):
    here = run(tmp_path, "here")
    asked = spy_on_the_worker(monkeypatch)
    there = run(tmp_path, "there")
    assert asked == [list(PNGS)]
    for name in (*PNGS, "events.csv", "trace.json", "scenario.yaml"):
        assert (there / name).read_bytes() == (here / name).read_bytes(), name
    assert (there / "summary.json").is_file()
    assert not [p.name for p in there.iterdir() if ".tmp" in p.name], "only renamed, complete files"


def test_a_plot_drawn_into_memory_is_the_file_s_bytes(tmp_path):
    result = hops.simulate(pipeline(3, 6))
    for draw in (lambda p: plot_timeline(result.timeline, p, title="t"),
                 lambda p: plot_dashboard(result.summary, result.timeline, p)):
        buf = io.BytesIO()
        assert draw(buf) is buf
        assert draw(tmp_path / "x.png") == tmp_path / "x.png"
        assert buf.getvalue() == (tmp_path / "x.png").read_bytes()


# --------------------------------------------------------------------------- when it fails
def test_a_worker_that_dies_is_one_line_and_the_run_never_looks_complete(tmp_path, monkeypatch, capsys):
    asked = spy_on_the_worker(monkeypatch)
    monkeypatch.setattr("hops.outputs.plots.plot_dashboard", crash)
    with pytest.raises(SystemExit) as exit_:
        run(tmp_path, "run")
    assert exit_.value.code == 2 and asked == [list(PNGS)]
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: timeline.png, dashboard.png: the process drawing them ended before it finished "
                   "(killed, or out of memory?); run again, or with output.plots=false to skip the plots"], err
    out = tmp_path / "run"
    assert not (out / "summary.json").exists()
    assert not any((out / name).exists() for name in PNGS)
    assert (out / "events.csv").is_file() and (out / "trace.json").is_file(), "what was written stays"


def test_a_bug_in_a_plot_reaches_the_run_as_itself(tmp_path, monkeypatch):
    spy_on_the_worker(monkeypatch)
    monkeypatch.setattr("hops.outputs.plots.plot_timeline", bug)
    with pytest.raises(ZeroDivisionError, match="a bug in a plot"):
        run(tmp_path, "run")
    assert not (tmp_path / "run" / "summary.json").exists()


SLOW_RUN = """
import os, pathlib, sys, time
from hops.run import app, plot_worker
import hops.outputs.plots

plot_worker.MIN_PASSES = 0
plot_worker.spare_core = lambda: True

def slow(*args, **kwargs):  # runs in the worker: says who it is, then takes its time
    pathlib.Path(os.environ["HOPS_TEST_FLAG"]).write_text(str(os.getpid()))
    time.sleep(600)

hops.outputs.plots.plot_timeline = slow
if __name__ == "__main__":
    app.main(sys.argv[1:])
"""


def ended(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1].startswith("Z")  # a zombie has ended
    except FileNotFoundError:
        return True


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads process states from /proc")
def test_a_killed_run_s_worker_ends_with_it_and_leaves_no_pngs(tmp_path):
    import signal
    import subprocess
    import sys
    import time

    script, flag, out = tmp_path / "slow_run.py", tmp_path / "worker-pid", tmp_path / "run"
    script.write_text(SLOW_RUN)
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    proc = subprocess.Popen([sys.executable, str(script), f"scenario_file={scenario_file(tmp_path)}",
                             f"hydra.run.dir={out}"], env={**env, "HOPS_TEST_FLAG": str(flag)},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while not flag.exists() or not flag.read_text():
        assert proc.poll() is None, proc.communicate()[1].decode()[-2000:]
        assert time.monotonic() < deadline, "the worker never started drawing"
        time.sleep(0.05)
    worker = int(flag.read_text())
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=60)
    deadline = time.monotonic() + 10
    while not ended(worker):
        assert time.monotonic() < deadline, "the worker outlived the killed run"
        time.sleep(0.1)
    assert not (out / "summary.json").exists()
    assert not any((out / name).exists() for name in PNGS)
