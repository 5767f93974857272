"""`hops.simulate`: scenario in, Result (summary + Timeline) out. No Hydra, no MLflow here."""
from __future__ import annotations

import dataclasses
import functools
import numbers
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from pydantic_core import PydanticCustomError

from hops.engine import loop as engine
from hops.errors import ScenarioError
from hops.outputs import files as outputs
from hops.model import physical
from hops.model.compute import StageTimes
from hops.model.hardware import Catalog, Topology
from hops.model.memory import memory_summary
from hops.metrics import summarize
from hops.provenance import model_fingerprint
from hops.scenario import Scenario, load_scenario
from hops.schema.fields import check_number
from hops.timeline import Timeline


@dataclass
class Result:
    scenario: Scenario
    summary: dict
    timeline: Timeline
    extras: dict = field(default_factory=dict)
    source: str | None = None  # the scenario file simulate() read, if it read one

    def write(self, out_dir: str | Path) -> dict[str, Path]:
        """summary.json and events.csv (byte-identical for the same scenario and seed).

        events.csv first, summary.json last and each renamed into place (hops.outputs.files), so
        an interrupted write never leaves a summary.json that looks complete.
        """
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        paths = {}
        if self.scenario.output.get("events", True):
            paths["events"] = outputs.write_with(out / "events.csv", self.timeline.write_csv)
        paths["summary"] = self.write_summary(out)
        return {"summary": paths.pop("summary"), **paths}

    def write_summary(self, out_dir: str | Path) -> Path:
        """summary.json, keys in natural order (h100_2 before h100_10), fsynced: the completion marker."""
        prov = self.summary.get("provenance")
        if isinstance(prov, dict) and self.source and not prov.get("scenario_file"):
            prov["scenario_file"] = self.source
        return outputs.write_text(Path(out_dir) / outputs.SUMMARY, outputs.summary_json(self.summary), sync=True)


def strict_json(obj) -> str:
    """JSON that every parser reads: a NaN or infinite number (an empty window, say) becomes null."""
    return outputs.summary_json(obj)


def simulate(scenario: Any, seed: int | None = None, *, catalog: Catalog | None = None,
             on_iteration: Callable[[int, int], None] | None = None) -> Result:
    """Simulate a scenario (dict, OmegaConf config, path or Scenario) with the given seed.

    ``on_iteration(done, total)`` is called after each simulated iteration (for a progress line)."""
    catalog = catalog or Catalog.load()
    sc = scenario if isinstance(scenario, Scenario) else load_scenario(scenario, catalog)
    seed = sc.seed if seed is None else _seed(seed)
    topo = Topology(sc, catalog)
    res = engine.run(sc, catalog, seed, topology=topo, on_iteration=on_iteration)
    summary = summarize(res.timeline)
    # one pipeline is simulated; samples/s counts every data-parallel replica of it (Timeline.samples_per_microbatch)
    summary["throughput"]["data_parallel_replicas"] = sc.dp_degree
    summary.update({
        "schedule": sc.schedule,
        "scheduler_effective": getattr(getattr(res.scheduler, "chosen", None), "name", res.scheduler.name),
        "virtual_stages": res.extras["virtual_stages"],  # model chunks per stage that ran (virtual_stages: auto)
        "post_validation": sc.post_validation,  # whether the optimizer barrier was lifted (post_validation: auto)
        "seed": seed,
        "stages": [{"stage": i, "device": st.device, "gpu": topo.devices[st.device].gpu,
                    "expected_ms": {"F": e.f, "B": e.b, "W": e.w, "BW": e.bw}, "layers": e.layers,
                    "backward": backward,
                    # a tensor-parallel group: its GPUs and the collectives its passes leave exposed
                    **({"tensor_parallel": {"devices": list(st.gpus), "exposed_collective_ms":
                                            {"F": e.tp_f, "B": e.tp_b, "BW": e.tp_bw}}} if st.tp > 1 else {})}
                   for i, (st, (e, backward)) in enumerate(zip(sc.stages, stage_times(sc, res)))],
        "peak_in_flight": res.peak_in_flight,
        "link_contention": res.link_stats,
        "activation_mb": res.extras["activation_mb"],
        "model_fingerprint": model_fingerprint(catalog),  # the same value the calibration ledger records
    })
    summary.update(memory_summary(sc, topo, catalog, res.peak_held, res.extras["activation_mb"],
                                  ends=res.extras["model_ends"], virtual_stages=res.extras["virtual_stages"]))
    physical.check_memory(sc, summary["peak_memory_mb"])
    # the same for a dict, an OmegaConf config or a file; write_summary() adds the file it came from
    summary["provenance"] = {**code_provenance(), "scenario": None, "scenario_file": None}
    extras = dict(res.extras)
    if sc.failure is not None:
        extras["horizon"] = horizon = run_horizon(sc, topo, catalog, summary, seed)
        from hops.failures import summary_block

        summary["failures"] = summary_block(horizon)
        summary["stragglers"] = {d: f for d, f in sorted(res.extras["stragglers"].items()) if f != 1.0}
    source = str(Path(scenario).resolve()) if isinstance(scenario, (str, Path)) else None
    return Result(sc, summary, res.timeline, extras, source=source)


def stage_times(sc: Scenario, res) -> list[tuple[StageTimes, str]]:
    """Each stage's expected per-microbatch times as the run placed its work, and how its backward
    ran ("fused" BW, "split" into B and W, or "either", a scheduler's choice per microbatch).

    With several model chunks per device the stage's times are the sum of its chunks' as the
    schedule placed them: ZB-V runs the LM head on device 0, not on the last device, so the
    stage's own one-chunk times would describe a placement that did not run."""
    chunks, placement = res.extras["chunks"], res.extras["placement"]
    split = res.extras["split_backward"]
    modes = [split] * len(placement) if isinstance(split, bool) else list(split)
    per_stage = []
    for i, own in enumerate(res.expected):
        mine = [k for k, (stage, _) in enumerate(placement) if stage == i]
        kinds = {"either" if modes[k] == "either" else "split" if modes[k] else "fused" for k in mine}
        backward = kinds.pop() if len(kinds) == 1 else "either"
        if chunks is None:
            per_stage.append((own, backward))
            continue
        total = {f.name: sum(getattr(chunks[k], f.name) for k in mine) for f in dataclasses.fields(StageTimes)}
        per_stage.append((StageTimes(**total), backward))
    return per_stage


@functools.lru_cache(maxsize=1)
def code_provenance() -> dict:
    """The hops version and, when hops runs from a git checkout, its commit (once per process)."""
    from importlib import metadata

    try:
        version = metadata.version("hops")
    except metadata.PackageNotFoundError:
        version = None
    commit = None
    here = Path(__file__).resolve().parent
    try:  # only when hops/ itself is the checkout's (not a wheel inside a venv inside some repo)
        out = subprocess.run(["git", "rev-parse", "--show-toplevel", "HEAD"], cwd=here, capture_output=True,
                             text=True, timeout=10)
        lines = out.stdout.split()
        if out.returncode == 0 and len(lines) == 2 and Path(lines[0]).resolve() == here.parent:
            commit = lines[1]
    except (OSError, subprocess.SubprocessError):
        pass
    return {"hops_version": version, "git_commit": commit}


def _seed(value: Any) -> int:
    """The `seed` argument checked as the scenario's `simulation.seed` is (a numpy integer is an integer)."""
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        value = int(value)
    try:
        return check_number(value, ge=0, integer=True, cap=2**63 - 1)
    except PydanticCustomError as exc:
        raise ScenarioError("seed", exc.message()) from None


def run_horizon(sc: Scenario, topo: Topology, catalog: Catalog, summary: dict, seed: int):
    """Carry the detailed run's steady-state iteration time over the failure horizon.

    Stragglers were already applied to the detailed run, so the horizon gets slowdown 1.0
    (drawing them again would count them twice).
    """
    from hops.failures import resolve_device_mtbf, simulate_horizon

    cfg = sc.failure
    mtbf = None
    if cfg.devices.mtbf_hours is not None:
        pairs = [(d.id, d.gpu) for d in sc.devices]
        mtbf = resolve_device_mtbf(cfg, pairs, {k: v["mtbf_hours"] for k, v in catalog.devices.items()})
    iteration_ms = 1000.0 / summary["throughput"]["iterations_per_s"]
    comm = summary["communication_overhead"]
    # the job is every data-parallel replica of the pipeline: each replica's GPUs fail, and any
    # failure stops the synchronous job (failure.devices.count, when given, says it instead)
    return simulate_horizon(cfg, iteration_ms=iteration_ms, n_devices=len(sc.devices) * sc.dp_degree, seed=seed,
                            straggler_slowdown=1.0, comm_fraction=min(1.0, comm / (1.0 + comm)),
                            device_mtbf_hours=mtbf,
                            samples_per_iteration=sc.microbatches * sc.micro_batch_size * sc.dp_degree)
