"""Hardware as data: preset catalogs (GPUs, hosts, interconnects, training stacks, model
constants) and the topology a scenario resolves them into.

Presets live in ``hops/presets/*.yaml`` so that changing a constant is a reviewed diff to
data with a citation next to it, and what-if questions ("what if the A10G had 500 GB/s?")
are a dotted override (``devices.a10g.memory_bandwidth_gbps=500``) rather than a code edit.
A prediction reads four preset groups, kept apart so that a fact of one cluster cannot pass
for a fact of a GPU: the GPU (spec-sheet physics), its host (NIC caps, the node's GPU link),
the training stack (kernels, dispatch, launch costs) and the model constants.
"""
from __future__ import annotations

import copy
import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

from hops import safe_yaml
from hops.errors import HopsError, echo

PRESET_DIR = Path(__file__).parents[1] / "presets"
CATALOG_FILES = {"devices": "devices.yaml", "interconnects": "interconnects.yaml", "model": "model.yaml",
                 "stacks": "stacks.yaml", "hosts": "hosts.yaml"}
# What a stack's choice keys may say (stacks.yaml explains each).
STACK_CHOICES = {"attention": ("unfused", "flash"), "dispatch": ("sync_launch", "async"),
                 "recompute": ("none", "selective", "full"), "tensor_parallel_overlap": ("none", "backward", "all"),
                 "p2p_overlap": (False, True, "interleaved"),
                 "sequence_parallel": (False, True), "dp_overlap_grad_reduce": (False, True),
                 "tf32_matmul": (False, True)}
FLASH_KEYS = ("flash_efficiency_forward", "flash_efficiency_backward", "flash_backward_flop_factor",
              "flash_causal_flop_share")
UNFUSED_KEYS = ("attention_bytes_forward", "attention_bytes_backward")
PER_GPU_KEYS = ("launch_overhead_ms", "k_floor_ms", "k_floor_backward_ms")
PRECISIONS = ("bf16", "fp16", "fp32", "fp8")  # a run's; fp8 only on GPUs with FP8 tensor cores
HOST_KEYS = ("host_network_gbps", "same_type_allreduce_gbps", "same_type_stall_ms", "same_type_stall_rate", "gpu_link")


class CatalogError(HopsError, ValueError):
    """A --set / override path does not exist in the catalog or has the wrong type."""


@dataclass(frozen=True)
class Catalog:
    devices: Mapping[str, Mapping[str, float]]
    interconnects: Mapping[str, Mapping[str, float]]
    model: Mapping[str, Any]
    stacks: Mapping[str, Mapping[str, Any]]
    hosts: Mapping[str, Mapping[str, Any]]

    @classmethod
    def load(cls, overrides: Mapping[str, Any] | Iterable[str] | None = None, preset_dir: Path = PRESET_DIR):
        data = _read_presets(Path(preset_dir))
        for path, value in _normalize_overrides(overrides):
            _set_dotted(data, path, value)
            _check_value(path, value, f"override {echo(path)}")
        for name, stack in data["stacks"].items():
            check_stack(name, stack)
        for name, host in data["hosts"].items():
            _check_host(name, host, data["interconnects"])
        return cls(**data)

    def fingerprint(self) -> str:
        """Stable hash of every value the model reads: identical numbers, identical fingerprint."""
        return hashlib.sha256(self.values_json().encode()).hexdigest()[:16]

    def as_dict(self) -> dict:
        return copy.deepcopy(self._sections())

    def values_json(self) -> str:
        """as_dict() as canonical JSON (sorted keys), without the deep copy json.dumps does not need.

        The model fingerprint hashes this on every simulate(), where the copy cost more than the dump."""
        return json.dumps(self._sections(), sort_keys=True, default=str)

    def _sections(self) -> dict:
        return {key: dict(getattr(self, key)) for key in CATALOG_FILES}

    def stack(self, scenario) -> dict:
        """The scenario's training stack: its preset with the scenario's `pipeline.stack_options`
        on top. The switches are the scenario's (a run's flags), the constants stay the preset's,
        so a what-if or a fit of a preset constant reaches every scenario on that preset."""
        return {**self.stacks[scenario.stack], **scenario.stack_options}

    def constants(self, stack: str) -> dict:
        """The model constants with the stack preset's on top. A stack never repeats a model key
        (tests/test_stacks.py)."""
        return {**self.model, **self.stacks[stack]}

    def scenario_constants(self, scenario) -> dict:
        """What the compute model, the engine and the memory accounting read for a scenario: the
        model constants with its stack (switches included, `stack`) on top."""
        return {**self.model, **self.stack(scenario)}


_PRESETS: dict[tuple, dict] = {}  # parsed preset files, per process


def _read_presets(preset_dir: Path) -> dict:
    """The parsed preset files, a fresh copy each call.

    Parsed once per process: every simulate() loads the catalog, and YAML parsing was most
    of a small scenario's run time. The key holds each file's mtime and size, so an edited
    preset is read again.
    """
    files = {key: preset_dir / name for key, name in CATALOG_FILES.items()}
    stats = [p.stat() for p in files.values()]
    stamp = (str(preset_dir.resolve()), *((st.st_mtime_ns, st.st_size) for st in stats))
    if stamp not in _PRESETS:
        _PRESETS.clear()
        _PRESETS[stamp] = {key: safe_yaml.load(p.read_text()) for key, p in files.items()}
    return _copy_tree(_PRESETS[stamp])


def _copy_tree(value):
    """A deep copy of parsed YAML: new dicts and lists, the immutable leaves shared.

    Four times faster than copy.deepcopy, which pays for a memo and a dispatch per value;
    anything other than a dict, a list or an immutable scalar still goes through deepcopy.
    Without the memo a node the YAML reaches twice (an anchor and its alias; the presets use
    none) is copied twice rather than shared.
    """
    if type(value) is dict:
        return {k: _copy_tree(v) for k, v in value.items()}
    if type(value) is list:
        return [_copy_tree(v) for v in value]
    if value is None or type(value) in (str, int, float, bool):
        return value
    return copy.deepcopy(value)


def _normalize_overrides(overrides) -> list[tuple[str, Any]]:
    if not overrides:
        return []
    if isinstance(overrides, Mapping):
        return list(overrides.items())
    out = []
    for item in overrides:
        if "=" not in item:
            raise CatalogError(f"override {echo(item)}: expected KEY=VALUE, e.g. stacks.fixture_megatron.k_floor_ms.l4=1.2")
        key, raw = item.split("=", 1)
        if not raw.strip():
            raise CatalogError(f"override {echo(key.strip())}: expected a value after '=', e.g. {key.strip()}=1.2")
        value = safe_yaml.load(raw)
        out.append((key.strip(), value))
    return out


def _set_dotted(data: dict, path: str, value: Any) -> None:
    parts = path.split(".")
    if parts[0] not in CATALOG_FILES:
        raise CatalogError(f"override {echo(path)}: expected a path under {', '.join(CATALOG_FILES)}")
    node = data
    for i, part in enumerate(parts[:-1]):
        if not isinstance(node, dict) or part not in node:
            known = ", ".join(sorted(node)) if isinstance(node, dict) else "nothing"
            raise CatalogError(f"override {echo(path)}: unknown key {echo('.'.join(parts[:i + 1]))}; known: {known}")
        node = node[part]
    leaf = parts[-1]
    if not isinstance(node, dict) or leaf not in node:
        known = ", ".join(sorted(node)) if isinstance(node, dict) else "nothing"
        raise CatalogError(f"override {echo(path)}: unknown key {echo(leaf)}; known: {known}")
    old = node[leaf]
    if isinstance(old, dict):
        raise CatalogError(f"override {echo(path)}: {path} is a mapping; set one of its values, e.g. "
                           f"{path}.{next(iter(old))}=...")
    if isinstance(old, (int, float)) and not isinstance(old, bool):
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise CatalogError(f"override {echo(path)}: expected a number, got {echo(value)}")
    elif isinstance(old, bool) and not isinstance(value, bool):
        raise CatalogError(f"override {echo(path)}: expected true or false, got {echo(value)}")
    node[leaf] = value


def dotted_items(tree: Any, *, keep_empty: bool = True) -> dict[str, Any]:
    """Nested mappings as one level of dotted keys (`a.b.c`), the paths Catalog.load's overrides name.

    Lists and scalars are leaves. An empty mapping is a leaf too (a config flattened into MLflow
    params shows it), unless ``keep_empty`` is False (a catalog compared leaf by leaf has none there).
    """
    flat: dict[str, Any] = {}

    def walk(prefix: str, v: Any) -> None:
        if isinstance(v, dict) and v:
            for k, x in v.items():
                walk(f"{prefix}.{k}" if prefix else str(k), x)
        elif prefix and (keep_empty or not isinstance(v, dict)):
            flat[prefix] = v

    walk("", tree)
    return flat


# Bounds every catalog value must meet, preset or override: finite, >= 0, and > 0 where the
# model divides by it or a zero means "no hardware" (k_floor_ms=-5 or bandwidth_gbps=0 would
# otherwise divide by zero or simulate negative time).
POSITIVE = {"peak_tflops", "peak_tflops_tf32", "peak_tflops_fp32", "peak_tflops_fp8", "memory_bandwidth_gbps",
            "memory_gb", "mtbf_hours", "bandwidth_gbps", "host_network_gbps",
            "same_type_allreduce_gbps", "same_type_stall_ms",
            "compute_time_coefficient", "flops_per_layer_token_coeff", "vocab_size", "bf16", "fp16", "fp32"}
SHARE = {"same_type_stall_rate"}  # shares of iterations: at most 1


def _check_value(path: str, value: Any, where: str) -> None:
    """`value` (a number or a mapping of them, as set at `path`) within the catalog's bounds."""
    if isinstance(value, dict):
        for k, v in value.items():
            _check_value(f"{path}.{k}", v, where)
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return
    leaf = path.rsplit(".", 1)[-1]
    positive = leaf in POSITIVE
    if not math.isfinite(value) or value < 0 or (positive and value == 0):
        raise CatalogError(f"{where}: got {echo(value)}; expected a finite number {'> 0' if positive else '>= 0'}")
    if leaf in SHARE and value > 1:
        raise CatalogError(f"{where}: got {value!r}; expected a share of iterations, from 0 to 1")


def is_choice(value: Any, choices: tuple) -> bool:
    """Membership by type and value: 1 is not true, nor "true" true."""
    return any(type(value) is type(c) and value == c for c in choices)


def choices_text(choices: tuple) -> str:
    """The choices as YAML spells them: false, true, interleaved."""
    return ", ".join(str(c).lower() if isinstance(c, bool) else str(c) for c in choices)


def p2p_overlaps(stack: Mapping[str, Any], megatron_interleaved: bool) -> bool:
    """Whether a stage's p2p sends overlap its next op: always, never, or (`interleaved`, Megatron's
    default) only under Megatron's interleaved 1F1B, the one schedule Megatron overlaps them in;
    other chunked schedules (ZB-V, PyTorch's interleaved ones, HOPS's own) are not Megatron's."""
    overlap = stack["p2p_overlap"]
    return overlap is True or (overlap == "interleaved" and megatron_interleaved)


def check_stack(name: str, stack: Mapping[str, Any]) -> None:
    """A stack names a known kernel, dispatch and recomputation, and carries the constants they read."""
    for key, choices in STACK_CHOICES.items():
        if not is_choice(stack.get(key), choices):
            raise CatalogError(f"stacks.{name}.{key}: got {stack.get(key)!r}; expected one of {choices_text(choices)}")
    needed = FLASH_KEYS if stack["attention"] == "flash" else UNFUSED_KEYS
    for key in (*needed, *PER_GPU_KEYS[:2]):
        if key not in stack:
            raise CatalogError(f"stacks.{name}.{key}: missing; {stack['attention']} attention and dispatch need it")
    for key in PER_GPU_KEYS:
        table = stack.get(key, {})
        if not isinstance(table, Mapping) or (key != "k_floor_backward_ms" and "default" not in table):
            raise CatalogError(f"stacks.{name}.{key}: expected a mapping of gpu preset names to ms with a `default`")


def _check_host(name: str, host: Mapping[str, Any], interconnects: Mapping[str, Any]) -> None:
    """A host carries only what a host adds to its GPUs, and its GPU link is an interconnect preset."""
    for key in host:
        if key not in HOST_KEYS:
            raise CatalogError(f"hosts.{name}.{key}: unknown key; expected one of {', '.join(HOST_KEYS)}")
    link = host.get("gpu_link")
    if link is not None and link not in interconnects:
        raise CatalogError(f"hosts.{name}.gpu_link: got {link!r}; expected an interconnect preset "
                           f"({', '.join(interconnects)})")


def per_gpu(stack: Mapping[str, Any], key: str, gpu: str) -> float | None:
    """The stack's value of a per-GPU constant for this gpu preset, else its `default`."""
    table = stack.get(key) or {}
    value = table.get(gpu, table.get("default"))
    return None if value is None else float(value)


@dataclass(frozen=True)
class DeviceParams:
    id: str
    gpu: str
    node: str
    peak_tflops: float  # dense bf16 / fp16 tensor rate
    peak_tflops_tf32: float  # what an fp32 run's GEMMs reach with TF32 ...
    peak_tflops_fp32: float  # ... and without
    memory_bandwidth_gbps: float
    memory_gb: float
    launch_overhead_ms: float
    mtbf_hours: float
    slowdown: float = 1.0
    l2_cache_mb: float = 0.0  # the GPU's L2 (0: not modelled)
    host_network_gbps: float | None = None  # the host's network interface, as NCCL reaches it
    same_type_allreduce_gbps: float | None = None  # two-way all-reduce rate between two such hosts
    k_floor_ms: float | None = None           # per-layer dispatch floor, forward (from the stack preset)
    k_floor_backward_ms: float | None = None  # ... backward
    same_type_stall_ms: float | None = None  # iteration-end stall when the final exchanges join two such hosts
    same_type_stall_rate: float = 0.0  # ... and the share of iterations it hits
    peak_tflops_fp8: float | None = None  # dense FP8 tensor rate (Hopper, Ada); None: no FP8 tensor cores

    def peak(self, precision: str, tf32: bool) -> float:
        """The rate of the transformer layers' GEMMs at the run's precision: an fp32 run without
        TF32 gets no tensor cores; an fp8 run's linear layers get the FP8 rate."""
        if precision == "fp8":
            return self.peak_tflops_fp8
        if precision != "fp32":
            return self.peak_tflops
        return self.peak_tflops_tf32 if tf32 else self.peak_tflops_fp32

    def peak_unquantized(self, precision: str, tf32: bool) -> float:
        """What the GEMMs outside the transformer layers' linears run at (the attention core, the
        LM head): an fp8 run keeps them in bf16, as Transformer Engine's FP8 recipe does."""
        return self.peak_tflops if precision == "fp8" else self.peak(precision, tf32)


def supported_precisions(gpu: Mapping[str, Any]) -> tuple[str, ...]:
    """A GPU preset's run precisions: its `precisions` where it lacks one (Volta: no bf16), fp8
    only where it has FP8 tensor cores (`peak_tflops_fp8`)."""
    base = tuple(gpu.get("precisions", [p for p in PRECISIONS if p != "fp8"]))
    return base + ("fp8",) if "peak_tflops_fp8" in gpu else base


@dataclass(frozen=True)
class LinkParams:
    src: str
    dst: str
    latency_ms: float
    bandwidth_gbps: float
    jitter: float
    kind: str  # preset name, or "measured"

    @property
    def name(self) -> str:
        return f"{self.src}->{self.dst}"

    def transfer_ms(self, size_mb: float) -> float:
        """alpha-beta model: latency + bytes / bandwidth (MB / (GB/s) = ms)."""
        return self.latency_ms + size_mb / self.bandwidth_gbps


def _opt_float(value) -> float | None:
    return None if value is None else float(value)


class Topology:
    """Devices with their effective parameters and the directed links between them.

    A link comes from, in increasing precedence: the interconnect preset inferred from
    node labels (same node vs cross node), an explicit ``hardware.links`` entry, and
    measured ``overrides.links`` values.
    """

    def __init__(self, scenario, catalog: Catalog):
        self.devices: dict[str, DeviceParams] = {}
        stack = catalog.stack(scenario)
        self._gpu_link: dict[str, str] = {}
        for d in scenario.devices:
            # GPU physics, then what its host adds, then the stack's launch costs on this GPU,
            # then the scenario's measured per-device values
            params = dict(catalog.devices[d.gpu])
            host = catalog.hosts[d.host] if d.host else {}
            params.update({k: v for k, v in host.items() if k != "gpu_link"})
            if host.get("gpu_link"):
                self._gpu_link[d.id] = host["gpu_link"]
            floor = per_gpu(stack, "k_floor_ms", d.gpu)
            params.update(launch_overhead_ms=per_gpu(stack, "launch_overhead_ms", d.gpu), k_floor_ms=floor,
                          k_floor_backward_ms=per_gpu(stack, "k_floor_backward_ms", d.gpu) or floor)
            params.update(scenario.device_overrides.get(d.id, {}))
            self.devices[d.id] = DeviceParams(
                id=d.id, gpu=d.gpu, node=d.node, peak_tflops=float(params["peak_tflops"]),
                peak_tflops_tf32=float(params["peak_tflops_tf32"]), peak_tflops_fp32=float(params["peak_tflops_fp32"]),
                memory_bandwidth_gbps=float(params["memory_bandwidth_gbps"]), memory_gb=float(params["memory_gb"]),
                launch_overhead_ms=float(params["launch_overhead_ms"]), mtbf_hours=float(params["mtbf_hours"]),
                slowdown=float(params.get("slowdown", 1.0)), l2_cache_mb=float(params.get("l2_cache_mb", 0.0)),
                host_network_gbps=_opt_float(params.get("host_network_gbps")),
                same_type_allreduce_gbps=_opt_float(params.get("same_type_allreduce_gbps")),
                k_floor_ms=_opt_float(params.get("k_floor_ms")),
                k_floor_backward_ms=_opt_float(params.get("k_floor_backward_ms")),
                same_type_stall_ms=_opt_float(params.get("same_type_stall_ms")),
                same_type_stall_rate=float(params.get("same_type_stall_rate", 0.0)),
                peak_tflops_fp8=_opt_float(params.get("peak_tflops_fp8")))
        self._catalog = catalog
        self._same, self._cross = scenario.same_node, scenario.cross_node
        self._explicit: dict[tuple[str, str], dict] = {}
        for link in scenario.links:
            self._explicit.setdefault((link.src, link.dst), {}).update(link.values)
        self._cache: dict[tuple[str, str], LinkParams | None] = {}

    def link(self, src: str, dst: str) -> LinkParams | None:
        key = (src, dst)
        if key not in self._cache:
            self._cache[key] = self._resolve(src, dst)
        return self._cache[key]

    def _resolve(self, src: str, dst: str) -> LinkParams | None:
        same = self.devices[src].node == self.devices[dst].node
        preset_name = self._same if same else self._cross
        if same and preset_name is None:  # the host's own GPU link, when the scenario names none
            preset_name = self._gpu_link.get(src)
        values: dict[str, float] = dict(self._catalog.interconnects[preset_name]) if preset_name else {}
        if not same and "bandwidth_gbps" in values:
            # A cross-node message leaves one host's network interface and enters another's: the
            # slower interface caps it, whatever the fabric preset says.
            caps = [c for c in (self.devices[src].host_network_gbps, self.devices[dst].host_network_gbps) if c]
            values["bandwidth_gbps"] = min([float(values["bandwidth_gbps"]), *caps])
        explicit = self._explicit.get((src, dst))
        kind = preset_name or ""
        if explicit:
            values.update(explicit)
            kind = "measured" if preset_name is None or set(explicit) - {"jitter"} else kind
        if "bandwidth_gbps" not in values or "latency_ms" not in values:
            return None
        return LinkParams(src, dst, float(values["latency_ms"]), float(values["bandwidth_gbps"]),
                          float(values.get("jitter", 0.0)), kind or "explicit")
