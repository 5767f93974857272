"""Deep pipelines: cost grows with the devices and links a run uses, and a too-deep one is refused at once.

Wall-time figures live in benchmarks/scale_bench.py. These specifications check
the shape instead, with numbers that do not depend on the machine: memory
allocated by the metrics as the pipeline deepens (tracemalloc), and the
ceiling's refusal happening before any per-stage work.
"""
import dataclasses
import tracemalloc

import pytest

import hops
from hops.errors import ScenarioError
from hops.engine.loop import MAX_STAGES
from hops.metrics import summarize
from hops.timeline import Timeline

from builders import pipeline


def chain_timeline(p: int, m: int = 2) -> Timeline:
    """p stages on p devices, every microbatch forward through all of them with a send per hop."""
    rows = {k: [] for k in ("kind", "stage", "device", "microbatch", "phase", "start_ms", "end_ms", "src", "dst",
                            "iteration")}

    def add(kind, s, mb, phase, t, src="", dst=""):
        for k, v in zip(rows, (kind, s, f"g{s}", mb, phase, t, t + 1.0, src, dst, 0)):
            rows[k].append(v)

    for mb in range(m):
        for s in range(p):
            add("compute", s, mb, "F", 2.0 * (s + mb))
            if s + 1 < p:
                add("transfer", s, mb, "F", 2.0 * (s + mb) + 1.0, f"g{s}", f"g{s + 1}")
        for s in reversed(range(p)):
            add("compute", s, mb, "BW", 2.0 * (2 * p - s + mb))
    return Timeline.from_rows(rows, stage_devices=[f"g{s}" for s in range(p)], microbatches_per_iteration=m)


def peak_bytes(fn) -> int:
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_per_link_utilization_names_exactly_the_links_used():
    s = summarize(chain_timeline(50))
    assert sorted(s["utilization"]["per_link"]) == sorted(f"g{i}->g{i + 1}" for i in range(49))


def test_metrics_memory_grows_linearly_with_pipeline_depth():
    small, large = chain_timeline(500), chain_timeline(2000)
    ratio = peak_bytes(lambda: summarize(large)) / peak_bytes(lambda: summarize(small))
    assert ratio < 6.0, f"4x the stages took {ratio:.1f}x the memory (linear ~4x, per-device-pair tables 16x)"


def test_a_pipeline_above_the_ceiling_is_refused_before_its_stages_are_parsed():
    doc = pipeline(MAX_STAGES + 1, 1)
    doc["pipeline"]["stages"][-1] = {"nonsense": True}  # never reached: the count alone decides
    with pytest.raises(ScenarioError) as err:
        hops.load_scenario(doc)
    msg = str(err.value)
    assert msg.startswith("pipeline.stages: ") and f"at most {MAX_STAGES}" in msg and "\n" not in msg


def test_simulate_refuses_a_too_deep_scenario_built_in_code():
    sc = hops.load_scenario(pipeline(2, 1))
    deep = dataclasses.replace(sc, stages=sc.stages * ((MAX_STAGES // 2) + 1))
    with pytest.raises(ScenarioError, match=f"at most {MAX_STAGES}"):
        hops.simulate(deep)


def test_the_ceiling_itself_is_allowed():
    hops.load_scenario(pipeline(MAX_STAGES, 1))
