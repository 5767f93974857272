"""events.csv: hops.outputs.text_columns' block writer against pyarrow's CSV writer, same bytes required.

Issue 22 asked whether pyarrow.csv.write_csv can replace hops/outputs/text_columns.py. events.csv prints
times as `"%.6f"` and quotes strings as csv.writer (QUOTE_MINIMAL) does; Arrow's writer prints a
float's shortest repr and, quoting "needed", quotes every string. So the pyarrow writer here
builds the `%.6f` text as Arrow strings (integer units from text_columns' exact rounding, the
fraction left-padded), passes strings pre-quoted as dictionary columns and writes them with
quoting "none". It is checked byte for byte against hops.outputs.files.write_events_csv; a third
variant, pyarrow with Arrow's own float text (not the same bytes), bounds what the float
formatting costs. The three run interleaved, so a change of load hits all alike.

    python benchmarks/csv_writer_bench.py                      # PP64 x 1024, 4 iterations, 5 rounds
    python benchmarks/csv_writer_bench.py --stages 8 --microbatches 64 --batches 1
"""
from __future__ import annotations

import argparse
import hashlib
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

import hops
from hops.outputs import text_columns as tc
from hops.outputs.files import write_events_csv
from hops.timeline import EVENTS_CSV_HEADER, _csv_field

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run_bench import scenario  # noqa: E402 - the same large scenario run_bench.py times


def _quoted(column: np.ndarray) -> pa.DictionaryArray:
    values, codes = tc.factorize(column)
    return pa.DictionaryArray.from_arrays(pa.array(codes.astype(np.int32)), pa.array([_csv_field(v) for v in values]))


def _fixed6(x: np.ndarray) -> pa.Array:
    """`"%.6f" % v` for every v, as Arrow strings (Arrow has no printf-style float format)."""
    units = tc._fixed6_units(x)  # round(|x| * 1e6) exactly as %.6f rounds it
    whole = pc.cast(pa.array(units // 10 ** 6), pa.string())
    frac = pc.utf8_lpad(pc.cast(pa.array(units % 10 ** 6), pa.string()), width=6, padding="0")
    text = pc.binary_join_element_wise(whole, frac, ".")
    return pc.if_else(pa.array(np.signbit(x)), pc.binary_join_element_wise(pa.scalar("-"), text, ""), text)


def write_pyarrow(tl, path: Path, *, same_bytes: bool = True, batch_size: int = 1024) -> None:
    times = (_fixed6(tl.start_ms), _fixed6(tl.end_ms)) if same_bytes else (pa.array(tl.start_ms), pa.array(tl.end_ms))
    table = pa.table({"kind": _quoted(tl.kind), "stage": pa.array(tl.stage), "device": _quoted(tl.device),
                      "microbatch": pa.array(tl.microbatch), "phase": _quoted(tl.phase), "start_ms": times[0],
                      "end_ms": times[1], "src": _quoted(tl.src), "dst": _quoted(tl.dst)})
    with open(path, "wb") as fh:
        fh.write((",".join(EVENTS_CSV_HEADER) + "\n").encode())
        pacsv.write_csv(table, fh, pacsv.WriteOptions(include_header=False, quoting_style="none",
                                                      batch_size=batch_size))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--stages", type=int, default=64)
    ap.add_argument("--microbatches", type=int, default=1024)
    ap.add_argument("--batches", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    tl = hops.simulate(scenario(a.stages, a.microbatches, a.batches)).timeline
    writers = {
        "hops.outputs.files.write_events_csv (text_columns)": write_events_csv,
        "pyarrow write_csv, %.6f built in Arrow": write_pyarrow,
        "... the same, batch_size 65536": lambda tl, p: write_pyarrow(tl, p, batch_size=1 << 16),
        "pyarrow write_csv, Arrow's float text (NOT the same bytes)": lambda tl, p: write_pyarrow(tl, p,
                                                                                                same_bytes=False),
    }
    with tempfile.TemporaryDirectory() as tmp:
        paths = {name: Path(tmp) / f"{i}.csv" for i, name in enumerate(writers)}
        times: dict[str, list[float]] = {name: [] for name in writers}
        for _ in range(a.rounds):
            for name, write in writers.items():
                t0 = time.perf_counter()
                write(tl, paths[name])
                times[name].append(time.perf_counter() - t0)
        digest = {name: hashlib.sha256(p.read_bytes()).hexdigest()[:16] for name, p in paths.items()}
        size = next(iter(paths.values())).stat().st_size / 1e6
    ours = next(iter(digest.values()))
    print(f"events.csv of PP{a.stages} x {a.microbatches} x {a.batches}: {len(tl):,} rows, {size:.1f} MB; "
          f"pyarrow {pa.__version__}; wall s, median of {a.rounds} interleaved rounds")
    base = statistics.median(next(iter(times.values())))
    for name, t in times.items():
        same = "same bytes" if digest[name] == ours else "different bytes"
        print(f"  {name:58s} {statistics.median(t):6.2f} s  {statistics.median(t) / base:5.2f}x  "
              f"(min {min(t):.2f}, max {max(t):.2f})  sha256 {digest[name]}  {same}")


if __name__ == "__main__":
    main()
