"""The scenario document's schema: six sections plus `overrides`, as the fixtures' hops.base.yaml.

Checks that need the preset catalog (gpu and interconnect names) or relate sections to
each other (a stage's device must exist) run after this, in hops.scenario; everything
about one field's type and range is decided here.
"""
from __future__ import annotations

from pathlib import PurePosixPath, PureWindowsPath
from typing import Annotated, Any

from pydantic import BeforeValidator, Field, WithJsonSchema, model_validator
from pydantic_core import PydanticCustomError

from hops.errors import echo
from hops.model.hardware import PRECISIONS, STACK_CHOICES
from hops.schema.failure import FailureModel
from hops.schema.fields import (MAX_BATCHES, MAX_COUNT, MAX_MICROBATCHES, MAX_MODEL_DIM, Bool, Choice, DictOf, Int,
                                ListOf, Num, OrAuto, Section, Str, check_number, closed_mapping, fail, section_defaults,
                                show)

SHARDINGS = ("none", "zero1", "fsdp")
DEFAULT_STACK = "megatron_core"  # a user scenario's training stack unless it names one (hops/presets/stacks.yaml)
DIST_KINDS = {
    "constant": ("ms",),
    "lognormal": ("cv", "mean_ms"),
    "normal": ("mean_ms", "std_ms"),
    "pareto": ("mean_ms", "shape"),
}
COMPUTE_MODES = {"analytical": ("memory_mb", "mode", "tflop"),
                 "distribution": ("backward", "backward_b", "backward_w", "forward", "mode")}
OUTPUT_NAMES = ("summary", "events", "timeline", "dashboard", "trace")


class DistributionModel(Section):
    """A latency distribution in ms; `pareto` is the heavy-tailed one (shape > 1 keeps the mean finite)."""

    model_config = dict(Section.model_config, json_schema_extra={
        "oneOf": [{"properties": {"kind": {"const": k}}, "required": ["kind", *keys],
                   "propertyNames": {"enum": ["kind", *keys]}} for k, keys in DIST_KINDS.items()]})

    kind: Str(tuple(DIST_KINDS))
    ms: Num(ge=0) | None = None
    mean_ms: Num(gt=0) | None = None
    std_ms: Num(ge=0) | None = None
    cv: Num(ge=0) | None = None
    shape: Num(gt=1, description="> 1 so the mean is finite") | None = None

    @model_validator(mode="before")
    @classmethod
    def _closed_mapping(cls, data: Any):
        data = closed_mapping(data, cls.model_fields)
        kind = data.get("kind")
        if isinstance(kind, str) and kind in DIST_KINDS:  # any other kind: the field's own check names it
            data = closed_mapping(data, ("kind", *DIST_KINDS[kind]))
            for key in DIST_KINDS[kind]:
                if key not in data:
                    raise fail("missing; expected a number", key=key)
        return data

    @property
    def params(self) -> dict[str, float]:
        return {k: getattr(self, k) for k in DIST_KINDS[self.kind]}


class ComputeModel(Section):
    """`analytical`: roofline from tflop and memory_mb; `distribution`: measured F/B(/W) distributions."""

    model_config = dict(Section.model_config, json_schema_extra={
        "if": {"properties": {"mode": {"const": "distribution"}}, "required": ["mode"]},
        "then": {"required": ["forward"], "propertyNames": {"enum": list(COMPUTE_MODES["distribution"])}},
        "else": {"required": ["tflop"], "propertyNames": {"enum": list(COMPUTE_MODES["analytical"])}}})

    mode: Str(tuple(COMPUTE_MODES)) = "analytical"
    tflop: Num(ge=0) | None = None
    memory_mb: Num(ge=0) = 0.0
    forward: DistributionModel | None = None
    backward: DistributionModel | None = None
    backward_b: DistributionModel | None = None
    backward_w: DistributionModel | None = None

    @model_validator(mode="before")
    @classmethod
    def _closed_mapping(cls, data: Any):
        mode = data.get("mode") or "analytical" if isinstance(data, dict) else None
        # a mode that is not a string (a mapping swapped in) is refused by the field's own check
        return closed_mapping(data, COMPUTE_MODES.get(mode, cls.model_fields) if isinstance(mode, str)
                              else cls.model_fields)

    @model_validator(mode="after")
    def _complete(self):
        if self.mode == "analytical" and self.tflop is None:
            raise fail("missing; expected a number", key="tflop")
        if self.mode == "distribution":
            if self.forward is None:
                raise fail("missing; expected a distribution {kind, ...}", key="forward")
            if self.backward is None and (self.backward_b is None or self.backward_w is None):
                raise fail("missing; expected a distribution (or both backward_b and backward_w)", key="backward")
        return self


Layers = OrAuto(lambda v: check_number(v, gt=0), {"type": "number", "exclusiveMinimum": 0},
                "transformer layers on this stage, or auto (split pipeline.model.layers by the stages' speed)")


def _chunks(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not float(v).is_integer() or v < 1:
        raise fail(f"expected an integer >= 1 or auto, got {show(v)}")
    return int(v)


VirtualStages = OrAuto(_chunks, {"type": "integer", "minimum": 1},
                       "model chunks per stage (interleaved 1F1B's v), or auto: the schedule's own "
                       "(default_virtual_stages: 2 for zb_v, interleaved_1f1b and interleaved_zb, 1 for the others; "
                       "hetero_search: 1 lets it choose the placement, 2 plans the V only)")


class StageModel(Section):
    device: Str(description="a hardware.devices id (one GPU); or give devices") | None = None
    devices: ListOf(Str(nonempty=True)) | None = Field(
        None, description="a tensor-parallel group: hardware.devices ids of one node and one GPU type; its size "
                          "must divide pipeline.model.heads")
    weights_mb: Num(ge=0, description="default: derived from the architecture, else 0") | None = None
    compute: ComputeModel | None = None  # None: derived from layers and pipeline.model's architecture
    layers: Layers | None = None
    activation_memory_mb: Num(ge=0) | None = None
    compute_jitter: Num(ge=0, le=1, description="this stage's coefficient of variation (at most 1); default "
                                                "pipeline.compute_jitter") | None = None

    @model_validator(mode="after")
    def _one_placement(self):
        if self.device is None and self.devices is None:
            raise fail("missing; expected a hardware.devices id (or devices: a tensor-parallel group)", key="device")
        if self.device is not None and self.devices is not None:
            raise fail("give device (one GPU) or devices (a tensor-parallel group), not both", key="devices")
        if self.devices is not None and not self.devices:
            raise fail("expected a non-empty list of hardware.devices ids", key="devices")
        return self

    @property
    def group(self) -> tuple[str, ...]:
        """The stage's GPUs: its tensor-parallel group, or its one device."""
        return tuple(self.devices) if self.devices is not None else (self.device,)


class BackwardSplitModel(Section):
    enabled: Bool = False
    activation_grad_fraction: Num(gt=0, lt=1, description="B's share of the fused backward; default "
                                  "(3h + s) / (6h + s) from the model shape, (D + 2A) / (2D + 2A) from "
                                  "the architecture's GEMM and attention-core FLOPs, 1/2 without either "
                                  "(hops/model/backward_split.py)") | None = None


class MoEModel(Section):
    """A mixture-of-experts FFN in every layer (Mixtral, DeepSeekMoE, Switch)."""

    experts: Int(gt=1, cap=MAX_MODEL_DIM, description="routed experts per layer")
    top_k: Int(gt=0, cap=MAX_MODEL_DIM, description="routed experts each token runs")
    expert_ffn_dim: Int(gt=0, cap=MAX_MODEL_DIM, description="one expert's FFN inner size; default "
                                                             "pipeline.model.ffn_dim") | None = None
    shared_experts: Int(ge=0, cap=MAX_MODEL_DIM, description="experts every token runs (DeepSeekMoE)") = 0
    expert_parallel: Int(gt=0, cap=MAX_COUNT, description="ranks of the data-parallel group the routed experts "
                                                          "are spread over; must divide experts and "
                                                          "optimizer.data_parallel.degree") = 1

    @model_validator(mode="after")
    def _fits(self):
        if self.top_k > self.experts:
            raise fail(f"got {self.top_k}; expected at most experts ({self.experts})", key="top_k")
        if self.experts % self.expert_parallel:
            raise fail(f"got {self.expert_parallel}; expected a divisor of experts ({self.experts})",
                       key="expert_parallel")
        return self


class ModelShape(Section):
    """The model's architecture; with `heads`, a stage may give only `device` and `layers`."""

    layers: Int(gt=0, cap=MAX_MODEL_DIM, description="transformer layers of the whole model") | None = None
    hidden_dim: Int(gt=0, cap=MAX_MODEL_DIM) | None = None
    heads: Int(gt=0, cap=MAX_MODEL_DIM, description="attention heads; must divide hidden_dim") | None = None
    kv_heads: Int(gt=0, cap=MAX_MODEL_DIM, description="key/value heads (grouped-query attention); must divide "
                                                        "heads; default heads") | None = None
    ffn_dim: Int(gt=0, cap=MAX_MODEL_DIM, description="FFN inner size; default 4 x hidden_dim") | None = None
    ffn_gated: Bool | None = None  # SwiGLU / GeGLU (Llama, InternLM): three hidden x ffn_dim matrices; default false
    seq_len: Int(gt=0, cap=MAX_MODEL_DIM) | None = None
    vocab_size: Int(gt=0, cap=MAX_MODEL_DIM) | None = None
    tied_embeddings: Bool | None = None
    moe: MoEModel | None = None

    @model_validator(mode="after")
    def _heads_divide(self):
        if self.heads is not None and self.hidden_dim is not None and self.hidden_dim % self.heads:
            raise fail(f"got {self.heads}; expected a divisor of hidden_dim ({self.hidden_dim})", key="heads")
        if self.kv_heads is not None:
            if self.heads is None:
                raise fail("needs heads", key="kv_heads")
            if self.heads % self.kv_heads:
                raise fail(f"got {self.kv_heads}; expected a divisor of heads ({self.heads})", key="kv_heads")
        return self


def _nonempty(what: str):
    def check(v):
        if isinstance(v, (list, tuple)) and not v:
            raise fail(f"expected a non-empty list of {what}")
        return v
    return BeforeValidator(check)


class SimulationModel(Section):
    batches: Int(gt=0, cap=MAX_BATCHES, description="iterations (optimizer steps) to simulate") = 1
    microbatches: Int(gt=0, cap=MAX_MICROBATCHES, description="microbatches per iteration")
    seed: Int(ge=0, cap=2**63 - 1) = 0
    micro_batch_size: Int(gt=0, cap=MAX_COUNT) = 1


class StackOptionsModel(Section):
    """The training stack's switches as the run set them (Megatron's --recompute-granularity,
    --sequence-parallel, --overlap-grad-reduce, ...), over the `stack` preset's; null keeps the
    preset's. Constants (efficiencies, launch costs) stay the preset's: they are not a run's flags."""

    attention: Str(STACK_CHOICES["attention"]) | None = None
    dispatch: Str(STACK_CHOICES["dispatch"]) | None = None
    recompute: Str(STACK_CHOICES["recompute"]) | None = None
    p2p_overlap: Choice(STACK_CHOICES["p2p_overlap"]) | None = None
    tensor_parallel_overlap: Str(STACK_CHOICES["tensor_parallel_overlap"]) | None = None
    sequence_parallel: Bool | None = None
    dp_overlap_grad_reduce: Bool | None = None
    tf32_matmul: Bool | None = None


class PipelineModel(Section):
    schedule: Str(description="gpipe, 1f1b, zb_h1, zb_h2, zb_v (virtual_stages: 2), zb_1p, zb_2p, zb_auto "
                            "(the ZB paper's automatic scheduling; zb_auto's scheduler_options.memory_limit), "
                            "interleaved_1f1b, interleaved_zb (PyTorch's; both virtual_stages >= 2), zero_bubble "
                            "(= zb_h1), hops_hetero, hetero_search (picks one chunk per stage, ZB-V's V or the "
                            "interleaved loop itself) or a dotted path") = "1f1b"
    scheduler_options: DictOf(Any) = Field(default_factory=dict)
    precision: Str(PRECISIONS) = "bf16"
    backward_factor: Num(gt=0) = 2.0
    backward_split: BackwardSplitModel = section_defaults()
    model: ModelShape = section_defaults()
    stack: Str(description="a training-stack preset (hops/presets/stacks.yaml)") = DEFAULT_STACK
    stack_options: StackOptionsModel = section_defaults()
    stages: Annotated[ListOf(StageModel), _nonempty("stages")]
    activation_mb: Num(gt=0) | None = None
    compute_jitter: Num(ge=0, le=1, description="the coefficient of variation of mean-1 lognormal noise; at most 1: beyond it most draws are near 0 and a run's sample mean falls far below 1") = 0.0
    host_overhead: DistributionModel | None = None
    virtual_stages: VirtualStages = "auto"


class DeviceModel(Section):
    id: Str(nonempty=True)
    gpu: Str(description="a device preset (hops/presets/devices.yaml)")
    host: Str(description="a host preset (hops/presets/hosts.yaml); default hardware.host") | None = None
    node: Str() | None = None
    socket: Int(ge=0) = 0


class InterconnectModel(Section):
    same_node: Str(description="an interconnect preset (hops/presets/interconnects.yaml)") | None = None
    cross_node: Str(description="an interconnect preset (hops/presets/interconnects.yaml)") | None = None


class HardwareLinkModel(Section):
    src: Str()
    dst: Str()
    type: Str(description="an interconnect preset") | None = None
    latency_ms: Num(ge=0) | None = None
    bandwidth_gbps: Num(gt=0, description="GB/s (gigabytes per second)") | None = None
    jitter: Num(ge=0, le=1, description="the coefficient of variation of mean-1 lognormal noise; at most 1: beyond it most draws are near 0 and a run's sample mean falls far below 1") | None = None


class HardwareModel(Section):
    host: Str(description="the host preset of every device that names none (hops/presets/hosts.yaml)") | None = None
    devices: Annotated[ListOf(DeviceModel), _nonempty("devices")]
    interconnect: InterconnectModel = section_defaults()
    links: ListOf(HardwareLinkModel) = Field(default_factory=list)


def _step_ms(v: Any):
    """One number for every stage, or a list with one number per stage."""
    if isinstance(v, (list, tuple)):
        out = []
        for i, x in enumerate(v):
            try:
                out.append(check_number(x, ge=0))
            except PydanticCustomError as exc:  # re-raised with the item's index in the path
                raise fail(exc.context["msg"], key=f"[{i}]") from None
        return tuple(out)
    return check_number(v, ge=0)


StepMs = Annotated[Any, BeforeValidator(_step_ms), WithJsonSchema({
    "description": "optimizer step time in ms: one number for every stage, or one per stage",
    "anyOf": [{"type": "number", "minimum": 0}, {"type": "array", "items": {"type": "number", "minimum": 0}}]})]


class DataParallelModel(Section):
    degree: Int(gt=0, cap=MAX_COUNT) = 1
    algorithm: Str(("ring", "naive")) = "ring"
    sharding: Str(SHARDINGS, description="none: a gradient all-reduce; zero1 (distributed optimizer) and fsdp: "
                                         "a reduce-scatter of the gradients plus an all-gather of the weights "
                                         "(hops/model/collectives.py)") = "none"
    interconnect: Str(description="an interconnect preset") | None = None


def _true_or_false(v: Any) -> bool:
    if not isinstance(v, bool):
        raise fail(f"expected true, false or auto, got {show(v)}")
    return v


PostValidation = OrAuto(_true_or_false, {"type": "boolean"},
                        "the Zero Bubble paper's optimizer post-validation: each stage steps without the "
                        "cross-stage barrier, so iterations overlap; honoured by zb_h1, zb_h2, zb_v, zb_1p, zb_2p, "
                        "zb_auto, zero_bubble and hetero_search; auto: on for those, the barrier for the others")


class OptimizerModel(Section):
    enabled: Bool = False
    step_ms: StepMs | None = None
    post_validation: PostValidation = False
    data_parallel: DataParallelModel = section_defaults()


def _relative_path(v: Any):
    if not isinstance(v, str) or not v:
        raise fail(f"expected a relative file path, got {show(v)}")
    if PurePosixPath(v).is_absolute() or PureWindowsPath(v).is_absolute() or ".." in PurePosixPath(v).parts:
        raise fail(f"got {echo(v)}; expected a path inside the run directory (relative, no '..')")
    return v


RelPath = Annotated[str, BeforeValidator(_relative_path), WithJsonSchema({"type": "string", "minLength": 1})]


class OutputPathsModel(Section):
    """Extra copies of the run's outputs at these paths, relative to the run directory."""

    summary: RelPath | None = None
    events: RelPath | None = None
    timeline: RelPath | None = None
    dashboard: RelPath | None = None
    trace: RelPath | None = None


class OutputModel(Section):
    dir: Str() | None = None
    plots: Bool = True
    events: Bool = True
    chrome_trace: Bool = True
    chrome_trace_gz: Bool = False  # write trace.json.gz instead (Perfetto opens it)
    # the PNGs drawn in a forked child while the text outputs are written (hops.run.charts_alongside);
    # null: where Linux and a second usable core allow it; false: in turn, in the run's process;
    # true: alongside even on one core (in turn where the platform has no fork or memory files)
    plots_alongside: Bool | None = None
    mlflow: Bool = False  # log the run (or each sweep job) to MLflow; acted on by the run app only
    paths: OutputPathsModel = section_defaults()


class DeviceOverrideModel(Section):
    peak_tflops: Num(gt=0) | None = None
    peak_tflops_tf32: Num(gt=0) | None = None
    peak_tflops_fp32: Num(gt=0) | None = None
    peak_tflops_fp8: Num(gt=0) | None = None
    memory_bandwidth_gbps: Num(gt=0) | None = None
    memory_gb: Num(gt=0) | None = None
    launch_overhead_ms: Num(ge=0) | None = None
    mtbf_hours: Num(gt=0) | None = None
    slowdown: Num(gt=0) | None = None


class OverrideLinkModel(Section):
    src: Str()
    dst: Str()
    latency_ms: Num(ge=0) | None = None
    bandwidth_gbps: Num(gt=0, description="GB/s (gigabytes per second)") | None = None
    jitter: Num(ge=0, le=1, description="the coefficient of variation of mean-1 lognormal noise; at most 1: beyond it most draws are near 0 and a run's sample mean falls far below 1") | None = None
    sizes_mb: ListOf(Num(ge=0)) | None = None
    source: Str() | None = None


class OverridesModel(Section):
    devices: DictOf(DeviceOverrideModel) = Field(default_factory=dict)
    links: ListOf(OverrideLinkModel) = Field(default_factory=list)


class ScenarioModel(Section):
    """A HOPS scenario (docs: README "Running scenarios"; legacy fields: docs/legacy_scenarios.md)."""

    model_config = dict(Section.model_config, title="HOPS scenario")

    simulation: SimulationModel
    pipeline: PipelineModel
    hardware: HardwareModel
    optimizer: OptimizerModel = section_defaults()
    failure: FailureModel | None = None
    output: OutputModel = section_defaults()
    overrides: OverridesModel = section_defaults()
