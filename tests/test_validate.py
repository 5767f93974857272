"""Specifications for validate: the variant information boundary, scoring, the report and the CLI."""
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import autoresearch.validate as validate_mod
from autoresearch.fixtures import FixtureError, list_fixtures, resolve_root
from autoresearch.scoring import aggregate, spearman
from autoresearch.validate import validate
from autoresearch.variants import VariantError, predict
from hops.model.hardware import Catalog, CatalogError

REPO = Path(__file__).resolve().parents[1]
SMALL = "exp2_13_a10g_pair_pp2_run135"  # a 2-stage fixture: cheap to copy and simulate
SIX = "exp2_1_all_nodes_run93"
PREDICTED_KEYS = ("predicted_throughput_per_s", "predicted_bubble_ratio", "util_spearman_rho")


def copy_fixture(root: Path, dest_root: Path, fid: str, split: str = "train", scale_compute: float = 1.0) -> Path:
    """Copy a real fixture under dest_root/<split>/cluster_results/, optionally stretching every compute event."""
    src = root / "train" / "cluster_results" / fid
    dst = dest_root / split / "cluster_results" / fid
    shutil.copytree(src, dst)
    if scale_compute != 1.0:
        for path in (dst / "megatron_trace").glob("rank*.jsonl"):
            out = []
            for line in path.read_text().splitlines():
                if line.lstrip().startswith("{"):
                    e = json.loads(line)
                    if e["event_type"] == "compute":
                        e["end_wall_ns"] = e["start_wall_ns"] + int((e["end_wall_ns"] - e["start_wall_ns"]) * scale_compute)
                    line = json.dumps(e)
                out.append(line)
            path.write_text("\n".join(out) + "\n")
    return dst


def predicted_view(report, variant):
    """Everything on the predicted side of a report's rows for one variant, as canonical bytes."""
    rows = [r for r in report.rows if r["variant"] == variant]
    view = [{"id": r["id"], "pred_thr": r["predicted_throughput_per_s"], "pred_bub": r["predicted_bubble_ratio"],
             "pred_phases": [(p["stage"], p["phase"], p["predicted_ms"]) for p in r["phase_breakdown"]]}
            for r in rows]
    return json.dumps(view, sort_keys=True).encode()


# --------------------------------------------------------------------------- the information boundary
def test_trace_never_reaches_spec_or_link_calibrated(fixtures_root, tmp_path):
    """Doubling every measured compute duration changes the measurement and replay, nothing else."""
    copy_fixture(fixtures_root, tmp_path / "orig", SMALL)
    copy_fixture(fixtures_root, tmp_path / "pert", SMALL, scale_compute=2.0)
    cache = tmp_path / "cache"
    a = validate("train", root=tmp_path / "orig", cache_dir=cache)
    b = validate("train", root=tmp_path / "pert", cache_dir=cache)

    meas = lambda rep: [r["measured_throughput_per_s"] for r in rep.rows]  # noqa: E731
    assert meas(a) != meas(b), "the perturbation must change the measured side"
    for variant in ("spec", "link_calibrated"):
        assert predicted_view(a, variant) == predicted_view(b, variant)
    assert predicted_view(a, "replay") != predicted_view(b, "replay")
    ra = next(r for r in a.rows if r["variant"] == "replay")
    rb = next(r for r in b.rows if r["variant"] == "replay")
    f_a = sum(p["predicted_ms"] for p in ra["phase_breakdown"] if p["phase"] == "F")
    f_b = sum(p["predicted_ms"] for p in rb["phase_breakdown"] if p["phase"] == "F")
    assert f_b == pytest.approx(2 * f_a, rel=0.1), "replay follows the trace it was fitted on"


def test_spec_and_link_calibrated_simulations_are_byte_identical_under_perturbation(fixtures_root, tmp_path):
    """The same check one level down: the simulated run's files, not just the scores."""
    catalog = Catalog.load()
    outs = {}
    for name, scale in (("orig", 1.0), ("pert", 2.0)):
        copy_fixture(fixtures_root, tmp_path / name, SMALL, scale_compute=scale)
        fx = list_fixtures(tmp_path / name, "train")[0]
        for variant in ("spec", "link_calibrated"):
            def forbidden():
                raise AssertionError(f"{variant} asked for the trace fit")
            res = predict(variant, fx, catalog, replay_fit=forbidden)
            paths = res.write(tmp_path / f"{name}_{variant}")
            outs[name, variant] = {k: p.read_bytes() for k, p in paths.items()}
    for variant in ("spec", "link_calibrated"):
        assert outs["orig", variant] == outs["pert", variant]


# --------------------------------------------------------------------------- scoring
def test_spearman_definition():
    assert spearman([1, 2, 3], [10, 20, 30]) == pytest.approx(1.0)
    assert spearman([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    assert spearman([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(0.8)
    assert spearman([1, 2, 2], [1, 2, 3]) == pytest.approx(np.corrcoef([1, 2.5, 2.5], [1, 2, 3])[0, 1])
    assert math.isnan(spearman([0.5, 0.5], [0.1, 0.9]))  # no spread on one side: undefined
    assert spearman([0.5, 0.5 + 1e-13, 0.7], [1, 2, 3]) == pytest.approx(np.corrcoef([1.5, 1.5, 3], [1, 2, 3])[0, 1])


def test_aggregates_follow_design_definitions(fixtures_root, tmp_path):
    rep = validate("train", root=fixtures_root, ids=[SMALL, SIX], cache_dir=tmp_path / "c")
    df = rep.table()
    for variant, agg in rep.aggregates().items():
        g = df[df["variant"] == variant]
        assert agg["mape"] == pytest.approx(g["throughput_error_pct"].abs().mean())
        assert agg["bubble_mae_pp"] == pytest.approx(g["bubble_pp_delta"].abs().mean())
        assert agg["n"] == 2
    r = rep.rows[0]
    assert r["throughput_error_pct"] == pytest.approx(
        (r["predicted_throughput_per_s"] - r["measured_throughput_per_s"]) / r["measured_throughput_per_s"] * 100)
    assert aggregate(df.iloc[:0])["n"] == 0


def test_phase_breakdown_adds_up_to_the_iteration_wall(fixtures_root, tmp_path):
    """F + BW + OPT + iteration-end idle + pipeline idle per stage is the mean iteration wall, on both sides."""
    rep = validate("train", root=fixtures_root, ids=[SIX], variants=["replay"], cache_dir=tmp_path / "c")
    row = rep.rows[0]
    for side, thr in (("measured_ms", row["measured_throughput_per_s"]), ("predicted_ms", row["predicted_throughput_per_s"])):
        wall = 6 / thr * 1000.0  # 6 microbatches per iteration
        for s in range(6):
            total = sum(p[side] for p in row["phase_breakdown"] if p["stage"] == s)
            assert total == pytest.approx(wall, rel=1e-6)


def test_replay_reproduces_the_fitted_compute(fixtures_root, tmp_path):
    """Replay's per-stage F and BW per iteration match the trace it was fitted on (sampling noise only)."""
    rep = validate("train", root=fixtures_root, ids=[SIX], variants=["replay"], cache_dir=tmp_path / "c")
    for p in rep.rows[0]["phase_breakdown"]:
        if p["phase"] in ("F", "BW"):
            assert p["predicted_ms"] == pytest.approx(p["measured_ms"], rel=0.05)


def _dead_time_parts(tl):
    """(kept iterations, window ms, their pipeline spans + steps, mean gap after an iteration's last event)."""
    from hops.metrics import measured_window

    w, t0, t1 = measured_window(tl)
    iters = np.unique(w.iteration[w.iteration >= 0])
    work = (w.kind == "compute") | (w.kind == "transfer")
    busy, after = 0.0, []
    for k, it in enumerate(iters):
        mine = w.iteration == it
        busy += w.end_ms[mine & work].max() - w.start_ms[mine].min()
        opt = mine & (w.kind == "optimizer")
        busy += (w.end_ms[opt] - w.start_ms[opt]).max() if opt.any() else 0.0
        if k + 1 < len(iters):
            after.append(w.start_ms[w.iteration == iters[k + 1]].min() - w.end_ms[mine].max())
    return len(iters), t1 - t0, busy, float(np.mean(after))


def test_replay_dead_time_counts_the_last_kept_iteration_up_to_its_last_event(fixtures_root):
    """Replay's dead time is what the scored window holds per kept iteration beyond the pipeline spans
    (first event to last compute or transfer) and the steps, plus the part after an iteration's last
    event that the window leaves out of the last one, averaged over the gaps where it is seen. exp2_1's
    last kept iteration holds a ~260 ms stall before its step, which a fit over the gaps alone missed."""
    from autoresearch.variants import fit_replay
    from hops.traces import load_trace

    fx = list_fixtures(fixtures_root, "train", [SIX])[0]
    tl = load_trace(fx.path, token=fx.token)
    n, window, busy, after = _dead_time_parts(tl)
    assert fit_replay(tl).host_overhead.mean_ms * n == pytest.approx(window - busy + after, rel=1e-9)


def test_a_trace_without_steps_keeps_its_dead_time_after_each_iteration(fixtures_root):
    """exp1_1_all_nodes_run15 records no optimizer events: all its dead time lies between an iteration's
    last event and the next one's first, so replay charges the mean of those gaps, and the last kept
    iteration, whose gap lies outside the window, does not count as one without dead time."""
    from autoresearch.variants import fit_replay
    from hops.traces import load_trace

    fx = list_fixtures(fixtures_root, "archive", ["exp1_1_all_nodes_run15"])[0]
    tl = load_trace(fx.path, token=fx.token)
    assert not (tl.kind == "optimizer").any()
    n, window, busy, after = _dead_time_parts(tl)
    assert after > 100
    assert fit_replay(tl).host_overhead.mean_ms == pytest.approx(after, rel=1e-9)


# --------------------------------------------------------------------------- what-if overrides
def test_set_changes_predictions_not_measurements(fixtures_root, tmp_path):
    base = validate("train", root=fixtures_root, ids=[SMALL], variants=["spec"], cache_dir=tmp_path / "c")
    what_if = validate("train", root=fixtures_root, ids=[SMALL], variants=["spec"], cache_dir=tmp_path / "c",
                       overrides=["stacks.fixture_megatron.k_floor_ms.a10g=3.0"])
    assert what_if.rows[0]["measured_throughput_per_s"] == base.rows[0]["measured_throughput_per_s"]
    assert what_if.rows[0]["predicted_throughput_per_s"] < base.rows[0]["predicted_throughput_per_s"]
    assert what_if.catalog_fingerprint != base.catalog_fingerprint
    faster = validate("train", root=fixtures_root, ids=[SMALL], variants=["spec"], cache_dir=tmp_path / "c",
                      overrides={"stacks.fixture_megatron.launch_overhead_ms.a10g": 0.0})
    assert faster.rows[0]["predicted_throughput_per_s"] > base.rows[0]["predicted_throughput_per_s"]


def test_the_report_calls_model_what_summary_json_the_gate_and_the_ledger_call_model(fixtures_root, tmp_path):
    """"model" is hops.provenance's fingerprint (code + catalog); the catalog's own hash is labelled catalog."""
    from hops.provenance import model_fingerprint

    what_if = ["stacks.fixture_megatron.k_floor_ms.a10g=3.0"]
    report = validate("train", root=fixtures_root, ids=[SMALL], variants=["spec"], cache_dir=tmp_path / "c",
                      overrides=what_if)
    first = report.text().splitlines()[0]
    assert f"model {model_fingerprint(what_if)} (catalog {Catalog.load(what_if).fingerprint()})" in first
    assert model_fingerprint(what_if) != Catalog.load(what_if).fingerprint()


def test_bad_override_path_fails_before_work():
    with pytest.raises(CatalogError):
        validate("train", root="/definitely/not/here", overrides=["model.no_such_constant=1"])


# --------------------------------------------------------------------------- groups
EXPECTED_FAMILY = {
    "exp2_8_h100_pair_pp2_run105": "h100", "exp2_22_h100_pair_gpipe_run165": "h100",
    "exp2_13_a10g_pair_pp2_run135": "a10g", "exp2_14_l4_pair_pp2_run137": "l4",
    "exp2_17_a10g_l4_pair_pp2_run147": "g_family", "exp2_9_g_only_pp4_run107": "g_family",
    "exp2_15_h100_a10g_pair_pp2_run139": "mixed", "exp2_1_all_nodes_run93": "mixed",
    "exp2_19_mixed_pp3_l4_a10g_h100_run153": "mixed",
}


def test_group_assignment_on_real_fixtures(fixtures_root):
    fx = {f.id: f for f in list_fixtures(fixtures_root, "train")}
    assert len(fx) == 36
    for fid, family in EXPECTED_FAMILY.items():
        assert fx[fid].device_family == family, fid
    assert fx["exp2_10_all_nodes_gpipe_run97"].schedule == "gpipe"
    assert fx["exp2_11_all_nodes_zero_bubble_run101"].schedule == "zero_bubble"
    assert fx["exp2_1_all_nodes_run93"].schedule == "1f1b"
    assert fx["exp2_29_all_nodes_batch24_run181"].groups() == {
        "device_family": "mixed", "schedule": "1f1b", "pipeline_depth": "6", "microbatches": "24"}
    assert fx["exp2_20_mixed_pp5_h100_g4_run157"].depth == 5
    counts = {}
    for f in fx.values():
        counts[f.device_family] = counts.get(f.device_family, 0) + 1
    assert counts == {"h100": 3, "a10g": 1, "l4": 1, "g_family": 7, "mixed": 24}


def test_group_aggregates_partition_the_suite(fixtures_root, tmp_path):
    ids = list(EXPECTED_FAMILY)
    rep = validate("train", root=fixtures_root, ids=ids, variants=["spec"], cache_dir=tmp_path / "c")
    groups = rep.groups()
    assert set(groups) == {"device_family", "schedule", "pipeline_depth", "microbatches"}
    assert set(groups["device_family"]) == {"h100", "a10g", "l4", "g_family", "mixed"}
    for labels in groups.values():
        assert sum(per["spec"]["n"] for per in labels.values()) == len(ids)
    assert groups["device_family"]["h100"]["spec"]["n"] == 2


# --------------------------------------------------------------------------- JSON contract
def test_json_output_schema(fixtures_root, tmp_path):
    out = tmp_path / "report.json"
    proc = subprocess.run([sys.executable, "-m", "autoresearch", "validate", "--split", "train", "--fixture", SMALL,
                           SIX, "--fixtures", str(fixtures_root), "--json", str(out)],
                          cwd=REPO, capture_output=True, text=True, env={**os.environ, "HOPS_CACHE": str(tmp_path / "c")})
    assert proc.returncode == 0, proc.stderr
    assert "aggregates" in proc.stdout and SMALL in proc.stdout

    def no_nan(token):
        raise AssertionError(f"non-JSON number {token} in output")

    doc = json.loads(out.read_text(), parse_constant=no_nan)
    assert set(doc) == {"split", "aggregates", "groups", "fixtures"}
    assert doc["split"] == "train"
    agg_keys = {"mape", "bubble_mae_pp", "rho_mean", "n"}
    assert set(doc["aggregates"]) == {"spec", "link_calibrated", "replay"}
    for agg in doc["aggregates"].values():
        assert set(agg) == agg_keys and agg["n"] == 2 and isinstance(agg["n"], int)
    assert set(doc["groups"]) == {"device_family", "schedule", "pipeline_depth", "microbatches"}
    for labels in doc["groups"].values():
        for per_variant in labels.values():
            for agg in per_variant.values():
                assert set(agg) == agg_keys
    assert len(doc["fixtures"]) == 6
    for row in doc["fixtures"]:
        assert set(row) == {"id", "variant", "measured_throughput_per_s", "predicted_throughput_per_s",
                            "throughput_error_pct", "bubble_pp_delta", "util_spearman_rho", "phase_breakdown"}
        for key in ("measured_throughput_per_s", "predicted_throughput_per_s", "throughput_error_pct",
                    "bubble_pp_delta"):
            assert isinstance(row[key], float)
        assert row["util_spearman_rho"] is None or -1.0 <= row["util_spearman_rho"] <= 1.0
        stages = 2 if row["id"] == SMALL else 6
        assert len(row["phase_breakdown"]) == stages * 5
        for p in row["phase_breakdown"]:
            assert set(p) == {"stage", "phase", "measured_ms", "predicted_ms"}
            assert p["phase"] in ("F", "BW", "OPT", "iter_end", "pipe_idle")


# --------------------------------------------------------------------------- speed machinery
def test_revalidation_reuses_parsed_traces(fixtures_root, tmp_path, monkeypatch):
    ids = [SMALL, SIX]
    validate("train", root=fixtures_root, ids=ids, cache_dir=tmp_path / "c")
    calls = []
    real = validate_mod.load_trace
    monkeypatch.setattr(validate_mod, "load_trace", lambda *a, **k: calls.append(a) or real(*a, **k))
    again = validate("train", root=fixtures_root, ids=ids, cache_dir=tmp_path / "c", overrides=["stacks.fixture_megatron.k_floor_ms.l4=1.0"])
    assert calls == [] and len(again.rows) == 6


def test_parallel_jobs_give_identical_rows(fixtures_root, tmp_path):
    ids = [SMALL, SIX, "exp2_14_l4_pair_pp2_run137"]
    validate_mod.clear_memo()
    one = validate("train", root=fixtures_root, ids=ids, cache_dir=tmp_path / "c", jobs=1)
    validate_mod.clear_memo()
    two = validate("train", root=fixtures_root, ids=ids, cache_dir=tmp_path / "c", jobs=2)
    assert one.to_json() == two.to_json()


# --------------------------------------------------------------------------- user errors
def run_cli(*args, env_extra=None):
    env = {k: v for k, v in os.environ.items() if k != "HOPS_FIXTURES"}
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-m", "autoresearch", *args], cwd=REPO, capture_output=True, text=True,
                          env=env)


@pytest.fixture
def empty_root(tmp_path) -> Path:
    (tmp_path / "train" / "cluster_results").mkdir(parents=True)
    return tmp_path


@pytest.mark.parametrize("args, needle", [
    (["--set", "model.no_such_constant=1"], "no_such_constant"),
    (["--set", "devices.a10g.memory_bandwidth_gbps=fast"], "expected a number"),
    (["--set", "devices.a10g.memory_bandwidth_gbps="], "expected a value after '='"),
    (["--fixture", "exp_nope"], "unknown fixture id 'exp_nope'"),
    (["--variant", "oracle"], "unknown variant 'oracle'"),
    (["--split", "nosuchsplit"], "split 'nosuchsplit' not found"),
    (["--jobs", "two"], "argument --jobs: expected an integer >= 0, got 'two'"),
])
def test_cli_user_errors_are_one_line_exit_2(empty_root, args, needle):
    base = ["validate", "--fixtures", str(empty_root)]
    if "--split" not in args:
        base += ["--split", "train"]
    proc = run_cli(*base, *args)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert needle in lines[0] and "Traceback" not in proc.stderr


def test_cli_missing_root_is_one_line_exit_2(tmp_path):
    proc = run_cli("validate", "--split", "train", "--fixtures", str(tmp_path / "missing"))
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1 and "is not a directory" in proc.stderr


def test_a_fixture_root_without_splits_says_how_to_point_at_the_data(tmp_path):
    """A fresh clone's ./fixtures holds only its README: the way to the data is HOPS_FIXTURES or --fixtures."""
    (tmp_path / "fixtures").mkdir()
    (tmp_path / "fixtures" / "README.md").write_text("fixture data lives outside the repo\n")
    env = {k: v for k, v in os.environ.items() if k != "HOPS_FIXTURES"}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    proc = subprocess.run([sys.executable, "-m", "autoresearch", "validate", "--split", "train"], cwd=tmp_path,
                          capture_output=True, text=True, env=env)
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()
    assert "split 'train' not found" in line and "HOPS_FIXTURES" in line and "--fixtures ROOT" in line


def test_fixture_root_resolution_order(tmp_path, monkeypatch):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    monkeypatch.setenv("HOPS_FIXTURES", str(b))
    assert resolve_root(str(a)) == a
    assert resolve_root(None) == b
    monkeypatch.delenv("HOPS_FIXTURES")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FixtureError, match="default ./fixtures"):
        resolve_root(None)
    (tmp_path / "fixtures").mkdir()
    assert resolve_root(None) == Path("fixtures")


def test_unknown_variant_api_error():
    with pytest.raises(VariantError):
        validate("train", root="/nowhere", variants=["oracle"])
