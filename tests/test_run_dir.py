"""A hops.run owns its run directory: a second run into a busy directory is refused with one
line, and a directory never holds files of two runs.

Before, two runs into the same hydra.run.dir both exited 0 with one run's outputs silently
gone, or left A's summary.json next to B's timeline.png, or a dashboard.png made of B's PNG
followed by the tail of A's. Every case here compares the directory, file by file, with the
same scenario run alone.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from hops.outputs import files as outputs
from hops.run.run_dir import LOCK, OWNER, PREVIOUS, RUN_OUTPUTS

REPO = Path(__file__).resolve().parent.parent
COMPARED = ("summary.json", "events.csv", "scenario.yaml", "timeline.png", "dashboard.png", "trace.json")
SCENARIOS = ("h100_pair", "hetero_pp4")

# hops.run, held before its first output is written until HOPS_TEST_GO exists
# (HOPS_TEST_HELD is created once it holds the directory and is waiting).
HELD = textwrap.dedent('''
    import os, pathlib, sys, time
    import hops.outputs.files
    held, go = pathlib.Path(os.environ["HOPS_TEST_HELD"]), pathlib.Path(os.environ["HOPS_TEST_GO"])
    orig = hops.outputs.files.write_events_csv
    def wait_then_write(*args, **kwargs):
        held.write_text("held")
        while not go.exists():
            time.sleep(0.05)
        return orig(*args, **kwargs)
    hops.outputs.files.write_events_csv = wait_then_write
    from hops.run.app import main
    main(sys.argv[1:])
''')


def env() -> dict:
    e = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    e["MPLBACKEND"] = "Agg"
    return e


def hops_run(*args: str, wait: bool = True):
    cmd = [sys.executable, "-m", "hops.run", *args]
    if wait:
        return subprocess.run(cmd, cwd=REPO, env=env(), capture_output=True, text=True, timeout=300)
    return subprocess.Popen(cmd, cwd=REPO, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.fixture(scope="module")
def alone(tmp_path_factory) -> dict[str, dict[str, bytes]]:
    """Each scenario's outputs when it has its directory to itself (the runs are deterministic)."""
    ref = {}
    for name in SCENARIOS:
        out = tmp_path_factory.mktemp(name)
        proc = hops_run(f"+scenario={name}", f"hydra.run.dir={out}")
        assert proc.returncode == 0, proc.stderr[-2000:]
        ref[name] = {f: (out / f).read_bytes() for f in COMPARED}
    return ref


def from_one_run(out: Path, alone: dict) -> str:
    """The scenario whose outputs `out` holds, asserting every file is that run's, byte for byte."""
    owners = {name for name, files in alone.items() if (out / "summary.json").read_bytes() == files["summary.json"]}
    assert len(owners) == 1, "summary.json is neither scenario's"
    owner = owners.pop()
    for f in COMPARED:
        assert (out / f).read_bytes() == alone[owner][f], f"{f} is not {owner}'s (the summary's run)"
    assert not list(out.glob(".*tmp*")), "a temporary file was left behind"
    return owner


def start_held(tmp_path: Path, *args: str) -> tuple[subprocess.Popen, Path]:
    script, held, go = tmp_path / "held.py", tmp_path / "held", tmp_path / "go"
    script.write_text(HELD)
    e = dict(env(), HOPS_TEST_HELD=str(held), HOPS_TEST_GO=str(go))
    proc = subprocess.Popen([sys.executable, str(script), *args], cwd=REPO, env=e, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 180
    while not held.exists():
        assert proc.poll() is None, proc.communicate()[1][-2000:]
        assert time.monotonic() < deadline, "the held run never reached its first output"
        time.sleep(0.05)
    return proc, go


def test_a_second_run_into_a_busy_directory_is_refused_and_changes_nothing(tmp_path, alone):
    out = tmp_path / "run"
    first, go = start_held(tmp_path, "+scenario=h100_pair", f"hydra.run.dir={out}")
    hydra_before = {p.name: p.read_bytes() for p in (out / ".hydra").iterdir()}
    second = hops_run("+scenario=hetero_pp4", f"hydra.run.dir={out}")
    lines = second.stderr.strip().splitlines()
    assert second.returncode == 2 and len(lines) == 1, second.stderr[-2000:]
    assert lines[0] == (f"error: hydra.run.dir={out} is in use by another hops run (pid {first.pid}); "
                        f"wait for it to finish or pass another hydra.run.dir")
    assert {p.name: p.read_bytes() for p in (out / ".hydra").iterdir()} == hydra_before, \
        "the refused run rewrote the owner's .hydra configs"
    go.write_text("go")
    assert first.wait(timeout=300) == 0, first.communicate()[1][-2000:]
    assert from_one_run(out, alone) == "h100_pair"
    assert "hetero_pp4" not in (out / "run.log").read_text()


def test_runs_started_together_into_one_directory_never_mix(tmp_path, alone):
    """The race as a user meets it: both start at once. Either one is refused (one line, exit 2)
    or they did not overlap; either way the directory is one run's, whole."""
    outcomes = []
    for i in range(3):
        out = tmp_path / f"pair{i}"
        procs = [hops_run(f"+scenario={name}", f"hydra.run.dir={out}", wait=False) for name in SCENARIOS]
        results = [(p.wait(timeout=300), p.communicate()[1]) for p in procs]
        codes = sorted(rc for rc, _ in results)
        assert codes in ([0, 0], [0, 2]), results
        for rc, err in results:
            if rc == 2:
                assert len(err.strip().splitlines()) == 1 and "is in use by another hops run" in err, err
        outcomes.append((codes, from_one_run(out, alone)))
    print("same-directory pairs (exit codes, owner):", outcomes)


def test_a_run_into_a_used_directory_leaves_none_of_the_earlier_runs_files(tmp_path, alone):
    out = tmp_path / "run"
    assert hops_run("+scenario=hetero_pp4", f"hydra.run.dir={out}").returncode == 0
    (out / ".timeline.1234-deadbeef.tmp.png").write_bytes(b"an interrupted write")
    again = hops_run("+scenario=h100_pair", "output.plots=false", "output.chrome_trace=false", f"hydra.run.dir={out}")
    assert again.returncode == 0, again.stderr[-2000:]
    left = sorted(p.name for p in out.iterdir() if p.name in RUN_OUTPUTS or "tmp" in p.name)
    assert left == ["events.csv", "scenario.yaml", "summary.json"], left
    assert (out / "events.csv").read_bytes() == alone["h100_pair"]["events.csv"]
    assert json.loads((out / "summary.json").read_text())["provenance"]["scenario"] == "h100_pair"


def test_a_run_that_fails_on_a_user_error_leaves_the_last_finished_run_as_it_was(tmp_path, alone):
    out = tmp_path / "run"
    assert hops_run("+scenario=hetero_pp4", f"hydra.run.dir={out}").returncode == 0
    before = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file() and p.name not in (LOCK, OWNER)}
    typo = hops_run("+scenario=h100_pair", "pipeline.schedule=fifo", f"hydra.run.dir={out}")
    assert typo.returncode == 2 and "unknown scheduler 'fifo'" in typo.stderr
    after = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file() and p.name not in (LOCK, OWNER)}
    assert after == before  # outputs, .hydra/ and run.log: nothing of the failed run, nothing set aside left over
    assert from_one_run(out, alone) == "hetero_pp4"


def test_a_run_of_the_directorys_own_scenario_yaml_reads_it_before_anything_moves(tmp_path, alone):
    out = tmp_path / "run"
    assert hops_run("+scenario=h100_pair", f"hydra.run.dir={out}").returncode == 0
    again = hops_run(f"scenario_file={out / 'scenario.yaml'}", f"hydra.run.dir={out}")
    assert again.returncode == 0, again.stderr[-2000:]
    assert (out / "events.csv").read_bytes() == alone["h100_pair"]["events.csv"]
    assert not (out / PREVIOUS).exists()


def test_ctrl_c_prints_one_line_exits_130_and_puts_the_last_finished_run_back(tmp_path, alone):
    out = tmp_path / "run"
    assert hops_run("+scenario=hetero_pp4", f"hydra.run.dir={out}").returncode == 0
    proc, _ = start_held(tmp_path, "+scenario=h100_pair", f"hydra.run.dir={out}")
    assert not (out / "summary.json").exists()  # set aside while the new run is under way
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and err.strip().splitlines() == ["interrupted"], err[-2000:]
    assert from_one_run(out, alone) == "hetero_pp4" and not (out / PREVIOUS).exists()


@pytest.mark.parametrize("first,second,holds", [
    (("-m", "simulation.seed=1,2"), ("-m", "simulation.seed=3"), "an earlier sweep's results (multirun.yaml)"),
    (("-m", "simulation.seed=1,2"), (), "an earlier sweep's results (multirun.yaml)"),
    ((), ("-m", "simulation.seed=3"), "an earlier run's results (summary.json)"),
])
def test_sweeps_and_runs_never_share_a_directory(tmp_path, first, second, holds):
    """A second sweep's shorter job list would leave the first's later jobs beside its own."""
    out = tmp_path / "dir"

    def where(args):
        return f"hydra.sweep.dir={out}" if args else f"hydra.run.dir={out}"

    launcher = ("hydra/launcher=basic",)
    assert hops_run(*first, *(launcher if first else ()), "output.plots=false", where(first)).returncode == 0
    listed = sorted(p.name for p in out.iterdir())
    proc = hops_run(*second, *(launcher if second else ()), "output.plots=false", where(second))
    kind = "hydra.sweep.dir" if second else "hydra.run.dir"
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        f"error: {kind}={out} holds {holds}; pass another {kind}, or remove them first"], proc.stderr[-2000:]
    assert sorted(p.name for p in out.iterdir()) == listed


def test_a_killed_run_does_not_leave_its_directory_locked(tmp_path, alone):
    out = tmp_path / "run"
    first, _ = start_held(tmp_path, "+scenario=hetero_pp4", f"hydra.run.dir={out}")
    os.kill(first.pid, signal.SIGKILL)
    first.communicate(timeout=60)
    assert (out / LOCK).exists() and (out / OWNER).read_text().strip() == str(first.pid)
    proc = hops_run("+scenario=h100_pair", f"hydra.run.dir={out}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert from_one_run(out, alone) == "h100_pair"


def test_a_second_sweep_into_a_busy_sweep_directory_is_refused(tmp_path):
    sweep = tmp_path / "sweep"
    first, go = start_held(tmp_path, "-m", "hydra/launcher=basic", "simulation.seed=1,2", "output.plots=false",
                           f"hydra.sweep.dir={sweep}")
    second = hops_run("-m", "hydra/launcher=basic", "simulation.seed=3", "output.plots=false",
                      f"hydra.sweep.dir={sweep}")
    assert second.returncode == 2 and second.stderr.strip().splitlines() == [
        f"error: hydra.sweep.dir={sweep} is in use by another hops run (pid {first.pid}); wait for it to finish "
        f"or pass another hydra.sweep.dir"], second.stderr[-2000:]
    go.write_text("go")
    assert first.wait(timeout=300) == 0, first.communicate()[1][-2000:]
    assert sorted(p.name for p in sweep.iterdir() if p.is_dir()) == ["0", "1"]


def test_every_file_a_run_writes_is_one_the_next_run_clears(tmp_path):
    """RUN_OUTPUTS is the list clear_previous() works from: a run with every output on writes nothing else."""
    out = tmp_path / "run"
    proc = hops_run("+scenario=h100_pair", "failure.enabled=true", "failure.horizon_hours=10",
                    "output.chrome_trace_gz=true", f"hydra.run.dir={out}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    written = {p.name for p in out.iterdir()} - {".hydra", "run.log", LOCK, OWNER}
    assert "progress.png" in written and "trace.json.gz" in written
    assert written <= set(RUN_OUTPUTS), written - set(RUN_OUTPUTS)


def test_each_writer_gets_its_own_temporary_name():
    """Two processes writing one file each rename their own complete bytes, never the other's tail."""
    path = Path("/x/dashboard.png")
    a, b = outputs.tmp_path(path), outputs.tmp_path(path)
    assert a != b and a.parent == b.parent == path.parent
    assert a.name.startswith(".dashboard.") and a.suffix == ".png" and f".{os.getpid()}-" in a.name
