"""Finding fixtures: the root, the splits, and the groups a fixture is scored in.

Every autoresearch command that reads fixtures goes through `list_fixtures`, so
the held-out split guard is enforced before anything is read (plus the
importer's own checks in ``hops.traces`` for code that bypasses this module).
A Fixture carries the checkpoint token it was listed with, if any, and every
read it makes (scenario, trace, link benchmark) presents it to the guard, so a
Fixture built by hand for a test-split directory refuses to read it.
"""
from __future__ import annotations

import difflib
import os
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import yaml

from hops.errors import HopsError
from hops.traces.guard import CheckpointToken, SplitGuardError, check_path, check_split

__all__ = ["Fixture", "FixtureError", "SplitGuardError", "CheckpointToken", "resolve_root", "list_fixtures",
           "SPLITS", "DEVICE_FAMILIES"]

SPLITS = ("train", "diagnostic", "archive")
DEVICE_FAMILIES = ("h100", "a10g", "l4", "g_family", "mixed")
SCENARIO_FILE = "hops.base.yaml"


class FixtureError(HopsError, LookupError):
    """The fixture root, a split or a fixture id the user named does not exist."""


def resolve_root(cli_value: str | os.PathLike | None) -> Path:
    """--fixtures, else $HOPS_FIXTURES, else ./fixtures; a missing directory is one clear line."""
    if cli_value:
        raw, origin = str(cli_value), "--fixtures"
    elif os.environ.get("HOPS_FIXTURES"):
        raw, origin = os.environ["HOPS_FIXTURES"], "HOPS_FIXTURES"
    else:
        raw, origin = "fixtures", "default ./fixtures"
    root = Path(raw).expanduser()
    if not root.is_dir():
        raise FixtureError(f"fixture root {raw} ({origin}) is not a directory; pass --fixtures ROOT or set "
                           f"HOPS_FIXTURES (layout: ROOT/<split>/cluster_results/<id>/)")
    return root


@dataclass(frozen=True)
class Fixture:
    """One measured run. Group labels come from its scenario, never from its trace."""

    id: str
    split: str
    path: Path
    token: CheckpointToken | None = field(default=None, compare=False, repr=False)

    @property
    def scenario_path(self) -> Path:
        return self.path / SCENARIO_FILE

    @cached_property
    def scenario_doc(self) -> dict:
        check_path(self.scenario_path, self.token)
        try:
            doc = yaml.safe_load(self.scenario_path.read_text())
        except yaml.YAMLError as exc:  # one line: where, and what the parser expected
            mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
            where = f": line {mark.line + 1}" if mark else ""
            raise FixtureError(f"{self.scenario_path}{where}: invalid YAML "
                               f"({getattr(exc, 'problem', None) or ' '.join(str(exc).split())})") from None
        except (OSError, UnicodeDecodeError) as exc:  # UnicodeDecodeError: not UTF-8
            raise FixtureError(f"{self.scenario_path}: cannot read scenario ({exc})") from None
        if not isinstance(doc, dict):
            raise FixtureError(f"{self.scenario_path}: expected a scenario mapping")
        return doc

    @cached_property
    def stage_gpus(self) -> tuple[str, ...]:
        doc = self.scenario_doc
        gpu_of = {d["id"]: str(d["gpu"]).lower() for d in doc.get("hardware", {}).get("devices", [])}
        return tuple(gpu_of.get(st.get("device"), "?") for st in doc.get("pipeline", {}).get("stages", []))

    @property
    def device_family(self) -> str:
        """h100 / a10g / l4 when the pipeline uses one GPU type, g_family for A10G+L4, mixed otherwise."""
        kinds = set(self.stage_gpus)
        if len(kinds) == 1:
            return next(iter(kinds))
        if kinds == {"a10g", "l4"}:
            return "g_family"
        return "mixed"

    @property
    def schedule(self) -> str:
        return str(self.scenario_doc.get("pipeline", {}).get("schedule", "1f1b"))

    @property
    def depth(self) -> int:
        return len(self.stage_gpus)

    @property
    def microbatches(self) -> int:
        return int(self.scenario_doc.get("simulation", {}).get("microbatches", 0))

    def check_trace_layout(self, stage_devices, microbatches_per_iteration: int) -> None:
        """The scenario describes the run its trace measured: same stages on the same devices, same microbatches.

        A disagreement would still score (a rate needs no equal counts, a rank
        correlation of unequal lists is just NaN), silently, and mean nothing.
        """
        declared = tuple(str(st.get("device")) for st in self.scenario_doc.get("pipeline", {}).get("stages", []))
        if len(declared) != len(stage_devices):
            raise FixtureError(f"{self.scenario_path}: pipeline.stages has {len(declared)} stages but the trace "
                               f"(hops_trace_map.json) has {len(stage_devices)}, expected them to agree")
        for s, (mine, theirs) in enumerate(zip(declared, stage_devices)):
            if mine != theirs:
                raise FixtureError(f"{self.scenario_path}: pipeline.stages[{s}].device is {mine!r} but the trace "
                                   f"ran stage {s} on {theirs!r}, expected them to agree")
        if self.microbatches != microbatches_per_iteration:
            raise FixtureError(f"{self.scenario_path}: simulation.microbatches is {self.microbatches} but the "
                               f"trace has {microbatches_per_iteration} per iteration, expected them to agree")

    def groups(self) -> dict[str, str]:
        """The group breakdowns the suite reports, as string labels (JSON keys)."""
        return {"device_family": self.device_family, "schedule": self.schedule,
                "pipeline_depth": str(self.depth), "microbatches": str(self.microbatches)}


def list_fixtures(root: str | os.PathLike, split: str, ids=None, *, token: CheckpointToken | None = None
                  ) -> list[Fixture]:
    """Fixtures of one split in id order, optionally only `ids` (all must exist).

    The held-out split raises SplitGuardError before the filesystem is touched,
    so not even the fixture names of the test split are read.
    """
    check_split(split, token)
    if not split or split in (".", "..") or "/" in split or "\\" in split:
        raise FixtureError(f"split {split!r}: expected a plain split name ({', '.join(SPLITS)})")
    base = Path(root) / split / "cluster_results"
    check_path(base, token)  # a split directory that is a symlink into the held-out split
    if not base.is_dir():
        present = sorted(p.name for p in Path(root).iterdir() if (p / "cluster_results").is_dir()) \
            if Path(root).is_dir() else []
        present = [p for p in present if p not in ("test",)]
        where = ", ".join(present) if present else (
            "none; point --fixtures ROOT or HOPS_FIXTURES at the fixture data, ROOT/<split>/cluster_results/<id>/")
        raise FixtureError(f"split {split!r} not found: {base} is not a directory (splits under {root}: {where})")
    found, broken = {}, {}
    for p in sorted(base.iterdir()):
        if p.name.startswith("."):
            continue  # editor and OS droppings (.DS_Store, .ipynb_checkpoints), never fixtures
        check_path(p, token)  # a fixture that is a symlink into the held-out split
        if not p.is_dir():
            broken[p.name] = f"{p}: not a fixture directory, expected {base}/<id>/{SCENARIO_FILE}"
        elif not (p / SCENARIO_FILE).is_file():
            broken[p.name] = f"{p}: no {SCENARIO_FILE}, expected every fixture directory to have its scenario"
        else:
            found[p.name] = Fixture(p.name, split, p, token)
    if ids is None and broken:  # the whole split was asked for: a fixture left out would change the suite
        raise FixtureError(next(iter(broken.values())))
    if ids is None:
        if not found:  # an empty split would score as a perfect (vacuous) suite
            raise FixtureError(f"split {split!r} has no fixtures: no {base}/<id>/{SCENARIO_FILE}")
        return list(found.values())
    wanted = list(dict.fromkeys(ids))
    for i in wanted:
        if i in broken:
            raise FixtureError(broken[i])
    missing = [i for i in wanted if i not in found]
    if missing:
        hint = difflib.get_close_matches(missing[0], list(found), n=1)
        raise FixtureError(f"unknown fixture id {missing[0]!r} in split {split!r}"
                           + (f"; did you mean {hint[0]!r}?" if hint else f" ({len(found)} fixtures there)"))
    return [found[i] for i in wanted]
