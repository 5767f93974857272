"""Concurrent writers: four processes logging to one fresh sqlite ledger lose no run, four concurrent
`propose` calls open exactly one iteration, and `repair` mends the state the old race left.

Separate from test_autoresearch.py because it needs no fixtures. The processes
are spawned (not forked: MLflow and SQLAlchemy hold threads and connections
that must not be copied), start on one barrier, and race both the first-time
schema creation and the writes.
"""
import json
import multiprocessing as mp
import os
import shutil
import subprocess
import sys
from pathlib import Path

from autoresearch import ledger

WORKERS, RUNS = 4, 5


def _worker(uri: str, worker: int, barrier) -> None:
    book = ledger.Ledger(uri)
    book.experiment_id(ledger.CALIBRATION)
    barrier.wait(timeout=120)
    for k in range(RUNS):
        run = book.start_run(ledger.CALIBRATION, f"w{worker}-{k}", run_type="concurrency",
                             params={"worker": worker, "k": k}, tags={"iteration": f"{worker}.{k}"})
        book.log(run, metrics={"spec.mape": 10.0 * worker + k, "link_calibrated.mape": float(k)})
        book.finish(run)


def test_four_processes_logging_at_once_lose_no_run(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}"
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(WORKERS)
    procs = [ctx.Process(target=_worker, args=(uri, w, barrier)) for w in range(WORKERS)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=240)
    assert [p.exitcode for p in procs] == [0] * WORKERS

    runs = ledger.Ledger(uri).runs(ledger.CALIBRATION, "tags.run_type = 'concurrency'")
    seen = {(int(r.data.params["worker"]), int(r.data.params["k"])) for r in runs}
    assert len(runs) == WORKERS * RUNS and seen == {(w, k) for w in range(WORKERS) for k in range(RUNS)}
    for r in runs:
        w, k = int(r.data.params["worker"]), int(r.data.params["k"])
        assert r.data.metrics == {"spec.mape": 10.0 * w + k, "link_calibrated.mape": float(k)}
        assert r.info.status == "FINISHED" and r.data.tags["iteration"] == f"{w}.{k}"
    assert (tmp_path / "mlruns").is_dir() and not (tmp_path / "mlartifacts").exists()


# --------------------------------------------------------------------------- iteration numbering under races
REPO = Path(__file__).resolve().parents[1]


def _env(tmp_path: Path) -> dict:
    state = tmp_path / "state"
    (state / "golden").mkdir(parents=True, exist_ok=True)
    shutil.copy(REPO / "autoresearch" / "golden" / "train.json", state / "golden" / "train.json")
    env = {k: v for k, v in os.environ.items() if k != "HOPS_AUTORESEARCH_KILL_AT"}
    return env | {"HOPS_AUTORESEARCH_STATE": str(state), "MPLBACKEND": "Agg",
                  "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}"}


def _cli(env, *argv) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "autoresearch", *argv], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=600)


PROPOSE = ("propose", "--hypothesis", "h", "--change-site", "hops/model/compute.py", "--expect", "e")


def test_four_concurrent_proposes_open_exactly_one_iteration(tmp_path):
    env = _env(tmp_path)
    procs = [subprocess.Popen([sys.executable, "-m", "autoresearch", *PROPOSE, "--title", f"p{k}"], cwd=REPO,
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for k in range(4)]
    results = [(p.wait(timeout=600), p.stdout.read(), p.stderr.read()) for p in procs]
    codes = sorted(code for code, _, _ in results)
    assert codes == [0, 2, 2, 2], results
    assert all("is open" in err for code, _, err in results if code == 2)
    book = ledger.Ledger(env["MLFLOW_TRACKING_URI"])
    runs = book.iteration_runs()
    assert len(runs) == 1 and len(book.open_runs()) == 1, "the losers created no run at all"
    assert _cli(env, "revert", "--reason", "race test").returncode == 0
    assert book.open_iteration() is None
    assert _cli(env, *PROPOSE).returncode == 0  # the numbering continues after the closed one
    assert sorted(int(r.data.tags["iteration"]) for r in book.iteration_runs()) == [
        int(runs[0].data.tags["iteration"]), int(runs[0].data.tags["iteration"]) + 1]


def test_repair_brings_a_raced_ledger_back_to_one_story(tmp_path):
    """The state the old race left: three runs numbered 9 open at once, a duplicated jsonl line, and a run the
    jsonl closed while MLflow still shows it open. Every command names `repair`; after it, all work again."""
    env = _env(tmp_path)
    book = ledger.Ledger(env["MLFLOW_TRACKING_URI"])
    ids = [book.start_run(ledger.CALIBRATION, f"iteration 9 ({k})", run_type="iteration",
                          tags={"iteration": 9, "outcome": "open", "hypothesis": f"h{k}", "opened": f"t{k}"})
           for k in range(3)]
    closed = book.start_run(ledger.CALIBRATION, "iteration 8", run_type="iteration",
                            tags={"iteration": 8, "outcome": "open", "hypothesis": "landed elsewhere"})
    line = json.dumps({"iteration": 8, "run_id": closed, "outcome": "landed", "hypothesis": "landed elsewhere",
                       "before": {}, "after": None})
    (Path(env["HOPS_AUTORESEARCH_STATE"]) / "iterations.jsonl").write_text(line + "\n" + line + "\n")
    for argv in (PROPOSE, ("revert", "--reason", "x")):
        p = _cli(env, *argv)
        assert p.returncode == 2 and "repair --keep" in p.stderr, p.stderr
    p = _cli(env, "repair", "--keep", "7")
    assert p.returncode == 2 and "open iterations are 9, 9, 9" in p.stderr
    p = _cli(env, "repair")
    assert p.returncode == 0, p.stderr
    assert "removed 1 duplicate line" in p.stdout and "iteration 8: ledger closed as landed" in p.stdout
    assert [r.info.run_id for r in book.open_runs()] == [ids[0]], "the first opened stays open, the rest are void"
    assert {book.get_run(i).data.tags["outcome"] for i in ids[1:]} == {"void"}
    assert book.get_run(closed).data.tags["outcome"] == "landed"
    assert len((Path(env["HOPS_AUTORESEARCH_STATE"]) / "iterations.jsonl").read_text().splitlines()) == 1
    assert _cli(env, "revert", "--reason", "now it closes").returncode == 0
    assert _cli(env, *PROPOSE).returncode == 0
    log = (Path(env["HOPS_AUTORESEARCH_STATE"]) / "LOG.md").read_text()
    assert log.count("## Iteration 9:") == 1, "void runs are not iterations and stay out of the log"
