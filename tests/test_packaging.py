"""HOPS from a wheel: `pip install .` (not the editable install) gives working commands.

The wheel is built from this checkout and installed into a fresh virtualenv. To keep this
to seconds, the virtualenv gets the wheel's dependencies from the environment running the
tests (a .pth line pointing at its site-packages; that directory's own .pth files, such as
the editable install's finder, are not processed), while hops itself, its config tree and
its shipped YAML come only from the wheel. The commands then run from a directory outside
any checkout.
"""
from __future__ import annotations

import os
import shutil
import site
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from autoresearch import state

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def wheel_env(tmp_path_factory):
    base = tmp_path_factory.mktemp("wheel")
    # setuptools builds in the source tree (build/, *.egg-info): build from a copy, not the checkout
    src = base / "src"
    anywhere = shutil.ignore_patterns(".git", "build", "*.egg-info", "__pycache__", ".*cache")
    top_level = {"mlruns", "outputs", "multirun", "fixtures"}  # run state at the root; hops/outputs is code

    def ignore(directory, names):
        return set(anywhere(directory, names)) | (top_level & set(names) if Path(directory) == REPO else set())

    shutil.copytree(REPO, src, ignore=ignore)
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", str(src), "--no-deps", "-q", "-w",
                            str(base / "dist")], capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr
    (wheel,) = (base / "dist").glob("hops-*.whl")
    venv = base / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    purelib = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    deps = [sysconfig.get_paths()["purelib"], *site.getsitepackages()]
    (Path(purelib) / "hops-test-deps.pth").write_text("\n".join(dict.fromkeys(deps)) + "\n")
    env = {k: v for k, v in os.environ.items()
           if k not in ("HYDRA_FULL_ERROR", "HOPS_AUTORESEARCH_STATE", "PYTHONPATH")}
    env["MPLBACKEND"] = "Agg"
    # from outside the checkout and without its PYTHONPATH: where the checkout is on the path, pip
    # takes its hops.egg-info (an editable install leaves one there) for hops already installed,
    # exits 0 and installs nothing
    inst = subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps", "-q",
                           str(wheel)], capture_output=True, text=True, timeout=300, cwd=base, env=env)
    assert inst.returncode == 0, inst.stderr
    assert (Path(purelib) / "hops" / "__init__.py").is_file(), "pip installed no hops from the wheel"
    work = base / "elsewhere"  # not inside any checkout
    work.mkdir()

    def run(*args: str, cwd: Path = work, **extra: str) -> subprocess.CompletedProcess:
        return subprocess.run([*args], cwd=cwd, env={**env, **extra}, capture_output=True, text=True,
                              timeout=300)

    return {"venv": venv, "py": str(py), "hops": str(venv / "bin" / "hops"), "run": run, "work": work,
            "purelib": Path(purelib), "env": env}


def test_the_wheel_is_what_runs(wheel_env):
    where = wheel_env["run"](wheel_env["py"], "-c", "import hops, autoresearch; print(hops.__file__); "
                                                    "print(autoresearch.__file__)")
    assert where.returncode == 0, where.stderr
    for line in where.stdout.split():
        assert Path(line).is_relative_to(wheel_env["purelib"]), line
    assert (wheel_env["purelib"] / "hops" / "conf" / "scenario" / "h100_pair.yaml").is_file()


def test_hops_runs_a_named_scenario_from_the_wheel(wheel_env):
    out = wheel_env["work"] / "run"
    proc = wheel_env["run"](wheel_env["hops"], "+scenario=h100_pair", "output.plots=false", f"hydra.run.dir={out}")
    assert proc.returncode == 0, proc.stderr
    assert "HOPS h100_pair: 2 stages" in proc.stdout
    import json

    summary = json.loads((out / "summary.json").read_text())
    assert summary["throughput"]["samples_per_s"] > 0
    assert summary["provenance"]["scenario"] == "h100_pair"
    assert summary["provenance"]["hops_version"] and summary["provenance"]["git_commit"] is None
    assert "HOPS h100_pair" in (out / "run.log").read_text()


def test_a_multirun_of_the_wheels_hops_on_a_terminal(wheel_env):
    """As a user types it: `hops -m ...` at a shell (the launcher pickles the sweep's callbacks)."""
    import csv

    from terminal import on_terminal

    sweep = wheel_env["work"] / "sweep"
    code, out = on_terminal([wheel_env["hops"], "-m", "simulation.seed=1,2", "output.plots=false",
                             f"hydra.sweep.dir={sweep}"], env=wheel_env["env"], cwd=wheel_env["work"])
    assert code == 0 and "Traceback" not in out, out[-3000:]
    with open(sweep / "sweep_results.csv", newline="") as fh:
        assert [(r["simulation.seed"], r["status"]) for r in csv.DictReader(fh)] == [("1", "ok"), ("2", "ok")]


def test_hydra_shell_completion_works_on_the_console_script(wheel_env):
    install = wheel_env["run"](wheel_env["hops"], "--shell-completion", "install=bash")
    assert install.returncode == 0 and "complete -o nospace -o default -F hydra_bash_completion hops" in install.stdout
    query = wheel_env["run"](wheel_env["hops"], "-sc", "query=bash", COMP_LINE="hops pipeline.sch")
    assert "pipeline.schedule=" in query.stdout.split()
    query = wheel_env["run"](wheel_env["hops"], "-sc", "query=bash", COMP_LINE="hops +scenario=")
    assert "+scenario=h100_pair" in query.stdout.split()


def test_autoresearch_from_the_wheel_finds_its_state_or_says_where_to_look(wheel_env, tmp_path):
    fixtures = tmp_path / "fixtures" / "train" / "cluster_results"
    fixtures.mkdir(parents=True)
    root = str(tmp_path / "fixtures")
    absent = wheel_env["run"](wheel_env["hops"], "autoresearch", "gate", "--fixtures", root)
    assert absent.returncode == 2
    assert "no autoresearch state" in absent.stderr and "--state DIR" in absent.stderr
    assert "malformed" not in absent.stderr and "Traceback" not in absent.stderr
    # --state DIR (before or after the command): the gate's config ships in the wheel, the golden file does not
    mine = tmp_path / "state"
    (mine / "golden").mkdir(parents=True)
    for args in (["--state", str(mine), "gate"], ["gate", f"--state={mine}"]):
        proc = wheel_env["run"](wheel_env["hops"], "autoresearch", *args, "--fixtures", root)
        assert proc.returncode == 2, proc.stderr
        assert f"no golden file at {mine / 'golden' / 'train.json'}" in proc.stderr
    # a checkout found from the working directory (here: a copy of its layout)
    clone = tmp_path / "clone"
    (clone / "autoresearch" / "golden").mkdir(parents=True)
    (clone / "docs").mkdir()
    found = wheel_env["run"](wheel_env["py"], "-c", "from autoresearch.state import state_dir; print(state_dir())",
                             cwd=clone / "docs")
    assert found.stdout.strip() == str(clone / "autoresearch"), found.stderr
    # search reads the allowlist that ships with the package
    search = wheel_env["run"](wheel_env["hops"], "autoresearch", "search", "--space", "nope", "--trials", "1",
                              "--fixtures", root)
    assert search.returncode == 2 and "allowlisted spaces: compute" in search.stderr, search.stderr


def test_a_state_named_from_outside_its_checkout_meets_the_ledger_and_tree_of_that_checkout(wheel_env, tmp_path):
    """`hops autoresearch --state CLONE/autoresearch` run from elsewhere and `python -m autoresearch` run inside
    CLONE are one calibration: one MLflow store (CLONE/mlruns, not ./mlruns of the working directory), one
    iteration open at a time, never the same iteration number twice, and the clone's git tree for the diff."""
    import json

    clone = tmp_path / "clone"  # a checkout: git, hops/, autoresearch/ with its golden file and records
    (clone / "hops").mkdir(parents=True)
    (clone / "autoresearch" / "golden").mkdir(parents=True)
    shutil.copy(REPO / "autoresearch" / "golden" / "train.json", clone / "autoresearch" / "golden" / "train.json")
    (clone / "autoresearch" / "iterations.jsonl").write_text(json.dumps({"iteration": 64, "outcome": "landed"}) + "\n")
    (clone / ".gitignore").write_text("/mlruns/\n.state.lock\n.open-iteration.json\n")
    for args in (["init", "-q"], ["add", "-A"],
                 ["-c", "user.email=t@hops.invalid", "-c", "user.name=t", "commit", "-q", "-m", "clone"]):
        subprocess.run(["git", *args], cwd=clone, check=True, capture_output=True)
    env = {k: v for k, v in wheel_env["env"].items() if k != "MLFLOW_TRACKING_URI"}  # the default store
    site = "stacks.fixture_megatron.k_floor_ms.l4"

    def autoresearch(argv, cwd):
        return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)

    outside = autoresearch([wheel_env["hops"], "autoresearch", "propose", "--state", str(clone / "autoresearch"),
                            "--hypothesis", "outside", "--change-site", site, "--expect", "x"], wheel_env["work"])
    assert outside.returncode == 0, outside.stdout + outside.stderr
    assert "opened iteration 65" in outside.stdout
    assert (clone / "mlruns" / "mlflow.db").is_file() and not (wheel_env["work"] / "mlruns").exists()
    inside = autoresearch([wheel_env["py"], "-m", "autoresearch", "propose", "--hypothesis", "inside",
                           "--change-site", site, "--expect", "x"], clone)
    assert inside.returncode == 2, inside.stdout + inside.stderr
    (line,) = inside.stderr.strip().splitlines()
    assert "iteration 65 is open ('outside')" in line
    closed = autoresearch([wheel_env["hops"], "autoresearch", "revert", "--state", str(clone / "autoresearch"),
                           "--reason", "done"], wheel_env["work"])
    assert closed.returncode == 0, closed.stdout + closed.stderr
    assert "not a git repository" not in closed.stdout and "no diff to save" in closed.stdout
    inside = autoresearch([wheel_env["py"], "-m", "autoresearch", "propose", "--hypothesis", "inside",
                           "--change-site", site, "--expect", "x"], clone)
    assert inside.returncode == 0 and "opened iteration 66" in inside.stdout, inside.stdout + inside.stderr
    records = [json.loads(x) for x in (clone / "autoresearch" / "iterations.jsonl").read_text().splitlines()]
    assert [(r["iteration"], r["outcome"]) for r in records] == [(64, "landed"), (65, "reverted")]


def test_hops_sweep_subcommand(wheel_env, tmp_path):
    proc = wheel_env["run"](wheel_env["hops"], "sweep", str(tmp_path))
    assert proc.returncode == 2 and f"no Hydra jobs under {tmp_path}" in proc.stderr


# --------------------------------------------------------------------------- state resolution, in process
def test_state_dir_precedence(tmp_path, monkeypatch):
    monkeypatch.delenv(state.ENV, raising=False)
    assert state.state_dir() == state.PACKAGE  # this checkout holds its own state
    monkeypatch.setenv(state.ENV, str(tmp_path))
    assert state.state_dir() == tmp_path
    assert state.config_path("gate.yaml") == state.PACKAGE / "gate.yaml"  # not in tmp: the shipped copy
    (tmp_path / "gate.yaml").write_text("split: train\n")
    assert state.config_path("gate.yaml") == tmp_path / "gate.yaml"


def test_state_flag_is_scoped_to_the_command(tmp_path, monkeypatch):
    from autoresearch.__main__ import main

    monkeypatch.delenv(state.ENV, raising=False)
    monkeypatch.setenv("HOPS_FIXTURES", str(tmp_path))
    (tmp_path / "train" / "cluster_results").mkdir(parents=True)
    assert main(["gate", "--state", str(tmp_path / "s")]) == 2
    assert state.ENV not in os.environ


def test_a_state_flag_naming_no_directory_is_a_mistyped_path_not_a_state_to_bootstrap(tmp_path, monkeypatch, capsys):
    from autoresearch.__main__ import main

    monkeypatch.delenv(state.ENV, raising=False)
    missing = tmp_path / "stat"
    assert main(["--state", str(missing), "gate"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert f"--state {missing}: no such directory" in line and "bootstrap" not in line
    assert not missing.exists()
    empty = tmp_path / "state"
    empty.mkdir()
    assert main(["--state", str(empty), "gate"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert f"no golden file at {empty / 'golden' / 'train.json'}" in line and "admit --bootstrap" in line
