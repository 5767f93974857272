"""Specifications for the calibration loop: gate, admit/revert, citations, split guard, checkpoint, search, ledger.

Runs on a tiny fixture root (two real train fixtures and one diagnostic
fixture, symlinked) with the ledger, golden file and committed records in
tmp dirs, so nothing here writes to the repo's mlruns/ or autoresearch/ files.
One sqlite ledger is shared by the module (its first-time migration costs
seconds); tests that open an iteration close it, and a finaliser closes any
left open by a failure so one failure does not cascade.
"""
import json
import re
import shutil
from pathlib import Path

import pytest
import yaml

import autoresearch.validate as validate_mod
from autoresearch import ledger
from autoresearch.__main__ import main
from autoresearch.gate import (GateConfig, checksum, citation_violations, golden_path, read_golden)
from autoresearch.search import SearchError, allowlisted_paths, load_allowlist, select
from hops.model.hardware import PRESET_DIR, Catalog, _normalize_overrides
from hops.traces.guard import REFUSAL, SplitGuardError

REPO = Path(__file__).resolve().parents[1]
TRAIN = ("exp2_13_a10g_pair_pp2_run135", "exp2_14_l4_pair_pp2_run137")
DIAGNOSTIC = "exp3_47_diag_pp3_gpipe_a10g_h100_l4_run371"
PROVENANCE = {"git_commit", "git_diff_hash", "model_fingerprint", "split", "variants", "overrides"}
COEF = "stacks.fixture_megatron.compute_time_coefficient"  # 1 / GEMM efficiency: every stage's GEMM time scales with it
PRESET = Catalog.load().stacks["fixture_megatron"]["compute_time_coefficient"]  # its value in hops/presets/stacks.yaml


# --------------------------------------------------------------------------- environment
def _link(src: Path, root: Path, split: str, fid: str) -> None:
    dst = root / split / "cluster_results" / fid
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.symlink_to(src / fid)


@pytest.fixture(scope="module")
def env(fixtures_root, tmp_path_factory):
    base = tmp_path_factory.mktemp("autoresearch")
    root = base / "fixtures"
    for fid in TRAIN:
        _link(fixtures_root / "train" / "cluster_results", root, "train", fid)
    _link(fixtures_root / "diagnostic" / "cluster_results", root, "diagnostic", DIAGNOSTIC)
    mp = pytest.MonkeyPatch()
    mp.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{base / 'ledger' / 'mlflow.db'}")
    mp.setenv("HOPS_AUTORESEARCH_STATE", str(base / "bootstrap"))
    mp.setenv("HOPS_FIXTURES", str(root))
    mp.setenv("MPLBACKEND", "Agg")
    assert main(["admit", "--bootstrap"]) == 0
    yield {"base": base, "root": root, "golden": read_golden(), "fixtures_root": fixtures_root}
    mp.undo()


@pytest.fixture
def state(env, tmp_path, monkeypatch):
    """A fresh state dir holding the module's bootstrapped golden file and no citations."""
    d = tmp_path / "state"
    (d / "golden").mkdir(parents=True)
    shutil.copy(env["base"] / "bootstrap" / "golden" / "train.json", d / "golden" / "train.json")
    monkeypatch.setenv("HOPS_AUTORESEARCH_STATE", str(d))
    yield d
    book = ledger.Ledger()
    if book.open_iteration() is not None:  # a failed test must not leave the shared ledger blocked
        main(["revert", "--reason", "test cleanup"])


def cite(state: Path, path: str, value, kind: str = "measurement", source: str = "test bench") -> None:
    f = state / "citations.yaml"
    doc = yaml.safe_load(f.read_text()) if f.exists() else {"citations": []}
    doc["citations"].append({"path": path, "value": value, "source": source, "kind": kind})
    f.write_text(yaml.safe_dump(doc))


def edit_presets(mp, edits: dict) -> None:
    """Stand-in for editing hops/presets/*.yaml: every Catalog.load sees `edits` (tests cannot touch the repo)."""
    original = Catalog.load.__func__

    def load(cls, overrides=None, preset_dir=PRESET_DIR):
        return original(cls, {**edits, **dict(_normalize_overrides(overrides))}, preset_dir)

    mp.setattr(Catalog, "load", classmethod(load))
    mp.setattr(validate_mod, "_CATALOGS", {})


def regression(env) -> float:
    """A coefficient that makes every tiny-set fixture worse: 4x slower GEMMs, whatever the error's sign."""
    worst = max(abs(v["link_calibrated"]["throughput_error_pct"]) for v in env["golden"]["fixtures"].values())
    assert worst < 40, "a 4x slower GEMM only regresses every fixture of a model within +-40 %"
    return PRESET * 4


def run(capsys, *argv) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


# --------------------------------------------------------------------------- gate
def test_bootstrap_golden_and_gate_passes_on_the_unchanged_tree(env, state, capsys):
    g = read_golden()
    assert g["checksum"] == checksum(g) and set(g["fixtures"]) == set(TRAIN)
    assert set(g["aggregates"]) == set(GateConfig.load().gated_variants)
    assert g["catalog"] == Catalog.load().as_dict() and g["admitted"]["git_commit"]
    code, out, _ = run(capsys, "gate")
    assert code == 0, out
    assert "PASS" in out and "sanity only" in out and "replay" in out
    code, _, err = run(capsys, "admit", "--bootstrap")
    assert code == 2 and "only creates the first golden file" in err


def test_deliberate_regression_is_rejected_with_every_violation_listed(env, state, capsys):
    bad = regression(env)
    cite(state, COEF, bad)  # cited, so only the numbers can reject it
    assert run(capsys, "propose", "--hypothesis", "kernels are faster than assumed", "--change-site", COEF,
               "--expect", "MAPE down")[0] == 0
    code, out, _ = run(capsys, "gate", "--set", f"{COEF}={bad}")
    assert code == 1, out
    assert "aggregate MAPE" in out and "|throughput error|" in out and "exceeds the 2 tolerance" in out
    assert "citation:" not in out
    assert "no run-to-run spread measured, every fixture keeps" in out  # the tiny root has no archive split
    for fid in TRAIN:
        assert f"{fid}: link_calibrated |throughput error|" in out
    before = golden_path().read_bytes()
    code, out, _ = run(capsys, "revert", "--reason", "every fixture regressed")
    assert code == 0 and golden_path().read_bytes() == before
    rec = ledger.read_iterations()[-1]
    assert rec["outcome"] == "reverted" and any("aggregate MAPE" in r for r in rec["regressions"])


def test_improvement_is_admitted_and_the_golden_file_updated(env, state, capsys, monkeypatch):
    golden_path().unlink()
    with monkeypatch.context() as m:  # the golden of a worse model (a dispatch floor 4x off)
        edit_presets(m, {COEF: regression(env)})
        assert run(capsys, "admit", "--bootstrap")[0] == 0
    worse = read_golden()
    cite(state, COEF, PRESET, source="restored: the preset value")
    code, out, _ = run(capsys, "propose", "--hypothesis", "the kernels run at the preset speed", "--change-site",
                       "hops/presets/model.yaml", "--expect", "MAPE and bubble MAE down on every fixture")
    assert code == 0, out
    code, out, _ = run(capsys, "admit")
    assert code == 0, out
    new = read_golden()
    assert new["checksum"] == checksum(new) and new["catalog"] == Catalog.load().as_dict()
    assert new["admitted"]["iteration"] > worse["admitted"]["iteration"]
    for v in ("spec", "link_calibrated"):
        assert new["aggregates"][v]["mape"] < worse["aggregates"][v]["mape"]
    rec = ledger.read_iterations()[-1]
    assert rec["outcome"] == "landed" and rec["hypothesis"] == "the kernels run at the preset speed"
    assert rec["before"]["spec"]["mape"] == pytest.approx(worse["aggregates"]["spec"]["mape"])
    assert rec["after"]["spec"]["mape"] == pytest.approx(new["aggregates"]["spec"]["mape"])
    log = (state / "LOG.md").read_text()
    assert "the kernels run at the preset speed" in log and "landed" in log and "→" in log
    code, _, err = run(capsys, "admit")
    assert code == 2 and "no open iteration" in err


def test_a_metric_redefinition_rebootstraps_the_golden_file_only_when_predictions_stand(env, state, capsys,
                                                                                        monkeypatch):
    """`admit --redefine-metrics` re-scores the same predictions under a new definition; a change that
    moves any fixture's throughput is a model change and must pass the ordinary gate instead."""
    import hops.metrics

    before = golden_path().read_bytes()
    assert run(capsys, "propose", "--hypothesis", "redefine", "--change-site", "hops/metrics.py",
               "--expect", "bubble moves, throughput does not")[0] == 0
    with monkeypatch.context() as m:
        edit_presets(m, {COEF: regression(env)})
        cite(state, COEF, regression(env))
        code, out, _ = run(capsys, "admit", "--redefine-metrics")
        assert code == 1 and "throughput moved" in out, out
        assert golden_path().read_bytes() == before
    with monkeypatch.context() as m:  # optimizer steps back to idle: bubble and rho move, throughput cannot
        m.setattr(hops.metrics, "busy_mask", lambda tl: tl.kind == "compute")
        m.setattr(validate_mod, "_MEMO", {})  # measured sides are memoized per process under the old definition
        code, out, _ = run(capsys, "admit", "--redefine-metrics")
        assert code == 0, out
    new = read_golden()
    assert new["checksum"] == checksum(new)
    old = env["golden"]
    for fid, per in new["fixtures"].items():
        assert per["spec"]["throughput_error_pct"] == pytest.approx(old["fixtures"][fid]["spec"]["throughput_error_pct"])
    assert any(per["spec"]["bubble_pp_delta"] != pytest.approx(old["fixtures"][fid]["spec"]["bubble_pp_delta"])
               for fid, per in new["fixtures"].items())
    assert ledger.read_iterations()[-1]["outcome"] == "landed"


def test_constant_change_without_citation_is_rejected(env, state, capsys, monkeypatch):
    edit_presets(monkeypatch, {"devices.h100.mtbf_hours": 12345})  # changes no score: only the citation rule bites
    code, out, _ = run(capsys, "gate")
    assert code == 1 and "citation: devices.h100.mtbf_hours 50000 -> 12345 has no citation" in out, out
    assert "aggregate" not in out.split("FAIL")[1]
    cite(state, "devices.h100.mtbf_hours", 999)  # wrong value: still rejected
    assert run(capsys, "gate")[0] == 1
    cite(state, "devices.h100.mtbf_hours", 12345, source="")  # empty source: rejected
    assert "empty `source`" in run(capsys, "gate")[1]
    cite(state, "devices.h100.mtbf_hours", 12345, source="fleet failure log 2025")
    assert run(capsys, "gate")[0] == 0
    # a --set what-if follows the same rule: numbers are printed, the missing citation fails the gate
    code, out, _ = run(capsys, "gate", "--set", "stacks.fixture_megatron.k_floor_ms.default=1.5")
    assert code == 1 and "MAPE % golden -> now" in out and "citation: stacks.fixture_megatron.k_floor_ms.default 1.4 -> 1.5" in out
    cfg = GateConfig.load()
    v = citation_violations([("devices.a10g.peak_tflops", 125, 130)],
                            [{"path": "devices.a10g.peak_tflops", "value": 130, "source": "optuna", "kind": "fit"}], cfg)
    assert v and "search_space.yaml" in v[0]


def test_hand_edited_golden_file_is_detected(env, state, capsys):
    doc = json.loads(golden_path().read_text())
    doc["aggregates"]["spec"]["mape"] += 50.0  # loosen the bar by hand
    golden_path().write_text(json.dumps(doc))
    code, out, _ = run(capsys, "gate")
    assert code == 1 and "does not match the checksum" in out


# --------------------------------------------------------------------------- the held-out split
def test_test_split_is_refused_everywhere(env, state, capsys):
    from autoresearch.fixtures import list_fixtures
    from autoresearch.gate import run_gate
    from autoresearch.observe import observe
    from autoresearch.search import run_search

    for call in (lambda: validate_mod.validate("test", root=env["root"]),
                 lambda: list_fixtures(env["root"], "test"),
                 lambda: run_gate(root=env["root"], split="test"),
                 lambda: observe("test", root=env["root"], log=False),
                 lambda: run_search("compute", 1, split="test", root=env["root"])):
        with pytest.raises(SplitGuardError, match="held out"):
            call()
    for argv in (["validate", "--split", "test"], ["observe", "--split", "test"], ["gate", "--split", "test"],
                 ["search", "--space", "compute", "--trials", "1", "--split", "test"]):
        code, out, err = run(capsys, *argv)
        assert code == 2 and REFUSAL in err and not out, argv
    code, _, err = run(capsys, "observe", "--split", "diagnostic")  # sanity-only split: not for steering
    assert code == 2 and "sanity-only" in err


def test_checkpoint_prints_and_records_suite_aggregates_only_and_only_once(env, state, capsys, tmp_path,
                                                                          monkeypatch):
    root = tmp_path / "with_test"
    for fid in TRAIN:  # a synthetic held-out split made of real traces
        _link(env["fixtures_root"] / "train" / "cluster_results", root, "test", fid)
    cache = tmp_path / "trace_cache"
    monkeypatch.setenv("HOPS_CACHE", str(cache))
    (state / "checkpoints.json").write_text("[]\n")
    assert run(capsys, "validate", "--split", "test", "--fixtures", str(root))[0] == 2
    code, out, err = run(capsys, "checkpoint", "--split", "test", "--confirm-human", "release review",
                         "--fixtures", str(root))
    assert code == 0, err
    assert "link_calibrated" in out and "MAPE" in out
    leaks = [*TRAIN, "a10g", "l4", "device_family", "pair", "exp2"]
    book = ledger.Ledger()
    runs = book.runs(ledger.CHECKPOINTS)
    assert len(runs) >= 1
    newest = max(runs, key=lambda r: r.info.start_time)
    recorded = json.dumps([newest.data.params, newest.data.metrics, newest.data.tags])
    on_disk = [p.read_text(errors="ignore") for p in Path(newest.info.artifact_uri.removeprefix("file://")).rglob("*")
               if p.is_file()] if Path(newest.info.artifact_uri.removeprefix("file://")).exists() else []
    for text in (out, err, recorded, (state / "checkpoints.json").read_text(), *on_disk):
        for word in leaks:
            assert word not in text, (word, text[:300])
    assert not cache.exists() or not any(cache.iterdir()), "no per-fixture cache files may outlive the checkpoint"
    assert set(json.loads((state / "checkpoints.json").read_text())[0]["aggregates"]["spec"]) == \
        {"mape", "bubble_mae_pp", "rho_mean", "n"}
    code, _, err = run(capsys, "checkpoint", "--split", "test", "--confirm-human", "again", "--fixtures", str(root))
    assert code == 2 and "already had its test checkpoint" in err
    (state / "checkpoints.json").write_text("[]\n")  # a fresh clone's file: the ledger still refuses
    assert run(capsys, "checkpoint", "--split", "test", "--confirm-human", "again", "--fixtures", str(root))[0] == 2
    code, _, err = run(capsys, "checkpoint", "--split", "train", "--confirm-human", "x")
    assert code == 2 and "only for the held-out split" in err


# --------------------------------------------------------------------------- search
def test_search_refuses_anything_not_allowlisted_and_nests_trials(env, state, capsys, tmp_path):
    code, _, err = run(capsys, "search", "--space", "nonexistent", "--trials", "1")
    assert code == 2 and "unknown space" in err
    code, _, err = run(capsys, "search", "--space", "compute", "--only", "devices.a10g.peak_tflops", "--trials", "1")
    assert code == 2 and "not allowlisted" in err
    bad = tmp_path / "space.yaml"
    bad.write_text(yaml.safe_dump({"spaces": {"x": [{"name": "n", "path": "model.no_such_constant", "low": 0,
                                                      "high": 1, "rationale": "r"}]}}))
    with pytest.raises(SearchError, match="not a catalog path"):
        load_allowlist(bad)
    entry = {"name": "c", "path": COEF, "low": 1.0, "high": 4.0, "rationale": "r"}
    for bounds in (None, {"kind": "citation", "low": "datasheet peak"}, {"kind": "hunch", "low": "a", "high": "b"}):
        bad.write_text(yaml.safe_dump({"spaces": {"x": [entry | ({"bounds": bounds} if bounds else {})]}}))
        with pytest.raises(SearchError, match="bounds without a justification"):
            select("x", path=bad)
        assert COEF not in allowlisted_paths(bad), "an unjustified bound cannot back a `fit` citation either"
    _, spaces = load_allowlist()
    assert all(not p.unjustified for params in spaces.values() for p in params)
    coef = next(p for p in spaces["compute"] if p.path == COEF)
    assert coef.high < 2.65, "the measured ceiling of the compute coefficient on train (and far from 3)"
    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    # the default floor moves no fixture here (both GPU types have their own): every trial ties the baseline
    code, out, err = run(capsys, "search", "--space", "compute", "--only", "stacks.fixture_megatron.k_floor_ms.default", "--trials", "2",
                         "--storage", storage, "--seed", "3")
    assert code == 0, err
    assert out.strip().endswith("no trial beat the current catalog values; nothing to propose") and "gate --set" not in out
    with pytest.MonkeyPatch.context() as mp:
        edit_presets(mp, {COEF: 1.0})  # GEMMs at datasheet peak: any trial above the bound's 1.0 does better
        code, out, err = run(capsys, "search", "--space", "compute", "--only", COEF, "--trials", "3", "--storage",
                             storage, "--study", "coefficient", "--seed", "3")
    assert code == 0, err
    assert "proposal only" in out and f"python -m autoresearch gate --set {COEF}=" in out
    book = ledger.Ledger()
    parent = max(book.runs(ledger.CALIBRATION, "tags.run_type = 'search'"), key=lambda r: r.info.start_time)
    trials = book.runs(ledger.CALIBRATION, f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'")
    assert len(trials) == 3 and all("link_calibrated.mape" in t.data.metrics for t in trials)
    assert PROVENANCE <= set(trials[0].data.params) and f"{COEF}=" in trials[0].data.params["overrides"]
    assert Catalog.load().as_dict() == read_golden()["catalog"], "search must not write presets"


def test_search_counts_finished_trials_on_stderr(env, state, capsys, tmp_path, monkeypatch):
    import hops.run.progress
    from autoresearch.search import run_search

    monkeypatch.setattr(hops.run.progress, "DELAY_S", 0.0)  # shown at once (2 s on a terminal) ...
    monkeypatch.setattr(hops.run.progress, "MIN_INTERVAL_S", 0.0)  # ... at every trial, however fast
    result = run_search("compute", 2, storage=f"sqlite:///{tmp_path / 'optuna.db'}", only=[COEF], seed=5,
                        progress=True)
    err = capsys.readouterr().err
    assert result.n_trials == 2
    assert "search compute:" in err and "2/2" in err and "trial 1: " in err  # per trial, with its objective
    assert err.endswith("\r")  # erased at the end: what is printed next starts on a clean line


def test_a_search_study_belongs_to_the_model_it_scored(env, state, capsys, tmp_path):
    """Trials rank one model: a resumed study says so and how many trials it held; a changed model (here a
    preset edited from 1.46 to 1.7) starts a new study with a new baseline, and a study named for another
    model is refused, never resumed with its stale trials."""
    search = ("search", "--space", "compute", "--only", COEF, "--storage", f"sqlite:///{tmp_path / 'optuna.db'}",
              "--seed", "1", "--trials")
    baseline = re.compile(r"baseline \(current catalog values, trial 0\): objective (\S+)")
    code, out, err = run(capsys, *search, "2")
    assert code == 0, err
    first = re.search(r"^search: new study (\S+) .* for model (\w+), 2 completed trial\(s\)", out, re.M)
    assert first and first.group(1) == f"autoresearch-compute-{first.group(2)}", out
    old_baseline = baseline.search(out).group(1)
    code, out, err = run(capsys, *search, "1")
    assert code == 0, err
    assert f"search: resumed study {first.group(1)} " in out and "already held 2 trial(s)" in out, out
    assert "3 completed trial(s) in all" in out
    with pytest.MonkeyPatch.context() as mp:
        edit_presets(mp, {"stacks.fixture_megatron.k_floor_ms.l4": 1.7})
        code, out, err = run(capsys, *search, "1")
        assert code == 0, err
        second = re.search(r"^search: new study (\S+) .* 1 completed trial\(s\)", out, re.M)
        assert second and second.group(1) != first.group(1), out
        assert baseline.search(out).group(1) != old_baseline, "the baseline is the changed model's"
        code, out, err = run(capsys, *search, "1", "--study", first.group(1))
    assert code == 2 and not out
    (line,) = err.strip().splitlines()
    assert f"study {first.group(1)!r} holds 3 trial(s) scored on model {first.group(2)}" in line
    assert "pass a new --study NAME, or drop --study" in line


def test_ctrl_c_ends_a_search_quietly_with_exit_130_and_its_runs_killed(env, state, tmp_path):
    """As `validate`, `gate` and the others: a terminal's Ctrl-C (SIGINT to the process group) is exit 130
    without a traceback, and the search's MLflow runs end KILLED instead of RUNNING until `repair`."""
    import os
    import signal
    import subprocess
    import sys
    import time

    import optuna

    storage, book = f"sqlite:///{tmp_path / 'optuna.db'}", ledger.Ledger()
    since = f"tags.run_type = 'trial' and attributes.start_time > {int(time.time() * 1000)}"
    proc = subprocess.Popen([sys.executable, "-m", "autoresearch", "search", "--space", "compute", "--trials",
                             "100000", "--storage", storage], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while len(book.runs(ledger.CALIBRATION, since)) < 3:  # trials are under way
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.2)
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert (proc.returncode, out, err) == (130, "", ""), err[-3000:]
    (summary,) = optuna.get_all_study_summaries(storage)
    study = optuna.load_study(study_name=summary.study_name, storage=storage)
    assert not [t for t in study.trials if t.state.name == "RUNNING"]
    (parent,) = [r for r in book.runs(ledger.CALIBRATION, "tags.run_type = 'search'")
                 if r.info.run_id == study.user_attrs["mlflow_run_id"]]
    assert parent.info.status == "KILLED"
    trials = book.runs(ledger.CALIBRATION, f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'")
    assert trials and {r.info.status for r in trials} <= {"FINISHED", "KILLED"}
    for r in trials:
        if r.info.status == "KILLED":  # the trial the Ctrl-C cut short: a failed trial, not a result
            assert study.trials[int(r.info.run_name.split()[-1])].state.name == "FAIL"


# --------------------------------------------------------------------------- ledger contents
def test_validate_logs_a_run_like_the_other_commands(env, state, capsys):
    book = ledger.Ledger()
    before = {r.info.run_id for r in book.runs(ledger.CALIBRATION, "tags.run_type = 'validate'")}
    code, out, err = run(capsys, "validate", "--split", "train", "--set", f"{COEF}=1.3")
    assert code == 0, err
    assert "link_calibrated" in out
    (new,) = [r for r in book.runs(ledger.CALIBRATION, "tags.run_type = 'validate'") if r.info.run_id not in before]
    assert new.info.status == "FINISHED" and new.info.run_name == "validate"
    assert PROVENANCE <= set(new.data.params) and new.data.params["overrides"] == f"{COEF}=1.3"
    assert new.data.params["split"] == "train" and new.data.params["variants"] == "spec,link_calibrated,replay"
    for key in ("spec.mape", "link_calibrated.mape", "link_calibrated.bubble_mae_pp", "replay.mape"):
        assert key in new.data.metrics, key
    assert {"fixtures.csv", "report.md", "scatter.png", "groups.png"} <= \
        {a.path for a in book.client.list_artifacts(new.info.run_id)}


def test_validate_needs_no_calibration_state_outside_a_checkout(env, tmp_path, monkeypatch, capsys):
    """An installed wheel scores fixtures without a golden file: its run belongs to no iteration."""
    from autoresearch import state as state_mod

    monkeypatch.delenv(state_mod.ENV, raising=False)
    monkeypatch.setattr(state_mod, "PACKAGE", tmp_path / "site-packages" / "autoresearch")  # not a checkout
    monkeypatch.chdir(tmp_path)
    with pytest.raises(state_mod.StateError):
        state_mod.state_dir()
    book = ledger.Ledger()
    before = {r.info.run_id for r in book.runs(ledger.CALIBRATION, "tags.run_type = 'validate'")}
    code, out, err = run(capsys, "validate", "--split", "train", "--fixture", TRAIN[0], "--variant", "spec")
    assert (code, err) == (0, ""), err
    assert "aggregates" in out
    (new,) = [r for r in book.runs(ledger.CALIBRATION, "tags.run_type = 'validate'") if r.info.run_id not in before]
    assert new.info.status == "FINISHED" and "iteration" not in new.data.tags


def test_an_unreachable_tracking_server_is_one_line_within_seconds(env, state, tmp_path):
    """MLflow alone retries a refused connection for about 4 minutes, then shows a traceback."""
    import os
    import socket
    import subprocess
    import sys

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again: nothing listens there
    env_ = {**os.environ, "MLFLOW_TRACKING_URI": f"http://hops:secret@127.0.0.1:{port}"}
    env_.pop("MLFLOW_HTTP_REQUEST_MAX_RETRIES", None)
    for argv in (["propose", "--hypothesis", "h", "--change-site", "hops/model/compute.py", "--expect", "e"],
                 ["validate", "--split", "train", "--fixture", TRAIN[0]]):
        proc = subprocess.run([sys.executable, "-m", "autoresearch", *argv], cwd=REPO, env=env_, capture_output=True,
                              text=True, timeout=90)  # MLflow's own retries would take minutes
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
        assert f"MLflow tracking server http://hops:***@127.0.0.1:{port} does not answer" in lines[0]
        assert "secret" not in proc.stderr


def test_runs_carry_the_documented_params_metrics_tags_and_artifacts(env, state, capsys):
    assert run(capsys, "propose", "--hypothesis", "h", "--change-site", "hops/model/compute.py", "--expect", "e",
               "--title", "host NIC caps")[0] == 0
    assert run(capsys, "gate")[0] == 0
    book = ledger.Ledger()
    it = book.open_iteration()
    gate = book.get_run(it.data.tags["last_gate_run"])
    n = it.data.tags["iteration"]
    assert (it.info.run_name, gate.info.run_name) == (f"it{n} iteration: host NIC caps", f"it{n} gate: host NIC caps")
    exp = book.client.get_experiment(gate.info.experiment_id)
    assert exp.tags["mlflow.experimentKind"] == "custom_model_development"  # MLflow 3 UI: training runs view
    view = json.loads(exp.tags["mlflow.sharedViewState.headline"])
    assert {f"metrics.`{m}`" for m in ("link_calibrated.mape", "spec.mape", "link_calibrated.bubble_mae_pp",
                                       "gate.violations")} <= set(view["selectedColumns"])
    assert set(ledger.HEADLINE_METRICS) <= set(gate.data.metrics)
    assert "viewStateShareKey=headline" in exp.tags["mlflow.note.content"]
    assert PROVENANCE <= set(gate.data.params)
    m = gate.data.metrics
    for key in ("spec.mape", "link_calibrated.bubble_mae_pp", "link_calibrated.rho_mean", "replay.mape",
                "gate.violations", "group.device_family.a10g.spec.mape", "diagnostic.link_calibrated.mape"):
        assert key in m, key
    for tag in ("iteration", "hypothesis", "change_site", "expected_effect", "outcome"):
        assert tag in gate.data.tags and tag in it.data.tags, tag
    assert (gate.data.tags["run_type"], it.data.tags["run_type"]) == ("gate", "iteration")
    assert gate.data.tags["outcome"] == "open" and it.data.metrics["before.spec.mape"] > 0
    arts = {a.path for a in book.client.list_artifacts(gate.info.run_id)}
    assert {"fixtures.csv", "report.md", "scatter.png", "groups.png"} <= arts
    assert run(capsys, "revert", "--blocked", "--reason", "needs per-stage host overhead in the schema")[0] == 0
    closed = book.runs(ledger.CALIBRATION, f"tags.iteration = '{it.data.tags['iteration']}'")
    assert {r.data.tags["outcome"] for r in closed} == {"blocked"}


def test_observe_ranks_contributors_with_numbers_and_logs_a_run(env, state, capsys):
    code, out, _ = run(capsys, "observe", "--top", "3")
    assert code == 0
    lines = re.findall(r"(?:first|middle|last)-stage \w+ [\w -]+ (under|over)-predicted ([+-][\d.]+)% on \d+ "
                       r"fixtures? \(measured ([\d.]+) vs predicted ([\d.]+) ms", out)
    assert lines, out
    for direction, pct, measured, predicted in lines:  # the relative error, signed as the throughput error is
        m, p = float(measured), float(predicted)
        assert (direction == "over") == (float(pct) >= 0)
        assert float(pct) == pytest.approx(100 * (p - m) / m, abs=0.01 + 10 / m)  # m, p were rounded to 0.1 ms
    assert "groups by contribution" in out and "worst fixtures" in out
    book = ledger.Ledger()
    obs = max(book.runs(ledger.CALIBRATION, "tags.run_type = 'observe'"), key=lambda r: r.info.start_time)
    assert "contributors.csv" in {a.path for a in book.client.list_artifacts(obs.info.run_id)}


def test_log_keeps_iterations_recorded_on_another_machine(env, state, capsys):
    from autoresearch.research_log import collect, render

    other = {"iteration": 41, "run_id": "elsewhere", "outcome": "reverted", "hypothesis": "from another clone",
             "change_site": "hops/engine/loop.py", "expected_effect": "x", "before": {}, "after": None,
             "regressions": ["exp: worse"], "reason": "r"}
    ledger.append_iteration(other)
    assert run(capsys, "log")[0] == 0
    text = (state / "LOG.md").read_text()
    assert "from another clone" in text and "## Iteration 41: reverted" in text
    assert "from another clone" in render(collect(None))


def test_one_state_directory_is_one_numbering_whatever_mlflow_store_its_commands_log_to(env, state, capsys,
                                                                                       monkeypatch, tmp_path):
    """Two MLflow stores on one state (another MLFLOW_TRACKING_URI in another shell): the second cannot open
    an iteration while the first holds one, and never issues a number the state has issued."""
    here, there = ledger.tracking_uri(), f"sqlite:///{tmp_path / 'other' / 'mlflow.db'}"
    propose = ("propose", "--hypothesis", "h", "--change-site", COEF, "--expect", "e")
    code, out, _ = run(capsys, *propose)
    n = int(re.search(r"opened iteration (\d+)", out).group(1))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", there)
    code, out, err = run(capsys, *propose)
    assert code == 2 and not out, out
    (line,) = err.strip().splitlines()
    assert f"iteration {n} is open on this state ({state}) in another MLflow ledger, {here}" in line
    assert f"MLFLOW_TRACKING_URI={here} python -m autoresearch revert" in line
    code, _, err = run(capsys, "revert", "--reason", "r")
    assert code == 2 and f"no open iteration to close in this MLflow ledger; iteration {n} is open" in err
    monkeypatch.setenv("MLFLOW_TRACKING_URI", here)
    assert run(capsys, "revert", "--reason", "closed where it was opened")[0] == 0
    monkeypatch.setenv("MLFLOW_TRACKING_URI", there)  # a store that never saw iteration n
    code, out, _ = run(capsys, *propose)
    assert code == 0 and f"opened iteration {n + 1} " in out, out
    assert run(capsys, "revert", "--reason", "r")[0] == 0
    assert [r["iteration"] for r in ledger.read_iterations()] == [n, n + 1]


@pytest.mark.parametrize("site, words", [
    ("stacks.fixture_megatron.k_floor_ms.l9", "no such catalog path; did you mean stacks.fixture_megatron.k_floor_ms.l4?"),
    ("stacks.fixture_megatron.nosuch", "no such catalog path"),
    ("/etc/passwd", "is outside the repo"),
    ("nosuchdir/x.py", "is neither a path in the repo"),
])
def test_propose_refuses_a_change_site_that_names_nothing(env, state, capsys, site, words):
    code, out, err = run(capsys, "propose", "--hypothesis", "h", "--change-site", site, "--expect", "e")
    assert code == 2 and words in err and not out and len(err.strip().splitlines()) == 1, err
    assert ledger.Ledger().open_iteration() is None


@pytest.mark.parametrize("site", ["stacks.fixture_megatron.k_floor_ms.l4", "stacks.fixture_megatron.k_floor_ms",
                                  "hops/model/compute.py", "hops/model/a_new_term.py"])
def test_propose_takes_a_catalog_value_or_mapping_and_a_file_of_the_repo_new_or_not(env, state, capsys, site):
    assert run(capsys, "propose", "--hypothesis", "h", "--change-site", site, "--expect", "e")[0] == 0
    assert run(capsys, "revert", "--reason", "test")[0] == 0


@pytest.mark.parametrize("argv, words", [
    (["validate", "--split", "train", "--jobs", "-1"], "argument --jobs: expected an integer >= 0, got -1"),
    (["gate", "--jobs", "-3"], "argument --jobs: expected an integer >= 0, got -3"),
    (["observe", "--top", "0"], "argument --top: expected an integer >= 1, got 0"),
    (["search", "--space", "compute", "--trials", "0"], "argument --trials: expected an integer >= 1, got 0"),
])
def test_a_count_below_its_range_is_refused_in_one_line(capsys, argv, words):
    with pytest.raises(SystemExit) as exc:  # argparse's own exit
        main(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2 and words in err and len(err.strip().splitlines()) == 1, err


def test_a_fixture_scenario_that_is_not_yaml_is_one_line_with_its_line(env, capsys, tmp_path):
    root = tmp_path / "fx"
    src = env["root"] / "train" / "cluster_results" / TRAIN[0]
    shutil.copytree(src, root / "train" / "cluster_results" / TRAIN[0])
    scen = root / "train" / "cluster_results" / TRAIN[0] / "hops.base.yaml"
    scen.write_text(scen.read_text() + "simulation: [\n")
    code, out, err = run(capsys, "validate", "--split", "train", "--fixtures", str(root))
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1, err
    assert f"{scen}: line {len(scen.read_text().splitlines()) + 1}: invalid YAML (expected the node content" in lines[0]


def test_a_validate_run_records_the_fixture_root_and_set_it_scored(env, state, capsys):
    assert run(capsys, "validate", "--split", "train", "--fixtures", str(env["root"]), "--fixture", TRAIN[0])[0] == 0
    book = ledger.Ledger()
    runs = book.client.search_runs([book.client.get_experiment_by_name(ledger.CALIBRATION).experiment_id],
                                   order_by=["attributes.start_time DESC"], max_results=1)
    assert runs[0].data.params["fixtures_root"] == str(env["root"]) and runs[0].data.params["fixture_set"] == TRAIN[0]


def test_search_proposes_nothing_when_no_trial_beats_the_current_values():
    from autoresearch.search import Param, SearchResult, render

    current = float(Catalog.load().as_dict()["stacks"]["fixture_megatron"]["compute_time_coefficient"])
    p = Param("compute_coefficient", "stacks.fixture_megatron.compute_time_coefficient", 1.0, 2.3, "r")
    trial = {"number": 0, "value": 2.4, "values": {p.path: current}, "mape": 1.9, "bubble_mae_pp": 0.5}
    text = render(SearchResult("s", "sqlite:///x", [p], {"mape": 1.0}, trial, trial, 2, "run"))
    assert text.endswith("no trial beat the current catalog values; nothing to propose") and "gate --set" not in text
    better = {**trial, "number": 1, "value": 2.0, "values": {p.path: current - 0.1}}
    assert "gate --set" in render(SearchResult("s", "sqlite:///x", [p], {"mape": 1.0}, better, trial, 2, "run"))


def test_the_logs_summary_row_marks_numbers_that_came_from_a_what_if_gate():
    from autoresearch.research_log import render

    rec = {"iteration": 61, "outcome": "reverted", "hypothesis": "h", "before": {"spec": {"mape": 1.89}},
           "after": {"spec": {"mape": 1.88}}, "after_whatif": "stacks.fixture_megatron.iteration_overhead_ms=6.2"}
    row = next(line for line in render([rec]).splitlines() if line.startswith("| 61 |"))
    assert "1.89 → 1.88 (what-if)" in row
    assert "(what-if)" not in next(line for line in render([{**rec, "after_whatif": "none"}]).splitlines()
                                   if line.startswith("| 61 |"))
