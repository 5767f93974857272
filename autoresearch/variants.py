"""The three prediction variants (autoresearch/README.md, Definitions), and what each one is allowed to see.

The information boundary is structural, not a convention: the builders of
`spec` and `link_calibrated` take a Fixture and nothing else, so no value
derived from the target trace can reach them. Only `replay` receives a
`ReplayFit`, and a ReplayFit can only be made from a measured Timeline.
`tests/test_validate.py` proves the boundary by perturbing a trace.

Replay takes per-stage forward/backward distributions, per-stage optimizer steps and the
mean per-iteration dead time (placed before the optimizer, where the engine puts host
overhead and the traces show it) from the target trace, and runs them on the links of
the fixture's pre-job benchmark, as link_calibrated does.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Callable

import numpy as np

from hops.api import Result, simulate
from hops.errors import HopsError, TraceError
from hops.model.hardware import Catalog
from hops.metrics import iteration_walls, measured_window
from hops.timeline import Timeline
from hops.traces import link_overrides
from hops.traces.guard import check_fixture_dir

from .fixtures import Fixture

class VariantError(HopsError, ValueError):
    """An unknown variant name was requested."""


@dataclass(frozen=True)
class Variant:
    name: str
    uses_trace: bool
    purpose: str


VARIANTS: dict[str, Variant] = {
    "spec": Variant("spec", False, "scenario + presets + model constants: pure prediction"),
    "link_calibrated": Variant("link_calibrated", False,
                               "spec + the fixture's pre-job link benchmark: the headline prediction"),
    "replay": Variant("replay", True, "compute, optimizer, dead time and transfers fitted from the target "
                                      "trace: diagnostic of orchestration only"),
}


def check_variants(names) -> tuple[str, ...]:
    names = tuple(dict.fromkeys(names or VARIANTS))
    for name in names:
        if name not in VARIANTS:
            raise VariantError(f"unknown variant {name!r}; expected one of {', '.join(VARIANTS)}")
    return names


# --------------------------------------------------------------------------- trace-free variants
# The fixtures are one cluster running one stack: Megatron-LM as experiment 2 ran it, on AWS
# hosts with one GPU each. Their calibrated constants live in these presets, never in a GPU's.
FIXTURE_STACK = "fixture_megatron"
FIXTURE_HOSTS = {"h100": "aws_p5", "a10g": "aws_g5", "l4": "aws_g6"}  # p5 / g5.2xlarge / g6.4xlarge


def on_fixture_cluster(doc: dict) -> dict:
    """`doc` with the fixtures' stack and each device's AWS host named, unless it names its own."""
    pipe = doc.get("pipeline")
    if isinstance(pipe, dict):
        pipe.setdefault("stack", FIXTURE_STACK)
    hw = doc.get("hardware")
    for dev in (hw.get("devices") or []) if isinstance(hw, dict) else []:
        if isinstance(dev, dict) and dev.get("gpu") in FIXTURE_HOSTS and "host" not in dev:
            dev["host"] = FIXTURE_HOSTS[dev["gpu"]]
    return doc


def spec_scenario(fixture: Fixture) -> dict:
    """The fixture's scenario as the Megatron job ran it.

    Every fixture is a Megatron training job, and that job steps Adam on every stage at every
    iteration (each trace has OPTIMIZER events on every rank). The scenarios' `optimizer:
    enabled: false` is the original simulator's template switch, not a property of the job, so
    the prediction runs the optimizer, with the step time the model derives from the stage's
    parameters, never a time read from the trace. Likewise the job's schedule is Megatron's,
    not the scenario's label (below), its stack and hosts are the fixture cluster's, and its
    stages do the FLOPs of the layers the scenario encodes (_layer_flops_of_the_job).
    """
    doc = on_fixture_cluster(copy.deepcopy(fixture.scenario_doc))
    opt = dict(doc.get("optimizer") or {})
    opt["enabled"] = True
    opt.pop("step_ms", None)
    doc["optimizer"] = opt
    pipe = doc.get("pipeline")
    if isinstance(pipe, dict) and int(pipe.get("virtual_stages") or 1) == 1:
        # Megatron-LM's only non-interleaved pipeline schedule is 1F1B with a fused backward
        # (forward_backward_pipelining_without_interleaving); a `schedule` of gpipe or
        # zero_bubble is the harness's label and never reached the job (every such train
        # trace runs 1F1B's order with BACKWARD events only).
        pipe["schedule"] = "1f1b"
        pipe.pop("scheduler_options", None)
    if isinstance(pipe, dict):
        _layer_flops_of_the_job(pipe, int((doc.get("simulation") or {}).get("micro_batch_size") or 1))
    return doc


# The experiment's scenarios declare a stage's forward work as this many FLOPs per layer, token and
# hidden unit squared (tflop = 28 s h^2 x layers x micro-batch; every train stage is an integer
# number of layers at 28, calibration iteration 18). It is a GPT layer's forward only at s = h.
FIXTURE_FLOPS_PER_LAYER_TOKEN = 28


def _layer_flops_of_the_job(pipe: dict, micro_batch: int) -> None:
    """Each analytical stage's layers as the scenario encodes them, at the FLOPs those layers do.

    A GPT layer's forward is 24 s h^2 FLOPs in its four linear layers plus 4 s^2 h in the attention
    core (QK^T and the value product), 24 s h^2 (1 + s / 6h) (Narayanan et al., SC'21, sec. 5.1), so
    the scenarios' 28 s h^2 under-counts long sequences (by 43 % at s 4096, h 1024) and over-counts
    wide layers. The job ran the layers, not the declared FLOPs.
    """
    model = pipe.get("model") or {}
    s, h = model.get("seq_len"), model.get("hidden_dim")
    if not s or not h:
        return
    for st in pipe.get("stages") or []:
        c = st.get("compute") if isinstance(st, dict) else None
        if not isinstance(c, dict) or c.get("mode", "analytical") != "analytical" or c.get("tflop") is None:
            continue
        layers = float(st.get("layers") or c["tflop"] * 1e12 / (FIXTURE_FLOPS_PER_LAYER_TOKEN * s * h * h * micro_batch))
        st["layers"] = layers
        st["compute"] = {**c, "tflop": layers * micro_batch * (24 * s * h * h + 4 * s * s * h) / 1e12}


def link_calibrated_scenario(fixture: Fixture) -> dict:
    """Measured links are appended after any the scenario declares, so they take precedence."""
    doc = spec_scenario(fixture)
    over = doc.setdefault("overrides", {}) or {}
    doc["overrides"] = over
    over["links"] = list(over.get("links") or []) + link_overrides(fixture.path, fixture.token)["links"]
    return doc


# --------------------------------------------------------------------------- replay
@dataclass(frozen=True)
class Lognormal:
    mean_ms: float
    cv: float

    @classmethod
    def fit(cls, samples: np.ndarray) -> "Lognormal":
        """Moment fit: the engine parameterises lognormals by mean and coefficient of variation."""
        mean = float(np.mean(samples))
        cv = float(np.std(samples) / mean) if mean > 0 and len(samples) > 1 else 0.0
        return cls(max(mean, 1e-6), cv)

    def as_doc(self) -> dict:
        return {"kind": "lognormal", "mean_ms": self.mean_ms, "cv": self.cv}


@dataclass(frozen=True)
class ReplayFit:
    """Everything replay takes from the target trace (measured window only, warm-up excluded)."""

    forward: tuple[Lognormal, ...]
    backward: tuple[Lognormal, ...] | None  # fused backward per stage
    backward_b: tuple[Lognormal, ...] | None  # split backward, when the trace reports it
    backward_w: tuple[Lognormal, ...] | None
    optimizer_step_ms: tuple[float, ...] | None  # per stage; None: the trace has no optimizer events
    host_overhead: Lognormal | None  # the mean dead time per iteration (cv 0: replay charges it every iteration)


def _per_stage(w: Timeline, mask: np.ndarray, n_stages: int, what: str) -> tuple[Lognormal, ...]:
    dur = w.end_ms - w.start_ms
    out = []
    for s in range(n_stages):
        x = dur[mask & (w.stage == s)]
        if len(x) == 0:
            raise TraceError(f"{w.meta.get('source', 'trace')}: stage {s} has no {what} events in the "
                             f"measured window, cannot fit a replay distribution")
        out.append(Lognormal.fit(x))
    return tuple(out)


def fit_replay(tl: Timeline) -> ReplayFit:
    w, _, _ = measured_window(tl)
    p = tl.n_stages
    compute = w.kind == "compute"
    split = bool(np.any(compute & np.isin(w.phase, ("B", "W"))))
    forward = _per_stage(w, compute & (w.phase == "F"), p, "forward")
    if split:
        backward = None
        backward_b = _per_stage(w, compute & (w.phase == "B"), p, "BACKWARD_INPUT")
        backward_w = _per_stage(w, compute & (w.phase == "W"), p, "BACKWARD_WEIGHT")
    else:
        backward, backward_b, backward_w = _per_stage(w, compute & (w.phase == "BW"), p, "backward"), None, None

    opt = w.kind == "optimizer"
    work = compute | (w.kind == "transfer")
    # The dead time per iteration is the sum of two parts, each averaged where the trace shows it.
    # Inside an iteration, from its last compute or transfer to its last event, less the step the
    # simulator charges there: over every kept iteration, the last too, since the scoring window
    # holds each iteration up to its last event (the traces' ~180 ms stalls before a step land in
    # the last one on some runs). After an iteration's last event, to the next one's first event:
    # over the gaps between kept iterations (the last one's lies outside the window, unobserved).
    ids, starts, walls = iteration_walls(w)
    inside, after = [], []
    for k, (it, start, wall) in enumerate(zip(ids, starts, walls)):
        mine = w.iteration == it
        o = mine & opt
        step = float(np.max(w.end_ms[o] - w.start_ms[o])) if o.any() else 0.0
        end = float(w.end_ms[mine].max())
        inside.append(max(end - float(w.end_ms[mine & work].max()) - step, 0.0))
        if k + 1 < len(ids):
            after.append(max(start + wall - end, 0.0))
    dead = [float(np.mean(inside)) + (float(np.mean(after)) if after else 0.0)] if inside else []
    step_ms = None
    if opt.any():  # mean step per stage: every stage steps after the barrier, the slowest sets the pace
        dur_opt = w.end_ms - w.start_ms
        step_ms = tuple(float(np.mean(dur_opt[opt & (w.stage == s)])) if (opt & (w.stage == s)).any() else 0.0
                        for s in range(p))
    host = Lognormal(dead[0], 0.0) if dead and dead[0] > 0 else None  # replay charges its mean every iteration

    return ReplayFit(forward, backward, backward_b, backward_w, step_ms, host)


def replay_scenario(fixture: Fixture, fit: ReplayFit, catalog: Catalog) -> dict:
    """Orchestration replay: the fitted compute, steps and dead time on the benchmarked links.

    Transfers come from the link benchmark, not from the trace's transfer events: those time
    the host-side posting of a p2p op (0.1-0.6 ms for a 2 MB activation on hops whose
    sender-end to receiver-start gap is 1.2-2.4 ms), not the message's flight.
    """
    doc = link_calibrated_scenario(fixture)
    pipe = doc["pipeline"]
    if len(fit.forward) != len(pipe["stages"]):
        raise TraceError(f"{fixture.path}: trace has {len(fit.forward)} stages, scenario has "
                         f"{len(pipe['stages'])}; replay needs them to agree")
    for s, stage in enumerate(pipe["stages"]):
        comp = {"mode": "distribution", "forward": fit.forward[s].as_doc()}
        if fit.backward is not None:
            comp["backward"] = fit.backward[s].as_doc()
        else:
            comp["backward_b"] = fit.backward_b[s].as_doc()
            comp["backward_w"] = fit.backward_w[s].as_doc()
        stage["compute"] = comp
    opt = dict(doc.get("optimizer") or {})
    if fit.optimizer_step_ms is not None:
        opt.update(enabled=True, step_ms=list(fit.optimizer_step_ms))
    else:
        opt["enabled"] = False
    doc["optimizer"] = opt
    # The fitted dead time already contains the iteration-end collectives the model would add.
    pipe.setdefault("model", {})["tied_embeddings"] = False
    if fit.host_overhead is not None:
        # its mean, not draws from a fitted lognormal: over a few simulated iterations the draws
        # alone would move the predicted mean by several percent
        pipe["host_overhead"] = {"kind": "constant", "ms": fit.host_overhead.mean_ms}
    else:
        pipe.pop("host_overhead", None)
    return doc


# --------------------------------------------------------------------------- prediction
def predict(variant: str, fixture: Fixture, catalog: Catalog, *, seed: int | None = None,
            replay_fit: Callable[[], ReplayFit] | None = None) -> Result:
    """Simulate one variant. `replay_fit` is called only for variants that may use the trace."""
    check_fixture_dir(fixture.path, fixture.token)  # before the scenario, trace or link bench is read
    v = VARIANTS[check_variants([variant])[0]]
    if v.name == "spec":
        doc = spec_scenario(fixture)
    elif v.name == "link_calibrated":
        doc = link_calibrated_scenario(fixture)
    else:
        if replay_fit is None:
            raise VariantError("replay needs the measured trace (pass replay_fit)")
        doc = replay_scenario(fixture, replay_fit(), catalog)
    return simulate(doc, seed=seed, catalog=catalog)
