"""`noise`: the run-to-run spread of the same configuration, measured, so a gate violation can be read against it.

The archive split holds older runs of configurations that are also in train
(`exp2_9_g_only_pp4_run65` in archive, `exp2_9_g_only_pp4_run107` in train:
same id up to the run number). Both sides are measured values only, computed
from the traces by the same code that scores every prediction
(scoring.side_of -> hops.metrics.summarize), so the spread is what the metric
itself does between two real runs. It is context for the gate report, never a
tolerance: the gate's rules stay as gate.yaml states them.

Train also holds *same-job twins*: runs whose scenarios differ only in the schedule
they name (`exp2_1_all_nodes`, `exp2_10_all_nodes_gpipe`, `exp2_11_all_nodes_zero_bubble`)
and whose traces show the same executed order of forward and backward passes on every
stage, i.e. the job ignored the label. Their spread is run-to-run noise of one job too,
measured in the same campaign, so it is reported beside the archive pairs and joins a
fixture's band. A pair whose executed orders differ is not a twin and is not counted.

Within one run, a few *slow iterations* can carry a throughput error by themselves: a
run's throughput is its microbatches over the sum of its kept iterations' walls, so an
iteration that stalls adds its excess to the mean. `noise` counts, per train run, the
kept iterations whose wall exceeds the run's median by more than SLOW_SHARE and what they
add to the mean wall. On the fixture cluster these are the p5 pair's iteration-end stalls,
which the model charges at their train-wide rate (hosts.yaml): a run that met more of them
than that rate is measured slower than any expected-value prediction, by about what its
excess adds. The count is context for the gate report too, never a tolerance.
"""
from __future__ import annotations

import copy
import json
import math
import re
from dataclasses import dataclass, field

import numpy as np

from hops.metrics import iteration_walls, measured_window, warmup_iterations
from hops.timeline import Timeline
from hops.traces import load_trace

from . import scoring
from .fixtures import FixtureError, list_fixtures, resolve_root

ARCHIVE, TRAIN = "archive", "train"
LABEL_KEYS = ("schedule", "backward_split", "scheduler_options")  # pipeline keys that only name a schedule
SLOW_SHARE = 0.10  # an iteration is slow when its wall exceeds its run's median wall by more than this share


def config_key(fixture_id: str) -> str:
    """The configuration a fixture ran: its id without the trailing `_runN`."""
    return re.sub(r"_run\d+$", "", fixture_id)


class _Spread:
    """Two measured runs of one configuration: how far the second is from the first, with the
    same sign convention as a throughput error ((second - first) / first x 100) and in bubble pp."""

    def _measured(self) -> tuple[float, float, float, float]:  # throughput first, second; bubble first, second
        raise NotImplementedError

    @property
    def throughput_pct(self) -> float:
        t0, t1, _, _ = self._measured()
        return (t1 - t0) / t0 * 100.0

    @property
    def bubble_pp(self) -> float:
        _, _, b0, b1 = self._measured()
        return (b1 - b0) * 100.0


@dataclass(frozen=True)
class Pair(_Spread):
    """An archive run against the train run of the same configuration (archive - train)."""

    key: str
    archive: str
    train: str
    throughput_archive: float  # microbatches per second, measured
    throughput_train: float
    bubble_archive: float  # ratio, measured
    bubble_train: float

    def _measured(self) -> tuple[float, float, float, float]:
        return self.throughput_train, self.throughput_archive, self.bubble_train, self.bubble_archive


@dataclass(frozen=True)
class Twin(_Spread):
    """Two train runs of one job under different schedule labels, with the same executed order."""

    job: str  # the reference run's configuration
    reference: str  # the run labelled 1f1b when the group has one, else the first id
    other: str
    throughput_reference: float
    throughput_other: float
    bubble_reference: float
    bubble_other: float

    def _measured(self) -> tuple[float, float, float, float]:
        return self.throughput_reference, self.throughput_other, self.bubble_reference, self.bubble_other


@dataclass(frozen=True)
class SlowIterations:
    """One run's kept iterations (the window hops.metrics measures) against its median wall."""

    run: str
    iterations: int
    slow: int  # walls above (1 + SLOW_SHARE) x the median
    added_pct: float  # mean wall over the mean wall of the other iterations, - 1, x 100: what they cost its throughput


def slow_iterations(run: str, tl: Timeline) -> SlowIterations:
    _, _, walls = iteration_walls(tl)
    walls = walls[warmup_iterations(walls):]
    slow = walls > (1.0 + SLOW_SHARE) * np.median(walls)
    added = (walls.mean() / walls[~slow].mean() - 1.0) * 100.0
    return SlowIterations(run, int(len(walls)), int(slow.sum()), float(added))


def _mean_abs(values) -> float:
    values = [abs(v) for v in values]
    return sum(values) / len(values) if values else math.nan


@dataclass
class Noise:
    pairs: list[Pair] = field(default_factory=list)
    unpaired: list[str] = field(default_factory=list)  # archive ids with no train run of the same config
    twins: list[Twin] = field(default_factory=list)
    not_twins: list[tuple[str, str]] = field(default_factory=list)  # same scenario, different executed order
    slow: dict[str, SlowIterations] = field(default_factory=dict)  # train run id -> its slow iterations

    @property
    def slow_share(self) -> float:
        """Slow iterations over kept iterations, on every train run."""
        n = sum(s.iterations for s in self.slow.values())
        return sum(s.slow for s in self.slow.values()) / n if n else math.nan

    @property
    def throughput_pct_mean(self) -> float:
        return _mean_abs(p.throughput_pct for p in self.pairs)

    @property
    def bubble_pp_mean(self) -> float:
        return _mean_abs(p.bubble_pp for p in self.pairs)

    @property
    def twin_throughput_pct_mean(self) -> float:
        return _mean_abs(t.throughput_pct for t in self.twins)

    @property
    def twin_bubble_pp_mean(self) -> float:
        return _mean_abs(t.bubble_pp for t in self.twins)

    def band(self, train_id: str) -> tuple[float, float] | None:
        """|throughput %| and |bubble pp| spread of this train fixture's job (largest over archive
        duplicates and same-job twins)."""
        mine = [p for p in self.pairs if p.train == train_id]
        mine += [t for t in self.twins if train_id in (t.reference, t.other)]
        if not mine:
            return None
        return max(abs(p.throughput_pct) for p in mine), max(abs(p.bubble_pp) for p in mine)

    def metrics(self) -> dict[str, float]:
        out = {"noise.throughput_pct_mean": self.throughput_pct_mean, "noise.bubble_pp_mean": self.bubble_pp_mean,
               "noise.pairs": float(len(self.pairs))}
        for p in self.pairs:
            out[f"noise.{p.key}.throughput_pct"] = p.throughput_pct
            out[f"noise.{p.key}.bubble_pp"] = p.bubble_pp
        if self.twins:
            out.update({"noise.twins.throughput_pct_mean": self.twin_throughput_pct_mean,
                        "noise.twins.bubble_pp_mean": self.twin_bubble_pp_mean, "noise.twins": float(len(self.twins))})
        for t in self.twins:
            out[f"noise.twin.{config_key(t.other)}.throughput_pct"] = t.throughput_pct
        if self.slow:
            out["noise.slow_iterations.share"] = self.slow_share
        for s in self.slow.values():
            out[f"noise.slow.{config_key(s.run)}.added_pct"] = s.added_pct
        return out


def _numbers_as_floats(v):
    """128 and 128.0 are the same value in a scenario."""
    if isinstance(v, dict):
        return {k: _numbers_as_floats(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_numbers_as_floats(x) for x in v]
    return float(v) if isinstance(v, int) and not isinstance(v, bool) else v


def job_key(doc: dict) -> str:
    """The scenario without the keys that only name a schedule, as canonical JSON."""
    doc = copy.deepcopy(doc)
    pipe = doc.get("pipeline")
    if isinstance(pipe, dict):
        for k in LABEL_KEYS:
            pipe.pop(k, None)
    return json.dumps(_numbers_as_floats(doc), sort_keys=True, default=str)


def executed_order(tl: Timeline) -> tuple:
    """Per stage, the (phase, microbatch) sequence of compute in the first measured iteration."""
    w, _, _ = measured_window(tl)
    first = w.iteration[w.iteration >= 0].min()
    m = (w.kind == "compute") & (w.iteration == first)
    out = []
    for s in range(tl.n_stages):
        k = m & (w.stage == s)
        order = np.argsort(w.start_ms[k], kind="stable")
        out.append(tuple(zip(w.phase[k][order].tolist(), w.microbatch[k][order].tolist())))
    return tuple(out)


def _twins(train: list, side, out: Noise) -> None:
    """Group train runs by job; pair each with its group's reference when the executed orders agree.

    ``side(fixture, timeline)`` measures a run once per `noise` call."""
    groups: dict[str, list] = {}
    for f in train:
        groups.setdefault(job_key(f.scenario_doc), []).append(f)
    for members in groups.values():
        if len(members) < 2:
            continue
        members.sort(key=lambda f: f.id)
        ref = next((f for f in members if (f.scenario_doc.get("pipeline") or {}).get("schedule") == "1f1b"),
                   members[0])
        ref_tl = load_trace(ref.path)
        ref_order, sr = executed_order(ref_tl), side(ref, ref_tl)
        for f in members:
            if f is ref:
                continue
            tl = load_trace(f.path)
            if executed_order(tl) != ref_order:
                out.not_twins.append((ref.id, f.id))
                continue
            so = side(f, tl)
            out.twins.append(Twin(config_key(ref.id), ref.id, f.id, sr.throughput_per_s, so.throughput_per_s,
                                  sr.bubble_ratio, so.bubble_ratio))


def noise(root=None) -> Noise:
    """Pair every archive fixture with the train fixture of the same configuration; measure both."""
    root = resolve_root(root)
    archive = list_fixtures(root, ARCHIVE)
    try:
        train_runs = list_fixtures(root, TRAIN)
    except FixtureError:
        train_runs = []
    train = {config_key(f.id): f for f in train_runs}
    out = Noise()
    sides: dict[str, scoring.Side] = {}

    def side(f, tl=None) -> scoring.Side:
        if f.id not in sides:
            sides[f.id] = scoring.side_of(tl if tl is not None else load_trace(f.path))
        return sides[f.id]

    _twins(train_runs, side, out)
    out.slow = {f.id: slow_iterations(f.id, load_trace(f.path)) for f in train_runs}
    for a in archive:
        t = train.get(config_key(a.id))
        if t is None:
            out.unpaired.append(a.id)
            continue
        sa = side(a)
        st = side(t)
        out.pairs.append(Pair(config_key(a.id), a.id, t.id, sa.throughput_per_s, st.throughput_per_s,
                              sa.bubble_ratio, st.bubble_ratio))
    return out


def render(n: Noise) -> str:
    lines = [f"noise floor: {len(n.pairs)} archive run(s) against the train run of the same configuration "
             f"(measured values only; archive - train)",
             f"{'configuration':<34} {'archive':>8} {'train':>8} {'thr %':>8} {'bubble pp':>10}"]
    for p in sorted(n.pairs, key=lambda p: p.key):
        lines.append(f"{p.key:<34} {p.archive.rsplit('_', 1)[-1]:>8} {p.train.rsplit('_', 1)[-1]:>8} "
                     f"{p.throughput_pct:>+8.2f} {p.bubble_pp:>+10.2f}")
    lines.append(f"mean |spread|: throughput {n.throughput_pct_mean:.2f} %, bubble {n.bubble_pp_mean:.2f} pp")
    if n.twins or n.not_twins:
        lines.append(f"same-job twins in train: {len(n.twins)} run(s) whose scenario differs from a reference run only "
                     f"in its schedule label and whose trace executed the same order (other - reference)")
        lines.append(f"{'reference':<34} {'other':<40} {'thr %':>8} {'bubble pp':>10}")
        for t in sorted(n.twins, key=lambda t: (t.reference, t.other)):
            lines.append(f"{config_key(t.reference):<34} {config_key(t.other):<40} {t.throughput_pct:>+8.2f} "
                         f"{t.bubble_pp:>+10.2f}")
        if n.twins:
            lines.append(f"twins mean |spread|: throughput {n.twin_throughput_pct_mean:.2f} %, "
                         f"bubble {n.twin_bubble_pp_mean:.2f} pp")
        for a, b in n.not_twins:
            lines.append(f"same scenario but a different executed order (not counted): {a}, {b}")
    if n.unpaired:
        lines.append(f"no train run of the same configuration (not counted): {', '.join(sorted(n.unpaired))}")
    slow = sorted((s for s in n.slow.values() if s.slow), key=lambda s: (-s.added_pct, s.run))
    if n.slow:
        total = sum(s.iterations for s in n.slow.values())
        lines.append(f"slow iterations in train (wall > {1 + SLOW_SHARE:.2f} x the run's median): "
                     f"{sum(s.slow for s in slow)} of {total} kept iterations ({100 * n.slow_share:.1f} %) on "
                     f"{len(slow)} of {len(n.slow)} runs; what they add to the run's mean wall, i.e. take off its "
                     f"measured throughput")
        lines.append(f"{'run':<46} {'slow':>8} {'adds %':>8}")
        for s in slow:
            lines.append(f"{s.run:<46} {f'{s.slow}/{s.iterations}':>8} {s.added_pct:>8.2f}")
    return "\n".join(lines)


def annotate(violations: list[str], n: Noise | None) -> list[str]:
    """Each per-fixture violation with the noise band of its configuration (or the suite mean) beside it,
    and a throughput violation with the run's slow iterations, where it has any."""
    if n is None or not n.pairs:
        return violations
    out = []
    for v in violations:
        fid = v.split(":", 1)[0]
        if fid.startswith("exp") and ("|throughput error|" in v or "|bubble delta|" in v):
            band = n.band(fid)
            if band is not None:
                v += f"  [run-to-run noise of this config: {band[0]:.2f} % thr, {band[1]:.2f} pp bubble]"
            else:
                v += (f"  [no duplicate of this config; suite noise mean {n.throughput_pct_mean:.2f} % thr, "
                      f"{n.bubble_pp_mean:.2f} pp bubble]")
            slow = n.slow.get(fid)
            if slow is not None and slow.slow and "|throughput error|" in v:
                v += (f"  [{slow.slow} of its {slow.iterations} iterations slow, adding {slow.added_pct:.1f} % to its "
                      f"mean wall; train: {100 * n.slow_share:.1f} % of iterations slow]")
        out.append(v)
    return out
