"""Loading a scenario: a six-section HOPS YAML document becomes the typed Scenario (hops.scenario_types).

Everything a simulation needs is checked here, up front, so that a user mistake
surfaces as one ScenarioError naming the field path (``pipeline.stages[2].device``)
instead of a traceback deep in the engine. Field types and ranges come from one place,
the schema models in hops.schema (which also publish the JSON Schema editors use);
this module adds what needs the preset catalog or relates sections to each other.
The fixtures' ``hops.base.yaml`` files are the reference format and load unchanged;
scenarios of the original simulator are translated first (hops.schema.legacy).
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Mapping

from hops.model.architecture import Architecture, vocab_matrices
from hops.errors import ScenarioError, echo
from hops.scenario_types import DeviceSpec, Distribution, LinkOverride, Scenario, Stage, StageCompute, derived_compute
from hops.schema.fields import MAX_TASKS

SECTIONS = ("simulation", "pipeline", "hardware", "optimizer", "failure", "output", "overrides")
REQUIRED_SECTIONS = ("simulation", "pipeline", "hardware")


# --------------------------------------------------------------------------- loading
def load_document(source: Any) -> tuple[dict, str | None]:
    """Accept a path, a dict or an OmegaConf config; return a plain dict and its source name."""
    from hops.schema.document import read_yaml_file

    if isinstance(source, (str, Path)):
        from hops.traces.guard import check_path

        path = Path(source)
        check_path(path)  # a held-out fixture's hops.base.yaml (hops.simulate, hops.run) is not read
        if not path.is_file():
            raise ScenarioError("scenario", f"file not found: {path}")
        data = read_yaml_file(path)
        if data is None:
            raise ScenarioError("scenario", "the file is empty (or holds only comments); expected a mapping of "
                                            "scenario sections (simulation, pipeline, hardware, ...)", str(path))
        if not isinstance(data, Mapping):
            raise ScenarioError("scenario", f"the file's top level is {kind_of(data)}; expected a mapping of scenario "
                                            f"sections (simulation, pipeline, hardware, ...)", str(path))
        return data, str(path)
    if type(source).__module__.startswith("omegaconf"):  # checked by name: the core never imports omegaconf
        from omegaconf import OmegaConf

        data = OmegaConf.to_container(source, resolve=True)
        if not isinstance(data, Mapping):
            raise ScenarioError("scenario", f"the config is {kind_of(data)}; expected a mapping of scenario sections")
        return data, None
    if isinstance(source, Mapping):
        return dict(source), None
    raise ScenarioError("scenario", f"expected a path, dict or OmegaConf config, got {type(source).__name__}")


def kind_of(value: Any) -> str:
    return "a list" if isinstance(value, list) else f"a single value ({type(value).__name__} {value!r:.40})"


class LegacyScenarioWarning(UserWarning):
    """A field of the original simulator's format that HOPS models differently (the message names the
    replacement); see docs/legacy_scenarios.md."""


def load_scenario(source: Any, catalog=None) -> Scenario:
    """Parse and validate a scenario document against the preset catalog."""
    import warnings

    from hops.model.hardware import Catalog
    from hops.schema import validate
    from hops.schema.legacy import translate

    data, src = load_document(source)
    catalog = catalog or Catalog.load()
    doc, notes = translate(data, src, catalog)
    _check_depth(doc, src)  # before the per-stage validation: a huge list is refused at once
    m = validate(doc, src)
    for note in notes:
        warnings.warn(note, LegacyScenarioWarning, stacklevel=2)
    return _build(m, data, tuple(notes), catalog, src)


def _check_depth(doc, src) -> None:
    from hops.engine.loop import MAX_STAGES

    stages = (doc.get("pipeline") or {}).get("stages") if isinstance(doc.get("pipeline"), Mapping) else None
    if isinstance(stages, list) and len(stages) > MAX_STAGES:
        _fail("pipeline.stages", f"{len(stages)} stages; the engine runs at most {MAX_STAGES} "
                                 f"(benchmarks/scale_bench.py)", src)


def _fail(path: str, message: str, src):
    raise ScenarioError(path, message, src)


def _choice(value, path, choices, src):
    if value is not None and value not in choices:
        _fail(path, f"got {echo(value)}; expected one of {', '.join(map(str, choices))}", src)
    return value


def _stack_options(options, stack: str, catalog, src) -> dict:
    """The switches the scenario sets, once the preset carries what they need (an unfused
    kernel its bytes per score, a flash one its efficiencies)."""
    from hops.model.hardware import CatalogError, check_stack

    given = {k: v for k, v in options if v is not None}
    try:
        check_stack(stack, {**catalog.stacks[stack], **given})
    except CatalogError as e:  # only the kernel switch can ask for constants a preset lacks
        _fail("pipeline.stack_options.attention" if "attention" in given else "pipeline.stack_options",
              f"{e} (a catalog.stacks.{stack}.* override can add it, or pick a stack that has it)", src)
    return given


def _build(m, raw: dict, notes: tuple, catalog, src) -> Scenario:
    """The engine's Scenario from validated models, plus the checks that need the catalog or cross sections."""
    from hops.model.backward_split import activation_grad_fraction, layer_activation_grad_fraction
    from hops.model.hardware import supported_precisions
    from hops.schedulers import resolve_scheduler

    pipe, hw, opt = m.pipeline, m.hardware, m.optimizer
    devices, seen = [], set()
    for i, d in enumerate(hw.devices):
        if d.id in seen:
            _fail(f"hardware.devices[{i}].id", f"duplicate device id {echo(d.id)}", src)
        seen.add(d.id)
        _choice(d.gpu, f"hardware.devices[{i}].gpu", tuple(catalog.devices), src)
        runs = supported_precisions(catalog.devices[d.gpu])
        if pipe.precision not in runs:
            _fail("pipeline.precision", f"got {pipe.precision!r}; hardware.devices[{i}] ({d.gpu}) has no "
                                        f"{pipe.precision} tensor cores: expected one of {', '.join(runs)}", src)
        host = d.host if d.host is not None else hw.host
        _choice(host, f"hardware.devices[{i}].host" if d.host is not None else "hardware.host", tuple(catalog.hosts),
                src)
        devices.append(DeviceSpec(d.id, d.gpu, d.node if d.node is not None else d.id, d.socket, host))
    if hw.host is not None:  # also when every device names its own: a misspelt default is still a mistake
        _choice(hw.host, "hardware.host", tuple(catalog.hosts), src)
    device_ids = {d.id for d in devices}
    known = ", ".join(sorted(device_ids))

    stack = _choice(pipe.stack, "pipeline.stack", tuple(catalog.stacks), src)
    stack_options = _stack_options(pipe.stack_options, stack, catalog, src)
    arch = _architecture(pipe.model, catalog, src)
    if arch is not None and opt.data_parallel.degree % arch.expert_parallel:
        _fail("pipeline.model.moe.expert_parallel", f"got {arch.expert_parallel}; expected a divisor of "
                                                    f"optimizer.data_parallel.degree ({opt.data_parallel.degree}): "
                                                    f"the experts spread over data-parallel replicas", src)
    auto = _check_layers(pipe, arch, src)
    nbytes = catalog.model["bytes_per_element"][pipe.precision]
    matrices = vocab_matrices(len(pipe.stages), (0, len(pipe.stages) - 1), arch.tied) if arch else None
    stages = []
    by_id = {d.id: d for d in devices}
    groups = _tensor_parallel_groups(pipe.stages, by_id, arch, known, src)
    for i, st in enumerate(pipe.stages):
        c = st.compute
        layers = 1.0 if auto else st.layers  # auto: replaced by the planned split below
        weights, derived = st.weights_mb, False
        if c is None:
            compute = derived_compute(arch, layers, m.simulation.micro_batch_size)
            if weights is None:
                weights, derived = arch.stage_weights_mb(layers, matrices[i], nbytes), True
        elif c.mode == "analytical":
            compute = StageCompute(c.mode, tflop=c.tflop, memory_mb=c.memory_mb)
        else:
            compute = StageCompute(c.mode, **{k: _dist(getattr(c, k)) for k in
                                              ("forward", "backward", "backward_b", "backward_w")})
        stages.append(Stage(device=groups[i][0], weights_mb=0.0 if weights is None else weights, compute=compute,
                            layers=layers, activation_memory_mb=st.activation_memory_mb,
                            compute_jitter=st.compute_jitter, weights_derived=derived, compute_derived=c is None,
                            group=groups[i] if len(groups[i]) > 1 else ()))
    tasks = 3 * m.simulation.batches * m.simulation.microbatches * len(stages)
    if tasks > MAX_TASKS:
        _fail("simulation", f"3 passes x batches x microbatches x stages = {tasks:,} compute tasks; expected at "
                            f"most {MAX_TASKS:,} (a few minutes of simulation): simulate fewer batches", src)

    schedule = pipe.schedule
    try:
        scheduler = resolve_scheduler(schedule)
    except (KeyError, ImportError, ValueError, TypeError) as exc:
        _fail("pipeline.schedule", str(exc.args[0] if exc.args else exc) or f"cannot load scheduler {echo(schedule)}",
              src)
    accepted = getattr(scheduler, "option_names", None)
    if accepted is not None:
        for key in pipe.scheduler_options:
            if key not in accepted:
                _fail(f"pipeline.scheduler_options.{key}",
                      f"unknown option for scheduler {echo(schedule)}; expected one of {', '.join(accepted)}"
                      if accepted else f"scheduler {echo(schedule)} takes no options", src)

    honours = bool(getattr(scheduler, "post_validation", False))
    post_validation = honours if opt.post_validation == "auto" else opt.post_validation
    if post_validation and not honours:
        from hops.schedulers import honouring_post_validation

        _fail("optimizer.post_validation", f"schedule {schedule!r} ignores it (it keeps the barrier before the "
                                           f"optimizer step); expected one of {', '.join(honouring_post_validation())}, "
                                           "or post_validation: false, or auto (only where a schedule honours it)", src)

    interconnects = tuple(catalog.interconnects)
    same_node = _choice(hw.interconnect.same_node, "hardware.interconnect.same_node", interconnects, src)
    cross_node = _choice(hw.interconnect.cross_node, "hardware.interconnect.cross_node", interconnects, src)
    links = []
    for section, items in (("hardware.links", hw.links), ("overrides.links", m.overrides.links)):
        for i, ln in enumerate(items):
            path = f"{section}[{i}]"
            for end in ("src", "dst"):
                if getattr(ln, end) not in device_ids:
                    _fail(f"{path}.{end}", f"unknown device {echo(getattr(ln, end))}; expected one of {known}", src)
            if ln.src == ln.dst:
                _fail(f"{path}.dst", f"{echo(ln.dst)} is src too; expected a link between two different devices", src)
            values = {}
            if getattr(ln, "type", None) is not None:
                values.update(catalog.interconnects[_choice(ln.type, f"{path}.type", interconnects, src)])
            values.update({k: getattr(ln, k) for k in LINK_VALUE_KEYS if getattr(ln, k) is not None})
            if not values:
                _fail(path, "expected at least one of type, latency_ms, bandwidth_gbps, jitter"
                      if section == "hardware.links" else "expected at least one of latency_ms, bandwidth_gbps, "
                                                          "jitter", src)
            links.append(LinkOverride(ln.src, ln.dst, values))

    dev_over = {}  # iterating a flat section gives model_dump()'s items without building its serializer
    for dev, values in m.overrides.devices.items():
        if dev not in device_ids:
            _fail(f"overrides.devices.{dev}", f"unknown device; expected one of {known}", src)
        dev_over[dev] = {k: v for k, v in values if v is not None}

    step = opt.step_ms
    if isinstance(step, tuple):
        if len(step) != len(stages):
            _fail("optimizer.step_ms", f"got {len(step)} values; expected one per stage ({len(stages)})", src)
        step_ms = step
    else:
        step_ms = None if step is None else (float(step),) * len(stages)
    dp_ic = _choice(opt.data_parallel.interconnect, "optimizer.data_parallel.interconnect", interconnects, src)
    if opt.data_parallel.degree > 1 and not opt.enabled:  # else its replicas would count, their reduction not
        _fail("optimizer.data_parallel.degree", f"got {opt.data_parallel.degree} replicas with optimizer.enabled: "
                                                "false; the replicas reduce their gradients for the optimizer step, "
                                                "which HOPS models with it: set optimizer.enabled: true", src)

    failure = None
    if m.failure is not None and m.failure.enabled:
        from hops.failures.config import from_model

        _check_failure_devices(m.failure, devices, src)
        job = len(devices) * opt.data_parallel.degree
        if m.failure.devices.count is not None and m.failure.devices.count < job:
            _fail("failure.devices.count", f"got {m.failure.devices.count}; expected at least the job's {job} GPUs "
                                           f"({len(devices)} in the pipeline x data-parallel degree "
                                           f"{opt.data_parallel.degree})", src)
        failure = from_model(m.failure)
    out = m.output
    output = {"dir": out.dir, "plots": out.plots, "events": out.events, "chrome_trace": out.chrome_trace,
              "chrome_trace_gz": out.chrome_trace_gz, "plots_alongside": out.plots_alongside,
              "mlflow": out.mlflow, "paths": {k: v for k, v in out.paths if v is not None}}
    split, model = pipe.backward_split, pipe.model
    scenario = Scenario(
        batches=m.simulation.batches, microbatches=m.simulation.microbatches, seed=m.simulation.seed,
        micro_batch_size=m.simulation.micro_batch_size, schedule=schedule,
        scheduler_options=dict(pipe.scheduler_options), precision=pipe.precision,
        backward_factor=pipe.backward_factor, backward_split=split.enabled,
        activation_grad_fraction=(split.activation_grad_fraction if split.activation_grad_fraction is not None
                                  else layer_activation_grad_fraction(arch.dense_flops(), arch.attention_flops())
                                  if arch is not None else activation_grad_fraction(model.hidden_dim, model.seq_len)),
        hidden_dim=model.hidden_dim,
        seq_len=model.seq_len, vocab_size=model.vocab_size, tied_embeddings=model.tied_embeddings,
        activation_mb=pipe.activation_mb, compute_jitter=pipe.compute_jitter,
        host_overhead=_dist(pipe.host_overhead), stages=tuple(stages), devices=tuple(devices),
        same_node=same_node, cross_node=cross_node, links=tuple(links), device_overrides=dev_over,
        optimizer_enabled=opt.enabled, optimizer_step_ms=step_ms, dp_degree=opt.data_parallel.degree,
        dp_algorithm=opt.data_parallel.algorithm, dp_interconnect=dp_ic, dp_sharding=opt.data_parallel.sharding,
        failure=failure, output=output,
        raw=raw, notes=notes, post_validation=post_validation,
        virtual_stages=(getattr(scheduler, "default_virtual_stages", 1) if pipe.virtual_stages == "auto"
                        else pipe.virtual_stages),
        stack=stack, stack_options=stack_options, architecture=arch,
    )
    _check_whole_chunks(pipe, scenario, auto, src)
    _check_hops(scenario, catalog, src)  # before layers: auto, whose planner times the stages over these links
    if auto:
        from hops.model.layer_split import split_layers

        split = split_layers(scenario, catalog)
        scenario = dataclasses.replace(scenario, stages=tuple(
            dataclasses.replace(st, layers=float(n), compute=derived_compute(arch, n, scenario.micro_batch_size),
                                weights_mb=arch.stage_weights_mb(n, matrices[i], nbytes)
                                if st.weights_derived else st.weights_mb)
            for i, (st, n) in enumerate(zip(scenario.stages, split))))
    return scenario


def _tensor_parallel_groups(stages, by_id, arch, known, src) -> list[tuple[str, ...]]:
    """Each stage's GPUs, checked: known ids, a tensor-parallel group inside one node and of one
    GPU type (Megatron runs TP over the node's NVLink/NVSwitch; a group of unequal GPUs would
    run at its slowest member), of a size that divides the attention heads (and the key/value
    heads: each rank holds whole heads), and no GPU in two different groups."""
    out, owner = [], {}
    for i, st in enumerate(stages):
        field_ = f"pipeline.stages[{i}].device" if st.devices is None else f"pipeline.stages[{i}].devices"
        group = tuple(st.devices) if st.devices is not None else (st.device,)
        for d in group:
            if d not in by_id:
                _fail(field_, f"unknown device {echo(d)}; expected one of hardware.devices ids: {known}", src)
        if len(set(group)) != len(group):
            _fail(field_, f"lists a device twice; expected distinct hardware.devices ids", src)
        if len(group) > 1:
            nodes = sorted({by_id[d].node for d in group})
            if len(nodes) > 1:
                _fail(field_, f"a tensor-parallel group spans nodes {', '.join(nodes)}; expected the GPUs of one node",
                      src)
            gpus = sorted({by_id[d].gpu for d in group})
            if len(gpus) > 1:
                _fail(field_, f"a tensor-parallel group mixes GPU types {', '.join(gpus)}; expected one type", src)
            if arch is None:
                _fail(field_, "a tensor-parallel group needs the architecture: give pipeline.model hidden_dim, "
                              "heads and seq_len", src)
            if arch.heads % len(group) or arch.kv_heads % len(group):
                what = "heads" if arch.heads % len(group) else "kv_heads"
                _fail(field_, f"tensor-parallel size {len(group)} does not divide pipeline.model.{what} "
                              f"({getattr(arch, what)}); expected a divisor", src)
        for d in group:
            if owner.setdefault(d, group) != group:
                _fail(field_, f"device {echo(d)} is already in the group {list(owner[d])}; a GPU belongs to one "
                              f"tensor-parallel group", src)
        out.append(group)
    return out


def _architecture(model, catalog, src) -> Architecture | None:
    """The model's shape when `heads` is given; the heads' divisibility is checked by the schema."""
    if model.heads is None:
        if model.moe is not None:
            _fail("pipeline.model.heads", "missing; moe describes the architecture, which needs heads, hidden_dim "
                                          "and seq_len", src)
        return None
    for key in ("hidden_dim", "seq_len"):
        if getattr(model, key) is None:
            _fail(f"pipeline.model.{key}", "missing; expected a number: heads describe the architecture, which "
                                           "needs hidden_dim and seq_len too", src)
    h = model.hidden_dim
    ffn = model.ffn_dim or 4 * h
    moe = {}
    if model.moe is not None:
        moe = dict(experts=model.moe.experts, top_k=model.moe.top_k, expert_ffn=model.moe.expert_ffn_dim or ffn,
                   shared_experts=model.moe.shared_experts, expert_parallel=model.moe.expert_parallel)
    return Architecture(
        layers=model.layers, hidden=h, heads=model.heads, kv_heads=model.kv_heads or model.heads,
        ffn_dim=ffn, ffn_gated=bool(model.ffn_gated), seq_len=model.seq_len,
        vocab=model.vocab_size or int(catalog.model["vocab_size"]),
        tied=model.tied_embeddings if model.tied_embeddings is not None else bool(catalog.model["tied_embeddings"]),
        **moe)


def _check_layers(pipe, arch, src) -> bool:
    """Every stage has compute or layers; derived stages have an architecture; layers add up.
    Returns whether the split is `auto`."""
    given = [st.layers for st in pipe.stages]
    auto = [v == "auto" for v in given]
    for i, st in enumerate(pipe.stages):
        path = f"pipeline.stages[{i}]"
        if st.compute is None and st.layers is None:
            _fail(path, "expected compute, or layers (with pipeline.model's architecture)", src)
        if st.compute is None and arch is None:
            _fail("pipeline.model.heads", f"missing; {path} gives layers without compute, so its work comes from "
                                          f"the architecture: give pipeline.model hidden_dim, heads and seq_len", src)
        if auto[i] and st.compute is not None:
            _fail(f"{path}.layers", "auto plans the split from the architecture; remove this stage's compute", src)
        if st.compute is None and not auto[i] and st.layers is not None and not float(st.layers).is_integer():
            _fail(f"{path}.layers", f"got {st.layers:g}; expected a whole number: a stage derived from the "
                                    f"architecture holds whole transformer layers", src)
    if any(auto):
        if not all(auto):
            _fail(f"pipeline.stages[{auto.index(False)}].layers", "expected auto: layers: auto is given on every "
                                                                  "stage or none", src)
        if arch.layers is None:
            _fail("pipeline.model.layers", "missing; layers: auto splits pipeline.model.layers over the stages", src)
        if arch.layers < len(auto):
            _fail("pipeline.model.layers", f"got {arch.layers}; expected at least one layer per stage "
                                           f"({len(auto)} stages)", src)
        return True
    if pipe.model.layers is not None and all(v is not None for v in given) and \
            abs(sum(given) - pipe.model.layers) > 1e-9:
        _fail("pipeline.stages", f"layers add up to {sum(given):g}; expected pipeline.model.layers = "
                                 f"{pipe.model.layers}", src)
    return False


def _check_whole_chunks(pipe, scenario: Scenario, auto: bool, src) -> None:
    """A model chunk holds whole layers: with v chunks per stage, a stage derived from the
    architecture holds a multiple of v layers (Megatron-LM refuses a layer count that its virtual
    pipeline size does not divide), and `layers: auto` needs pipeline.model.layers to split into
    whole chunks. A stage given by its `compute` has no layer count to check."""
    v = scenario.virtual_stages
    if v <= 1:
        return
    why = f"{v} model chunks per stage (pipeline.virtual_stages, {scenario.schedule}) each hold whole layers"
    if auto:
        if pipe.model.layers % v or pipe.model.layers // v < len(pipe.stages):
            _fail("pipeline.model.layers", f"got {pipe.model.layers}; {why}, so layers: auto needs a multiple of "
                                           f"{v} with at least {v} per stage", src)
        return
    for i, st in enumerate(pipe.stages):
        if st.compute is None and st.layers is not None and float(st.layers) % v:
            _fail(f"pipeline.stages[{i}].layers", f"got {st.layers:g}; {why}: expected a multiple of {v}", src)


def _dist(d) -> Distribution | None:
    return None if d is None else Distribution(d.kind, d.params)


LINK_VALUE_KEYS = ("latency_ms", "bandwidth_gbps", "jitter")


def _check_failure_devices(f, devices, src) -> None:
    """Keys of an MTBF map must name a device id, a gpu type of this scenario, or `default`."""
    mtbf = f.devices.mtbf_hours
    if isinstance(mtbf, Mapping):
        names = {"default"} | {d.id for d in devices} | {d.gpu for d in devices}
        for key in mtbf:
            if key not in names:
                _fail(f"failure.devices.mtbf_hours.{key}", f"matches no device; expected default, a gpu type "
                                                           f"({', '.join(sorted({d.gpu for d in devices}))}) or a "
                                                           f"device id", src)


def _check_hops(s: Scenario, catalog, src) -> None:
    """Every consecutive pair of stages on different devices needs a link, and every tensor-parallel
    group a link between its GPUs."""
    from hops.model.hardware import Topology

    topo = Topology(s, catalog)
    for i, st in enumerate(s.stages):
        if st.tp > 1 and topo.link(st.gpus[0], st.gpus[1]) is None:
            raise ScenarioError(f"pipeline.stages[{i}].devices",
                                f"no link inside the tensor-parallel group: set hardware.interconnect.same_node or "
                                f"use a host preset with a gpu_link", src)
    for i in range(s.n_stages - 1):
        a, b = s.stages[i].device, s.stages[i + 1].device
        if a != b and topo.link(a, b) is None:
            which = "same_node" if s.device(a).node == s.device(b).node else "cross_node"
            raise ScenarioError(f"pipeline.stages[{i + 1}].device",
                                f"no link from {a} to {b}: set hardware.interconnect.{which} or add a "
                                f"hardware.links entry", src)
