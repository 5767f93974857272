"""Cost of reading and validating a scenario: the schema models' import, the first load
(when pydantic compiles the validator) and a warm load, for a small and a PP64 x 1024 scenario.

Cold figures come from fresh interpreters (median of --runs), warm from one process. `import hops`
imports hops.schema on the way (hops.scenario needs it), so the schema's own share is read from
`python -X importtime`: the cumulative time of the hops.schema line, pydantic included.

    python benchmarks/scenario_load_bench.py
    python benchmarks/scenario_load_bench.py --runs 9
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
COLD = """
import time
t0 = time.perf_counter(); import hops; t1 = time.perf_counter()
hops.load_scenario({path!r}); t2 = time.perf_counter()
print(t1 - t0, t2 - t1)
"""


def schema_import_s(importtime: str) -> float:
    """hops.schema's cumulative import time from `-X importtime` output (microseconds there)."""
    for line in importtime.splitlines():
        fields = [f.strip() for f in line.removeprefix("import time:").split("|")]
        if len(fields) == 3 and fields[2] == "hops.schema":
            return int(fields[1]) / 1e6
    raise RuntimeError("hops.schema not in the -X importtime output")


def doc(p: int, m: int) -> dict:
    sys.path.insert(0, str(REPO / "tests"))
    from builders import pipeline

    return pipeline(p, m)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    path = REPO / "conf" / "scenario" / "h100_pair.yaml"
    imports, schemas, firsts = [], [], []
    for _ in range(args.runs):
        proc = subprocess.run([sys.executable, "-X", "importtime", "-c", COLD.format(path=str(path))],
                              capture_output=True, text=True, check=True, cwd=REPO)
        out = proc.stdout.split()
        imports.append(float(out[0]))
        firsts.append(float(out[1]))
        schemas.append(schema_import_s(proc.stderr))
    print(f"cold (median of {args.runs} processes; -X importtime adds its own overhead): "
          f"import hops {1000 * statistics.median(imports):.0f} ms, "
          f"of which hops.schema {1000 * statistics.median(schemas):.0f} ms, "
          f"first load_scenario {1000 * statistics.median(firsts):.0f} ms")

    from hops.model.hardware import Catalog
    from hops.scenario import load_scenario

    catalog = Catalog.load()
    for p, m in ((8, 64), (64, 1024)):
        d = doc(p, m)
        load_scenario(d, catalog)
        times = []
        for _ in range(50):
            t = time.perf_counter()
            load_scenario(d, catalog)
            times.append(time.perf_counter() - t)
        print(f"warm load_scenario PP{p} x {m}: median {1000 * statistics.median(times):.2f} ms")


if __name__ == "__main__":
    main()
