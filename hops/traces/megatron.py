"""Megatron-LM JSONL traces -> Timeline, strictly: a trace imports whole or not at all.

Ground truth that silently lost a line would bias every score computed against
it, so anything that looks like an event but cannot be read raises TraceError
naming FILE:LINE. Lines that do not start with `{` are log noise (NCCL banners,
warnings) interleaved by the launcher and are skipped. Warm-up iterations are
kept: dropping them is a metrics rule (hops.metrics), not an import decision.
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import replace
from pathlib import Path

import numpy as np

from ..errors import TraceError
from ..timeline import EVENTS_CSV_HEADER, Timeline
from .guard import check_fixture_dir

# Bump when the mapping below changes so stale caches are never served.
IMPORTER_VERSION = "1"

# Split-backward traces (zero-bubble style) may report input- and weight-gradient
# work separately; a fused BACKWARD stays "BW" so it is not mistaken for either.
PHASE_MAP = {
    "FORWARD": "F",
    "BACKWARD": "BW",
    "BACKWARD_INPUT": "B",
    "BACKWARD_WEIGHT": "W",
    "OPTIMIZER": "OPT",
}
EVENT_TYPES = ("compute", "transfer")
REQUIRED = {
    "stage": int, "iteration": int, "microbatch": int, "event_type": str, "phase": str,
    "start_wall_ns": int, "end_wall_ns": int, "device_id": str,
}
TRANSFER_REQUIRED = {"src_device": str, "dst_device": str}


def trace_files(fixture_dir: str | Path) -> list[Path]:
    """rank*.jsonl in rank order (numeric, so rank10 follows rank9)."""
    tdir = Path(fixture_dir) / "megatron_trace"
    files = list(tdir.glob("rank*.jsonl"))
    if not files:
        raise TraceError(f"{tdir}: no rank*.jsonl trace files found, expected megatron_trace/rank<N>.jsonl")

    def rank_of(p: Path):
        digits = p.stem[4:]
        return (int(digits) if digits.isdigit() else 1 << 30, p.name)

    return sorted(files, key=rank_of)


def stage_map(fixture_dir: str | Path) -> tuple[str, ...]:
    """Stage -> device from hops_trace_map.json; stages must be 0..n-1 with no gaps."""
    path = Path(fixture_dir) / "hops_trace_map.json"
    try:
        stages = json.loads(path.read_text())["stages"]
        ids = sorted(int(k) for k in stages)
    except FileNotFoundError:
        raise TraceError(f"{path}: file missing, expected a JSON object {{\"stages\": {{\"0\": device_id, ...}}}}") from None
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise TraceError(f"{path}:1: cannot read stage map ({exc}), expected {{\"stages\": {{\"0\": device_id, ...}}}}") from None
    if ids != list(range(len(ids))) or not ids:
        raise TraceError(f"{path}:1: stage ids {ids} are not 0..n-1, expected consecutive stage numbers from 0")
    return tuple(str(stages[str(i)]) for i in ids)


def _check(rec, path: Path, lineno: int, devices: tuple[str, ...]):
    where = f"{path}:{lineno}"
    if not isinstance(rec, dict):
        raise TraceError(f"{where}: event is {type(rec).__name__}, expected a JSON object")
    need = dict(REQUIRED)
    if rec.get("event_type") == "transfer":
        need.update(TRANSFER_REQUIRED)
    for name, typ in need.items():
        if name not in rec:
            raise TraceError(f"{where}: missing field {name!r}, expected every event to have {sorted(need)}")
        val = rec[name]
        if not isinstance(val, typ) or isinstance(val, bool):
            raise TraceError(f"{where}: field {name!r} is {val!r}, expected {typ.__name__}")
    if rec["event_type"] not in EVENT_TYPES:
        raise TraceError(f"{where}: unknown event_type {rec['event_type']!r}, expected one of {list(EVENT_TYPES)}")
    if rec["phase"] not in PHASE_MAP:
        raise TraceError(f"{where}: unknown phase {rec['phase']!r}, expected one of {list(PHASE_MAP)}")
    if rec["end_wall_ns"] < rec["start_wall_ns"]:
        raise TraceError(f"{where}: end_wall_ns {rec['end_wall_ns']} is before start_wall_ns "
                         f"{rec['start_wall_ns']}, expected end >= start")
    if not 0 <= rec["stage"] < len(devices):
        raise TraceError(f"{where}: stage {rec['stage']} is not in hops_trace_map.json, expected 0..{len(devices) - 1}")
    if rec["device_id"] != devices[rec["stage"]]:
        raise TraceError(f"{where}: device_id {rec['device_id']!r} but hops_trace_map.json puts stage "
                         f"{rec['stage']} on {devices[rec['stage']]!r}, expected them to agree")
    if rec["event_type"] == "transfer" and rec["src_device"] != rec["device_id"]:
        raise TraceError(f"{where}: transfer src_device {rec['src_device']!r} differs from device_id "
                         f"{rec['device_id']!r}, expected transfers to be logged by the sending rank")
    if rec["microbatch"] < 0 or rec["iteration"] < 0:
        raise TraceError(f"{where}: negative iteration/microbatch, expected counters >= 0")


def _read_events(files: list[Path], devices: tuple[str, ...]) -> list[dict]:
    events = []
    for path in files:
        with open(path, encoding="utf-8", errors="replace") as fh:
            for lineno, line in enumerate(fh, 1):
                text = line.strip()
                if not text.startswith("{"):
                    continue
                try:
                    rec = json.loads(text)
                except json.JSONDecodeError as exc:
                    raise TraceError(f"{path}:{lineno}: invalid JSON ({exc.msg} at column {exc.colno}), "
                                     f"expected one JSON event object per line") from None
                _check(rec, path, lineno, devices)
                events.append(rec)
    if not events:
        raise TraceError(f"{files[0].parent}: no trace events found, expected JSON event lines in rank*.jsonl")
    return events


def _to_timeline(events: list[dict], devices: tuple[str, ...], source: str) -> Timeline:
    raw_iters = sorted({e["iteration"] for e in events})
    iter_index = {it: i for i, it in enumerate(raw_iters)}
    # Megatron's counter is monotonic, so sorted order is the order iterations ran in.
    mb_per_iter = 1 + max((e["microbatch"] for e in events if e["phase"] != "OPTIMIZER"), default=0)
    t0 = min(e["start_wall_ns"] for e in events)
    rows = {name: [] for name in EVENTS_CSV_HEADER + ("iteration",)}
    for e in events:
        it = iter_index[e["iteration"]]
        is_opt = e["phase"] == "OPTIMIZER"
        is_transfer = e["event_type"] == "transfer"
        # The optimizer step belongs to the iteration, not to the microbatch Megatron
        # happened to have in its counter when it logged it.
        kind = "transfer" if is_transfer else ("optimizer" if is_opt else "compute")
        rows["kind"].append(kind)
        rows["stage"].append(e["stage"])
        rows["device"].append(e["device_id"])
        rows["microbatch"].append(-1 if is_opt and not is_transfer else it * mb_per_iter + e["microbatch"])
        rows["phase"].append(PHASE_MAP[e["phase"]])
        # Subtract in integer ns first: float64 ms of epoch ns would lose sub-µs precision.
        rows["start_ms"].append((e["start_wall_ns"] - t0) / 1e6)
        rows["end_ms"].append((e["end_wall_ns"] - t0) / 1e6)
        rows["src"].append(e["src_device"] if is_transfer else "")
        rows["dst"].append(e["dst_device"] if is_transfer else "")
        rows["iteration"].append(it)
    meta = {"source": source, "origin_wall_ns": t0, "raw_iterations": raw_iters}
    return Timeline.from_rows(rows, stage_devices=devices, microbatches_per_iteration=mb_per_iter, meta=meta)


def _cache_key(files: list[Path], fixture_dir: Path) -> str:
    h = hashlib.sha256(IMPORTER_VERSION.encode())
    for path in [fixture_dir / "hops_trace_map.json", *files]:
        h.update(path.name.encode() + b"\0")
        h.update(path.read_bytes() if path.exists() else b"")
    return h.hexdigest()


def default_cache_dir() -> Path:
    return Path(os.environ.get("HOPS_CACHE") or Path.home() / ".cache" / "hops" / "traces")


ARRAYS = EVENTS_CSV_HEADER + ("iteration",)


def _save(tl: Timeline, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    header = {"stage_devices": list(tl.stage_devices), "microbatches_per_iteration": tl.microbatches_per_iteration,
              "samples_per_microbatch": tl.samples_per_microbatch, "meta": tl.meta}
    tmp = path.with_name(f"{path.stem}.{os.getpid()}.tmp.npz")
    np.savez(tmp, header=np.array(json.dumps(header)), **{n: getattr(tl, n) for n in ARRAYS})
    os.replace(tmp, path)  # atomic: concurrent loaders never see half a file


def _load(path: Path) -> Timeline | None:
    try:
        with np.load(path, allow_pickle=False) as z:
            header = json.loads(str(z["header"]))
            cols = {n: z[n] for n in ARRAYS}
    except (OSError, ValueError, KeyError):
        return None  # unreadable cache is a miss, never an error
    return Timeline(**cols, stage_devices=tuple(header["stage_devices"]),
                    microbatches_per_iteration=header["microbatches_per_iteration"],
                    samples_per_microbatch=header["samples_per_microbatch"], meta=header["meta"])


def load_trace(fixture_dir: str | Path, cache_dir: str | Path | None = None, *, use_cache: bool = True,
               token: object = None) -> Timeline:
    """The fixture's measured run as a Timeline (ms from the earliest event, all iterations kept).

    Cached as .npz keyed by the content of the trace files and stage map, so an
    edited trace is re-parsed and an unchanged one loads in milliseconds.
    A fixture of the held-out test split is refused (SplitGuardError) unless a
    checkpoint token from hops.traces.guard is passed (see that module).
    """
    check_fixture_dir(fixture_dir, token)
    fixture_dir = Path(fixture_dir)
    devices = stage_map(fixture_dir)
    files = trace_files(fixture_dir)
    cache_path = None
    if use_cache:
        key = _cache_key(files, fixture_dir)
        cache_path = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        cache_path = cache_path / f"{key}.npz"
        if cache_path.exists():
            hit = _load(cache_path)
            if hit is not None:
                # Same bytes may live in several fixture dirs; report the one asked for.
                return replace(hit, meta={**hit.meta, "source": str(fixture_dir)})
    tl = _to_timeline(_read_events(files, devices), devices, source=str(fixture_dir))
    if cache_path is not None:
        try:
            _save(tl, cache_path)
        except OSError:
            pass  # a read-only cache dir must not break importing
    return tl
