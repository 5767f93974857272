"""The calibration-loop commands, plugged into `python -m autoresearch` (see __main__.py).

An iteration is one MLflow run (run_type=iteration) that `propose` opens with
the hypothesis before any code changes and `admit` / `revert` close; every
gate, observe or search run logged while it is open carries its tags, and
closing it rewrites the outcome tag on all of them so UI filters agree. Only
one iteration is open at a time: the before -> after numbers of an iteration
mean something only if nothing else landed in between.

Handlers return the exit code: 0 ok, 1 the gate said no (every violation is
listed on stdout), 2 a user mistake (HopsError, one line on stderr).
"""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from hops.errors import HopsError

from . import ledger


def _fixtures(p) -> None:
    p.add_argument("--fixtures", metavar="ROOT", help="fixture root (default: $HOPS_FIXTURES, else ./fixtures)")


def _jobs(p) -> None:
    p.add_argument("--jobs", type=int, default=1, metavar="N", help="worker processes (default 1; 0 = all cores)")


def _split(p, default: str | None = "train") -> None:
    p.add_argument("--split", default=default, required=default is None, metavar="NAME",
                   help=f"fixture split (default: {default}; the test split is held out)" if default
                   else "fixture split")


def add_commands(sub) -> None:
    p = sub.add_parser("observe", help="rank the largest train error contributors (groups, stage x device x phase)")
    _split(p), _fixtures(p), _jobs(p)
    p.add_argument("--variant", default="link_calibrated", help="variant to analyse (default: link_calibrated)")
    p.add_argument("--top", type=int, default=8, help="lines per ranking (default 8)")
    p.set_defaults(func=run_observe)

    p = sub.add_parser("propose", help="open a calibration iteration (before changing any code)")
    p.add_argument("--hypothesis", required=True, help="what is wrong in the model and why you think so")
    p.add_argument("--change-site", required=True, metavar="PATH",
                   help="file to change (e.g. hops/compute.py) or catalog path (e.g. model.k_floor_ms)")
    p.add_argument("--expect", required=True, help="expected effect, with numbers (e.g. 'last-stage F error -50%%')")
    p.set_defaults(func=run_propose)

    p = sub.add_parser("gate", help="the working tree (+ --set what-ifs) against the golden file; exit 1 on any violation")
    _split(p), _fixtures(p), _jobs(p)
    p.add_argument("--set", action="extend", nargs="+", default=None, metavar="KEY=VALUE",
                   help="catalog what-if, e.g. model.k_floor_ms=1.2 (needs a citation like any changed value)")
    p.set_defaults(func=run_gate_cmd)

    p = sub.add_parser("admit", help="land the open iteration: re-run the gate, rewrite the golden file if it passes")
    _fixtures(p), _jobs(p)
    p.add_argument("--bootstrap", action="store_true", help="create the first golden file (only when none exists)")
    p.set_defaults(func=run_admit)

    p = sub.add_parser("revert", help="close the open iteration as reverted (or --blocked)")
    p.add_argument("--reason", required=True, help="why it did not land")
    p.add_argument("--blocked", action="store_true", help="outcome blocked: the idea needs something not available")
    p.set_defaults(func=run_revert)

    p = sub.add_parser("search", help="Optuna search over allowlisted constants (a proposal, never admitted by itself)")
    _split(p), _fixtures(p), _jobs(p)
    p.add_argument("--space", required=True, help="named space in autoresearch/search_space.yaml")
    p.add_argument("--trials", type=int, required=True, help="trials to run in this process (in each worker)")
    p.add_argument("--workers", type=int, default=1, metavar="N",
                   help="worker processes on the one study (default 1); with an RDB --storage, separate "
                        "invocations with the same --study join it too")
    p.add_argument("--storage", metavar="URL", help="Optuna storage (default sqlite under mlruns/; an RDB URL shares "
                                                    "one study between workers)")
    p.add_argument("--study", metavar="NAME", help="study name (default autoresearch-<space>)")
    p.add_argument("--only", action="extend", nargs="+", metavar="PATH", help="restrict to these allowlisted paths")
    p.add_argument("--seed", type=int, default=None, help="sampler seed")
    p.set_defaults(func=run_search)

    p = sub.add_parser("checkpoint", help="the human-confirmed, once-per-model test split evaluation (aggregates only)")
    _split(p, None), _fixtures(p), _jobs(p)
    p.add_argument("--confirm-human", required=True, metavar="WHY", help="why a human is taking this checkpoint")
    p.set_defaults(func=run_checkpoint)

    p = sub.add_parser("log", help="render every iteration into autoresearch/LOG.md")
    p.set_defaults(func=run_log)


# --------------------------------------------------------------------------- observe / search / checkpoint / log
def run_observe(args) -> int:
    from .observe import observe

    print(observe(args.split, root=args.fixtures, variant=args.variant, jobs=args.jobs, top=args.top))
    return 0


def run_search(args) -> int:
    from .search import render, run_search as search

    print(render(search(args.space, args.trials, storage=args.storage, study_name=args.study, root=args.fixtures,
                        jobs=args.jobs, seed=args.seed, only=args.only, split=args.split,
                        workers=args.workers)))
    return 0


def run_checkpoint(args) -> int:
    from .checkpoint import checkpoint

    print(checkpoint(args.split, args.confirm_human, root=args.fixtures, jobs=args.jobs))
    return 0


def run_log(args) -> int:
    from .research_log import collect, write_log

    book = ledger.Ledger()
    path = write_log(book)
    print(f"{path}: {len(collect(book))} iteration(s)")
    return 0


# --------------------------------------------------------------------------- gate
def log_gate(result, run_type: str, book: ledger.Ledger | None = None, iteration=None) -> str:
    """One run per gate evaluation; while an iteration is open it also becomes the iteration's "after".

    A what-if gate (--set) counts as evidence too (search proposals are judged that way before any
    file changes); the what-if is recorded next to the numbers so the log says which model they are.
    """
    book = book or ledger.Ledger()
    if iteration is None:
        iteration = book.open_iteration()
    cfg = result.cfg
    run = book.start_run(ledger.CALIBRATION, run_type if iteration is None else
                         f"iteration {iteration.data.tags['iteration']} {run_type}", run_type=run_type,
                         params=ledger.provenance(cfg.split, cfg.variants, result.overrides),
                         tags={**(ledger.iteration_tags(iteration) if iteration else {}),
                               "gate": "pass" if result.passed else "fail", "whatif": str(bool(result.overrides)),
                               "violations": "\n".join(result.violations)})
    metrics = {"gate.violations": len(result.violations)}
    if result.report is not None:
        metrics |= ledger.aggregate_metrics(result.report.aggregates())
        metrics |= ledger.group_metrics(result.report.groups())
    if result.diagnostic is not None:
        metrics |= ledger.aggregate_metrics(result.diagnostic.aggregates(), prefix=f"{cfg.diagnostic_split}.")
    book.log(run, metrics=metrics)
    if result.report is not None:
        from .gate import render

        with tempfile.TemporaryDirectory() as tmp:
            d = ledger.write_report_artifacts(result.report, Path(tmp), title=f"{run_type} {cfg.split}",
                                              sections=["## Gate", "", "```", render(result, max_worse=20), "```"])
            book.log_artifacts(run, d)
    book.finish(run)
    if iteration is not None and result.report is not None:
        aggs = {v: a for v, a in result.report.aggregates().items() if v in cfg.gated_variants}
        whatif = " ".join(f"{k}={v}" for k, v in result.overrides.items())
        book.log(iteration.info.run_id, metrics=ledger.aggregate_metrics(aggs, prefix="after."),
                 tags={"last_gate_run": run, "last_gate_status": "pass" if result.passed else "fail",
                       "last_gate_violations": "\n".join(result.violations), "last_gate_whatif": whatif or "none"})
    return run


def run_gate_cmd(args) -> int:
    from .gate import render, run_gate

    result = run_gate(root=args.fixtures, overrides=args.set, jobs=args.jobs, split=args.split)
    print(render(result))
    try:
        log_gate(result, "gate")
    except HopsError:
        raise
    except Exception as exc:  # noqa: BLE001 - the verdict must not depend on the tracking store being up
        print(f"autoresearch gate: warning: could not log the run to {ledger.tracking_uri()} ({exc})",
              file=sys.stderr)
    return 0 if result.passed else 1


# --------------------------------------------------------------------------- iterations
def _check_change_site(site: str) -> None:
    from hops.hardware import Catalog

    from .gate import flatten

    path = (ledger.REPO / site) if not Path(site).is_absolute() else Path(site)
    if path.exists() or path.parent.is_dir() and path.suffix:
        return
    if site in flatten(Catalog.load().as_dict()):
        return
    raise HopsError(f"--change-site {site!r} is neither a path in the repo (or a new file in an existing "
                    f"directory) nor a catalog path like model.k_floor_ms")


def run_propose(args) -> int:
    from .gate import GateConfig, read_golden

    book = ledger.Ledger()
    current = book.open_iteration()
    if current is not None:
        t = current.data.tags
        raise HopsError(f"iteration {t['iteration']} is open ({t.get('hypothesis', '')[:60]!r}); close it first "
                        f"with `python -m autoresearch admit`, `revert --reason ...` or `revert --blocked --reason ...`")
    for flag, value in (("--hypothesis", args.hypothesis), ("--expect", args.expect)):
        if not value.strip():
            raise HopsError(f"{flag} must not be empty")
    _check_change_site(args.change_site)
    golden = read_golden()
    cfg = GateConfig.load()
    n = book.next_iteration()
    run = book.start_run(ledger.CALIBRATION, f"iteration {n}", run_type="iteration",
                         params=ledger.provenance(cfg.split, cfg.gated_variants),
                         tags={"iteration": n, "hypothesis": args.hypothesis.strip(),
                               "change_site": args.change_site, "expected_effect": args.expect.strip(),
                               "outcome": "open", "opened": ledger.now()})
    book.log(run, metrics=ledger.aggregate_metrics(golden["aggregates"], prefix="before."))
    print(f"opened iteration {n} (MLflow run {run}); baseline = golden file:")
    for v, a in golden["aggregates"].items():
        print(f"  {v}: MAPE {a['mape']:.2f}%, bubble MAE {a['bubble_mae_pp']:.2f} pp, rho {a['rho_mean']:.2f}")
    print("next: change the code, `python -m autoresearch gate`, then `admit` or `revert --reason ...`")
    return 0


def close_iteration(book: ledger.Ledger, run, outcome: str, *, after: dict | None, before: dict | None = None,
                    regressions=(), worse=(), reason: str = "", prov: dict | None = None) -> dict:
    """Append the durable record, then mark every run of the iteration with its outcome.

    `prov` is the tree the outcome was judged on (admit passes the one it measured, before the
    golden file it writes makes the tree look dirty).
    """
    from .research_log import from_run

    rec = from_run(run)
    t = run.data.tags
    prov = prov or {"git_commit": ledger.git_commit(), "git_diff_hash": ledger.git_diff_hash(),
                    "model_fingerprint": ledger.model_fingerprint()}
    rec.update(outcome=outcome, closed=ledger.now(), reason=reason, after=after, regressions=list(regressions),
               worse_within_tolerance=list(worse), opened=t.get("opened", ""),
               **{k: prov[k] for k in ("git_commit", "git_diff_hash", "model_fingerprint")})
    if before is not None:
        rec["before"] = before
    from .validate import _nan_to_none

    rec = _nan_to_none(rec)
    ledger.append_iteration(rec)
    metrics = ledger.aggregate_metrics(rec["before"] or {}, prefix="before.")
    if after:
        metrics |= ledger.aggregate_metrics(after, prefix="after.")
    book.log(run.info.run_id, metrics=metrics, tags={"closed": rec["closed"], "reason": reason})
    book.tag_iteration(t["iteration"], {"outcome": outcome})
    book.finish(run.info.run_id, "FINISHED" if outcome == "landed" else "KILLED")
    return rec


def _refresh_log(book) -> None:
    from .research_log import write_log

    write_log(book)


def run_admit(args) -> int:
    from .gate import GateConfig, build_golden, golden_path, render, run_gate, write_golden

    book = ledger.Ledger()
    cfg = GateConfig.load()
    if args.bootstrap:
        if golden_path(cfg.split).exists():
            raise HopsError(f"{golden_path(cfg.split)} exists: --bootstrap only creates the first golden file; "
                            f"land changes through propose / gate / admit")
        iteration = None
    else:
        iteration = book.open_iteration()
        if iteration is None:
            raise HopsError("no open iteration to admit: open one with `python -m autoresearch propose "
                            "--hypothesis ... --change-site ... --expect ...` (or `admit --bootstrap` for the "
                            "first golden file)")
    result = run_gate(root=args.fixtures, jobs=args.jobs, bootstrap=args.bootstrap)
    print(render(result))
    if not result.passed:
        log_gate(result, "admit", book, iteration)
        print("admit refused: the gate does not pass on the current tree (fix it, or close the iteration with "
              "`revert --reason ...`)")
        return 1
    if args.bootstrap:
        n = book.next_iteration()
        run = book.start_run(ledger.CALIBRATION, f"iteration {n}", run_type="iteration",
                             params=ledger.provenance(cfg.split, cfg.gated_variants),
                             tags={"iteration": n, "outcome": "open", "opened": ledger.now(),
                                   "hypothesis": "bootstrap: the first golden file, from the model as it is",
                                   "change_site": f"autoresearch/golden/{cfg.split}.json",
                                   "expected_effect": "none: establishes the baseline every later change is gated against"})
        iteration = book.get_run(run)
    log_gate(result, "admit", book, iteration)
    n = int(iteration.data.tags["iteration"])
    prov = ledger.provenance(cfg.split, cfg.gated_variants)
    new = build_golden(result.report, cfg, catalog=result.catalog, iteration=n, prov=prov)
    path = write_golden(new, cfg.split)
    before = None if args.bootstrap else result.golden["aggregates"]
    close_iteration(book, book.get_run(iteration.info.run_id), "landed", after=new["aggregates"],
                    before=before or {}, worse=[m for _, m in result.comparison.worse[:10]], prov=prov)
    _refresh_log(book)
    print(f"admitted iteration {n}: {path} rewritten; {ledger.iterations_path().name} and LOG.md updated. "
          f"Commit them with the change.")
    return 0


def run_revert(args) -> int:
    from .research_log import from_run

    book = ledger.Ledger()
    iteration = book.open_iteration()
    if iteration is None:
        raise HopsError("no open iteration to close (see `python -m autoresearch log`)")
    if not args.reason.strip():
        raise HopsError("--reason must not be empty")
    outcome = "blocked" if args.blocked else "reverted"
    rec = from_run(iteration)
    close_iteration(book, iteration, outcome, after=rec["after"], regressions=rec["regressions"],
                    reason=args.reason.strip())
    _refresh_log(book)
    print(f"closed iteration {iteration.data.tags['iteration']} as {outcome}; the golden file is unchanged. "
          f"Restore the code yourself (git restore / git revert) if it is still modified.")
    return 0
