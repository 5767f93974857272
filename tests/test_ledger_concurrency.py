"""Four processes logging to one fresh sqlite ledger at once lose no run (autoresearch.ledger).

Separate from test_autoresearch.py because it needs no fixtures. The processes
are spawned (not forked: MLflow and SQLAlchemy hold threads and connections
that must not be copied), start on one barrier, and race both the first-time
schema creation and the writes.
"""
import multiprocessing as mp

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
