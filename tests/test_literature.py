"""The literature benchmark measures what the sources publish: steady-state throughput, and
the same ratios under other readings of what a source leaves open (each reruns every schedule
of the case with its change; the printed range spans them and the case itself)."""
import pytest

import hops
from experiments.literature.cases import CASES, on_gpu, one_fewer_at_the_ends, unit_times, zb_paper
from experiments.literature.run import metrics, run_case, spread

INTERNEVO = next(c for c in CASES if c.name.startswith("InternEvo"))


def test_a_reading_is_the_whole_case_rerun_with_its_change():
    res = run_case(INTERNEVO)
    alt = res["readings"]
    assert list(alt.reading) == [r.label for r in INTERNEVO.readings]
    runs = {}
    for sched in ("1f1b", "zb_h1"):
        doc = INTERNEVO.build(sched, "")
        on_gpu("h800", "hgx_h800")(doc)
        assert {d["gpu"] for d in doc["hardware"]["devices"]} == {"h800"}
        r = hops.simulate(doc)
        runs[sched] = metrics(r.summary, r.timeline)["throughput"]
    h800 = alt[alt.reading == "H800 on an HGX H800 node"].predicted.item()
    assert h800 == runs["zb_h1"] / runs["1f1b"]
    assert h800 != res["table"].predicted.item()  # the reading moved the prediction


def test_the_range_spans_the_case_and_every_reading():
    res = run_case(INTERNEVO)
    (sp,) = spread(res)
    preds = [res["table"].predicted.item(), *res["readings"].predicted]
    assert (sp["low"], sp["high"], sp["readings"]) == (min(preds), max(preds), len(INTERNEVO.readings) + 1)
    assert sp["inside"] == (min(preds) <= 1.114 <= max(preds))
    assert sp["ranking_kept"] == int(res["ranking_ok"]) + sum(p > 1.0 for p in res["readings"].predicted)


@pytest.mark.parametrize("model,split", [("1.5B", [2, 3, 3, 3, 3, 3, 3, 2]), ("28.3B", [1] + [2] * 30 + [1])])
def test_the_zb_papers_end_stages_reading_states_one_layer_fewer_at_each_end(model, split):
    doc = zb_paper("1f1b", model)
    one_fewer_at_the_ends(doc)
    assert [st["layers"] for st in doc["pipeline"]["stages"]] == split
    assert sum(split) == doc["pipeline"]["model"]["layers"]


def test_a_case_without_readings_prints_no_range():
    case = next(c for c in CASES if c.name.startswith("ZB repository"))
    res = run_case(case)
    assert res["readings"] is None and spread(res) == []


@pytest.mark.parametrize("schedule,post_validated", [("1f1b", False), ("zb_h2", True)])
def test_throughput_is_the_steady_state_one_a_long_run_reaches(schedule, post_validated):
    """Post-validation pays the first fill once per run: over a short run's average it would
    weigh as if paid every few iterations. A flush pays it every iteration, so there the
    steady state is the run's average."""
    doc = unit_times(schedule)  # F = B = W = 1 ms, p 4, m 16: 48 ms of work per iteration
    r = hops.simulate(doc)
    steady = metrics(r.summary, r.timeline)["throughput"]
    average = r.summary["throughput"]["samples_per_s"]
    period_ms = {"1f1b": 48 + 3 * 3, "zb_h2": 48}[schedule]  # (p - 1)(F + B + W) flushed; 0 in steady state
    assert steady == pytest.approx(16 / period_ms * 1000)
    assert (steady > average * 1.01) == post_validated


@pytest.mark.parametrize("f,b,w", [(1, 1, 1), (1, 1.5, 0.8), (1, 1.2, 1.0), (1, 2, 0.5), (1.5, 1, 1)])
def test_1f1b_and_zb_h1_bubbles_are_the_deepseek_v3_tables_formulas_at_unequal_times(f, b, w):
    """DeepSeek-V3 report, Table 2: (PP-1)(F+B) and (PP-1)(F+B-2W) per iteration, B the full
    backward (here b + w); ZB-1p at 1F1B's memory is never worse than its handcrafted ZB-H1."""
    p, m = 4, 16
    bubble = {}
    for schedule in ("1f1b", "zb_h1", "zb_1p"):
        r = hops.simulate(unit_times(schedule, p=p, m=m, f=f, b=b, w=w))
        bubble[schedule] = metrics(r.summary, r.timeline)["bubble"] * m * (f + b + w)  # ms per iteration
    assert bubble["1f1b"] == pytest.approx((p - 1) * (f + b + w))
    assert bubble["zb_h1"] == pytest.approx((p - 1) * (f + b + w - 2 * w))
    assert bubble["zb_1p"] <= bubble["zb_h1"] + 1e-9


@pytest.mark.parametrize("v", [1, 2, 4])
def test_interleaved_1f1b_bubble_and_messages_are_megatrons_at_unit_times(v):
    """Narayanan et al. (SC21), sec. 2.2: v chunks per device cut the bubble to (p-1)/(vm); each
    microbatch then crosses vp - 1 chunk boundaries each way instead of p - 1."""
    p, m = 4, 16
    doc = unit_times("1f1b" if v == 1 else "interleaved_1f1b", p=p, m=m)
    doc["pipeline"]["virtual_stages"] = v
    r = hops.simulate(doc)
    got = metrics(r.summary, r.timeline)
    assert got["bubble"] == pytest.approx((p - 1) / (v * m))
    assert got["pipeline_messages"] == 2 * m * (v * p - 1)
