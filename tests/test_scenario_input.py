"""Scenario input: legacy files of the original simulator, the published schema, and hostile input.

Each class of bad input has a case here that failed before it was handled: the error is
one line naming the file / field and what was expected (exit code 2 from the CLIs), and a
valid input is never refused or crashed on.
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import yaml

import hops
from builders import pipeline
from hops.model.hardware import Catalog, CatalogError, per_gpu
from hops.scenario import LegacyScenarioWarning, load_scenario

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def seed_configs() -> list[Path]:
    """The original simulator's example scenarios: ../shared/reference/seed_configs (never copied here)."""
    roots = [REPO.parent / "shared" / "reference"]
    if os.environ.get("HOPS_FIXTURES"):
        roots.insert(0, Path(os.environ["HOPS_FIXTURES"]).resolve().parent / "reference")
    for root in roots:
        files = sorted((root / "seed_configs").glob("*.yaml"))
        if files:
            return files
    msg = f"seed_configs not found under {', '.join(map(str, roots))} (the shared reference scenarios)"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(msg)
    pytest.skip(msg)


def load_quiet(source, catalog=None):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", LegacyScenarioWarning)
        sc = load_scenario(source, catalog)
    return sc, [str(w.message) for w in caught if w.category is LegacyScenarioWarning]


def cli(module: str, *args: str, cwd: Path = REPO, timeout: float = 180, env=None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in (env or os.environ).items() if k != "HYDRA_FULL_ERROR"}
    return subprocess.run([sys.executable, "-m", module, *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)


def one_line_exit_2(proc, needle: str) -> str:
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert needle in lines[0], lines[0]
    return lines[0]


# --------------------------------------------------------------------------- legacy scenarios
def by_name(files, name):
    return next(f for f in files if f.name == name)


def test_explicit_mode_is_a_distribution_stage_with_backward_from_backward_factor(seed_configs):
    sc, notes = load_quiet(by_name(seed_configs, "h100_dual_node_pp2.yaml"))
    c = sc.stages[0].compute
    assert c.mode == "distribution"
    assert (c.forward.kind, dict(c.forward.params)) == ("normal", {"mean_ms": 22.0, "std_ms": 1.5})
    assert dict(c.backward.params) == {"mean_ms": 44.0, "std_ms": 3.0}  # backward_factor 2.0
    # latency_us -> latency_ms
    assert {(ln.src, ln.values["latency_ms"], ln.values["bandwidth_gbps"]) for ln in sc.links} == {
        ("h100_node0_gpu0", 0.2, 12.5), ("h100_node1_gpu0", 0.2, 12.5)}
    assert notes == []  # renames only: nothing HOPS models differently


def test_a_legacy_backward_distribution_is_used_as_given():
    doc = {"simulation": {"microbatches": 2}, "hardware": {"devices": [{"id": "g", "gpu": "h100"}]},
           "pipeline": {"stages": [{"device": "g", "compute": {
               "mode": "explicit", "distribution": {"type": "normal", "mean": 5.0, "std": 0.5},
               "backward": {"type": "constant", "value": 7.0}}}]}}
    c = load_quiet(doc)[0].stages[0].compute
    assert c.backward.kind == "constant" and c.backward.params == {"ms": 7.0}


def test_efficiency_jitter_and_optimizer_fields_map_to_hops_fields(seed_configs):
    catalog = Catalog.load()
    sc, notes = load_quiet(by_name(seed_configs, "default.yaml"), catalog)
    h100, a100 = catalog.devices["h100"], catalog.devices["a100"]
    coeff = catalog.stacks[sc.stack]["compute_time_coefficient"]
    assert sc.device_overrides["node0_gpu0"] == pytest.approx(
        {"peak_tflops": h100["peak_tflops"] * 0.76 * coeff, "memory_bandwidth_gbps": h100["memory_bandwidth_gbps"] * 0.88})
    assert sc.device_overrides["node1_gpu1"]["memory_bandwidth_gbps"] == pytest.approx(a100["memory_bandwidth_gbps"] * 0.78)
    assert [st.compute_jitter for st in sc.stages] == [0.10, 0.10, 0.18, 0.18]
    assert sc.optimizer_step_ms == (2.0,) * 4 and sc.dp_algorithm == "naive"
    assert sc.output["paths"] == {"summary": "output/summary.json", "events": "output/trace.csv",
                                  "timeline": "output/timeline.png", "dashboard": "output/dashboard.png"}
    # each field HOPS models differently has exactly one note, naming the replacement
    assert len(notes) == 4, notes
    for field_, replacement in (("compute.efficiency", "overrides.devices"), ("compute.jitter", "compute_jitter"),
                                ("optimizer.gradient_mb", "data_parallel"), ("optimizer.update", "step_ms")):
        assert any(field_ in n and replacement in n for n in notes), (field_, notes)
    assert all("\n" not in n for n in notes)


@pytest.mark.parametrize("stack", ["megatron_core", "fixture_megatron"])
def test_efficiency_reproduces_the_legacy_roofline(stack):
    """t_compute = tflop / (peak x efficiency): 1 TFLOP at 0.5 x 312 TFLOP/s is 6.41 ms, plus the
    launch where the stack adds it (sync_launch); an async stack hides it behind the GPU work."""
    doc = {"simulation": {"microbatches": 1}, "hardware": {"devices": [{"id": "g", "gpu": "a100"}]},
           "pipeline": {"stack": stack, "stages": [{"device": "g", "compute": {"mode": "analytical", "tflop": 1.0,
                                                                               "efficiency": {"compute": 0.5}}}]}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LegacyScenarioWarning)
        f = hops.simulate(doc).summary["stages"][0]["expected_ms"]["F"]
    st = Catalog.load().stacks[stack]
    launch = per_gpu(st, "launch_overhead_ms", "a100") if st["dispatch"] == "sync_launch" else 0.0
    assert f == pytest.approx(1.0 / (312 * 0.5) * 1000 + launch)


@pytest.mark.parametrize("edit, words", [
    (lambda d: d["pipeline"]["stages"][0]["compute"].update(efficiency={"compute": -0.76}),
     "pipeline.stages[0].compute.efficiency.compute: got -0.76; expected a number in (0, 1]"),
    (lambda d: d["optimizer"].update(allreduce={"algorithm": "tree"}),
     "optimizer.allreduce.algorithm: got 'tree'; expected ring or naive"),
])
def test_a_bad_legacy_field_is_named_as_the_file_names_it_with_its_real_range(edit, words):
    doc = {"simulation": {"microbatches": 1}, "hardware": {"devices": [{"id": "g", "gpu": "a100"}]},
           "optimizer": {"enabled": True},
           "pipeline": {"stages": [{"device": "g", "compute": {"mode": "analytical", "tflop": 1.0}}]}}
    edit(doc)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LegacyScenarioWarning)
        with pytest.raises(hops.ScenarioError) as err:
            hops.simulate(doc)
    assert str(err.value) == words


def test_per_stage_jitter_spreads_only_that_stage():
    doc = {"simulation": {"microbatches": 16}, "hardware": {"devices": [{"id": "a", "gpu": "h100", "node": "n"},
                                                                        {"id": "b", "gpu": "h100", "node": "n"}],
                                                            "interconnect": {"same_node": "nvlink"}},
           "pipeline": {"stages": [{"device": "a", "compute": {"tflop": 1.0}, "compute_jitter": 0.2},
                                   {"device": "b", "compute": {"tflop": 1.0}}]}}
    tl = hops.simulate(doc).timeline
    dur = tl.end_ms - tl.start_ms
    fwd = [(tl.kind == "compute") & (tl.phase == "F") & (tl.stage == s) for s in (0, 1)]
    assert dur[fwd[0]].std() > 0.05 * dur[fwd[0]].mean()
    assert dur[fwd[1]].std() == pytest.approx(0.0, abs=1e-9)


def test_legacy_failure_keys_become_mtbf_and_restart_time():
    doc = pipeline(2, 2)
    doc["failure"] = {"enabled": True, "device_failure_probability": 0.01, "link_failure_probability": 0.001,
                      "check_interval_ms": 1000.0, "recovery_time_ms": 120000.0}
    sc, notes = load_quiet(doc)
    f = sc.failure
    assert f.devices.mtbf_hours == pytest.approx(1000.0 / -math.log(1 - 0.01) / 3.6e6)
    assert f.links.mtbf_hours == pytest.approx(1000.0 / -math.log(1 - 0.001) / 3.6e6)
    assert f.checkpoint.restart_minutes == 2.0 and f.checkpoint.detection_minutes == 0.0
    assert f.links.repair_minutes == 2.0
    assert len(notes) == 1 and "failure" in notes[0] and "checkpoint" in notes[0]
    doc["failure"].pop("check_interval_ms")
    with pytest.raises(hops.ScenarioError, match=r"failure\.check_interval_ms: missing"):
        load_scenario(doc)


def test_accumulation_steps_fold_into_microbatches():
    doc = pipeline(2, 4, batches=4)
    doc["optimizer"] = {"enabled": True, "accumulation_steps": 2}
    sc, notes = load_quiet(doc)
    assert (sc.batches, sc.microbatches) == (2, 8) and "accumulation_steps" in notes[0]
    doc["optimizer"]["accumulation_steps"] = 3
    with pytest.raises(hops.ScenarioError, match=r"optimizer\.accumulation_steps: got 3"):
        load_scenario(doc)


def test_a_document_without_legacy_fields_is_not_touched():
    from hops.schema.legacy import translate

    doc = pipeline(3, 4)
    assert translate(doc, None, Catalog.load()) == (doc, [])


def test_hops_run_honours_legacy_output_paths_and_prints_notes(seed_configs, tmp_path):
    out = tmp_path / "run"
    proc = cli("hops.run", f"scenario_file={by_name(seed_configs, 'default.yaml')}", f"hydra.run.dir={out}")
    assert proc.returncode == 0, proc.stderr
    for rel in ("output/summary.json", "output/trace.csv", "output/timeline.png", "output/dashboard.png"):
        assert (out / rel).stat().st_size > 0, rel
    assert (out / "output/summary.json").read_bytes() == (out / "summary.json").read_bytes()
    assert (out / "output/trace.csv").read_bytes() == (out / "events.csv").read_bytes()
    notes = [ln for ln in proc.stderr.splitlines() if ln.startswith("note: ")]
    assert len(notes) == 4 and "Traceback" not in proc.stderr
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LegacyScenarioWarning)
        api = hops.simulate(by_name(seed_configs, "default.yaml")).summary
    assert json.loads((out / "summary.json").read_text())["throughput"] == api["throughput"]


@pytest.mark.parametrize("path", ["/abs/summary.json", "../escape.json"])
def test_output_paths_stay_inside_the_run_dir(path):
    doc = pipeline(2, 2)
    doc["output"] = {"summary_json": path}
    with pytest.raises(hops.ScenarioError, match=r"output\.paths\.summary: got .*inside the run directory"):
        load_scenario(doc)


# --------------------------------------------------------------------------- the schema
def test_the_shipped_schema_is_generated_from_the_models():
    proc = cli("hops.schema", "--check")
    assert proc.returncode == 0, proc.stderr


def test_the_schema_accepts_every_shipped_scenario_and_rejects_a_bad_one(fixtures_root):
    jsonschema = pytest.importorskip("jsonschema")
    from hops.schema import SCHEMA_FILE

    v = jsonschema.Draft202012Validator(json.loads(SCHEMA_FILE.read_text()))
    files = sorted((REPO / "conf" / "scenario").glob("*.yaml"))
    files += sorted(fixtures_root.glob("*/cluster_results/*/hops.base.yaml"))
    assert len(files) >= 6 + 56
    for f in files:
        errors = [e.message for e in v.iter_errors(yaml.safe_load(f.read_text()))]
        assert not errors, (f, errors[:3])
    bad = pipeline(2, 2)
    bad["simulation"]["microbatches"] = 0
    bad["pipeline"]["stages"][0]["compute"]["forward"] = {"kind": "normal", "mean_ms": 1.0}  # std_ms missing
    bad["pipeline"]["stagez"] = []
    assert len(list(v.iter_errors(bad))) == 3


# --------------------------------------------------------------------------- numbers that are not numbers
def mutate(fn):
    sc = pipeline(3, 4)
    fn(sc)
    return sc


NOT_FINITE = {
    "pipeline.activation_mb": lambda s, v: s["pipeline"].update(activation_mb=v),
    "pipeline.stages[0].weights_mb": lambda s, v: s["pipeline"]["stages"][0].update(weights_mb=v),
    "pipeline.stages[1].compute.forward.ms": lambda s, v: s["pipeline"]["stages"][1]["compute"]["forward"].update(ms=v),
    "overrides.links[0].bandwidth_gbps": lambda s, v: s["overrides"]["links"][0].update(bandwidth_gbps=v),
    "overrides.devices.g0.peak_tflops": lambda s, v: s["overrides"].update(devices={"g0": {"peak_tflops": v}}),
    "optimizer.step_ms": lambda s, v: s["optimizer"].update(step_ms=v),
    "optimizer.step_ms[1]": lambda s, v: s["optimizer"].update(step_ms=[1.0, v, 1.0]),
    "failure.horizon_hours": lambda s, v: s.update(failure={"horizon_hours": v}),
    "failure.devices.mtbf_hours": lambda s, v: s.update(failure={"devices": {"mtbf_hours": v}}),
    "failure.checkpoint.write_minutes": lambda s, v: s.update(failure={"checkpoint": {"write_minutes": v}}),
    "simulation.microbatches": lambda s, v: s["simulation"].update(microbatches=v),
}


@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan])
@pytest.mark.parametrize("field_", sorted(NOT_FINITE))
def test_inf_and_nan_are_refused_in_every_float_field(field_, value):
    with pytest.raises(hops.ScenarioError) as err:
        load_scenario(mutate(lambda s: NOT_FINITE[field_](s, value)))
    assert str(err.value).startswith(f"{field_}: expected a finite number, got ")


@pytest.mark.parametrize("override, message", [
    ("stacks.fixture_megatron.k_floor_ms.default=-5", "got -5; expected a finite number >= 0"),
    ("devices.h100.memory_gb=-24", "got -24; expected a finite number > 0"),
    ("interconnects.ethernet.bandwidth_gbps=0", "got 0; expected a finite number > 0"),
    ("stacks.megatron_core.k_floor_ms.default=.inf", "got inf"),
    ("devices.a10g.peak_tflops=.nan", "got nan"),
    ("model=3", "'model': model is a mapping; set one of its values"),
])
def test_catalog_overrides_have_the_presets_bounds(override, message):
    with pytest.raises(CatalogError, match=message.replace("(", r"\(").replace(")", r"\)")):
        Catalog.load([override])


def test_summary_json_is_strict_json(tmp_path):
    from hops.api import strict_json

    text = strict_json({"a": math.nan, "b": [1.0, math.inf], "c": {"d": -math.inf}, "e": 2.5})

    def refuse(name):
        raise AssertionError(f"bare {name} in summary.json")

    assert json.loads(text, parse_constant=refuse) == {"a": None, "b": [1.0, None], "c": {"d": None}, "e": 2.5}
    r = hops.simulate(pipeline(1, 1))
    r.summary["latency_ms"]["p99"] = math.nan  # what an empty window would give
    r.write(tmp_path)
    json.loads((tmp_path / "summary.json").read_text(), parse_constant=refuse)


# --------------------------------------------------------------------------- YAML itself
def test_duplicate_keys_are_an_error_naming_the_key(tmp_path):
    f = tmp_path / "dup.yaml"
    f.write_text(yaml.safe_dump(pipeline(2, 2), sort_keys=False).replace("simulation:\n",
                                                                         "simulation:\n  batches: 3\n", 1))
    with pytest.raises(hops.ScenarioError, match=r"dup.yaml: line \d+: invalid YAML \(duplicate key 'batches'"):
        load_scenario(f)


BOMB = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{c}: &{c} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}]\n"
    for p, c in zip("abcdefgh", "bcdefghi"))


def test_an_alias_bomb_is_refused_by_the_api_and_the_cli(tmp_path):
    f = tmp_path / "bomb.yaml"
    f.write_text(BOMB + "simulation: *i\n")
    with pytest.raises(hops.ScenarioError, match="aliases expand to more than"):
        load_scenario(f)
    proc = cli("hops.run", f"scenario_file={f}", f"hydra.run.dir={tmp_path / 'run'}", timeout=60)
    one_line_exit_2(proc, "aliases expand to more than")


@pytest.mark.parametrize("text, kind", [("- simulation\n- pipeline\n", "a list"), ("42\n", "a single value"),
                                        ("just words\n", "a single value")])
def test_a_file_whose_top_level_is_not_a_mapping_is_the_projects_error_naming_the_file(tmp_path, text, kind):
    f = tmp_path / "flat.yaml"
    f.write_text(text)
    for call in (hops.simulate, load_scenario):  # the library, as the CLI
        with pytest.raises(hops.ScenarioError) as err:
            call(str(f))
        assert str(err.value).startswith(f"{f}: scenario: the file's top level is {kind}"), err.value
        assert "expected a mapping of scenario sections" in str(err.value)
    one_line_exit_2(cli("hops.run", f"scenario_file={f}", f"hydra.run.dir={tmp_path / 'run'}"),
                    f"{f}: scenario: the file's top level is {kind}")


def test_a_non_utf8_file_is_one_line(tmp_path):
    f = tmp_path / "latin1.yaml"
    f.write_bytes(yaml.safe_dump(pipeline(2, 2)).encode() + "# caf\u00e9\n".encode("latin-1"))
    with pytest.raises(hops.ScenarioError, match=r"latin1.yaml: line \d+: not UTF-8 text \(byte 0xe9"):
        load_scenario(f)
    one_line_exit_2(cli("hops.run", f"scenario_file={f}", f"hydra.run.dir={tmp_path / 'run'}"), "not UTF-8")


# --------------------------------------------------------------------------- one-line errors
TOO_BIG = {
    "seed -1": (lambda s: s["simulation"].update(seed=-1), "simulation.seed: got -1; expected a number >= 0"),
    "schedule .x": (lambda s: s["pipeline"].update(schedule=".x"), "pipeline.schedule: "),
    "hidden_dim 1e300": (lambda s: s["pipeline"].update(model={"hidden_dim": 1e300}),
                         "pipeline.model.hidden_dim: got 1e+300; expected at most"),
    "microbatches 1e9": (lambda s: s["simulation"].update(microbatches=1e9), "simulation.microbatches: got 1e+09"),
    "batches 1e7": (lambda s: s["simulation"].update(batches=10**7), "simulation.batches: got 1e+07"),
    "horizon_hours 1e300": (lambda s: s.update(failure={"horizon_hours": 1e300}),
                            "failure.horizon_hours: got 1e+300; expected at most"),
    "devices.count 1e15": (lambda s: s.update(failure={"devices": {"count": 10**15}}),
                           "failure.devices.count: got 1e+15; expected at most"),
    "too much work": (lambda s: s["simulation"].update(batches=10**5, microbatches=10**3),
                      "simulation: 3 passes x batches x microbatches x stages = 900,000,000 compute tasks; expected at most "
                      "20,000,000"),
    "unknown scheduler option": (lambda s: s["pipeline"].update(schedule="zb_v",
                                                                scheduler_options={"max_inflight": 2}),
                                 "pipeline.scheduler_options.max_inflight: unknown option for scheduler "
                                 "'zb_v'; expected one of max_in_flight"),
    "option for zero_bubble": (lambda s: s["pipeline"].update(schedule="zero_bubble",
                                                              scheduler_options={"max_in_flight": 2}),
                               "pipeline.scheduler_options.max_in_flight: scheduler 'zero_bubble' takes no options"),
    "option for hops_hetero": (lambda s: s["pipeline"].update(schedule="hops_hetero",
                                                              scheduler_options={"max_in_flight": 2}),
                               "pipeline.scheduler_options.max_in_flight: scheduler 'hops_hetero' takes no options"),
    "post_validation with 1f1b": (lambda s: s["optimizer"].update(post_validation=True),
                                  "optimizer.post_validation: schedule '1f1b' ignores it"),
    "option for 1f1b": (lambda s: s["pipeline"].update(scheduler_options={"max_in_flight": 2}),
                        "pipeline.scheduler_options.max_in_flight: scheduler '1f1b' takes no options"),
    "mtbf key matching no device": (lambda s: s.update(failure={"devices": {"mtbf_hours": {"h100": 5e4}}}),
                                    "failure.devices.mtbf_hours.h100: matches no device; expected default, a gpu "
                                    "type (a100)"),
}


@pytest.mark.parametrize("case", sorted(TOO_BIG))
def test_absurd_or_silently_ignored_input_is_one_line(case):
    fn, expected = TOO_BIG[case]
    with pytest.raises(hops.ScenarioError) as err:
        load_scenario(mutate(fn))
    assert str(err.value).startswith(expected), str(err.value)
    assert "\n" not in str(err.value)


def test_known_scheduler_options_and_an_mtbf_map_by_gpu_type_still_load():
    sc = mutate(lambda s: s["pipeline"].update(schedule="zb_v", scheduler_options={"max_in_flight": 3}))
    sc["failure"] = {"devices": {"mtbf_hours": {"a100": 4e4, "g1": 1e4, "default": 5e4}}}
    assert load_scenario(sc).scheduler_options == {"max_in_flight": 3}


@pytest.mark.parametrize("args, needle", [
    (["simulation.seed=-1"], "simulation.seed: got -1"),
    (["pipeline.schedule=.x"], "pipeline.schedule: "),
    (["catalog.model=3"], "catalog: override 'model': model is a mapping"),
    (["catalog.stacks.megatron_core.k_floor_ms.default=inf"], "catalog: override 'stacks.megatron_core.k_floor_ms.default': got inf"),
    (["pipeline.compute_jitter=nan"], "pipeline.compute_jitter: expected a finite number, got nan"),
])
def test_cli_refusals_are_one_line_exit_2(tmp_path, args, needle):
    one_line_exit_2(cli("hops.run", *args, "output.plots=false", f"hydra.run.dir={tmp_path / 'run'}"), needle)


def test_an_unwritable_run_dir_is_one_line(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    one_line_exit_2(cli("hops.run", "output.plots=false", f"hydra.run.dir={blocker / 'run'}"), "cannot write")


@pytest.mark.parametrize("command", ["validate", "gate"])
@pytest.mark.parametrize("setting, needle", [
    ("stacks.megatron_core.k_floor_ms.default=.inf", "got inf"),
    ("interconnects.ethernet.bandwidth_gbps=0", "got 0; expected a finite number > 0"),
    ("model=3", "model is a mapping"),
])
def test_autoresearch_set_refuses_non_numbers_with_exit_2(tmp_path, command, setting, needle):
    root = tmp_path / "fx"
    (root / "train" / "cluster_results").mkdir(parents=True)
    args = [command, "--fixtures", str(root), "--set", setting] + (["--split", "train"] if command == "validate" else [])
    env = dict(os.environ, MLFLOW_TRACKING_URI=f"sqlite:///{tmp_path / 'mlflow.db'}")
    one_line_exit_2(cli("autoresearch", *args, env=env), needle)


# --------------------------------------------------------------------------- valid input, not refused
def test_a_constant_host_overhead_of_zero_is_valid():
    sc = mutate(lambda s: s["pipeline"].update(host_overhead={"kind": "constant", "ms": 0}))
    assert hops.simulate(sc).summary["throughput"]["microbatches_per_s"] > 0


def test_a_one_stage_scenario_draws_its_dashboard(tmp_path):
    pytest.importorskip("matplotlib")
    from hops.outputs.plots import plot_dashboard

    doc = {"simulation": {"batches": 3, "microbatches": 8},
           "pipeline": {"stages": [{"device": "g0", "weights_mb": 100,
                                    "compute": {"mode": "analytical", "tflop": 0.37, "memory_mb": 10}}]},
           "hardware": {"devices": [{"id": "g0", "gpu": "h100"}]}}
    r = hops.simulate(doc)  # latencies equal up to rounding: numpy refused to bin them ("Too many bins")
    assert Path(plot_dashboard(r.summary, r.timeline, tmp_path / "d.png")).stat().st_size > 10_000


def test_existing_messages_keep_their_field_and_expectation():
    cases = [
        (lambda s: s["pipeline"]["stages"][0]["compute"].update(tflop=1.0),
         "pipeline.stages[0].compute.tflop: unknown key; expected one of backward, backward_b, backward_w, forward, mode"),
        (lambda s: s["pipeline"]["stages"][0]["compute"]["forward"].update(std_ms=1.0),
         "pipeline.stages[0].compute.forward.std_ms: unknown key; expected one of kind, ms"),
        (lambda s: s["pipeline"]["stages"][0]["compute"].update(forward={"kind": "normal", "mean_ms": 2.0}),
         "pipeline.stages[0].compute.forward.std_ms: missing; expected a number"),
        (lambda s: s["simulation"].pop("microbatches"), "simulation.microbatches: missing; expected an integer"),
        (lambda s: s["hardware"].update(devices="g0"), "hardware.devices: expected a list, got 'g0'"),
        (lambda s: s["hardware"]["devices"][0].pop("id"), "hardware.devices[0].id: missing; expected a string"),
        (lambda s: s.update(failure={"components": [{"name": "a", "mtbf_hours": 1}, {"name": "a", "mtbf_hours": 1}]}),
         "failure.components[1].name: got 'a'; names must be unique"),
        # YAML reads `1:` as an int key: still named as the device it does not match
        (lambda s: s["overrides"].update(devices={1: {"slowdown": 2}}), "overrides.devices.1: unknown device"),
        (lambda s: s["pipeline"].update(scheduler_options={1: 2}), "pipeline.scheduler_options.1: scheduler '1f1b'"),
    ]
    for fn, expected in cases:
        with pytest.raises(hops.ScenarioError) as err:
            load_scenario(mutate(fn))
        assert str(err.value).startswith(expected), str(err.value)


def test_a_non_utf8_fixture_scenario_is_one_line(fixtures_root, tmp_path):
    import shutil

    src = fixtures_root / "train" / "cluster_results" / "exp2_13_a10g_pair_pp2_run135"
    dst = tmp_path / "fx" / "train" / "cluster_results" / src.name
    shutil.copytree(src, dst)  # a temporary copy, outside the repo
    with open(dst / "hops.base.yaml", "ab") as fh:
        fh.write("# caf\u00e9\n".encode("latin-1"))
    proc = cli("autoresearch", "validate", "--split", "train", "--fixtures", str(tmp_path / "fx"))
    one_line_exit_2(proc, "hops.base.yaml: cannot read scenario")


def test_a_set_value_in_exponent_notation_is_a_number():
    # YAML 1.1 reads "1e-3" (no dot) as a string; the what-if meant the number
    assert Catalog.load(["stacks.megatron_core.k_floor_ms.default=1e-3"]).stacks["megatron_core"]["k_floor_ms"]["default"] == 0.001
    with pytest.raises(CatalogError, match="expected a number, got 'fast'"):
        Catalog.load(["devices.a10g.memory_bandwidth_gbps=fast"])


# --------------------------------------------------------------------------- values of the wrong shape
def _paths(node, path=()):
    """Every value's path in a scenario document (keys and list indices)."""
    if isinstance(node, dict):
        for k, v in node.items():
            yield path + (k,)
            yield from _paths(v, path + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield path + (i,)
            yield from _paths(v, path + (i,))


def _put(doc, path, value):
    for k in path[:-1]:
        doc = doc[k]
    doc[path[-1]] = value


SHIPPED = sorted((REPO / "conf" / "scenario").glob("*.yaml"))


@pytest.mark.parametrize("scenario", SHIPPED, ids=[f.stem for f in SHIPPED])
def test_a_mapping_or_list_in_any_field_is_a_one_line_error(scenario):
    """Swapping a section into a scalar field (stages[3].compute.mode <-> simulation) raised
    `TypeError: unhashable type: 'dict'` from the schema; every field must name itself instead."""
    doc = yaml.safe_load(scenario.read_text())
    swapped = 0
    for path in _paths(doc):
        for wrong in ({"kind": "constant", "ms": 1.0}, [1, 2]):
            d = json.loads(json.dumps(doc))
            _put(d, path, wrong)
            try:
                load_scenario(d)
            except hops.ScenarioError as exc:
                assert "\n" not in str(exc) and str(exc), (path, str(exc))
            swapped += 1
    assert swapped > 50


def test_swapping_compute_mode_and_simulation_names_the_field():
    doc = yaml.safe_load((REPO / "conf" / "scenario" / "hetero_pp4.yaml").read_text())
    compute = doc["pipeline"]["stages"][3]["compute"]
    compute["mode"], doc["simulation"] = doc["simulation"], compute.get("mode", "analytical")
    with pytest.raises(hops.ScenarioError, match=r"^simulation: expected a mapping, got 'analytical'$"):
        load_scenario(doc)
    doc["simulation"] = compute["mode"]  # now only the mode holds a mapping
    with pytest.raises(hops.ScenarioError, match=r"^pipeline.stages\[3\].compute.mode: expected a string, got dict$"):
        load_scenario(doc)
    doc = pipeline(2, 2)
    doc["pipeline"]["stages"][0]["compute"]["forward"]["kind"] = {"constant": 1}
    with pytest.raises(hops.ScenarioError, match=r"forward.kind: expected a string, got dict$"):
        load_scenario(doc)


LONG = "x" * 10_000
LONG_VALUES = {
    "device gpu": lambda s: s["hardware"]["devices"][0].update(gpu=LONG),
    "stage device": lambda s: s["pipeline"]["stages"][0].update(device=LONG),
    "schedule": lambda s: s["pipeline"].update(schedule=LONG),
    "precision": lambda s: s["pipeline"].update(precision=LONG),
    "a number field": lambda s: s["simulation"].update(microbatches=LONG),
    "a bool field": lambda s: s["optimizer"].update(enabled=LONG),
    "an unknown key": lambda s: s["simulation"].update({LONG: 1}),
    "an output path": lambda s: s["output"].update(paths={"summary": "/" + LONG}),
    "a duplicate device id": lambda s: s["hardware"]["devices"].append(dict(s["hardware"]["devices"][0], id=LONG))
    or s["hardware"]["devices"].append(dict(s["hardware"]["devices"][0], id=LONG)),
    "a link end": lambda s: s["overrides"]["links"][0].update(src=LONG),
}


@pytest.mark.parametrize("case", sorted(LONG_VALUES))
def test_an_echoed_10kb_value_is_shortened(case):
    """The error names the field and shows the start of the value and its length, not 10 kB."""
    with pytest.raises(hops.ScenarioError) as err:
        load_scenario(mutate(LONG_VALUES[case]))
    msg = str(err.value)
    assert len(msg) < 400 and "\n" not in msg, (len(msg), msg[:500])
    assert "xxxxxxxxxx" in msg and "characters)" in msg, msg


def test_the_cli_shortens_an_echoed_value(tmp_path):
    f = tmp_path / "long.yaml"
    f.write_text(yaml.safe_dump(mutate(LONG_VALUES["device gpu"])))
    line = one_line_exit_2(cli("hops.run", f"scenario_file={f}", f"hydra.run.dir={tmp_path / 'run'}"),
                           "hardware.devices[0].gpu")
    assert len(line) < 500, len(line)


# --------------------------------------------------------------------------- YAML 1.2 numbers
H100_PAIR = REPO / "conf" / "scenario" / "h100_pair.yaml"
EXPONENT_FLOATS = [("1e3", 1000.0), ("1.5E-2", 0.015), ("-2e+5", -200000.0), ("1.0e3", 1000.0), ("2E1", 20.0)]


def h100_pair_with_tflop(tmp_path: Path, text: str) -> Path:
    """conf/scenario/h100_pair.yaml with stage 0's `tflop: 13.19` written as `text`, verbatim."""
    f = tmp_path / "exp.yaml"
    f.write_text(H100_PAIR.read_text().replace("tflop: 13.19", f"tflop: {text}", 1))
    return f


@pytest.mark.parametrize("text, value", EXPONENT_FLOATS)
def test_a_scenario_file_reads_an_exponent_without_a_dot_or_a_sign_as_a_number(tmp_path, text, value):
    """YAML 1.2 floats (`1e3`), which PyYAML's YAML 1.1 reads as strings."""
    data, _ = hops.scenario.load_document(h100_pair_with_tflop(tmp_path, text))
    got = data["pipeline"]["stages"][0]["compute"]["tflop"]
    assert type(got) is float and got == value


def test_a_quoted_exponent_stays_a_string(tmp_path):
    with pytest.raises(hops.ScenarioError, match=r"tflop: expected a number, got '1e3'"):
        load_scenario(h100_pair_with_tflop(tmp_path, '"1e3"'))


def test_readmes_1e308_example_is_refused_by_the_physical_bound_not_as_a_string(tmp_path):
    """README: `compute.tflop: 1e308` makes a stage's forward time infinite."""
    proc = cli("hops.run", f"scenario_file={h100_pair_with_tflop(tmp_path, '1e308')}", "output.plots=false",
               f"hydra.run.dir={tmp_path / 'run'}")
    line = one_line_exit_2(proc, "pipeline.stages[0]")
    assert "got '1e308'" not in line and "expected a number" not in line, line


@pytest.mark.parametrize("text, value", [(t, v) for t, v in EXPONENT_FLOATS if v > 0])  # memory_gb > 0
def test_presets_and_catalog_overrides_read_exponent_floats(tmp_path, text, value):
    presets = REPO / "hops" / "presets"
    for f in presets.glob("*.yaml"):
        (tmp_path / f.name).write_text(f.read_text())
    devices = tmp_path / "devices.yaml"
    devices.write_text(devices.read_text().replace("  memory_gb: 80\n", f"  memory_gb: {text}\n", 1))
    assert Catalog.load(preset_dir=tmp_path).devices["h100"]["memory_gb"] == value
    assert Catalog.load([f"devices.h100.memory_gb={text}"]).devices["h100"]["memory_gb"] == value


# --------------------------------------------------------------------------- library arguments
@pytest.mark.parametrize("seed, shown", [("x", "'x'"), ("3", "'3'"), (-1, "-1"), (1.5, "1.5"), (True, "True")])
def test_simulate_refuses_a_seed_that_is_not_an_integer_ge_0_naming_the_argument(seed, shown):
    with pytest.raises(hops.HopsError) as err:
        hops.simulate(H100_PAIR, seed=seed)
    msg = str(err.value)
    assert msg.startswith("seed: ") and shown in msg and "\n" not in msg, msg


def test_simulate_takes_a_numpy_integer_seed_as_that_seed():
    import numpy as np

    assert hops.simulate(H100_PAIR, seed=np.int64(3)).summary["seed"] == 3
