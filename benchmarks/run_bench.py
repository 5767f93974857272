"""What a run costs around the simulation: `hops.run` end to end vs `hops.simulate`, per output.

Prints medians (and the ratio to the simulation) for:
- the cold start, in fresh processes loading compiled bytecode: `import hops`, the first
  `hops.simulate` (PP8 x 64) with the model fingerprint's disk cache and without it, and
  `python -m hops.run` end to end on the default scenario; against the 0.05-0.08 s issue 20
  quotes for the original HOPS (target: <= 3x) and a baseline of `import numpy, yaml` + a
  warm simulate (no checkout of the original HOPS is here to time);
- a small scenario's warm `hops.simulate` (PP8 x 64; target <= 10 ms), and the preset
  YAML parse it no longer repeats (libyaml vs pure Python, per-process catalog cache);
- a large one (PP64 x 1024, 4 iterations): simulate, each output writer (events.csv,
  trace.json, trace.json.gz, timeline.png, dashboard.png), and `python -m hops.run` end to
  end with and without plots (target: end to end <= 2x the simulation).

    python benchmarks/run_bench.py                   # both cases, 3 repeats
    python benchmarks/run_bench.py --small-only      # the quick one
    python benchmarks/run_bench.py --no-plots        # without the PNG writers
    python benchmarks/run_bench.py --large-only --repeats 5   # only PP64 x 1024, in 5 paired rounds
    python benchmarks/run_bench.py --stages 32 --microbatches 512 --batches 2

Measured 2026-12-03 on the shared 2-core dev box, other jobs running (load ~1.7), medians
of 3, `--no-plots`; wall s (ratio to the simulation), CPU ratio in brackets. Before: the
tree at 3e10860 (same script); after: the block writers (hops.outputs.text_columns).
                                      before                    after
  hops.simulate PP64 x 1024 x 4       6.88 s                    6.91 s
  write events.csv                    3.54 s  0.51x [0.49x]     0.95 s  0.14x [0.13x]
  write trace.json (207 MB)           6.50 s  0.94x [0.93x]     1.23 s  0.18x [0.17x]
  write trace.json.gz (28 MB)         8.39 s  1.22x [1.23x]     2.81 s  0.41x [0.38x]
  hops.run end to end, plots off     21.06 s  3.06x [3.09x]    11.44 s  1.66x [1.61x]
  ... plots off, trace.json.gz       22.88 s  3.32x [3.31x]    13.18 s  1.91x [1.92x]
  PP8 x 64 warm hops.simulate        11.95 ms                  10.76 ms
Re-measured later the same day, PP8 x 64 row only (issue 13: fewer lookups per engine event,
RNG streams made on first use, integer distinct values by a sort in hops.metrics, a cheaper
preset copy and model fingerprint), `--small-only` alternating the tree at 9045516 and the
changed one, 5 runs each, median of the 5 medians of 20: 7.82 ms before, 6.69 ms after
(load ~1.2, other jobs still running; an earlier quieter pair: 7.09 / 6.22 ms). While the
other jobs kept both cores busy (load ~3.3) single runs of either swung between 12.5 and
15.5 ms, more than the difference; alternating the two in one process then (200 calls
each) gave 8.27 / 7.19 ms.
Cold start re-measured 2026-12-04 (issue 20), `--cold-only`, alternating the tree at f48329d
(before) and this one (after: one validator per document, hops.schema.fields.section_defaults),
3 rounds each, medians of the rounds' medians of 5 fresh processes, compiled bytecode. Other
jobs loaded both cores (load 7.6-9.9), so wall times are 3-4x a quiet box's; the CPU times
(in brackets) are the comparison:
                                      before                  after
  first hops.simulate                 457 ms [121 ms]         335 ms [91 ms]
  import hops + first simulate       1066 ms [305 ms]         862 ms [251 ms]
An earlier alternation at load 4.7-6.8: first simulate [83] -> [67] ms CPU, import + first
[197] -> [179] ms CPU. On a quiet box (load 0.1, before, 02:57, hops compiled from source as
this box's PYTHONDONTWRITEBYTECODE=1 shells do): import numpy + yaml 136 ms, import hops
193 ms, first simulate 105 ms, warm 9.3 ms; compiled bytecode saves ~0.05-0.1 s of the import.
Against the 0.05-0.08 s quoted for the original HOPS: the first simulate is within 3x on a
quiet box, import + first simulate (~0.2-0.3 s quiet) is 2.5-6x. What is left is pydantic's
fixed cost (import ~45 ms, schema classes ~20 ms, the one validator ~20 ms, its plugin scan
through importlib.metadata ~15 ms), numpy.random (~14 ms) and numpy.ma (~9 ms; np.percentile
imports it), and the dataclasses hops creates at import (~15 ms); quiet-box estimates from
`python -X importtime` and step timings, not from this script.
PP64 x 1024 x 4 re-measured the same day (full run, --repeats 3, load 7.5-11; wall 3x CPU):
simulate 12.78 s [4.26 s]; hops.run end to end plots off 2.26x [1.91x], with
trace.json.gz 2.43x [2.04x], plots on 3.89x [3.72x]; then `--no-plots` (load 4-8): simulate
10.38 s [4.70 s], plots off 1.10x [1.52x], with trace.json.gz 1.67x [1.78x]. Plots miss
the 2x target: drawing timeline.png costs 0.70x and dashboard.png 0.41x of the simulation
(in process, warm), and a fresh process also imports matplotlib (~1 s CPU at that load).
Plots re-measured the same day (issue 20: a dense timeline of > 20,000 bars drawn as one image of
per-pixel busy shares; the dashboard's bars one collection per panel, its row labels texts),
alternating the tree at 958b7ca (before) and the changed one, two runs each, `--repeats 3`, load
1.3-2.2; ratios to the simulation (3.4-4.0 s), wall [CPU]:
                                      before                      after
  write timeline.png                  0.77x, 0.79x                0.17x, 0.17x
  write dashboard.png                 0.32x, 0.35x                0.21x, 0.18x
  hops.run end to end, plots off      1.59x, 1.62x                1.57x, 1.42x
  hops.run end to end, plots on       2.81x, 2.88x [2.82, 2.89]   2.21x, 1.89x [2.07, 2.01]
Two later full runs of the changed tree (load ~2): --repeats 5, plots on 2.04x [2.02x], timeline.png
0.18x, dashboard.png 0.20x; --repeats 3, plots on 2.34x [2.34x] (plots off 1.58x), timeline.png
0.16x, dashboard.png 0.20x. At the 2x line, not under it with a margin.
Since then the end-to-end runs come in rounds, each right after a simulate, and the median of
those paired ratios is printed with its range and each round's load (a ratio of two medians
taken minutes apart moved with the load). `--large-only --repeats 5`, 2026-12-04 09:19, no
change to hops since the table above, load 1.3-1.6: simulate 4.11 s, timeline.png 0.15x,
dashboard.png 0.18x; paired, median [min-max]: plots off 1.69x [1.52-1.82], with trace.json.gz
1.98x [1.67-2.09], plots on 2.14x [1.84-2.49].
Tried against it, alternating the trees, and not kept:
- the PNGs drawn by a second process (a spawned one-worker ProcessPoolExecutor, started before
  the simulation so matplotlib's import overlaps it, returning PNG bytes; commit 48c5d21, then
  reverted). It costs ~1 s more CPU (its interpreter and `import hops`, ~140 MB of Timeline
  pickled through a pipe, 0.5 s before the worker has it) and gained only while a core was idle,
  and not reliably then: whole runs 7.4-7.9 -> 6.9-7.1 s at load 0.6-1.3 (medians of 4), but
  7.9 -> 8.7 s at load 0.4-1.6, 7.1 -> 8.0 s at load 1.2-2.3, and in this script at load 2.2-2.4
  plots on 2.46x against 2.15x without it.
- threads (the PNGs in one, events.csv and the trace in the other) overlap only what releases
  the GIL (zlib, file writes, some numpy): the four writers in process 2.6 -> 2.1-2.3 s (load
  ~0.5), whole runs at load 1.2-2.3 7.4 s against 7.1 s (no gain measurable).
Kept since: the PNGs drawn by a forked child (hops.run.charts_alongside) while the run writes
its text files; fork shares the Timeline and the imported modules, so neither the pickling nor
the interpreter start of the spawned worker is paid. The last case below draws them in turn
(output.plots_alongside=false) in the same rounds. `--large-only --repeats 5`, 2026-12-04
11:55, load 0.8-1.2: simulate 3.48 s; paired, median [min-max]: plots off 1.71x [1.61-1.79],
plots on 1.88x [1.49-1.98], drawn in turn 2.09x [1.73-2.54]; alongside was the shorter in each
of the 5 rounds, at about 0.05x more CPU (1.94x against 1.93x, medians). Alternating the tree
before it (62a1f42) and after, `python -m hops.run` on this scenario with plots, 8 runs each at
load 0.4-1.0: 7.50 s -> 6.49 s wall (median; the child's run shorter in all 8 pairs), 7.59 ->
7.76 s CPU. Where the second core is busy the gain shrinks toward nothing (three earlier
`--repeats 5` runs at load 0.8-1.8 gave plots on 1.85x, 2.13x and, for the tree before, 2.16x).
Re-measured 2026-12-04 14:00, `--large-only --repeats 5` on the tree with pipeline.stack_options
and the fp32 rates (a merge of the stack's switches per lookup; no other change on this path),
load 1.0-1.2: simulate 4.12 s; paired: plots off 1.70x [1.65-1.96], plots on 2.01x
[1.84-2.13], drawn in turn 2.16x [2.06-2.36]; again at 14:28 (load 0.2 at the start, 1.0 at
the end): plots off 1.69x [1.68-1.79], plots on 2.08x [1.83-2.18], in turn 2.17x. Earlier that day on 8dccea3, `--repeats 3` at
load 0.6-0.8: plots off 1.61x [1.60-1.78], plots on 1.91x [1.77-1.92], in turn 2.15x. With
plots the run sits at the 2x line: of the child's ~2 s, matplotlib's import is 0.34 s and the
dashboard's 350-odd text draws at PP64 about half of its 0.9 s. `--cold-only` then: first
simulate 66 ms (cached fingerprint), import hops + first simulate 175 ms, warm simulate 6.5 ms.
Then the chart process forked before the simulation (it imports matplotlib while the run
simulates and is sent the Timeline's arrays through a memory file afterwards), 2026-12-04 17:05,
`--large-only --repeats 3`, the tree before (e14ce06) and after run one after the other while
another agent kept the box loaded (load 2.4-2.8, then 1.9-2.6): before, plots off 1.53x
[1.31-1.87], plots on 2.36x [1.42-2.39], in turn 2.41x [1.33-2.86]; after, plots off 1.65x
[1.59-1.73], plots on 1.86x [1.82-2.01], in turn 2.10x [2.07-2.16]. A second pair right after
(load 1.1-1.4, then ~1.0): before, plots off 1.72x [1.65-1.86], plots on 2.21x [2.04-2.49], in turn
2.39x; after, plots off 1.61x [1.60-1.68], plots on 1.71x [1.55-2.30], in turn 2.01x. Measured in one process
(/tmp scripts, not kept) before the change, the child's critical path was import 0.3 s + timeline
0.6-0.9 s + dashboard 0.7 s against the parent's 1.1-1.2 s of text writers. Tried and not kept:
PNG encode at zlib level 1 or as RGB (5-25 ms per chart: Pillow's per-row filter choice
dominates, not deflate), glibc's mmap threshold raised in the fresh child (no difference
beyond the noise).
"""
from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml
from scale_bench import scenario  # the same 1F1B H100 pipeline (benchmarks/ is on sys.path)

REPO = Path(__file__).resolve().parent.parent
# Measure this checkout's hops, as the `python -m hops.run` runs below do (cwd=REPO), even
# when an editable install points at another checkout.
sys.path.insert(0, str(REPO))

import hops  # noqa: E402
from hops.model.hardware import CATALOG_FILES, PRESET_DIR  # noqa: E402


def median_s(fn, repeats: int) -> float:
    return timed(fn, repeats)[0]


def timed(fn, repeats: int) -> tuple[float, float]:
    """Median wall time and median CPU time (this process and the children it waited for).

    On a shared machine the wall time swings with other jobs; the CPU time much less,
    so both are printed and the ratios can be checked against each other.
    """
    walls, cpus = [], []
    for _ in range(repeats):
        c0, w0 = _cpu(), time.perf_counter()
        fn()
        walls.append(time.perf_counter() - w0)
        cpus.append(_cpu() - c0)
    return statistics.median(walls), statistics.median(cpus)


def _cpu() -> float:
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def small(repeats: int) -> None:
    doc = scenario(8, 64, 1)
    hops.simulate(doc)  # warm: imports, preset cache
    warm, warm_cpu = timed(lambda: hops.simulate(doc), max(repeats, 20))
    texts = [(PRESET_DIR / name).read_text() for name in CATALOG_FILES.values()]
    parse_py = median_s(lambda: [yaml.load(t, Loader=yaml.SafeLoader) for t in texts], 20)
    c_loader = getattr(yaml, "CSafeLoader", None)
    parse_c = median_s(lambda: [yaml.load(t, Loader=c_loader) for t in texts], 20) if c_loader else float("nan")
    cached = median_s(hops.Catalog.load, 20)
    print("small scenario: PP8 x 64, 1 iteration")
    print(f"  hops.simulate warm (median of {max(repeats, 20)})  {1000 * warm:8.2f} ms   (target <= 10 ms; "
          f"cpu {1000 * warm_cpu:.2f} ms)")
    print(f"  preset YAML parse, pure Python         {1000 * parse_py:8.2f} ms   (what every simulate paid before)")
    print(f"  preset YAML parse, libyaml CSafeLoader  {1000 * parse_c:8.2f} ms   (libyaml {'yes' if c_loader else 'no'})")
    print(f"  Catalog.load, cached per process        {1000 * cached:8.2f} ms")


COLD_PROBE = """
import json, os, sys, time
sys.path.insert(0, {repo!r}); sys.path.insert(0, {bench!r})
marks = [(time.perf_counter(), time.process_time())]
import numpy, yaml
marks.append((time.perf_counter(), time.process_time()))
import hops
marks.append((time.perf_counter(), time.process_time()))
from scale_bench import scenario
doc = scenario(8, 64, 1)
marks.append((time.perf_counter(), time.process_time()))
hops.simulate(doc)
marks.append((time.perf_counter(), time.process_time()))
hops.simulate(doc)
marks.append((time.perf_counter(), time.process_time()))
steps = ("numpy_yaml", "import_hops", None, "first", "warm")
out = {{k: marks[i + 1][0] - marks[i][0] for i, k in enumerate(steps) if k}}
out.update({{k + "_cpu": marks[i + 1][1] - marks[i][1] for i, k in enumerate(steps) if k}})
print(json.dumps(out))
"""


UPSTREAM_S = (0.05, 0.08)  # issue 20: the original HOPS's first run of the PP8 x 64 scenario, as quoted there


def cold(repeats: int) -> None:
    """A new process's first simulate, and hops.run end to end on the default scenario, in fresh processes.

    Bytecode: the figures are for processes that load compiled bytecode, as an installed
    package (pip compiles it) or any checkout run once does. This box's shells set
    PYTHONDONTWRITEBYTECODE=1, so there a checkout without __pycache__ compiles every hops
    module from source at each start (~0.1 s more); that row is printed too. The compiled
    bytecode goes to a temporary PYTHONPYCACHEPREFIX, so the checkout stays clean.

    There is no checkout of the original (upstream) HOPS here to time in the same run, so the
    baseline is what a simulator with no start-up cost of its own would pay: importing numpy
    and yaml, then the simulation itself (a warm hops.simulate in the same process). The
    ratio (import hops + first simulate) / baseline is what the issue's "<= 3x upstream's"
    target is read against here, next to the issue's quoted 0.05-0.08 s.
    """
    import json

    n = max(repeats, 5)
    probe = [sys.executable, "-c", COLD_PROBE.format(repo=str(REPO), bench=str(REPO / "benchmarks"))]
    with tempfile.TemporaryDirectory() as pyc, tempfile.TemporaryDirectory() as tmp:
        compiled = {**os.environ, "MPLBACKEND": "Agg", "PYTHONPYCACHEPREFIX": pyc}
        compiled.pop("PYTHONDONTWRITEBYTECODE", None)
        source = {**os.environ, "MPLBACKEND": "Agg", "PYTHONDONTWRITEBYTECODE": "1"}
        source.pop("PYTHONPYCACHEPREFIX", None)
        modes = {"cache": {**compiled}, "no cache": {**compiled, "HOPS_CACHE_DIR": ""},  # "": no disk cache
                 "source": source}
        subprocess.run(probe, env=compiled, check=True, capture_output=True)  # compiles the bytecode read below
        runs = {label: [] for label in modes}
        for _ in range(n):
            for label, env in modes.items():
                out = subprocess.run(probe, env=env, capture_output=True, text=True, check=True).stdout
                runs[label].append(json.loads(out))
        run_app = [sys.executable, "-m", "hops.run", "output.plots=false", f"hydra.run.dir={tmp}/run"]
        subprocess.run(run_app, cwd=REPO, env=compiled, check=True, capture_output=True)  # compiles Hydra's too
        e2e = timed(lambda: subprocess.run(run_app, cwd=REPO, env=compiled, check=True, capture_output=True), n)
        bare = timed(lambda: subprocess.run([sys.executable, "-c", "import numpy, yaml"], env=compiled, check=True), n)
    med = {label: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for label, rs in runs.items()}
    c, nc, src = med["cache"], med["no cache"], med["source"]
    base = c["numpy_yaml"] + c["warm"]
    ours = c["import_hops"] + c["first"]
    lo, hi = UPSTREAM_S
    from_source = not any(REPO.glob("hops/**/__pycache__"))
    print(f"cold start: PP8 x 64, 1 iteration, a fresh process each (medians of {n}; compiled bytecode)")
    print(f"  import numpy + yaml                     {1000 * c['numpy_yaml']:8.1f} ms")
    print(f"  import hops (after numpy + yaml)        {1000 * c['import_hops']:8.1f} ms")
    print(f"  first hops.simulate                     {1000 * c['first']:8.1f} ms   (cpu {1000 * c['first_cpu']:.1f} "
          f"ms; fingerprint cached on disk; {c['first'] / hi:.1f}-{c['first'] / lo:.1f}x upstream's quoted "
          f"{lo:g}-{hi:g} s, target <= 3x)")
    print(f"  first hops.simulate, no disk cache      {1000 * nc['first']:8.1f} ms   (HOPS_CACHE_DIR= : ASTs parsed)")
    print(f"  warm hops.simulate (second call)        {1000 * c['warm']:8.1f} ms")
    ours_cpu = c["import_hops_cpu"] + c["first_cpu"]
    print(f"  import hops + first simulate            {1000 * ours:8.1f} ms   (cpu {1000 * ours_cpu:.1f} ms; "
          f"{ours / hi:.1f}-{ours / lo:.1f}x the "
          f"quoted {lo:g}-{hi:g} s; vs baseline numpy + yaml + warm simulate {1000 * base:.1f} ms: "
          f"{ours / base:.1f}x, target <= 3x; no upstream checkout to time)")
    print(f"  ... PYTHONDONTWRITEBYTECODE=1           {1000 * (src['import_hops'] + src['first']):8.1f} ms   "
          f"(import hops {1000 * src['import_hops']:.1f} + first simulate {1000 * src['first']:.1f}; "
          + ("hops compiled from source each process)" if from_source else "the checkout's __pycache__ is read)"))
    print(f"  python -m hops.run output.plots=false   {e2e[0]:8.2f} s    (default scenario, wall; "
          f"python -c 'import numpy, yaml': {bare[0]:.2f} s)")


def large(p: int, m: int, batches: int, repeats: int, plots: bool = True) -> None:
    from hops.outputs.chrome_trace import write_chrome_trace
    from hops.outputs.files import write_events_csv
    from hops.outputs.plots import plot_dashboard, plot_timeline

    doc = scenario(p, m, batches)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        t_sim, c_sim = timed(lambda: hops.simulate(doc), repeats)
        result = hops.simulate(doc)
        n = len(result.timeline)
        steps = {
            "events.csv": lambda: write_events_csv(result.timeline, tmp / "events.csv"),  # as hops.run writes it
            "trace.json": lambda: write_chrome_trace(result.timeline, tmp / "trace.json"),
            "trace.json.gz": lambda: write_chrome_trace(result.timeline, tmp / "trace.json.gz"),
            "timeline.png": lambda: plot_timeline(result.timeline, tmp / "timeline.png"),
            "dashboard.png": lambda: plot_dashboard(result.summary, result.timeline, tmp / "dashboard.png"),
        }
        if not plots:
            del steps["timeline.png"], steps["dashboard.png"]
        cost = {k: timed(fn, repeats) for k, fn in steps.items()}
        sizes = {k: (tmp / k).stat().st_size / 1e6 for k in steps}
        path = tmp / "scenario.yaml"
        path.write_text(yaml.safe_dump(doc))
        env = {**os.environ, "MPLBACKEND": "Agg"}

        def cli(*args):
            proc = subprocess.run([sys.executable, "-m", "hops.run", f"scenario_file={path}",
                                   f"hydra.run.dir={tmp / 'run'}", *args], cwd=REPO, env=env,
                                  capture_output=True, text=True)
            if proc.returncode != 0:
                raise SystemExit(proc.stderr)

        cases = {"hops.run end to end, plots off": ("output.plots=false",),
                 "... plots off, trace.json.gz": ("output.plots=false", "output.chrome_trace_gz=true"),
                 **({"hops.run end to end, plots on": (),
                     "... plots on, drawn in turn": ("output.plots_alongside=false",)} if plots else {})}
        e2e, paired = end_to_end(lambda: hops.simulate(doc), {k: (lambda a=a: cli(*a)) for k, a in cases.items()},
                                 repeats)
    print(f"large scenario: PP{p} x {m}, {batches} iterations, {n:,} events (medians of {repeats}; "
          f"wall, then CPU of the process and its children)")
    print(f"  {'hops.simulate':34s} {t_sim:8.2f} s   1.00x   cpu {c_sim:6.2f} s   1.00x")
    for k, (v, c) in cost.items():
        print(f"  {'write ' + k:34s} {v:8.2f} s   {v / t_sim:4.2f}x   cpu {c:6.2f} s   {c / c_sim:4.2f}x"
              f"   {sizes[k]:8.1f} MB")
    for k, (v, c) in e2e.items():
        print(f"  {k:34s} {v:8.2f} s   {v / t_sim:4.2f}x   cpu {c:6.2f} s   {c / c_sim:4.2f}x"
              + ("   (target <= 2x)" if k.endswith(("plots off", "plots on")) else ""))
    print(f"  paired with a simulate run just before each (median ratio [min-max] of {repeats} rounds; "
          f"simulate {statistics.median(paired['simulate']):.2f} s):")
    for k in e2e:
        r = paired[k]
        print(f"  {k:34s} {statistics.median(r):4.2f}x  [{min(r):.2f}-{max(r):.2f}]")


def end_to_end(simulate, cases: dict, repeats: int) -> tuple[dict, dict]:
    """`timed` of each case, and each case's ratio to a simulate timed in the same round.

    The rounds interleave a simulate and every case, so a ratio compares runs made under the
    same load: on a shared box the load shifts between a block of simulates and a block of
    end-to-end runs, and a ratio of the two blocks' medians moves with it.
    """
    walls = {k: [] for k in ["simulate", *cases]}
    cpus = {k: [] for k in cases}
    for i in range(repeats):
        load = os.getloadavg()[0]
        w0 = time.perf_counter()
        simulate()
        walls["simulate"].append(time.perf_counter() - w0)
        for k, fn in cases.items():
            c0, w0 = _cpu(), time.perf_counter()
            fn()
            walls[k].append(time.perf_counter() - w0)
            cpus[k].append(_cpu() - c0)
        ratios = ", ".join(f"{k.removeprefix('hops.run end to end, ')} {walls[k][-1] / walls['simulate'][-1]:.2f}x"
                           for k in cases)
        print(f"  round {i + 1}: load {load:.2f}; simulate {walls['simulate'][-1]:.2f} s; {ratios}", flush=True)
    medians = {k: (statistics.median(walls[k]), statistics.median(cpus[k])) for k in cases}
    paired = {"simulate": walls["simulate"],
              **{k: [w / s for w, s in zip(walls[k], walls["simulate"])] for k in cases}}
    return medians, paired


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--stages", type=int, default=64)
    ap.add_argument("--microbatches", type=int, default=1024)
    ap.add_argument("--batches", type=int, default=4)
    ap.add_argument("--small-only", action="store_true")
    ap.add_argument("--cold-only", action="store_true", help="only the fresh-process start-up figures")
    ap.add_argument("--large-only", action="store_true", help="only the large scenario (no cold start, no small one)")
    ap.add_argument("--no-plots", action="store_true", help="skip the PNG writers and the end-to-end run with plots")
    args = ap.parse_args()
    print(f"load average at start: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    if not args.large_only:
        cold(args.repeats)
        if args.cold_only:
            return
        small(args.repeats)
    if not args.small_only:
        large(args.stages, args.microbatches, args.batches, args.repeats, plots=not args.no_plots)
    print(f"load average at end: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")


if __name__ == "__main__":
    main()
