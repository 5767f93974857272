"""Chrome trace-event JSON of a Timeline, for zooming into a run in Perfetto / chrome://tracing.

Why this layout:
- Process "stages" holds one thread per stage (compute, optimizer, and all-reduce /
  failure rows that belong to that stage or its device); process "links" holds one
  thread per directed link "src->dst" with its transfers. Rows that fit neither go to
  a "cluster" thread. Sort-index metadata keeps stage 10 after stage 9.
- Perfetto only renders properly nested slices on one thread. Overlapping events
  (an all-reduce overlapping backward, concurrent transfers on one link) are moved
  to extra threads named "<track> #2", "#3"... instead of being silently mangled.
- Slice names are the phase ("F", "B", "W", "BW", "OPT", "send F", ...), because
  Perfetto colours slices by name: every forward gets the same colour. The microbatch,
  iteration, stage and device are in args.
- Times are shifted so the first event starts at 0 (wall-clock traces otherwise
  start at ~1.7e15 µs). Start and end are rounded to whole ns first and `dur` is
  their difference: rounding `ts` and `dur` separately made back-to-back events
  overlap by 1 ns, which Perfetto draws as a second lane for every stage.
- Events are written by a formatting template, not one json.dumps per event, so a
  million-event trace costs about a second; `trace.json.gz` (which Perfetto opens
  as is) is about 15x smaller. Events come in a fixed order with sorted keys, so the
  same Timeline always gives the same bytes.
"""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np

from .timeline import Timeline

STAGES_PID, LINKS_PID, CLUSTER_PID = 1, 2, 3
GZIP_LEVEL = 3  # level 6 triples the write time for a few % smaller files


def stage_track_name(stage: int, device: str) -> str:
    return f"stage {stage} ({device})"


def _assign_lanes(start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Greedy interval colouring: each event takes the lowest lane free at its start."""
    import heapq

    order = np.lexsort((end, start))
    s, e = start[order], end[order]
    if len(s) < 2 or bool(np.all(s[1:] >= np.maximum.accumulate(e)[:-1])):
        return np.zeros(len(start), dtype=np.int64)  # nothing overlaps: one lane (the usual case)
    lanes = np.zeros(len(start), dtype=np.int64)
    busy: list[tuple[int, int]] = []
    free: list[int] = []
    n_lanes = 0
    for i in order.tolist():
        while busy and busy[0][0] <= start[i]:
            heapq.heappush(free, heapq.heappop(busy)[1])
        if free:
            ln = heapq.heappop(free)
        else:
            ln, n_lanes = n_lanes, n_lanes + 1
        lanes[i] = ln
        heapq.heappush(busy, (int(end[i]), ln))
    return lanes


def _slice_name(kind: str, phase: str) -> str:
    if kind == "compute":
        return phase or "compute"
    if kind == "optimizer":
        return "OPT"
    if kind == "transfer":
        return f"send {phase}" if phase else "send"
    return kind


def _json_safe(obj):
    return json.loads(json.dumps(obj, sort_keys=True, default=str))


def event_times_ns(timeline: Timeline) -> tuple[np.ndarray, np.ndarray, float]:
    """Start and end of every event in whole ns since the first event, and that first start (ms)."""
    tl = timeline
    t0 = float(np.min(tl.start_ms)) if len(tl) else 0.0
    start = np.rint((tl.start_ms - t0) * 1e6).astype(np.int64)
    end = np.maximum(np.rint((tl.end_ms - t0) * 1e6).astype(np.int64), start)
    return start, end, t0


def write_chrome_trace(timeline: Timeline, path, *, compress: bool | None = None) -> Path:
    """Write `timeline` as Chrome trace-event JSON to `path` and return the path.

    `compress` gzips the file (default: when `path` ends in .gz); Perfetto opens either.
    """
    tl = timeline
    path = Path(path)
    compress = path.suffix == ".gz" if compress is None else compress
    n = len(tl)
    n_st = tl.n_stages
    first_stage: dict[str, int] = {}
    for s, d in enumerate(tl.stage_devices):
        first_stage.setdefault(str(d), s)

    # ---- base track of every event: a stage, a link "src->dst", or the cluster row
    kinds, stages = tl.kind.astype(str), tl.stage
    is_link = (kinds == "transfer") & ((tl.src != "") | (tl.dst != ""))
    src_l, dst_l = tl.src.tolist(), tl.dst.tolist()
    link_names = np.asarray([f"{src_l[i]}->{dst_l[i]}" for i in np.flatnonzero(is_link).tolist()], dtype=str)
    dev_stage = np.asarray([first_stage.get(d, -1) for d in tl.device.tolist()], dtype=np.int64)
    on_own_stage = (stages >= 0) & (stages < n_st)
    track_stage = np.where(on_own_stage, stages, dev_stage)  # -1: cluster
    uniq_links, link_idx = np.unique(link_names, return_inverse=True)
    links = sorted(uniq_links.tolist(), key=lambda k: (first_stage.get(k.partition("->")[0], 1 << 30),
                                                       first_stage.get(k.partition("->")[2], 1 << 30), k))
    # one integer per base track: stages 0..n_st-1, links n_st.., cluster last
    link_pos = {k: n_st + i for i, k in enumerate(links)}
    cluster = n_st + len(links)
    track = np.where(track_stage >= 0, track_stage, cluster).astype(np.int64)
    if is_link.any():
        track[is_link] = np.asarray([link_pos[k] for k in uniq_links.tolist()], dtype=np.int64)[link_idx]

    start_ns, end_ns, t0 = event_times_ns(tl)

    # ---- lanes per base track so no two slices on one thread overlap
    lane = np.zeros(n, dtype=np.int64)
    by_track = np.argsort(track, kind="stable")
    bounds = np.flatnonzero(np.diff(track[by_track])) + 1
    for ix in np.split(by_track, bounds) if n else []:
        lane[ix] = _assign_lanes(start_ns[ix], end_ns[ix])
    n_lanes = np.zeros(cluster + 1, dtype=np.int64)
    np.maximum.at(n_lanes, track, lane + 1)

    # ---- threads, in display order: stages by index, links in pipeline order, then cluster
    ordered = [(s, STAGES_PID, stage_track_name(s, str(d))) for s, d in enumerate(tl.stage_devices)]
    ordered += [(link_pos[k], LINKS_PID, k) for k in links]
    ordered += [(cluster, CLUSTER_PID, "cluster")] if n_lanes[cluster] else []
    meta: list[dict] = []
    for pid, pname in ((STAGES_PID, "stages"), (LINKS_PID, "links"), (CLUSTER_PID, "cluster")):
        if any(p == pid for _, p, _ in ordered):
            meta.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": pname}})
            meta.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0,
                         "args": {"sort_index": pid}})
    first_tid = np.zeros(cluster + 1, dtype=np.int64)
    pid_of = np.zeros(cluster + 1, dtype=np.int64)
    t = 0
    for tr, pid, name in ordered:
        first_tid[tr], pid_of[tr] = t + 1, pid
        for ln in range(max(int(n_lanes[tr]), 1)):
            t += 1
            meta.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": t,
                         "args": {"name": name + (f" #{ln + 1}" if ln else "")}})
            meta.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": t, "args": {"sort_index": t}})
    tid = (first_tid[track] + lane).tolist()
    pid_l = pid_of[track].tolist()

    # ---- complete events, in timeline order (from_rows already sorts by start, end, stage);
    # keys in sorted order, as json.dumps(sort_keys=True) would write them. ns / 1000 prints
    # as the exact µs decimal (shortest float repr), so ts + dur lands on the next ts.
    q = {v: json.dumps(v) for col in (tl.device.tolist(), src_l, dst_l, tl.phase.tolist(), kinds.tolist())
         for v in set(col)}
    kind_l, phases = kinds.tolist(), tl.phase.tolist()
    names = {(k, p): json.dumps(_slice_name(k, p)) for k, p in set(zip(kind_l, phases))}
    cols = ([q[v] for v in tl.device.tolist()], tl.iteration.tolist(), [q[v] for v in kind_l],
            tl.microbatch.tolist(), [q[v] for v in phases], stages.tolist(),
            ((end_ns - start_ns) / 1000.0).tolist(), [names[kp] for kp in zip(kind_l, phases)],
            pid_l, tid, (start_ns / 1000.0).tolist())
    xfer = kinds == "transfer"  # transfers also carry src / dst
    dst_x = [f',"dst":{q[d]}' if x else "" for d, x in zip(dst_l, xfer.tolist())]
    src_x = [f',"src":{q[v]}' if x else "" for v, x in zip(src_l, xfer.tolist())]
    template = ('{"args":{"device":%s%s,"iteration":%d,"kind":%s,"microbatch":%d,"phase":%s%s,"stage":%d},'
                '"cat":%s,"dur":%r,"name":%s,"ph":"X","pid":%d,"tid":%d,"ts":%r}')
    lines = [template % (d, dx, it, k, mb, ph, sx, st, k, du, nm, pi, ti, ts)
             for d, dx, it, k, mb, ph, sx, st, du, nm, pi, ti, ts in zip(cols[0], dst_x, *cols[1:5], src_x,
                                                                           *cols[5:])]

    doc_head = {"displayTimeUnit": "ms",
                "otherData": _json_safe({"t0_ms": t0, "stage_devices": list(tl.stage_devices),
                                         "microbatches_per_iteration": tl.microbatches_per_iteration,
                                         "meta": tl.meta or {}})}
    head = "".join(json.dumps(k) + ": " + json.dumps(v, sort_keys=True) + ",\n" for k, v in sorted(doc_head.items()))
    body = ",\n".join([*(json.dumps(e, sort_keys=True, separators=(",", ":")) for e in meta), *lines])
    text = "{" + head + '"traceEvents": [\n' + body + "\n]}\n"  # one event per line: diffable
    if compress:
        # mtime=0 and no file name in the header: the same trace gives the same bytes
        with open(path, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=GZIP_LEVEL,
                                                    mtime=0, filename="") as fh:
            fh.write(text.encode())
    else:
        path.write_text(text)
    return path
