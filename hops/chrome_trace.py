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
  start at ~1.7e15 µs) and rounded to ns; events are emitted in a fixed order and
  JSON keys are sorted, so the same Timeline always gives the same bytes.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from .timeline import Timeline

STAGES_PID, LINKS_PID, CLUSTER_PID = 1, 2, 3


def stage_track_name(stage: int, device: str) -> str:
    return f"stage {stage} ({device})"


def _assign_lanes(start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Greedy interval colouring: each event takes the lowest lane free at its start."""
    import heapq

    lanes = np.zeros(len(start), dtype=np.int64)
    busy: list[tuple[float, int]] = []
    free: list[int] = []
    n_lanes = 0
    for i in np.lexsort((end, start)):
        while busy and busy[0][0] <= start[i]:
            heapq.heappush(free, heapq.heappop(busy)[1])
        if free:
            ln = heapq.heappop(free)
        else:
            ln, n_lanes = n_lanes, n_lanes + 1
        lanes[i] = ln
        heapq.heappush(busy, (float(end[i]), ln))
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


def write_chrome_trace(timeline: Timeline, path) -> Path:
    """Write `timeline` as Chrome trace-event JSON to `path` and return the path."""
    tl = timeline
    path = Path(path)
    n = len(tl)
    n_st = tl.n_stages
    first_stage: dict[str, int] = {}
    for s, d in enumerate(tl.stage_devices):
        first_stage.setdefault(str(d), s)

    # ---- base track of every event: ("stage", s) | ("link", name) | ("cluster", "")
    tracks: list[tuple[str, object]] = []
    for kind, stage, src, dst, dev in zip(tl.kind.tolist(), tl.stage.tolist(), tl.src.tolist(),
                                          tl.dst.tolist(), tl.device.tolist()):
        if kind == "transfer" and (src or dst):
            tracks.append(("link", f"{src}->{dst}"))
        elif 0 <= stage < n_st:
            tracks.append(("stage", stage))
        elif dev in first_stage:
            tracks.append(("stage", first_stage[dev]))
        else:
            tracks.append(("cluster", ""))

    t0 = float(np.min(tl.start_ms)) if n else 0.0
    ts = np.round((tl.start_ms - t0) * 1000.0, 3)
    dur = np.round(np.maximum(tl.end_ms - tl.start_ms, 0.0) * 1000.0, 3)

    # ---- lanes per base track so no two slices on one thread overlap
    lane = np.zeros(n, dtype=np.int64)
    by_track: dict[tuple, list[int]] = {}
    for i, t in enumerate(tracks):
        by_track.setdefault(t, []).append(i)
    for idx in by_track.values():
        ix = np.asarray(idx)
        lane[ix] = _assign_lanes(ts[ix], ts[ix] + dur[ix])

    links = sorted({name for kind, name in tracks if kind == "link"},
                   key=lambda k: (first_stage.get(k.partition("->")[0], 1 << 30),
                                  first_stage.get(k.partition("->")[2], 1 << 30), k))
    n_lanes: dict[tuple, int] = {}
    for t, ln in zip(tracks, lane.tolist()):
        n_lanes[t] = max(n_lanes.get(t, 0), ln + 1)

    # ---- threads, in display order: stages by index, links in pipeline order, then cluster
    ordered = [(("stage", s), stage_track_name(s, str(d))) for s, d in enumerate(tl.stage_devices)]
    ordered += [(("link", k), k) for k in links]
    ordered += [(("cluster", ""), "cluster")] if ("cluster", "") in n_lanes else []
    pid_of = {"stage": STAGES_PID, "link": LINKS_PID, "cluster": CLUSTER_PID}
    tid: dict[tuple, int] = {}
    events: list[dict] = []
    for kind, pname in (("stage", "stages"), ("link", "links"), ("cluster", "cluster")):
        if any(t[0] == kind for t, _ in ordered):
            events.append({"ph": "M", "name": "process_name", "pid": pid_of[kind], "tid": 0,
                           "args": {"name": pname}})
            events.append({"ph": "M", "name": "process_sort_index", "pid": pid_of[kind], "tid": 0,
                           "args": {"sort_index": pid_of[kind]}})
    for track, name in ordered:
        for ln in range(n_lanes.get(track, 1)):
            t = tid[(track, ln)] = len(tid) + 1
            pid = pid_of[track[0]]
            events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": t,
                           "args": {"name": name + (f" #{ln + 1}" if ln else "")}})
            events.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": t,
                           "args": {"sort_index": t}})

    # ---- complete events, in timeline order (from_rows already sorts by start, end, stage)
    kinds, phases, devs = tl.kind.tolist(), tl.phase.tolist(), tl.device.tolist()
    mbs, its, stages = tl.microbatch.tolist(), tl.iteration.tolist(), tl.stage.tolist()
    srcs, dsts = tl.src.tolist(), tl.dst.tolist()
    ts_l, dur_l, lane_l = ts.tolist(), dur.tolist(), lane.tolist()
    for i in range(n):
        pid, t = pid_of[tracks[i][0]], tid[(tracks[i], lane_l[i])]
        args = {"microbatch": mbs[i], "phase": phases[i], "iteration": its[i], "stage": stages[i],
                "device": devs[i], "kind": kinds[i]}
        if kinds[i] == "transfer":
            args["src"], args["dst"] = srcs[i], dsts[i]
        events.append({"ph": "X", "name": _slice_name(kinds[i], phases[i]), "cat": kinds[i], "pid": pid,
                       "tid": t, "ts": ts_l[i], "dur": dur_l[i], "args": args})

    doc_head = {"displayTimeUnit": "ms",
                "otherData": _json_safe({"t0_ms": t0, "stage_devices": list(tl.stage_devices),
                                         "microbatches_per_iteration": tl.microbatches_per_iteration,
                                         "meta": tl.meta or {}})}
    # One event per line: diffable, and still streams fine for 100k+ events.
    with open(path, "w") as fh:
        fh.write("{")
        for k, v in sorted(doc_head.items()):
            fh.write(json.dumps(k) + ": " + json.dumps(v, sort_keys=True) + ",\n")
        fh.write('"traceEvents": [\n')
        fh.write(",\n".join(json.dumps(e, sort_keys=True, separators=(",", ":")) for e in events))
        fh.write("\n]}\n")
    return path
