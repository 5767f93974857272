"""The literature benchmark's other readings of what a source leaves open: each reruns every
schedule of the case with its change, and the printed range spans them and the case itself."""
import hops
from experiments.literature.cases import CASES, on_gpu
from experiments.literature.run import run_case, spread

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
        runs[sched] = hops.simulate(doc).summary["throughput"]["samples_per_s"]
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


def test_a_case_without_readings_prints_no_range():
    case = next(c for c in CASES if c.name.startswith("ZB repository"))
    res = run_case(case)
    assert res["readings"] is None and spread(res) == []
