"""`rebaseline`: a recorded human decision that admits a corrected tree the per-fixture rule cannot.

Why it exists: the golden file's small per-fixture errors can come from terms
that cancel. A tree that corrects them may improve every aggregate on train,
archive and the held-out split and still move a few fixtures past their
allowance. Such a tree is landed here, once, by a person who names the reason,
under rules that are stricter than the gate's on everything but those fixtures:

- every gated train aggregate (MAPE, bubble MAE, rho of spec and link_calibrated)
  improves; holding is not enough, unless the metric is at its best value
  (rho 1 on a suite of two-stage runs has nowhere to go);
- no archive aggregate gets worse;
- no diagnostic aggregate gets worse by more than the noise floor's mean spread
  (MAPE against the throughput spread, bubble MAE against the bubble spread);
- citations, sanity and the golden checksum pass as in the gate;
- every per-fixture violation that remains is listed, each with the physical
  explanation the person gives (`--explain ID=TEXT`), in the log entry.

It rewrites the golden file once and records the outcome `rebaselined`, with
each member's before -> after. gate.yaml is not touched, so later iterations
face the same gate as before.

The members' patches are applied to the (clean) working tree, then the judging
runs in a fresh interpreter: this process has already imported the model code
of HEAD, and the verdict must be about the patched code.
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys

from hops.errors import HopsError

from . import ledger, stack, worktree

ENV_TREE = "HOPS_REBASELINE_TREE"  # set for the judging interpreter: the tree the parent applied
ENV_KEEP = "HOPS_REBASELINE_KEEP"  # and the user's untracked files it found (JSON list): never part of the tree


def member_record(n: int) -> dict:
    """A closed iteration whose diff was kept: parked, reverted or blocked, with its patch on disk."""
    rec = ledger.latest_records().get(n)
    if rec is None:
        raise stack.StackError(f"iteration {n} is not in {ledger.iterations_path().name}")
    if rec.get("outcome") not in ("parked", "reverted", "blocked"):
        raise stack.StackError(f"iteration {n} is {rec.get('outcome')}: a re-baseline admits a parked, reverted or "
                               f"blocked iteration's kept patch")
    if not rec.get("patch") or not stack.patch_file(rec).is_file():
        raise stack.StackError(f"iteration {n}: its patch {rec.get('patch')!r} is missing under {ledger.state_dir()}")
    return rec


def parse_explanations(items) -> dict[str, str]:
    out = {}
    for item in items or []:
        fid, sep, text = item.partition("=")
        if not sep or not fid.strip() or not text.strip():
            raise HopsError(f"--explain {item[:60]!r}: expected FIXTURE_ID=the physical explanation")
        out[fid.strip()] = text.strip()
    return out


BEST = {"mape": 0.0, "bubble_mae_pp": 0.0, "rho_mean": 1.0}  # a metric at its best cannot improve: holding counts


def compare_aggregates(before: dict, after: dict, variants, *, strict: bool, allowed: dict | None = None,
                       eps: float = 1e-6) -> list[str]:
    """Why `after` fails against `before`: strict = each metric must improve; else each may worsen by `allowed`."""
    out = []
    for v in variants:
        for metric, sign, label in stack.AGGREGATE_RULES:
            a, b = (before.get(v) or {}).get(metric), (after.get(v) or {}).get(metric)
            if a is None or b is None or math.isnan(a):
                continue
            d = sign * (b - a)
            if math.isnan(b):
                out.append(f"{v} {label} became NaN")
            elif strict and d >= -eps and not abs(b - BEST[metric]) <= eps:
                out.append(f"{v} {label} {a:.3f} -> {b:.3f} does not improve")
            elif not strict and d > (allowed or {}).get(metric, 0.0) + eps:
                limit = (allowed or {}).get(metric, 0.0)
                out.append(f"{v} {label} {a:.3f} -> {b:.3f} worsens" + (f" by more than {limit:.2f}" if limit else ""))
    return out


def verdict(splits: dict, floor: dict, per_fixture: dict, others: list[str], explain: dict, variants,
            diagnostic: str) -> list[str]:
    """Every reason the re-baseline is refused (empty: it lands). `splits`: name -> (before, after) aggregates."""
    out = [f"train: {x}" for x in compare_aggregates(*splits["train"], variants, strict=True)]
    out += [f"archive: {x}" for x in compare_aggregates(*splits["archive"], variants, strict=False)]
    if not floor:
        out.append("no noise floor measured (no archive run pairs with a train run): the diagnostic rule cannot "
                   "be judged")
    else:
        out += [f"{diagnostic}: {x}" for x in compare_aggregates(*splits[diagnostic], variants, strict=False,
                                                                  allowed=floor)]
    out += [f"gate: {v}" for v in others]
    out += [f"{fid}: a per-fixture violation remains without an explanation (--explain {fid}=...)"
            for fid in sorted(per_fixture) if fid not in explain]
    out += [f"--explain {fid}: not a fixture with a remaining violation" for fid in sorted(explain)
            if fid not in per_fixture]
    return out


def start(args) -> int:
    """In the calling process: check, apply the members' patches, and judge in a fresh interpreter."""
    reason = (args.confirm_human or "").strip()
    if not reason:
        raise HopsError("rebaseline rewrites the golden file outside the gate's per-fixture rule: it runs only as a "
                        "recorded human decision, --confirm-human \"REASON\" (cite the evidence)")
    ons = stack.parse_on(args.on)
    parse_explanations(args.explain)
    if not worktree.owns_tree():
        raise HopsError(f"rebaseline applies patches to the working tree, but the calibration state "
                        f"({ledger.state_dir()}) is not in this repository; unset HOPS_AUTORESEARCH_STATE")
    book = ledger.Ledger()
    with ledger.state_lock():
        from .iteration_runs import refuse_if_open, replay_unfinished

        replay_unfinished(book)
        refuse_if_open(book)  # here, or in another MLflow ledger of this state
        users = worktree.untracked()  # the user's, not the members': left where they are
        if worktree.snapshot(users) != worktree.head_tree():
            raise HopsError("rebaseline applies the members' patches to the working tree, which has uncommitted "
                            "changes: commit or stash them first")
        patches = [stack.patch_file(member_record(n)) for n in ons]
        tree = worktree.stacked(patches)  # refuses a patch that does not apply, before the tree changes
        worktree.apply(patches)
    cmd = [sys.executable, "-m", "autoresearch", "rebaseline", "--on", ",".join(map(str, ons)),
           "--confirm-human", reason, "--jobs", str(args.jobs)]
    cmd += ["--fixtures", args.fixtures] if args.fixtures else []
    for item in args.explain or []:
        cmd += ["--explain", item]
    proc = subprocess.run(cmd, env={**os.environ, ENV_TREE: tree, ENV_KEEP: json.dumps(users)})
    if proc.returncode != 0 and worktree.snapshot(users) == tree:
        worktree.restore(tree)  # refused or failed: the tree goes back to HEAD, as it was
        print("rebaseline: working tree restored to HEAD", file=sys.stderr)
    return proc.returncode


def judge(args) -> int:
    """In the fresh interpreter: gate v3 on train, archive and diagnostic against HEAD, then land or refuse."""
    from .iteration_runs import close_effect, close_record, log_gate, replay_unfinished
    from .gate import build_golden, golden_text, render, run_gate
    from .journal import run as transact
    from .validate import validate

    tree, reason = os.environ.pop(ENV_TREE), args.confirm_human.strip()
    users = json.loads(os.environ.pop(ENV_KEEP, "[]"))
    ons = stack.parse_on(args.on)
    explain = parse_explanations(args.explain)
    book = ledger.Ledger()
    with ledger.state_lock():
        replay_unfinished(book)
        if worktree.snapshot(users) != tree:
            raise HopsError("the working tree changed while the re-baseline was being judged; start again")
        records = {n: member_record(n) for n in ons}
        result = run_gate(root=args.fixtures, jobs=args.jobs)
        cfg, golden = result.cfg, result.golden
        print(render(result))
        variants = cfg.gated_variants
        print("scoring HEAD's model on archive and diagnostic (the before of the re-baseline) ...", file=sys.stderr)
        head = worktree.head_tree()
        before = {s: stack.evaluate_tree(head, root=args.fixtures, variants=variants, split=s, jobs=args.jobs)
                  for s in ("archive", cfg.diagnostic_split)}
        after = {"archive": validate("archive", root=args.fixtures, variants=variants, jobs=args.jobs).aggregates(),
                 cfg.diagnostic_split: result.diagnostic.aggregates() if result.diagnostic is not None else {}}
        noise = result.noise
        floor = ({"mape": noise.throughput_pct_mean, "bubble_mae_pp": noise.bubble_pp_mean}
                 if noise is not None and noise.pairs else {})
        train_before = {v: golden["aggregates"][v] for v in variants}
        train_after = {v: {m: now for m, (_, now) in per.items()} for v, per in result.comparison.aggregates.items()}
        per_fixture = result.comparison.fixture_violations
        others = [v for v in result.violations if not any(v in lines for lines in per_fixture.values())]
        refusals = verdict({"train": (train_before, train_after),
                            **{s: (before[s], after[s]) for s in before}}, floor, per_fixture, others, explain,
                           variants, cfg.diagnostic_split)
        print(summary(train_before, train_after, before, after, floor, variants, cfg.diagnostic_split))
        if refusals:
            print("rebaseline refused:\n" + "\n".join(f"  - {r}" for r in refusals))
            log_gate(result, "rebaseline", book)
            return 1
        prov = ledger.provenance(cfg.split, variants)
        n = book.next_iteration()
        title = f"re-baseline: land {' + '.join(f'it{k}' for k in ons)}"
        run = book.start_run(ledger.CALIBRATION, f"it{n} iteration: {title}", run_type="iteration", params=prov,
                             tags={"iteration": n, "outcome": "open", "opened": ledger.now(), "title": title,
                                   "hypothesis": f"re-baseline (human decision): {reason}",
                                   "change_site": f"autoresearch/golden/{cfg.split}.json",
                                   "expected_effect": "every gated train aggregate improves; archive holds; "
                                                      "diagnostic within the noise floor",
                                   "stack_on": ",".join(map(str, ons))})
        ledger.mark_open(n, run, book.uri)
        log_gate(result, "rebaseline", book, book.get_run(run))
        iteration = book.get_run(run)
        new = build_golden(result.report, cfg, catalog=result.catalog, iteration=n, prov=prov)
        members = [stack.Member(k, records[k].get("title", ""), stack.patch_file(records[k]), records[k])
                   for k in ons]
        steps = stack.cumulative(members, golden, new["aggregates"], root=args.fixtures, variants=variants,
                                 jobs=args.jobs, split=cfg.split)
        explained = [f"{line} — {explain[fid]}" for fid, lines in sorted(per_fixture.items()) for line in lines]
        effects = [{"kind": "write", "path": f"golden/{cfg.split}.json", "text": golden_text(new)}]
        for k, (b, a) in zip(ons, steps):
            rec = {**records[k], "outcome": "rebaselined", "closed": ledger.now(), "before": b, "after": a,
                   "reason": f"landed by the re-baseline of iteration {n}: {reason}",
                   "previous_outcome": records[k].get("outcome"), "landed_with": n, "stack": ons,
                   **{key: prov[key] for key in ("git_commit", "git_diff_hash", "model_fingerprint")}}
            effects += [{"kind": "append", "record": rec}, close_effect(rec, "rebaselined")]
        rec = close_record(iteration, "rebaselined", after=new["aggregates"], before=train_before, prov=prov,
                           regressions=explained, reason=reason, stack=ons,
                           splits={s: {"before": before[s], "after": after[s]} for s in before}, noise_floor=floor)
        effects += [{"kind": "append", "record": rec}, close_effect(rec, "rebaselined"), {"kind": "log"}]
        transact("rebaseline", effects, summary=f"iteration {n} re-baselined", book=book)
    print(f"re-baselined as iteration {n}: {ledger.state_dir() / 'golden' / (cfg.split + '.json')} rewritten; "
          f"{ledger.iterations_path().name} and LOG.md updated. Commit them with the tree.")
    return 0


def summary(train_before, train_after, before, after, floor, variants, diagnostic) -> str:
    lines = ["re-baseline evidence (before = golden / HEAD's model, after = this tree):",
             f"{'split':<11} {'variant':<16} {'MAPE %':>16} {'bubble MAE pp':>16} {'rho':>14}"]
    for split, b, a in (("train", train_before, train_after), ("archive", before["archive"], after["archive"]),
                        (diagnostic, before[diagnostic], after[diagnostic])):
        for v in variants:
            cells = [f"{(b.get(v) or {}).get(m, math.nan):.2f} -> {(a.get(v) or {}).get(m, math.nan):.2f}"
                     for m in ("mape", "bubble_mae_pp", "rho_mean")]
            lines.append(f"{split:<11} {v:<16} {cells[0]:>16} {cells[1]:>16} {cells[2]:>14}")
    if floor:
        lines.append(f"noise floor (mean run-to-run spread): {floor['mape']:.2f} % throughput, "
                     f"{floor['bubble_mae_pp']:.2f} pp bubble: the most a {diagnostic} aggregate may worsen")
    return "\n".join(lines)
