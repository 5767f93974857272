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
"""
from __future__ import annotations

import copy
import json
import math
import re
from dataclasses import dataclass, field

import numpy as np

from hops.metrics import measured_window
from hops.timeline import Timeline
from hops.traces import load_trace

from . import scoring
from .fixtures import FixtureError, list_fixtures, resolve_root

ARCHIVE, TRAIN = "archive", "train"
LABEL_KEYS = ("schedule", "backward_split", "scheduler_options")  # pipeline keys that only name a schedule


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


def _mean_abs(values) -> float:
    values = [abs(v) for v in values]
    return sum(values) / len(values) if values else math.nan


@dataclass
class Noise:
    pairs: list[Pair] = field(default_factory=list)
    unpaired: list[str] = field(default_factory=list)  # archive ids with no train run of the same config
    twins: list[Twin] = field(default_factory=list)
    not_twins: list[tuple[str, str]] = field(default_factory=list)  # same scenario, different executed order

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
    return "\n".join(lines)


def annotate(violations: list[str], n: Noise | None) -> list[str]:
    """Each per-fixture violation with the noise band of its configuration (or the suite mean) beside it."""
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
        out.append(v)
    return out
