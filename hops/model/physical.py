"""Every duration and memory figure derived from a scenario must be physical before it is reported.

Each input field is checked on its own (finite, in range), but products and quotients of
valid inputs still overflow: `compute.tflop: 1e308` is a finite number whose compute time is
infinite, and `memory_mb: 1e308` gives a finite time of 10^305 ms whose sums lose every
digit of the rest of the run. Simulating either produced a makespan of inf or NaN metrics
that looked like a result. So the durations themselves are checked where the engine
assembles them, and the first one that is not finite or is longer than MAX_DURATION_MS is
refused with the scenario field it came from, the inputs that produced it, and its value.
The same holds for each device's peak memory and for the failure horizon (its restart,
repair and checkpoint times, and how many fault events its MTBFs and rates imply).
"""
from __future__ import annotations

import math

import numpy as np

from hops.errors import ScenarioError, echo
from hops.schema.fields import MAX_COUNT, MAX_HORIZON_HOURS

# No single step of a training run (one microbatch's compute, one transfer, one optimizer
# step, one collective) lasts longer than the longest failure horizon HOPS simulates; with
# at most MAX_TASKS of them a run's clock stays far inside float range and keeps sub-ms digits.
MAX_DURATION_MS = MAX_HORIZON_HOURS * 3.6e6  # ten years
# A device holding more than an exabyte is no device; over-capacity reports (a GPipe run that
# stashes too many microbatches) stay far below this.
MAX_MEMORY_MB = 1e12
# Fault events one failure horizon may hold (expected count): ten years of a 100k-GPU cluster at a
# 50k-hour MTBF is under 2e5; the bound is the scenario size bound MAX_COUNT.
MAX_FAULT_EVENTS = MAX_COUNT


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
    ``devices``: each scenario stage's device parameters (hops.model.compute.ComputeModel.devices)."""
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


def check_horizon(cfg, units: dict, device_mtbf_hours, interval_minutes: float) -> None:
    """The failure horizon's durations (each a finite time of at most ten years) and its expected
    number of fault events (at most MAX_FAULT_EVENTS): an MTBF of 1e-308 hours is a finite,
    positive input whose failure rate is infinite, and drawing its failures crashed or ran out
    of memory. ``units``: hops.failures.horizon.cluster_units; ``device_mtbf_hours``: per GPU or None."""
    ck, lk, pl = cfg.checkpoint, cfg.links, cfg.planned
    minutes = {"failure.checkpoint.interval_minutes": interval_minutes,
               "failure.checkpoint.write_minutes": ck.write_minutes,
               "failure.checkpoint.restart_minutes": ck.restart_minutes,
               "failure.checkpoint.detection_minutes": ck.detection_minutes,
               "failure.checkpoint.replace_minutes": ck.replace_minutes,
               "failure.checkpoint.spare_repair_hours": ck.spare_repair_hours * 60.0,
               "failure.links.repair_minutes": lk.repair_minutes,
               "failure.links.degradation.duration_minutes": lk.degradation.duration_minutes,
               "failure.stragglers.throttling.duration_minutes": cfg.stragglers.throttling.duration_minutes,
               "failure.planned.extra_minutes": pl.extra_minutes,
               **({"failure.planned.interval_hours": pl.interval_hours * 60.0} if pl.interval_hours else {}),
               **{f"failure.components[{i}].repair_minutes": c.repair_minutes for i, c in enumerate(cfg.components)}}
    for path, m in minutes.items():
        check(m * 60e3, path, "this time", f"{path.rsplit('.', 1)[-1]}={m:g}" if "hours" not in path
              else f"{path.rsplit('.', 1)[-1]}={m / 60.0:g}")
    hours = cfg.horizon_hours
    expected = {}  # field -> (expected events over the horizon, how)
    if device_mtbf_hours is not None:
        rate = float(np.sum(1.0 / np.asarray(device_mtbf_hours, dtype=np.float64)))
        expected["failure.devices.mtbf_hours"] = (hours * rate, f"{units['gpu']} GPUs")
    for i, c in enumerate(cfg.components):
        expected[f"failure.components[{i}].mtbf_hours"] = (
            hours * units[c.per] / c.mtbf_hours, f"mtbf_hours={c.mtbf_hours:g} x {units[c.per]} {c.per} unit(s)")
    if lk.mtbf_hours is not None:
        expected["failure.links.mtbf_hours"] = (hours * units["link"] / lk.mtbf_hours,
                                                f"mtbf_hours={lk.mtbf_hours:g} x {units['link']} links")
    expected["failure.links.degradation.rate_per_hour"] = (
        hours * lk.degradation.rate_per_hour * units["link"], f"{units['link']} links")
    expected["failure.stragglers.throttling.rate_per_hour"] = (
        hours * cfg.stragglers.throttling.rate_per_hour * units["gpu"], f"{units['gpu']} GPUs")
    for path, (n, how) in expected.items():
        if not n <= MAX_FAULT_EVENTS:  # NaN and inf included
            raise ScenarioError(path, f"{n:.3g} fault events expected over the {hours:g} h horizon ({how}); "
                                      f"expected at most {MAX_FAULT_EVENTS:,}: a value here is physically impossible")
