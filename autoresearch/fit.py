"""The phase fit: constants of a search space fitted to the train traces' per-stage F and BW times.

Iteration 26 fitted the sum model's constants (space `sum_model`) this way by hand; this is that fit
as code, so cross-validation (crossval.py) can rerun it on a subset of train with the same
residuals and bounds.

Data: every stage of every fixture, its measured forward and fused-backward ms per microbatch
(scoring.phase_breakdown over the measured window, per iteration, / microbatches per iteration)
against the model's own expected times for that stage (hops.model.compute.ComputeModel on the Megatron
scenario the spec variant runs, catalog = presets + the candidate values through
``Catalog.load(overrides)``). No simulation: a prediction of all 36 train fixtures takes ~10 ms.

Residual: relative, (predicted - measured) / measured, under scipy's soft-L1 loss with a 10 %
scale. Relative, because stage times span 1.5-40 ms and an absolute residual lets the few long
stages (seq 4096, h 2048) decide every constant; this definition lands on iteration 26's committed
constants (autoresearch/README.md shows the table), absolute ms residuals do not (the coefficient
goes to 1.70, attention backward bytes to 28.9). Soft-L1 keeps a single odd stage (a last stage
that stalls on its host) from pulling a constant.

The model is piecewise (``max(floor, kernels)``), so the cost has flat directions and several local
minima: a floor that is below the kernel sum on every stage has no gradient. The fit therefore
starts from the middle of the bounds and from ``starts - 1`` uniform draws inside them (one
numpy Generator from ``seed``) and keeps the lowest cost; it never starts from the catalog's
current values, so a refit on a subset of train cannot inherit the all-train fit through a flat
direction.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np

from hops.model.compute import ComputeModel
from hops.errors import HopsError
from hops.model.hardware import Catalog, Topology
from hops.scenario import Scenario, load_scenario
from hops.traces import load_trace

from . import scoring
from .fixtures import Fixture
from .search import Param, select
from .variants import spec_scenario

LOSS, F_SCALE = "soft_l1", 0.1  # soft-L1 of the relative residual, linear beyond 10 %
DEFAULT_STARTS, DEFAULT_SEED = 8, 0


class FitError(HopsError):
    """The fit was asked for something it cannot do (no data, no parameters)."""


@dataclass(frozen=True)
class StagePhases:
    """One fixture's measured F and BW ms per microbatch per stage, with the scenario that predicts them."""

    id: str
    scenario: Scenario
    gpus: tuple[str, ...]  # preset GPU of each stage
    measured: np.ndarray  # shape (stages, 2): F, BW; a NaN row is a stage the fit does not see

    def without_gpu(self, gpu: str) -> "StagePhases":
        """The same fixture with its stages on `gpu` hidden from the fit (NaN rows): its other
        stages still inform the constants, and nothing measured on that GPU does."""
        hide = np.array([g == gpu for g in self.gpus])
        return dataclasses.replace(self, measured=np.where(hide[:, None], np.nan, self.measured))

    def seen_gpus(self) -> set[str]:
        return {g for g, row in zip(self.gpus, self.measured) if np.isfinite(row).all()}


@dataclass
class FitResult:
    values: dict[str, float]  # fitted value per catalog path
    params: list[Param]
    cost: float
    fixtures: tuple[str, ...]  # ids the fit saw
    unseen: dict[str, float] = field(default_factory=dict)  # paths of GPUs absent from the data: fallback value
    residuals: np.ndarray | None = None  # relative residual per (stage row, phase) at the fitted values

    def at_bound(self, rtol: float = 1e-3) -> dict[str, str]:
        """{path: 'low'|'high'} for fitted values within rtol x (high - low) of a bound."""
        out = {}
        for p in self.params:
            if p.path in self.values and p.path not in self.unseen:
                v, tol = self.values[p.path], rtol * (p.high - p.low)
                if v - p.low <= tol:
                    out[p.path] = "low"
                elif p.high - v <= tol:
                    out[p.path] = "high"
        return out


def stage_phases(fixtures: list[Fixture], *, cache_dir=None) -> list[StagePhases]:
    """Measured per-stage phases of each fixture (traces parsed through the importer's disk cache)."""
    base = Catalog.load()
    out = []
    for f in fixtures:
        tl = load_trace(f.path, cache_dir=cache_dir, token=f.token)
        f.check_trace_layout(tl.stage_devices, tl.microbatches_per_iteration)
        breakdown, _, _ = scoring.phase_breakdown(tl)
        per = {(s, ph): v / tl.microbatches_per_iteration for s, ph, v in breakdown}
        measured = np.array([[per[(s, "F")], per[(s, "BW")]] for s in range(tl.n_stages)])
        sc = load_scenario(spec_scenario(f), base)
        gpus = tuple(next(d.gpu for d in sc.devices if d.id == st.device) for st in sc.stages)
        out.append(StagePhases(f.id, sc, gpus, measured))
    return out


def predicted(data: list[StagePhases], catalog: Catalog) -> np.ndarray:
    """The model's expected F and BW ms per microbatch, stacked like the measured arrays."""
    rows = []
    for d in data:
        model = ComputeModel(d.scenario, Topology(d.scenario, catalog), catalog)
        rows += [[e.f, e.bw] for e in model.expected]
    return np.array(rows)


def relative_residuals(data: list[StagePhases], overrides: dict[str, float] | None = None) -> np.ndarray:
    """(predicted - measured) / measured per stage and phase, with `overrides` applied to the presets."""
    measured = np.vstack([d.measured for d in data])
    return (predicted(data, Catalog.load(overrides)) - measured) / measured


def unseen_fallbacks(data: list[StagePhases], params: list[Param]) -> dict[str, float]:
    """Per-GPU constants of GPUs no seen stage of `data` runs on, and what a GPU without them gets.

    Such a constant has no residual, so a fit cannot move it. A stack gives a GPU without its own
    dispatch floors its `default` forward floor, for the backward too, and without its own launch
    cost its `default` launch (hops/model/hardware.py per_gpu); that is what a GPU the fit never
    saw runs with. Per-GPU paths read ``stacks.<stack>.<key>.<gpu>``.
    """
    seen = set().union(*(d.seen_gpus() for d in data))
    stacks = Catalog.load().stacks
    out = {}
    for p in params:
        parts = p.path.split(".")
        if parts[0] == "stacks" and len(parts) == 4 and parts[3] not in seen:
            if parts[2] not in ("k_floor_ms", "k_floor_backward_ms", "launch_overhead_ms"):
                raise FitError(f"{p.path}: no stage of the fit data runs on {parts[3]} and the stack has no "
                               f"generic value for {parts[2]}; leave that GPU's fixtures in the fit")
            key = "launch_overhead_ms" if parts[2] == "launch_overhead_ms" else "k_floor_ms"
            out[p.path] = float(stacks[parts[1]][key]["default"])
    return out


def fit(data: list[StagePhases], params: list[Param], *, starts: int = DEFAULT_STARTS,
        seed: int = DEFAULT_SEED) -> FitResult:
    """Least squares (soft-L1, relative) of `params` within their bounds; best of `starts` starting points."""
    from scipy.optimize import least_squares

    if not data:
        raise FitError("no fixtures to fit on")
    unseen = unseen_fallbacks(data, params)
    free = [p for p in params if p.path not in unseen]
    if not free:
        raise FitError("no parameter of the space is identifiable from these fixtures")
    lo, hi = np.array([p.low for p in free]), np.array([p.high for p in free])
    paths = [p.path for p in free]

    def residuals(x):
        r = relative_residuals(data, {**unseen, **dict(zip(paths, map(float, x)))}).ravel()
        return r[np.isfinite(r)]  # hidden stages (StagePhases.without_gpu) have no residual

    rng = np.random.default_rng(seed)
    x0s = [(lo + hi) / 2] + [lo + (hi - lo) * rng.random(len(free)) for _ in range(max(starts, 1) - 1)]
    best = None
    for x0 in x0s:
        r = least_squares(residuals, x0, bounds=(lo, hi), loss=LOSS, f_scale=F_SCALE)
        if best is None or r.cost < best.cost:
            best = r
    values = {**unseen, **dict(zip(paths, (float(v) for v in best.x)))}
    return FitResult(values={p.path: values[p.path] for p in params}, params=list(params), cost=float(best.cost),
                     fixtures=tuple(d.id for d in data), unseen=unseen,
                     residuals=relative_residuals(data, values))


def fit_space(space: str, data: list[StagePhases], **kwargs) -> FitResult:
    """Fit a named space of search_space.yaml (entries with justified bounds only, as search demands)."""
    _, params = select(space)
    return fit(data, params, **kwargs)
