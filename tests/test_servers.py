"""Team scale on real engines: PostgreSQL, an MLflow tracking server, Optuna on PostgreSQL, a Ray cluster.

Every service here is the real program, started on 127.0.0.1 by a fixture of this module
from what the README's test command installs (the `servers` extra: psycopg and PostgreSQL
itself, as the `pgserver` wheel's binaries; the `ray` extra) and stopped by the same fixture. Ray's servers bind every interface,
so the Ray head runs in a network namespace of its own that holds only a loopback
interface: it can listen on 127.0.0.1 and nowhere else. Locally a missing server
program is a skip; in CI (CI=true) it is a failure, because a green run that skipped
these would certify nothing.
"""
from __future__ import annotations

import csv
import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

import arscratch
from terminal import on_terminal

pytestmark = pytest.mark.servers

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
TRAIN = ("exp2_13_a10g_pair_pp2_run135", "exp2_14_l4_pair_pp2_run137")
DIAGNOSTIC = "exp3_47_diag_pp3_gpipe_a10g_h100_l4_run371"
ARCHIVE = "exp2_9_g_only_pp4_run65"  # an older run of a config the tiny root does not hold: no noise pair
PROVENANCE = {"git_commit", "git_diff_hash", "model_fingerprint", "split", "variants", "overrides"}
# Every autoresearch command, each exercised against the tracking server below (a new
# command fails test_every_autoresearch_command_is_exercised_here until it is added).
COVERED = {"validate", "observe", "propose", "gate", "admit", "revert", "park", "repair", "search", "checkpoint",
           "log", "noise", "precommit", "crossval", "rebaseline"}


# --------------------------------------------------------------------------- helpers
def need(found, what: str):
    """`found`, or a skip (locally) / failure (CI) naming what is missing."""
    if not found:
        msg = f"{what} is not installed (README's test command installs it)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(msg)
        pytest.skip(msg)
    return found


def need_module(name: str, what: str):
    import importlib

    try:
        return importlib.import_module(name)
    except ImportError:
        return need(None, what)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(ready, what: str, proc: subprocess.Popen, log: Path, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"{what} exited with code {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            if ready():
                return
        except Exception:  # noqa: BLE001 - not up yet
            pass
        time.sleep(0.3)
    pytest.fail(f"{what} not ready after {timeout:.0f} s:\n{log.read_text()[-3000:]}")


def stop(proc: subprocess.Popen, sig=signal.SIGTERM, group: bool = False, timeout: float = 30) -> None:
    """Stop a process this module started (and its process group if it leads one)."""
    if proc.poll() is not None:
        return
    (os.killpg if group else os.kill)(proc.pid, sig)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        (os.killpg if group else os.kill)(proc.pid, signal.SIGKILL)
        proc.wait(10)


def env_with(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("HYDRA_FULL_ERROR", "RAY_ADDRESS")}
    env.update(MPLBACKEND="Agg", **extra)
    return env


def python(*args: str, env: dict, timeout: float = 300, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)


def read_csv(path: Path) -> list[dict]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


# --------------------------------------------------------------------------- PostgreSQL
def pg_bindir() -> Path | None:
    """initdb / postgres: the `pgserver` wheel's (the `servers` extra installs it), else the system's."""
    import importlib.util

    spec = importlib.util.find_spec("pgserver")  # finds the package without running its __init__
    for location in (spec.submodule_search_locations or []) if spec else []:
        bindir = Path(location) / "pginstall" / "bin"
        if (bindir / "initdb").is_file():
            return bindir
    found = shutil.which("initdb")
    if found:
        return Path(found).resolve().parent
    versions = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))  # Debian keeps them off PATH
    return versions[-1].parent if versions else None


def server_user() -> dict:
    """Popen arguments to run PostgreSQL as a user it accepts: it refuses to run as root."""
    if os.geteuid() != 0:
        return {}
    for name in ("postgres", "nobody"):  # the distribution's server user, else the unprivileged one every system has
        try:
            pw = pwd.getpwnam(name)
        except KeyError:
            continue
        return {"user": pw.pw_uid, "group": pw.pw_gid, "extra_groups": []}
    pytest.fail("running as root, and neither a `postgres` nor a `nobody` user exists to run PostgreSQL as")


def reachable_bindir(bindir: Path, base: Path) -> Path:
    """The wheel's binaries where the server user can run them.

    As root, the wheel sits under a home directory the server user may not enter (/root is
    0700), so the package and its bundled libraries (pgserver.libs, reached through the
    binaries' relative RPATH) are copied next to the data directory; elsewhere it runs in place.
    """
    if os.geteuid() != 0 or not (bindir.parent.parent.name == "pgserver"):
        return bindir
    site = bindir.parent.parent.parent
    for name in ("pgserver", "pgserver.libs"):
        if (site / name).is_dir():
            shutil.copytree(site / name, base / name, symlinks=True)
    return base / "pgserver" / "pginstall" / "bin"


@pytest.fixture(scope="module")
def postgres():
    """A throw-away PostgreSQL cluster on 127.0.0.1 (trust auth, user hops) with databases mlflow and optuna."""
    found = need(pg_bindir(), "PostgreSQL (the `pgserver` wheel: pip install -e '.[servers]')")
    psycopg = need_module("psycopg", "psycopg (pip install -e '.[servers]')")
    base = Path(tempfile.mkdtemp(prefix="hops-pg-"))  # not under pytest's 0700 tmp: the server user must reach it
    os.chmod(base, 0o755)
    data = base / "data"
    data.mkdir()
    as_user = server_user()
    if as_user:
        os.chown(data, as_user["user"], as_user["group"])
    log = base / "server.log"
    try:
        bindir = reachable_bindir(found, base)
        subprocess.run([str(bindir / "initdb"), "-D", str(data / "db"), "-U", "hops", "--auth=trust", "-E", "UTF8",
                        "--no-sync", "--no-instructions"], check=True, capture_output=True, timeout=120, **as_user)
        port = free_port()
        with open(log, "w") as out:
            proc = subprocess.Popen([str(bindir / "postgres"), "-D", str(data / "db"), "-h", "127.0.0.1",
                                     "-p", str(port), "-k", str(data), "-c", "fsync=off",
                                     "-c", "synchronous_commit=off", "-c", "full_page_writes=off"],
                                    stdout=out, stderr=subprocess.STDOUT, **as_user)
        dsn = f"host=127.0.0.1 port={port} user=hops dbname=postgres"
        try:
            wait_for(lambda: psycopg.connect(dsn, connect_timeout=2).close() or True, "postgres", proc, log)
            with psycopg.connect(dsn, autocommit=True) as conn:
                for db in ("mlflow", "optuna"):
                    conn.execute(f"CREATE DATABASE {db}")
            yield {"url": f"postgresql+psycopg://hops@127.0.0.1:{port}", "dsn": dsn, "port": port}
        finally:
            stop(proc, signal.SIGINT)  # SIGINT = PostgreSQL's "fast" shutdown
    finally:
        shutil.rmtree(base, ignore_errors=True)


# --------------------------------------------------------------------------- MLflow tracking server
@pytest.fixture(scope="module")
def mlflow_server(postgres, tmp_path_factory):
    """`mlflow server` with its backend store in PostgreSQL and a server-side artifact root."""
    exe = need(shutil.which("mlflow", path=str(BIN)) or shutil.which("mlflow"), "mlflow (the server CLI)")
    base = tmp_path_factory.mktemp("mlflow-server")
    artifacts, log, port = base / "artifacts", base / "server.log", free_port()
    artifacts.mkdir()
    with open(log, "w") as out:
        proc = subprocess.Popen([exe, "server", "--backend-store-uri", f"{postgres['url']}/mlflow",
                                 "--artifacts-destination", artifacts.as_uri(), "--serve-artifacts",
                                 "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    uri = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: urllib.request.urlopen(f"{uri}/health", timeout=2).status == 200, "mlflow server", proc,
                 log, timeout=180)
        yield {"uri": uri, "artifacts": artifacts, "postgres": postgres}
    finally:
        stop(proc, group=True, timeout=5)  # the server and its uvicorn worker: the process group it leads


def client(server):
    from mlflow import MlflowClient

    return MlflowClient(server["uri"])


def db_count(server, sql: str) -> int:
    import psycopg

    dsn = server["postgres"]["dsn"].replace("dbname=postgres", "dbname=mlflow")
    with psycopg.connect(dsn) as conn:
        return conn.execute(sql).fetchone()[0]


# --------------------------------------------------------------------------- calibration round
def tiny_root(fixtures_root: Path, base: Path) -> Path:
    """Two train fixtures, one diagnostic fixture, and the two train ones again as a `test` split."""
    root = base / "fixtures"
    for split, src, fid in [*[("train", "train", f) for f in TRAIN], ("diagnostic", "diagnostic", DIAGNOSTIC),
                            *[("test", "train", f) for f in TRAIN]]:
        dst = root / split / "cluster_results" / fid
        dst.parent.mkdir(parents=True, exist_ok=True)
        dst.symlink_to(fixtures_root / src / "cluster_results" / fid)
    return root


@pytest.fixture
def calibration_env(mlflow_server, fixtures_root, tmp_path, monkeypatch):
    """The environment of a team member: only MLFLOW_TRACKING_URI says where the ledger is."""
    root = tiny_root(fixtures_root, tmp_path)
    env = env_with(MLFLOW_TRACKING_URI=mlflow_server["uri"], HOPS_AUTORESEARCH_STATE=str(tmp_path / "state"),
                   HOPS_FIXTURES=str(root))
    for key in ("MLFLOW_TRACKING_URI", "HOPS_AUTORESEARCH_STATE", "HOPS_FIXTURES", "MPLBACKEND"):
        monkeypatch.setenv(key, env[key])  # for the commands run in this process
    return env, root


def autoresearch(env: dict, *args: str) -> str:
    """`python -m autoresearch ARGS` in a fresh process: the command line exactly as a user types it."""
    proc = python("-m", "autoresearch", *args, env=env)
    assert proc.returncode == 0, f"autoresearch {' '.join(args)}:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def autoresearch_here(capsys, *args: str) -> str:
    """The same command through its entry point in this process (saves the ~3 s import of a fresh one)."""
    from autoresearch.__main__ import main

    code = main(list(args))
    out = capsys.readouterr()
    assert code == 0, f"autoresearch {' '.join(args)}:\n{out.out}\n{out.err}"
    return out.out


def test_every_autoresearch_command_is_exercised_here():
    from autoresearch.__main__ import build_parser

    commands = set(next(a for a in build_parser()._actions if a.dest == "command").choices)
    assert commands <= COVERED, f"not exercised against the tracking server: {commands - COVERED}"


class ServerCli(arscratch.Cli):
    """`python -m autoresearch` in a scratch copy of the repo whose only ledger is the tracking server."""

    def __init__(self, repo: Path, uri: str, fixtures: Path):
        super().__init__(repo, Path("unused.db"), fixtures)
        self.uri = uri

    def env(self, **extra: str) -> dict:
        return {**super().env(**extra), "MLFLOW_TRACKING_URI": self.uri}

    def ok(self, *argv: str) -> str:
        code, out, err = self(*argv)
        assert code == 0, f"autoresearch {' '.join(argv)}:\n{out}\n{err}"
        return out


def test_calibration_round_on_the_tracking_server(mlflow_server, calibration_env, fixtures_root, tmp_path, capsys):
    """park, revert and admit edit the git tree, so the round runs in a scratch copy one correction behind."""
    env, root = calibration_env
    repo = arscratch.copy_repo(tmp_path / "repo")
    model = repo / "hops" / "presets" / "model.yaml"
    model.write_text(model.read_text().replace("tied_embeddings: true", "tied_embeddings: false", 1))
    arscratch.commit(repo, "a model one correction behind")
    cli = ServerCli(repo, mlflow_server["uri"], root)

    def tie() -> None:
        model.write_text(model.read_text().replace("tied_embeddings: false", "tied_embeddings: true", 1))

    cli.ok("admit", "--bootstrap")
    arscratch.commit(repo, "golden file")
    cli.ok("propose", "--hypothesis", "Megatron ties the embeddings", "--change-site", "hops/presets/model.yaml",
           "--expect", "MAPE down", "--title", "tie embeddings")
    tie()
    code, out, err = cli("gate")  # the aggregates improve (park needs that; per-fixture checks may fail)
    assert code in (0, 1) and "golden ->" in out, out + err
    parked_out = cli.ok("park")
    assert "parked iteration" in parked_out
    parked_n = parked_out.split("parked iteration ", 1)[1].split(":", 1)[0]
    arscratch.commit(repo, "parked")
    cli.ok("propose", "--hypothesis", "the untouched tree holds", "--change-site", "hops/model/compute.py",
           "--expect", "aggregates hold")
    assert "PASS" in cli.ok("gate")
    code, out, err = cli("admit")  # no change yet: nothing to land
    assert code == 2 and "changes nothing" in err, out + err
    compute = repo / "hops" / "model" / "compute.py"
    compute.write_text(compute.read_text() + "\n# the aggregates hold\n")  # a change that moves no number
    assert "admitted iteration" in cli.ok("admit")
    arscratch.commit(repo, "landed")
    cli.ok("propose", "--hypothesis", "nothing changed", "--change-site", "hops/model/compute.py", "--expect", "no gain")
    cli.ok("revert", "--reason", "no change to measure")
    cli.ok("repair")
    cli.ok("log")
    assert "running the gate" in cli.ok("precommit", "hops/model/compute.py")  # a staged model file: the gate runs
    assert "mean |spread|" in cli.ok("noise", "--fixtures", str(fixtures_root))
    # A re-baseline judged against the server and refused (an explanation that names no violation):
    # its evidence is logged there all the same, and the tree goes back to HEAD.
    (root / "archive" / "cluster_results").mkdir(parents=True)
    (root / "archive" / "cluster_results" / ARCHIVE).symlink_to(fixtures_root / "archive" / "cluster_results" / ARCHIVE)
    code, out, err = cli("rebaseline", "--on", parked_n, "--confirm-human", "servers test",
                         "--explain", f"{TRAIN[0]}=names no violation")
    assert code == 1 and f"--explain {TRAIN[0]}: not a fixture with a remaining violation" in out, out + err
    assert "tied_embeddings: false" in model.read_text()
    # Commands that leave the tree alone, from this process (HOPS_AUTORESEARCH_STATE is a tmp dir).
    assert "link_calibrated" in autoresearch_here(capsys, "validate", "--split", "train")
    assert "worst fixtures" in autoresearch_here(capsys, "observe", "--top", "2")
    autoresearch_here(capsys, "checkpoint", "--split", "test", "--confirm-human", "servers test",
                      "--fixtures", str(root))
    assert "left out" in autoresearch_here(capsys, "crossval", "--by", "device")
    # `search` against this server: test_four_search_workers_share_one_postgres_study.

    c = client(mlflow_server)
    exp = c.get_experiment_by_name("calibration")
    assert exp is not None and exp.artifact_location.startswith("mlflow-artifacts:"), exp  # server-side root
    runs = c.search_runs([exp.experiment_id], max_results=1000)
    by_type: dict[str, list] = {}
    for r in runs:
        by_type.setdefault(r.data.tags.get("run_type"), []).append(r)
    assert {"iteration", "gate", "admit", "observe", "noise", "validate", "rebaseline", "crossval"} <= set(by_type), \
        set(by_type)
    outcome = {r.data.tags.get("hypothesis"): r for r in by_type["iteration"]}
    parked, landed = outcome["Megatron ties the embeddings"], outcome["the untouched tree holds"]
    assert parked.data.tags["outcome"] == "parked" and parked.info.status == "KILLED"
    assert "gate_report.txt" in {a.path for a in c.list_artifacts(parked.info.run_id)}
    assert landed.data.tags["outcome"] == "landed" and outcome["nothing changed"].data.tags["outcome"] == "reverted"
    gate = c.get_run(landed.data.tags["last_gate_run"])
    assert PROVENANCE <= set(gate.data.params)
    assert gate.data.tags["iteration"] == landed.data.tags["iteration"] and gate.data.tags["outcome"] == "landed"
    for key in ("spec.mape", "link_calibrated.bubble_mae_pp", "link_calibrated.rho_mean", "gate.violations"):
        assert key in gate.data.metrics, key
    gated = c.get_run(parked.data.tags["last_gate_run"])  # the parked change's gate: MAPE down
    assert gated.data.metrics["link_calibrated.mape"] < parked.data.metrics["before.link_calibrated.mape"]
    assert {"fixtures.csv", "report.md", "scatter.png"} <= {a.path for a in c.list_artifacts(gate.info.run_id)}
    # The artifacts went through the server to its own artifact root, and come back through it.
    import mlflow.artifacts

    report = Path(mlflow.artifacts.download_artifacts(run_id=gate.info.run_id, artifact_path="report.md",
                                                      dst_path=str(tmp_path / "dl"),
                                                      tracking_uri=mlflow_server["uri"])).read_text()
    assert "link_calibrated" in report
    on_server = list(mlflow_server["artifacts"].glob(f"**/{gate.info.run_id}/artifacts/report.md"))
    assert len(on_server) == 1 and on_server[0].read_text() == report
    # ... and the runs are rows in PostgreSQL, the server's backend store.
    assert db_count(mlflow_server, "SELECT count(*) FROM runs") >= len(runs)
    assert db_count(mlflow_server, f"SELECT count(*) FROM params WHERE run_uuid = '{gate.info.run_id}'") \
        == len(gate.data.params)
    checkpoint, = c.search_runs([c.get_experiment_by_name("checkpoints").experiment_id])
    assert checkpoint.data.tags["run_type"] == "checkpoint" and checkpoint.data.metrics
    assert not any(fid in key for key in checkpoint.data.metrics for fid in TRAIN)  # suite aggregates only
    log = (repo / "autoresearch" / "LOG.md").read_text()  # `log` renders what the server holds
    assert "parked — tie embeddings" in log and "the untouched tree holds" in log and "nothing changed" in log


# --------------------------------------------------------------------------- shared Optuna search
def test_four_search_workers_share_one_postgres_study(mlflow_server, calibration_env):
    import optuna

    env, _ = calibration_env
    autoresearch(env, "admit", "--bootstrap")
    storage, k, workers = f"{mlflow_server['postgres']['url']}/optuna", 2, 4
    autoresearch(env, "search", "--space", "compute", "--only", "stacks.fixture_megatron.k_floor_ms.default", "--trials", str(k),
                 "--workers", str(workers), "--storage", storage, "--study", "shared", "--seed", "7")
    study = optuna.load_study(study_name="shared", storage=storage)
    trials = study.get_trials(deepcopy=False)
    assert len(trials) == workers * k and all(t.state.name == "COMPLETE" for t in trials)
    assert sorted(t.number for t in trials) == list(range(workers * k))  # no duplicate, no lost number
    run_ids = [t.user_attrs["mlflow_run_id"] for t in trials]
    assert len(set(run_ids)) == len(trials)

    c = client(mlflow_server)
    parent = study.user_attrs["mlflow_run_id"]
    nested = c.search_runs([c.get_experiment_by_name("calibration").experiment_id],
                           filter_string=f"tags.`mlflow.parentRunId` = '{parent}'", max_results=1000)
    assert sorted(r.info.run_id for r in nested) == sorted(run_ids)
    by_id = {r.info.run_id: r for r in nested}
    for t in trials:
        run = by_id[t.user_attrs["mlflow_run_id"]]
        assert run.info.status == "FINISHED" and run.data.params["trial"] == str(t.number)
        assert run.data.metrics["objective"] == pytest.approx(t.value)
    assert c.get_run(parent).data.metrics["trials"] == workers * k


# --------------------------------------------------------------------------- hops.run results in MLflow
def test_sweep_jobs_become_nested_mlflow_runs_with_config_metrics_and_artifacts(mlflow_server, tmp_path):
    sweep = tmp_path / "sweep"
    proc = python("-m", "hops.run", "-m", "output.mlflow=true", "pipeline.schedule=gpipe,1f1b",
                  f"hydra.sweep.dir={sweep}", env=env_with(MLFLOW_TRACKING_URI=mlflow_server["uri"]))
    assert proc.returncode == 0, proc.stderr
    table = read_csv(sweep / "sweep_results.csv")
    c = client(mlflow_server)
    exp = c.get_experiment_by_name("runs")
    parent = c.search_runs([exp.experiment_id], filter_string=f"tags.sweep_dir = '{sweep.resolve()}'")
    assert len(parent) == 1 and parent[0].data.tags["run_type"] == "sweep"
    jobs = c.search_runs([exp.experiment_id], filter_string=f"tags.`mlflow.parentRunId` = '{parent[0].info.run_id}'")
    assert sorted(r.data.tags["job"] for r in jobs) == ["0", "1"]
    for run in jobs:
        row = next(r for r in table if r["job"] == run.data.tags["job"])
        p, m = run.data.params, run.data.metrics
        assert p["pipeline.schedule"] == row["pipeline.schedule"] and p["output.mlflow"] == "true"
        assert "simulation.microbatches" in p and json.loads(p["pipeline.stages"])  # lists as JSON
        for col in ("samples_per_s", "bubble_ratio", "makespan_ms", "latency_p99_ms"):
            assert m[col] == pytest.approx(float(row[col]), rel=1e-12), col
        assert {"summary.json", "scenario.yaml", "timeline.png", "dashboard.png"} <= \
            {a.path for a in c.list_artifacts(run.info.run_id)}
        import mlflow.artifacts

        got = mlflow.artifacts.download_artifacts(run_id=run.info.run_id, artifact_path="summary.json",
                                                  dst_path=str(tmp_path / run.info.run_id),
                                                  tracking_uri=mlflow_server["uri"])
        assert Path(got).read_bytes() == (sweep / row["dir"] / "summary.json").read_bytes()
    assert "sweep_results.csv" in {a.path for a in c.list_artifacts(parent[0].info.run_id)}


def test_a_single_run_logs_one_run_and_without_the_option_mlflow_is_not_even_imported(mlflow_server, tmp_path):
    env = env_with(MLFLOW_TRACKING_URI=mlflow_server["uri"])
    code = ("import sys; from hops.run.app import main; main(sys.argv[1:]); "
            "print('MLFLOW-IMPORTED' if 'mlflow' in sys.modules else 'MLFLOW-NOT-IMPORTED')")
    off = python("-c", code, "output.plots=false", f"hydra.run.dir={tmp_path / 'off'}", env=env)
    assert off.returncode == 0 and "MLFLOW-NOT-IMPORTED" in off.stdout, off.stderr
    on = python("-c", code, "output.plots=false", "output.mlflow=true", f"hydra.run.dir={tmp_path / 'on'}", env=env)
    assert on.returncode == 0 and "mlflow: run " in on.stdout, on.stderr
    c = client(mlflow_server)
    exp = c.get_experiment_by_name("runs")
    runs = {r.data.tags.get("job_dir"): r for r in c.search_runs([exp.experiment_id], max_results=1000)}
    assert str((tmp_path / "on").resolve()) in runs and str((tmp_path / "off").resolve()) not in runs
    run = runs[str((tmp_path / "on").resolve())]
    summary = json.loads((tmp_path / "on" / "summary.json").read_text())
    assert run.data.metrics["samples_per_s"] == pytest.approx(summary["throughput"]["samples_per_s"], rel=1e-12)
    assert "mlflow.parentRunId" not in run.data.tags and run.info.status == "FINISHED"


def test_an_unreachable_tracking_server_is_one_error_line_not_a_silent_run(tmp_path):
    env = env_with(MLFLOW_TRACKING_URI=f"http://127.0.0.1:{free_port()}")  # MLflow's own retries: ~4 minutes
    proc = python("-m", "hops.run", "output.plots=false", "output.mlflow=true", f"hydra.run.dir={tmp_path}", env=env,
                  timeout=90)
    assert proc.returncode == 2, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: output.mlflow: MLflow tracking server http://127.0.0.1:") and "does not answer" \
        in last and "Traceback" not in proc.stderr
    assert (tmp_path / "summary.json").is_file()  # the run's outputs are kept


# --------------------------------------------------------------------------- Ray cluster
@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory):
    """`ray start --head` in a network namespace whose only interface is loopback (Ray binds every interface).

    The namespace also has its own process ids: killing `unshare` (--kill-child) ends every
    Ray process, workers included, so nothing outlives the test.
    """
    ray = need(shutil.which("ray", path=str(BIN)), "ray (pip install -e '.[ray]')")
    need_module("hydra_plugins.hydra_ray_launcher", "hydra-ray-launcher (pip install -e '.[ray]')")
    unshare, nsenter = shutil.which("unshare"), shutil.which("nsenter")
    ip = shutil.which("ip") or shutil.which("ip", path="/usr/sbin:/sbin")
    need(unshare and nsenter and ip and os.geteuid() == 0,
         "root with unshare/nsenter (util-linux) and ip (iproute2), for a private network namespace")
    temp = Path(tempfile.mkdtemp(prefix="hops-ray-"))  # short: Ray's unix socket paths must fit 107 bytes
    log, port = temp / "head.log", 6379  # the namespace is private: the default port is free there
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [unshare, "--net", "--pid", "--fork", "--kill-child", "--mount-proc", "--", "sh", "-c",
             f"{ip} link set lo up && exec {ray} start --head --block --port={port} --num-cpus=2 "
             f"--object-store-memory=100000000 --include-dashboard=false --disable-usage-stats --temp-dir={temp}"],
            stdout=out, stderr=subprocess.STDOUT, env=env_with())
    try:
        def head_pid() -> int:
            return int(Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()[0])

        def enter(*cmd: str) -> list[str]:
            return [nsenter, f"--target={head_pid()}", "--net", "--", *cmd]

        probe = f"import socket; socket.create_connection(('127.0.0.1', {port}), 1)"
        wait_for(lambda: subprocess.run(enter(sys.executable, "-c", probe), capture_output=True).returncode == 0
                 and "Ray runtime started" in log.read_text(errors="replace"), "ray head", proc, log)
        yield {"address": f"127.0.0.1:{port}", "enter": enter, "temp": temp}
    finally:
        stop(proc, signal.SIGKILL)  # --kill-child: the namespace's init, and with it every Ray process, dies
        shutil.rmtree(temp, ignore_errors=True)


SWEEP = ("+scenario=hetero_pp4", "pipeline.schedule=gpipe,1f1b", "simulation.seed=1,2", "output.plots=false")


def test_ray_sweep_rows_equal_the_joblib_sweep_byte_for_byte(ray_cluster, tmp_path):
    from hops.run.sweep import METRICS

    on_ray, on_joblib = tmp_path / "ray", tmp_path / "joblib"
    # On a terminal, as a user runs it: Ray pickles the sweep's callbacks, whose progress line
    # (drawn only on a terminal) once made every multirun fail there.
    code, out = on_terminal(ray_cluster["enter"](sys.executable, "-m", "hops.run", "-m", "hydra/launcher=hops_ray",
                                                 *SWEEP, f"hydra.sweep.dir={on_ray}"),
                            env=env_with(RAY_ADDRESS=ray_cluster["address"]), timeout=600)
    assert code == 0 and "Traceback" not in out, out[-4000:]
    assert f"Connecting to existing Ray cluster at address: {ray_cluster['address']}" in out
    joblib_proc = python("-m", "hops.run", "-m", *SWEEP, f"hydra.sweep.dir={on_joblib}", env=env_with())
    assert joblib_proc.returncode == 0, joblib_proc.stderr[-4000:]

    ray_rows, joblib_rows = read_csv(on_ray / "sweep_results.csv"), read_csv(on_joblib / "sweep_results.csv")
    assert len(ray_rows) == 4 and all(r["status"] == "ok" for r in ray_rows)
    for a, b in zip(ray_rows, joblib_rows, strict=True):
        assert {m: a[m] for m in METRICS} == {m: b[m] for m in METRICS}  # the CSV text, not a float tolerance
    assert (on_ray / "sweep_results.csv").read_bytes() == (on_joblib / "sweep_results.csv").read_bytes()
    # The jobs ran in the cluster's worker processes: their job lines are in its worker logs.
    logs = "".join(p.read_text(errors="replace") for p in ray_cluster["temp"].glob("session_*/logs/worker-*.out"))
    for job in range(4):
        assert f"[job {job}] " in logs and f"-> {on_ray / str(job)}" in logs


# --------------------------------------------------------------------------- Slurm without Slurm
def test_slurm_launcher_without_slurm_is_one_line_naming_what_is_missing(tmp_path):
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    if shutil.which("sbatch") and shutil.which("srun"):
        pytest.skip("this machine has Slurm: the missing-executable message cannot be produced here")
    proc = python("-m", "hops.run", "-m", "hydra/launcher=hops_slurm", "simulation.seed=1,2", "output.plots=false",
                  f"hydra.sweep.dir={tmp_path}", env=env_with())
    assert proc.returncode == 2
    lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    missing = [t for t in ("sbatch", "srun") if not shutil.which(t)]
    assert lines[0].startswith("error: hydra/launcher=hops_slurm needs Slurm's " + " and ".join(missing) + " on PATH")
