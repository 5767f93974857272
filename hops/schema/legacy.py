"""Scenarios written for the original HOPS simulator, read as HOPS scenarios.

`translate` rewrites every legacy field into the HOPS field with the same meaning
(docs/legacy_scenarios.md has the table) and returns one note per field that HOPS models
differently, naming the replacement, so nothing is dropped silently. A document without
legacy fields comes back unchanged (the same object), so current scenarios pay nothing.
"""
from __future__ import annotations

import copy
import math
from typing import Any

from hops.errors import ScenarioError, echo
from hops.schema.scenario import DEFAULT_STACK

LEGACY_OUTPUTS = {"summary_json": "summary", "trace_csv": "events", "timeline": "timeline", "dashboard": "dashboard"}
LEGACY_FAILURE = ("device_failure_probability", "link_failure_probability", "check_interval_ms", "recovery_time_ms")
LEGACY_OPTIMIZER = ("gradient_mb", "accumulation_steps", "allreduce", "update")


def is_legacy(doc: Any) -> bool:
    if not isinstance(doc, dict):
        return False
    pipe, opt, fail_, out = (doc.get(k) if isinstance(doc.get(k), dict) else {} for k in
                             ("pipeline", "optimizer", "failure", "output"))
    stages = pipe.get("stages") if isinstance(pipe.get("stages"), list) else []
    computes = [st.get("compute") for st in stages if isinstance(st, dict) and isinstance(st.get("compute"), dict)]
    links = [ln for sec in (doc.get("hardware"), doc.get("overrides")) if isinstance(sec, dict)
             for ln in (sec.get("links") if isinstance(sec.get("links"), list) else []) if isinstance(ln, dict)]
    return (any(c.get("mode") == "explicit" or "efficiency" in c or "jitter" in c for c in computes)
            or any(k in opt for k in LEGACY_OPTIMIZER) or any(k in fail_ for k in LEGACY_FAILURE)
            or any(k in out for k in LEGACY_OUTPUTS) or any("latency_us" in ln for ln in links))


class _Translator:
    def __init__(self, doc: dict, source: str | None, catalog):
        self.doc, self.source, self.catalog = doc, source, catalog
        self.notes: list[str] = []

    def fail(self, path: str, message: str):
        raise ScenarioError(path, message, self.source)

    def number(self, value, path: str, *, ge=None, lt=None) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            self.fail(path, f"expected a finite number, got {echo(value)}")
        if (ge is not None and value < ge) or (lt is not None and value >= lt):
            bounds = " and ".join(t for t in (f">= {ge:g}" if ge is not None else "",
                                              f"< {lt:g}" if lt is not None else "") if t)
            self.fail(path, f"got {echo(value)}; expected a number {bounds}")
        return float(value)

    def distribution(self, d: Any, path: str, scale: float = 1.0) -> dict:
        """A legacy {type, mean, std} (or a HOPS {kind, ...}) as a HOPS distribution, times `scale`."""
        if not isinstance(d, dict):
            self.fail(path, f"expected a distribution mapping {{type, mean, std}}, got {type(d).__name__}")
        if "kind" in d:  # already HOPS-shaped
            out = dict(d)
            for key in ("ms", "mean_ms", "std_ms"):
                if key in out and scale != 1.0:
                    out[key] = self.number(out[key], f"{path}.{key}") * scale
            return out
        kind = d.get("type")
        keys = {"normal": {"type", "mean", "std"}, "constant": {"type", "value", "mean"},
                "lognormal": {"type", "mean", "std", "cv"}}
        if kind not in keys:
            self.fail(f"{path}.type", f"got {echo(kind)}; expected one of {', '.join(keys)} (legacy) "
                                      f"or a HOPS distribution {{kind: constant|normal|lognormal|pareto, ...}}")
        for key in d:
            if key not in keys[kind]:
                self.fail(f"{path}.{key}", f"unknown key; expected one of {', '.join(sorted(keys[kind]))}")
        if kind == "constant":
            given = d.get("value", d.get("mean"))
            return {"kind": "constant", "ms": self.number(given, f"{path}.value", ge=0) * scale}
        mean = self.number(d.get("mean"), f"{path}.mean", ge=0)
        if kind == "normal":
            return {"kind": "normal", "mean_ms": mean * scale,
                    "std_ms": self.number(d.get("std", 0.0), f"{path}.std", ge=0) * scale}
        cv = d["cv"] if "cv" in d else self.number(d.get("std", 0.0), f"{path}.std", ge=0) / mean if mean else 0.0
        return {"kind": "lognormal", "mean_ms": mean * scale, "cv": self.number(cv, f"{path}.cv", ge=0)}

    # ------------------------------------------------------------------ sections
    def stages(self) -> None:
        pipe = self.doc.get("pipeline")
        if not isinstance(pipe, dict) or not isinstance(pipe.get("stages"), list):
            return
        k = pipe.get("backward_factor", 2.0)
        k = self.number(k, "pipeline.backward_factor", ge=0) if k is not None else 2.0
        eff_stages, jitter_stages = [], []
        for i, st in enumerate(pipe["stages"]):
            if not isinstance(st, dict) or not isinstance(st.get("compute"), dict):
                continue
            c, path = st["compute"], f"pipeline.stages[{i}].compute"
            if c.get("mode") == "explicit":
                if "jitter" in c:
                    self.fail(f"{path}.jitter", "explicit stages carry their spread in distribution.std; "
                                                "jitter applies to analytical stages only")
                if "distribution" not in c:
                    self.fail(f"{path}.distribution", "missing; expected a distribution {type, mean, std}")
                extra = set(c) - {"mode", "distribution", "backward"}
                if extra:
                    self.fail(f"{path}.{sorted(extra)[0]}", "unknown key; expected one of backward, distribution, mode")
                forward = self.distribution(c["distribution"], f"{path}.distribution")
                backward = (self.distribution(c["backward"], f"{path}.backward") if c.get("backward") is not None
                            else self.distribution(c["distribution"], f"{path}.distribution", scale=k))
                st["compute"] = {"mode": "distribution", "forward": forward, "backward": backward}
                continue
            if "efficiency" in c:
                self.efficiency(st, c.pop("efficiency"), f"{path}.efficiency")
                eff_stages.append(i)
            if "jitter" in c:
                j = c.pop("jitter")
                jp = f"{path}.jitter"
                if not isinstance(j, dict) or j.get("type", "normal") != "normal" or set(j) - {"type", "mean", "std"}:
                    self.fail(jp, f"expected {{type: normal, mean: 0, std: <relative spread>}}, got {echo(j)}")
                if self.number(j.get("mean", 0.0), f"{jp}.mean") != 0.0:
                    self.fail(f"{jp}.mean", f"got {echo(j['mean'])}; expected 0 (a systematic slowdown is "
                                            f"overrides.devices.<id>.slowdown)")
                st["compute_jitter"] = self.number(j.get("std", 0.0), f"{jp}.std", ge=0)
                jitter_stages.append(i)
        if eff_stages:
            self.notes.append(f"{_stages(eff_stages)}.compute.efficiency: HOPS has no per-stage efficiency; folded "
                              f"into overrides.devices.<id>.peak_tflops (x compute / compute_time_coefficient) and "
                              f"memory_bandwidth_gbps (x memory) of each stage's device")
        if jitter_stages:
            self.notes.append(f"{_stages(jitter_stages)}.compute.jitter: HOPS draws mean-1 lognormal noise with cv = "
                              f"the legacy std (replacement: pipeline.stages[i].compute_jitter)")

    def efficiency(self, stage: dict, eff: Any, path: str) -> None:
        if not isinstance(eff, dict) or set(eff) - {"compute", "memory"}:
            self.fail(path, f"expected {{compute: 0..1, memory: 0..1}}, got {echo(eff)}")
        device = stage.get("device")
        gpu = next((d.get("gpu") for d in (self.doc.get("hardware") or {}).get("devices") or []
                    if isinstance(d, dict) and d.get("id") == device), None)
        if gpu not in self.catalog.devices:
            return  # the schema check names the bad device / gpu
        overrides = self.doc.setdefault("overrides", {}) or {}
        self.doc["overrides"] = overrides
        devs = overrides.setdefault("devices", {}) or {}
        overrides["devices"] = devs
        mine = devs.setdefault(device, {})
        preset = self.catalog.devices[gpu]
        pipe = self.doc.get("pipeline")
        stack = (pipe.get("stack") if isinstance(pipe, dict) else None) or DEFAULT_STACK
        coeff = float(self.catalog.stacks.get(stack, {}).get("compute_time_coefficient", 1.0))
        for key, field_, factor in (("compute", "peak_tflops", coeff), ("memory", "memory_bandwidth_gbps", 1.0)):
            if key not in eff:
                continue
            e = self.number(eff[key], f"{path}.{key}")  # the bound below: (0, 1]
            if not 0 < e <= 1:
                self.fail(f"{path}.{key}", f"got {echo(eff[key])}; expected a number in (0, 1]")
            value = float(preset[field_]) * e * factor
            prev = mine.get(f"_legacy_{field_}")
            if prev is not None and prev != value:
                self.fail(f"{path}.{key}", f"differs from another stage on device {echo(device)}; HOPS takes one "
                                           f"value per device (overrides.devices.{device}.{field_})")
            mine[field_] = mine[f"_legacy_{field_}"] = value

    def links(self) -> None:
        for section in ("hardware", "overrides"):
            sec = self.doc.get(section)
            items = sec.get("links") if isinstance(sec, dict) else None
            for i, ln in enumerate(items if isinstance(items, list) else []):
                if isinstance(ln, dict) and "latency_us" in ln:
                    path = f"{section}.links[{i}]"
                    if ln.get("latency_ms") is not None:
                        self.fail(f"{path}.latency_us", "give latency_ms or latency_us, not both")
                    ln["latency_ms"] = self.number(ln.pop("latency_us"), f"{path}.latency_us", ge=0) / 1000.0

    def optimizer(self) -> None:
        opt = self.doc.get("optimizer")
        if not isinstance(opt, dict) or not any(k in opt for k in LEGACY_OPTIMIZER):
            return
        acc = opt.pop("accumulation_steps", None)
        if acc is not None:
            if isinstance(acc, bool) or not isinstance(acc, int) or acc < 1:
                self.fail("optimizer.accumulation_steps", f"got {echo(acc)}; expected an integer >= 1")
            if acc > 1:
                sim = self.doc.get("simulation") or {}
                batches, mbs = sim.get("batches", 1), sim.get("microbatches")
                if not isinstance(batches, int) or not isinstance(mbs, int) or batches % acc:
                    self.fail("optimizer.accumulation_steps", f"got {acc}; simulation.batches ({echo(batches)}) must "
                                                              f"be a multiple of it")
                sim["batches"], sim["microbatches"] = batches // acc, mbs * acc
                self.notes.append(f"optimizer.accumulation_steps: HOPS steps the optimizer once per iteration; "
                                  f"simulated as {batches // acc} iterations of {mbs * acc} microbatches "
                                  f"(replacement: simulation.batches / simulation.microbatches)")
        allreduce = opt.pop("allreduce", None)
        if allreduce is not None:
            if not isinstance(allreduce, dict) or set(allreduce) - {"algorithm"}:
                self.fail("optimizer.allreduce", f"expected {{algorithm: ring|naive}}, got {echo(allreduce)}")
            dp = opt.setdefault("data_parallel", {}) or {}
            opt["data_parallel"] = dp
            if "algorithm" in allreduce:
                if allreduce["algorithm"] not in ("ring", "naive"):  # named as the file names it
                    self.fail("optimizer.allreduce.algorithm", f"got {echo(allreduce['algorithm'])}; expected ring "
                                                               f"or naive")
                dp.setdefault("algorithm", allreduce["algorithm"])
        gradient = opt.pop("gradient_mb", None)
        if gradient is not None or allreduce is not None:
            grad = "" if gradient is None else f" (gradient_mb={echo(gradient)} is not used)"
            degree = (opt.get("data_parallel") or {}).get("degree", 1)
            self.notes.append(f"optimizer.gradient_mb/allreduce: HOPS all-reduces each stage's weights_mb across "
                              f"optimizer.data_parallel.degree replicas (here {echo(degree)}){grad}; the algorithm is "
                              f"optimizer.data_parallel.algorithm")
        update = opt.pop("update", None)
        if update is not None:
            dist = self.distribution(update, "optimizer.update")
            if opt.get("step_ms") is not None:
                self.fail("optimizer.update", "give optimizer.step_ms or the legacy update, not both")
            mean = dist.get("ms", dist.get("mean_ms"))
            opt["step_ms"] = mean
            spread = {k: v for k, v in dist.items() if k in ("std_ms", "cv") and v}
            self.notes.append(f"optimizer.update: HOPS's optimizer step is a fixed optimizer.step_ms; using the mean "
                              f"{mean:g} ms" + (f" ({', '.join(f'{k}={v:g}' for k, v in spread.items())} "
                                                f"not modeled)" if spread else ""))

    def failure(self) -> None:
        f = self.doc.get("failure")
        if not isinstance(f, dict) or not any(k in f for k in LEGACY_FAILURE):
            return
        legacy = {k: f.pop(k) for k in LEGACY_FAILURE if k in f}
        probs = {k: self.number(legacy[k], f"failure.{k}", ge=0, lt=1) for k in
                 ("device_failure_probability", "link_failure_probability") if k in legacy}
        interval = legacy.get("check_interval_ms")
        if any(probs.values()) and interval is None:
            self.fail("failure.check_interval_ms", "missing; the legacy failure probabilities are per check interval")
        out = []
        for key, section in (("device_failure_probability", "devices"), ("link_failure_probability", "links")):
            p = probs.get(key)
            if p:
                ms = self.number(interval, "failure.check_interval_ms", ge=0)
                if ms <= 0:
                    self.fail("failure.check_interval_ms", f"got {echo(interval)}; expected a number > 0")
                hours = ms / -math.log1p(-p) / 3.6e6  # exponential time to failure with P(fail in interval) = p
                sec = f.setdefault(section, {}) or {}
                f[section] = sec
                sec["mtbf_hours"] = hours
                out.append(f"{section}.mtbf_hours={hours:.4g}")
        if "recovery_time_ms" in legacy:
            minutes = self.number(legacy["recovery_time_ms"], "failure.recovery_time_ms", ge=0) / 60000.0
            ck = f.setdefault("checkpoint", {}) or {}
            f["checkpoint"] = ck
            ck.setdefault("restart_minutes", minutes)
            ck.setdefault("detection_minutes", 0.0)
            out.append(f"checkpoint.restart_minutes={minutes:g}")
            if probs.get("link_failure_probability"):
                f["links"].setdefault("repair_minutes", minutes)
                out.append(f"links.repair_minutes={minutes:g}")
        self.notes.append("failure: legacy per-check failure probabilities and recovery time became "
                          f"{', '.join(out) or 'nothing (all zero)'}; HOPS restarts the job from its last checkpoint "
                          "over failure.horizon_hours (replacement: failure.devices/links/checkpoint, "
                          "docs/failures.md)")

    def output(self) -> None:
        out = self.doc.get("output")
        if not isinstance(out, dict) or not any(k in out for k in LEGACY_OUTPUTS):
            return
        paths = out.setdefault("paths", {}) or {}
        out["paths"] = paths
        for legacy, name in LEGACY_OUTPUTS.items():
            if legacy in out:
                if paths.get(name) is not None:
                    self.fail(f"output.{legacy}", f"give output.{legacy} or output.paths.{name}, not both")
                paths[name] = out.pop(legacy)


def _stages(indices: list[int]) -> str:
    if len(indices) == 1:
        return f"pipeline.stages[{indices[0]}]"
    return f"pipeline.stages[{indices[0]}..{indices[-1]}]" if indices == list(range(indices[0], indices[-1] + 1)) \
        else "pipeline.stages[" + ",".join(map(str, indices)) + "]"


def translate(doc: Any, source: str | None, catalog) -> tuple[Any, list[str]]:
    """(HOPS document, notes); `doc` itself is returned untouched when it has no legacy field."""
    if not is_legacy(doc):
        return doc, []
    t = _Translator(copy.deepcopy(doc), source, catalog)
    t.stages()
    t.links()
    t.optimizer()
    t.failure()
    t.output()
    for dev in ((t.doc.get("overrides") or {}).get("devices") or {}).values():
        if isinstance(dev, dict):
            for key in [k for k in dev if k.startswith("_legacy_")]:
                del dev[key]
    return t.doc, t.notes
