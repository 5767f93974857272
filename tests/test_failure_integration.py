"""hops.simulate with a failure section: stragglers reach the detailed run, faults the horizon."""
import copy

import pytest

import hops
from builders import pipeline


def with_failure(section):
    sc = pipeline(4, 8, batches=2)
    sc["failure"] = section
    return sc


def test_a_failure_section_with_zero_rates_changes_nothing_in_the_detailed_run(tmp_path):
    plain = hops.simulate(pipeline(4, 8, batches=2))
    quiet = hops.simulate(with_failure({"enabled": True, "horizon_hours": 24}))
    assert quiet.summary["failures"]["count"] == 0
    assert quiet.summary["throughput"] == plain.summary["throughput"]
    plain.write(tmp_path / "a")
    quiet.write(tmp_path / "b")
    assert (tmp_path / "a" / "events.csv").read_bytes() == (tmp_path / "b" / "events.csv").read_bytes()


def test_a_fixed_straggler_slows_its_stage_and_the_pipeline():
    plain = hops.simulate(pipeline(4, 8, batches=2)).summary
    slow = hops.simulate(with_failure({"enabled": True, "stragglers": {"fixed": {"g2": 1.5}}})).summary
    assert slow["stragglers"] == {"g2": 1.5}
    assert slow["makespan_ms"] > plain["makespan_ms"]


def test_faults_cost_goodput_and_are_reproducible():
    section = {"enabled": True, "horizon_hours": 24 * 7, "devices": {"count": 4096, "mtbf_hours": 20000},
               "checkpoint": {"interval_minutes": 30, "write_minutes": 0.5}}
    a = hops.simulate(with_failure(copy.deepcopy(section))).summary["failures"]
    b = hops.simulate(with_failure(copy.deepcopy(section))).summary["failures"]
    assert a == b
    assert a["count"] > 0 and 0 < a["goodput_ratio"] < 1


def data_parallel(sc, degree):
    sc["optimizer"] = {"enabled": True, "data_parallel": {"degree": degree, "interconnect": "nvlink"}}
    return sc


def test_a_data_parallel_job_fails_as_often_as_all_of_its_replicas_gpus():
    """Each replica's GPUs fail; any failure stops the synchronous job, so d replicas fail d times as often."""
    section = {"enabled": True, "horizon_hours": 24, "devices": {"mtbf_hours": 50000}}
    one = hops.simulate(data_parallel(with_failure(copy.deepcopy(section)), 1)).summary["failures"]
    eight = hops.simulate(data_parallel(with_failure(copy.deepcopy(section)), 8)).summary["failures"]
    assert one["job_mtbf_hours"] == pytest.approx(50000 / 4)  # the pipeline's 4 GPUs
    assert eight["job_mtbf_hours"] == pytest.approx(50000 / 32)  # ... and the 28 of its 7 other replicas


def test_a_given_device_count_still_says_how_large_the_job_is():
    section = {"enabled": True, "horizon_hours": 24, "devices": {"count": 1000, "mtbf_hours": 50000}}
    summary = hops.simulate(data_parallel(with_failure(section), 8)).summary["failures"]
    assert summary["job_mtbf_hours"] == pytest.approx(50000 / 1000)


def test_a_straggler_in_any_replica_slows_the_data_parallel_job():
    """Stragglers drawn on every replica's GPUs: at a 5 % chance per GPU, one pipeline of 4 GPUs
    usually has none, while 16 replicas (64 GPUs) almost always hold one, and the pipeline runs at
    the slowest copy's pace."""
    drawn = {"enabled": True, "stragglers": {"drawn": {"probability": 0.05, "factor_range": [1.5, 1.5]}}}
    hit = {d: 0 for d in (1, 16)}
    for seed in range(20):
        for degree in hit:
            sc = data_parallel(with_failure(copy.deepcopy(drawn)), degree)
            sc["simulation"]["seed"] = seed
            stragglers = hops.simulate(sc).summary["stragglers"]
            assert set(stragglers.values()) <= {1.5} and set(stragglers) <= {"g0", "g1", "g2", "g3"}
            hit[degree] += bool(stragglers)
    assert hit[1] <= 8 and hit[16] >= 18  # P(any of 4) = 0.19, P(any of 64) = 0.96


def test_replicas_only_add_stragglers_to_the_pipelines_own_draw():
    import numpy as np

    from hops.failures import parse_failure, replica_stragglers, straggler_factors

    cfg = parse_failure({"enabled": True, "stragglers": {"drawn": {"probability": 0.3}, "fixed": {"b": 1.02}}})
    ids = ["a", "b", "c"]
    own = straggler_factors(cfg, ids, np.random.default_rng(3))
    assert replica_stragglers(cfg, ids, 1, np.random.default_rng(3)) == own
    many = replica_stragglers(cfg, ids, 5, np.random.default_rng(3))
    assert all(many[d] >= own[d] for d in ids)


def test_a_gpus_copies_straggle_as_often_as_the_binomial_says():
    """At 1 % per GPU and 50 replicas a pipeline GPU has a straggling copy with probability
    1 - 0.99^50 = 0.395; its factor is the slowest copy's, within the drawn range. Drawn in
    closed form, so a degree of a million costs what a degree of two does."""
    import numpy as np

    from hops.failures import parse_failure, replica_stragglers

    cfg = parse_failure({"enabled": True, "stragglers": {"drawn": {"probability": 0.01, "factor_range": [1.1, 1.4]}}})
    ids = [f"g{i}" for i in range(4000)]
    factors = np.array(list(replica_stragglers(cfg, ids, 50, np.random.default_rng(0)).values()))
    slow = factors[factors > 1.0]
    assert abs(len(slow) / len(ids) - (1 - 0.99 ** 50)) < 0.03
    assert slow.min() >= 1.1 and slow.max() <= 1.4
    huge = replica_stragglers(cfg, ids[:8], 10 ** 6, np.random.default_rng(0))
    assert all(f > 1.0 for f in huge.values())  # 10^4 expected straggling copies of each GPU


def test_a_device_count_below_the_jobs_gpus_is_refused_naming_the_field():
    from hops.errors import ScenarioError

    sc = data_parallel(with_failure({"enabled": True, "devices": {"count": 7, "mtbf_hours": 50000}}), 2)
    with pytest.raises(ScenarioError, match=r"failure\.devices\.count: got 7; expected at least the job's 8 GPUs "
                                            r"\(4 in the pipeline x data-parallel degree 2\)"):
        hops.simulate(sc)


def test_a_goodput_ratio_never_exceeds_one():
    summary = hops.simulate(with_failure({"enabled": True, "stragglers": {"fixed": {"g2": 1.5}}})).summary
    assert summary["failures"]["goodput_ratio"] <= 1.0
