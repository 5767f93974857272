"""Scenarios: every shipped format loads; each kind of mistake names its field in one line."""
import copy
import glob
import os
from pathlib import Path

import pytest

import hops
from hops.model.hardware import Catalog, per_gpu
from builders import pipeline

REFERENCE = Path(__file__).resolve().parents[2] / "shared" / "reference"


def test_every_fixture_and_reference_scenario_loads_and_simulates(fixtures_root):
    """Fixtures, the hetero_bench references and the original simulator's seed_configs (legacy format).

    The reference files live next to the fixtures (../shared/reference) and are never copied
    into the repo; if they are missing the count check fails rather than skipping.
    """
    import warnings

    from hops.scenario import LegacyScenarioWarning

    reference = fixtures_root.parent / "reference"
    reference = reference if reference.is_dir() else REFERENCE
    files = sorted(glob.glob(str(fixtures_root / "*" / "cluster_results" / "*" / "hops.base.yaml")))
    files += sorted(glob.glob(str(reference / "hetero_bench" / "*.yaml")))
    files += sorted(glob.glob(str(reference / "seed_configs" / "*.yaml")))
    assert len(files) >= 56 + 16 + 7, f"expected the fixtures and {reference}/{{hetero_bench,seed_configs}}"
    for f in files:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", LegacyScenarioWarning)
            s = hops.simulate(f).summary
        assert s["throughput"]["microbatches_per_s"] > 0, f


def mutate(fn):
    sc = pipeline(3, 4)
    fn(sc)
    return sc


BAD = {
    "unknown top-level key": (lambda s: s.update(pipelin={}), "pipelin: unknown key"),
    "unknown nested key": (lambda s: s["simulation"].update(batchez=2), "simulation.batchez: unknown key"),
    "wrong type": (lambda s: s["simulation"].update(microbatches="four"), "simulation.microbatches: expected an integer"),
    "non-positive count": (lambda s: s["simulation"].update(microbatches=0), "simulation.microbatches: got 0; expected a number > 0"),
    "unknown preset": (lambda s: s["hardware"]["devices"][1].update(gpu="gb9000"), "hardware.devices[1].gpu: got 'gb9000'; expected one of"),
    "missing device": (lambda s: s["pipeline"]["stages"][2].update(device="nope"), "pipeline.stages[2].device: unknown device 'nope'"),
    "unknown scheduler": (lambda s: s["pipeline"].update(schedule="fastest"), "pipeline.schedule: unknown scheduler 'fastest'"),
    "bad distribution": (lambda s: s["pipeline"]["stages"][0]["compute"].update(forward={"kind": "gamma"}), "pipeline.stages[0].compute.forward.kind"),
    "missing section": (lambda s: s.pop("hardware"), "hardware: missing section"),
    "negative weights": (lambda s: s["pipeline"]["stages"][1].update(weights_mb=-1), "pipeline.stages[1].weights_mb: got -1.0; expected a number >= 0"),
    "bad precision": (lambda s: s["pipeline"].update(precision="int3"), "pipeline.precision: got 'int3'"),
    "link to itself": (lambda s: s["overrides"]["links"].append({"src": "g1", "dst": "g1", "latency_ms": 0.1}),
                       "overrides.links[4].dst: 'g1' is src too; expected a link between two different devices"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_scenarios_name_the_field(case):
    fn, expected = BAD[case]
    with pytest.raises(hops.ScenarioError) as err:
        hops.load_scenario(mutate(fn))
    message = str(err.value)
    assert expected in message
    assert "\n" not in message


def test_a_pipeline_hop_with_no_link_is_rejected():
    sc = pipeline(3, 4)
    sc["overrides"] = {}
    sc["hardware"]["interconnect"] = {"same_node": "nvlink"}  # every device is on its own node
    with pytest.raises(hops.ScenarioError, match=r"pipeline.stages\[1\].device: no link from g0 to g1"):
        hops.load_scenario(sc)


def test_yaml_errors_name_the_file_and_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("simulation:\n  batches: [1\n")
    with pytest.raises(hops.ScenarioError, match=r"bad.yaml: line \d+: invalid YAML"):
        hops.load_scenario(bad)


def test_errors_from_a_file_carry_its_name(tmp_path):
    import yaml

    f = tmp_path / "s.yaml"
    f.write_text(yaml.safe_dump(mutate(lambda s: s["simulation"].update(seed="x"))))
    with pytest.raises(hops.ScenarioError, match=r"s.yaml: simulation.seed: expected an integer"):
        hops.load_scenario(f)


def test_omegaconf_and_dict_and_path_give_the_same_result(tmp_path):
    import yaml
    from omegaconf import OmegaConf

    sc = pipeline(3, 4, jitter=0.1)
    f = tmp_path / "s.yaml"
    f.write_text(yaml.safe_dump(sc))
    a = hops.simulate(sc).summary
    b = hops.simulate(OmegaConf.create(copy.deepcopy(sc))).summary
    c = hops.simulate(f).summary
    assert a == b == c


def test_overrides_replace_preset_values_per_device():
    sc = pipeline(2, 2)
    sc["pipeline"]["stack"] = "fixture_megatron"  # its launch adds to the compute term (sync_launch)
    for st in sc["pipeline"]["stages"]:
        st["compute"] = {"mode": "analytical", "tflop": 1.0, "memory_mb": 0.0}
    slow = copy.deepcopy(sc)
    slow["overrides"]["devices"] = {"g1": {"peak_tflops": 31.2}}
    base = hops.simulate(sc).summary["stages"][1]["expected_ms"]["F"]
    slowed = hops.simulate(slow).summary["stages"][1]["expected_ms"]["F"]
    launch = per_gpu(Catalog.load().stacks["fixture_megatron"], "launch_overhead_ms", "a100")
    assert slowed - launch == pytest.approx((base - launch) * 10)


def test_same_and_cross_node_links_come_from_node_labels():
    sc = pipeline(3, 2)
    sc["overrides"] = {}
    sc["hardware"]["devices"] = [{"id": "g0", "gpu": "h100", "node": "a"}, {"id": "g1", "gpu": "h100", "node": "a"},
                                 {"id": "g2", "gpu": "h100", "node": "b"}]
    r = hops.simulate(sc)
    kinds = {lp.name: lp.kind for lp in r.extras["links"]}
    assert kinds["g0->g1"] == "nvlink" and kinds["g1->g2"] == "infiniband"


def test_an_absent_null_or_empty_section_is_that_section_with_its_defaults():
    from hops.schema import validate

    sc = pipeline(2, 2)
    for key in ("optimizer", "failure", "output", "overrides"):
        del sc[key]
    del sc["hardware"]["interconnect"]
    absent = validate(sc)
    for key in ("optimizer", "output", "overrides"):
        null, empty = validate({**sc, key: None}), validate({**sc, key: {}})
        assert getattr(null, key) == getattr(absent, key) == getattr(empty, key)
    assert absent.optimizer.data_parallel.degree == 1 and absent.optimizer.data_parallel.algorithm == "ring"
    assert absent.output.plots is True and absent.output.paths.summary is None and absent.overrides.links == []
    assert absent.pipeline.backward_split.enabled is False and absent.pipeline.model.heads is None
    assert absent.hardware.interconnect.same_node is None
    failure = validate({**sc, "failure": {}}).failure
    assert failure.devices.per_node == 8 and failure.planned.count is None
    assert failure.links.repair_minutes == 30.0 and failure.links.degradation.bandwidth_factor == 0.5
    assert failure.stragglers.drawn.factor_range == (1.05, 1.3) and failure.stragglers.throttling.factor == 1.5
    assert failure.checkpoint.interval_minutes == 60.0


def test_a_first_simulate_compiles_one_validator_for_the_whole_document():
    """Defaults of nested sections are validated inside the document's validator: pydantic
    compiles no validator or serializer per section class (each cost a process's first run
    a few ms). A check of what is built, not a timing: benchmarks/run_bench.py times it."""
    import json
    import subprocess
    import sys

    code = ("import hops, json, pydantic, hops.schema.scenario as s, hops.schema.failure as f\n"
            "from builders import pipeline\n"
            "sc = pipeline(2, 2); sc['failure'] = {'enabled': True}; hops.simulate(sc)\n"
            "models = [c for mod in (s, f) for c in vars(mod).values() if isinstance(c, type)"
            " and issubclass(c, pydantic.BaseModel) and c.__module__ == mod.__name__]\n"
            "print(json.dumps(sorted(c.__name__ for c in models if c.__pydantic_complete__)))")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), *sys.path])}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == ["ScenarioModel"]
