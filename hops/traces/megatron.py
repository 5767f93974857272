"""Megatron-LM JSONL traces -> Timeline, strictly: a trace imports whole or not at all.

Ground truth that silently lost a line would bias every score computed against
it, so anything that looks like an event but cannot be read raises TraceError
naming FILE:LINE, and so does a rank file that is missing, empty, binary or cut
short. A launcher prefix (torchrun ``--tee``: ``[default0]:{...}``) is stripped
before a line is judged. Lines that then do not start with `{` are log noise
(NCCL banners, warnings) and are skipped, unless they carry an event key, which
means an event hides behind a prefix we do not know. Warm-up iterations are
kept: dropping them is a metrics rule (hops.metrics), not an import decision.
"""
from __future__ import annotations

import hashlib
import heapq
import json
import math
import os
import re
from dataclasses import replace
from pathlib import Path

import numpy as np

from hops.errors import TraceError, echo
from hops.timeline import EVENTS_CSV_HEADER, Timeline
from hops.traces.guard import check_fixture_dir, check_path

# Bump when the mapping below changes so stale caches are never served.
IMPORTER_VERSION = "3"  # 3: events outside their run and times beyond int64 are refused

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
INT64 = (-2**63, 2**63 - 1)  # the range of a wall clock in ns (time.time_ns, CUDA events, numpy)


# torchrun --tee / --redirects: "[default0]:", "[rank3]:", possibly stacked ("[default0]:[rank0]:").
LAUNCHER_PREFIX = re.compile(r"^\s*(?:\[[A-Za-z_][\w.-]*?\d+\]:\s*)+")
EVENT_KEYS = ('"start_wall_ns"', '"event_type"')


def _reject_constant(name: str):
    raise ValueError(f"{name} is not a number")


def _finite_float(text: str) -> float:
    val = float(text)
    if not math.isfinite(val):
        raise ValueError(f"{text} overflows to {val}, expected a finite number")
    return val


# One decoder for every line (building one per json.loads call was a third of the parse time).
_STRICT = json.JSONDecoder(parse_constant=_reject_constant, parse_float=_finite_float)


def strict_json(text: str, where: str, what: str):
    """JSON without NaN/Infinity (not JSON at all) and without overflow to inf (``1e400``)."""
    try:
        return _STRICT.decode(text)
    except ValueError as exc:
        detail = f"{exc.msg.removesuffix(' at')} at column {exc.colno}" if isinstance(exc, json.JSONDecodeError) \
            else str(exc)
        raise TraceError(f"{where}: invalid JSON ({detail}), expected {what}") from None


def json_lines(path: Path, what: str, event_keys=EVENT_KEYS):
    """(line number, object) for every JSON line of a text log, strictly.

    A missing or unreadable file, bytes that are not UTF-8 (a binary or corrupt
    file), an empty file and a cut-off last line are errors naming the file; so is
    a noise line that carries an event key (data behind an unknown prefix).
    """
    try:
        fh = open(path, "rb")
    except OSError as exc:
        raise TraceError(f"{path}: cannot read ({exc.strerror or exc}), expected a readable {what} file") from None
    with fh:
        n_lines = 0
        for lineno, raw in enumerate(fh, 1):
            n_lines = lineno
            where = f"{path}:{lineno}"
            if b"\0" in raw:
                raise TraceError(f"{where}: binary data (NUL byte), expected UTF-8 text with one JSON object per line")
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise TraceError(f"{where}: not UTF-8 (byte 0x{raw[exc.start]:02x} at column {exc.start + 1}), "
                                 f"expected UTF-8 text with one JSON object per line") from None
            if lineno == 1:
                line = line.removeprefix("\ufeff")
            text = line.strip()
            if text.startswith("["):
                text = LAUNCHER_PREFIX.sub("", text, count=1).strip()
            if not text.startswith("{"):
                if any(key in text for key in event_keys):
                    raise TraceError(f"{where}: an event behind an unrecognised prefix ({echo(text[:40])}...), "
                                     f"expected the JSON object at the start of the line or after a "
                                     f"launcher prefix like [default0]:")
                continue
            if not raw.endswith(b"\n"):
                try:
                    json.loads(text)
                except ValueError:
                    raise TraceError(f"{where}: truncated last line (no newline at end of file and the JSON "
                                     f"object is incomplete), expected complete {what} lines") from None
            yield lineno, strict_json(text, where, what)
        if n_lines == 0:
            raise TraceError(f"{path}: empty file, expected {what} lines")


def trace_files(fixture_dir: str | Path, token: object = None) -> list[Path]:
    """rank*.jsonl in rank order (numeric, so rank10 follows rank9); ranks must be 0..n-1.

    A gap in the rank numbers means a rank's file is missing, and its events with it.
    """
    check_fixture_dir(fixture_dir, token)
    tdir = Path(fixture_dir) / "megatron_trace"
    files = list(tdir.glob("rank*.jsonl"))
    if not files:
        raise TraceError(f"{tdir}: no rank*.jsonl trace files found, expected megatron_trace/rank<N>.jsonl")
    ranks = {}
    for p in files:
        check_path(p, token)  # a file symlinked into the held-out split
        digits = p.name[4:-len(".jsonl")]
        if not digits.isdigit():
            raise TraceError(f"{p}: unexpected trace file name, expected rank<N>.jsonl with a rank number")
        if int(digits) in ranks:
            raise TraceError(f"{p}: rank {int(digits)} also in {ranks[int(digits)].name}, expected one file per rank")
        ranks[int(digits)] = p
    missing = sorted(set(range(max(ranks) + 1)) - set(ranks))
    if missing:
        raise TraceError(f"{tdir / f'rank{missing[0]}.jsonl'}: file missing (ranks found: "
                         f"{', '.join(map(str, sorted(ranks)))}), expected rank0..rank{max(ranks)}.jsonl")
    return [ranks[r] for r in sorted(ranks)]


def stage_map(fixture_dir: str | Path, token: object = None) -> tuple[str, ...]:
    """Stage -> device from hops_trace_map.json; stages must be 0..n-1 with no gaps."""
    check_fixture_dir(fixture_dir, token)
    path = Path(fixture_dir) / "hops_trace_map.json"
    check_path(path, token)
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
            raise TraceError(f"{where}: missing field {echo(name)}, expected every event to have {sorted(need)}")
        val = rec[name]
        if not isinstance(val, typ) or isinstance(val, bool):
            raise TraceError(f"{where}: field {echo(name)} is {echo(val)}, expected {typ.__name__}")
    if rec["event_type"] not in EVENT_TYPES:
        raise TraceError(f"{where}: unknown event_type {echo(rec['event_type'])}, expected one of {list(EVENT_TYPES)}")
    if rec["phase"] not in PHASE_MAP:
        raise TraceError(f"{where}: unknown phase {echo(rec['phase'])}, expected one of {list(PHASE_MAP)}")
    for name in ("start_wall_ns", "end_wall_ns"):
        if not INT64[0] <= rec[name] <= INT64[1]:
            raise TraceError(f"{where}: {name} {echo(rec[name])} is beyond int64, expected a wall-clock time in ns "
                             f"within +-2^63")
    if rec["start_wall_ns"] < 0:
        raise TraceError(f"{where}: start_wall_ns {rec['start_wall_ns']} is negative, expected a wall-clock time in "
                         f"ns since the Unix epoch")
    if rec["end_wall_ns"] < rec["start_wall_ns"]:
        raise TraceError(f"{where}: end_wall_ns {rec['end_wall_ns']} is before start_wall_ns "
                         f"{rec['start_wall_ns']}, expected end >= start")
    if not 0 <= rec["stage"] < len(devices):
        raise TraceError(f"{where}: stage {rec['stage']} is not in hops_trace_map.json, expected 0..{len(devices) - 1}")
    if rec["device_id"] != devices[rec["stage"]]:
        raise TraceError(f"{where}: device_id {echo(rec['device_id'])} but hops_trace_map.json puts stage "
                         f"{rec['stage']} on {echo(devices[rec['stage']])}, expected them to agree")
    if rec["event_type"] == "transfer" and rec["src_device"] != rec["device_id"]:
        raise TraceError(f"{where}: transfer src_device {echo(rec['src_device'])} differs from device_id "
                         f"{echo(rec['device_id'])}, expected transfers to be logged by the sending rank")
    if rec["microbatch"] < 0 or rec["iteration"] < 0:
        raise TraceError(f"{where}: negative iteration/microbatch, expected counters >= 0")


def _read_events(files: list[Path], devices: tuple[str, ...]) -> list[dict]:
    events = []
    for path in files:
        before = len(events)
        for lineno, rec in json_lines(path, "JSON trace event"):
            _check(rec, path, lineno, devices)
            rec["_file"], rec["_line"] = path, lineno
            events.append(rec)
        if len(events) == before:
            raise TraceError(f"{path}: no trace events (only log noise), expected JSON event lines")
    _check_within_run(events)
    _check_complete(events, devices)
    return events


def _check_within_run(events: list[dict]) -> None:
    """No event lasts longer than the rest of the run spans, or lies further from it than that
    span: such an event cannot belong to it.

    A clock jump or a corrupt field (a compute event of 10^15 ns, twelve days, in a run of
    seconds) imported cleanly and then stretched the measured window by a million, so the
    bubble error read millions of points and rho flipped sign. The rest of the run is every
    other event: the span from the earliest start to the latest end among them (the two
    earliest starts and latest ends give it for every event in one pass).
    """
    if len(events) < 2:
        return
    starts = heapq.nsmallest(2, range(len(events)), key=lambda k: events[k]["start_wall_ns"])
    ends = heapq.nlargest(2, range(len(events)), key=lambda k: events[k]["end_wall_ns"])
    for k, e in enumerate(events):
        first = events[starts[1] if k == starts[0] else starts[0]]["start_wall_ns"]
        last = events[ends[1] if k == ends[0] else ends[0]]["end_wall_ns"]
        span = max(last - first, 0)
        took = e["end_wall_ns"] - e["start_wall_ns"]
        if took > span:
            raise TraceError(f"{e['_file']}:{e['_line']}: event lasts {took:,} ns ({took / 1e9:.3g} s) but the rest "
                             f"of the run spans {span:,} ns ({span / 1e9:.3g} s), expected an event inside its run "
                             f"(a clock jump or a corrupt start_wall_ns/end_wall_ns?)")
        apart = max(first - e["end_wall_ns"], e["start_wall_ns"] - last)
        if apart > span:
            raise TraceError(f"{e['_file']}:{e['_line']}: event lies {apart:,} ns ({apart / 1e9:.3g} s) "
                             f"{'before' if first > e['end_wall_ns'] else 'after'} the rest of the run, which spans "
                             f"{span:,} ns ({span / 1e9:.3g} s), expected an event inside its run (a clock jump or a "
                             f"corrupt start_wall_ns/end_wall_ns?)")


def _check_complete(events: list[dict], devices: tuple[str, ...]) -> None:
    """Every stage ran the forward and the backward of every microbatch of every iteration.

    A rank file cut short at a line boundary parses cleanly; this is where it shows,
    as microbatches (or whole iterations) missing from the stages that file logged.
    """
    m = 1 + max((e["microbatch"] for e in events if e["phase"] != "OPTIMIZER"), default=0)
    iterations = sorted({e["iteration"] for e in events})
    seen: dict[tuple, set] = {}
    files: dict[int, set] = {}
    for e in events:
        if e["event_type"] == "compute" and e["phase"] != "OPTIMIZER":
            key = (e["stage"], e["iteration"], "F" if e["phase"] == "FORWARD" else "B")
            seen.setdefault(key, set()).add(e["microbatch"])
            files.setdefault(e["stage"], set()).add(e["_file"].name)
    for s, dev in enumerate(devices):
        if s not in files:
            raise TraceError(f"{events[0]['_file'].parent}: stage {s} ({dev}) has no compute events in any rank "
                             f"file, expected every stage of hops_trace_map.json to be traced (rank file missing?)")
        where = ", ".join(sorted(files[s]))
        for it in iterations:
            for ph, name in (("F", "forward"), ("B", "backward")):
                got = seen.get((s, it, ph), set())
                if len(got) != m:
                    lost = sorted(set(range(m)) - got)
                    raise TraceError(f"{where}: stage {s} has no {name} of microbatch {lost[0]} in iteration {it} "
                                     f"({len(got)} of {m}), expected every microbatch of every iteration "
                                     f"(file truncated?)")


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
    devices = stage_map(fixture_dir, token)
    files = trace_files(fixture_dir, token)
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
