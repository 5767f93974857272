"""The one shape every run takes: a simulated run and a measured trace both end here.

Metrics, plots and scoring read only a Timeline, so "simulated" and "measured"
are computed by the same code and cannot drift apart by definition.
"""
from __future__ import annotations

import csv
import io
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

KINDS = ("compute", "transfer", "optimizer", "allreduce", "failure", "collective")  # collective: tensor-parallel, inside a pass
PHASES = ("F", "B", "W", "BW", "OPT", "")
EVENTS_CSV_HEADER = ("kind", "stage", "device", "microbatch", "phase", "start_ms", "end_ms", "src", "dst")


@dataclass(frozen=True)
class Timeline:
    """Columnar event table (one row per task) plus the pipeline layout it ran on.

    `microbatch` is global across iterations (iteration * microbatches + index), so
    a microbatch keeps its identity; `iteration` says which optimizer step it fed.
    Rows without a stage, microbatch or link use -1 / "".

    `chunk` is the model chunk (virtual stage) of the stage a compute or transfer row ran on:
    0..v-1 under interleaved 1F1B or ZB-V, where one stage runs several chunks and `stage`
    alone cannot tell them apart; 0 when every stage is one chunk, -1 for rows of no chunk
    (optimizer, all-reduce, failure). It is not an events.csv column, so a one-chunk run's
    output keeps its bytes; a source that knows no chunks leaves it out (the default).

    `samples_per_microbatch` is the samples one microbatch step trains over the whole job: the
    micro-batch size times the data-parallel replicas the rows stand for (a simulation runs one
    pipeline of them), so samples/s is the job's, as a planner or a paper counts it.
    """

    kind: np.ndarray
    stage: np.ndarray
    device: np.ndarray
    microbatch: np.ndarray
    phase: np.ndarray
    start_ms: np.ndarray
    end_ms: np.ndarray
    src: np.ndarray
    dst: np.ndarray
    iteration: np.ndarray
    stage_devices: tuple[str, ...]
    microbatches_per_iteration: int
    samples_per_microbatch: int = 1
    meta: dict = field(default_factory=dict)
    chunk: np.ndarray | None = None

    def __post_init__(self):
        if self.chunk is None:  # sources without virtual stages: one chunk per stage
            object.__setattr__(self, "chunk", default_chunks(self.kind))

    @classmethod
    def from_rows(cls, rows: dict[str, list], *, stage_devices, microbatches_per_iteration,
                  samples_per_microbatch=1, meta=None) -> "Timeline":
        """Build from equal-length column lists; rows are sorted by (start, end) for stable output.

        A "chunk" column is optional (see the class docstring)."""
        n = len(rows["kind"])
        for name in EVENTS_CSV_HEADER + ("iteration",) + (("chunk",) if "chunk" in rows else ()):
            if len(rows[name]) != n:
                raise ValueError(f"timeline column {name!r} has {len(rows[name])} rows, expected {n}")
        start = np.asarray(rows["start_ms"], dtype=np.float64)
        end = np.asarray(rows["end_ms"], dtype=np.float64)
        stage = np.asarray(rows["stage"], dtype=np.int64)
        order = np.lexsort((stage, end, start)) if n else np.arange(0)

        def col(name, dtype=None):
            arr = np.asarray(rows[name], dtype=dtype) if n else np.asarray([], dtype=dtype or np.str_)
            return arr[order]

        return cls(
            kind=col("kind", np.str_), stage=stage[order], device=col("device", np.str_),
            microbatch=col("microbatch", np.int64), phase=col("phase", np.str_),
            start_ms=start[order], end_ms=end[order], src=col("src", np.str_), dst=col("dst", np.str_),
            iteration=col("iteration", np.int64), stage_devices=tuple(stage_devices),
            microbatches_per_iteration=int(microbatches_per_iteration),
            samples_per_microbatch=int(samples_per_microbatch), meta=dict(meta or {}),
            chunk=col("chunk", np.int64) if "chunk" in rows else None,
        )

    def __len__(self) -> int:
        return len(self.kind)

    @property
    def n_stages(self) -> int:
        return len(self.stage_devices)

    @property
    def n_chunks(self) -> int:
        """Model chunks per stage the rows show (1 unless a schedule ran virtual stages)."""
        return int(self.chunk.max()) + 1 if len(self.chunk) and self.chunk.max() > 0 else 1

    def select(self, mask: np.ndarray) -> "Timeline":
        """Rows where mask holds, same layout."""
        return Timeline(
            kind=self.kind[mask], stage=self.stage[mask], device=self.device[mask],
            microbatch=self.microbatch[mask], phase=self.phase[mask], start_ms=self.start_ms[mask],
            end_ms=self.end_ms[mask], src=self.src[mask], dst=self.dst[mask], iteration=self.iteration[mask],
            stage_devices=self.stage_devices, microbatches_per_iteration=self.microbatches_per_iteration,
            samples_per_microbatch=self.samples_per_microbatch, meta=self.meta, chunk=self.chunk[mask],
        )

    def to_frame(self):
        """pandas DataFrame view (pandas imported lazily: the core stays light)."""
        import pandas as pd

        return pd.DataFrame({name: getattr(self, name) for name in EVENTS_CSV_HEADER + ("iteration", "chunk")})

    def write_csv(self, path: str | Path) -> None:
        """events.csv with the exact contract header; floats at µs resolution so output is byte-stable.

        One formatting pass over whole columns instead of a csv.writer call per row, with the
        csv module's quoting applied once per distinct string: the same bytes, several times faster.
        """
        quoted: dict[str, str] = {}

        def q(column: np.ndarray) -> list[str]:
            values = column.tolist()
            for v in set(values) - quoted.keys():
                quoted[v] = _csv_field(v)
            return [quoted[v] for v in values]

        cols = (q(self.kind), self.stage.tolist(), q(self.device), self.microbatch.tolist(), q(self.phase),
                self.start_ms.tolist(), self.end_ms.tolist(), q(self.src), q(self.dst))
        rows = map("%s,%d,%s,%d,%s,%.6f,%.6f,%s,%s\n".__mod__, zip(*cols))
        with open(path, "w", newline="") as fh:
            fh.write(",".join(EVENTS_CSV_HEADER) + "\n")
            fh.writelines(rows)


def default_chunks(kind: np.ndarray) -> np.ndarray:
    """Chunk 0 for compute and transfer rows, -1 for the rest: a timeline of one chunk per stage."""
    kind = np.asarray(kind)
    return np.where((kind == "compute") | (kind == "transfer"), 0, -1).astype(np.int64)


def _csv_field(value: str) -> str:
    """One field exactly as csv.writer (QUOTE_MINIMAL) writes it inside a row."""
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerow((value, ""))
    return buf.getvalue()[:-2]
