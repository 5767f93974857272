"""The held-out test split stays unread: listing, validating and importing all refuse it.

Everything here runs on a synthetic fixture root, so the guard is checked on
every machine, with or without real fixtures.
"""
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from autoresearch.fixtures import list_fixtures
from autoresearch.validate import validate
from hops.traces import load_trace
from hops.traces.guard import (REFUSAL, CheckpointToken, SplitGuardError, check_fixture_dir, issue_checkpoint_token)

from fixture_builders import make_fixture

REPO = Path(__file__).resolve().parents[1]


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


# ---------------------------------------------------------------- every door, before anything is read
# An audit hook sees every open(), os.open(), listdir and scandir in the process, whatever
# library makes it (pathlib, numpy, yaml, hashlib readers): the spy cannot be bypassed by
# a code path that does not call builtins.open.
_WATCHED: list[tuple[str, list]] = []


def _audit(event, args):
    if not _WATCHED or event not in ("open", "os.listdir", "os.scandir") or not args:
        return
    target = args[0]
    if target is None or isinstance(target, int):
        return
    target = os.fsdecode(target)
    for full in {os.path.abspath(target), os.path.realpath(target)}:
        for prefix, hits in _WATCHED:
            if full == prefix or full.startswith(prefix + os.sep):
                hits.append((event, full))


sys.addaudithook(_audit)


@pytest.fixture
def nothing_under_test_is_read(synthetic_root):
    """Yields; afterwards asserts that no file or directory under ROOT/test was opened or listed."""
    hits: list = []
    entry = (os.path.realpath(synthetic_root / "test"), hits)
    _WATCHED.append(entry)
    yield
    _WATCHED.remove(entry)
    assert hits == [], f"read under the held-out split: {hits[:3]}"


def held(root: Path) -> Path:
    return root / "test" / "cluster_results" / "held_1"


def test_the_spy_sees_reads_under_test(synthetic_root):
    hits: list = []
    _WATCHED.append((os.path.realpath(synthetic_root / "test"), hits))
    try:
        load_trace(held(synthetic_root), token=token(), use_cache=False)
    finally:
        _WATCHED.pop()
    assert any(e == "open" and f.endswith("rank0.jsonl") for e, f in hits)


@pytest.mark.parametrize("split", ["test", "test/", "./test", "train/../test", "test/cluster_results", "TEST",
                                   "./train/../test/"])
def test_path_tricks_in_the_split_name_are_refused(synthetic_root, nothing_under_test_is_read, split):
    with pytest.raises(SplitGuardError):
        list_fixtures(synthetic_root, split)
    with pytest.raises(SplitGuardError):
        validate(split, root=synthetic_root, cache_dir=synthetic_root / "cache")


def test_a_split_directory_symlinked_to_test_is_refused(synthetic_root, nothing_under_test_is_read):
    (synthetic_root / "mirror").symlink_to(synthetic_root / "test")
    with pytest.raises(SplitGuardError):
        list_fixtures(synthetic_root, "mirror")


def test_a_fixture_symlinked_from_train_into_test_is_refused(synthetic_root, nothing_under_test_is_read):
    (synthetic_root / "train" / "cluster_results" / "borrowed").symlink_to(held(synthetic_root))
    with pytest.raises(SplitGuardError, match="borrowed"):
        list_fixtures(synthetic_root, "train")


def test_a_rank_file_symlinked_into_test_is_refused(synthetic_root, nothing_under_test_is_read):
    rank0 = synthetic_root / "train" / "cluster_results" / "run_a" / "megatron_trace" / "rank0.jsonl"
    rank0.unlink()
    rank0.symlink_to(held(synthetic_root) / "megatron_trace" / "rank0.jsonl")
    with pytest.raises(SplitGuardError, match="rank0.jsonl"):
        load_trace(rank0.parent.parent, use_cache=False)


def _doors():
    from autoresearch.fixtures import Fixture
    from autoresearch.variants import predict
    from hops import load_scenario, simulate
    from hops.model.hardware import Catalog
    from hops.traces import fit_link_bench, link_overrides
    from hops.traces.link_bench import bench_files
    from hops.traces.megatron import stage_map, trace_files

    return {
        "load_trace": lambda d: load_trace(d, use_cache=False),
        "trace_files (hashing)": trace_files,
        "stage_map": stage_map,
        "fit_link_bench": fit_link_bench,
        "link_overrides": link_overrides,
        "bench_files": bench_files,
        "predict(spec)": lambda d: predict("spec", Fixture("x", "train", d), Catalog.load()),
        "predict(link_calibrated)": lambda d: predict("link_calibrated", Fixture("x", "train", d), Catalog.load()),
        "Fixture.scenario_doc": lambda d: Fixture("x", "train", d).scenario_doc,
        "hops.simulate(hops.base.yaml)": lambda d: simulate(d / "hops.base.yaml"),
        "hops.load_scenario(hops.base.yaml)": lambda d: load_scenario(str(d / "hops.base.yaml")),
    }


def _spellings(root: Path) -> dict:
    link = root / "scratch_copy"
    if not link.exists():
        link.symlink_to(held(root))
    return {"plain": held(root), "dotdot": root / "train" / ".." / "test" / "cluster_results" / "held_1",
            "symlink": link, "relative": Path(os.path.relpath(held(root)))}


@pytest.mark.parametrize("door", list(_doors()))
@pytest.mark.parametrize("spelling", ["plain", "dotdot", "symlink", "relative"])
def test_every_door_refuses_a_held_out_fixture_before_reading_it(synthetic_root, nothing_under_test_is_read,
                                                                 door, spelling):
    target = _spellings(synthetic_root)[spelling]
    with pytest.raises(SplitGuardError) as err:
        _doors()[door](target)
    assert "held out" in str(err.value) and "\n" not in str(err.value)


def test_a_fixture_listed_with_the_token_carries_it_through_every_door(synthetic_root, tmp_path):
    from autoresearch.variants import predict
    from hops.model.hardware import Catalog

    (fx,) = list_fixtures(synthetic_root, "test", token=token())
    assert predict("link_calibrated", fx, Catalog.load()).summary["throughput"]["microbatches_per_s"] > 0


def _one_line_refusal(proc):
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "held out" in lines[0] and "Traceback" not in proc.stderr, proc.stderr


@pytest.mark.parametrize("split", ["./test", "train/../test", "test/"])
def test_cli_refuses_split_path_tricks_with_one_line(synthetic_root, split):
    proc = subprocess.run([sys.executable, "-m", "autoresearch", "validate", "--split", split,
                           "--fixtures", str(synthetic_root)], cwd=REPO, capture_output=True, text=True)
    _one_line_refusal(proc)


def test_run_app_refuses_a_held_out_scenario_file_with_one_line(synthetic_root, tmp_path):
    proc = subprocess.run([sys.executable, "-m", "hops.run", f"scenario_file={held(synthetic_root) / 'hops.base.yaml'}",
                           "output.plots=false", f"hydra.run.dir={tmp_path / 'out'}"],
                          cwd=REPO, capture_output=True, text=True)
    _one_line_refusal(proc)
    assert not (tmp_path / "out" / "summary.json").exists()
