"""How run outputs reach the disk: complete or not at all, in a stable, readable order.

Every file is written to a temporary name in the same directory and renamed into
place, so a killed run never leaves a half-written file under its final name, and
summary.json is written last: a run directory with a summary.json is a complete run
(hops.run.sweep relies on this to tell finished jobs from interrupted ones).
"""
from __future__ import annotations

import json
import math
import os
import re
import secrets
from pathlib import Path

SUMMARY = "summary.json"


def natural_key(text: str) -> list:
    """h100_2 before h100_10; stage "9" before "10"."""
    return [(0, int(t), "") if t.isdigit() else (1, 0, t) for t in re.split(r"(\d+)", str(text)) if t]


def naturally_ordered(obj):
    """Mappings with their keys in natural order, recursively (json.dump keeps insertion order);
    a number that is not finite becomes None, so the JSON is strict (no bare NaN or Infinity)."""
    if isinstance(obj, dict):
        return {k: naturally_ordered(obj[k]) for k in sorted(obj, key=natural_key)}
    if isinstance(obj, (list, tuple)):
        return [naturally_ordered(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def summary_json(summary: dict) -> str:
    return json.dumps(naturally_ordered(summary), indent=2, allow_nan=False) + "\n"


def schedule_text(summary: dict) -> str:
    """The schedule asked for, and what an adaptive one (hops_hetero) picked: "hops_hetero (chose 1f1b)"."""
    sched = summary.get("schedule", "?")
    eff = summary.get("scheduler_effective")
    try:
        from hops.schedulers import resolve_scheduler

        own_name = resolve_scheduler(sched).name
    except Exception:  # noqa: BLE001 - display only
        own_name = sched
    return sched if not eff or eff == own_name else f"{sched} (chose {eff})"


def slowest_stage(summary: dict) -> dict | None:
    """The stage with the longest expected forward + backward per microbatch as the run ran its
    backward (B + W where it was split, the fused BW otherwise): the pace of the steady state.
    None under virtual stages, whose devices each run several chunks placed by the schedule:
    the busiest device then says more about what paces the run."""
    stages = summary.get("stages") or []
    if not stages or (summary.get("virtual_stages") or 1) > 1:
        return None

    def per_mb(st):
        e = st["expected_ms"]
        if st.get("backward") == "split":
            return e["F"] + e["B"] + e["W"]
        return e["F"] + (e.get("BW") or e.get("B", 0.0) + e.get("W", 0.0))

    worst = max(stages, key=per_mb)
    util = (summary.get("utilization") or {}).get("per_stage", {}).get(str(worst["stage"]))
    return {**worst, "per_microbatch_ms": per_mb(worst), "utilization": util}


def busiest_device(summary: dict) -> tuple[str, float] | None:
    """The device busy the largest share of the run, and that share."""
    per_device = (summary.get("utilization") or {}).get("per_device") or {}
    return max(per_device.items(), key=lambda kv: kv[1]) if per_device else None


def scenario_label(summary: dict) -> str | None:
    """The scenario's name as summary.json records it (name, else the file's name)."""
    prov = summary.get("provenance") or {}
    if prov.get("scenario"):
        return str(prov["scenario"])
    f = prov.get("scenario_file")
    return (Path(f).parent.name if Path(f).name == "hops.base.yaml" else Path(f).stem) if f else None


def tmp_path(path: Path) -> Path:
    """A hidden sibling, unique to this writer, that keeps the extension (matplotlib and gzip go
    by it): .trace.<pid>-<random>.tmp.json. Two writers of the same file (two processes writing
    one directory) each rename their own complete file; with one shared temporary name one
    could rename the other's half-written bytes, or its own bytes followed by the other's tail."""
    return path.with_name(f".{path.stem}.{os.getpid()}-{secrets.token_hex(4)}.tmp{path.suffix}")


def commit(tmp: Path, path: Path, *, sync: bool = False) -> Path:
    """Rename a fully written temporary into place (fsync first when asked: the completion marker)."""
    if sync:
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
    os.replace(tmp, path)
    return path


def write_text(path: str | Path, text: str, *, sync: bool = False) -> Path:
    return write_with(path, lambda tmp: tmp.write_text(text), sync=sync)


def write_events_csv(timeline, path: str | Path) -> None:
    """events.csv, the same bytes as `Timeline.write_csv` (the contract), built a block of rows at a time.

    This lives here, not in hops/timeline.py, because timeline.py is a model file: a faster
    writer must not change the model fingerprint. Rows the block formatter cannot print
    (non-finite or huge times) send the whole file to `Timeline.write_csv`.
    """
    import numpy as np

    from hops.outputs import text_columns as tc
    from hops.timeline import EVENTS_CSV_HEADER, KINDS, PHASES, _csv_field

    tl = timeline
    kinds, kind_c = tc.factorize(tl.kind, KINDS)
    devices, dev_c = tc.factorize(tl.device)
    phases, phase_c = tc.factorize(tl.phase, PHASES)
    ends, src_c = tc.factorize(np.concatenate([tl.src, tl.dst]))
    src_c, dst_c = src_c[:len(tl)], src_c[len(tl):]
    first, codes = tc.combine([kind_c, tl.stage, dev_c, phase_c, src_c, dst_c])
    with open(path, "w", newline="") as fh:  # the encoding Timeline.write_csv gets
        fh.write(",".join(EVENTS_CSV_HEADER) + "\n")
        enc = fh.encoding
        rows = [(kinds[kind_c[i]], int(tl.stage[i]), devices[dev_c[i]], phases[phase_c[i]], ends[src_c[i]],
                 ends[dst_c[i]]) for i in first.tolist()]
        quoted = {v: _csv_field(v) for v in {*kinds, *devices, *phases, *ends}}
        try:
            parts = [[f"{quoted[k]},{st},{quoted[d]},".encode(enc) for k, st, d, *_ in rows],
                     [f",{quoted[ph]},".encode(enc) for _, _, _, ph, _, _ in rows],
                     [b","] * len(rows),
                     [f",{quoted[s]},{quoted[t]}\n".encode(enc) for *_, s, t in rows]]
        except UnicodeEncodeError:
            parts = None
        blocks = parts and tc.render(parts, codes, [(tc.INT, tl.microbatch), (tc.FIXED6, tl.start_ms),
                                                    (tc.FIXED6, tl.end_ms)])
        if blocks is not None:
            fh.flush()
            for block in blocks:
                fh.buffer.write(block)
            return
    tl.write_csv(path)


def write_with(path: str | Path, writer, *, sync: bool = False) -> Path:
    """`writer(tmp)` writes the file at a temporary path; it is renamed to `path` only once done.

    A writer that fails leaves no temporary behind; its OSError on the temporary (a full disk)
    gets `path` as its second file name, as a failed rename has, so the one-line error names
    the output the user knows (hops.run.run_dir.cannot_write)."""
    path = Path(path)
    tmp = tmp_path(path)
    try:
        writer(tmp)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        if exc.filename == str(tmp) and exc.filename2 is None:
            raise OSError(exc.errno, exc.strerror, exc.filename, None, str(path)) from exc
        raise
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return commit(tmp, path, sync=sync)
