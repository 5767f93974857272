"""Optuna search over allowlisted constants: a proposal generator, never a way around the gate.

A search can only move constants declared in `search_space.yaml` within their
physical bounds, and it writes nothing to the presets: the best trial is
printed as the `gate --set ...` command to run next, and it lands only through
gate + admit with a citation of kind `fit`. The objective is one number,
weights x (train link_calibrated MAPE, bubble MAE), so TPE can rank trials
directly; both parts are logged so a weighting choice can be revisited.

Every trial is a nested MLflow run under the study's run. The Optuna study
lives in an RDB storage (default sqlite under mlruns/). `--workers N` runs N
processes on one study through that storage (Optuna's own parallel mode: each
`study.optimize` asks the storage for the next trial, so no two workers get the
same trial); workers on several machines share a study by passing the same
`--storage` URL (e.g. PostgreSQL) and `--study` name.

A study ranks trials of one model: it records the model fingerprint they scored, the
default study is named after it (a changed model starts a new study and baseline), and a
named study of another model is refused. Ctrl-C exits 130 quietly (see `_CtrlC`) and
closes the search's open MLflow runs as KILLED.
"""
from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import yaml

from hops.errors import HopsError
from hops.model.hardware import Catalog, dotted_items
from hops.run.tracking import redact  # storage URLs may carry a password; it must not reach the ledger
from hops.traces.guard import check_split

from . import ledger, state

SPACE_PATH = ledger.PACKAGE / "search_space.yaml"  # the shipped allowlist; a state dir may hold its own
FIT_SPLIT = "train"
VARIANT = "link_calibrated"


class SearchError(HopsError):
    """The search asked for something the allowlist does not permit."""


@dataclass(frozen=True)
class Param:
    name: str
    path: str
    low: float
    high: float
    rationale: str
    log: bool = False
    step: float | None = None
    unjustified: str = ""  # why the bounds' justification is incomplete ("" = justified)


BOUND_KINDS = ("citation", "measurement")


def bounds_problem(entry: dict) -> str:
    """What is missing from an entry's `bounds` justification (a citation or a measurement per bound)."""
    b = entry.get("bounds")
    if not isinstance(b, dict):
        return "no `bounds` justification (kind: citation|measurement, low: why, high: why)"
    missing = [k for k in ("kind", "low", "high") if not str(b.get(k) or "").strip()]
    if missing:
        return f"`bounds` lacks {', '.join(missing)}"
    if b["kind"] not in BOUND_KINDS:
        return f"`bounds.kind` {b['kind']!r} is not one of {', '.join(BOUND_KINDS)}"
    return ""


def load_allowlist(path: Path | None = None) -> tuple[dict, dict[str, list[Param]]]:
    """(objective weights, {space: params}); every entry checked against the catalog and its bounds."""
    path = Path(path or state.config_path(SPACE_PATH.name))
    try:
        doc = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise SearchError(f"{path}: cannot read the allowlist ({exc})") from None
    leaves = dotted_items(Catalog.load().as_dict(), keep_empty=False)
    weights = {k: float(v) for k, v in (doc.get("objective") or {"mape": 1.0, "bubble_mae_pp": 1.0}).items()}
    spaces: dict[str, list[Param]] = {}
    for space, entries in (doc.get("spaces") or {}).items():
        params = []
        for e in entries or []:
            where = f"{path.name}: space {space!r} entry {e.get('name', '?')!r}"
            missing = [k for k in ("name", "path", "low", "high", "rationale") if e.get(k) in (None, "")]
            if missing:
                raise SearchError(f"{where}: missing {', '.join(missing)}")
            if e["path"] not in leaves:
                raise SearchError(f"{where}: {e['path']} is not a catalog path (see hops/presets/*.yaml)")
            current = leaves[e["path"]]
            if not isinstance(current, (int, float)) or isinstance(current, bool):
                raise SearchError(f"{where}: {e['path']} is not numeric ({current!r})")
            low, high = float(e["low"]), float(e["high"])
            if e.get("log") and e.get("step"):
                raise SearchError(f"{where}: `log` and `step` cannot be combined")
            if not low < high or (e.get("log") and low <= 0):
                raise SearchError(f"{where}: bounds [{low}, {high}] are empty (or not positive for log: true)")
            params.append(Param(e["name"], e["path"], low, high, str(e["rationale"]), bool(e.get("log")),
                                float(e["step"]) if e.get("step") else None, bounds_problem(e)))
        spaces[space] = params
    return weights, spaces


def allowlisted_paths(path: Path | None = None) -> set[str]:
    """Paths a `fit` citation may cite: declared with justified bounds."""
    return {p.path for params in load_allowlist(path)[1].values() for p in params if not p.unjustified}


def select(space: str, only=None, path: Path | None = None) -> tuple[dict, list[Param]]:
    weights, spaces = load_allowlist(path)
    if space not in spaces:
        raise SearchError(f"unknown space {space!r}; allowlisted spaces: {', '.join(spaces) or 'none'} "
                          f"({Path(path or state.config_path(SPACE_PATH.name)).name})")
    params = spaces[space]
    bad = [f"{p.name} ({p.path}): {p.unjustified}" for p in params if p.unjustified]
    if bad:
        raise SearchError(f"space {space!r} in {Path(path or SPACE_PATH).name} has bounds without a justification, "
                          f"so its search would not be held to physics: " + "; ".join(bad))
    if only:
        declared = {p.path: p for p in params}
        for item in only:
            if item not in declared:
                raise SearchError(f"{item} is not allowlisted in space {space!r} (allowed: "
                                  f"{', '.join(declared)}); declare it with bounds and a rationale in "
                                  f"{Path(path or state.config_path(SPACE_PATH.name)).name} first")
        params = [declared[item] for item in dict.fromkeys(only)]
    return weights, params


def default_storage() -> str:
    (state.repo_root() / "mlruns").mkdir(exist_ok=True)
    return f"sqlite:///{state.repo_root() / 'mlruns' / 'optuna.db'}"


@dataclass
class SearchResult:
    study_name: str
    storage: str
    params: list[Param]
    weights: dict
    best: dict | None  # {"number", "value", "values": {path: v}, "mape", "bubble_mae_pp"}
    baseline: dict | None
    n_trials: int
    parent_run: str
    already: int = 0  # trials the study held before this run (a resumed study), of the same model
    model_fingerprint: str = ""  # the model every trial of the study scored (with its own values)


def run_search(space: str, trials: int, *, storage: str | None = None, study_name: str | None = None,
               root=None, jobs: int = 1, seed: int | None = None, only=None, split: str = FIT_SPLIT,
               allowlist: Path | None = None, workers: int = 1, progress: bool = False) -> SearchResult:
    """Run `trials` trials in each of `workers` processes on one study (Optuna's shared-storage mode).

    `progress`: count finished trials on stderr (hops.run.progress; the CLI asks when stderr is a terminal).
    """
    check_split(split)
    if split != FIT_SPLIT:
        why = {"diagnostic": "diagnostic is sanity-only, never for fitting",
               "archive": "archive holds duplicate runs that measure the noise floor, never for fitting"}
        raise SearchError(f"search fits constants on {FIT_SPLIT!r} only ({why.get(split, f'{split} is not train')}); "
                          f"drop --split {split}")
    if trials < 1:
        raise SearchError("--trials must be at least 1")
    if workers < 1:
        raise SearchError("--workers must be at least 1")
    weights, params = select(space, only, allowlist)
    from .fixtures import resolve_root

    root = resolve_root(root)
    storage = storage or default_storage()
    # A study ranks trials of one model: its code and every catalog value but the ones it sets. The default
    # study is per model fingerprint, so a changed model starts a new one (with a new baseline trial).
    fingerprint = ledger.model_fingerprint()
    named = study_name is not None
    study_name = study_name or f"autoresearch-{space}-{fingerprint}"
    study = _open_study(study_name, storage, seed)
    if study.user_attrs.get("paths") not in (None, [p.path for p in params]):
        raise SearchError(f"study {study_name!r} searches {study.user_attrs['paths']}, not this selection; "
                          f"pass a different --study")
    already = len(study.trials)
    scored = study.user_attrs.get("model_fingerprint")
    if already and scored != fingerprint:
        raise SearchError(f"study {study_name!r} holds {already} trial(s) scored on model "
                          f"{scored or '(not recorded)'}, but the model is now {fingerprint} (code or presets "
                          f"changed): its trials and baseline rank a model that no longer exists; pass a new "
                          f"--study NAME" + (", or drop --study (the default study is per model)" if named else ""))
    study.set_user_attr("paths", [p.path for p in params])
    study.set_user_attr("model_fingerprint", fingerprint)
    current = dotted_items(Catalog.load().as_dict(), keep_empty=False)
    if not study.trials and all(p.low <= current[p.path] <= p.high for p in params):
        study.enqueue_trial({p.path: float(current[p.path]) for p in params}, user_attrs={"baseline": True})

    book = ledger.Ledger()
    parent = study.user_attrs.get("mlflow_run_id")
    try:
        parent = parent and book.get_run(parent).info.run_id
    except Exception:  # noqa: BLE001 - a run id from another machine's ledger
        parent = None
    if not parent:
        parent = book.start_run(ledger.CALIBRATION, f"search {space}", run_type="search",
                                params={**ledger.provenance(split, [VARIANT]), "space": space, "study": study_name,
                                        "storage": redact(storage), "paths": ",".join(p.path for p in params),
                                        "objective": " + ".join(f"{w:g}*{k}" for k, w in weights.items())},
                                tags=_open_tags(book))
        study.set_user_attr("mlflow_run_id", parent)

    from hops.run.progress import Progress

    try:
        with Progress(total=trials * workers, desc=f"search {space}", unit="trial", enabled=progress) as bar:
            if workers == 1:
                _optimize(study, book, parent, params, weights, root, jobs, split, trials, bar)
            else:
                # The study and its parent run exist now, so workers only load them: no creation race.
                import multiprocessing
                from concurrent.futures import wait

                from .workers import interruptible_pool

                before = len(_finished(study))  # the workers' trials are counted in the shared storage
                with interruptible_pool(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
                    futures = [pool.submit(_worker, space, trials, storage, study_name, root, jobs,
                                           None if seed is None else seed + i, only, split, allowlist, parent)
                               for i in range(workers)]
                    while bar.enabled and wait(futures, timeout=2.0).not_done:
                        bar.set_count(len(_finished(study)) - before)
                    for future in futures:
                        future.result()
    except KeyboardInterrupt:
        _close_interrupted(study, book, parent)
        raise
    done = [t for t in study.trials if t.state.name == "COMPLETE"]
    best = _summary(study.best_trial) if done else None
    base = next((t for t in done if t.user_attrs.get("baseline")), None)
    result = SearchResult(study_name, redact(storage), params, weights, best, _summary(base) if base else None,
                          len(done), parent, already, fingerprint)
    if best:
        book.log(parent, metrics={"best.objective": best["value"], f"best.{VARIANT}.mape": best["mape"],
                                  f"best.{VARIANT}.bubble_mae_pp": best["bubble_mae_pp"], "trials": len(done)},
                 tags={"best_trial": best["number"], "proposal": gate_command(best["values"])})
    book.finish(parent)
    return result


INTERRUPTED = "interrupted (Ctrl-C) before it finished; not a result"


def _close_interrupted(study, book, parent: str) -> None:
    """After a Ctrl-C: the search run and its trial runs still RUNNING end KILLED, as the user stopped them.

    This process's own trial run was closed by its objective; a trial run of a worker (killed with the
    pool) or one this process had not closed yet is found under the search run by its writer, and its
    Optuna trial, if still RUNNING, is told FAIL. Runs of other live processes (workers of another
    invocation on the study) are left alone. Best effort: the exit stays a quiet 130 whatever the store does.
    """
    from optuna.trial import TrialState

    me = ledger.writer()
    try:
        running = book.runs(ledger.CALIBRATION, f"tags.`mlflow.parentRunId` = '{parent}' and "
                                                f"attributes.status = 'RUNNING'")
    except Exception:  # noqa: BLE001 - the store may be what was interrupted
        running = []
    for run in running:
        writer = run.data.tags.get(ledger.WRITER)
        if writer != me and ledger.writer_alive(writer) is not False:
            continue
        try:
            book.log(run.info.run_id, tags={"incomplete": INTERRUPTED})
            book.finish(run.info.run_id, "KILLED")
            number = int(run.data.params.get("trial") or run.info.run_name.rpartition(" ")[2])  # "trial N"
            trial = next((t for t in study.get_trials(deepcopy=False) if t.number == number), None)
            if trial is not None and trial.state == TrialState.RUNNING:
                study.tell(number, state=TrialState.FAIL)
        except Exception:  # noqa: BLE001
            pass
    try:
        book.log(parent, tags={"interrupted": INTERRUPTED})
        book.finish(parent, "KILLED")
    except Exception:  # noqa: BLE001
        pass


class _CtrlC:
    """Where a Ctrl-C may stop a search in this process, and what Optuna says about it.

    A KeyboardInterrupt is raised at once only while a trial simulates (nearly all of the time); in
    Optuna's or MLflow's bookkeeping it waits for the next trial's start or end, since neither store is
    interrupt-safe there (one inside Optuna's `tell` ends in Optuna's own UnboundLocalError traceback).
    Optuna logs an interrupted trial as a failure with a 30-line traceback; a Ctrl-C is no failure to
    report, so those records are dropped (`filter`, on Optuna's logger).
    """

    def __init__(self):
        self.pending = False  # a Ctrl-C came outside a simulation: stop at the next safe point
        self.simulating = False
        self.trials: set[int] = set()  # interrupted trials, whose failure records are dropped

    def handler(self, signum, frame) -> None:
        if self.simulating:
            raise KeyboardInterrupt
        self.pending = True

    def check(self) -> None:
        if self.pending:
            raise KeyboardInterrupt

    def filter(self, record) -> bool:
        text = record.getMessage()
        return not any(text.startswith(f"Trial {n} failed") for n in self.trials)

    @contextmanager
    def installed(self):
        """Handle SIGINT for the duration (main thread, default handler only: an ignored SIGINT stays ignored)."""
        import logging
        import signal
        import threading

        log = logging.getLogger("optuna.study._optimize")  # where Optuna reports a failed trial
        log.addFilter(self)
        own = (threading.current_thread() is threading.main_thread()
               and signal.getsignal(signal.SIGINT) is signal.default_int_handler)
        previous = signal.signal(signal.SIGINT, self.handler) if own else None
        try:
            yield self
        finally:
            if own:
                signal.signal(signal.SIGINT, previous)
            log.removeFilter(self)


def _open_study(study_name: str, storage: str, seed: int | None, *, create: bool = True):
    """The study in its RDB storage; an unreachable or unsupported storage URL is one line, not a traceback."""
    import optuna
    import sqlalchemy.exc

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    sampler = optuna.samplers.TPESampler(seed=seed)
    try:
        if create:
            return optuna.create_study(study_name=study_name, storage=storage, direction="minimize",
                                       sampler=sampler, load_if_exists=True)
        return optuna.load_study(study_name=study_name, storage=storage, sampler=sampler)
    except (ImportError, sqlalchemy.exc.SQLAlchemyError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        hint = ' (install the driver: pip install -e ".[servers]")' if isinstance(exc, ImportError) else ""
        raise SearchError(f"--storage {redact(storage)}: cannot open the study: {first}{hint}") from None


def _worker(space, trials, storage, study_name, root, jobs, seed, only, split, allowlist, parent) -> None:
    """One worker process: load the shared study and run its trials (Optuna hands out the trial numbers)."""
    weights, params = select(space, only, allowlist)
    study = _open_study(study_name, storage, seed, create=False)
    _optimize(study, ledger.Ledger(), parent, params, weights, root, jobs, split, trials)


def _finished(study) -> list:
    from optuna.trial import TrialState

    return study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.FAIL, TrialState.PRUNED))


def _optimize(study, book, parent, params, weights, root, jobs, split, trials, progress=None) -> None:
    from .validate import FixtureEvaluationError, validate

    ctrl_c = _CtrlC()

    def objective(trial):
        run = None
        try:
            ctrl_c.check()  # a Ctrl-C between two trials: this one does not start
            values = {p.path: trial.suggest_float(p.path, p.low, p.high, log=p.log, step=p.step) for p in params}
            run = book.start_run(ledger.CALIBRATION, f"trial {trial.number}", run_type="trial", parent=parent,
                                 params={**ledger.provenance(split, [VARIANT], values), "trial": trial.number,
                                         **{f"value.{k}": v for k, v in values.items()}})
            trial.set_user_attr("mlflow_run_id", run)
            try:
                ctrl_c.simulating = True
                ctrl_c.check()
                report = validate(split, root=root, variants=[VARIANT], overrides=values, jobs=jobs)
            except FixtureEvaluationError as exc:
                book.log(run, tags={"error": str(exc)})
                book.finish(run, "FAILED")
                raise
            finally:
                ctrl_c.simulating = False
            agg = report.aggregates()[VARIANT]
            value = sum(w * agg[k] for k, w in weights.items())
            for k in ("mape", "bubble_mae_pp", "rho_mean"):
                trial.set_user_attr(k, agg[k])
            book.log(run, metrics={**ledger.aggregate_metrics({VARIANT: agg}), "objective": value})
            book.finish(run)
            return value if math.isfinite(value) else float("inf")
        except KeyboardInterrupt:  # Optuna records the trial FAIL and re-raises; the run ends as the user ended it
            ctrl_c.trials.add(trial.number)
            if run is not None:
                try:
                    book.log(run, tags={"incomplete": INTERRUPTED})
                    book.finish(run, "KILLED")
                except Exception:  # noqa: BLE001 - best effort: the exit stays a quiet 130
                    pass
            raise

    def counted(study, trial) -> None:  # an Optuna callback: once per finished trial
        if ctrl_c.pending:
            study.stop()
        if progress is not None:
            if trial.value is not None:
                progress.note(f"trial {trial.number}: {trial.value:.3f}, best {study.best_value:.3f}")
            progress.update()

    with ctrl_c.installed():
        study.optimize(objective, n_trials=trials, catch=(HopsError,), callbacks=[counted])
    ctrl_c.check()  # stopped by a Ctrl-C that came between two trials


def _open_tags(book) -> dict:
    run = ledger.open_iteration_if_any(book)
    return ledger.iteration_tags(run) if run else {}


def _summary(trial) -> dict:
    return {"number": trial.number, "value": trial.value, "values": dict(trial.params),
            "mape": trial.user_attrs.get("mape", math.nan), "bubble_mae_pp": trial.user_attrs.get("bubble_mae_pp",
                                                                                                   math.nan)}


def gate_command(values: dict) -> str:
    return "python -m autoresearch gate --set " + " ".join(f"{k}={v:.6g}" for k, v in values.items())


def render(r: SearchResult) -> str:
    obj = " + ".join(f"{w:g} x {k}" for k, w in r.weights.items())
    model = f"model {r.model_fingerprint}" if r.model_fingerprint else "this model"
    if r.already:
        lines = [f"search: resumed study {r.study_name} ({r.storage}), which already held {r.already} trial(s) "
                 f"of {model}; {r.n_trials} completed trial(s) in all; objective = {obj} (train {VARIANT})"]
    else:
        lines = [f"search: new study {r.study_name} ({r.storage}) for {model}, {r.n_trials} completed trial(s); "
                 f"objective = {obj} (train {VARIANT})"]
    if r.baseline:
        lines.append(f"baseline (current catalog values, trial {r.baseline['number']}): objective "
                     f"{r.baseline['value']:.3f} (MAPE {r.baseline['mape']:.2f}%, bubble MAE "
                     f"{r.baseline['bubble_mae_pp']:.2f} pp)")
    if not r.best:
        lines.append("no trial completed; nothing to propose")
        return "\n".join(lines)
    b = r.best
    lines.append(f"best trial {b['number']}: objective {b['value']:.3f} (MAPE {b['mape']:.2f}%, bubble MAE "
                 f"{b['bubble_mae_pp']:.2f} pp)")
    current = dotted_items(Catalog.load().as_dict(), keep_empty=False)
    if (r.baseline and b["number"] == r.baseline["number"]) or all(
            math.isclose(b["values"][p.path], float(current[p.path])) for p in r.params):
        lines.append("no trial beat the current catalog values; nothing to propose")
        return "\n".join(lines)
    for p in r.params:
        lines.append(f"  {p.path} = {b['values'][p.path]:.6g} (now {current[p.path]}, bounds [{p.low:g}, {p.high:g}])")
    lines += ["This is a proposal only: nothing was written. To land it, as any change:",
              "  1. python -m autoresearch propose --hypothesis ... --change-site hops/presets/... --expect ...",
              f"  2. {gate_command(b['values'])}",
              f"  3. edit the presets, add citations (kind: fit, source: \"optuna study {r.study_name} trial "
              f"{b['number']}\"), then gate and admit"]
    return "\n".join(lines)
