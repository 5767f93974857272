"""`python -m autoresearch <command>`: the calibration loop's command line.

Commands plug in without editing this file: if a module `autoresearch.commands`
exists, its `add_commands(subparsers)` is called. A command's parser sets
`func=handler`; the handler returns an exit code and raises a HopsError for a
user mistake, which is printed here as one line with exit code 2 (no traceback:
the message already says what was wrong and what was expected).
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys

from hops.errors import HopsError

from .cli_args import at_least


class OneLineParser(argparse.ArgumentParser):
    """Usage errors as a single line, like every other user error of this CLI."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def _add_validate(subparsers) -> None:
    p = subparsers.add_parser(
        "validate", help="score the prediction variants against the measured fixtures of a split",
        description="Score spec / link_calibrated / replay predictions against every fixture of a split "
                    "(definitions: autoresearch/README.md).")
    p.add_argument("--split", required=True, metavar="{train,diagnostic,archive}",
                   help="fixture split to score (the test split is held out)")
    p.add_argument("--variant", action="extend", nargs="+", metavar="NAME",
                   help="variants to run: spec, link_calibrated, replay (default: all)")
    p.add_argument("--fixture", action="extend", nargs="+", metavar="ID", help="only these fixture ids")
    p.add_argument("--fixtures", metavar="ROOT", help="fixture root (default: $HOPS_FIXTURES, else ./fixtures)")
    p.add_argument("--json", metavar="PATH", help="also write the machine-readable report here")
    p.add_argument("--jobs", type=at_least(0), default=1, metavar="N",
                   help="worker processes (default 1; 0 = all cores)")
    p.add_argument("--set", action="extend", nargs="+", default=None, metavar="KEY=VALUE",
                   help="catalog what-if without editing files, e.g. stacks.fixture_megatron.k_floor_ms.l4=1.2 or "
                        "devices.a10g.memory_bandwidth_gbps=500")
    p.add_argument("--seed", type=int, default=None, help="simulation seed for all variants (default: scenario's)")
    p.set_defaults(func=_run_validate)


def _run_validate(args) -> int:
    from .validate import validate

    report = validate(args.split, root=args.fixtures, variants=args.variant, ids=args.fixture,
                      overrides=args.set, jobs=args.jobs, progress=sys.stderr.isatty(), seed=args.seed)
    if args.json:
        try:
            report.to_json(args.json)
        except OSError as exc:
            raise HopsError(f"--json {args.json}: cannot write ({exc.strerror or exc})") from None
    print(report.text())
    from .ledger import log_evaluation

    log_evaluation(report, "validate", overrides=args.set)  # after printing: a ledger failure loses no result
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="python -m autoresearch", description=__doc__.splitlines()[0])
    parser.add_argument("--state", metavar="DIR", help="state directory (golden/, iterations.jsonl, ...; default: "
                        "$HOPS_AUTORESEARCH_STATE, else the checkout's autoresearch/); may follow the command too")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    _add_validate(sub)
    try:
        plugins = importlib.import_module("autoresearch.commands")
    except ModuleNotFoundError as exc:
        if exc.name != "autoresearch.commands":
            raise  # the plug-in exists but is broken: that is a bug to see, not to hide
    else:
        plugins.add_commands(sub)
    return parser


def _pop_state(argv: list[str]) -> tuple[list[str], str | None]:
    """`--state DIR` is global: accept it before or after the command."""
    for i, a in enumerate(argv):
        if a == "--state" and i + 1 < len(argv):
            return argv[:i] + argv[i + 2:], argv[i + 1]
        if a.startswith("--state="):
            return argv[:i] + argv[i + 1:], a.split("=", 1)[1]
    return argv, None


def main(argv=None) -> int:
    parser = build_parser()
    argv, state_arg = _pop_state(list(sys.argv[1:] if argv is None else argv))
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return 2
    from . import state

    saved = os.environ.get(state.ENV)
    try:
        if state_arg is not None:
            state.use(state_arg)
        return int(args.func(args) or 0)
    except HopsError as exc:
        print(f"autoresearch {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    finally:  # in-process callers (tests) get their environment back
        if saved is None:
            os.environ.pop(state.ENV, None)
        else:
            os.environ[state.ENV] = saved


if __name__ == "__main__":
    raise SystemExit(main())
