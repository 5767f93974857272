"""The held-out test split stays unread: listing, validating and importing all refuse it.

Everything here runs on a synthetic fixture root, so the guard is checked on
every machine, with or without real fixtures.
"""
import json
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from autoresearch.fixtures import list_fixtures
from autoresearch.validate import validate
from hops.traces import load_trace
from hops.traces.guard import (REFUSAL, CheckpointToken, SplitGuardError, check_fixture_dir, issue_checkpoint_token)

REPO = Path(__file__).resolve().parents[1]
T0 = 1_700_000_000_000_000_000
SCENARIO = """
simulation: {batches: 2, microbatches: 2, seed: 1}
pipeline:
  schedule: 1f1b
  activation_mb: 1.0
  stages:
    - {device: gpu_a, weights_mb: 10, compute: {mode: analytical, tflop: 0.01, memory_mb: 10}}
    - {device: gpu_b, weights_mb: 10, compute: {mode: analytical, tflop: 0.01, memory_mb: 10}}
hardware:
  devices: [{id: gpu_a, gpu: a10g, node: n0}, {id: gpu_b, gpu: a10g, node: n1}]
  interconnect: {same_node: pcie, cross_node: ethernet}
optimizer: {enabled: false}
failure: {enabled: false}
output: {}
"""


def _event(stage, it, mb, phase, start_ms, dur_ms):
    dev = ("gpu_a", "gpu_b")[stage]
    return {"stage": stage, "iteration": it, "microbatch": mb, "event_type": "compute", "phase": phase,
            "start_wall_ns": T0 + int(start_ms * 1e6), "end_wall_ns": T0 + int((start_ms + dur_ms) * 1e6),
            "device_id": dev}


def make_fixture(root: Path, split: str, fid: str) -> Path:
    """A complete, tiny 2-stage fixture: scenario, stage map, trace, link bench."""
    d = root / split / "cluster_results" / fid
    (d / "megatron_trace").mkdir(parents=True)
    (d / "calibration" / "link_bench").mkdir(parents=True)
    (d / "hops.base.yaml").write_text(SCENARIO)
    (d / "hops_trace_map.json").write_text(json.dumps({"stages": {"0": "gpu_a", "1": "gpu_b"}}))
    ranks = {0: [], 1: []}
    t = 0.0
    for it in range(4):
        for mb in range(2):
            ranks[0].append(_event(0, it, mb, "FORWARD", t, 1.0))
            ranks[1].append(_event(1, it, mb, "FORWARD", t + 1.5, 1.0))
            ranks[1].append(_event(1, it, mb, "BACKWARD", t + 2.5, 2.0))
            ranks[0].append(_event(0, it, mb, "BACKWARD", t + 5.0, 2.0))
            t += 8.0
        for s in (0, 1):
            ranks[s].append(_event(s, it, 1, "OPTIMIZER", t + 3.0, 1.0))
        t += 10.0
    for r, evs in ranks.items():
        (d / "megatron_trace" / f"rank{r}.jsonl").write_text("\n".join(json.dumps(e) for e in evs) + "\n")
    (d / "calibration" / "link_bench" / "pair_0_1.jsonl").write_text(
        json.dumps({"rank": 0, "size_mb": 1, "p50_ms": 0.5}) + "\n")
    return d


@pytest.fixture
def synthetic_root(tmp_path) -> Path:
    make_fixture(tmp_path, "train", "run_a")
    make_fixture(tmp_path, "test", "held_1")
    return tmp_path


def token():
    return issue_checkpoint_token(confirm_human=True, purpose="unit test")


def test_list_fixtures_refuses_test_split(synthetic_root):
    with pytest.raises(SplitGuardError) as err:
        list_fixtures(synthetic_root, "test")
    assert str(err.value) == REFUSAL
    assert "checkpoint --split test --confirm-human" in str(err.value)


def test_refusal_happens_before_touching_the_filesystem(tmp_path):
    # No test directory exists: the answer is still the guard, not "not found", so the
    # error does not even confirm whether a test split is present.
    with pytest.raises(SplitGuardError):
        list_fixtures(tmp_path / "nowhere", "test")


def test_token_opens_the_test_split(synthetic_root):
    assert [f.id for f in list_fixtures(synthetic_root, "test", token=token())] == ["held_1"]
    assert [f.id for f in list_fixtures(synthetic_root, "train")] == ["run_a"]


def test_other_splits_never_list_test_fixtures(synthetic_root):
    from autoresearch.fixtures import FixtureError

    with pytest.raises(FixtureError):
        list_fixtures(synthetic_root, "train", ids=["held_1"])


def test_validate_refuses_test_split(synthetic_root, tmp_path):
    with pytest.raises(SplitGuardError):
        validate("test", root=synthetic_root, cache_dir=tmp_path / "cache")


def test_validate_with_token_reads_test_split(synthetic_root, tmp_path):
    rep = validate("test", root=synthetic_root, cache_dir=tmp_path / "cache", token=token())
    assert {r["id"] for r in rep.rows} == {"held_1"}


def test_validate_runs_on_synthetic_train(synthetic_root, tmp_path):
    rep = validate("train", root=synthetic_root, cache_dir=tmp_path / "cache")
    assert {r["variant"] for r in rep.rows} == {"spec", "link_calibrated", "replay"}


def test_load_trace_refuses_test_fixture_dir(synthetic_root, tmp_path):
    with pytest.raises(SplitGuardError):
        load_trace(synthetic_root / "test" / "cluster_results" / "held_1", cache_dir=tmp_path / "c")


def test_load_trace_refusal_comes_before_the_cache(synthetic_root, tmp_path):
    # Parse with a token (fills the cache), then ask again without: still refused.
    d = synthetic_root / "test" / "cluster_results" / "held_1"
    load_trace(d, cache_dir=tmp_path / "c", token=token())
    with pytest.raises(SplitGuardError):
        load_trace(d, cache_dir=tmp_path / "c")


def test_load_trace_refuses_symlink_into_test(synthetic_root, tmp_path):
    link = tmp_path / "scratch_copy"
    link.symlink_to(synthetic_root / "test" / "cluster_results" / "held_1")
    with pytest.raises(SplitGuardError):
        load_trace(link, cache_dir=tmp_path / "c")


def test_load_trace_with_token_and_on_train(synthetic_root, tmp_path):
    tl = load_trace(synthetic_root / "test" / "cluster_results" / "held_1", cache_dir=tmp_path / "c", token=token())
    assert tl.n_stages == 2
    assert load_trace(synthetic_root / "train" / "cluster_results" / "run_a", cache_dir=tmp_path / "c").n_stages == 2


def test_a_directory_merely_named_test_elsewhere_is_not_held_out(tmp_path):
    d = make_fixture(tmp_path / "test", "train", "x")  # ROOT happens to be called "test"
    check_fixture_dir(d)


def test_tokens_cannot_be_forged_or_issued_without_confirmation():
    with pytest.raises(TypeError):
        CheckpointToken("sneaky")
    with pytest.raises(SplitGuardError):
        issue_checkpoint_token(confirm_human=False, purpose="x")
    with pytest.raises(SplitGuardError):
        check_fixture_dir("/r/test/cluster_results/a", token="not a token")
    restored = pickle.loads(pickle.dumps(token()))  # process pools ship tokens to workers
    check_fixture_dir("/r/test/cluster_results/a", token=restored)


def test_cli_refuses_test_split_with_one_line_and_exit_2(synthetic_root):
    proc = subprocess.run([sys.executable, "-m", "autoresearch", "validate", "--split", "test",
                           "--fixtures", str(synthetic_root)], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "held out" in lines[0] and "Traceback" not in proc.stderr
    assert proc.stdout == ""
