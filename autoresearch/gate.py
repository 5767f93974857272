"""The admission gate: the working tree against the committed golden file, with no way to argue.

Everything the gate may decide on sits in `gate.yaml`; the command line can
add catalog what-ifs (`--set`) but cannot loosen a rule. The golden file holds
the scores the model had when it was last admitted, the catalog values it had
then (so a changed constant is detected as data, whatever file or flag it came
from), and a checksum written by `admit`, so a hand edit is caught instead of
silently moving the bar. The checksum is a tripwire against editing, not a
signature: review and CI, which run this same gate, are the real lock.
"""
from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from hops.errors import HopsError
from hops.model.hardware import Catalog, dotted_items
from hops.traces.guard import check_split

from . import ledger, state
from .fixtures import FixtureError, resolve_root
from .scoring import aggregate

CONFIG_PATH = ledger.PACKAGE / "gate.yaml"  # the shipped default; a state dir may hold its own
# The gate's own rules and record: a commit touching them is gated like a model change.
GATE_FILES = ("autoresearch/gate.py", "autoresearch/search.py", "autoresearch/gate.yaml", "autoresearch/citations.yaml",
              "autoresearch/search_space.yaml", "autoresearch/golden/*.json")
GOLDEN_SCHEMA = 1
FIXTURE_KEYS = ("throughput_error_pct", "bubble_pp_delta", "util_spearman_rho")


class GateError(HopsError):
    """The gate cannot run as asked (no golden file, malformed config or citations)."""


# --------------------------------------------------------------------------- config
@dataclass(frozen=True)
class GateConfig:
    split: str
    gated_variants: tuple[str, ...]
    reported_variants: tuple[str, ...]
    diagnostic_split: str
    aggregate: dict
    fixture: dict
    epsilon: float
    citation_kinds: tuple[str, ...]
    assumption_refused_under: tuple[str, ...] = ()

    @property
    def variants(self) -> tuple[str, ...]:
        return self.gated_variants + self.reported_variants

    @classmethod
    def load(cls, path: Path | None = None) -> "GateConfig":
        path = path or state.config_path(CONFIG_PATH.name)
        if not path.is_file():
            raise GateError(f"{path}: gate config not found (it ships with the package; reinstall hops)")
        try:
            doc = yaml.safe_load(path.read_text())
            return cls(split=doc["split"], gated_variants=tuple(doc["gated_variants"]),
                       reported_variants=tuple(doc.get("reported_variants") or ()),
                       diagnostic_split=doc.get("diagnostic_split") or "",
                       aggregate={k: float(v) for k, v in doc["aggregate"].items()},
                       fixture={k: float(v) for k, v in doc["fixture"].items()}, epsilon=float(doc["epsilon"]),
                       citation_kinds=tuple(doc["citation_kinds"]),
                       assumption_refused_under=tuple(doc.get("assumption_refused_under") or ()))
        except (OSError, yaml.YAMLError, KeyError, TypeError, ValueError, AttributeError) as exc:
            raise GateError(f"{path}: malformed gate config ({exc})") from None


# --------------------------------------------------------------------------- golden file
def golden_path(split: str = "train") -> Path:
    return ledger.state_dir() / "golden" / f"{split}.json"


def checksum(doc: dict) -> str:
    body = {k: v for k, v in doc.items() if k != "checksum"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, allow_nan=False).encode()).hexdigest()


def read_golden(split: str = "train") -> dict:
    path = golden_path(split)
    if not path.exists():
        raise GateError(f"no golden file at {path}: create the first one with "
                        f"`python -m autoresearch admit --bootstrap`")
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise GateError(f"{path}: unreadable golden file ({exc}); restore it with git checkout") from None


def build_golden(report, cfg: GateConfig, *, catalog: dict, iteration: int, prov: dict) -> dict:
    from .validate import _nan_to_none

    table = report.table()
    fixtures: dict[str, dict] = {}
    for row in table.to_dict("records"):
        if row["variant"] in cfg.gated_variants:
            fixtures.setdefault(row["id"], {})[row["variant"]] = {k: row[k] for k in FIXTURE_KEYS}
    aggs = report.aggregates()
    doc = _nan_to_none({
        "schema": GOLDEN_SCHEMA, "split": report.split, "variants": list(cfg.gated_variants),
        "admitted": {"iteration": iteration, "date": ledger.now(), "git_commit": prov["git_commit"],
                     "git_diff_hash": prov["git_diff_hash"]},
        "model_fingerprint": prov["model_fingerprint"], "catalog_fingerprint": report.catalog_fingerprint,
        "catalog": catalog,
        "aggregates": {v: aggs[v] for v in cfg.gated_variants if v in aggs},
        "fixtures": dict(sorted(fixtures.items())),
    })
    doc["checksum"] = checksum(doc)
    return doc


def golden_text(doc: dict) -> str:
    return json.dumps(doc, indent=1, sort_keys=True, allow_nan=False) + "\n"


def write_golden(doc: dict, split: str = "train") -> Path:
    return ledger.atomic_write(golden_path(split), golden_text(doc))


# --------------------------------------------------------------------------- model change
def needs_gate(files) -> list[str]:
    """The files (repo-relative) that make a commit a model change: MODEL_FILES or GATE_FILES."""
    import fnmatch

    from hops.provenance import is_model_file

    out = []
    for f in files:
        rel = Path(f).as_posix().removeprefix("./")
        if is_model_file(rel) or any(fnmatch.fnmatchcase(rel, p) and rel.count("/") == p.count("/")
                                     for p in GATE_FILES):
            out.append(rel)
    return out


def model_change(golden: dict | None) -> list[str]:
    """Notes: which declared model files differ from the golden file's commit, and the fingerprints."""
    from hops.provenance import is_model_file

    if golden is None:
        return []
    commit = (golden.get("admitted") or {}).get("git_commit") or ""
    now = ledger.model_fingerprint()
    was = golden.get("model_fingerprint")
    diff = ledger._git("diff", "--name-only", commit) if commit and commit != "unknown" else None
    untracked = ledger._git("ls-files", "--others", "--exclude-standard")
    if diff is None or untracked is None:
        return [f"model: fingerprint {was} (golden) -> {now}; files not compared (commit {commit[:12]} unknown here)"]
    files = sorted({f for f in (diff + untracked).splitlines() if f and is_model_file(f)})
    if not files:
        return [f"model: no declared model file differs from the golden file's commit {commit[:12]}"
                + ("" if now == was else f" (fingerprint {was} -> {now}: catalog values differ, or the golden "
                                         f"file predates hops.provenance)")]
    same = " (comments/docstrings only: the fingerprint is unchanged)" if now == was else ""
    return [f"model: {len(files)} model file(s) changed since the golden file's commit {commit[:12]}: "
            + ", ".join(files[:8]) + (", ..." if len(files) > 8 else "") + f"; fingerprint {was} -> {now}{same}"]


# --------------------------------------------------------------------------- citations
def catalog_changes(old: dict, new: dict) -> list[tuple[str, Any, Any]]:
    """(dotted path, golden value, current value) for every leaf added or changed; removals carry new=None."""
    a, b = dotted_items(old, keep_empty=False), dotted_items(new, keep_empty=False)
    return [(p, a.get(p), b.get(p)) for p in sorted(set(a) | set(b)) if not _same(a.get(p), b.get(p))]


def _same(x, y) -> bool:
    if isinstance(x, (int, float)) and isinstance(y, (int, float)) and not isinstance(x, bool) \
            and not isinstance(y, bool):
        return math.isclose(float(x), float(y), rel_tol=1e-9, abs_tol=1e-12)
    return x == y


def citations_path() -> Path:
    return ledger.state_dir() / "citations.yaml"


def load_citations() -> list[dict]:
    path = citations_path()
    if not path.exists():
        return []
    try:
        doc = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise GateError(f"{path}: not valid YAML ({exc})") from None
    entries = doc.get("citations") if isinstance(doc, dict) else None
    if entries is None:
        return []
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise GateError(f"{path}: `citations` must be a list of {{path, value, source, kind}} mappings")
    return entries


def citation_violations(changes, citations: list[dict], cfg: GateConfig) -> list[str]:
    """A changed value passes only with an entry naming its path, the exact new value, a source and a kind."""
    from .search import allowlisted_paths

    fit_ok = allowlisted_paths()
    out = []
    for path, old, new in changes:
        if new is None:
            continue  # a removed preset cannot be cited; its effect on the scores is gated like any change
        mine = [c for c in citations if c.get("path") == path]
        match = [c for c in mine if _same(c.get("value"), new)]
        hint = f"add {{path: {path}, value: {new}, source: ..., kind: spec_sheet|measurement}} to {citations_path().name}"
        if not match:
            found = f" (cited values: {', '.join(str(c.get('value')) for c in mine)})" if mine else ""
            out.append(f"citation: {path} {old} -> {new} has no citation for value {new}{found}; {hint}")
            continue
        c = match[-1]
        if not str(c.get("source") or "").strip():
            out.append(f"citation: {path} = {new}: the citation has an empty `source`")
        elif c.get("kind") not in cfg.citation_kinds:
            out.append(f"citation: {path} = {new}: kind {c.get('kind')!r} is not one of {', '.join(cfg.citation_kinds)}")
        elif c.get("kind") == "fit" and path not in fit_ok:
            out.append(f"citation: {path} = {new}: kind `fit` is allowed only for constants in search_space.yaml")
        elif c.get("kind") == "assumption" and path.startswith(cfg.assumption_refused_under):
            out.append(f"citation: {path} = {new}: kind `assumption` is refused for a value the calibration "
                       f"variants read (gate.yaml assumption_refused_under); cite a spec sheet or a measurement")
    return out


# --------------------------------------------------------------------------- comparison
@dataclass
class Comparison:
    violations: list[str] = field(default_factory=list)
    worse: list[tuple[float, str]] = field(default_factory=list)  # within tolerance, largest first
    notes: list[str] = field(default_factory=list)
    aggregates: dict = field(default_factory=dict)  # variant -> {metric: (golden, now)}
    allowances: dict = field(default_factory=dict)  # fixture id -> (throughput points, bubble pp), band-aware only
    fixture_violations: dict = field(default_factory=dict)  # fixture id -> its per-fixture violation lines


def allowance(cfg: GateConfig, band: tuple[float, float] | None) -> tuple[float, float]:
    """Gate v3: a fixture may move by max(the tolerance, its configuration's measured run-to-run spread).

    A model that predicts a job from its scenario cannot be held closer to one run than a second run of
    the same job is to it; without a duplicate run the spread is unknown and gate.yaml's tolerance holds.
    """
    thr, bub = cfg.fixture["throughput_error_points"], cfg.fixture["bubble_pp"]
    if band is None:
        return thr, bub
    return max(thr, band[0]), max(bub, band[1])


def _f(x) -> float:
    return math.nan if x is None else float(x)


def compare(golden: dict, report, cfg: GateConfig, bands: dict | None = None) -> Comparison:
    """The tree's scores against the golden file. `bands`: fixture id -> (|throughput %|, |bubble pp|)
    run-to-run spread of its configuration (noise.Noise.band), which widens that fixture's allowance."""
    out = Comparison()
    bands = bands or {}
    table = report.table()
    ids = set(table["id"])
    for fid in sorted(set(golden["fixtures"]) - ids):
        out.violations.append(f"fixture set: {fid} is in the golden file but was not evaluated")
    new_ids = sorted(ids - set(golden["fixtures"]))
    if new_ids:
        out.notes.append(f"{len(new_ids)} fixture(s) not in the golden file (no baseline, enter it on admit): "
                         + ", ".join(new_ids))
    dropped = sorted(set(golden.get("variants", [])) - set(cfg.gated_variants))
    if dropped:
        out.violations.append(f"gate.yaml: {', '.join(dropped)} gated in the golden file but no longer gated")
    common = table[table["id"].isin(golden["fixtures"])]
    eps = cfg.epsilon
    for fid in sorted(golden["fixtures"]):
        if bands.get(fid) is not None:
            out.allowances[fid] = allowance(cfg, bands[fid])
    for v in cfg.gated_variants:
        now = aggregate(common[common["variant"] == v])
        old = golden["aggregates"].get(v)
        if old is None:
            out.violations.append(f"{v}: not in the golden file (gated variants changed? re-bootstrap)")
            continue
        out.aggregates[v] = {m: (_f(old.get(m)), now[m]) for m in ("mape", "bubble_mae_pp", "rho_mean", "n")}
        for metric, label, allowed, sign in (("mape", "aggregate MAPE", cfg.aggregate["mape_pct"], 1),
                                             ("bubble_mae_pp", "aggregate bubble MAE", cfg.aggregate["bubble_mae_pp"], 1),
                                             ("rho_mean", "mean rho", cfg.aggregate["rho_mean"], -1)):
            a, b = _f(old.get(metric)), now[metric]
            if math.isnan(a):
                continue
            if math.isnan(b) or sign * (b - a) > allowed + eps:
                out.violations.append(f"{v}: {label} {a:.3f} -> {b:.3f} "
                                      f"({'higher' if sign > 0 else 'lower'} is worse; allowed {allowed:g})")
        rows = {r["id"]: r for r in common[common["variant"] == v].to_dict("records")}
        for fid, per in sorted(golden["fixtures"].items()):
            if fid not in rows or v not in per:
                continue
            base = allowance(cfg, None)
            widened = out.allowances.get(fid) or base
            for key, label, unit, allowed, tol in (
                    ("throughput_error_pct", "|throughput error|", "%", widened[0], base[0]),
                    ("bubble_pp_delta", "|bubble delta|", " pp", widened[1], base[1])):
                a, b = abs(_f(per[v][key])), abs(_f(rows[fid][key]))
                if math.isnan(a):
                    continue
                delta = b - a
                msg = f"{fid}: {v} {label} {a:.2f}{unit} -> {b:.2f}{unit} ({delta:+.2f})"
                if math.isnan(b) or delta > allowed + eps:
                    limit = (f" exceeds the {allowed:.2f} allowance (its config's run-to-run spread)" if allowed > tol
                             else f" exceeds the {allowed:g} tolerance")
                    line = msg + limit if not math.isnan(b) else f"{fid}: {v} {label} became NaN (was {a:.2f}{unit})"
                    out.violations.append(line)
                    out.fixture_violations.setdefault(fid, []).append(line)
                elif delta > eps:
                    out.worse.append((delta, msg))
    out.worse.sort(key=lambda t: -t[0])
    return out


def sanity(report, variants=None) -> list[str]:
    """Every prediction finite and positive. On the diagnostic split this is the only check there is."""
    bad = []
    for r in report.table().to_dict("records"):
        if variants is not None and r["variant"] not in variants:
            continue
        thr, bub = r["predicted_throughput_per_s"], r["predicted_bubble_ratio"]
        if not (math.isfinite(thr) and thr > 0 and math.isfinite(bub)):
            bad.append(f"{report.split}: {r['id']} {r['variant']} predicted throughput {thr}, bubble {bub}")
    return bad


# --------------------------------------------------------------------------- the gate
@dataclass
class GateResult:
    cfg: GateConfig
    golden: dict | None
    report: Any
    diagnostic: Any | None
    catalog: dict
    changes: list
    overrides: dict
    comparison: Comparison
    violations: list[str]
    notes: list[str]
    noise: Any = None  # noise.Noise: the measured spread behind the band-aware allowances

    @property
    def passed(self) -> bool:
        return not self.violations


def evaluate(split: str, *, root, overrides, variants, jobs: int):
    """validate(), with a fixture that fails to simulate reported as a violation rather than a crash."""
    from .validate import FixtureEvaluationError, validate

    try:
        return validate(split, root=root, variants=variants, overrides=overrides or None, jobs=jobs), None
    except FixtureEvaluationError as exc:
        return None, f"{split}: evaluation failed: {exc}"


def run_gate(*, root=None, overrides=None, jobs: int = 1, split: str | None = None, bootstrap: bool = False
             ) -> GateResult:
    """Evaluate the tree (+ overrides) on train and the diagnostic split; compare with the golden file.

    With `bootstrap` there is no golden yet: only the sanity checks apply.
    """
    cfg = GateConfig.load()
    split = split or cfg.split
    check_split(split)  # the guard's message before any other complaint
    if split != cfg.split:
        raise GateError(f"the gate admits on {cfg.split!r} only ({cfg.diagnostic_split} is sanity-only, archive "
                        f"is the noise floor); drop --split {split}")
    root = resolve_root(root)
    overrides = ledger.normalize_overrides(overrides)
    catalog = Catalog.load(overrides).as_dict()  # a bad --set fails here as a user error
    golden = None if bootstrap else read_golden(split)
    violations: list[str] = []
    if golden is not None and golden.get("checksum") != checksum(golden):
        violations.append(f"golden: {golden_path(split)} does not match the checksum admit wrote (edited by "
                          f"hand?); restore it with `git checkout -- {golden_path(split)}`")
    report, failure = evaluate(split, root=root, overrides=overrides, variants=cfg.variants, jobs=jobs)
    violations += [failure] if failure else []
    comparison, noise, bands = Comparison(), None, {}
    if report is not None:
        violations += sanity(report, cfg.gated_variants)
        if golden is not None:
            noise, note = _noise_band(root)
            bands = {fid: noise.band(fid) for fid in golden["fixtures"]} if noise is not None else {}
            comparison = compare(golden, report, cfg, bands)
            comparison.notes += [note] if note else []
            violations += comparison.violations
    changes = catalog_changes(golden["catalog"], catalog) if golden is not None else []
    violations += citation_violations(changes, load_citations(), cfg)
    diagnostic, notes = None, [*model_change(golden), *comparison.notes]
    if cfg.diagnostic_split:
        try:
            diagnostic, failure = evaluate(cfg.diagnostic_split, root=root, overrides=overrides,
                                           variants=cfg.gated_variants, jobs=jobs)
        except FixtureError:
            notes.append(f"{cfg.diagnostic_split} split not found under {root}: sanity check skipped")
        else:
            violations += [failure] if failure else (sanity(diagnostic) if diagnostic is not None else [])
    return GateResult(cfg, golden, report, diagnostic, catalog, changes, overrides, comparison, violations, notes,
                      noise)


def _noise_band(root):
    """The measured run-to-run spread (archive pairs and same-job twins), which sets each duplicated
    fixture's allowance (gate v3); without an archive split every fixture keeps gate.yaml's tolerance."""
    from .noise import noise

    try:
        n = noise(root)
    except FixtureError:
        return None, (f"no archive split under {root}: no run-to-run spread measured, every fixture keeps "
                      f"gate.yaml's tolerance")
    twins = (f"; same-job twins in train: mean {n.twin_throughput_pct_mean:.2f} % over {len(n.twins)}"
             if n.twins else "")
    return n, (f"run-to-run noise (archive vs train, measured): mean {n.throughput_pct_mean:.2f} % throughput, "
               f"{n.bubble_pp_mean:.2f} pp bubble over {len(n.pairs)} pair(s){twins}")


def same_predictions(result: GateResult) -> list[str]:
    """Fixtures x gated variants whose throughput error differs from the golden file.

    Empty means the tree simulates and measures exactly what the golden file recorded, so any
    change in bubble or rho is the scoring definition's, not the model's: the one case in which
    `admit --redefine-metrics` may re-bootstrap the golden file without the per-fixture gate.
    """
    golden, table = result.golden or {}, result.report.table() if result.report is not None else None
    if table is None:
        return ["no report"]
    moved = []
    for r in table[table["variant"].isin(result.cfg.gated_variants)].to_dict("records"):
        old = golden.get("fixtures", {}).get(r["id"], {}).get(r["variant"])
        if old is None:
            moved.append(f"{r['id']} {r['variant']}: not in the golden file")
            continue
        a, b = _f(old.get("throughput_error_pct")), r["throughput_error_pct"]
        if not math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9):
            moved.append(f"{r['id']} {r['variant']}: throughput error {a:.6g} % -> {b:.6g} %")
    return moved


def allowance_lines(result: GateResult) -> list[str]:
    """The per-fixture allowance the gate used: gate.yaml's tolerance, or the config's measured spread."""
    base = allowance(result.cfg, None)
    wide = result.comparison.allowances
    n_base = len(result.golden["fixtures"]) - len(wide)
    out = [f"per-fixture allowance (gate v3: max(tolerance, the config's run-to-run spread)): {n_base} fixture(s) "
           f"without a duplicate run keep {base[0]:g} points / {base[1]:g} pp"
           + (f"; {len(wide)} with one:" if wide else "")]
    out += [f"  {fid}: {a[0]:.2f} points / {a[1]:.2f} pp" for fid, a in sorted(wide.items())]
    return out


def render(result: GateResult, *, max_worse: int = 5) -> str:
    cfg, lines = result.cfg, []
    g = result.golden
    n = result.report.table()["id"].nunique() if result.report is not None else 0
    head = f"gate {cfg.split}: {n} fixtures; gated {', '.join(cfg.gated_variants)}"
    if cfg.reported_variants:
        head += f"; reported only {', '.join(cfg.reported_variants)}"
    if result.overrides:
        head += "; what-if " + " ".join(f"{k}={v}" for k, v in result.overrides.items())
    lines.append(head)
    if g is not None:
        adm = g.get("admitted", {})
        lines.append(f"golden: iteration {adm.get('iteration')} admitted {adm.get('date')} at "
                     f"{str(adm.get('git_commit'))[:12]}")
        lines.append(f"{'variant':<16} {'MAPE % golden -> now':>24} {'bubble MAE pp':>22} {'rho mean':>18}")
        for v, m in result.comparison.aggregates.items():
            cells = [f"{m[k][0]:.2f} -> {m[k][1]:.2f}" for k in ("mape", "bubble_mae_pp", "rho_mean")]
            lines.append(f"{v:<16} {cells[0]:>24} {cells[1]:>22} {cells[2]:>18}")
    if result.report is not None:
        aggs = result.report.aggregates()
        for v in cfg.reported_variants:
            if v in aggs:
                a = aggs[v]
                lines.append(f"{v:<16} (not gated) MAPE {a['mape']:.2f}%, bubble MAE {a['bubble_mae_pp']:.2f} pp, "
                             f"rho {a['rho_mean']:.2f}")
    if result.diagnostic is not None:
        d = result.diagnostic.aggregates()
        parts = ", ".join(f"{v} MAPE {a['mape']:.2f}%" for v, a in d.items())
        lines.append(f"{cfg.diagnostic_split} (sanity only, never an admission criterion): "
                     f"{result.diagnostic.table()['id'].nunique()} fixtures simulated; {parts}")
    if result.golden is not None:
        lines += allowance_lines(result)
    cited = len(result.changes) - sum(1 for v in result.violations if v.startswith("citation:"))
    if result.changes:
        lines.append(f"catalog: {len(result.changes)} value(s) differ from the golden snapshot, {cited} cited")
    worse = result.comparison.worse
    if worse:
        lines.append(f"within tolerance but worse: {len(worse)} fixture x variant pair(s); largest:")
        lines += [f"  {msg}" for _, msg in worse[:max_worse]]
    lines += [f"note: {x}" for x in result.notes]
    if result.violations:
        kinds: dict[str, int] = {}
        for v in result.violations:
            kind = v.split(":", 1)[0] if v.split(":", 1)[0] in ("citation", "golden", "fixture set") else \
                "aggregate" if "aggregate" in v or "mean rho" in v else "fixture"
            kinds[kind] = kinds.get(kind, 0) + 1
        lines.append(f"FAIL: {len(result.violations)} violation(s) ("
                     + ", ".join(f"{n} {k}" for k, n in kinds.items()) + ")")
        from .noise import annotate

        lines += [f"  - {x}" for x in annotate(result.violations, result.noise)]
    else:
        lines.append("PASS: every rule in gate.yaml holds")
    return "\n".join(lines)
