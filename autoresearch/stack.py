"""Stacked iterations: parked patches, the trees they build, and the rule that nothing rides along.

When two missing terms cancel on some fixture, either correction alone fails
that fixture's check although both are right. Such an iteration is parked (its
diff kept as a patch), and later iterations open on top of it
(`propose --on N`). The stacked tree faces the full, unchanged gate. When it
passes, every member lands as its own iteration, measured cumulatively in
stack order: member i's "before" is the tree with the members below it, its
"after" the tree with it added. Each member must improve at least one gated
aggregate on its own and worsen none, so a stack cannot carry a passenger.

Trees other than the working tree are scored in a subprocess on an exported
copy (`git archive` + `git apply`), because a running process has already
imported the working tree's model code.
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from hops.errors import HopsError

from . import ledger, worktree
from .iteration_runs import untracked_at_open
from .scoring import aggregate

MAX_MEMBERS = 4
AGGREGATE_RULES = (("mape", 1, "MAPE"), ("bubble_mae_pp", 1, "bubble MAE"), ("rho_mean", -1, "rho"))


class StackError(HopsError):
    """A stack cannot be built or landed as asked (message names the iteration and the rule)."""


@dataclass(frozen=True)
class Member:
    iteration: int
    title: str
    patch: Path | None  # None: the open iteration on top, whose change is the working tree
    record: dict | None


def parse_on(text: str) -> list[int]:
    try:
        out = [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise StackError(f"--on {text!r}: expected iteration numbers like 4 or 4,5") from None
    if not out:
        raise StackError("--on needs at least one parked iteration number")
    return out


def patch_file(rec: dict) -> Path:
    return ledger.state_dir() / rec["patch"]


def parked(n: int) -> dict:
    rec = ledger.latest_records().get(n)
    if rec is None:
        raise StackError(f"iteration {n} is not in {ledger.iterations_path().name}")
    if rec.get("outcome") != "parked":
        raise StackError(f"iteration {n} is {rec.get('outcome')}, not parked: only parked iterations can be "
                         f"stacked on")
    if not rec.get("patch") or not patch_file(rec).is_file():
        raise StackError(f"iteration {n}: its patch {rec.get('patch')!r} is missing under {ledger.state_dir()}")
    return rec


def expand(ons: list[int]) -> list[int]:
    """The parked iterations named, each preceded by the ones it was parked on, bottom first, no repeats."""
    out: list[int] = []

    def visit(n: int, path: tuple[int, ...]) -> None:
        if n in path:
            raise StackError(f"iteration {n} is stacked on itself ({' -> '.join(map(str, path + (n,)))})")
        for below in parked(n).get("stack_on") or []:
            visit(int(below), path + (n,))
        if n not in out:
            out.append(n)

    for n in ons:
        visit(n, ())
    return out


def check_size(n_members: int) -> None:
    if n_members > MAX_MEMBERS:
        raise StackError(f"a stack has at most {MAX_MEMBERS} members; this one would have {n_members}")


def members(run) -> list[Member]:
    """The stack under an open iteration, bottom first, plus the open iteration itself when it changes anything."""
    t = run.data.tags
    below = [int(x) for x in (t.get("stack_on") or "").split(",") if x]
    out = [Member(n, (rec := parked(n)).get("title") or rec.get("hypothesis", "")[:60], patch_file(rec), rec)
           for n in below]
    if own_diff(below, untracked_at_open(run)):
        out.append(Member(int(t["iteration"]), t.get("title") or t.get("hypothesis", "")[:60], None, None))
    return out


def base_tree(stack_on: list[int]) -> str:
    return worktree.stacked([patch_file(parked(n)) for n in stack_on]) if stack_on else worktree.head_tree()


def own_diff(stack_on: list[int], keep_out=()) -> str:
    """The open iteration's change alone: the working tree (but `keep_out`) minus HEAD and the patches under it."""
    return worktree.diff(base_tree(stack_on), worktree.snapshot(keep_out))


# --------------------------------------------------------------------------- scoring other trees
def aggregates_on(rows: list[dict], ids, variants) -> dict:
    df = pd.DataFrame(rows)
    df = df[df["id"].isin(list(ids))] if ids is not None else df
    return {v: aggregate(df[df["variant"] == v]) for v in variants}


def evaluate_tree(tree: str, *, root, variants, ids=None, split: str = "train", jobs: int = 1) -> dict:
    """Aggregates of `variants` on `split` for the model in git tree `tree` (scored in a subprocess)."""
    from .fixtures import resolve_root

    root = Path(resolve_root(root)).resolve()  # the subprocess runs in another directory
    with tempfile.TemporaryDirectory(prefix="hops-stack-") as tmp:
        src = worktree.export(tree, Path(tmp) / "tree")
        out = Path(tmp) / "report.json"
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(src), os.environ.get("PYTHONPATH", "")]).rstrip(
            os.pathsep)}
        env.pop("HOPS_AUTORESEARCH_KILL_AT", None)
        cmd = [sys.executable, "-m", "autoresearch", "validate", "--split", split, "--variant", *variants,
               "--fixtures", str(root), "--jobs", str(jobs), "--json", str(out)]
        proc = subprocess.run(cmd, cwd=src, env=env, capture_output=True, timeout=3600)
        if proc.returncode != 0:
            err = proc.stderr.decode(errors="replace").strip().splitlines()
            raise StackError(f"scoring tree {tree[:12]} failed: {err[-1] if err else f'exit {proc.returncode}'}")
        doc = json.loads(out.read_text())
    rows = [{k: (math.nan if v is None else v) for k, v in r.items()} for r in doc["fixtures"]]
    return aggregates_on(rows, ids, variants)


def rule_violation(before: dict, after: dict, variants, eps: float) -> str | None:
    """None when `after` improves at least one gated aggregate over `before` and worsens none."""
    better, worse = [], []
    for v in variants:
        for metric, sign, label in AGGREGATE_RULES:
            a, b = (before.get(v) or {}).get(metric), (after.get(v) or {}).get(metric)
            if a is None or b is None or math.isnan(a) or math.isnan(b):
                continue
            d = sign * (b - a)
            if d < -eps:
                better.append(f"{v} {label} {a:.3f} -> {b:.3f}")
            elif d > eps:
                worse.append(f"{v} {label} {a:.3f} -> {b:.3f}")
    if worse:
        return "worsens " + ", ".join(worse)
    if not better:
        return "improves no gated aggregate (MAPE, bubble MAE or rho of " + " or ".join(variants) + ")"
    return None


def cumulative(stack: list[Member], golden: dict, final: dict, *, root, variants, jobs: int, split: str
               ) -> list[tuple[dict, dict]]:
    """(before, after) per member in stack order: golden, then each prefix of the stack, then `final`."""
    ids = sorted(golden["fixtures"])
    steps = [{v: golden["aggregates"][v] for v in variants if v in golden["aggregates"]}]
    patches = [m.patch for m in stack if m.patch is not None]
    for i in range(1, len(stack)):
        steps.append(evaluate_tree(worktree.stacked(patches[:i]), root=root, variants=variants, ids=ids,
                                   split=split, jobs=jobs))
    steps.append(final)
    return [(steps[i], steps[i + 1]) for i in range(len(stack))]
