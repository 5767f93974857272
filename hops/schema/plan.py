"""The planning request's schema (`hops plan FILE`): a model, a device inventory and the batch.

Checked like a scenario (hops.schema.validate), so a mistake is one line naming the field;
what needs the preset catalog (gpu and host names) is checked by hops.planner.
"""
from __future__ import annotations

from pydantic import Field

from hops.schema.fields import MAX_COUNT, Int, ListOf, Num, Section, Str, section_defaults
from hops.schema.scenario import DEFAULT_STACK, SHARDINGS, ModelShape, StackOptionsModel


class PoolModel(Section):
    """Identical nodes: `nodes` hosts of `gpus_per_node` GPUs of one type."""

    gpu: Str(description="a device preset (hops/presets/devices.yaml)")
    host: Str(description="a host preset (hops/presets/hosts.yaml); its gpu_link joins a tensor-parallel "
                          "group") | None = None
    nodes: Int(gt=0, cap=MAX_COUNT)
    gpus_per_node: Int(gt=0, cap=1024) = 8
    price_per_gpu_hour: Num(ge=0, description="any currency; gives cost per sample") | None = None


class TrainingModel(Section):
    global_batch: Int(gt=0, cap=10**7, description="samples (sequences) per optimizer step, all replicas")
    micro_batch_size: Int(gt=0, cap=MAX_COUNT) = 1
    stack: Str(description="a training-stack preset") = DEFAULT_STACK
    stack_options: StackOptionsModel = section_defaults()  # as a scenario's pipeline.stack_options
    sharding: Str(SHARDINGS) = "none"
    data_parallel: Int(gt=0, cap=MAX_COUNT, description="fix the data-parallel degree; default: searched") | None \
        = None
    max_pipeline: Int(gt=0, cap=1024, description="most pipeline stages a plan may have") = 16
    schedules: ListOf(Str()) = Field(default_factory=lambda: ["1f1b", "zb_h1"])
    cross_node: Str(description="the interconnect preset between nodes") = "infiniband"


class PlanRequestModel(Section):
    model: ModelShape
    inventory: ListOf(PoolModel)
    training: TrainingModel
