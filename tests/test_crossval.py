"""The phase fit and the cross-validation built on it (autoresearch/fit.py, autoresearch/crossval.py)."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from autoresearch import crossval as cv_mod
from autoresearch import fit as phase_fit
from autoresearch.__main__ import main
from autoresearch.fixtures import list_fixtures
from autoresearch.search import select
from hops.model.hardware import Catalog

SHAPES = ("exp2_1_all_nodes_run93", "exp2_33_all_nodes_seq4096_run197", "exp2_34_all_nodes_hidden2048_run201")


@pytest.fixture(scope="module")
def shapes(fixtures_root):
    return phase_fit.stage_phases(list_fixtures(fixtures_root, "train", SHAPES))


def _params(*paths):
    _, params = select("sum_model")
    return [p for p in params if p.path in paths]


STACK = "stacks.fixture_megatron"


def test_the_fit_recovers_constants_that_generated_the_phase_times(shapes):
    # Three shapes (base, seq 4096, hidden 2048) separate GEMM efficiency from the attention traffic;
    # "measured" phases are the model's own prediction under known values away from the presets.
    truth = {"stacks.fixture_megatron.compute_time_coefficient": 1.6, "stacks.fixture_megatron.attention_bytes_forward": 20.0,
             "stacks.fixture_megatron.attention_bytes_backward": 40.0, "stacks.fixture_megatron.logits_bytes_forward": 30.0}
    synthetic = phase_fit.predicted(shapes, Catalog.load(truth))
    data, k = [], 0
    for d in shapes:
        data.append(dataclasses.replace(d, measured=synthetic[k:k + len(d.measured)]))
        k += len(d.measured)
    result = phase_fit.fit(data, _params(*truth), starts=3)
    for path, value in truth.items():
        assert result.values[path] == pytest.approx(value, rel=0.02), path
    assert np.abs(result.residuals).max() < 1e-3


def test_the_fit_stays_within_the_space_bounds_and_names_values_at_a_bound(shapes):
    params = _params("stacks.fixture_megatron.compute_time_coefficient", "stacks.fixture_megatron.attention_bytes_forward")
    doubled = [dataclasses.replace(d, measured=d.measured * 4.0) for d in shapes]  # no value in bounds gets there
    result = phase_fit.fit(doubled, params, starts=2)
    for p in params:
        assert p.low <= result.values[p.path] <= p.high
    assert result.at_bound()["stacks.fixture_megatron.compute_time_coefficient"] == "high"


@pytest.mark.parametrize("constant", ["k_floor_ms", "launch_overhead_ms"])
def test_a_gpu_absent_from_the_fit_data_gets_the_stacks_default_not_a_fitted_value(fixtures_root, constant):
    """A per-GPU constant (dispatch floor, launch cost) for a GPU the fit has no data on is not
    fitted: it is what HOPS would predict for a GPU the stack has no entry for, its `default`."""
    data = phase_fit.stage_phases(list_fixtures(fixtures_root, "train", ["exp2_8_h100_pair_pp2_run105"]))
    a10g, h100 = f"{STACK}.{constant}.a10g", f"{STACK}.{constant}.h100"
    result = phase_fit.fit(data, _params(a10g, h100), starts=1)
    generic = Catalog.load().stacks["fixture_megatron"][constant]["default"]
    assert result.unseen == {a10g: generic}
    assert result.values[a10g] == generic


def test_crossval_fits_each_fold_without_the_fixtures_it_scores(fixtures_root, monkeypatch):
    ids = [*SHAPES, "exp2_8_h100_pair_pp2_run105", "exp2_9_g_only_pp4_run107", "exp2_13_a10g_pair_pp2_run135"]
    splits = []

    def only_train(root, split):
        splits.append(split)
        return list_fixtures(root, split, ids)

    monkeypatch.setattr(cv_mod, "list_fixtures", only_train)
    seen = []
    real_fit = phase_fit.fit

    def spy(data, params, **kw):
        seen.append({d.id for d in data})
        return real_fit(data, params, **kw)

    monkeypatch.setattr(phase_fit, "fit", spy)
    result = cv_mod.crossval("depth", root=fixtures_root, starts=1)
    assert splits == ["train"]
    assert seen[0] == set(ids)  # the all-train fit
    assert len(result.folds) == 3  # pp2, pp4, pp6
    for fold, fitted in zip(result.folds, seen[1:]):
        assert fitted == set(fold.fitted_on) == set(ids) - set(fold.left_out)
        assert fold.left_out_scores["spec"]["n"] == len(fold.left_out)


def test_the_gpu_reading_hides_only_that_gpus_stages_from_each_fold(fixtures_root, monkeypatch):
    """`--by gpu` answers "a GPU type the fit never measured, beside types it did": the fold's fit
    keeps every fixture with a stage elsewhere, those stages included, sees no stage on the GPU,
    and so gives that GPU's dispatch constants the stack's default; the stage error column is
    over the hidden stages alone."""
    ids = ["exp2_1_all_nodes_run93", "exp2_8_h100_pair_pp2_run105", "exp2_13_a10g_pair_pp2_run135"]
    monkeypatch.setattr(cv_mod, "list_fixtures", lambda root, split: list_fixtures(root, split, ids))
    fits = []
    real_fit = phase_fit.fit

    def spy(data, params, **kw):
        fits.append(data)
        return real_fit(data, params, **kw)

    monkeypatch.setattr(phase_fit, "fit", spy)
    result = cv_mod.crossval("gpu", root=fixtures_root, starts=1)
    fold = next(f for f in result.folds if f.label == "h100")
    data = fits[1 + [f.label for f in result.folds].index("h100")]
    assert {d.id for d in data} == {"exp2_1_all_nodes_run93", "exp2_13_a10g_pair_pp2_run135"} == set(fold.fitted_on)
    mixed = next(d for d in data if d.id == "exp2_1_all_nodes_run93")
    for gpu, row in zip(mixed.gpus, mixed.measured):
        assert np.isnan(row).all() == (gpu == "h100")
    assert f"{STACK}.k_floor_ms.h100" in fold.fit.unseen and f"{STACK}.k_floor_ms.a10g" not in fold.fit.unseen
    assert set(fold.left_out) == {"exp2_1_all_nodes_run93", "exp2_8_h100_pair_pp2_run105"}
    whole = phase_fit.stage_phases(list_fixtures(fixtures_root, "train", list(fold.left_out)))
    rel = np.abs(phase_fit.predicted(whole, Catalog.load(fold.fit.values)) / np.vstack([d.measured for d in whole]) - 1)
    on_h100 = np.array([g == "h100" for d in whole for g in d.gpus])
    assert fold.phase_out == pytest.approx(rel[on_h100].mean() * 100)
    assert fold.phase_out != pytest.approx(rel.mean() * 100)


def test_with_several_fit_seeds_each_fold_is_refit_from_each_and_reports_the_range(fixtures_root, monkeypatch):
    """A fold's constants are not identified by its few fixtures, so refits from other seeds can
    land elsewhere at the same cost: --fit-seeds N refits every fold from seeds 0..N-1, the row
    keeps the first seed's ratio and reports the range over all N."""
    ids = [*SHAPES, "exp2_8_h100_pair_pp2_run105", "exp2_13_a10g_pair_pp2_run135"]
    monkeypatch.setattr(cv_mod, "list_fixtures", lambda root, split: list_fixtures(root, split, ids))
    seeds = []
    real_fit = phase_fit.fit

    def spy(data, params, **kw):
        seeds.append(kw["seed"])
        return real_fit(data, params, **kw)

    monkeypatch.setattr(phase_fit, "fit", spy)
    one = cv_mod.crossval("depth", root=fixtures_root, starts=1)
    seeds.clear()
    three = cv_mod.crossval("depth", root=fixtures_root, starts=1, fit_seeds=3)
    assert seeds == [0] + [0, 1, 2] * len(three.folds)  # the all-train fit once, each fold from every seed
    a, b = one.table(), three.table()
    assert list(b["ratio"]) == list(a["ratio"])  # the first seed's refit is the row
    assert (b["ratio_min"] <= b["ratio"]).all() and (b["ratio"] <= b["ratio_max"]).all()
    assert (a["ratio_min"] == a["ratio"]).all() and (a["ratio_max"] == a["ratio"]).all()
    assert three.to_dict()["fit_seeds"] == 3 and "--fit-seeds 3" in three.to_dict()["command"]


def test_shape_groups_are_the_shapes_beyond_the_base_model(fixtures_root):
    fixtures = list_fixtures(fixtures_root, "train", [*SHAPES, "exp2_8_h100_pair_pp2_run105"])
    groups = cv_mod.groups_by("shape", fixtures, phase_fit.stage_phases(fixtures))
    assert groups == {"seq 4096": ["exp2_33_all_nodes_seq4096_run197"],
                      "hidden 2048": ["exp2_34_all_nodes_hidden2048_run201"],
                      "layers 2": list(SHAPES), "layers 6": ["exp2_8_h100_pair_pp2_run105"]}


def test_the_cli_prints_the_table_per_group_and_logs_a_crossval_run(fixtures_root, monkeypatch, capsys, tmp_path):
    ids = ["exp2_8_h100_pair_pp2_run105", "exp2_9_g_only_pp4_run107", "exp2_1_all_nodes_run93"]
    monkeypatch.setattr(cv_mod, "list_fixtures", lambda root, split: list_fixtures(root, split, ids))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    monkeypatch.setenv("HOPS_AUTORESEARCH_STATE", str(tmp_path / "state"))
    assert main(["crossval", "--by", "depth", "--fixtures", str(fixtures_root)]) == 0
    out = capsys.readouterr().out
    assert "in_mape" in out and "out_mape" in out
    for label in ("pp2", "pp4", "pp6"):
        assert any(line.split()[:2] == [label, "spec"] for line in out.splitlines()), label
    from autoresearch import ledger

    runs = ledger.Ledger().runs(ledger.CALIBRATION, "tags.run_type = 'crossval'")
    assert len(runs) == 1 and "crossval.depth.pp2.spec.out.mape" in runs[0].data.metrics


def test_a_bad_by_value_is_a_one_line_error(capsys):
    assert main(["crossval", "--by", "colour"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--by 'colour'" in err and "device, gpu, depth, shape" in err


def test_readme_tables_refuse_a_crossval_measured_on_another_model(tmp_path, monkeypatch):
    import importlib.util
    import json
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "docs" / "make_readme_assets.py"
    spec = importlib.util.spec_from_file_location("make_readme_assets", path)
    assets = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(assets)
    for by in assets.CROSSVAL_BY:
        doc = json.loads((assets.CROSSVAL / f"{by}.json").read_text())
        (tmp_path / f"{by}.json").write_text(json.dumps({**doc, "model_fingerprint": "0" * 16}))
    monkeypatch.setattr(assets, "CROSSVAL", tmp_path)
    monkeypatch.setattr(assets, "REPO", tmp_path.parent)
    with pytest.raises(SystemExit, match="the model is now .*: run python -m autoresearch crossval --by device"):
        assets.crossval()
