"""Regenerate the figures README.md shows, from real runs, so they cannot go stale.

    python docs/make_readme_assets.py            # rewrite README.md's generated blocks + docs/img/
    python docs/make_readme_assets.py --check    # exit 1 if README.md or the images are out of date

Each generated block in README.md sits between ``<!-- generated: NAME -->`` and
``<!-- end generated -->``; nothing outside those markers is touched. Blocks:

- ``sample-run``: what ``python -m hops.run`` prints for the default scenario (the output
  directory is shown as Hydra's default pattern, not this machine's timestamp);
- ``calibration``: the train-split aggregates of the committed golden file
  (autoresearch/golden/train.json), which `admit` rewrites, so the README quotes exactly
  what the gate holds the model to;
- ``crossval``: the cross-validation tables of docs/crossval/<by>.json, which
  ``python -m autoresearch crossval --by <by> --json docs/crossval/<by>.json`` writes (a few
  minutes on the fixtures, so the README quotes its committed output). Each records the model
  fingerprint it measured; a stale one (the model changed since) stops this script with the
  command to rerun.
- ``literature``: the published-vs-predicted table of ``python -m experiments.literature``.
- ``study``: the scheduling study's targets, runtime and provenance, from the
  experiments/hetero_scheduler/results_full.json that ``python -m experiments.hetero_scheduler``
  writes (about 20 minutes on 2 cores, so the README quotes its committed output);
- ``plan``: what ``hops plan docs/plans/llama2_70b_mixed.yaml`` prints (a few seconds), in
  README.md and in docs/parallelism.md, the other file with generated blocks.

The timeline image is rendered from the same default run.
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
PARALLELISM = REPO / "docs" / "parallelism.md"
PLAN_REQUEST = "docs/plans/llama2_70b_mixed.yaml"
IMAGE = REPO / "docs" / "img" / "hetero_pp4_timeline.png"
GOLDEN = REPO / "autoresearch" / "golden" / "train.json"
CROSSVAL = REPO / "docs" / "crossval"
CROSSVAL_FIT_SEEDS = 3  # the folds' refits are not unique: the tables give the ratio's range over these
CROSSVAL_BY = ("device", "gpu", "depth", "shape")
STUDY = REPO / "experiments" / "hetero_scheduler" / "results_full.json"
BLOCK = re.compile(r"(<!-- generated: (?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- end generated -->)", re.S)


def sample_run(tmp: Path) -> tuple[str, Path]:
    """The default run's printed summary, with its run directory shown as Hydra's pattern."""
    run_dir = tmp / "run"
    proc = subprocess.run([sys.executable, "-m", "hops.run", f"hydra.run.dir={run_dir}"], cwd=REPO,
                          capture_output=True, text=True, check=True)
    text = proc.stdout.replace(str(run_dir), "outputs/<date>/<time>")
    lines = [ln for ln in text.splitlines() if ln.strip()]
    keep = []
    for ln in lines:  # the summary, then the first output path and an ellipsis
        keep.append(ln)
        if ln.startswith("  outputs/"):
            keep.append("  ...")
            break
    return "```\n$ python -m hops.run\n" + "\n".join(keep) + "\n```\n", run_dir / "timeline.png"


def calibration() -> str:
    golden = json.loads(GOLDEN.read_text())
    adm = golden["admitted"]
    rows = ["| variant | MAPE of throughput | bubble MAE | mean rho (stage utilization) |", "|---|---|---|---|"]
    for variant in ("link_calibrated", "spec"):
        a = golden["aggregates"][variant]
        rows.append(f"| `{variant}` | {a['mape']:.2f} % | {a['bubble_mae_pp']:.2f} pp | {a['rho_mean']:.2f} |")
    head = (f"Train split ({golden['aggregates']['spec']['n']} fixtures), as held by the golden file "
            f"(iteration {adm['iteration']}, {adm['date'][:10]}):\n\n")
    return head + "\n".join(rows) + "\n"


def crossval() -> str:
    sys.path.insert(0, str(REPO))
    from autoresearch.ledger import model_fingerprint

    now = model_fingerprint()
    parts = []
    for by in CROSSVAL_BY:
        path = CROSSVAL / f"{by}.json"
        cmd = f"python -m autoresearch crossval --by {by} --fit-seeds {CROSSVAL_FIT_SEEDS} --json {path.relative_to(REPO)}"
        if not path.exists():
            raise SystemExit(f"{path.relative_to(REPO)} is missing: run {cmd}")
        doc = json.loads(path.read_text())
        if doc["model_fingerprint"] != now:
            raise SystemExit(f"{path.relative_to(REPO)} measured model {doc['model_fingerprint']}, the model is now "
                             f"{now}: run {cmd}")
        seeds = doc.get("fit_seeds", 1)
        spread = f" [range over {seeds} fit seeds]" if seeds > 1 else ""
        rows = ["| left out | fixtures | fitted on | variant | MAPE in → out | bubble MAE in → out | rho in → out "
                f"| stage F, BW error in → out | out / in{spread} |", "|---|---|---|---|---|---|---|---|---|"]
        for r in doc["rows"]:
            rho = " → ".join("n/a" if r[k] is None else f"{r[k]:.2f}" for k in ("in_rho", "out_rho"))
            flag = "" if r["target_met"] else " ✗"
            rows.append(f"| {r['group']} | {r['n']} | {r['fit_n']} | `{r['variant']}` | {r['in_mape']:.2f} → "
                        f"{r['out_mape']:.2f} % | {r['in_bubble_pp']:.2f} → {r['out_bubble_pp']:.2f} pp | {rho} | "
                        f"{r['phase_in_pct']:.1f} → {r['phase_out_pct']:.1f} % | "
                        f"{r['ratio']:.2f}x{flag}"
                        + (f" [{r['ratio_min']:.2f}-{r['ratio_max']:.2f}]" if seeds > 1 else "") + " |")
        verdict = "met" if doc["met"] else "not met (✗)"
        libs = ", ".join(f"{k} {v}" for k, v in doc.get("libraries", {}).items())
        parts.append(f"`{doc['command']}` ({doc['date'][:10]}, model {doc['model_fingerprint']}"
                     + (f"; {libs}" if libs else "") + "): target "
                     f"out / in ≤ {doc['target_ratio']:g} {verdict}.\n\n" + "\n".join(rows) + "\n")
    first = json.loads((CROSSVAL / f"{CROSSVAL_BY[0]}.json").read_text())
    consts = first["constants"]
    rows = ["| constant | committed | refit on all train |", "|---|---|---|"]
    rows += [f"| `{path}` | {c['committed']} | {c['all train']} |" for path, c in consts.items()]
    parts.append(f"The phase fit on all {first['all_train_fixtures']} train fixtures against the committed "
                 "constants (`*`: at a bound of search_space.yaml):\n\n" + "\n".join(rows) + "\n")
    return "\n".join(parts)


def literature() -> str:
    proc = subprocess.run([sys.executable, "-m", "experiments.literature", "--markdown"], cwd=REPO,
                          capture_output=True, text=True, check=True)
    return proc.stdout


def plan() -> str:
    proc = subprocess.run([sys.executable, "-m", "hops.plan", PLAN_REQUEST], cwd=REPO,
                          capture_output=True, text=True, check=True)
    return f"```\n$ hops plan {PLAN_REQUEST}\n{proc.stdout}```\n"


def study() -> str:
    doc = json.loads(STUDY.read_text())
    rows = ["| configs | split cost | jitter | seeds | hetero_search vs zb_h1 (target ≥ +3 %) | worst vs the best "
            "barrier built-in within ZB-H1's memory (target ≥ -0.5 %) | regressions beyond 0.5 % | worst, regressions "
            "on seeds 101-103 only | hetero_search_pv: worst vs the best built-in within ZB-H1's memory, barrier or "
            "post-validated (target ≥ -0.5 %), regressions |", "|---|---|---|---|---|---|---|---|---|"]
    for key, t in doc["targets"].items():
        group, cost, jit = key.split("/")
        seeds, first = doc["seeds"][jit], doc["targets_first_seeds"].get(key)
        rows.append(f"| {group} | {cost} | {doc['jitter'][jit] * 100:g} % | {len(seeds)} | "
                    f"{t['mean_improvement_vs_zb_h1_pct']:+.2f} % | {t['worst_vs_best_builtin_pct']:+.2f} % | "
                    f"{t['regressions']} | " + (f"{first['worst_vs_best_builtin_pct']:+.2f} %, {first['regressions']}"
                                               if first else "(the same seeds)") + " | "
                    f"{t['pv_worst_vs_best_builtin_pct']:+.2f} %, {t['pv_regressions']} |")
    rt, prov = doc["runtime_s"], doc["provenance"]
    return (f"`python -m experiments.hetero_scheduler --jobs {rt['jobs']}`: {rt['total']:.0f} s wall "
            f"({rt['grid']:.0f} s grid), git {prov['git']}, hops code {prov['code_fingerprint']}"
            f"{'' if prov['stable'] else ' (hops/ changed during the run)'}.\n\n" + "\n".join(rows) + "\n")


def tp_groups() -> str:
    """docs/parallelism.md's TP-4 example: the scenario of tests/test_tensor_data_parallel.py's
    test_7b_on_two_stages_of_four_h100_against_two_stages_of_one, written out here, since a
    script does not import the tests."""
    sys.path.insert(0, str(REPO))
    import hops

    def doc(tp: int) -> dict:
        devices, stages = [], []
        for i in range(2):
            ids = [f"n{i}g{k}" for k in range(tp)]
            devices += [{"id": d, "gpu": "h100_sxm", "node": f"n{i}"} for d in ids]
            stages.append({**({"devices": ids} if tp > 1 else {"device": ids[0]}), "layers": 16})
        return {"simulation": {"microbatches": 4, "batches": 2, "micro_batch_size": 1},
                "pipeline": {"schedule": "1f1b", "stack": "megatron_core",
                             "model": {"layers": 32, "hidden_dim": 4096, "heads": 32, "seq_len": 4096,
                                       "vocab_size": 32000}, "stages": stages},
                "hardware": {"host": "dgx_h100", "devices": devices, "interconnect": {"cross_node": "infiniband"}},
                "optimizer": {"enabled": True}}

    one, four = hops.simulate(doc(1)).summary, hops.simulate(doc(4)).summary
    rows = ["| stage | forward 1 GPU (ms) | forward TP 4 (ms) | ratio | peak memory 1 GPU (GB) | peak per GPU, "
            "TP 4 (GB) | ratio |", "|---|---|---|---|---|---|---|"]
    for s in range(2):
        f1, f4 = one["stages"][s]["expected_ms"]["F"], four["stages"][s]["expected_ms"]["F"]
        m1, m4 = one["peak_memory_mb"][f"n{s}g0"] / 1e3, four["peak_memory_mb"][f"n{s}g0"] / 1e3
        rows.append(f"| {s} | {f1:.2f} | {f4:.2f} | {f4 / f1:.3f} | {m1:.1f} | {m4:.1f} | {m4 / m1:.3f} |")
    tp = four["stages"][0]
    return ("\n".join(rows) + "\n\nThe forward does not reach 0.25: on stage 0 its 2 x 16 NVLink all-reduces take "
            f"{tp['tensor_parallel']['exposed_collective_ms']['F']:.1f} ms of the {tp['expected_ms']['F']:.1f} ms, and "
            "the norms and dropouts stay whole without sequence parallelism. Throughput goes from "
            f"{one['throughput']['samples_per_s']:.2f} to {four['throughput']['samples_per_s']:.2f} samples/s.\n")


def fill(path: Path, blocks: dict[str, str]) -> str:
    """The file's text with each of `blocks` rewritten between its markers; every block must be there."""
    text = path.read_text()
    missing = set(blocks) - {m.group("name") for m in BLOCK.finditer(text)}
    if missing:
        raise SystemExit(f"{path.relative_to(REPO)}: no generated block named {', '.join(sorted(missing))}")
    return BLOCK.sub(lambda m: m.group(1) + blocks.get(m.group("name"), m.group("body")) + m.group(4), text)


def render(tmp: Path) -> tuple[dict[Path, str], bytes]:
    sample, png = sample_run(tmp)
    planned = plan()
    texts = {README: fill(README, {"sample-run": sample, "calibration": calibration(), "crossval": crossval(),
                                   "literature": literature(), "study": study(), "plan": planned}),
             PARALLELISM: fill(PARALLELISM, {"plan": planned, "tp-groups": tp_groups()})}
    return texts, png.read_bytes()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="only report whether README.md is up to date")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        texts, image = render(Path(tmp))
    wanted = {**{p: t.encode() for p, t in texts.items()}, IMAGE: image}
    if args.check:
        stale = [str(p.relative_to(REPO)) for p, new in wanted.items() if not p.exists() or p.read_bytes() != new]
        print("up to date" if not stale else "stale: " + ", ".join(stale))
        return 1 if stale else 0
    IMAGE.parent.mkdir(parents=True, exist_ok=True)
    for p, new in wanted.items():
        p.write_bytes(new)
    print("wrote " + ", ".join(str(p.relative_to(REPO)) for p in wanted))
    return 0


if __name__ == "__main__":
    sys.exit(main())
