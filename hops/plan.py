"""`hops plan REQUEST.yaml` (or `python -m hops.plan`): the 3D planner from the command line.

A request names the model (as a scenario's `pipeline.model`), the inventory (pools of
identical nodes) and the batch; the planner (hops.planner.Planner3D) prints its best plans
with their simulated throughput, cost per sample when the pools are priced, the uniform
split of the best plan's stages and the best plan on each GPU type alone, and with
`--scenario FILE` writes the best plan as a scenario of one replica to simulate or edit.
Example: docs/plans/llama2_70b_mixed.yaml. A bad request ends with one line on stderr and
exit code 2.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import yaml

from hops.errors import EXIT_INTERRUPTED, HopsError


def read_request(path: Path):
    """(model mapping, pools, training section) of a request file, checked field by field."""
    from hops.errors import ScenarioError
    from hops.planner import Pool
    from hops.scenario import kind_of
    from hops.schema import validate
    from hops.schema.document import read_yaml_file
    from hops.schema.plan import PlanRequestModel

    data = read_yaml_file(path)
    if not isinstance(data, dict):
        found = "the file is empty" if data is None else f"the file's top level is {kind_of(data)}"
        raise ScenarioError("request", f"{found}; expected a mapping with model, inventory and training", str(path))
    req = validate(data, str(path), PlanRequestModel)
    model = {k: v for k, v in req.model.model_dump().items() if v is not None}
    pools = [Pool(p.gpu, p.nodes, p.gpus_per_node, p.host, p.price_per_gpu_hour) for p in req.inventory]
    return model, pools, req.training


def _positive(text: str) -> int:
    """--top: an integer >= 1 (argparse's one-line error otherwise; 0 used to end in an IndexError)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {value}")
    return value


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="hops plan", description=__doc__.splitlines()[0])
    ap.add_argument("request", type=Path, help="a plan request YAML (model, inventory, training)")
    ap.add_argument("--top", type=_positive, default=3, help="plans to simulate (best estimates first)")
    ap.add_argument("--scenario", type=Path, help="write the best plan as a scenario YAML here")
    args = ap.parse_args(sys.argv[1:] if argv is None else argv)
    from hops.errors import ScenarioError
    from hops.planner import Planner3D

    try:
        if not args.request.is_file():
            raise ScenarioError("request", f"file not found: {args.request}")
        model, pools, tr = read_request(args.request)
        planner = Planner3D(model, pools, global_batch=tr.global_batch, micro_batch_size=tr.micro_batch_size,
                            stack=tr.stack, stack_options={k: v for k, v in tr.stack_options if v is not None},
                            sharding=tr.sharding, cross_node=tr.cross_node,
                            max_pipeline=tr.max_pipeline)
        result = planner.plan(schedules=tr.schedules, dp=tr.data_parallel, verify_top=args.top)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except HopsError as exc:
        if isinstance(exc, ScenarioError) and getattr(exc, "source", "") is None:  # the planner's own checks
            exc = ScenarioError(exc.path, str(exc).removeprefix(f"{exc.path}: "), str(args.request))
        print(f"error: {exc}", file=sys.stderr)
        return 2
    rows = [(f"plan {i + 1}", p) for i, p in enumerate(result.candidates)]
    rows.append(("uniform split", result.uniform))
    rows += [(f"only {name}", p) for name, p in result.single_type.items()]
    width = max(len(p.describe()) for _, p in rows)
    lines = [f"{result.configurations} configurations searched; simulated plans, best first:"]
    for label, p in rows:
        cost = p.cost_per_sample
        lines.append(f"  {label:<24} {p.describe():<{width}} {p.samples_per_s:9.3f} samples/s"
                     + ("" if cost is None else f"  cost/sample {cost:#.3g}")
                     + f"  peak/GPU {max(p.memory_mb) / 1000:.1f} GB" + ("  OVER CAPACITY" if p.over_capacity else ""))
    if args.scenario:
        try:
            args.scenario.write_text(yaml.safe_dump(planner.scenario(result.best, result.best.schedule),
                                                    sort_keys=False))
        except OSError as exc:
            print(f"error: --scenario {args.scenario}: cannot write ({exc.strerror or exc})", file=sys.stderr)
            return 2
        lines.append(f"best plan's scenario: {args.scenario}")
    try:
        print("\n".join(lines), flush=True)
    except BrokenPipeError:  # `hops plan REQUEST | head -1`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


if __name__ == "__main__":
    sys.exit(main())
