"""A suite is scored on every fixture it holds, against the run each fixture's scenario describes.

Specifications for the silent ways a suite used to change: a fixture directory
dropped for lacking its scenario, a scenario that describes a different run than
its trace, and a fixture without a link benchmark scored as link_calibrated
while being plain spec.
"""
import subprocess
import sys
from pathlib import Path

import pytest

from autoresearch.fixtures import FixtureError, list_fixtures
from autoresearch.validate import FixtureEvaluationError, validate

from fixture_builders import make_fixture

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def root(tmp_path) -> Path:
    make_fixture(tmp_path, "train", "run_a")
    make_fixture(tmp_path, "train", "run_b")
    return tmp_path


def test_a_fixture_directory_without_its_scenario_is_an_error_not_a_smaller_suite(root):
    (root / "train" / "cluster_results" / "run_b" / "hops.base.yaml").unlink()
    with pytest.raises(FixtureError, match=r"run_b: no hops\.base\.yaml"):
        list_fixtures(root, "train")
    with pytest.raises(FixtureError, match=r"run_b: no hops\.base\.yaml"):
        list_fixtures(root, "train", ids=["run_b"])
    assert [f.id for f in list_fixtures(root, "train", ids=["run_a"])] == ["run_a"]  # an intact one still runs


def test_a_stray_file_among_fixtures_is_an_error_but_hidden_entries_are_not(root):
    (root / "train" / "cluster_results" / ".DS_Store").write_text("x")
    assert len(list_fixtures(root, "train")) == 2
    (root / "train" / "cluster_results" / "run_c.tar").write_text("x")
    with pytest.raises(FixtureError, match=r"run_c\.tar: not a fixture directory"):
        list_fixtures(root, "train")


def test_the_cli_reports_a_dropped_fixture_in_one_line(root):
    (root / "train" / "cluster_results" / "run_b" / "hops.base.yaml").unlink()
    proc = subprocess.run([sys.executable, "-m", "autoresearch", "validate", "--split", "train",
                           "--fixtures", str(root)], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "run_b: no hops.base.yaml" in lines[0] and "Traceback" not in proc.stderr


@pytest.mark.parametrize("edit, words", [
    (("microbatches: 2", "microbatches: 4"), "simulation.microbatches is 4 but the trace has 2 per iteration"),
    (("    - {device: gpu_b", "    - {device: gpu_a, weights_mb: 10, compute: {mode: analytical, tflop: 0.01}}\n"
                            "    - {device: gpu_b"), "pipeline.stages has 3 stages but the trace"),
    (("    - {device: gpu_a", "    - {device: gpu_b"), "pipeline.stages[0].device is 'gpu_b' but the trace ran "
                                                     "stage 0 on 'gpu_a'"),
])
def test_a_scenario_that_disagrees_with_its_trace_is_an_error(root, tmp_path, edit, words):
    path = root / "train" / "cluster_results" / "run_b" / "hops.base.yaml"
    path.write_text(path.read_text().replace(*edit, 1))
    for variants in (["spec"], ["link_calibrated", "replay"]):
        with pytest.raises(FixtureEvaluationError) as err:
            validate("train", root=root, variants=variants, cache_dir=tmp_path / "cache")
        assert str(err.value).startswith("run_b: ") and words in str(err.value) and "hops.base.yaml" in str(err.value)


def test_the_check_holds_when_the_measured_side_is_memoised(root, tmp_path):
    validate("train", root=root, variants=["spec"], cache_dir=tmp_path / "cache")  # memoises run_b's trace
    path = root / "train" / "cluster_results" / "run_b" / "hops.base.yaml"
    path.write_text(path.read_text().replace("microbatches: 2", "microbatches: 3"))
    with pytest.raises(FixtureEvaluationError, match="simulation.microbatches is 3"):
        validate("train", root=root, variants=["spec"], cache_dir=tmp_path / "cache")


def test_a_fixture_without_link_bench_is_listed_as_spec(tmp_path):
    make_fixture(tmp_path, "train", "benched")
    make_fixture(tmp_path, "train", "bare", link_bench=False)
    rep = validate("train", root=tmp_path, cache_dir=tmp_path / "cache")
    assert "link_calibrated = spec (no link bench): bare" in rep.text()
    rows = {(r["id"], r["variant"]): r for r in rep.rows}
    assert rows[("bare", "link_calibrated")]["throughput_error_pct"] == rows[("bare", "spec")]["throughput_error_pct"]
    assert rows[("benched", "link_calibrated")]["throughput_error_pct"] != \
        rows[("benched", "spec")]["throughput_error_pct"]


def test_no_line_when_every_fixture_has_its_link_bench(root, tmp_path):
    assert "no link bench" not in validate("train", root=root, cache_dir=tmp_path / "cache").text()
