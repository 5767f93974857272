"""Specifications for the noise floor: archive duplicates against train runs of the same configuration.

Measured values only: the spread must equal what hops.metrics computes from the two traces directly.
"""
import math

import pytest

from autoresearch.__main__ import main
from autoresearch.noise import Noise, Pair, annotate, config_key, noise
from hops.metrics import summarize
from hops.traces import load_trace

TRAIN = ("exp2_9_g_only_pp4_run107", "exp2_8_h100_pair_pp2_run105")
ARCHIVE = ("exp2_9_g_only_pp4_run65", "exp2_8_h100_pair_pp2_run63", "exp1_1_all_nodes_run15")


@pytest.fixture(scope="module")
def root(fixtures_root, tmp_path_factory):
    r = tmp_path_factory.mktemp("noise")
    for split, ids in (("train", TRAIN), ("archive", ARCHIVE)):
        for fid in ids:
            d = r / split / "cluster_results" / fid
            d.parent.mkdir(parents=True, exist_ok=True)
            d.symlink_to(fixtures_root / split / "cluster_results" / fid)
    return r


def test_pairs_are_archive_runs_of_a_train_configuration_measured_by_the_metrics_code(root):
    n = noise(root)
    assert {(p.archive, p.train) for p in n.pairs} == {(ARCHIVE[0], TRAIN[0]), (ARCHIVE[1], TRAIN[1])}
    assert n.unpaired == ["exp1_1_all_nodes_run15"]
    for p in n.pairs:
        a = summarize(load_trace(root / "archive" / "cluster_results" / p.archive))
        t = summarize(load_trace(root / "train" / "cluster_results" / p.train))
        thr_a, thr_t = a["throughput"]["microbatches_per_s"], t["throughput"]["microbatches_per_s"]
        assert p.throughput_pct == pytest.approx((thr_a - thr_t) / thr_t * 100)
        assert p.bubble_pp == pytest.approx((a["bubble_ratio"] - t["bubble_ratio"]) * 100)
    assert n.throughput_pct_mean == pytest.approx(sum(abs(p.throughput_pct) for p in n.pairs) / 2)
    assert 0 < n.throughput_pct_mean < 10 and 0 <= n.bubble_pp_mean < 5, "duplicates of a config agree closely"
    assert config_key("exp2_9_g_only_pp4_run65") == config_key("exp2_9_g_only_pp4_run107") == "exp2_9_g_only_pp4"


def test_noise_command_prints_every_pair_and_the_means(root, capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'l.db'}")
    assert main(["noise", "--fixtures", str(root), "--json", str(tmp_path / "noise.json")]) == 0
    out = capsys.readouterr().out
    assert "exp2_9_g_only_pp4" in out and "exp2_8_h100_pair_pp2" in out and "mean |spread|" in out
    assert "exp1_1_all_nodes_run15" in next(x for x in out.splitlines() if x.startswith("no train run"))
    assert out.splitlines()[-1].startswith("exp2_8_h100_pair_pp2_run105") and "3/18" in out.splitlines()[-1], \
        "the train runs' slow iterations close the report"
    assert (tmp_path / "noise.json").read_text().count('"archive"') == 2
    assert main(["noise", "--fixtures", str(tmp_path / "none")]) == 2


def test_gate_violations_are_printed_beside_the_noise_band():
    n = Noise([Pair("exp2_9_g_only_pp4", "exp2_9_g_only_pp4_run65", "exp2_9_g_only_pp4_run107", 9.0, 10.0, 0.3, 0.29)])
    v = ["exp2_9_g_only_pp4_run107: spec |throughput error| 1.00% -> 4.00% (+3.00) exceeds the 2 tolerance",
         "exp2_33_all_nodes_seq4096_run197: spec |bubble delta| 1.00 pp -> 4.00 pp (+3.00) exceeds the 2 tolerance",
         "spec: aggregate MAPE 10.000 -> 11.000 (higher is worse; allowed 0)"]
    out = annotate(v, n)
    assert out[0].endswith("[run-to-run noise of this config: 10.00 % thr, 1.00 pp bubble]")
    assert "no duplicate of this config; suite noise mean 10.00 % thr" in out[1]
    assert out[2] == v[2], "aggregate violations carry no per-config band"
    assert annotate(v, None) == v and not math.isnan(n.bubble_pp_mean)


TWINS = ("exp2_1_all_nodes_run93", "exp2_10_all_nodes_gpipe_run97", "exp2_11_all_nodes_zero_bubble_run101")


def test_same_job_twins_are_train_runs_that_differ_only_in_a_schedule_label_the_job_ignored(fixtures_root, tmp_path):
    for split, ids in (("train", TWINS + ("exp2_9_g_only_pp4_run107",)), ("archive", ("exp2_9_g_only_pp4_run65",))):
        for fid in ids:
            d = tmp_path / split / "cluster_results" / fid
            d.parent.mkdir(parents=True, exist_ok=True)
            d.symlink_to(fixtures_root / split / "cluster_results" / fid)
    n = noise(tmp_path)
    assert {(t.reference, t.other) for t in n.twins} == {(TWINS[0], TWINS[1]), (TWINS[0], TWINS[2])}, \
        "the 1f1b-labelled run is the reference; exp2_9 is another job"
    ref = summarize(load_trace(tmp_path / "train" / "cluster_results" / TWINS[0]))["throughput"]["microbatches_per_s"]
    for t in n.twins:
        other = summarize(load_trace(tmp_path / "train" / "cluster_results" / t.other))["throughput"]["microbatches_per_s"]
        assert t.throughput_pct == pytest.approx((other - ref) / ref * 100)
    zb = next(t for t in n.twins if t.other == TWINS[2])
    assert n.band(TWINS[2])[0] == pytest.approx(abs(zb.throughput_pct)), "a twin's spread joins the run's band"
    assert abs(zb.throughput_pct) > 2, "exp2_11 runs >2 % slower than its 1f1b twin: the gate's tolerance is below it"
    assert n.metrics()["noise.twins"] == 2.0


def test_a_run_whose_trace_executed_another_order_is_not_a_twin(tmp_path):
    import json

    from tests.fixture_builders import make_fixture

    make_fixture(tmp_path, "archive", "job_a_run0")
    make_fixture(tmp_path, "train", "job_a_run1")
    other = make_fixture(tmp_path, "train", "job_b_run2")
    scen = other / "hops.base.yaml"
    scen.write_text(scen.read_text().replace("schedule: 1f1b", "schedule: gpipe"))
    rank0 = other / "megatron_trace" / "rank0.jsonl"
    events = [json.loads(line) for line in rank0.read_text().splitlines()]
    for e in events:  # stage 0 runs microbatch 1's forward before microbatch 0's backward: GPipe's order
        if e["phase"] == "FORWARD" and e["microbatch"] == 1:
            shift = 8.0 - 2.0
            e["start_wall_ns"] -= int(shift * 1e6)
            e["end_wall_ns"] -= int(shift * 1e6)
    rank0.write_text("\n".join(json.dumps(e) for e in events) + "\n")
    n = noise(tmp_path)
    assert n.twins == [] and n.not_twins == [("job_a_run1", "job_b_run2")]


def test_a_slow_iteration_is_counted_with_what_it_adds_to_the_runs_mean_wall(tmp_path):
    import json

    from autoresearch.noise import slow_iterations
    from tests.fixture_builders import make_fixture

    d = make_fixture(tmp_path, "train", "job_a_run1")
    for rank in (d / "megatron_trace").glob("rank*.jsonl"):  # iteration 2 starts 13 ms late
        events = [json.loads(line) for line in rank.read_text().splitlines()]
        for e in events:
            if e["iteration"] >= 2:
                e["start_wall_ns"] += 13_000_000
                e["end_wall_ns"] += 13_000_000
        rank.write_text("\n".join(json.dumps(e) for e in events) + "\n")
    s = slow_iterations("job_a_run1", load_trace(d))
    # the builder's iterations are 26 ms apart and the last one ends 20 ms after its start
    walls = [26.0, 26.0 + 13.0, 26.0, 20.0]
    assert (s.iterations, s.slow) == (4, 1), "39 ms is more than 10 % over the median 26; 20 and 26 are not"
    assert s.added_pct == pytest.approx((sum(walls) / 4) / ((26 + 26 + 20) / 3) * 100 - 100, abs=1e-6)
    t = summarize(load_trace(d))
    assert t["throughput"]["microbatches_per_s"] == pytest.approx(4 * 2 / sum(walls) * 1e3, rel=1e-6), \
        "throughput is microbatches over the summed walls, so the slow wall's excess comes off it"


def test_a_throughput_violation_shows_the_runs_slow_iterations(fixtures_root, tmp_path):
    fid = "exp2_28_all_nodes_batch3_run177"
    for split, ids in (("train", (fid, TRAIN[0])), ("archive", ("exp2_9_g_only_pp4_run65",))):
        for f in ids:
            d = tmp_path / split / "cluster_results" / f
            d.parent.mkdir(parents=True, exist_ok=True)
            d.symlink_to(fixtures_root / split / "cluster_results" / f)
    n = noise(tmp_path)
    s = n.slow[fid]
    assert (s.iterations, s.slow) == (18, 6), "6 of the run's 18 iterations meet the p5 pair's ~175 ms stall"
    assert n.slow[TRAIN[0]].slow == 0, "a run without a p5 pair at its ends has no slow iteration"
    assert n.slow_share == pytest.approx(6 / 36)
    thr, bub = (f"{fid}: spec |throughput error| 1.00% -> 11.00% (+10.00) exceeds the 2 tolerance",
                f"{fid}: spec |bubble delta| 1.00 pp -> 4.00 pp (+3.00) exceeds the 2 tolerance")
    out = annotate([thr, bub], n)
    assert f"[6 of its 18 iterations slow, adding {s.added_pct:.1f} % to its mean wall" in out[0]
    assert "slow" not in out[1], "the count speaks to throughput, not to the bubble rule"
    assert 20 < s.added_pct < 30
