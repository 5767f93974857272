"""Scenario: the typed, validated form of a six-section HOPS YAML document.

Everything a simulation needs is checked here, up front, so that a user mistake
surfaces as one ScenarioError naming the field path (``pipeline.stages[2].device``)
instead of a traceback deep in the engine. The fixtures' ``hops.base.yaml`` files
are the reference format and load unchanged.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import yaml

from .errors import ScenarioError

SECTIONS = ("simulation", "pipeline", "hardware", "optimizer", "failure", "output", "overrides")
REQUIRED_SECTIONS = ("simulation", "pipeline", "hardware")
PRECISIONS = ("bf16", "fp16", "fp32")
DIST_KINDS = {
    "constant": {"ms"},
    "normal": {"mean_ms", "std_ms"},
    "lognormal": {"mean_ms", "cv"},
    "pareto": {"mean_ms", "shape"},
}


@dataclass(frozen=True)
class Distribution:
    """A latency distribution in ms. `pareto` is the heavy-tailed one (shape > 1 keeps the mean finite)."""

    kind: str
    params: Mapping[str, float]

    @property
    def mean_ms(self) -> float:
        return float(self.params["ms"] if self.kind == "constant" else self.params["mean_ms"])


@dataclass(frozen=True)
class StageCompute:
    mode: str  # analytical | distribution
    tflop: float = 0.0
    memory_mb: float = 0.0
    forward: Distribution | None = None
    backward: Distribution | None = None
    backward_b: Distribution | None = None
    backward_w: Distribution | None = None


@dataclass(frozen=True)
class Stage:
    device: str
    weights_mb: float
    compute: StageCompute
    layers: float | None = None
    activation_memory_mb: float | None = None


@dataclass(frozen=True)
class DeviceSpec:
    id: str
    gpu: str
    node: str
    socket: int = 0


@dataclass(frozen=True)
class LinkOverride:
    src: str
    dst: str
    values: Mapping[str, float]


@dataclass(frozen=True)
class Scenario:
    batches: int
    microbatches: int
    seed: int
    micro_batch_size: int
    schedule: str
    scheduler_options: Mapping[str, Any]
    precision: str
    backward_factor: float
    backward_split: bool
    activation_grad_fraction: float
    hidden_dim: int | None
    seq_len: int | None
    vocab_size: int | None
    tied_embeddings: bool | None  # None: the model constant decides
    activation_mb: float | None
    compute_jitter: float
    host_overhead: Distribution | None
    stages: tuple[Stage, ...]
    devices: tuple[DeviceSpec, ...]
    same_node: str | None
    cross_node: str | None
    links: tuple[LinkOverride, ...]  # explicit links (type preset) and measured overrides
    device_overrides: Mapping[str, Mapping[str, float]]
    optimizer_enabled: bool
    optimizer_step_ms: tuple[float, ...] | None  # per stage
    dp_degree: int
    dp_algorithm: str
    dp_interconnect: str | None
    failure: Any
    output: Mapping[str, Any]
    raw: Mapping[str, Any] = field(repr=False, compare=False, default_factory=dict)
    virtual_stages: int = 1  # model chunks per stage (interleaved 1F1B's v); the schedule places them

    @property
    def n_stages(self) -> int:
        return len(self.stages)

    def device(self, device_id: str) -> DeviceSpec:
        return next(d for d in self.devices if d.id == device_id)


# --------------------------------------------------------------------------- parsing helpers
class _Reader:
    """Typed access to one mapping, naming the full path of whatever is wrong."""

    def __init__(self, data: Any, path: str, source: str | None):
        self.path, self.source = path, source
        if data is None:
            data = {}
        if not isinstance(data, Mapping):
            self.fail(path, f"expected a mapping, got {type(data).__name__}")
        self.data = dict(data)

    def fail(self, path: str, message: str):
        raise ScenarioError(path, message, self.source)

    def sub(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def check_keys(self, allowed) -> None:
        for key in self.data:
            if key not in allowed:
                self.fail(self.sub(str(key)), f"unknown key; expected one of {', '.join(sorted(allowed))}")

    def get(self, key, kind, default=..., *, positive=False, nonneg=False, choices=None, lo=None, hi=None):
        path = self.sub(key)
        if key not in self.data or self.data[key] is None:
            if default is ...:
                self.fail(path, f"missing; expected {_kind_name(kind)}")
            return default
        value = self.data[key]
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if kind is int and isinstance(value, float) and value.is_integer():
            value = int(value)
        if not isinstance(value, kind) or (kind in (int, float) and isinstance(value, bool)):
            self.fail(path, f"expected {_kind_name(kind)}, got {value!r}")
        if choices is not None and value not in choices:
            self.fail(path, f"got {value!r}; expected one of {', '.join(map(str, choices))}")
        if positive and not value > 0:
            self.fail(path, f"got {value!r}; expected a number > 0")
        if nonneg and not value >= 0:
            self.fail(path, f"got {value!r}; expected a number >= 0")
        if lo is not None and not (lo < value < hi):
            self.fail(path, f"got {value!r}; expected a number strictly between {lo} and {hi}")
        return value

    def reader(self, key) -> "_Reader":
        return _Reader(self.data.get(key), self.sub(key), self.source)


def _kind_name(kind) -> str:
    return {int: "an integer", float: "a number", str: "a string", bool: "true or false",
            list: "a list", dict: "a mapping"}.get(kind, str(kind))


def parse_distribution(data: Any, path: str, source: str | None) -> Distribution:
    r = _Reader(data, path, source)
    kind = r.get("kind", str, choices=tuple(DIST_KINDS))
    r.check_keys({"kind"} | DIST_KINDS[kind])
    params = {}
    for key in sorted(DIST_KINDS[kind]):
        nonneg = key in ("std_ms", "cv")
        params[key] = r.get(key, float, nonneg=nonneg, positive=not nonneg)
    if kind == "pareto" and params["shape"] <= 1:
        r.fail(r.sub("shape"), f"got {params['shape']!r}; expected > 1 so the mean is finite")
    return Distribution(kind, params)


# --------------------------------------------------------------------------- loading
def load_document(source: Any) -> tuple[dict, str | None]:
    """Accept a path, a dict or an OmegaConf config; return a plain dict and its source name."""
    if isinstance(source, (str, Path)):
        from .traces.guard import check_path

        path = Path(source)
        check_path(path)  # a held-out fixture's hops.base.yaml (hops.simulate, hops.run) is not read
        if not path.is_file():
            raise ScenarioError("scenario", f"file not found: {path}")
        try:
            data = yaml.safe_load(path.read_text())
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f"line {mark.line + 1}" if mark else "?"
            raise ScenarioError(where, f"invalid YAML ({getattr(exc, 'problem', exc)})", str(path)) from None
        return (data if data is not None else {}), str(path)
    if type(source).__module__.startswith("omegaconf"):  # checked by name: the core never imports omegaconf
        from omegaconf import OmegaConf

        return OmegaConf.to_container(source, resolve=True), None
    if isinstance(source, Mapping):
        return dict(source), None
    raise ScenarioError("scenario", f"expected a path, dict or OmegaConf config, got {type(source).__name__}")


def load_scenario(source: Any, catalog=None) -> Scenario:
    """Parse and validate a scenario document against the preset catalog."""
    from .hardware import Catalog
    from .schedulers import resolve_scheduler

    data, src = load_document(source)
    catalog = catalog or Catalog.load()
    top = _Reader(data, "", src)
    top.check_keys(SECTIONS)
    for name in REQUIRED_SECTIONS:
        if name not in data:
            top.fail(name, "missing section")

    sim = top.reader("simulation")
    sim.check_keys({"batches", "microbatches", "seed", "micro_batch_size"})
    pipe = top.reader("pipeline")
    pipe.check_keys({"schedule", "scheduler_options", "precision", "backward_factor", "backward_split", "model",
                     "stages", "activation_mb", "compute_jitter", "host_overhead", "virtual_stages"})
    hw = top.reader("hardware")
    hw.check_keys({"devices", "interconnect", "links"})

    devices = _parse_devices(hw, catalog)
    device_ids = {d.id for d in devices}
    stages = _parse_stages(pipe, device_ids, src)

    model = pipe.reader("model")
    model.check_keys({"hidden_dim", "seq_len", "vocab_size", "tied_embeddings"})
    split = pipe.reader("backward_split")
    split.check_keys({"enabled", "activation_grad_fraction"})

    schedule = pipe.get("schedule", str, "1f1b")
    try:
        resolve_scheduler(schedule)
    except (KeyError, ImportError) as exc:
        pipe.fail(pipe.sub("schedule"), str(exc.args[0] if exc.args else exc))

    ic = hw.reader("interconnect")
    ic.check_keys({"same_node", "cross_node"})
    same_node = ic.get("same_node", str, None, choices=tuple(catalog.interconnects))
    cross_node = ic.get("cross_node", str, None, choices=tuple(catalog.interconnects))
    links = _parse_links(hw, top, device_ids, catalog)

    opt = top.reader("optimizer")
    opt.check_keys({"enabled", "step_ms", "data_parallel"})
    dp = opt.reader("data_parallel")
    dp.check_keys({"degree", "algorithm", "interconnect"})

    overrides = top.reader("overrides")
    overrides.check_keys({"devices", "links"})
    dev_over = _parse_device_overrides(overrides, device_ids)

    out = top.reader("output")
    out.check_keys({"dir", "plots", "events", "chrome_trace"})
    output = {"dir": out.get("dir", str, None), "plots": out.get("plots", bool, True),
              "events": out.get("events", bool, True), "chrome_trace": out.get("chrome_trace", bool, True)}

    host = pipe.data.get("host_overhead")
    scenario = Scenario(
        batches=sim.get("batches", int, 1, positive=True),
        microbatches=sim.get("microbatches", int, positive=True),
        seed=sim.get("seed", int, 0),
        micro_batch_size=sim.get("micro_batch_size", int, 1, positive=True),
        schedule=schedule,
        scheduler_options=dict(pipe.get("scheduler_options", dict, {})),
        precision=pipe.get("precision", str, "bf16", choices=PRECISIONS),
        backward_factor=pipe.get("backward_factor", float, 2.0, positive=True),
        backward_split=split.get("enabled", bool, False),
        activation_grad_fraction=split.get("activation_grad_fraction", float, 0.5, lo=0.0, hi=1.0),
        hidden_dim=model.get("hidden_dim", int, None, positive=True),
        seq_len=model.get("seq_len", int, None, positive=True),
        vocab_size=model.get("vocab_size", int, None, positive=True),
        tied_embeddings=model.get("tied_embeddings", bool, None),
        activation_mb=pipe.get("activation_mb", float, None, positive=True),
        compute_jitter=pipe.get("compute_jitter", float, 0.0, nonneg=True),
        host_overhead=parse_distribution(host, pipe.sub("host_overhead"), src) if host is not None else None,
        stages=stages,
        devices=devices,
        same_node=same_node,
        cross_node=cross_node,
        links=links,
        device_overrides=dev_over,
        optimizer_enabled=opt.get("enabled", bool, False),
        optimizer_step_ms=_step_ms(opt, len(stages)),
        dp_degree=dp.get("degree", int, 1, positive=True),
        dp_algorithm=dp.get("algorithm", str, "ring", choices=("ring", "naive")),
        dp_interconnect=dp.get("interconnect", str, None, choices=tuple(catalog.interconnects)),
        failure=_parse_failure(data.get("failure"), src),
        output=output,
        raw=data,
        virtual_stages=pipe.get("virtual_stages", int, 1, positive=True),
    )
    _check_hops(scenario, catalog, src)
    return scenario


def _parse_devices(hw: _Reader, catalog) -> tuple[DeviceSpec, ...]:
    items = hw.get("devices", list)
    if not items:
        hw.fail(hw.sub("devices"), "expected a non-empty list of devices")
    devices, seen = [], set()
    for i, item in enumerate(items):
        r = _Reader(item, f"{hw.sub('devices')}[{i}]", hw.source)
        r.check_keys({"id", "gpu", "node", "socket"})
        dev_id = r.get("id", str)
        if dev_id in seen:
            r.fail(r.sub("id"), f"duplicate device id {dev_id!r}")
        seen.add(dev_id)
        gpu = r.get("gpu", str, choices=tuple(catalog.devices))
        devices.append(DeviceSpec(dev_id, gpu, r.get("node", str, dev_id), r.get("socket", int, 0)))
    return tuple(devices)


def _check_depth(pipe: _Reader, n: int) -> None:
    from .engine import MAX_STAGES

    if n > MAX_STAGES:
        pipe.fail(pipe.sub("stages"), f"{n} stages; the engine runs at most {MAX_STAGES} (benchmarks/scale_bench.py)")


def _parse_stages(pipe: _Reader, device_ids: set[str], src) -> tuple[Stage, ...]:
    items = pipe.get("stages", list)
    if not items:
        pipe.fail(pipe.sub("stages"), "expected a non-empty list of stages")
    _check_depth(pipe, len(items))  # before the per-stage parse: a huge list is refused at once
    stages = []
    for i, item in enumerate(items):
        r = _Reader(item, f"{pipe.sub('stages')}[{i}]", src)
        r.check_keys({"device", "weights_mb", "compute", "layers", "activation_memory_mb"})
        device = r.get("device", str)
        if device not in device_ids:
            r.fail(r.sub("device"), f"unknown device {device!r}; expected one of hardware.devices ids: "
                                    f"{', '.join(sorted(device_ids))}")
        c = r.reader("compute")
        mode = c.get("mode", str, "analytical", choices=("analytical", "distribution"))
        if mode == "analytical":
            c.check_keys({"mode", "tflop", "memory_mb"})
            compute = StageCompute(mode, tflop=c.get("tflop", float, nonneg=True),
                                   memory_mb=c.get("memory_mb", float, 0.0, nonneg=True))
        else:
            c.check_keys({"mode", "forward", "backward", "backward_b", "backward_w"})
            dists = {k: parse_distribution(c.data[k], c.sub(k), src) if c.data.get(k) is not None else None
                     for k in ("forward", "backward", "backward_b", "backward_w")}
            if dists["forward"] is None:
                c.fail(c.sub("forward"), "missing; expected a distribution {kind, ...}")
            if dists["backward"] is None and (dists["backward_b"] is None or dists["backward_w"] is None):
                c.fail(c.sub("backward"), "missing; expected a distribution (or both backward_b and backward_w)")
            compute = StageCompute(mode, **dists)
        stages.append(Stage(device=device, weights_mb=r.get("weights_mb", float, 0.0, nonneg=True),
                            compute=compute, layers=r.get("layers", float, None, positive=True),
                            activation_memory_mb=r.get("activation_memory_mb", float, None, nonneg=True)))
    return tuple(stages)


LINK_VALUE_KEYS = ("latency_ms", "bandwidth_gbps", "jitter")


def _parse_links(hw: _Reader, top: _Reader, device_ids, catalog) -> tuple[LinkOverride, ...]:
    """Explicit links (hardware.links: src, dst, type preset) then measured overrides (overrides.links)."""
    out = []
    for section, reader, allow_type in (("links", hw, True), ("links", top.reader("overrides"), False)):
        items = reader.get(section, list, [])
        for i, item in enumerate(items):
            r = _Reader(item, f"{reader.sub(section)}[{i}]", reader.source)
            allowed = {"src", "dst", *LINK_VALUE_KEYS} | ({"type"} if allow_type else {"sizes_mb", "source"})
            r.check_keys(allowed)
            values = {}
            for end in ("src", "dst"):
                dev = r.get(end, str)
                if dev not in device_ids:
                    r.fail(r.sub(end), f"unknown device {dev!r}; expected one of {', '.join(sorted(device_ids))}")
            if allow_type and "type" in r.data:
                values.update(catalog.interconnects[r.get("type", str, choices=tuple(catalog.interconnects))])
            values["latency_ms"] = r.get("latency_ms", float, values.get("latency_ms"), nonneg=True)
            values["bandwidth_gbps"] = r.get("bandwidth_gbps", float, values.get("bandwidth_gbps"), positive=True)
            values["jitter"] = r.get("jitter", float, values.get("jitter"), nonneg=True)
            values = {k: v for k, v in values.items() if v is not None}
            if not values:
                r.fail(r.path, "expected at least one of type, latency_ms, bandwidth_gbps, jitter")
            out.append(LinkOverride(r.data["src"], r.data["dst"], values))
    return tuple(out)


DEVICE_VALUE_KEYS = ("peak_tflops", "memory_bandwidth_gbps", "memory_gb", "launch_overhead_ms", "mtbf_hours",
                     "slowdown")


def _parse_device_overrides(overrides: _Reader, device_ids) -> dict:
    r = overrides.reader("devices")
    out = {}
    for dev in r.data:
        if dev not in device_ids:
            r.fail(r.sub(str(dev)), f"unknown device; expected one of {', '.join(sorted(device_ids))}")
        d = r.reader(dev)
        d.check_keys(set(DEVICE_VALUE_KEYS))
        out[dev] = {k: d.get(k, float, positive=True) for k in d.data}
    return out


def _step_ms(opt: _Reader, n_stages: int) -> tuple[float, ...] | None:
    """optimizer.step_ms: one number for every stage, or a list with one number per stage."""
    value = opt.data.get("step_ms")
    if isinstance(value, list):
        if len(value) != n_stages:
            opt.fail(opt.sub("step_ms"), f"got {len(value)} values; expected one per stage ({n_stages})")
        items = _Reader({str(i): v for i, v in enumerate(value)}, opt.sub("step_ms"), opt.source)
        return tuple(items.get(str(i), float, nonneg=True) for i in range(n_stages))
    step = opt.get("step_ms", float, None, nonneg=True)
    return None if step is None else (step,) * n_stages


def _parse_failure(section, src):
    try:
        from .failures.config import parse_failure
    except ImportError:  # failure model not installed in this build: only "disabled" is understood
        r = _Reader(section, "failure", src)
        if r.get("enabled", bool, False):
            r.fail("failure.enabled", "failure injection is not available in this build")
        return None
    try:
        return parse_failure(section, "failure")
    except ScenarioError as exc:
        if src and exc.source is None:
            raise ScenarioError(exc.path, str(exc).split(": ", 1)[-1], src) from None
        raise


def _check_hops(s: Scenario, catalog, src) -> None:
    """Every consecutive pair of stages on different devices needs a link."""
    from .hardware import Topology

    topo = Topology(s, catalog)
    for i in range(s.n_stages - 1):
        a, b = s.stages[i].device, s.stages[i + 1].device
        if a != b and topo.link(a, b) is None:
            which = "same_node" if s.device(a).node == s.device(b).node else "cross_node"
            raise ScenarioError(f"pipeline.stages[{i + 1}].device",
                                f"no link from {a} to {b}: set hardware.interconnect.{which} or add a "
                                f"hardware.links entry", src)
