"""The calibration-loop commands, plugged into `python -m autoresearch` (see __main__.py).

An iteration is one MLflow run (run_type=iteration) that `propose` opens with
the hypothesis before any code changes and `admit` / `park` / `revert` close;
every gate, observe or search run logged while it is open carries its tags, and
closing it rewrites the outcome tag on all of them so UI filters agree. Only
one iteration is open at a time (decided under ledger.state_lock): the before
-> after numbers of an iteration mean something only if nothing else landed in
between. Closing is one journaled transaction (journal.py), so a kill at any
step is completed by the next command; parked diffs and stacks live in stack.py
and worktree.py.

Handlers return the exit code: 0 ok, 1 the gate said no (every violation is
listed on stdout), 2 a user mistake (HopsError, one line on stderr).
"""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from hops.errors import HopsError

from . import ledger
from .cli_args import at_least
from .iteration_runs import (close_effect, close_record, elsewhere_note, log_gate, refuse_if_open, replay_unfinished,
                             short_title, snapshot_or_none, untracked_at_open, untracked_tags)


def _fixtures(p) -> None:
    p.add_argument("--fixtures", metavar="ROOT", help="fixture root (default: $HOPS_FIXTURES, else ./fixtures)")


def _jobs(p) -> None:
    p.add_argument("--jobs", type=at_least(0), default=1, metavar="N",
                   help="worker processes (default 1; 0 = all cores)")


def _split(p, default: str | None = "train") -> None:
    p.add_argument("--split", default=default, required=default is None, metavar="NAME",
                   help=f"fixture split (default: {default}; the test split is held out)" if default
                   else "fixture split")


def add_commands(sub) -> None:
    p = sub.add_parser("observe", help="rank the largest train error contributors (groups, stage x device x phase)")
    _split(p), _fixtures(p), _jobs(p)
    p.add_argument("--variant", default="link_calibrated", help="variant to analyse (default: link_calibrated)")
    p.add_argument("--top", type=at_least(1), default=8, help="lines per ranking (default 8)")
    p.set_defaults(func=run_observe)

    p = sub.add_parser("propose", help="open a calibration iteration (before changing any code)")
    p.add_argument("--hypothesis", required=True, help="what is wrong in the model and why you think so")
    p.add_argument("--change-site", required=True, metavar="PATH",
                   help="file to change (e.g. hops/model/compute.py) or catalog path (e.g. stacks.fixture_megatron.k_floor_ms.l4)")
    p.add_argument("--expect", required=True, help="expected effect, with numbers (e.g. 'last-stage F error -50%%')")
    p.add_argument("--title", help="a few words naming the change (MLflow run names, patch file); default: the "
                                   "hypothesis' first words")
    p.add_argument("--on", metavar="N[,M...]", help="open on top of these parked iterations: their patches are "
                                                     "applied to the (clean) working tree, bottom first")
    _fixtures(p), _jobs(p)
    p.set_defaults(func=run_propose)

    p = sub.add_parser("park", help="close the open iteration as parked: save its diff as a patch, restore the tree")
    p.add_argument("--reason", default="", help="why it is parked (default: the per-fixture checks it fails)")
    p.add_argument("--keep-tree", action="store_true", help="save the patch but leave the working tree as it is")
    p.set_defaults(func=run_park)

    p = sub.add_parser("gate", help="the working tree (+ --set what-ifs) against the golden file; exit 1 on any violation")
    _split(p), _fixtures(p), _jobs(p)
    p.add_argument("--set", action="extend", nargs="+", default=None, metavar="KEY=VALUE",
                   help="catalog what-if, e.g. stacks.fixture_megatron.k_floor_ms.l4=1.2 (needs a citation like any changed value)")
    p.set_defaults(func=run_gate_cmd)

    p = sub.add_parser("admit", help="land the open iteration: re-run the gate, rewrite the golden file if it passes")
    _fixtures(p), _jobs(p)
    p.add_argument("--bootstrap", action="store_true", help="create the first golden file (only when none exists)")
    p.add_argument("--redefine-metrics", action="store_true",
                   help="land a metric-definition iteration: re-bootstrap the golden file from the same predictions "
                        "(refused unless every fixture's throughput error is unchanged)")
    p.set_defaults(func=run_admit)

    p = sub.add_parser("rebaseline", help="a recorded human decision: admit a kept tree that improves every "
                                          "aggregate but fails per-fixture checks (see autoresearch/README.md)")
    p.add_argument("--on", required=True, metavar="N[,M...]", help="the parked / reverted iterations whose kept "
                                                                    "patches make the tree, bottom first")
    p.add_argument("--confirm-human", metavar="REASON", help="why a person admits this tree (cite the evidence); "
                                                              "without it the command refuses")
    p.add_argument("--explain", action="extend", nargs="+", metavar="ID=TEXT",
                   help="the physical explanation of each fixture that still violates its allowance")
    _fixtures(p), _jobs(p)
    p.set_defaults(func=run_rebaseline)

    p = sub.add_parser("revert", help="close the open iteration as reverted (or --blocked)")
    p.add_argument("--reason", required=True, help="why it did not land")
    p.add_argument("--blocked", action="store_true", help="outcome blocked: the idea needs something not available")
    p.add_argument("--keep-tree", action="store_true", help="save the patch but leave the working tree as it is")
    p.set_defaults(func=run_revert)

    p = sub.add_parser("repair", help="bring a broken ledger state back to one consistent story (see README)")
    p.add_argument("--keep", type=int, metavar="N", help="with several open iterations: the one to keep open "
                                                          "(default: the first opened); the others become void")
    p.add_argument("--drop-journal", action="store_true", help="discard an unreadable journal of an interrupted "
                                                                 "command instead of replaying it")
    p.set_defaults(func=run_repair)

    p = sub.add_parser("search", help="Optuna search over allowlisted constants (a proposal, never admitted by itself)")
    _split(p), _fixtures(p), _jobs(p)
    p.add_argument("--space", required=True, help="named space in autoresearch/search_space.yaml")
    p.add_argument("--trials", type=at_least(1), required=True, help="trials to run in this process (in each worker)")
    p.add_argument("--workers", type=at_least(1), default=1, metavar="N",
                   help="worker processes on the one study (default 1); with an RDB --storage, separate "
                        "invocations with the same --study join it too")
    p.add_argument("--storage", metavar="URL", help="Optuna storage (default sqlite under mlruns/; an RDB URL shares "
                                                    "one study between workers)")
    p.add_argument("--study", metavar="NAME", help="study name (default autoresearch-<space>-<model fingerprint>: "
                                                   "a study holds trials of one model)")
    p.add_argument("--only", action="extend", nargs="+", metavar="PATH", help="restrict to these allowlisted paths")
    p.add_argument("--seed", type=int, default=None, help="sampler seed")
    p.set_defaults(func=run_search)

    p = sub.add_parser("checkpoint", help="the human-confirmed, once-per-model test split evaluation (aggregates only)")
    _split(p, None), _fixtures(p), _jobs(p)
    p.add_argument("--confirm-human", required=True, metavar="WHY", help="why a human is taking this checkpoint")
    p.set_defaults(func=run_checkpoint)

    p = sub.add_parser("noise", help="run-to-run spread: archive duplicates against the train runs of the same config")
    _fixtures(p)
    p.add_argument("--json", metavar="PATH", help="also write the pairs and means as JSON")
    p.set_defaults(func=run_noise)

    p = sub.add_parser("crossval", help="refit the fitted constants without each group of train fixtures and "
                                        "score the group (what to expect on a setup the fit never saw)")
    p.add_argument("--by", required=True, metavar="{device,gpu,depth,shape}", help="how to group the train fixtures")
    p.add_argument("--space", default="sum_model", help="space of search_space.yaml to refit (default sum_model)")
    p.add_argument("--json", metavar="PATH", help="also write the tables as JSON (README's come from docs/crossval/)")
    p.add_argument("--fit-seeds", type=int, default=1, metavar="N",
                   help="refit each fold from N fit seeds and report the range of its ratio (default 1; "
                        "README's tables use 3)")
    _fixtures(p), _jobs(p)
    p.set_defaults(func=run_crossval)

    p = sub.add_parser("precommit", help="the pre-commit hook: run the gate when a staged file is a model or gate file")
    p.add_argument("files", nargs="*", help="staged files (pre-commit passes them)")
    _fixtures(p), _jobs(p)
    p.set_defaults(func=run_precommit)

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
                        workers=args.workers, progress=sys.stderr.isatty())))
    return 0


def run_checkpoint(args) -> int:
    from .checkpoint import checkpoint

    replay_unfinished()
    print(checkpoint(args.split, args.confirm_human, root=args.fixtures, jobs=args.jobs))
    return 0


def run_noise(args) -> int:
    import json

    from .noise import noise, render

    n = noise(args.fixtures)
    print(render(n))
    if args.json:
        doc = {"pairs": [{**p.__dict__, "throughput_pct": p.throughput_pct, "bubble_pp": p.bubble_pp} for p in n.pairs],
               "throughput_pct_mean": n.throughput_pct_mean, "bubble_pp_mean": n.bubble_pp_mean,
               "unpaired": n.unpaired,
               "twins": [{**t.__dict__, "throughput_pct": t.throughput_pct, "bubble_pp": t.bubble_pp} for t in n.twins],
               "not_twins": [list(p) for p in n.not_twins],
               "slow_iterations": {"slow_share": n.slow_share, "runs": [s.__dict__ for s in n.slow.values()]}}
        if not Path(args.json).parent.is_dir():  # as validate --json: a typo'd directory is not created
            raise HopsError(f"--json {args.json}: cannot write (no directory {Path(args.json).parent})")
        try:
            ledger.atomic_write(Path(args.json), json.dumps(doc, indent=1, allow_nan=False) + "\n")
        except (OSError, ValueError) as exc:
            raise HopsError(f"--json {args.json}: cannot write ({exc})") from None
    book = ledger.Ledger()
    run = book.start_run(ledger.CALIBRATION, "noise", run_type="noise",
                         params={"git_commit": ledger.git_commit(), "split": "archive+train"})
    book.log(run, metrics=n.metrics())
    book.finish(run)
    return 0


def run_crossval(args) -> int:
    from .crossval import crossval, render

    if args.fit_seeds < 1:
        raise HopsError(f"--fit-seeds: expected an integer >= 1, got {args.fit_seeds}")
    cv = crossval(args.by, space=args.space, root=args.fixtures, jobs=args.jobs, progress=sys.stderr.isatty(),
                  fit_seeds=args.fit_seeds)
    print(render(cv))
    if args.json:
        import json

        try:
            ledger.atomic_write(Path(args.json), json.dumps(cv.to_dict(), indent=1, allow_nan=False) + "\n")
        except (OSError, ValueError) as exc:
            raise HopsError(f"--json {args.json}: cannot write ({exc})") from None
    book = ledger.Ledger()
    run = book.start_run(ledger.CALIBRATION, f"crossval {args.by}", run_type="crossval",
                         params={**ledger.provenance("train", ("spec", "link_calibrated")), "by": args.by,
                                 "space": args.space})
    book.log(run, metrics=cv.metrics())
    with tempfile.TemporaryDirectory() as tmp:
        cv.table().to_csv(Path(tmp) / "crossval.csv", index=False)
        cv.constants().to_csv(Path(tmp) / "constants.csv")
        book.log_artifacts(run, tmp)
    book.finish(run)
    return 0


def run_precommit(args) -> int:
    """Derive the hook's file selection from hops.provenance.MODEL_FILES + gate.GATE_FILES (no regex to drift)."""
    from .gate import needs_gate

    hits = needs_gate(args.files)
    if not hits:
        print(f"autoresearch precommit: none of {len(args.files)} staged file(s) is a model or gate file; "
              f"gate skipped")
        return 0
    print(f"autoresearch precommit: {len(hits)} model/gate file(s) staged ({', '.join(hits[:5])}"
          f"{', ...' if len(hits) > 5 else ''}): running the gate")
    args.set, args.split = None, None
    return run_gate_cmd(args)


def run_log(args) -> int:
    from .research_log import collect, write_log

    book = ledger.Ledger()
    replay_unfinished(book)
    path = write_log(book)
    print(f"{path}: {len(collect(book))} iteration(s)")
    return 0


# --------------------------------------------------------------------------- gate
def run_gate_cmd(args) -> int:
    from .gate import render, run_gate

    replay_unfinished()
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
NEW_FILE_SUFFIXES = (".py", ".yaml", ".yml", ".json", ".md", ".toml", ".txt", ".csv")


def _check_change_site(site: str) -> None:
    """A file of the repo (existing, or new in an existing directory) or a catalog path."""
    import difflib

    from hops.model.hardware import Catalog, dotted_items

    catalog = Catalog.load().as_dict()
    paths = dotted_items(catalog, keep_empty=False)
    if site in paths or any(p.startswith(site + ".") for p in paths):  # a value, or a mapping of them
        return
    if site.split(".", 1)[0] in catalog:  # reads as a catalog path, and is none
        close = difflib.get_close_matches(site, list(paths), n=1)
        raise HopsError(f"--change-site {site!r}: no such catalog path" + (f"; did you mean {close[0]}?" if close
                                                                           else ""))
    from .state import repo_root

    repo = repo_root()
    path = Path(site) if Path(site).is_absolute() else repo / site
    try:
        path.resolve().relative_to(repo.resolve())
    except ValueError:
        raise HopsError(f"--change-site {site!r} is outside the repo ({repo})") from None
    if path.exists() or (path.parent.is_dir() and path.suffix in NEW_FILE_SUFFIXES):
        return
    raise HopsError(f"--change-site {site!r} is neither a path in the repo (or a new file in an existing "
                    f"directory) nor a catalog path like stacks.fixture_megatron.k_floor_ms.l4")


def run_propose(args) -> int:
    from . import stack, worktree
    from .gate import GateConfig, read_golden

    for flag, value in (("--hypothesis", args.hypothesis), ("--expect", args.expect)):
        if not value.strip():
            raise HopsError(f"{flag} must not be empty")
    _check_change_site(args.change_site)
    golden = read_golden()
    cfg = GateConfig.load()
    on = stack.expand(stack.parse_on(args.on)) if args.on else []
    stack.check_size(len(on))
    book = ledger.Ledger()
    with ledger.state_lock():  # numbering and the one-open-iteration rule are decided under one lock
        replay_unfinished(book)
        refuse_if_open(book)  # here, or in another MLflow ledger of this state
        before = {v: golden["aggregates"][v] for v in cfg.gated_variants if v in golden["aggregates"]}
        users = worktree.untracked() if worktree.is_repo() else []  # theirs, not the change's: kept out of it
        if on:
            if not worktree.owns_tree():
                raise HopsError(f"--on edits the working tree, but the calibration state ({ledger.state_dir()}) is "
                                f"not in this repository ({worktree.repo()}); unset HOPS_AUTORESEARCH_STATE")
            if worktree.snapshot(users) != worktree.head_tree():
                raise HopsError("--on applies parked patches to the working tree, which has uncommitted changes: "
                                "commit them, or close them as an iteration first")
            tree = stack.base_tree(on)  # refuses a patch that no longer applies, before anything changes
            print(f"scoring the stack {' + '.join(f'it{n}' for n in on)} (the new iteration's baseline) ...",
                  file=sys.stderr)
            before = stack.evaluate_tree(tree, root=args.fixtures, variants=cfg.gated_variants,
                                         ids=sorted(golden["fixtures"]), split=cfg.split, jobs=args.jobs)
        n = book.next_iteration()
        title = (args.title or "").strip() or short_title(args.hypothesis)
        # The run is born void and becomes open in the same batch that records its baseline: a kill
        # in between leaves a void run (closed by `repair`), never an open iteration without a "before".
        tags = {"iteration": n, "title": title, "hypothesis": args.hypothesis.strip(),
                "change_site": args.change_site, "expected_effect": args.expect.strip(), "outcome": "void",
                "reason": UNFINISHED_PROPOSE, "opened": ledger.now()}
        if on:
            tags["stack_on"] = ",".join(map(str, on))
        ledger.crash_point("propose:run")
        run = book.start_run(ledger.CALIBRATION, f"it{n} iteration: {title}", run_type="iteration",
                             params=ledger.provenance(cfg.split, cfg.gated_variants), tags=tags)
        ledger.mark_open(n, run, book.uri)
        ledger.crash_point("propose:created")
        book.log(run, tags=untracked_tags(users))
        book.log(run, metrics=ledger.aggregate_metrics(before, prefix="before."), tags={"outcome": "open", "reason": ""})
        if on:
            worktree.apply([stack.patch_file(stack.parked(k)) for k in on])
    print(f"opened iteration {n} (MLflow run {run})" + (f" on top of {', '.join(f'it{k}' for k in on)}; their "
                                                          f"patches are applied to the working tree" if on else "")
          + "; baseline = " + ("the stacked tree:" if on else "golden file:"))
    for v, a in before.items():
        print(f"  {v}: MAPE {a['mape']:.2f}%, bubble MAE {a['bubble_mae_pp']:.2f} pp, rho {a['rho_mean']:.2f}")
    if users:
        print(f"untracked before this iteration, so never part of its patch nor removed by park / revert: "
              f"{', '.join(users[:8])}{', ...' if len(users) > 8 else ''} (commit one first to make it part of "
              f"the change)")
    print("next: change the code, `python -m autoresearch gate`, then `admit`, `park` or `revert --reason ...`")
    return 0


UNFINISHED_PROPOSE = "propose was killed before the baseline was recorded; run propose again"


def _require_open(book):
    iteration = book.open_iteration()
    if iteration is None:
        elsewhere = book.open_elsewhere()
        raise HopsError("no open iteration to close in this MLflow ledger; " + elsewhere_note(elsewhere)
                        if elsewhere else "no open iteration to close (see `python -m autoresearch log`)")
    return iteration


def _stack_on(run) -> list[int]:
    return [int(x) for x in (run.data.tags.get("stack_on") or "").split(",") if x]


def _patch_effects(run, outcome: str, keep_tree: bool) -> tuple[list[dict], dict, str]:
    """Save the open iteration's own diff (if any) as autoresearch/patches/itN-<slug>.patch; restore the tree."""
    from . import stack, worktree

    if not worktree.is_repo():
        return [], {}, "not a git repository: no diff saved"
    t = run.data.tags
    users = untracked_at_open(run)
    tree = worktree.snapshot(users)
    own = worktree.diff(stack.base_tree(_stack_on(run)), tree)
    effects, extra = [], {}
    if own.strip():
        name = f"patches/it{t['iteration']}-{worktree.slug(t.get('title') or t.get('hypothesis', ''))}.patch"
        effects.append({"kind": "write", "path": name, "text": own})
        extra["patch"] = name
        note = f"diff saved as {name}"
    else:
        note = "no diff to save (the tree holds no change of its own)"
    if not keep_tree and tree != worktree.head_tree() and worktree.owns_tree():
        effects.append({"kind": "restore", "tree": tree, "keep_out": users})
        note += "; working tree restored to HEAD" + (" (parked patches below it removed too; they stay parked)"
                                                     if _stack_on(run) else "")
    return effects, extra, note


def run_park(args) -> int:
    from . import stack
    from .gate import GateConfig
    from .journal import run as transact

    cfg = GateConfig.load()
    book = ledger.Ledger()
    with ledger.state_lock():
        replay_unfinished(book)
        it = _require_open(book)
        t = it.data.tags
        if not t.get("last_gate_run"):
            raise HopsError(f"iteration {t['iteration']} has no gate run yet: park keeps an iteration whose gate "
                            f"was seen; run `python -m autoresearch gate` first")
        if t.get("last_gate_whatif", "none") != "none":
            raise HopsError(f"the last gate of iteration {t['iteration']} was a what-if (--set "
                            f"{t['last_gate_whatif']}), which a patch cannot hold: edit the presets (with "
                            f"citations) and run `gate` on the tree")
        if t.get("last_gate_tree") != snapshot_or_none(untracked_at_open(it)):
            raise HopsError(f"the working tree changed since iteration {t['iteration']}'s last gate: run "
                            f"`python -m autoresearch gate` again, so the parked patch is the tree that was judged")
        from .research_log import from_run

        seen = from_run(it)
        why = stack.rule_violation(seen["before"], seen["after"] or {}, cfg.gated_variants, cfg.epsilon)
        if why:
            raise HopsError(f"iteration {t['iteration']} cannot be parked: against its baseline it {why}; a "
                            f"stack member must improve an aggregate on its own (revert it instead)")
        if not stack.own_diff(_stack_on(it), untracked_at_open(it)).strip():
            raise HopsError(f"iteration {t['iteration']} changes nothing beyond the patches under it: nothing to park")
        stack.check_size(len(_stack_on(it)) + 1)
        effects, extra, note = _patch_effects(it, "parked", args.keep_tree)
        reason = args.reason.strip() or "aggregates improve; fails per-fixture checks (parked for a stack)"
        rec = close_record(it, "parked", after=seen["after"], regressions=seen["regressions"], reason=reason,
                           stack_on=_stack_on(it), **extra)
        report = t.get("last_gate_report", "")
        transact("park", [*[e for e in effects if e["kind"] == "write"], {"kind": "append", "record": rec},
                          close_effect(rec, "parked", artifacts={"gate_report.txt": report} if report else None),
                          {"kind": "log"}, *[e for e in effects if e["kind"] == "restore"]],
                 summary=f"iteration {t['iteration']} parked", book=book)
    print(f"parked iteration {t['iteration']}: {note}. Commit {extra.get('patch', 'the log')}, "
          f"{ledger.iterations_path().name} and LOG.md; stack on it with `propose --on {t['iteration']} ...`")
    return 0


def run_admit(args) -> int:
    from . import stack
    from .gate import GateConfig, build_golden, golden_path, golden_text, render, run_gate
    from .journal import run as transact

    book = ledger.Ledger()
    cfg = GateConfig.load()
    with ledger.state_lock():
        replay_unfinished(book)
        if args.bootstrap:
            if golden_path(cfg.split).exists():
                raise HopsError(f"{golden_path(cfg.split)} exists: --bootstrap only creates the first golden file; "
                                f"land changes through propose / gate / admit")
            iteration = None
        else:
            iteration = book.open_iteration()
            elsewhere = book.open_elsewhere() if iteration is None else None
            if elsewhere is not None:
                raise HopsError("no open iteration to admit in this MLflow ledger; " + elsewhere_note(elsewhere))
            if iteration is None:
                raise HopsError("no open iteration to admit: open one with `python -m autoresearch propose "
                                "--hypothesis ... --change-site ... --expect ...` (or `admit --bootstrap` for the "
                                "first golden file)")
        members = stack.members(iteration) if iteration is not None and _stack_on(iteration) else []
        if members:
            stack.check_size(len(members))
        result = run_gate(root=args.fixtures, jobs=args.jobs, bootstrap=args.bootstrap)
        print(render(result))
        if getattr(args, "redefine_metrics", False):
            from .gate import same_predictions

            moved = same_predictions(result)
            if moved:
                print("admit --redefine-metrics refused: a metric definition may change how runs are scored, not "
                      "what is simulated or measured; throughput moved on:\n  " + "\n  ".join(moved[:10]))
                return 1
            # the golden comparison is what is being redefined; sanity, citation and checksum rules still hold
            result.violations = [v for v in result.violations if v not in result.comparison.violations]
        if not result.passed:
            log_gate(result, "admit", book, iteration)
            print("admit refused: the gate does not pass on the current tree (fix it, park it, or close the "
                  "iteration with `revert --reason ...`)")
            return 1
        if not args.bootstrap and not members and _changes_nothing(iteration, result):
            t = iteration.data.tags
            raise HopsError(f"iteration {t['iteration']} changes nothing: the working tree holds no diff beyond "
                            f"HEAD and the gate scores every fixture as the golden file does, so landing it would "
                            f"record a change to {t.get('change_site', '?')} that never happened; make the change "
                            f"and run `python -m autoresearch gate` again, or close it as not pursued with "
                            f"`python -m autoresearch revert --reason ...`")
        if args.bootstrap:
            n = book.next_iteration()
            run = book.start_run(ledger.CALIBRATION, f"it{n} iteration: bootstrap", run_type="iteration",
                                 params=ledger.provenance(cfg.split, cfg.gated_variants),
                                 tags={"iteration": n, "outcome": "open", "opened": ledger.now(), "title": "bootstrap",
                                       "hypothesis": "bootstrap: the first golden file, from the model as it is",
                                       "change_site": f"autoresearch/golden/{cfg.split}.json",
                                       "expected_effect": "none: establishes the baseline every later change is "
                                                          "gated against"})
            ledger.mark_open(n, run, book.uri)
            iteration = book.get_run(run)
        final = {v: {m: now for m, (_, now) in per.items()} for v, per in result.comparison.aggregates.items()}
        steps = []
        if members:
            print(f"stack: measuring {' + '.join(f'it{m.iteration}' for m in members)} cumulatively ...",
                  file=sys.stderr)
            steps = stack.cumulative(members, result.golden, final, root=args.fixtures, variants=cfg.gated_variants,
                                     jobs=args.jobs, split=cfg.split)
            riders = [f"it{m.iteration} ({m.title}): {why}" for m, (b, a) in zip(members, steps)
                      if (why := stack.rule_violation(b, a, cfg.gated_variants, cfg.epsilon))]
            lines = [f"  it{m.iteration} {m.title}: MAPE " + ", ".join(
                f"{v} {b[v]['mape']:.2f} -> {a[v]['mape']:.2f}" for v in cfg.gated_variants if v in a)
                for m, (b, a) in zip(members, steps)]
            print("stack members, each on top of those below it:\n" + "\n".join(lines))
            if riders:
                log_gate(result, "admit", book, iteration)
                print("admit refused: every stack member must improve a gated aggregate on its own and worsen "
                      "none (nothing rides along):\n" + "\n".join(f"  - {r}" for r in riders))
                return 1
        gate_run = log_gate(result, "admit", book, iteration, finish=False)
        ledger.crash_point("admit:gate_logged")
        iteration = book.get_run(iteration.info.run_id)
        n = int(iteration.data.tags["iteration"])
        prov = ledger.provenance(cfg.split, cfg.gated_variants)
        new = build_golden(result.report, cfg, catalog=result.catalog, iteration=n, prov=prov)
        effects = [{"kind": "write", "path": f"golden/{cfg.split}.json", "text": golden_text(new)}]
        worse = [m for _, m in result.comparison.worse[:10]]
        if members:
            stack_ids = [m.iteration for m in members]
            for m, (b, a) in zip(members, steps):
                if m.record is not None:  # a parked member lands as its own iteration, under its own number
                    rec = {**m.record, "outcome": "landed", "closed": ledger.now(), "before": b, "after": a,
                           "regressions": [], "reason": f"landed in the stack {'+'.join(map(str, stack_ids))} "
                                                        f"(admitted with iteration {n})",
                           "parked_reason": m.record.get("reason", ""), "landed_with": n, "stack": stack_ids,
                           "worse_within_tolerance": [],
                           **{k: prov[k] for k in ("git_commit", "git_diff_hash", "model_fingerprint")}}
                    effects += [{"kind": "append", "record": rec}, close_effect(rec, "landed")]
            top = next(((b, a) for m, (b, a) in zip(members, steps) if m.record is None), None)
            before = top[0] if top else steps[-1][1]
            rec = close_record(iteration, "landed", after=new["aggregates"], before=before, worse=worse, prov=prov,
                               stack=stack_ids, stack_on=_stack_on(iteration),
                               **({} if top else {"reason": "stack carrier: no change of its own"}))
        else:
            before = {} if args.bootstrap else result.golden["aggregates"]
            rec = close_record(iteration, "landed", after=new["aggregates"], before=before, worse=worse, prov=prov)
        effects += [{"kind": "append", "record": rec}, close_effect(rec, "landed"),
                    {"kind": "mlflow", "run_id": gate_run, "status": "FINISHED"}, {"kind": "log"}]
        transact("admit", effects, summary=f"iteration {n} landed", book=book)
    path = golden_path(cfg.split)
    landed = f"iterations {', '.join(str(m.iteration) for m in members)}" if members else f"iteration {n}"
    print(f"admitted {landed}: {path} rewritten; {ledger.iterations_path().name} and LOG.md updated. "
          f"Commit them with the change.")
    return 0


def _changes_nothing(iteration, result) -> bool:
    """The open (unstacked) iteration has no diff against its base (HEAD) and admitting it would leave the
    golden file's model, catalog, fixture set and every score as they are: nothing to land.

    Both halves count. A diff that moves no number (a comment, a docstring) is still a change someone made
    and may land; an empty diff with moved numbers (a model change committed outside the loop, fixtures
    entering the golden file on admit) is still something to record.
    """
    from . import stack, worktree
    from .gate import build_golden

    if _stack_on(iteration):  # a stack carrier lands the parked members below it
        return False
    if worktree.is_repo() and stack.own_diff([], untracked_at_open(iteration)).strip():
        return False
    cfg = result.cfg
    new = build_golden(result.report, cfg, catalog=result.catalog, iteration=0,
                       prov=ledger.provenance(cfg.split, cfg.gated_variants))
    same = ("model_fingerprint", "catalog", "variants", "fixtures", "aggregates")
    return all(new.get(k) == result.golden.get(k) for k in same)


def run_rebaseline(args) -> int:
    import os

    from . import rebaseline

    return rebaseline.judge(args) if os.environ.get(rebaseline.ENV_TREE) else rebaseline.start(args)


def run_revert(args) -> int:
    from .journal import run as transact
    from .research_log import from_run

    if not args.reason.strip():
        raise HopsError("--reason must not be empty")
    book = ledger.Ledger()
    with ledger.state_lock():
        replay_unfinished(book)
        iteration = _require_open(book)
        outcome = "blocked" if args.blocked else "reverted"
        effects, extra, note = _patch_effects(iteration, outcome, args.keep_tree)
        seen = from_run(iteration)
        rec = close_record(iteration, outcome, after=seen["after"], regressions=seen["regressions"],
                           reason=args.reason.strip(), stack_on=_stack_on(iteration), **extra)
        transact("revert", [*[e for e in effects if e["kind"] == "write"], {"kind": "append", "record": rec},
                            close_effect(rec, outcome), {"kind": "log"},
                            *[e for e in effects if e["kind"] == "restore"]],
                 summary=f"iteration {iteration.data.tags['iteration']} {outcome}", book=book)
    below = _stack_on(iteration)
    print(f"closed iteration {iteration.data.tags['iteration']} as {outcome}; the golden file is unchanged; {note}"
          + (f"; the stack dropped (iterations {', '.join(map(str, below))} stay parked)" if below else "") + ".")
    return 0


def run_repair(args) -> int:
    """One consistent story again: finish a journal, void race duplicates, close runs the jsonl closed, dedupe."""
    from . import unfinished
    from .journal import journal_path, replay

    book = ledger.Ledger()
    done = []
    with ledger.state_lock():
        open_runs = book.open_runs()
        if args.keep is not None and len(open_runs) > 1:  # refuse a wrong --keep before changing anything
            match = [r for r in open_runs if int(r.data.tags.get("iteration", -1)) == args.keep]
            if len(match) != 1:
                nums = ", ".join(r.data.tags.get("iteration", "?") for r in open_runs)
                raise HopsError(f"--keep {args.keep}: open iterations are {nums}; name exactly one")
        if args.drop_journal and journal_path().exists():
            journal_path().unlink()
            done.append("dropped the journal of an interrupted command")
        r = replay(book)
        if r:
            done.append(r)
        records = ledger.read_iterations()
        unique, seen = [], set()
        for rec in records:
            key = ledger._record_key(rec)
            if key not in seen:
                seen.add(key)
                unique.append(rec)
        if len(unique) != len(records):
            import json as _json

            ledger.atomic_write(ledger.iterations_path(), "".join(
                _json.dumps(r, sort_keys=True, allow_nan=False, default=str) + "\n" for r in unique))
            done.append(f"removed {len(records) - len(unique)} duplicate line(s) from {ledger.iterations_path().name}")
        closed = {r.get("run_id"): r for r in unique if r.get("outcome") in ledger.CLOSED}
        for run in book.iteration_runs():
            if run.data.tags.get("outcome") == "open" and run.info.run_id in closed:
                rec = closed[run.info.run_id]
                book.tag_iteration(run.info.run_id, {"outcome": rec["outcome"]})
                book.finish(run.info.run_id, "FINISHED" if rec["outcome"] in ledger.LANDED else "KILLED")
                done.append(f"iteration {rec['iteration']}: ledger closed as {rec['outcome']} (as recorded)")
        open_runs = book.open_runs()
        if len(open_runs) > 1:
            keep = open_runs[0]
            if args.keep is not None:
                keep = next(r for r in open_runs if int(r.data.tags.get("iteration", -1)) == args.keep)
            for run in open_runs:
                if run.info.run_id != keep.info.run_id:
                    book.tag_iteration(run.info.run_id, {"outcome": "void", "reason": "opened by a propose race; "
                                                                                      "closed by repair"})
                    book.finish(run.info.run_id, "KILLED")
                    done.append(f"iteration {run.data.tags.get('iteration')} (run {run.info.run_id[:8]}): void")
            done.append(f"iteration {keep.data.tags.get('iteration')} stays open")
        done += unfinished.repair(book)
        _refresh_log(book)
    print("repair: " + ("; ".join(done) if done else "nothing to repair") + "; LOG.md regenerated")
    return 0


def _refresh_log(book) -> None:
    from .research_log import write_log

    write_log(book)
