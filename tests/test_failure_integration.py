"""hops.simulate with a failure section: stragglers reach the detailed run, faults the horizon."""
import copy

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
