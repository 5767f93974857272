"""Every duration and memory figure derived from a scenario must be physical before it is reported.

Each input field is checked on its own (finite, in range), but products and quotients of
valid inputs still overflow: `compute.tflop: 1e308` is a finite number whose compute time is
infinite, and `memory_mb: 1e308` gives a finite time of 10^305 ms whose sums lose every
digit of the rest of the run. Simulating either produced a makespan of inf or NaN metrics
that looked like a result. So the durations themselves are checked where the engine
assembles them, and the first one that is not finite or is longer than MAX_DURATION_MS is
refused with the scenario field it came from, the inputs that produced it, and its value.
"""
from __future__ import annotations

import math

import numpy as np

from .errors import ScenarioError, echo
from .schema.fields import MAX_HORIZON_HOURS

# No single step of a training run (one microbatch's compute, one transfer, one optimizer
# step, one collective) lasts longer than the longest failure horizon HOPS simulates; with
# at most MAX_TASKS of them a run's clock stays far inside float range and keeps sub-ms digits.
MAX_DURATION_MS = MAX_HORIZON_HOURS * 3.6e6  # ten years
# A device holding more than an exabyte is no device; over-capacity reports (a GPipe run that
# stashes too many microbatches) stay far below this.
MAX_MEMORY_MB = 1e12


def check(value: float, path: str, what: str, inputs: str = "") -> None:
    """Refuse `value` (ms) unless it is finite, >= 0 and at most MAX_DURATION_MS."""
    if math.isfinite(value) and 0.0 <= value <= MAX_DURATION_MS:
        return
    src = f" (from {inputs})" if inputs else ""
    raise ScenarioError(path, f"{what} is {value:.6g} ms{src}; expected a finite time of at most "
                              f"{MAX_DURATION_MS:.3g} ms (ten years): a value here is physically impossible")


def _compute_inputs(stage, device) -> str:
    """The scenario values a stage's compute time is made of, the device's included (an override may be the culprit)."""
    c = stage.compute
    on = f"on device {echo(stage.device)} at slowdown {device.slowdown:g}"
    if c.mode == "distribution":
        dists = {k: getattr(c, k) for k in ("forward", "backward", "backward_b", "backward_w")}
        return ", ".join(f"{k}={d.kind} {d.params}" for k, d in dists.items() if d is not None) + f" {on}"
    given = f", layers={stage.layers:g}" if stage.layers is not None else ""
    return (f"tflop={c.tflop:g}, memory_mb={c.memory_mb:g}{given} {on}, {device.peak_tflops:g} TFLOP/s, "
            f"{device.memory_bandwidth_gbps:g} GB/s")


def check_layout(scenario, devices: list, phys: list, exp: list, opt_ms: list, sync_ms: float, links: list,
                 msg_mb: float) -> None:
    """The durations a placement decides: each virtual stage's expected F/B/W/BW, each stage's
    optimizer step, the tied-embedding sync and one transfer on every link used.
    ``devices``: each scenario stage's device parameters (hops.compute.ComputeModel.devices)."""
    for k, e in enumerate(exp):
        i = phys[k]
        for name, value in (("forward", e.f), ("backward", e.bw), ("backward B", e.b), ("backward W", e.w)):
            check(value, f"pipeline.stages[{i}].compute", f"the {name} time per microbatch",
                  _compute_inputs(scenario.stages[i], devices[i]))
    for i, value in enumerate(opt_ms):
        if scenario.optimizer_step_ms is not None:
            path, inputs = "optimizer.step_ms", f"step_ms={scenario.optimizer_step_ms[i]:g}"
        else:
            path, inputs = f"pipeline.stages[{i}].weights_mb", f"weights_mb={scenario.stages[i].weights_mb:g}"
        check(value, path, f"stage {i}'s optimizer step", inputs)
    check(sync_ms, "pipeline.model", "the tied-embedding all-reduce",
          f"hidden_dim={scenario.hidden_dim}, vocab_size={scenario.vocab_size}")
    path = "pipeline.activation_mb" if scenario.activation_mb is not None else "pipeline.model"
    for lp in links:
        check(lp.transfer_ms(msg_mb), path, f"one activation transfer on {lp.name}",
              f"{msg_mb:g} MB at {lp.bandwidth_gbps:g} GB/s + {lp.latency_ms:g} ms latency")


def check_iteration_end(scenario, allreduce_ms: list, host_ms: list) -> None:
    """The per-iteration durations outside the schedule: data-parallel all-reduce and host overhead."""
    for i, value in enumerate(allreduce_ms):
        check(value, f"pipeline.stages[{i}].weights_mb", f"stage {i}'s data-parallel all-reduce",
              f"weights_mb={scenario.stages[i].weights_mb:g} over {scenario.dp_degree} replicas")
    if host_ms:
        worst = max(host_ms, key=lambda v: v if math.isfinite(v) else math.inf)
        check(worst, "pipeline.host_overhead", "a drawn per-iteration host overhead")


def check_samples(scenario, devices: list, phys: list, samples: list) -> None:
    """The drawn compute times (a distribution's tail or a jitter can reach where its mean does not)."""
    for k, phases in enumerate(samples):
        for name, arr in phases.items():
            if len(arr) and not (np.isfinite(arr).all() and arr.max() <= MAX_DURATION_MS):
                bad = arr[~np.isfinite(arr)] if not np.isfinite(arr).all() else arr[arr > MAX_DURATION_MS]
                i = phys[k]
                check(float(bad[0]), f"pipeline.stages[{i}].compute", f"a drawn {name} time",
                      _compute_inputs(scenario.stages[i], devices[i]))


def check_memory(scenario, peak_memory_mb: dict) -> None:
    """Each device's peak memory: finite and at most MAX_MEMORY_MB, else the stage that put it there."""
    for device, mb in peak_memory_mb.items():
        if math.isfinite(mb) and 0.0 <= mb <= MAX_MEMORY_MB:
            continue
        i, st = next((i, st) for i, st in enumerate(scenario.stages) if st.device == device)
        act = "" if st.activation_memory_mb is None else f", activation_memory_mb={st.activation_memory_mb:g}"
        raise ScenarioError(f"pipeline.stages[{i}]", f"device {echo(device)} holds {mb:.6g} MB at its peak (from "
                                                     f"weights_mb={st.weights_mb:g}{act}); expected a finite size of "
                                                     f"at most {MAX_MEMORY_MB:.3g} MB (an exabyte): a value here is "
                                                     f"physically impossible")
