"""`validate`: every fixture of a split x every variant, scored; the API the gate and ledger call.

Speed matters because the calibration loop re-validates after every model
change. The measured side of a fixture (its summary, phase breakdown and replay
fit) depends only on the trace bytes, so it is memoised per process keyed by a
hash of those bytes; parsed traces are also cached on disk by
``hops.traces.load_trace``. A re-validation after a catalog change therefore
costs only the simulations.

Comparability: every variant simulates the scenario's own `simulation.batches`
iterations with the scenario's seed (the same seed for all variants). Throughput
is a rate over each side's measured window, so the two sides need not hold the
same number of iterations, and taking the count from the trace would leak trace
information into `spec`. Phase breakdowns are per iteration for the same reason.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import time
from concurrent.futures import as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

import pandas as pd

from hops.errors import HopsError
from hops.model.hardware import Catalog
from hops.provenance import model_fingerprint
from hops.traces import load_trace
from hops.traces.guard import SplitGuardError, check_split
from hops.traces.link_bench import bench_files
from hops.traces.megatron import IMPORTER_VERSION, trace_files

from . import scoring
from .fixtures import Fixture, list_fixtures, resolve_root
from .variants import VARIANTS, ReplayFit, check_variants, fit_replay, predict

__all__ = ["validate", "Report", "FixtureEvaluationError"]

ROW_KEYS = ("id", "variant", "measured_throughput_per_s", "predicted_throughput_per_s", "throughput_error_pct",
            "bubble_pp_delta", "util_spearman_rho", "phase_breakdown")


class FixtureEvaluationError(HopsError):
    """A fixture's scenario or trace could not be evaluated; the message starts with the fixture id."""


# --------------------------------------------------------------------------- measured side, memoised
@dataclass
class Measured:
    side: scoring.Side
    fit: ReplayFit | None = None
    layout: tuple = ()  # (stage devices, microbatches per iteration) of the trace


_MEMO: dict[str, Measured] = {}
_MEMO_LIMIT = 512
_CATALOGS: dict[str, Catalog] = {}


def trace_key(fixture: Fixture) -> str:
    """Content hash of what the measured side depends on (trace files + stage map + importer version)."""
    h = hashlib.sha256(IMPORTER_VERSION.encode())
    for path in [fixture.path / "hops_trace_map.json", *trace_files(fixture.path, fixture.token)]:
        h.update(path.name.encode() + b"\0")
        h.update(path.read_bytes() if path.exists() else b"")
    return h.hexdigest()


def clear_memo() -> None:
    """Forget memoised measured sides (benchmarks use it to time a cold process)."""
    _MEMO.clear()


def _catalog(overrides) -> Catalog:
    key = json.dumps(overrides, sort_keys=True, default=str)
    if key not in _CATALOGS:
        _CATALOGS[key] = Catalog.load(overrides)
    return _CATALOGS[key]


def _evaluate(fixture: Fixture, variants: tuple[str, ...], overrides, seed, cache_dir, token,
              known: Measured | None) -> tuple[list[dict], Measured]:
    """All variants of one fixture (runs in a worker process when jobs > 1)."""
    try:
        catalog = _catalog(overrides)
        timeline = None

        def trace():
            nonlocal timeline
            if timeline is None:
                timeline = load_trace(fixture.path, cache_dir=cache_dir, token=token)
            return timeline

        measured = known or Measured(scoring.side_of(trace()), layout=(trace().stage_devices,
                                                                       trace().microbatches_per_iteration))
        fixture.check_trace_layout(*measured.layout)
        if "replay" in variants and measured.fit is None:
            measured.fit = fit_replay(trace())
        groups = fixture.groups()
        rows = []
        for name in variants:
            fit = (lambda: measured.fit) if VARIANTS[name].uses_trace else None
            result = predict(name, fixture, catalog, seed=seed, replay_fit=fit)
            predicted = scoring.side_of(result.timeline)
            scored = scoring.score(measured.side, predicted)
            rows.append({"id": fixture.id, "split": fixture.split, "variant": name, **groups, **scored})
        return rows, measured
    except SplitGuardError:
        raise
    except HopsError as exc:
        raise FixtureEvaluationError(f"{fixture.id}: {exc}") from None


# --------------------------------------------------------------------------- report
@dataclass
class Report:
    """Scores of one validation run. `rows` hold one dict per (fixture, variant)."""

    split: str
    variants: tuple[str, ...]
    rows: list[dict]
    catalog_fingerprint: str  # the catalog values alone (Catalog.fingerprint)
    model_fingerprint: str  # code + catalog (hops.provenance): the "model" of summary.json, the gate and the ledger
    overrides: Any = None
    elapsed_s: float = 0.0
    extras: dict = field(default_factory=dict)

    def table(self) -> pd.DataFrame:
        """Per-fixture rows (one per fixture x variant), scalar columns only."""
        cols = [k for k in (self.rows[0] if self.rows else {}) if k != "phase_breakdown"]
        return pd.DataFrame([{k: r[k] for k in cols} for r in self.rows], columns=cols or None)

    def phases(self) -> pd.DataFrame:
        """Long-form stage x phase breakdown: id, variant, stage, phase, measured_ms, predicted_ms."""
        recs = [{"id": r["id"], "variant": r["variant"], **p} for r in self.rows for p in r["phase_breakdown"]]
        return pd.DataFrame(recs, columns=["id", "variant", "stage", "phase", "measured_ms", "predicted_ms"])

    def aggregates(self) -> dict:
        return scoring.aggregates_by_variant(self.table()) if self.rows else {}

    def groups(self) -> dict:
        return scoring.group_aggregates(self.table()) if self.rows else {}

    def to_dict(self) -> dict:
        """Exactly the --json document: split, aggregates, groups, fixtures (NaN becomes null)."""
        return _nan_to_none({
            "split": self.split,
            "aggregates": self.aggregates(),
            "groups": self.groups(),
            "fixtures": [{k: r[k] for k in ROW_KEYS} for r in self.rows],
        })

    def to_json(self, path: str | os.PathLike | None = None) -> str:
        text = json.dumps(self.to_dict(), indent=2, allow_nan=False) + "\n"
        if path is not None:
            Path(path).write_text(text)
        return text

    def text(self) -> str:
        """The human report: per-fixture scores side by side, suite aggregates, groups, phase errors."""
        df = self.table()
        if df.empty:
            return f"split {self.split}: no fixtures"
        wide = df.pivot_table(index="id", columns="variant", sort=False,
                              values=["throughput_error_pct", "bubble_pp_delta", "util_spearman_rho"])
        wide.columns = [f"{v}:{ {'throughput_error_pct': 'thr%', 'bubble_pp_delta': 'bub_pp', 'util_spearman_rho': 'rho'}[m]}"
                        for m, v in wide.columns]
        order = [f"{v}:{m}" for v in self.variants for m in ("thr%", "bub_pp", "rho")]
        wide = wide.reindex(columns=[c for c in order if c in wide.columns])
        wide.insert(0, "family", df.drop_duplicates("id").set_index("id")["device_family"])
        agg = pd.DataFrame(self.aggregates()).T[list(scoring.METRICS)]
        agg["n"] = agg["n"].astype(int)
        grp = pd.DataFrame([{"group": g, "label": label, "variant": v, **a}
                            for g, labels in self.groups().items() for label, per in labels.items()
                            for v, a in per.items()])
        grp = grp.pivot_table(index=["group", "label"], columns="variant", values="mape", sort=False)
        grp = grp.reindex(columns=[v for v in self.variants if v in grp.columns])
        phase = scoring.phase_error_table(self.phases())
        with pd.option_context("display.width", 250, "display.max_rows", None, "display.max_columns", None,
                               "display.float_format", "{:.2f}".format):
            parts = [
                f"split {self.split}: {df['id'].nunique()} fixtures x {len(self.variants)} variants, "
                f"model {self.model_fingerprint} (catalog {self.catalog_fingerprint}), {self.elapsed_s:.2f} s",
                wide.to_string(), "",
                "aggregates (MAPE %, bubble MAE pp, mean Spearman rho of stage utilization, n)",
                agg.to_string(), "",
                "MAPE % by group", grp.to_string(), "",
                "phase error, predicted - measured ms per iteration (mean over stages, then fixtures)",
                phase.to_string(),
            ]
        if "link_calibrated" in self.variants and self.extras.get("no_link_bench"):
            parts.append(f"\nlink_calibrated = spec (no link bench): {', '.join(self.extras['no_link_bench'])}")
        return "\n".join(parts)


def _nan_to_none(obj):
    if isinstance(obj, float):
        return None if math.isnan(obj) or math.isinf(obj) else obj
    if isinstance(obj, dict):
        return {k: _nan_to_none(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_nan_to_none(v) for v in obj]
    return obj


# --------------------------------------------------------------------------- entry point
def validate(split: str, *, root: str | os.PathLike | None = None, variants: Iterable[str] | None = None,
             ids: Iterable[str] | None = None, overrides: Mapping[str, Any] | Iterable[str] | None = None,
             jobs: int = 1, progress: bool = False, seed: int | None = None,
             cache_dir: str | os.PathLike | None = None, token=None) -> Report:
    """Score `variants` (default: all) on every fixture of `split` (or only `ids`).

    `overrides` are catalog what-ifs (``{"stacks.fixture_megatron.k_floor_ms.default": 1.2}`` or
    ``["devices.a10g.memory_bandwidth_gbps=500"]``) applied without editing
    files. `seed` defaults to each scenario's own seed, shared by all variants.
    `token` is the checkpoint token (hops.traces.guard) that alone opens the
    held-out split. User mistakes raise HopsError subclasses with one-line messages.
    """
    t_start = time.perf_counter()
    check_split(split, token)  # before anything else, so the answer for `test` never depends on the root
    names = check_variants(variants)
    overrides = list(overrides) if overrides is not None and not isinstance(overrides, Mapping) else overrides
    catalog = _catalog(overrides)  # a bad --set path fails here, before any work
    root_path = resolve_root(root)
    fixtures = list_fixtures(root_path, split, list(ids) if ids is not None else None, token=token)
    keys = [trace_key(f) for f in fixtures]
    from hops.run.progress import Progress

    # on stderr, only when asked (the CLI asks when a human watches) and only past 2 s
    bar = Progress(total=len(fixtures), desc=f"validate {split}", unit="fixture", enabled=progress)
    results: dict[int, list[dict]] = {}

    def collect(i: int, rows: list[dict], measured: Measured) -> None:
        results[i] = rows
        if len(_MEMO) >= _MEMO_LIMIT:
            _MEMO.pop(next(iter(_MEMO)))
        _MEMO[keys[i]] = measured
        bar.note(fixtures[i].id)
        bar.update()

    args = (names, overrides, seed, cache_dir, token)
    try:
        jobs = (os.cpu_count() or 1) if jobs <= 0 else jobs
        if jobs == 1 or len(fixtures) <= 1:
            for i, f in enumerate(fixtures):
                collect(i, *_evaluate(f, *args, _MEMO.get(keys[i])))
        else:
            from .workers import interruptible_pool  # not a model file: how the work is spread, not what it computes

            with interruptible_pool(min(jobs, len(fixtures))) as pool:
                futures = {pool.submit(_evaluate, f, *args, _MEMO.get(keys[i])): i for i, f in enumerate(fixtures)}
                for fut in as_completed(futures):
                    collect(futures[fut], *fut.result())
    finally:
        bar.close()
    rows = [r for i in range(len(fixtures)) for r in results[i]]
    no_bench = [f.id for f in fixtures if not bench_files(f.path, f.token)]
    return Report(split=split, variants=names, rows=rows, catalog_fingerprint=catalog.fingerprint(),
                  model_fingerprint=model_fingerprint(catalog), overrides=overrides,
                  elapsed_s=time.perf_counter() - t_start,
                  extras={"no_link_bench": no_bench, "fixtures_root": str(root_path),
                          "fixture_set": "all" if ids is None else ",".join(sorted(f.id for f in fixtures))})
