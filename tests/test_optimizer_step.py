"""The optimizer step: streamed parameters over HBM when the model shape is known."""
import pytest

import hops
from builders import pipeline


def gpt(p=3, step_ms=None):
    sc = pipeline(p, 4, batches=2)
    sc["pipeline"]["model"] = {"hidden_dim": 1024, "seq_len": 1024, "tied_embeddings": False}
    for st in sc["pipeline"]["stages"]:
        st["compute"] = {"mode": "analytical", "tflop": 0.06, "memory_mb": 128}
    sc["optimizer"] = {"enabled": True} if step_ms is None else {"enabled": True, "step_ms": step_ms}
    return sc


def step_times(sc):
    tl = hops.simulate(sc).timeline
    opt = tl.select((tl.kind == "optimizer") & (tl.iteration == 0))
    return dict(zip(opt.stage.tolist(), (opt.end_ms - opt.start_ms).tolist()))


def test_step_time_follows_parameters_and_hbm_bandwidth():
    steps = step_times(gpt())
    catalog = hops.Catalog.load()
    m = catalog.constants("megatron_core")  # the default stack's step: HBM traffic + its own dispatch
    layers = 0.06e12 / (m["flops_per_layer_token_coeff"] * 1024 * 1024 ** 2)
    a100 = catalog.devices["a100"]
    middle = layers * 12 * 1024 ** 2 * m["optimizer_step_bytes_per_param"] / 1e6 / a100["memory_bandwidth_gbps"] \
        + m["optimizer_step_fixed_ms"]
    assert steps[1] == pytest.approx(middle)
    assert steps[0] > steps[1] and steps[2] > steps[1]  # embedding and LM-head stages carry V*h more


def test_explicit_step_times_win_per_stage():
    assert step_times(gpt(step_ms=[1.0, 2.0, 3.0])) == pytest.approx({0: 1.0, 1: 2.0, 2: 3.0})
    with pytest.raises(hops.ScenarioError, match=r"optimizer.step_ms: got 2 values; expected one per stage \(3\)"):
        hops.load_scenario(gpt(step_ms=[1.0, 2.0]))
