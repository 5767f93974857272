"""Failure model: determinism, the zero-rate identity, bounds on lost work, MTBF monotonicity, bad input."""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import yaml

from hops.errors import ScenarioError
from hops.failures import (parse_failure, simulate_horizon, straggler_factors, summary_block,
                           young_daly_interval_minutes)

ROOT = Path(__file__).resolve().parents[1]

BUSY = {  # every fault kind switched on
    "horizon_hours": 24 * 14,
    "devices": {"count": 4096, "per_node": 8, "mtbf_hours": 40000, "distribution": "weibull", "weibull_shape": 0.8},
    "components": [
        {"name": "software", "per": "job", "mtbf_hours": 30, "hardware": False},
        {"name": "host", "per": "node", "mtbf_hours": 60000},
        {"name": "switch", "per": "link", "mtbf_hours": 300000, "effect": "stall", "repair_minutes": 15},
    ],
    "planned": {"count": 6, "extra_minutes": 20},
    "links": {"mtbf_hours": 200000, "repair_minutes": 30,
              "degradation": {"rate_per_hour": 0.0005, "bandwidth_factor": 0.25, "duration_minutes": 20}},
    "stragglers": {"drawn": {"probability": 0.001, "factor_range": [1.05, 1.2]},
                   "throttling": {"rate_per_hour": 0.0002, "factor": 1.4, "duration_minutes": 10}},
    "checkpoint": {"interval_minutes": 30, "write_minutes": 1.0, "restart_minutes": 8, "detection_minutes": 3,
                   "replace_minutes": 20, "hot_spares": 2, "spare_repair_hours": 12},
}


def run(section, seed=7, iteration_ms=2500.0, **kw):
    return simulate_horizon(parse_failure(section), iteration_ms=iteration_ms, n_devices=8, seed=seed, **kw)


def accounting_closes(r):
    total = r.useful_ms + r.lost_work_ms + r.slowdown_ms + r.downtime_ms + r.checkpoint_overhead_ms
    return math.isclose(total, r.horizon_ms, rel_tol=1e-9)


# --------------------------------------------------------------------------- the four named tests
def test_fault_sequence_identical_per_seed():
    a, b, c = run(BUSY, seed=11), run(BUSY, seed=11), run(BUSY, seed=12)
    assert a.events == b.events and len(a.events) > 20
    assert json.dumps(summary_block(a)) == json.dumps(summary_block(b))
    assert np.array_equal(a.progress_iterations, b.progress_iterations)
    assert a.events != c.events
    # every kind of fault actually happened, so the identity above covers all streams
    assert {"device_failure", "job_failure", "link_failure", "planned", "link_degradation",
            "throttling"} <= set(a.counts_by_kind)
    # one stream per kind: changing one process leaves the other processes' draws alone
    other = json.loads(json.dumps(BUSY))
    other["components"][0]["mtbf_hours"] = 5
    d = run(other, seed=11)
    dev = lambda r: [e.t_ms for e in r.events if e.component == "device"]  # noqa: E731
    assert dev(a) == dev(d) and len(dev(a)) > 5


def test_zero_rates_equal_a_run_without_failures():
    zero = {"horizon_hours": 24 * 14, "devices": {"count": 4096},
            "components": [], "planned": {"count": 0},
            "links": {"degradation": {"rate_per_hour": 0}},
            "stragglers": {"drawn": {"probability": 0.0}, "throttling": {"rate_per_hour": 0}},
            "checkpoint": {"interval_minutes": 30}}
    r = run(zero)
    # a run without a failure section: the engine's steady state, uninterrupted for the horizon
    assert r.events == () and r.failure_count == 0 and dict(r.counts_by_kind) == {}
    assert r.iterations == pytest.approx(r.iterations_without_faults, rel=1e-12)
    assert r.throughput_with_faults == pytest.approx(r.throughput_without_faults, rel=1e-12)
    assert r.goodput_ratio == pytest.approx(1.0, rel=1e-12)
    assert r.downtime_ms == r.lost_work_ms == r.checkpoint_overhead_ms == r.slowdown_ms == 0.0
    b = summary_block(r)
    assert b["count"] == 0 and b["by_kind"] == {} and b["goodput_ratio"] == pytest.approx(1.0)
    # straggler draws with zero probability leave the detailed engine's compute untouched
    assert set(straggler_factors(parse_failure(zero), ["a", "b", "c"], seed=3).values()) == {1.0}
    # a disabled section is no failure model at all
    assert parse_failure({"enabled": False, **zero}) is None and parse_failure(None) is None
    # the only thing that separates a fault-free run from one without the section is a checkpoint
    # cost the user configured, and it costs exactly writes x write time
    zero["checkpoint"]["write_minutes"] = 0.5
    w = run(zero)
    assert w.events == () and w.lost_work_ms == 0.0 and w.downtime_ms == 0.0
    assert w.checkpoint_overhead_ms == pytest.approx(w.checkpoints * 30_000.0)
    assert w.goodput_ratio == pytest.approx(1.0 - w.checkpoint_overhead_ms / w.horizon_ms, rel=1e-9)
    assert accounting_closes(w)


@pytest.mark.parametrize("seed", range(5))
def test_lost_work_bounded_by_interval_plus_restart_per_failure(seed):
    r = run(BUSY, seed=seed)
    ck = parse_failure(BUSY).checkpoint
    interval_ms = r.checkpoint_every * r.iteration_ms  # the interval, rounded to whole iterations
    assert abs(interval_ms - ck.interval_minutes * 60_000) <= r.iteration_ms / 2
    restart_ms = (ck.detection_minutes + ck.restart_minutes + ck.replace_minutes) * 60_000
    restarts = [e for e in r.events if e.effect == "restart"]
    assert restarts
    for e in r.events:
        assert 0.0 <= e.lost_ms <= interval_ms + 1e-6
        if e.effect != "restart":
            assert e.lost_ms == 0.0
    assert r.lost_work_ms <= len(restarts) * (interval_ms + restart_ms)
    assert r.lost_work_ms == pytest.approx(sum(e.lost_ms for e in r.events))
    assert accounting_closes(r)


def test_goodput_falls_as_mtbf_falls():
    def goodput(mtbf):
        sec = {"horizon_hours": 24 * 30, "devices": {"count": 16384, "mtbf_hours": mtbf},
               "checkpoint": {"interval_minutes": 20, "write_minutes": 0.5, "restart_minutes": 10,
                              "detection_minutes": 2}}
        return np.mean([run(sec, seed=s, iteration_ms=6000.0).goodput_ratio for s in range(4)])

    g = [goodput(m) for m in (2e6, 5e5, 1e5, 3e4, 1e4)]
    assert all(a > b for a, b in zip(g, g[1:])), g
    assert g[0] > 0.95 and g[-1] < 0.6


# --------------------------------------------------------------------------- more behaviour
def test_hot_spares_shorten_restart():
    sec = json.loads(json.dumps(BUSY))
    no_spares = run({**sec, "checkpoint": {**sec["checkpoint"], "hot_spares": 0}})
    spares = run({**sec, "checkpoint": {**sec["checkpoint"], "hot_spares": 8}})
    assert [(e.t_ms, e.kind) for e in no_spares.events] == [(e.t_ms, e.kind) for e in spares.events]
    assert spares.downtime_ms < no_spares.downtime_ms and spares.goodput_ratio > no_spares.goodput_ratio


def test_checkpoint_interval_has_an_interior_optimum_near_young_daly():
    sec = {"horizon_hours": 24 * 20, "devices": {"count": 16384, "mtbf_hours": 80000},
           "checkpoint": {"write_minutes": 1.0, "restart_minutes": 5, "detection_minutes": 1}}
    cfg = parse_failure(sec)
    grid = [2, 5, 10, 20, 30, 45, 70, 120, 240]
    g = [np.mean([simulate_horizon(cfg, iteration_ms=5000.0, n_devices=8, seed=s,
                                   checkpoint_interval_minutes=iv).goodput_ratio for s in range(6)]) for iv in grid]
    best = grid[int(np.argmax(g))]
    yd = young_daly_interval_minutes(1.0, 80000 / 16384)
    assert 2 < best < 240 and yd / 2 <= best <= yd * 2, (best, yd, g)


def test_stragglers_and_episodes_slow_the_job():
    base = {"horizon_hours": 48, "devices": {"count": 1024}}
    clean = run(base)
    slow = run({**base, "stragglers": {"throttling": {"rate_per_hour": 0.002, "factor": 2.0,
                                                      "duration_minutes": 30}}})
    assert slow.slowdown_ms > 0 and slow.goodput_ratio < clean.goodput_ratio and accounting_closes(slow)
    fixed = run({**base, "stragglers": {"fixed": {"d0": 1.25}}})
    assert fixed.straggler_slowdown == 1.25 and fixed.goodput_ratio == pytest.approx(1 / 1.25)
    f = straggler_factors(parse_failure({"stragglers": {"fixed": {"d1": 1.5},
                                                        "drawn": {"probability": 1.0, "factor_range": [1.1, 1.2]}}}),
                          ["d0", "d1"], seed=1)
    assert f["d1"] == 1.5 and 1.1 <= f["d0"] <= 1.2
    with pytest.raises(ScenarioError, match=r"failure\.stragglers\.fixed\.nope"):
        straggler_factors(parse_failure({"stragglers": {"fixed": {"nope": 1.2}}}), ["d0"], seed=1)


def test_long_horizon_is_fast():
    import time

    cfg = parse_failure(yaml.safe_load((ROOT / "conf/scenario/llama3_405b_54d.yaml").read_text())["failure"])
    t = time.perf_counter()
    r = simulate_horizon(cfg, iteration_ms=6740.0, n_devices=16, seed=405)
    assert time.perf_counter() - t < 5.0
    b = summary_block(r)
    assert {"count", "by_kind", "downtime_ms", "lost_work_ms", "checkpoint_overhead_ms", "goodput_ratio"} <= set(b)
    assert 380 <= b["interruptions"]["unexpected"] <= 460 and b["interruptions"]["planned"] == 47
    assert 0.85 < b["goodput_ratio"] < 0.95


def test_progress_plot(tmp_path):
    pytest.importorskip("matplotlib")
    from hops.outputs.plots.progress import plot_progress

    out = plot_progress(run(BUSY), tmp_path / "progress.png")
    assert out.stat().st_size > 10_000


# --------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("section, path, words", [
    ({"devices": {"mtbf_hours": -5}}, "failure.devices.mtbf_hours", "> 0"),
    ({"devices": {"mtbf_hours": 0}}, "failure.devices.mtbf_hours", "> 0"),
    ({"devices": {"mtbf_hours": {"h100": 0}}}, "failure.devices.mtbf_hours.h100", "> 0"),
    ({"components": [{"name": "gpu", "mtbf_hours": 0}]}, "failure.components[0].mtbf_hours", "> 0"),
    ({"links": {"mtbf_hours": -1}}, "failure.links.mtbf_hours", "> 0"),
    ({"checkpoint": {"interval_minutes": 0}}, "failure.checkpoint.interval_minutes", "> 0"),
    ({"stragglers": {"drawn": {"probability": 1.5}}}, "failure.stragglers.drawn.probability", "[0, 1]"),
    ({"stragglers": {"drawn": {"probability": -0.1}}}, "failure.stragglers.drawn.probability", "[0, 1]"),
    ({"stragglers": {"fixed": {"dev3": 0.8}}}, "failure.stragglers.fixed.dev3", ">= 1"),
    ({"stragglers": {"drawn": {"factor_range": [0.9, 1.2]}}}, "failure.stragglers.drawn.factor_range[0]", ">= 1"),
    ({"stragglers": {"throttling": {"factor": 0.5}}}, "failure.stragglers.throttling.factor", ">= 1"),
    ({"links": {"degradation": {"bandwidth_factor": 1.5}}}, "failure.links.degradation.bandwidth_factor", "(0, 1]"),
    ({"devices": {"distribution": "gamma"}}, "failure.devices.distribution", "exponential, weibull"),
    ({"checkpoint": {"interval": 5}}, "failure.checkpoint.interval", "unknown key"),
    ({"planned": {"count": 2.5}}, "failure.planned.count", "integer"),
    ({"horizon_hours": "long"}, "failure.horizon_hours", "a number"),
    ({"enabled": "yes"}, "failure.enabled", "true or false"),
])
def test_bad_input_is_one_line_naming_the_field(section, path, words):
    with pytest.raises(ScenarioError) as info:
        parse_failure(section)
    msg = str(info.value)
    assert info.value.path == path
    assert msg.startswith(path + ":") and words in msg and "\n" not in msg


def test_scenario_file_loads_and_names_failure_fields():
    doc = yaml.safe_load((ROOT / "conf/scenario/llama3_405b_54d.yaml").read_text())
    assert set(doc) >= {"simulation", "pipeline", "hardware", "optimizer", "failure", "output"}
    cfg = parse_failure(doc["failure"])
    assert cfg.devices.count == 16384 and len(cfg.components) == 18 and cfg.planned.count == 47
    doc["failure"]["checkpoint"]["interval_minutes"] = 0
    with pytest.raises(ScenarioError, match=r"^failure\.checkpoint\.interval_minutes: got 0"):
        parse_failure(doc["failure"])
