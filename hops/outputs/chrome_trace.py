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
  iteration, stage and device are in args; with virtual stages (a timeline of more than
  one chunk per stage) also the chunk, so a stage's two ZB-V chunks can be told apart.
  A one-chunk timeline's events carry no chunk: its trace keeps its bytes.
- Times are shifted so the first event starts at 0 (wall-clock traces otherwise
  start at ~1.7e15 µs). Start and end are rounded to whole ns first and `dur` is
  their difference: rounding `ts` and `dur` separately made back-to-back events
  overlap by 1 ns, which Perfetto draws as a second lane for every stage.
- Events are printed a block of rows at a time (hops.outputs.text_columns: the text a few
  hundred device / phase / track combinations share, plus digit columns), not one
  json.dumps or `%` per event, and streamed to the file: a million-event trace costs
  well under the simulation that produced it. The bytes are those json.dumps would
  write (sorted keys, shortest float repr); times a block cannot print fall back to
  json.dumps per event. `trace.json.gz` (which Perfetto opens as is) is about 7x
  smaller. Events come in a fixed order, so the same Timeline always gives the same bytes.
"""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np

from hops.outputs.text_columns import INT, US, combine, factorize, render
from hops.timeline import KINDS, PHASES, Timeline

STAGES_PID, LINKS_PID, CLUSTER_PID = 1, 2, 3
GZIP_LEVEL = 3  # levels 1-3 compress this text equally fast (~120 MB/s), 3 the smallest; 6 takes 2.3x longer


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
    if kind == "collective":
        return f"TP collectives {phase}"
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

    # ---- every string column as codes into its distinct values (a few hundred at most)
    kinds, kind_c = factorize(tl.kind, KINDS)
    devices, dev_c = factorize(tl.device)
    phases, phase_c = factorize(tl.phase, PHASES)
    xfer = kind_c == (kinds.index("transfer") if "transfer" in kinds else -1)  # only these print src / dst
    ends, end_c = factorize(np.concatenate([tl.src[xfer], tl.dst[xfer]]))
    src_c, dst_c = np.full(n, -1, dtype=np.int64), np.full(n, -1, dtype=np.int64)
    src_c[xfer], dst_c[xfer] = np.split(end_c, 2)
    stages = tl.stage

    # ---- base track of every event: a stage, a link "src->dst", or the cluster row
    no_end = ends.index("") if "" in ends else -1
    is_link = xfer & ((src_c != no_end) | (dst_c != no_end))
    pair = src_c * max(len(ends), 1) + dst_c
    pairs = np.unique(pair[is_link]).tolist()
    pair_name = {k: f"{ends[k // len(ends)]}->{ends[k % len(ends)]}" for k in pairs}
    dev_stage = np.asarray([first_stage.get(d, -1) for d in devices], dtype=np.int64)[dev_c]
    on_own_stage = (stages >= 0) & (stages < n_st)
    track_stage = np.where(on_own_stage, stages, dev_stage)  # -1: cluster
    links = sorted(set(pair_name.values()), key=lambda k: (first_stage.get(k.partition("->")[0], 1 << 30),
                                                          first_stage.get(k.partition("->")[2], 1 << 30), k))
    # one integer per base track: stages 0..n_st-1, links n_st.., cluster last
    link_pos = {k: n_st + i for i, k in enumerate(links)}
    cluster = n_st + len(links)
    track = np.where(track_stage >= 0, track_stage, cluster).astype(np.int64)
    if pairs:
        track[is_link] = np.asarray([link_pos[pair_name[k]] for k in pairs], dtype=np.int64)[
            np.searchsorted(pairs, pair[is_link])]

    start_ns, end_ns, t0 = event_times_ns(tl)

    # ---- lanes per base track so no two slices on one thread overlap
    lane = np.zeros(n, dtype=np.int64)
    by_track = np.argsort(track.astype(np.int16) if cluster < 1 << 15 else track, kind="stable")  # radix sort
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
    tid = first_tid[track] + lane

    # ---- complete events, in timeline order (from_rows already sorts by start, end, stage),
    # each line led by the ",\n" that separates it from the one before
    chunk = event_chunks(tl)
    rep, combo = combine([dev_c, kind_c, phase_c, src_c, dst_c, stages, tid] + ([chunk] if chunk is not None else []))
    parts: list[list[bytes]] = [[], [], [], [], []]
    for i in rep.tolist():
        x = bool(xfer[i])
        texts = _event_parts(devices[dev_c[i]], kinds[kind_c[i]], phases[phase_c[i]], ends[src_c[i]] if x else None,
                             ends[dst_c[i]] if x else None, int(stages[i]), int(pid_of[track[i]]), int(tid[i]),
                             None if chunk is None or chunk[i] < 0 else int(chunk[i]))
        for j, text in enumerate(texts):
            parts[j].append(text.encode())
    dur_ns = end_ns - start_ns
    blocks = render(parts, combo, [(INT, tl.iteration), (INT, tl.microbatch), (US, dur_ns), (US, start_ns)])
    if blocks is None:  # times a block cannot print (huge or not finite): one json.dumps per event
        blocks = _event_lines(tl, kinds, kind_c, devices, dev_c, phases, phase_c, ends, src_c, dst_c, xfer,
                              pid_of[track], tid, start_ns, dur_ns, chunk)

    doc_head = {"displayTimeUnit": "ms",
                "otherData": _json_safe({"t0_ms": t0, "stage_devices": list(tl.stage_devices),
                                         "microbatches_per_iteration": tl.microbatches_per_iteration,
                                         "meta": tl.meta or {}})}
    head = "".join(json.dumps(k) + ": " + json.dumps(v, sort_keys=True) + ",\n" for k, v in sorted(doc_head.items()))
    meta_text = ",\n".join(json.dumps(e, sort_keys=True, separators=(",", ":")) for e in meta)

    def write(fh) -> None:  # one event per line: diffable
        fh.write(("{" + head + '"traceEvents": [\n' + meta_text).encode())
        lead = not meta_text  # the first event then needs no separator
        for block in blocks:
            fh.write(block[2:] if lead and block else block)
            lead = lead and not block
        fh.write(b"\n]}\n")

    with open(path, "wb") as raw:
        if compress:
            # mtime=0 and no file name in the header: the same trace gives the same bytes
            with gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=GZIP_LEVEL, mtime=0, filename="") as fh:
                write(fh)
        else:
            write(raw)
    return path


def event_chunks(timeline: Timeline) -> np.ndarray | None:
    """The chunk of every event for the args, or None when the timeline has one chunk per stage."""
    return timeline.chunk if timeline.n_chunks > 1 else None


def _event_parts(device: str, kind: str, phase: str, src: str | None, dst: str | None, stage: int, pid: int,
                 tid: int, chunk: int | None = None) -> list[str]:
    """A complete event's line around its numbers (iteration, microbatch, dur, ts), led by ",\\n".

    Keys in sorted order, as json.dumps(sort_keys=True) writes them; transfers also carry
    src and dst, events of a chunk under virtual stages their chunk.
    """
    q = json.dumps
    head = '{"args":{' + (f'"chunk":{chunk},' if chunk is not None else "") + '"device":' + q(device)
    return [",\n" + head + (f',"dst":{q(dst)}' if dst is not None else "") + ',"iteration":',
            ',"kind":' + q(kind) + ',"microbatch":',
            ',"phase":' + q(phase) + (f',"src":{q(src)}' if src is not None else "") + f',"stage":{stage}}},'
            + '"cat":' + q(kind) + ',"dur":',
            ',"name":' + q(_slice_name(kind, phase)) + f',"ph":"X","pid":{pid},"tid":{tid},"ts":',
            "}"]


def _event_lines(tl, kinds, kind_c, devices, dev_c, phases, phase_c, ends, src_c, dst_c, xfer, pid, tid,
                 start_ns, dur_ns, chunk=None):
    """The same lines as the block formatter, one json.dumps per event (any float json prints)."""
    for i in range(len(tl)):
        k, ph = kinds[kind_c[i]], phases[phase_c[i]]
        args = {"device": devices[dev_c[i]], "iteration": int(tl.iteration[i]), "kind": k,
                "microbatch": int(tl.microbatch[i]), "phase": ph, "stage": int(tl.stage[i])}
        if xfer[i]:
            args.update(src=ends[src_c[i]], dst=ends[dst_c[i]])
        if chunk is not None and chunk[i] >= 0:
            args["chunk"] = int(chunk[i])
        event = {"args": args, "cat": k, "dur": float(dur_ns[i]) / 1000.0, "name": _slice_name(k, ph), "ph": "X",
                 "pid": int(pid[i]), "tid": int(tid[i]), "ts": float(start_ns[i]) / 1000.0}
        yield (",\n" + json.dumps(event, sort_keys=True, separators=(",", ":"))).encode()
