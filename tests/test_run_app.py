"""The run app: `python -m hops.run` with Hydra configs, sweeps, outputs and one-line errors.

Every run goes to a tmp dir (hydra.run.dir / hydra.sweep.dir) so nothing lands in the repo.
Cheap cases run in-process through hops.run.main(argv); what only a real process shows
(exit codes, stderr without a traceback, parallel launchers, lazy imports) runs as a
subprocess.
"""
from __future__ import annotations

import csv
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from hops import simulate
from hops.run.app import CONF_DIR, SECTIONS, main
from hops.scenario import load_scenario

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
SCENARIOS = sorted(p.stem for p in (CONF_DIR / "scenario").glob("*.yaml"))
MY_SCENARIOS = ["hetero_pp4", "h100_pair", "dgx_h100", "mixed_pp6", "straggler_pp4"]
FIXTURE = "train/cluster_results/exp2_10_all_nodes_gpipe_run97/hops.base.yaml"


def cli(*args: str, cwd: Path | None = None, timeout: float = 180) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    return subprocess.run([sys.executable, "-m", "hops.run", *args], cwd=cwd or REPO, env=env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture(autouse=True)
def _no_full_error(monkeypatch):
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)


def run_inproc(tmp_path: Path, *args: str, name: str = "run") -> Path:
    out = tmp_path / name
    main([*args, f"hydra.run.dir={out}"])
    return out


def read_csv(path: Path) -> list[dict]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


# --------------------------------------------------------------------------- default run, outputs
@pytest.fixture(scope="module")
def default_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("default") / "run"
    proc = cli(f"hydra.run.dir={out}")
    assert proc.returncode == 0, proc.stderr
    return out, proc


def test_default_run_writes_every_output_and_prints_a_summary(default_run):
    out, proc = default_run
    for name in ("summary.json", "events.csv", "timeline.png", "dashboard.png", "trace.json", "scenario.yaml",
                 ".hydra/config.yaml", ".hydra/overrides.yaml"):
        assert (out / name).is_file(), name
    for png in ("timeline.png", "dashboard.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = proc.stdout
    assert "hetero_pp4" in text
    for label in ("throughput", "samples/s", "bubble", "slowest stage", "peak memory"):
        assert label in text, label
    for device in ("l4_0", "l4_1", "a10g_0", "a10g_1"):
        assert re.search(rf"{device} [\d.]+/24 GB", text), device
    assert str(out / "summary.json") in text and str(out / "trace.json") in text
    summary = json.loads((out / "summary.json").read_text())
    assert [s["device"] for s in summary["stages"]] == ["l4_0", "l4_1", "a10g_0", "a10g_1"]
    assert summary["throughput"]["samples_per_s"] > 0


@pytest.mark.parametrize("schedule,pattern", [("1f1b", r"F [\d.]+ \+ BW [\d.]+ = "),
                                              ("zb_h1", r"F [\d.]+ \+ B [\d.]+ \+ W [\d.]+ = ")])
def test_the_slowest_stage_line_shows_the_backward_as_the_schedule_ran_it(tmp_path, schedule, pattern):
    proc = cli(f"pipeline.schedule={schedule}", "output.plots=false", f"hydra.run.dir={tmp_path / 'run'}")
    assert proc.returncode == 0, proc.stderr
    assert re.search(r"slowest stage .*: " + pattern, proc.stdout), proc.stdout


def test_trace_json_is_chrome_trace_with_stage_and_link_tracks(default_run):
    out, _ = default_run
    trace = json.loads((out / "trace.json").read_text())
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    assert events and all(e["ph"] in {"X", "M", "i", "I", "C", "B", "E"} for e in events)
    slices = [e for e in events if e["ph"] == "X"]
    assert slices and all({"name", "ts", "dur", "pid", "tid"} <= set(e) and e["dur"] >= 0 for e in slices)
    threads = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    processes = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert {"stages", "links"} <= processes
    for stage, device in enumerate(["l4_0", "l4_1", "a10g_0", "a10g_1"]):
        assert any(t.startswith(f"stage {stage} ({device})") for t in threads), (stage, threads)
    for link in ("l4_0->l4_1", "l4_1->a10g_0", "a10g_0->a10g_1", "a10g_1->a10g_0"):
        assert any(t.startswith(link) for t in threads), (link, threads)
    names = {e["name"] for e in slices}
    assert {"F", "BW"} <= names and any(n.startswith("send") for n in names)


def test_plots_off_and_heavy_libraries_stay_unimported(tmp_path):
    out = tmp_path / "run"
    code = ("import sys\nfrom hops.run.app import main\n"
            f"main(['output.plots=false', 'hydra.run.dir={out}'])\n"
            "print('HEAVY', sorted(m for m in ('matplotlib', 'mlflow', 'pandas', 'optuna') if m in sys.modules))\n")
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "HEAVY []" in proc.stdout
    assert (out / "summary.json").is_file() and not (out / "timeline.png").exists()


# --------------------------------------------------------------------------- named scenarios
@pytest.mark.parametrize("name", SCENARIOS)
def test_every_named_scenario_runs(tmp_path, name):
    out = run_inproc(tmp_path, f"+scenario={name}", "output.plots=false", "output.chrome_trace=false")
    summary = json.loads((out / "summary.json").read_text())
    import yaml

    declared = yaml.safe_load((CONF_DIR / "scenario" / f"{name}.yaml").read_text())
    assert len(summary["stages"]) == len(declared["pipeline"]["stages"])
    assert summary["schedule"] == declared["pipeline"]["schedule"]
    assert summary["throughput"]["samples_per_s"] > 0


def test_required_named_scenarios_exist():
    assert set(MY_SCENARIOS) <= set(SCENARIOS)


def _compose(overrides: list[str]) -> dict:
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("config", overrides=overrides)
    data = OmegaConf.to_container(cfg, resolve=True)
    return {k: data[k] for k in SECTIONS if k in data}


@pytest.mark.parametrize("name", SCENARIOS)
def test_named_scenario_composes_to_exactly_its_file(name):
    """Nothing of the default (hetero_pp4) sections leaks into a named scenario."""
    assert load_scenario(_compose([f"+scenario={name}"])) == load_scenario(CONF_DIR / "scenario" / f"{name}.yaml")


def test_no_arguments_is_hetero_pp4():
    assert load_scenario(_compose([])) == load_scenario(_compose(["+scenario=hetero_pp4"]))


def test_straggler_is_the_slowest_stage(tmp_path):
    out = run_inproc(tmp_path, "+scenario=straggler_pp4", "output.plots=false")
    healthy = run_inproc(tmp_path, "+scenario=straggler_pp4", "output.plots=false",
                         "overrides.devices.h100_2.slowdown=1.0", name="healthy")
    slow, fast = (json.loads((d / "summary.json").read_text()) for d in (out, healthy))
    per_mb = [s["expected_ms"]["F"] + s["expected_ms"]["BW"] for s in slow["stages"]]
    assert per_mb.index(max(per_mb)) == 2
    assert slow["throughput"]["samples_per_s"] < fast["throughput"]["samples_per_s"]


# --------------------------------------------------------------------------- overrides, catalog, files
def test_catalog_and_device_overrides_need_no_plus(tmp_path):
    base = json.loads((run_inproc(tmp_path, "output.plots=false", name="base") / "summary.json").read_text())
    slow_net = run_inproc(tmp_path, "output.plots=false", "catalog.interconnects.ethernet.bandwidth_gbps=0.5",
                          name="net")
    dev = run_inproc(tmp_path, "output.plots=false", "overrides.devices.a10g_1.peak_tflops=60", name="dev")
    net_s, dev_s = (json.loads((d / "summary.json").read_text()) for d in (slow_net, dev))
    assert net_s["model_fingerprint"] != base["model_fingerprint"]
    assert net_s["throughput"]["samples_per_s"] < base["throughput"]["samples_per_s"]
    assert dev_s["stages"][3]["expected_ms"]["F"] > base["stages"][3]["expected_ms"]["F"]
    assert "catalog.interconnects.ethernet.bandwidth_gbps=0.5" in (slow_net / "scenario.yaml").read_text()


def _schema_keys(model, conf, path=""):
    """Dotted keys of a schema section (nested sections too) that the config tree does not list."""
    import typing

    from pydantic import BaseModel

    def section(annotation):
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            return annotation
        return next((s for a in typing.get_args(annotation) if (s := section(a)) is not None), None)

    missing = []
    for name, field in model.model_fields.items():
        if not isinstance(conf, dict) or name not in conf:
            missing.append(path + name)
        elif section(field.annotation) is not None and isinstance(conf[name], dict):
            missing += _schema_keys(section(field.annotation), conf[name], f"{path}{name}.")
    return missing


@pytest.mark.parametrize("group", [s for s in SECTIONS if s not in ("overrides", "failure")])
def test_the_config_tree_lists_every_key_the_schema_accepts(group):
    """So `section.key=value` works without Hydra's `+` (conf/pipeline/default.yaml says so);
    `failure.` and `overrides.` are open prefixes the app passes as `++`."""
    import typing

    import yaml

    from hops.schema.scenario import ScenarioModel

    model = next(a for a in typing.get_args(ScenarioModel.model_fields[group].annotation) or
                 (ScenarioModel.model_fields[group].annotation,) if isinstance(a, type))
    conf = yaml.safe_load((CONF_DIR / group / "default.yaml").read_text())
    assert _schema_keys(model, conf) == []


def test_virtual_stages_is_an_override_without_a_plus(tmp_path):
    out = run_inproc(tmp_path, "pipeline.schedule=interleaved_zb", "pipeline.virtual_stages=2", "output.plots=false")
    summary = json.loads((out / "summary.json").read_text())
    assert summary["schedule"] == "interleaved_zb" and len(summary["peak_in_flight"]) == 4


def test_scenario_file_on_a_fixture_with_overrides(tmp_path, fixtures_root, monkeypatch):
    path = fixtures_root / FIXTURE
    monkeypatch.chdir(path.parent.parent)  # relative scenario_file resolves against the caller's cwd
    rel = Path(path.parent.name) / path.name
    out = run_inproc(tmp_path, f"scenario_file={rel}", "pipeline.schedule=zero_bubble", "simulation.seed=3",
                     "output.plots=false")
    summary = json.loads((out / "summary.json").read_text())
    assert summary["schedule"] == "zero_bubble" and summary["seed"] == 3
    assert [s["device"] for s in summary["stages"]][0] == "h100_node0_gpu0" and len(summary["stages"]) == 6

    import yaml

    doc = yaml.safe_load(path.read_text())
    doc["pipeline"]["schedule"] = "zero_bubble"
    doc["simulation"]["seed"] = 3
    expected = simulate(doc).summary
    assert summary["throughput"] == expected["throughput"]
    # scenario.yaml is exactly what ran: running it again gives the same events, byte for byte
    again = run_inproc(tmp_path, f"scenario_file={out / 'scenario.yaml'}", "output.plots=false", name="again")
    assert (again / "events.csv").read_bytes() == (out / "events.csv").read_bytes()


def scenario_with_host_overhead(tmp_path: Path) -> Path:
    """conf/scenario/h100_pair.yaml plus a host overhead, which conf/'s defaults hold as null."""
    import yaml

    doc = yaml.safe_load((CONF_DIR / "scenario" / "h100_pair.yaml").read_text())
    doc["pipeline"]["host_overhead"] = {"kind": "constant", "ms": 40.0}
    f = tmp_path / "overhead.yaml"
    f.write_text(yaml.safe_dump(doc, sort_keys=False))
    return f


def test_a_deletion_is_replayed_on_a_scenario_file_like_on_a_named_scenario(tmp_path):
    """README: section overrides, `~pipeline.host_overhead` among them, are replayed on top of the file."""
    f = scenario_with_host_overhead(tmp_path)
    proc = cli(f"scenario_file={f}", "~pipeline.host_overhead", "output.plots=false",
               f"hydra.run.dir={tmp_path / 'deleted'}")
    assert proc.returncode == 0, proc.stderr
    ran = load_scenario(tmp_path / "deleted" / "scenario.yaml").raw
    assert "host_overhead" not in ran["pipeline"]
    named = cli("+scenario=h100_pair", "output.plots=false", f"hydra.run.dir={tmp_path / 'named'}")
    kept = cli(f"scenario_file={f}", "output.plots=false", f"hydra.run.dir={tmp_path / 'kept'}")
    samples = {d: json.loads((tmp_path / d / "summary.json").read_text())["throughput"]["samples_per_s"]
               for d in ("deleted", "named", "kept")}
    assert named.returncode == kept.returncode == 0
    assert samples["deleted"] == samples["named"] > samples["kept"], samples


def test_a_sweep_over_a_scenario_file_with_a_deletion_shows_the_deletion_as_typed(tmp_path):
    f = scenario_with_host_overhead(tmp_path)
    sweep = tmp_path / "sweep"
    proc = cli("-m", "hydra/launcher=basic", f"scenario_file={f}", "~pipeline.host_overhead", "simulation.seed=1,2",
               "output.plots=false", f"hydra.sweep.dir={sweep}")
    assert proc.returncode == 0, proc.stderr
    jobs = [ln for ln in proc.stdout.splitlines() if ln.startswith("[job ")]
    assert len(jobs) == 2 and all(" ~pipeline.host_overhead simulation.seed=" in ln for ln in jobs), proc.stdout
    rows = read_csv(sweep / "sweep_results.csv")
    assert [(r["pipeline.host_overhead"], r["simulation.seed"], r["status"]) for r in rows] == [
        ("", "1", "ok"), ("", "2", "ok")]
    assert not any(k.startswith("scenario_file_delete") for k in rows[0])


def test_a_run_dirs_scenario_yaml_names_the_command_that_reruns_it_exactly(tmp_path):
    """scenario.yaml is "exactly the scenario that ran"; the catalog overrides (presets, not scenario)
    are on the re-run command its header gives, and the re-run keeps the run's name."""
    first = cli("+scenario=hetero_pp4", "catalog.interconnects.ethernet.bandwidth_gbps=1.5", "output.plots=false",
                f"hydra.run.dir={tmp_path / 'first'}")
    assert first.returncode == 0, first.stderr
    header = (tmp_path / "first" / "scenario.yaml").read_text().splitlines()[:2]
    assert header[0].endswith("Re-run it exactly with (THIS_FILE: this file):"), header
    command = shlex.split(header[1].lstrip("# ").replace("THIS_FILE", str(tmp_path / "first" / "scenario.yaml")))
    assert command[:3] == ["python", "-m", "hops.run"], command
    again = cli(*command[3:], "output.plots=false", f"hydra.run.dir={tmp_path / 'again'}")
    plain = cli(f"scenario_file={tmp_path / 'first' / 'scenario.yaml'}", "output.plots=false",
                f"hydra.run.dir={tmp_path / 'plain'}")
    assert again.returncode == plain.returncode == 0, again.stderr + plain.stderr
    samples = {d: json.loads((tmp_path / d / "summary.json").read_text())["throughput"]["samples_per_s"]
               for d in ("first", "again", "plain")}
    assert samples["again"] == samples["first"] != samples["plain"], samples  # the override matters here
    assert again.stdout.splitlines()[0].startswith("HOPS hetero_pp4: "), again.stdout


def test_scenario_file_runs_a_fixture_unchanged(tmp_path, fixtures_root):
    path = fixtures_root / FIXTURE
    out = run_inproc(tmp_path, f"scenario_file={path}", "output.plots=false")
    assert json.loads((out / "summary.json").read_text())["throughput"] == simulate(path).summary["throughput"]


# --------------------------------------------------------------------------- errors
BAD_INPUTS = [
    (["+scenario=nosuch"], r"unknown scenario 'nosuch'; available: .*dgx_h100.*h100_pair.*hetero_pp4.*mixed_pp6"),
    (["scenario=h100_pair"], r"use \+scenario=NAME"),
    (["pipeline.schedule=fifo"], r"pipeline\.schedule: unknown scheduler 'fifo'; expected one of 1f1b, gpipe, .*hops_hetero, .*zero_bubble"),
    (["pipeline.schedul=gpipe"], r"pipeline\.schedul: unknown key; expected one of .*schedule"),
    (["simulation.seed=abc"], r"simulation\.seed: expected an integer"),
    (["simulation.microbatches=0"], r"simulation\.microbatches: .*> 0"),
    (["pipeline.precision=int4"], r"pipeline\.precision: .*bf16, fp16, fp32"),
    (["hardware.interconnect.cross_node=carrier_pigeon"], r"hardware\.interconnect\.cross_node: .*ethernet"),
    (["catalog.devices.a10x.peak_tflops=1"], r"catalog: .*unknown key 'devices\.a10x'; known: .*a10g"),
    (["overrides.devices.nope.slowdown=2"], r"overrides\.devices\.nope: unknown device; expected one of a10g_0"),
    (["simulation.seed=["], r"bad override 'simulation\.seed=\['"),
    (["scenario_file=does/not/exist.yaml"], r"scenario_file: file not found"),
    (["+scenario=h100_pair", "scenario_file=x.yaml"], r"either \+scenario=NAME or scenario_file"),
    (["scenario_file="], r"scenario_file: empty; expected the path of a scenario YAML file"),
    (["scenario_file=/dev/null"], r"scenario_file: /dev/null is not a regular file"),
    (["simulation=5"], r"simulation=5: simulation is a config group; give one of its options by name \(default\)"),
    (["failure=null"], r"failure=null: failure is a config group; .* failure\.enabled=false turns it off"),
    (["+foo=1"], r"foo: unknown top-level key; expected a scenario section"),
    (["pipeline.compute_jitter=1e6"], r"pipeline\.compute_jitter: got 1000000\.0; expected a number in \[0, 1\]"),
]


def one_line_error(tmp_path, capsys, *args: str) -> str:
    """The one stderr line of a run that a user error ends with exit code 2."""
    with pytest.raises(SystemExit) as exc:
        run_inproc(tmp_path, *args, "output.plots=false")
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


@pytest.mark.parametrize("args,pattern", BAD_INPUTS, ids=[" ".join(a) for a, _ in BAD_INPUTS])
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, args, pattern):
    err = one_line_error(tmp_path, capsys, *args)
    assert re.search(pattern, err), err


@pytest.fixture
def own_scenario():
    """Writes conf/scenario/<name>.yaml for one test (a user's own +scenario=NAME file), then removes it."""
    made = []

    def write(name: str, text: str) -> str:
        path = CONF_DIR / "scenario" / f"{name}.yaml"
        assert not path.exists()
        made.append(path)
        path.write_text(text)
        return str(path)

    yield write
    for path in made:
        path.unlink(missing_ok=True)


@pytest.mark.parametrize("text,error", [
    ("simulation: { microbatches: 8\npipeline:\n  schedule: 1f1b\n", r"line 3: invalid YAML \(expected ',' or '\}'"),
    ("simulation: { microbatchez: 8 }\n", r"simulation\.microbatchez: unknown key; expected one of .*microbatches"),
    ("simulation: { microbatches: -1 }\n", r"simulation\.microbatches: got -1; expected a number > 0"),
])
def test_a_mistake_in_a_scenario_file_of_conf_names_the_file_in_one_line(tmp_path, capsys, own_scenario, text, error):
    path = own_scenario("users_own", "# @package _global_\n" + text)
    err = one_line_error(tmp_path, capsys, "+scenario=users_own")
    assert err.startswith(f"error: {path}: ") and re.search(error, err), err


def test_a_bad_value_given_on_the_command_line_is_not_blamed_on_the_scenario_file(tmp_path, capsys):
    with pytest.raises(SystemExit):
        run_inproc(tmp_path, "+scenario=h100_pair", "simulation.microbatches=-1", "output.plots=false")
    assert capsys.readouterr().err.strip() == "error: simulation.microbatches: got -1; expected a number > 0"


@pytest.mark.parametrize("text,error", [
    ("", r"scenario: the file is empty \(or holds only comments\)"),
    ("# nothing yet\n", r"scenario: the file is empty"),
    ("simulation: 5\n", r"simulation: expected a mapping of its fields, got a single value \(int 5\)"),
    ("output: [1]\n", r"output: expected a mapping of its fields, got a list"),
])
def test_a_scenario_file_that_is_empty_or_holds_a_section_that_is_no_mapping_is_one_line(tmp_path, capsys, text,
                                                                                         error):
    f = tmp_path / "mine.yaml"
    f.write_text(text)
    err = one_line_error(tmp_path, capsys, f"scenario_file={f}")
    assert err.startswith(f"error: {f}: ") and re.search(error, err), err


def test_a_directory_given_as_scenario_file_is_named_as_a_directory(tmp_path, capsys):
    with pytest.raises(SystemExit):
        run_inproc(tmp_path, f"scenario_file={tmp_path}", "output.plots=false")
    assert capsys.readouterr().err.strip() == f"error: scenario_file: {tmp_path} is a directory; expected a scenario YAML file"


def test_a_bad_value_given_on_the_command_line_is_not_blamed_on_a_scenario_file_either(tmp_path, capsys):
    f = tmp_path / "mine.yaml"
    f.write_text((CONF_DIR / "scenario" / "h100_pair.yaml").read_text())
    with pytest.raises(SystemExit):
        run_inproc(tmp_path, f"scenario_file={f}", "simulation.microbatches=-1", "output.plots=false")
    assert capsys.readouterr().err.strip() == "error: simulation.microbatches: got -1; expected a number > 0"
    f.write_text(f.read_text().replace("microbatches: 8", "microbatches: -1"))
    with pytest.raises(SystemExit):
        run_inproc(tmp_path, f"scenario_file={f}", "output.plots=false")
    assert capsys.readouterr().err.strip() == f"error: {f}: simulation.microbatches: got -1; expected a number > 0"


def test_a_sweep_with_a_scenario_file_whose_section_is_no_mapping_keeps_the_good_job(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("simulation: 5\n")
    good = CONF_DIR / "scenario" / "h100_pair.yaml"
    proc = cli("-m", f"scenario_file={bad},{good}", "output.plots=false", f"hydra.sweep.dir={tmp_path / 'sweep'}")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    with open(tmp_path / "sweep" / "sweep_results.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert [bool(r["samples_per_s"]) for r in rows] == [False, True]
    assert "expected a mapping" in rows[0]["status"] and rows[1]["status"] == "ok"


def test_failure_settings_on_the_command_line_of_a_run_without_failures_get_a_note(tmp_path, capsys):
    run_inproc(tmp_path, "failure.stragglers.fixed.l4_0=1.5", "output.plots=false")
    assert ("note: failure.enabled is false: the command line's failure.stragglers.fixed.l4_0 is not applied "
            "(add failure.enabled=true)") in capsys.readouterr().err


def test_data_parallel_replicas_count_in_samples_per_second_not_in_microbatches_per_second(tmp_path, capsys):
    one = json.loads((run_inproc(tmp_path / "one", "+scenario=h100_pair", "optimizer.enabled=true",
                                 "output.plots=false") / "summary.json").read_text())["throughput"]
    two = json.loads((run_inproc(tmp_path / "two", "+scenario=h100_pair", "optimizer.enabled=true",
                                 "optimizer.data_parallel.degree=2", "output.plots=false")
                      / "summary.json").read_text())["throughput"]
    assert two["data_parallel_replicas"] == 2 and one["data_parallel_replicas"] == 1
    assert two["samples_per_s"] == pytest.approx(2 * two["microbatches_per_s"]), "micro-batch 1, two replicas"
    assert two["microbatches_per_s"] < one["microbatches_per_s"], "the replicas' gradient reduction costs time"
    assert "microbatches/s per pipeline x 2 data-parallel replicas" in capsys.readouterr().out


def test_a_directory_where_an_output_goes_is_one_line_naming_it(tmp_path):
    (tmp_path / "run" / "events.csv").mkdir(parents=True)
    proc = cli("output.plots=false", f"hydra.run.dir={tmp_path / 'run'}")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [f"error: cannot write {tmp_path / 'run' / 'events.csv'}: Is a "
                                                "directory (choose another hydra.run.dir)"]


@pytest.mark.parametrize("multirun", [False, True])
def test_a_full_disk_while_writing_outputs_is_one_line_without_hydras_report(tmp_path, capsys, monkeypatch, multirun):
    """The disk fills while the outputs are written (a writer raises ENOSPC, as the OS does):
    one line naming the file, no "Error executing job" report; in a sweep the job is recorded as
    failed and the sweep exits 2 after the others."""
    import errno

    from hops.run import app

    def full_disk(result, run_dir, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", str(run_dir / "events.csv"))

    monkeypatch.setattr(app, "write_outputs", full_disk)
    # the basic launcher runs the jobs in this process, where the writer is replaced
    args = ["-m", "hydra/launcher=basic", "simulation.seed=1,2", f"hydra.sweep.dir={tmp_path / 'sweep'}"] if multirun else []
    with pytest.raises(SystemExit) as exc:
        run_inproc(tmp_path, *args, "output.plots=false")
    assert exc.value.code == 2
    err = [line for line in capsys.readouterr().err.strip().splitlines() if line]
    assert not any("Error executing job" in line or "Traceback" in line for line in err), err
    if multirun:
        assert sum(line.startswith("[job ") and "No space left on device" in line for line in err) == 2, err
        assert err[-1].startswith("error: "), err
        assert sorted(p.parent.name for p in (tmp_path / "sweep").glob("*/error.txt")) == ["0", "1"]
    else:
        assert len(err) == 1 and re.fullmatch(r"error: cannot write .*events\.csv: No space left on device .*", err[0]), err


@pytest.mark.parametrize("typo", ["simulation.sed=3", "simulaton.seed=3", "pipeline.schedul=gpipe"])
def test_a_mistyped_keys_suggestion_is_a_command_that_works(tmp_path, typo):
    proc = cli(typo, "output.plots=false", f"hydra.run.dir={tmp_path / 'bad'}")
    assert proc.returncode == 2
    suggestion = proc.stderr.strip().split("did you mean: ", 1)[1]
    argv = shlex.split(suggestion)
    assert argv[:3] == ["python", "-m", "hops.run"]
    fixed = cli(*argv[3:])
    assert fixed.returncode == 0, fixed.stderr
    assert (tmp_path / "bad" / "summary.json").is_file()


def test_a_scenario_key_the_config_does_not_set_yet_gets_the_command_with_a_plus(tmp_path):
    """Hydra refuses to add a key the composed config lacks without a +, although the scenario
    schema has it (a stage given by compute has no activation_memory_mb): the error is the
    user's command with the +, and that command runs."""
    args = ("pipeline.stages.1.activation_memory_mb=100", "output.plots=false", f"hydra.run.dir={tmp_path / 'run'}")
    proc = cli(*args)
    assert proc.returncode == 2
    err = proc.stderr.strip()
    assert err.startswith("error: pipeline.stages[1].activation_memory_mb: this configuration does not set it yet")
    argv = shlex.split(err.split("needs a + to add it: ", 1)[1])
    assert argv[:4] == ["python", "-m", "hops.run", "+pipeline.stages.1.activation_memory_mb=100"]
    assert cli(*argv[3:]).returncode == 0
    assert (tmp_path / "run" / "summary.json").is_file()


def test_big_cluster_summary_is_compact_and_in_natural_order():
    from hops.run.app import memory_lines

    devices = [f"h100_{i}" for i in range(64)]
    s = {"stages": [], "peak_memory_mb": {d: 1000.0 * (1 + i % 50) for i, d in enumerate(devices)},
         "memory_capacity_mb": {d: 80000.0 for d in devices}, "memory_over_capacity": []}
    lines = memory_lines(s)
    assert len(lines) == 1 and "64 devices" in lines[0] and len(lines[0]) < 120, lines
    assert "fullest h100_49 50.0/80 GB" in lines[0]
    few = {"stages": [], "peak_memory_mb": {"h100_10": 1.0, "h100_2": 1.0, "a10g_1": 1.0},
           "memory_capacity_mb": {"h100_10": 8e4, "h100_2": 8e4, "a10g_1": 8e4}, "memory_over_capacity": []}
    line = memory_lines(few)[0]
    assert line.index("a10g_1") < line.index("h100_2") < line.index("h100_10")


def test_run_log_and_provenance(default_run):
    out, proc = default_run
    log = (out / "run.log").read_text()
    assert "HOPS hetero_pp4 (default): 4 stages" in log and str(out / "summary.json") in log
    prov = json.loads((out / "summary.json").read_text())["provenance"]
    assert prov["scenario"] == "hetero_pp4" and prov["scenario_file"] is None and prov["hops_version"]


def test_bad_input_from_the_command_line(tmp_path):
    proc = cli("+scenario=nosuch", f"hydra.run.dir={tmp_path / 'x'}")
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "available:" in lines[0] and "Traceback" not in proc.stderr
    assert not proc.stdout.strip()


def test_a_run_ended_by_a_user_error_says_why_in_its_run_log(tmp_path):
    """Hydra made the run directory before the scenario was read: its run.log is not left empty."""
    out = tmp_path / "x"
    proc = cli("pipeline.schedule=fifo", "output.plots=false", f"hydra.run.dir={out}")
    assert proc.returncode == 2
    line = proc.stderr.strip()
    assert line.startswith("error: pipeline.schedule: unknown scheduler 'fifo'") and "\n" not in line
    log = (out / "run.log").read_text().strip()
    assert log.endswith(line) and len(log.splitlines()) == 1, log
    assert not (out / "summary.json").exists()


def test_full_error_shows_the_traceback(tmp_path):
    env = dict(os.environ, HYDRA_FULL_ERROR="1")
    proc = subprocess.run([sys.executable, "-m", "hops.run", "pipeline.schedule=fifo", "output.plots=false",
                           f"hydra.run.dir={tmp_path / 'x'}"], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode != 0 and "Traceback" in proc.stderr


# --------------------------------------------------------------------------- multiruns
def check_sweep(sweep: Path, n_jobs: int, key: str, values: list[str]) -> list[dict]:
    rows = read_csv(sweep / "sweep_results.csv")
    assert len(rows) == n_jobs
    assert [r[key] for r in rows] == values
    for r in rows:
        assert r["status"] == "ok"
        assert (sweep / r["dir"] / "summary.json").is_file()
        for metric in ("samples_per_s", "bubble_ratio", "makespan_ms", "latency_p99_ms", "peak_memory_max_mb"):
            assert float(r[metric]) > 0, metric
    return rows


def test_multirun_joblib_two_jobs_one_table(tmp_path):
    sweep = tmp_path / "sweep"
    proc = cli("-m", "simulation.seed=1,2", "output.plots=false", f"hydra.sweep.dir={sweep}")
    assert proc.returncode == 0, proc.stderr
    assert "Joblib" in proc.stdout + proc.stderr  # the default -m launcher
    rows = check_sweep(sweep, 2, "simulation.seed", ["1", "2"])
    assert [r["seed"] for r in rows] == ["1", "2"]
    assert sorted(p.name for p in sweep.iterdir() if p.is_dir()) == ["0", "1"]
    assert "sweep_results.csv" in proc.stdout


def test_one_sweep_compares_schedules_of_one_and_of_two_chunks_post_validated_where_they_can_be(tmp_path):
    """pipeline.virtual_stages is `auto` by default: each job runs its schedule's own chunks; with
    optimizer.post_validation=auto, ZB-V drops the barrier and 1F1B keeps it."""
    sweep = tmp_path / "sweep"
    proc = cli("-m", "pipeline.schedule=1f1b,zb_v", "optimizer.post_validation=auto", "output.plots=false",
               f"hydra.sweep.dir={sweep}")
    assert proc.returncode == 0, proc.stderr
    rows = check_sweep(sweep, 2, "pipeline.schedule", ["1f1b", "zb_v"])
    assert [r["virtual_stages"] for r in rows] == ["1", "2"]
    assert [r["post_validation"] for r in rows] == ["False", "True"]


def test_multirun_submitit_local(tmp_path):
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    sweep = tmp_path / "sweep"
    proc = cli("-m", "hydra/launcher=hops_submitit_local", "+scenario=mixed_pp6", "pipeline.schedule=gpipe,1f1b",
               "output.plots=false", f"hydra.sweep.dir={sweep}", timeout=300)
    assert proc.returncode == 0, proc.stderr
    check_sweep(sweep, 2, "pipeline.schedule", ["gpipe", "1f1b"])
    assert (sweep / ".submitit").is_dir()


def test_slurm_launcher_config_composes_against_the_plugin_schema():
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("config", overrides=["hydra/launcher=hops_slurm", "hydra.launcher.partition=cpu"],
                      return_hydra_config=True)
    launcher = cfg.hydra.launcher
    assert launcher._target_.endswith("SlurmLauncher") and launcher.partition == "cpu"
    assert launcher.gpus_per_node == 0 and launcher.cpus_per_task == 1


def test_sweep_with_a_bad_job_keeps_the_good_ones(tmp_path):
    sweep = tmp_path / "sweep"
    proc = cli("-m", "hydra/launcher=basic", "pipeline.schedule=fifo,gpipe", "output.plots=false",
               f"hydra.sweep.dir={sweep}")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith("error: 1 sweep job(s) failed")
    assert "Traceback" not in proc.stderr
    rows = read_csv(sweep / "sweep_results.csv")
    assert [r["status"].split(":")[0] for r in rows] == ["error", "ok"]
    assert "unknown scheduler 'fifo'" in rows[0]["status"]


def test_sweep_table_only_counts_this_sweep(tmp_path):
    """Jobs left in the sweep dir by an earlier sweep are not reported as this sweep's."""
    import time

    from hops.run.sweep import write_sweep_table

    sweep = tmp_path / "sweep"
    summary = {"throughput": {"samples_per_s": 2.0, "microbatches_per_s": 2.0, "iterations_per_s": 0.5},
               "bubble_ratio": 0.25, "makespan_ms": 10.0, "latency_ms": {"p50": 1.0, "p99": 2.0},
               "peak_memory_mb": {"a": 5.0, "b": 7.0}, "stages": [], "schedule": "1f1b", "seed": 3}
    for job, seed in ((0, 7), (5, 1)):
        (sweep / str(job) / ".hydra").mkdir(parents=True)
        (sweep / str(job) / ".hydra" / "overrides.yaml").write_text(f"- simulation.seed={seed}\n")
        (sweep / str(job) / "summary.json").write_text(json.dumps(summary))
    old = time.time() - 3600
    os.utime(sweep / "5" / ".hydra" / "overrides.yaml", (old, old))
    rows = read_csv(write_sweep_table(sweep, since=time.time() - 60))
    assert [(r["job"], r["simulation.seed"], r["status"]) for r in rows] == [("0", "7", "ok")]
    assert rows[0]["peak_memory_max_mb"] == "7.0" and rows[0]["peak_memory_device"] == "b"
    assert len(read_csv(write_sweep_table(sweep))) == 2  # without `since` (python -m hops.run.sweep DIR): all


@pytest.mark.parametrize("text", ['{"throughput": ', "[1, 2]"])
def test_a_damaged_summary_is_a_row_of_its_own_not_a_traceback(tmp_path, text):
    from hops.run.sweep import main as sweep_main, write_sweep_table

    sweep = tmp_path / "sweep"
    (sweep / "0" / ".hydra").mkdir(parents=True)
    (sweep / "0" / ".hydra" / "overrides.yaml").write_text("- simulation.seed=1\n")
    (sweep / "0" / "summary.json").write_text(text)
    (row,) = read_csv(write_sweep_table(sweep))
    assert row["status"].startswith("damaged: summary.json does not read as a run's summary")
    assert sweep_main([str(sweep)]) == 2


# --------------------------------------------------------------------------- README
def test_readme_scheduler_plugin_example_works(tmp_path):
    text = README.read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    plugin = next(b for b in blocks if "StaticOrderScheduler" in b)
    module = re.search(r"# (\w+)\.py", plugin).group(1)
    (tmp_path / f"{module}.py").write_text(plugin)
    cls = re.search(r"class (\w+)\(", plugin).group(1)
    proc = cli(f"pipeline.schedule={module}.{cls}", "output.plots=false", f"hydra.run.dir={tmp_path / 'out'}",
               cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["schedule"] == f"{module}.{cls}"


def test_readmes_sweep_table_columns_are_the_tables_columns(tmp_path):
    """README lists sweep_results.csv's columns: `job`, the overrides, then the fixed ones, in order."""
    from hops.run.sweep import write_sweep_table

    text = " ".join(README.read_text().split())
    listed = re.search(r"sweep_results\.csv`: one row per job, columns `job`, then its overrides \(.*?\), then "
                       r"(`.*?`)\.", text)
    assert listed, "README's sweep table column list not found"
    sweep = tmp_path / "sweep"
    (sweep / "0" / ".hydra").mkdir(parents=True)
    (sweep / "0" / ".hydra" / "overrides.yaml").write_text("- +scenario=h100_pair\n- simulation.seed=1\n")
    (sweep / "0" / "summary.json").write_text("{}")
    columns = list(read_csv(write_sweep_table(sweep))[0])
    assert columns[:3] == ["job", "scenario", "simulation.seed"]
    assert re.findall(r"`([^`]+)`", listed.group(1)) == columns[3:]


def test_readmes_llama_3_8b_scenario_runs_as_written_with_adams_state_in_memory(tmp_path):
    text = README.read_text()
    snippet = next(b for b in re.findall(r"```yaml\n(.*?)```", text, flags=re.S) if "# Llama-3-8B" in b)
    f = tmp_path / "llama3_8b.yaml"
    f.write_text(snippet)
    proc = cli(f"scenario_file={f}", "output.plots=false", f"hydra.run.dir={tmp_path / 'run'}")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    # A middle stage's 8 layers hold 8 x 218 M = 1.75e9 parameters (Q, O 4096^2; K, V 4096 x 1024;
    # three 4096 x 14336 FFN matrices); with Adam's mixed-precision state, >= 16 B each (2 B weights,
    # 2-4 B gradients, 12 B fp32 master and moments), >= 28 GB. Without it the GPUs showed 4-5.6 GB.
    assert min(summary["peak_memory_mb"].values()) > 28_000, summary["peak_memory_mb"]


def test_ci_runs_the_readme_test_command_verbatim_and_installs_nothing_else_from_pypi():
    """A newcomer's test run and CI's are the same run: .ci/run adds no pip install of its own."""
    command = re.search(r"^(pip install .*python -m pytest)$", README.read_text(), flags=re.M).group(1)
    assert '".[dev,servers,ray]"' in command  # everything the tests use, so nothing is skipped
    ci = [ln.strip() for ln in (REPO / ".ci" / "run").read_text().splitlines()
          if ln.strip() and not ln.strip().startswith("#")]
    assert command in ci
    assert [ln for ln in ci if "pip install" in ln] == [command]


def test_readme_has_one_test_command_and_the_gallery_image():
    text = README.read_text()
    assert text.count('HOPS_FIXTURES=../shared/fixtures python -m pytest') == 1
    assert 'pip install -e ".[dev]" && python -m hops.run' in text
    for img in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text):
        assert (REPO / img).is_file(), img


# --------------------------------------------------------------------------- the `hops` command
def hops_command(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """`hops ARGS` as the console script pip installs runs it (pyproject's [project.scripts] entry
    point, sys.argv[0] "hops"), on this checkout's code."""
    import tomllib

    module, func = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]["hops"].split(":")
    code = f"import sys; sys.argv[0] = 'hops'; from {module} import {func}; sys.exit({func}())"
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    return subprocess.run([sys.executable, "-c", code, *args], cwd=cwd or REPO, env=env, capture_output=True,
                          text=True, timeout=120)


def test_hops_help_lists_every_subcommand():
    from hops.run.app import SUBCOMMANDS

    proc = hops_command("--help")
    assert proc.returncode == 0, proc.stderr
    for name in SUBCOMMANDS:
        assert re.search(rf"^\s+hops {name} ", proc.stdout, flags=re.M), (name, proc.stdout[:1500])


def test_a_mistyped_subcommand_is_named_with_the_one_meant():
    proc = hops_command("plna", "request.yaml")
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        "error: hops: unknown subcommand 'plna'; expected sweep, autoresearch, plan, or KEY=VALUE overrides for a "
        "run; did you mean `hops plan`?"], proc.stderr


def test_readmes_list_of_hops_commands_has_every_subcommand():
    from hops.run.app import SUBCOMMANDS

    text = README.read_text()
    block = text[text.index("It installs one command, `hops`"):]
    block = block[:block.index("```", block.index("```") + 3)]
    for name in SUBCOMMANDS:
        assert re.search(rf"^hops {name} ", block, flags=re.M), (name, block)


@pytest.mark.parametrize("command", ["python -m hops.run.sweep", "hops sweep"])
def test_sweep_of_a_missing_directory_says_so_in_one_line(tmp_path, command):
    missing = tmp_path / "multirun" / "nope"

    def run(*args):
        if command == "hops sweep":
            return hops_command("sweep", *args)
        return subprocess.run([sys.executable, "-m", "hops.run.sweep", *args], cwd=REPO, capture_output=True,
                              text=True, timeout=120)

    proc = run(str(missing))
    assert (proc.returncode, proc.stderr, proc.stdout) == (2, f"error: sweep directory not found: {missing}\n", "")
    proc = run()
    assert (proc.returncode, proc.stderr) == (2, f"usage: {command} SWEEP_DIR\n")
    single = tmp_path / "one_run"
    assert cli("output.plots=false", f"hydra.run.dir={single}").returncode == 0
    proc = run(str(single))
    assert proc.returncode == 2 and proc.stderr.startswith(f"error: {single} is one run's directory, not a sweep's")
    assert not (single / "sweep_results.csv").exists()
