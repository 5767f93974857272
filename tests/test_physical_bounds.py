"""Physically impossible scenarios are refused, not simulated into inf, NaN or negative metrics.

Every input below passes its own field check (finite, in range), but what the engine derives
from it is not a time or a size any machine has: `compute.tflop: 1e308` made the makespan
inf, the bubble NaN and the throughput 0, and `hops.run` exited 0 printing `bubble nan %`.
Each case must now be one error naming the field and the derived value, through the API
and the CLI (one line, exit code 2, no summary.json).
"""
from __future__ import annotations

import copy
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import hops
from builders import pipeline
from hops.errors import ScenarioError
from hops.metrics import share
from hops.model.physical import MAX_DURATION_MS

REPO = Path(__file__).resolve().parent.parent
PAIR = yaml.safe_load((REPO / "conf" / "scenario" / "h100_pair.yaml").read_text())


def pair(**edits) -> dict:
    """conf/scenario/h100_pair.yaml with `path.to.key=value` edits (a list index is a number)."""
    doc = copy.deepcopy(PAIR)
    for path, value in edits.items():
        node = doc
        keys = [int(k) if k.isdigit() else k for k in path.split("__")]
        for k in keys[:-1]:
            node = node[k] if isinstance(k, int) else node.setdefault(k, {})
        node[keys[-1]] = value
    return doc


# (edits, the field the error names, what it says the derived value is)
IMPOSSIBLE = [
    ({"pipeline__stages__1__compute__tflop": 1e308}, "pipeline.stages[1].compute", "is inf ms"),
    # 1e308 MB at 2000 GB/s is 5e+304 ms, of which the forward waits on the share its MLP
    # hand-overs cannot keep in the H100's 50 MB of L2 (compute.mlp_handover_l2_miss): 0.609
    ({"pipeline__stages__1__compute__memory_mb": 1e308}, "pipeline.stages[1].compute", "is 3.04687e+304 ms"),
    ({"pipeline__stages__0__compute__tflop": 1e200}, "pipeline.stages[0].compute", "tflop=1e+200"),
    ({"pipeline__stages__0__layers": 1e300}, "pipeline.stages[0].compute", "layers=1e+300"),
    ({"overrides__devices__h100_0__peak_tflops": 1e-300}, "pipeline.stages[0].compute", "1e-300 TFLOP/s"),
    ({"overrides__devices__h100_1__slowdown": 1e300}, "pipeline.stages[1].compute", "slowdown 1e+300"),
    ({"pipeline__activation_mb": 1e308}, "pipeline.activation_mb", "transfer on h100_0->h100_1"),
    ({"optimizer__step_ms": 1e300}, "optimizer.step_ms", "optimizer step is 1e+300 ms"),
    ({"pipeline__stages__0__weights_mb": 1e308}, "pipeline.stages[0]", "holds inf MB"),
    ({"pipeline__stages__1__activation_memory_mb": 1e300}, "pipeline.stages[1]", "MB at its peak"),
    ({"pipeline__host_overhead": {"kind": "constant", "ms": 1e300}}, "pipeline.host_overhead", "1e+300 ms"),
]


@pytest.mark.parametrize("edits,field_,says", IMPOSSIBLE, ids=[next(iter(e)) for e, _, _ in IMPOSSIBLE])
def test_an_impossible_derived_value_is_refused_by_the_api(edits, field_, says):
    with pytest.raises(ScenarioError) as info:
        hops.simulate(pair(**edits))
    msg = str(info.value)
    assert info.value.path == field_ and says in msg, msg
    assert "\n" not in msg and "physically impossible" in msg


def test_a_distribution_whose_draws_overflow_is_refused():
    """A finite mean with a tail past any real step: the drawn times are checked, not only the mean."""
    doc = pipeline(2, 4)
    doc["pipeline"]["stages"][1]["compute"]["forward"] = {"kind": "normal", "mean_ms": 1e9, "std_ms": 1e14}
    with pytest.raises(ScenarioError) as info:
        hops.simulate(doc)
    assert info.value.path == "pipeline.stages[1].compute" and "a drawn F time" in str(info.value), info.value


def test_the_bound_is_inclusive_of_real_runs_and_far_below_overflow():
    """A ten-year step is accepted (the horizon's own bound); a run of such steps still has finite metrics."""
    doc = pipeline(2, 2, f=MAX_DURATION_MS / 2, b=MAX_DURATION_MS)
    s = hops.simulate(doc).summary
    assert math.isfinite(s["makespan_ms"]) and 0.0 <= s["bubble_ratio"] <= 1.0
    doc = pipeline(2, 2, f=MAX_DURATION_MS * 1.01)
    with pytest.raises(ScenarioError, match=r"pipeline.stages\[0\].compute: the forward time"):
        hops.simulate(doc)


def test_the_cli_refuses_an_overflowing_scenario_with_one_line_and_no_summary(tmp_path):
    scenario = tmp_path / "overflow.yaml"
    scenario.write_text(yaml.safe_dump(pair(pipeline__stages__1__compute__tflop=1e308)))
    run_dir = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    proc = subprocess.run([sys.executable, "-m", "hops.run", f"scenario_file={scenario}", f"hydra.run.dir={run_dir}"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=180)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-2000:]
    assert "pipeline.stages[1].compute" in lines[0] and "tflop=1e+308" in lines[0] and "inf ms" in lines[0]
    assert str(scenario) in lines[0]  # names the file too
    assert "nan" not in proc.stdout and not (run_dir / "summary.json").exists()


@pytest.mark.parametrize("raw,clamped", [(-2.220446049250313e-16, 0.0), (1.0000000000000002, 1.0), (0.25, 0.25),
                                         (0.0, 0.0), (1.0, 1.0), (-0.01, -0.01), (1.5, 1.5)])
def test_rounding_strays_of_a_share_are_clamped_and_real_errors_are_not(raw, clamped):
    """1 - busy/window is -2.2e-16 for a stage busy the whole window: reported as 0. A stray
    beyond rounding (-0.01) is a bug and stays visible."""
    assert share(raw) == clamped


def test_no_reported_share_leaves_zero_to_one_across_schedules():
    for schedule in ("gpipe", "1f1b", "zero_bubble", "hops_hetero"):
        s = hops.simulate(pipeline(4, 8, f=1 / 3, b=2 / 3, schedule=schedule, hop_ms=0.1)).summary
        shares = [s["bubble_ratio"], *s["bubble_per_stage"], *s["idle_breakdown"].values(),
                  *(v for group in s["utilization"].values() for v in group.values())]
        assert all(0.0 <= v <= 1.0 for v in shares), (schedule, shares)


LLAMA = yaml.safe_load((REPO / "conf" / "scenario" / "llama3_405b_54d.yaml").read_text())


@pytest.mark.parametrize("path,value,says", [
    (("components", 5, "mtbf_hours"), 1e-308, "failure.components[5].mtbf_hours: inf fault events expected"),
    (("checkpoint", "interval_minutes"), 1e308, "failure.checkpoint.interval_minutes: this time is inf ms"),
    (("checkpoint", "restart_minutes"), 1e300, "failure.checkpoint.restart_minutes: this time is 6e+304 ms"),
    (("stragglers", "throttling", "rate_per_hour"), 1e300, "failure.stragglers.throttling.rate_per_hour: "),
])
def test_an_impossible_failure_horizon_is_refused(path, value, says):
    """An MTBF of 1e-308 h or a checkpoint interval of 1e308 min crashed the horizon with
    OverflowError (a traceback) or tried to draw more failures than memory holds."""
    doc = copy.deepcopy(LLAMA)
    node = doc["failure"]
    for k in path[:-1]:
        node = node[k] if isinstance(k, int) else node.setdefault(k, {})
    node[path[-1]] = value
    with pytest.raises(ScenarioError) as info:
        hops.simulate(doc)
    assert str(info.value).startswith(says) and "\n" not in str(info.value), str(info.value)
