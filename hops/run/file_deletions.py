"""`~pipeline.host_overhead` on a scenario_file= run: a deletion from the file, not from conf/.

Hydra applies a deletion to the config it composes from conf/ and refuses one whose key is null
or absent there ("Could not delete from config"), which is every optional key: the defaults
hold `host_overhead: null`. A scenario_file= run takes its sections from the file, so such a
deletion is handed to Hydra as `++scenario_file_delete.<key>=true`, which composes whatever
conf/ holds, keeps its place among the other overrides (.hydra/overrides.yaml), and is
replayed as `~<key>` onto the file (hops.run.app.apply_section_overrides). The sweep table,
the job lines and MLflow show it as the user typed it.
"""
from __future__ import annotations

PREFIX = "scenario_file_delete."


def for_hydra(argv: list[str], sections: tuple[str, ...]) -> list[str]:
    """The command line with a scenario_file= run's section deletions rewritten for Hydra."""
    if not any(a.lstrip("+").startswith("scenario_file=") for a in argv):
        return argv
    out = []
    for a in argv:
        key = a[1:]
        if a.startswith("~") and "=" not in key and "." in key and key.split(".", 1)[0] in sections:
            a = f"++{PREFIX}{key}=true"
        out.append(a)
    return out


def deleted_key(override_key: str) -> str | None:
    """`scenario_file_delete.pipeline.x` -> `pipeline.x`; None for any other key."""
    return override_key.removeprefix(PREFIX) if override_key.startswith(PREFIX) else None


def as_typed(override: str) -> str:
    """An override as the user typed it (`~pipeline.x` for its rewritten form)."""
    key = deleted_key(override.lstrip("+").partition("=")[0])
    return f"~{key}" if key is not None else override
