"""`noise`: the run-to-run spread of the same configuration, measured, so a gate violation can be read against it.

The archive split holds older runs of configurations that are also in train
(`exp2_9_g_only_pp4_run65` in archive, `exp2_9_g_only_pp4_run107` in train:
same id up to the run number). Both sides are measured values only, computed
from the traces by the same code that scores every prediction
(scoring.side_of -> hops.metrics.summarize), so the spread is what the metric
itself does between two real runs. It is context for the gate report, never a
tolerance: the gate's rules stay as gate.yaml states them.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from hops.traces import load_trace

from . import scoring
from .fixtures import FixtureError, list_fixtures, resolve_root

ARCHIVE, TRAIN = "archive", "train"


def config_key(fixture_id: str) -> str:
    """The configuration a fixture ran: its id without the trailing `_runN`."""
    return re.sub(r"_run\d+$", "", fixture_id)


@dataclass(frozen=True)
class Pair:
    key: str
    archive: str
    train: str
    throughput_archive: float  # microbatches per second, measured
    throughput_train: float
    bubble_archive: float  # ratio, measured
    bubble_train: float

    @property
    def throughput_pct(self) -> float:
        """(archive - train) / train x 100, the same sign convention as a throughput error."""
        return (self.throughput_archive - self.throughput_train) / self.throughput_train * 100.0

    @property
    def bubble_pp(self) -> float:
        return (self.bubble_archive - self.bubble_train) * 100.0


@dataclass
class Noise:
    pairs: list[Pair] = field(default_factory=list)
    unpaired: list[str] = field(default_factory=list)  # archive ids with no train run of the same config

    @property
    def throughput_pct_mean(self) -> float:
        return sum(abs(p.throughput_pct) for p in self.pairs) / len(self.pairs) if self.pairs else math.nan

    @property
    def bubble_pp_mean(self) -> float:
        return sum(abs(p.bubble_pp) for p in self.pairs) / len(self.pairs) if self.pairs else math.nan

    def band(self, train_id: str) -> tuple[float, float] | None:
        """|throughput %| and |bubble pp| spread of this train fixture's configuration (largest if several)."""
        mine = [p for p in self.pairs if p.train == train_id]
        if not mine:
            return None
        return max(abs(p.throughput_pct) for p in mine), max(abs(p.bubble_pp) for p in mine)

    def metrics(self) -> dict[str, float]:
        out = {"noise.throughput_pct_mean": self.throughput_pct_mean, "noise.bubble_pp_mean": self.bubble_pp_mean,
               "noise.pairs": float(len(self.pairs))}
        for p in self.pairs:
            out[f"noise.{p.key}.throughput_pct"] = p.throughput_pct
            out[f"noise.{p.key}.bubble_pp"] = p.bubble_pp
        return out


def _measured(fixture) -> scoring.Side:
    return scoring.side_of(load_trace(fixture.path))


def noise(root=None) -> Noise:
    """Pair every archive fixture with the train fixture of the same configuration; measure both."""
    root = resolve_root(root)
    archive = list_fixtures(root, ARCHIVE)
    try:
        train = {config_key(f.id): f for f in list_fixtures(root, TRAIN)}
    except FixtureError:
        train = {}
    out = Noise()
    sides: dict[str, scoring.Side] = {}
    for a in archive:
        t = train.get(config_key(a.id))
        if t is None:
            out.unpaired.append(a.id)
            continue
        sa = _measured(a)
        st = sides.setdefault(t.id, _measured(t))
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
