"""`python -m hops.run`: the Hydra app around `hops.simulate`.

    python -m hops.run                                   # the default scenario (hetero_pp4)
    python -m hops.run +scenario=h100_pair pipeline.schedule=gpipe
    python -m hops.run scenario_file=path/to/hops.base.yaml simulation.seed=3
    python -m hops.run catalog.interconnects.ethernet.bandwidth_gbps=12.5
    python -m hops.run -m +scenario=hetero_pp4 pipeline.schedule=gpipe,1f1b simulation.seed=1,2

Config tree: conf/ at the repository root (conf/config.yaml). Every run writes into
Hydra's run directory: summary.json, events.csv, timeline.png, dashboard.png,
trace.json (plus Hydra's .hydra/ with the resolved config); a -m sweep also writes
<sweep dir>/sweep_results.csv (hops.run.sweep.SweepTable).

User errors (bad scenario, bad override, unknown scenario name) end with one line on
stderr and exit code 2; HYDRA_FULL_ERROR=1 shows the traceback instead.
This module imports Hydra; the hops core never does. matplotlib is imported only when
plots are drawn (output.plots=true).
"""
from __future__ import annotations

import os
import re
import shlex
import sys
from functools import partial
from pathlib import Path
from typing import Any

from hops.errors import EXIT_INTERRUPTED, EXIT_USER_ERROR, HopsError
from hops.outputs.files import busiest_device, schedule_text, slowest_stage
from hops.run import charts_alongside as alongside
from hops.run.progress import Progress
from hops.run.run_dir import finished


def _conf_dir() -> Path:
    """The Hydra config tree: the copy a wheel ships as hops/conf, else the checkout's conf/."""
    package = Path(__file__).resolve().parents[1]  # hops/
    return package / "conf" if (package / "conf" / "config.yaml").is_file() else package.parent / "conf"


CONF_DIR = _conf_dir()
SECTIONS = ("simulation", "pipeline", "hardware", "optimizer", "failure", "output", "overrides")
GROUP_SECTIONS = SECTIONS[:-1]  # config groups; `overrides` is a plain key of conf/config.yaml
TOP_LEVEL_KEYS = ("scenario_file", "catalog")  # conf/config.yaml's other keys
# Mappings whose keys are open-ended (preset names, device ids, the failure schema):
# `catalog.x.y=v` is passed to Hydra as `++catalog.x.y=v`, so no `+` is needed to add a key.
# Their keys are validated by hops itself (Catalog.load / the scenario parser).
OPEN_PREFIXES = ("catalog.", "overrides.", "failure.")
ERROR_FILE = "error.txt"  # a sweep job's user error, read by hops.run.sweep
_USER_FULL_ERROR = False  # the user's HYDRA_FULL_ERROR=1 (main() sets the variable for its own use)


# --------------------------------------------------------------------------- the task
def task(cfg) -> float:
    """One Hydra job: compose the scenario, simulate, write outputs, print a summary.

    Returns samples/s, so an optimizing sweeper (e.g. Optuna) can use it as its objective.
    """
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from hops.outputs.files import SUMMARY

    hc = HydraConfig.get()
    run_dir = Path(hc.runtime.output_dir)
    multirun = hc.mode == RunMode.MULTIRUN
    # A summary.json left by an earlier run into this directory would make this one look
    # complete if it is interrupted: summary.json is written last, and only by this run.
    (run_dir / SUMMARY).unlink(missing_ok=True)
    # Sweep jobs run side by side and print one line each: the sweep's own line counts them.
    progress = Progress(enabled=False if multirun else None, bar_format="{desc}[{elapsed}]")
    charts = None
    try:
        doc, name = scenario_document(cfg, hc)
        catalog = load_catalog(cfg)
        charts = start_charts(doc)

        import warnings

        from hops import simulate
        from hops.scenario import LegacyScenarioWarning

        progress.phase(f"hops: simulating {_size(doc)}")
        unused = _failure_settings_ignored(doc, list(hc.overrides.task))
        if unused:
            progress.write(f"note: failure.enabled is false: the command line's {', '.join(unused)} "
                           f"{'is' if len(unused) == 1 else 'are'} not applied (add failure.enabled=true)")

        def iteration_done(done: int, total: int) -> None:
            progress.phase(f"hops: simulating {_size(doc)}, {done} of {total} iterations done")

        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", LegacyScenarioWarning)
            result = simulate(doc, catalog=catalog, on_iteration=iteration_done)
        for w in caught:  # legacy-field notes: one line each (docs/legacy_scenarios.md)
            if issubclass(w.category, LegacyScenarioWarning):
                progress.write(f"note: {w.message}")
            else:
                warnings.showwarning(w.message, w.category, w.filename, w.lineno)
    except HopsError as exc:
        progress.close()
        if charts is not None:
            charts.stop()
        path, overrides = getattr(exc, "path", ""), list(hc.overrides.task)
        src = ((_scenario_file(cfg) if not _overridden(path, overrides) else None) if cfg.get("scenario_file")
               else _scenario_holding(path, hc.runtime.choices.get("scenario"), overrides))
        if src and getattr(exc, "source", "") is None and not str(exc).startswith("scenario_file"):
            exc = type(exc)(exc.path, str(exc).removeprefix(f"{exc.path}: "), str(src))  # name the file
        return _job_failed(str(exc), hc, run_dir, multirun, exc)
    except BaseException:
        progress.close()
        if charts is not None:
            charts.stop()
        raise
    (run_dir / ERROR_FILE).unlink(missing_ok=True)
    sm = result.summary
    sm["provenance"].update(scenario=name.removesuffix(" (default)"),
                            scenario_file=_scenario_file(cfg))
    title = (f"{name} · {schedule_text(sm)} · {sm['throughput']['samples_per_s']:.2f} samples/s · "
             f"bubble {100 * sm['bubble_ratio']:.1f} %")
    try:
        with progress:  # erased before the summary prints
            paths = write_outputs(result, run_dir, title=title, catalog_overrides=catalog_overrides(cfg),
                                  progress=progress, charts=charts)
    except OSError as exc:  # a full disk, a read-only or occupied output path
        message = user_error_message(exc)
        if message is None:
            raise
        return _job_failed(message, hc, run_dir, multirun, exc)
    finally:
        if charts is not None:
            charts.stop()  # joined by write_outputs, or a failure before it could be
    finished(run_dir)  # the previous run's files, set aside when this one started, can go
    text = job_line(result.summary, hc, run_dir) if multirun else format_summary(result, name, paths)
    _emit(text, over_progress=multirun)
    _to_job_log(text)
    return float(result.summary["throughput"]["samples_per_s"])


def start_charts(doc: dict) -> alongside.ChartProcess | None:
    """The chart process (hops.run.charts_alongside), forked before the simulation so it imports
    matplotlib meanwhile, when the scenario's output section says the charts are drawn alongside
    (write_outputs decides again on the parsed section, and draws in turn or starts one itself)."""
    out = doc.get("output") or {}
    if out.get("plots", True) is not True or out.get("plots_alongside") not in (None, True):
        return None
    wanted = out.get("plots_alongside") or alongside.available()
    return alongside.ChartProcess() if wanted and alongside.supported() else None


def _job_failed(message: str, hc, run_dir: Path, multirun: bool, exc: BaseException) -> float:
    """A job ended by a user error: in a sweep, recorded for the sweep table and NaN returned,
    so one bad combination does not lose the others (hops.run.sweep reports failed jobs and
    makes the sweep exit with code 2); in a single run, one line and exit code 2, here, before
    Hydra adds its own "Error executing job" line. Either way the job's run.log gets the line:
    the run directory Hydra made for it says why it holds no outputs."""
    _to_job_log(f"error: {message}", "ERROR")
    if multirun:
        try:
            run_dir.mkdir(parents=True, exist_ok=True)
            (run_dir / ERROR_FILE).write_text(f"{message}\n")
        except OSError:
            pass  # the sweep table then reports the job as not finished
        print(f"[job {hc.job.num}] error: {message}", file=sys.stderr, flush=True)
        return float("nan")
    if _USER_FULL_ERROR:
        raise exc
    print(f"error: {message}", file=sys.stderr)
    sys.exit(EXIT_USER_ERROR)


def _scenario_file(cfg) -> str | None:
    if not cfg.get("scenario_file"):
        return None
    from hydra.utils import to_absolute_path

    return str(Path(to_absolute_path(str(cfg.scenario_file))))


def _scenario_holding(path: str, scenario: str | None, overrides: list[str]) -> str | None:
    """conf/scenario/<scenario>.yaml when that file writes the field at `path` and no command-line
    override does, else None.

    Why: Hydra composes a +scenario=NAME file into the config before HOPS checks it, so an
    error in it would name the field but not the file a user has to open."""
    from hops.schema.document import parse_yaml

    if not scenario or not path or _overridden(path, overrides):
        return None
    file = CONF_DIR / "scenario" / f"{scenario}.yaml"
    try:
        node = parse_yaml(file.read_text(), str(file))
    except (OSError, HopsError):
        return None
    for part in re.split(r"\.|\[(\d+)\]\.?", path):
        if part is None or part == "":
            continue
        key = int(part) if part.isdigit() else part
        if (isinstance(node, dict) and key in node) or (isinstance(node, list) and isinstance(key, int)
                                                        and key < len(node)):
            node = node[key]
        else:
            return None
    return str(file)


def _failure_settings_ignored(doc: dict, overrides: list[str]) -> list[str]:
    """The failure.* keys the command line sets while the run's failure section is disabled."""
    if (doc.get("failure") or {}).get("enabled"):
        return []
    keys = (o.partition("=")[0].lstrip("+~") for o in overrides)
    return sorted({k for k in keys if k.startswith("failure.") and k != "failure.enabled"})


def _overridden(path: str, overrides: list[str]) -> bool:
    """Whether a command-line override sets the field at `path` (or a field above or below it):
    then an error there is the command line's, not the scenario file's."""
    for o in overrides:
        key = re.sub(r"\.(\d+)(?=\.|$)", r"[\1]", o.partition("=")[0].lstrip("+~"))
        if path == key or path.startswith((key + ".", key + "[")) or key.startswith((path + ".", path + "[")):
            return True
    return False


def _size(doc: dict) -> str:
    sim, pipe = doc.get("simulation") or {}, doc.get("pipeline") or {}
    return (f"{len(pipe.get('stages') or [])} stages x {sim.get('microbatches', '?')} microbatches x "
            f"{sim.get('batches', 1)} iterations")


def _to_job_log(text: str, level: str = "INFO") -> None:
    """Hydra's job log (<run dir>/run.log) gets the printed summary (or error) too."""
    import logging

    record = logging.LogRecord("hops.run", getattr(logging, level), __file__, 0, text, None, None)
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler):
            handler.handle(record)


def scenario_document(cfg, hc) -> tuple[dict, str]:
    """The six-section scenario this job runs, as a plain dict, and a display name."""
    from omegaconf import OmegaConf

    from hops.errors import ScenarioError
    from hops.run.file_deletions import PREFIX

    choices = dict(hc.runtime.choices)
    unknown = sorted(set(cfg.keys()) - {*SECTIONS, *TOP_LEVEL_KEYS, PREFIX.rstrip(".")})
    if unknown:  # `+foo=1` adds a key Hydra's struct mode lets through; nothing would read it
        raise ScenarioError(str(unknown[0]), f"unknown top-level key; expected a scenario section "
                                             f"({', '.join(SECTIONS)}) or one of {', '.join(TOP_LEVEL_KEYS)}")
    if cfg.get("scenario_file") == "":
        raise ScenarioError("scenario_file", "empty; expected the path of a scenario YAML file")
    if cfg.get("scenario_file"):
        if choices.get("scenario"):
            raise ScenarioError("scenario_file", "use either +scenario=NAME or scenario_file=PATH, not both")
        from hydra.utils import to_absolute_path

        from hops.engine.loop import MAX_STAGES
        from hops.scenario import kind_of, load_document

        path = Path(to_absolute_path(str(cfg.scenario_file)))
        if path.is_dir():
            raise ScenarioError("scenario_file", f"{path} is a directory; expected a scenario YAML file")
        if not path.is_file():
            raise ScenarioError("scenario_file", f"file not found: {path}" if not path.exists()
                                else f"{path} is not a regular file; expected a scenario YAML file")
        data, _ = load_document(path)  # a top level that is not a mapping is refused there, naming the file
        for key in SECTIONS:  # before anything below reads a section as a mapping
            if data.get(key) is not None and not isinstance(data[key], dict):
                raise ScenarioError(key, f"expected a mapping of its fields, got {kind_of(data[key])}", str(path))
        stages = data["pipeline"].get("stages") if isinstance(data.get("pipeline"), dict) else None
        if isinstance(stages, list) and len(stages) > MAX_STAGES:  # before OmegaConf copies it (~1 ms per stage)
            raise ScenarioError("pipeline.stages", f"{len(stages)} stages; the engine runs at most {MAX_STAGES}",
                                str(path))
        doc = OmegaConf.create(data)
        apply_section_overrides(doc, list(hc.overrides.task), cfg)
        name = path.parent.name if path.name == "hops.base.yaml" else _run_name(path) or path.stem
        return OmegaConf.to_container(doc, resolve=True), name
    container = OmegaConf.to_container(cfg, resolve=True)
    doc = {key: container[key] for key in SECTIONS if key in container}
    return doc, choices.get("scenario") or "hetero_pp4 (default)"


def _run_name(path: Path) -> str | None:
    """A run directory's scenario.yaml re-runs under the name of the run that wrote it (its summary.json)."""
    import json

    from hops.outputs.files import SUMMARY

    summary = path.parent / SUMMARY
    if path.name != "scenario.yaml" or not summary.is_file():
        return None
    try:
        name = json.loads(summary.read_text())["provenance"]["scenario"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return name if isinstance(name, str) and name else None


def apply_section_overrides(doc, overrides: list[str], cfg) -> None:
    """Re-apply the command line's section overrides onto a scenario loaded from a file.

    Hydra has already composed (and so checked) them against conf/; here the same
    overrides are replayed, with Hydra's semantics, onto the file's own sections:
    `a.b=v` sets (merging mappings), `~a.b` deletes, `pipeline=NAME` takes the whole
    section from the config group. Everything else (hydra.*, catalog.*, scenario_file)
    is not part of the scenario and is skipped.
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf, open_dict

    from hops.run.file_deletions import deleted_key

    for ov in OverridesParser.create().parse_overrides(overrides):
        key = ov.key_or_group
        delete = ov.is_delete()
        gone = deleted_key(key)  # `~key` as main() handed it to Hydra (hops.run.file_deletions)
        if gone is not None:
            key, delete = gone, True
        head = key.split(".", 1)[0]
        if head not in SECTIONS:
            continue
        if "." not in key and head in GROUP_SECTIONS:  # a config-group choice: the composed section
            doc[head] = OmegaConf.to_container(cfg[head], resolve=True)
            continue
        if delete:
            parent_key, _, leaf = key.rpartition(".")
            parent = OmegaConf.select(doc, parent_key) if parent_key else doc
            if parent is not None and leaf in parent:
                with open_dict(parent):
                    del parent[leaf]
            continue
        OmegaConf.update(doc, key, ov.value(), merge=True, force_add=True)


def catalog_overrides(cfg) -> dict[str, Any]:
    """The run's `catalog.*` mapping flattened to the dotted paths Catalog.load takes."""
    from omegaconf import OmegaConf

    from hops.model.hardware import dotted_items

    node = cfg.get("catalog")
    return dotted_items(OmegaConf.to_container(node, resolve=True) if node is not None else {})


def load_catalog(cfg):
    """Presets with the run's `catalog.*` overrides applied."""
    from hops.model.hardware import Catalog, CatalogError

    try:
        return Catalog.load(catalog_overrides(cfg))
    except CatalogError as exc:
        raise CatalogError(f"catalog: {exc}") from None


def write_outputs(result, run_dir: Path, title: str | None = None, catalog_overrides: dict | None = None,
                  progress: Progress | None = None, charts_alongside: bool | None = None,
                  charts: alongside.ChartProcess | None = None) -> dict[str, Path]:
    """Every output of a run, each renamed into place once complete, summary.json last.

    A directory without summary.json is an interrupted (or failed) run, never a complete one.
    `progress` is told which file is being written (of how many). `charts_alongside`: draw the
    PNGs in a forked child while this process writes the rest (hops.run.charts_alongside);
    None: as `output.plots_alongside` says, and where that is null, wherever it is available.
    `charts`: that child, already started (`start_charts`, before the simulation); it is ended
    here in every case, used or not.
    """
    from hops.outputs import files as outputs

    run_dir.mkdir(parents=True, exist_ok=True)
    out = result.scenario.output
    tl = result.timeline
    plan: list[tuple[str, str, Any]] = []  # (key in paths, file, writer: path -> None, or the text itself)
    if out.get("events", True):
        plan.append(("events", "events.csv", lambda p: outputs.write_events_csv(tl, p)))
    # exactly what ran: re-run with scenario_file=<this>
    plan.append(("scenario", "scenario.yaml", _scenario_yaml(result.scenario.raw, catalog_overrides)))
    if out.get("plots", True):  # partials, not lambdas: a chart process is sent them pickled
        from hops.outputs.plots import plot_dashboard, plot_timeline  # cheap: matplotlib loads when one draws

        plan.append(("timeline", "timeline.png", partial(plot_timeline, tl, title=title)))
        plan.append(("dashboard", "dashboard.png",  # names scenario + schedule
                     partial(plot_dashboard, result.summary, tl)))
        if result.extras.get("horizon") is not None:
            from hops.outputs.plots.progress import plot_progress

            plan.append(("progress", "progress.png", partial(plot_progress, result.extras["horizon"], title=title)))
    if out.get("chrome_trace", True):
        gz = bool(out.get("chrome_trace_gz", False))

        from hops.outputs.chrome_trace import write_chrome_trace

        plan.append(("trace", "trace.json.gz" if gz else "trace.json",
                     lambda p: write_chrome_trace(tl, p, compress=gz)))
    paths: dict[str, Path] = {"summary": run_dir / outputs.SUMMARY}  # listed first, written last
    total = len(plan) + 1
    if charts_alongside is None:
        charts_alongside = out.get("plots_alongside")
    if charts_alongside is None:
        charts_alongside = alongside.available()
    charts_alongside = charts_alongside and alongside.supported()  # elsewhere `true` draws in turn
    try:
        if charts_alongside and any(name.endswith(".png") for _, name, _ in plan):
            charts = charts or alongside.ChartProcess()
            charts.draw([(key, partial(outputs.write_with, run_dir / name, writer))
                         for key, name, writer in plan if name.endswith(".png")])
            plan = [job for job in plan if not job[1].endswith(".png")]
        elif charts is not None:  # started before the simulation, for charts this run does not draw there
            charts.stop()
            charts = None
        for i, (key, name, writer) in enumerate(plan, 1):
            if progress is not None:
                progress.phase(f"hops: writing {name} ({i} of {total} files, {len(tl):,} events"
                               + (", the charts alongside)" if charts else ")"))
            paths[key] = (outputs.write_text(run_dir / name, writer) if isinstance(writer, str)
                          else outputs.write_with(run_dir / name, writer))
        if charts is not None:
            if progress is not None:
                progress.phase(f"hops: drawing the charts ({len(plan) + 1} to {total - 1} of {total} files)")
            paths.update(charts.join())
    finally:
        if charts is not None:
            charts.stop()
    if progress is not None:
        progress.phase(f"hops: writing summary.json ({total} of {total} files)")
    paths["summary"] = result.write_summary(run_dir)
    for key, rel in (out.get("paths") or {}).items():  # output.paths (legacy output.timeline, ...)
        if key in paths:
            import shutil

            dest = run_dir / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(paths[key], dest)
            paths[f"{key} (output.paths)"] = dest
    if out.get("dir"):
        print(f"note: output.dir={out['dir']} is ignored by hops.run; outputs go to Hydra's run dir "
              f"(set hydra.run.dir=DIR)", file=sys.stderr)
    return paths


def _scenario_yaml(doc: dict, catalog_overrides: dict | None = None) -> str:
    """The scenario as it ran, headed by the command that re-runs it exactly: the run's
    `catalog.*` overrides change presets, not the scenario, so they go on that command line.
    The file names itself THIS_FILE, not its path: the same run writes the same bytes wherever
    its directory is (and however hops was started), and a moved run directory does not point back
    at the old one."""
    import json

    import yaml

    args = [f"catalog.{k}={v if isinstance(v, str) else json.dumps(v)}" for k, v in (catalog_overrides or {}).items()]
    head = ("# The scenario this run simulated (all overrides applied). Re-run it exactly with (THIS_FILE: this file):\n"
            f"#   {' '.join(['python -m hops.run scenario_file=THIS_FILE', *map(shlex.quote, args)])}\n")
    return head + yaml.safe_dump(dict(doc), sort_keys=False, default_flow_style=None, width=120)


# --------------------------------------------------------------------------- printing
ERASE_LINE = "\r\x1b[K"  # carriage return + ANSI "erase to end of line"


def _emit(text: str, *, over_progress: bool = False) -> None:
    """Print to stdout; a closed pipe (`python -m hops.run | head`) is not an error.

    `over_progress`: a sweep job's line, printed while the launching process may be drawing
    its progress line on the same terminal; on a terminal the line is erased first, so the
    job's line starts at the left margin (the progress line is redrawn under it).
    """
    if over_progress and sys.stdout.isatty():
        text = ERASE_LINE + text
    try:
        print(text, flush=True)
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())


def _idle_split(s: dict) -> str:
    idle = s.get("idle_breakdown")
    if not idle:
        return ""
    return f" (pipeline {100 * idle['pipeline']:.1f} + iteration end {100 * idle['iteration_end']:.1f})"


COMPACT_DEVICES = 8  # above this many devices the memory line is a digest, not a list


def memory_lines(s: dict) -> list[str]:
    """Peak memory per device (pipeline order, then natural: h100_2 before h100_10), or a digest for big clusters."""
    from hops.outputs.files import natural_key

    peak, cap = s.get("peak_memory_mb", {}), s.get("memory_capacity_mb", {})
    if not peak:
        return []
    # pipeline order (the order the summary's stages print in), then devices no stage uses
    order = list(dict.fromkeys([st["device"] for st in s.get("stages", []) if st["device"] in peak]
                               + sorted(peak, key=natural_key)))
    over = [d for d in order if d in (s.get("memory_over_capacity") or [])]

    def gb(d: str) -> str:
        c = cap.get(d, float("nan")) / 1000
        return f"{d} {peak[d] / 1000:.1f}/{c:.0f} GB" if not c >= 1e6 else f"{d} {peak[d] / 1000:.1f}/{c:.3g} GB"

    if len(order) > COMPACT_DEVICES:
        ratio = {d: peak[d] / cap[d] if cap.get(d) else float("nan") for d in order}
        hi, lo = max(order, key=lambda d: ratio[d]), min(order, key=lambda d: ratio[d])
        lines = [f"  peak memory    {len(order)} devices, fullest {gb(hi)} ({100 * ratio[hi]:.0f} %), "
                 f"emptiest {gb(lo)} ({100 * ratio[lo]:.0f} %)"]
        if over:
            shown = ", ".join(over[:6]) + (f" and {len(over) - 6} more" if len(over) > 6 else "")
            lines.append(f"  !! over memory capacity: {len(over)} devices: {shown}")
        return lines
    lines: list[str] = []
    row: list[str] = []
    for item in map(gb, order):  # wrap at ~100 columns
        if row and 17 + len("   ".join([*row, item])) > 100:
            lines.append(("  peak memory    " if not lines else " " * 17) + "   ".join(row))
            row = []
        row.append(item)
    lines.append(("  peak memory    " if not lines else " " * 17) + "   ".join(row))
    if over:
        lines.append(f"  !! over memory capacity: {', '.join(over)}")
    return lines


def format_summary(result, name: str, paths: dict[str, Path]) -> str:
    s = result.summary
    tp, its = s["throughput"], s["window"]["iterations"]
    lines = [f"HOPS {name}: {len(s.get('stages', []))} stages, schedule {schedule_text(s)}, seed {s.get('seed')}",
             f"  throughput     {tp['samples_per_s']:.2f} samples/s  ({tp['microbatches_per_s']:.2f} microbatches/s"
             + (f" per pipeline x {tp['data_parallel_replicas']} data-parallel replicas"
                if tp.get("data_parallel_replicas", 1) > 1 else "") + f", {tp['iterations_per_s']:.3f} iterations/s)",
             f"  bubble         {100 * s['bubble_ratio']:.1f} %{_idle_split(s)}   makespan {s['makespan_ms']:.0f} ms over "
             f"{its} iteration{'s' if its != 1 else ''}, microbatch latency p50 {s['latency_ms']['p50']:.1f} / "
             f"p99 {s['latency_ms']['p99']:.1f} ms"]
    worst = slowest_stage(s)
    if worst:
        e = worst["expected_ms"]
        util = f", {100 * worst['utilization']:.0f} % busy" if worst.get("utilization") is not None else ""
        back = (f"B {e['B']:.1f} + W {e['W']:.1f}" if worst.get("backward") == "split"
                else f"BW {worst['per_microbatch_ms'] - e['F']:.1f}")
        lines.append(f"  slowest stage  {worst['stage']} on {worst['device']} ({worst['gpu']}): F {e['F']:.1f} + "
                     f"{back} = {worst['per_microbatch_ms']:.1f} ms per microbatch{util}")
    elif busiest_device(s) is not None:  # virtual stages: chunks, not stages, are what the devices run
        dev, share = busiest_device(s)
        gpu = next((st["gpu"] for st in s.get("stages", []) if st["device"] == dev), "?")
        lines.append(f"  busiest device {dev} ({gpu}): {100 * share:.0f} % busy, {s.get('virtual_stages')} model "
                     f"chunks per device")
    lines += memory_lines(s)
    fails = s.get("failures")
    if isinstance(fails, dict):
        intr = fails.get("interruptions", {})
        good = fails.get("goodput_ratio")
        hours = fails.get("horizon_ms", 0.0) / 3.6e6
        lines.append(f"  failures       {intr.get('unexpected', fails.get('count', '?'))} unexpected + "
                     f"{intr.get('planned', 0)} planned interruptions over {hours:.0f} h"
                     + (f", goodput {100 * good:.1f} %" if good is not None else ""))
    lines.append("outputs:")
    lines += [f"  {p}" for p in paths.values()]
    return "\n".join(lines)


def job_line(summary: dict, hc, run_dir: Path) -> str:
    """One line per sweep job (jobs run in parallel; their full summaries are in their dirs)."""
    from hops.run.file_deletions import as_typed

    ovs = " ".join(as_typed(o).lstrip("+") for o in hc.overrides.task)
    return (f"[job {hc.job.num}] {ovs or '(defaults)'}: {summary['throughput']['samples_per_s']:.2f} samples/s, "
            f"bubble {100 * summary['bubble_ratio']:.1f} % -> {run_dir}")


# --------------------------------------------------------------------------- errors
def _available(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


def user_error_message(exc: BaseException, argv: list[str] | None = None) -> str | None:
    """One line for an error caused by the user's input; None for anything else (a bug).

    `argv` (the command line) lets a mistyped key's hint be the corrected command.
    """
    if isinstance(exc, HopsError):
        return str(exc)
    if isinstance(exc, OSError) and exc.filename:  # e.g. an unwritable hydra.run.dir
        from hops.run.run_dir import cannot_write

        return cannot_write(exc)
    import yaml

    if isinstance(exc, yaml.YAMLError):  # a config file Hydra composes (conf/, +scenario=NAME) does not parse
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        where = f"{mark.name}: line {mark.line + 1}" if mark else "a config file"
        return f"{where}: invalid YAML ({getattr(exc, 'problem', None) or _squash(str(exc))})"
    if isinstance(exc, ValueError) and str(exc).startswith("Config group override must be"):  # `simulation=5`
        group = next((a for a in argv or [] if a.partition("=")[0].lstrip("+~") in (*GROUP_SECTIONS, "scenario")
                      and (not re.fullmatch(r"[A-Za-z_][\w-]*", a.partition("=")[2])
                           or a.partition("=")[2] in ("null", "None"))), None)  # YAML's null reaches Hydra as None
        if group is not None:
            key, _, value = group.lstrip("+~").partition("=")
            off = f"; {key}.enabled=false turns it off" if key in ("failure", "optimizer") else ""
            return (f"{key}={value}: {key} is a config group; give one of its options by name "
                    f"({', '.join(_available(key)) or 'none'}) or set a field with {key}.FIELD=VALUE{off}")
    missing = missing_slurm_tools(exc)
    if missing:
        return (f"hydra/launcher=hops_slurm needs Slurm's {' and '.join(missing)} on PATH (not found: run the sweep "
                f"from a Slurm login node, or check it here with hydra/launcher=hops_submitit_local)")
    try:
        from hydra.errors import HydraException, MissingConfigException, OverrideParseException
        from omegaconf.errors import OmegaConfBaseException
    except ImportError:  # pragma: no cover
        return None
    if isinstance(exc, OverrideParseException):
        return f"bad override {getattr(exc, 'override', '')!r}: {_squash(str(exc))}"
    if isinstance(exc, MissingConfigException):
        missing = str(getattr(exc, "missing_cfg_file", "") or "")
        group, _, option = missing.rpartition("/")
        options = list(getattr(exc, "options", None) or []) or (_available(group) if group else [])
        if group == "hydra/launcher" and option == "ray":
            return "hydra/launcher=hops_ray needs the Ray launcher plugin: pip install -e \".[ray]\""
        if group:
            what = "scenario" if group == "scenario" else f"{group} option"
            return f"{group}: unknown {what} {option!r}; available: {', '.join(options) or '(none)'}"
        return _squash(str(exc))
    if isinstance(exc, (HydraException, OmegaConfBaseException)):
        cause = exc.__cause__ if isinstance(exc.__cause__, OmegaConfBaseException) else exc
        text = str(exc)
        full_key = getattr(cause, "full_key", None)
        if "not in struct" in str(cause) and full_key:
            parent = getattr(cause, "parent_node", None)
            keys = sorted(str(k) for k in parent.keys()) if parent is not None and hasattr(parent, "keys") else []
            if _scenario_field(str(full_key)):
                return (f"{full_key}: this configuration does not set it yet, so Hydra needs a + to add it: "
                        f"{_with_plus(str(full_key), argv)}")
            hint = f"; expected one of {', '.join(keys)}" if keys else ""
            return f"{full_key}: unknown key{hint}{_did_you_mean(str(full_key), keys, argv)}"
        if "No match in the defaults list" in text and "'scenario'" in text:
            return f"scenario: use +scenario=NAME (with a +); available: {', '.join(_available('scenario'))}"
        if "Multiple values for scenario" in text:
            return "scenario: only one +scenario=NAME per run"
        return _squash(text + (f" ({_squash(str(exc.__cause__))})" if exc.__cause__ is not None else ""))
    return None


def missing_slurm_tools(exc: BaseException) -> list[str]:
    """The Slurm executables submitit needs but cannot find, when `exc` is submitit saying so; else []."""
    import shutil
    import traceback

    if not isinstance(exc, RuntimeError):
        return []
    frames = traceback.extract_tb(exc.__traceback__)
    if not any(f"submitit{os.sep}slurm" in f.filename for f in frames):
        return []
    return [tool for tool in ("sbatch", "srun") if shutil.which(tool) is None]


def _scenario_field(full_key: str) -> bool:
    """Whether the scenario schema has a field at `full_key` ("pipeline.stages[0].layers"): a key
    the composed config lacks only because its scenario did not set it, such as `layers` on a
    stage given by `compute`. Hydra refuses to add such a key without a +."""
    import typing

    from pydantic import BaseModel

    from hops.schema import _unwrap as unwrap  # Optional / Annotated to the type inside, as the schema reads it
    from hops.schema.scenario import ScenarioModel

    ann = ScenarioModel
    for part in re.split(r"\.|\[\d+\]", full_key):
        if part == "":
            continue
        ann = unwrap(ann)
        if typing.get_origin(ann) is dict:
            return True  # an open mapping (scheduler_options): hops checks its keys
        if typing.get_origin(ann) is list and typing.get_args(ann):
            ann = unwrap(typing.get_args(ann)[-1])
            if part.isdigit():
                continue
        if not (isinstance(ann, type) and issubclass(ann, BaseModel) and part in ann.model_fields):
            return False
        ann = ann.model_fields[part].annotation
    return True


def _with_plus(full_key: str, argv: list[str] | None) -> str:
    """The user's own command with a + before the override of `full_key`."""
    dotted = re.sub(r"\[(\d+)\]", r".\1", full_key)
    args = [f"+{a}" if a.partition("=")[0] == dotted else a for a in argv or []]
    return f"{PROG} {' '.join(shlex.quote(a) for a in args)}" if args != list(argv or []) else f"+{dotted}=..."


def _did_you_mean(full_key: str, keys: list[str], argv: list[str] | None) -> str:
    """"; did you mean: python -m hops.run pipeline.schedule=gpipe" — the user's own command, key corrected.

    No "+key=" hint: a key the scenario schema does not know is refused by hops anyway.
    """
    import difflib

    parent, _, leaf = full_key.rpartition(".")
    close = difflib.get_close_matches(leaf, keys, n=1, cutoff=0.6)
    if not close:
        return ""
    fixed = f"{parent}.{close[0]}" if parent else close[0]
    args = list(argv or [])
    for i, a in enumerate(args):
        key, eq, value = a.partition("=")
        bare = key.lstrip("+~")
        if eq and (bare == full_key or bare.startswith(full_key + ".")):
            args[i] = f"{key[:len(key) - len(bare)]}{fixed}{bare[len(full_key):]}={value}"
            break
    else:
        return f"; did you mean {fixed}?"
    return f"; did you mean: {PROG} {' '.join(shlex.quote(a) for a in args)}"


def _squash(text: str) -> str:
    """Hydra messages are multi-line; the user gets one line."""
    parts = [p.strip() for p in text.replace("\t", " ").splitlines() if p.strip()]
    parts = [p for p in parts if not p.startswith(("Set the environment variable HYDRA_FULL_ERROR",
                                                       "full_key:", "object_type="))]
    return "; ".join(parts)


def open_namespace_args(argv: list[str]) -> list[str]:
    """`catalog.a.b=v` -> `++catalog.a.b=v` (and overrides., failure.): add-or-override."""
    return [f"++{a}" if a.startswith(OPEN_PREFIXES) and "=" in a else a for a in argv]


# --------------------------------------------------------------------------- entry point
def main(argv: list[str] | None = None) -> None:
    """Run the Hydra app; user errors become one line on stderr and exit code 2."""
    import hydra

    if not (CONF_DIR / "config.yaml").is_file():
        print(f"error: config tree not found at {CONF_DIR} (a broken install: reinstall hops with pip install .)",
              file=sys.stderr)
        sys.exit(EXIT_USER_ERROR)
    from hops.run import file_deletions

    args = file_deletions.for_hydra(open_namespace_args(list(sys.argv[1:] if argv is None else argv)), SECTIONS)
    global _USER_FULL_ERROR
    user_full_error = _USER_FULL_ERROR = os.environ.get("HYDRA_FULL_ERROR") == "1"
    # Make Hydra raise instead of printing its multi-line report; we print one line ourselves.
    os.environ["HYDRA_FULL_ERROR"] = "1"
    saved_argv = sys.argv
    sys.argv = [saved_argv[0] if saved_argv else "hops.run", *args]
    app = hydra.main(config_path=str(CONF_DIR), config_name="config", version_base="1.3")(task)
    try:
        app()
        from hops.run.sweep import FAILED_SWEEPS, SweepError

        if FAILED_SWEEPS:
            raise SweepError(FAILED_SWEEPS.pop())
        from hops.run.mlflow_runs import FAILED as FAILED_MLFLOW

        if FAILED_MLFLOW:
            raise HopsError(FAILED_MLFLOW.pop())
    except BrokenPipeError:  # `python -m hops.run --help | head`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except KeyboardInterrupt:  # Ctrl-C: the run directory keeps the last finished run (run_dir.put_back)
        print("interrupted", file=sys.stderr)
        sys.exit(EXIT_INTERRUPTED)
    except Exception as exc:  # noqa: BLE001 - classified below
        message = None if user_full_error else user_error_message(exc, list(args))
        if message is None:
            raise
        print(f"error: {message}", file=sys.stderr)
        sys.exit(EXIT_USER_ERROR)
    finally:
        from hops.run.run_dir import release

        release()  # the run dir this process took (hops.run.run_dir.OwnRunDir), also after a user error's exit
        sys.argv = saved_argv
        if not user_full_error:
            os.environ.pop("HYDRA_FULL_ERROR", None)


PROG = "python -m hops.run"  # how the user ran us, for suggested commands (`hops` via cli())
SUBCOMMANDS = {"sweep": "hops.run.sweep", "autoresearch": "autoresearch.__main__", "plan": "hops.plan"}


def cli() -> None:
    """The `hops` console script: the run app, plus `hops sweep DIR`, `hops plan REQUEST` and
    `hops autoresearch ...`.

    A bare first word is never a Hydra override (those hold `=` or start with + ~ -), so
    the subcommands cannot shadow one. `hops` being a real executable is what Hydra's
    shell completion needs: eval "$(hops -sc install=bash)".
    """
    global PROG
    PROG = "hops"
    first = sys.argv[1] if len(sys.argv) > 1 else ""
    if first and first not in SUBCOMMANDS and re.fullmatch(r"[A-Za-z][\w-]*", first):  # no override: no = + ~ -
        import difflib

        close = difflib.get_close_matches(first, SUBCOMMANDS, n=1)
        hint = f"; did you mean `hops {close[0]}`?" if close else ""
        print(f"error: hops: unknown subcommand {first!r}; expected {', '.join(SUBCOMMANDS)}, or KEY=VALUE "
              f"overrides for a run{hint}", file=sys.stderr)
        sys.exit(EXIT_USER_ERROR)
    if first in SUBCOMMANDS:
        import importlib

        name = sys.argv[1]
        sub = importlib.import_module(SUBCOMMANDS[name])
        sys.exit(sub.main(sys.argv[2:], prog="hops sweep") if name == "sweep" else sub.main(sys.argv[2:]))
    main()
