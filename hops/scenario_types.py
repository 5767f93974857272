"""The typed Scenario the simulator reads: stages, devices, links and run settings, all resolved.

hops.scenario builds it from a document (validating every field); the compute model, the memory
summary and the engine only read it. It lives apart from the loader because the loader itself
runs the compute model (`layers: auto` plans the split with it), so the record the compute model
takes cannot sit in the module that imports the compute model.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from hops.model.architecture import Architecture
from hops.schema.scenario import DEFAULT_STACK


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
    attention_tflop: float = 0.0  # the attention core's, apart from tflop: stages derived from the architecture


@dataclass(frozen=True)
class Stage:
    device: str
    weights_mb: float
    compute: StageCompute
    layers: float | None = None
    activation_memory_mb: float | None = None
    compute_jitter: float | None = None  # None: pipeline.compute_jitter
    weights_derived: bool = False  # weights_mb came from the architecture (it follows the schedule's placement)
    # compute came from layers and the architecture: its model chunks hold whole layers (hops.scenario)
    compute_derived: bool = False
    group: tuple[str, ...] = ()  # the tensor-parallel group (device first); () = device alone

    @property
    def tp(self) -> int:
        """Tensor-parallel size: the GPUs that split this stage's layers (1 for a `device:` stage)."""
        return max(len(self.group), 1)

    @property
    def gpus(self) -> tuple[str, ...]:
        return self.group or (self.device,)


@dataclass(frozen=True)
class DeviceSpec:
    id: str
    gpu: str
    node: str
    socket: int = 0
    host: str | None = None  # a host preset; None: no host caps


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
    dp_sharding: str  # none | zero1 | fsdp (optimizer.data_parallel.sharding)
    failure: Any
    output: Mapping[str, Any]
    raw: Mapping[str, Any] = field(repr=False, compare=False, default_factory=dict)
    notes: tuple[str, ...] = ()  # one line per legacy field HOPS models differently
    virtual_stages: int = 1  # model chunks per stage (interleaved 1F1B's v); the schedule places them
    post_validation: bool = False  # optimizer post-validation (ZB paper): no barrier between iterations
    stack: str = DEFAULT_STACK  # the training-stack preset
    stack_options: Mapping[str, Any] = field(default_factory=dict)  # the run's switches over the preset's
    architecture: Architecture | None = None  # the model's shape, when pipeline.model gives heads

    @property
    def n_stages(self) -> int:
        return len(self.stages)

    def embeddings_tied(self, model_constants: Mapping[str, Any]) -> bool:
        """Whether the input and output embeddings share one matrix: the scenario's
        `pipeline.model.tied_embeddings`, else the model constant `tied_embeddings`."""
        return bool(self.tied_embeddings if self.tied_embeddings is not None else model_constants["tied_embeddings"])

    @property
    def expert_parallel(self) -> int:
        """Ranks a mixture of experts' routed experts are spread over (1: a dense model)."""
        return self.architecture.expert_parallel if self.architecture is not None else 1

    def device(self, device_id: str) -> DeviceSpec:
        return next(d for d in self.devices if d.id == device_id)


def derived_compute(arch: Architecture, layers: float, micro_batch: int) -> StageCompute:
    tflop, attention, memory = arch.stage_work(layers, micro_batch)
    return StageCompute("analytical", tflop=tflop, memory_mb=memory, attention_tflop=attention)
