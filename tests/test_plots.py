"""Specifications for the run pictures (timeline PNG, dashboard PNG) and the Chrome trace.

The Timelines are generated here (a plain GPipe layout) so these tests depend on
nothing but the Timeline contract, not on the engine or on fixtures.
"""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from hops.outputs.chrome_trace import stage_track_name, write_chrome_trace
from hops.metrics import summarize
from hops.timeline import Timeline

REPO = Path(__file__).resolve().parents[1]

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
COLUMNS = ("kind", "stage", "device", "microbatch", "phase", "start_ms", "end_ms", "src", "dst", "iteration")


def gpipe_timeline(stages: int, microbatches: int, iterations: int = 2, *, failure: bool = True,
                   fwd_ms: float = 2.0, xfer_ms: float = 0.3) -> Timeline:
    """All forwards, then all backwards, per iteration; one optimizer step per stage; no overlaps per track."""
    devices = [f"gpu{s}" for s in range(stages)]
    rows = {c: [] for c in COLUMNS}

    def add(kind, stage, mb, phase, start, end, src="", dst="", it=0):
        for c, v in zip(COLUMNS, (kind, stage, devices[stage], mb, phase, start, end, src, dst, it)):
            rows[c].append(v)

    t = 0.0
    for it in range(iterations):
        base = it * microbatches
        slot = fwd_ms + xfer_ms
        for m in range(microbatches):
            for s in range(stages):
                st = t + (m + s) * slot
                add("compute", s, base + m, "F", st, st + fwd_ms, it=it)
                if s + 1 < stages:
                    add("transfer", s, base + m, "F", st + fwd_ms, st + slot, devices[s], devices[s + 1], it)
        t_b = t + (microbatches + stages - 1) * slot
        bslot = 2 * fwd_ms + xfer_ms
        for m in range(microbatches):
            for s in reversed(range(stages)):
                st = t_b + (m + stages - 1 - s) * bslot
                add("compute", s, base + m, "B", st, st + 2 * fwd_ms, it=it)
                if s > 0:
                    add("transfer", s, base + m, "B", st + 2 * fwd_ms, st + bslot, devices[s], devices[s - 1], it)
        t_end = t_b + (microbatches + stages - 1) * bslot
        for s in range(stages):
            add("optimizer", s, -1, "OPT", t_end, t_end + 1.0, it=it)
        t = t_end + 1.0
    if failure:
        # between iterations, on the middle stage: does not overlap anything on that track
        add("failure", stages // 2, -1, "", t, t + 0.5, it=-1)
    return Timeline.from_rows(rows, stage_devices=devices, microbatches_per_iteration=microbatches,
                              meta={"schedule": "gpipe", "seed": 7})


def full_summary(tl: Timeline) -> dict:
    s = summarize(tl)
    s.update(schedule="gpipe", seed=7)
    s["memory_capacity_mb"] = {d: 24576.0 for d in tl.stage_devices}
    s["peak_memory_mb"] = {d: 1000.0 * (i + 1) for i, d in enumerate(tl.stage_devices)}
    s["link_contention"] = {k: {"transfers": 10, "contended": i % 4, "wait_ms": 0.5 * i}
                            for i, k in enumerate(s["utilization"]["per_link"])}
    return s


def load_trace(path):
    doc = json.loads(path.read_text())
    assert isinstance(doc["traceEvents"], list)
    return doc["traceEvents"]


def thread_names(events) -> dict[tuple[int, int], str]:
    return {(e["pid"], e["tid"]): e["args"]["name"] for e in events
            if e["ph"] == "M" and e["name"] == "thread_name"}


# ---------------------------------------------------------------- chrome trace

def spans_by_track(events) -> list[list[tuple]]:
    """Each Perfetto track's (start, end) slices, in time order."""
    by_thread: dict[tuple, list] = {}
    for e in events:
        if e["ph"] == "X":
            by_thread.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"]))
    return [sorted(spans) for spans in by_thread.values()]


def test_chrome_trace_is_json_with_complete_events(tmp_path):
    tl = gpipe_timeline(4, 6)
    events = load_trace(write_chrome_trace(tl, tmp_path / "trace.json"))
    xs = [e for e in events if e["ph"] == "X"]
    assert len(xs) == len(tl)
    for e in xs:
        for key in ("ph", "ts", "dur", "pid", "tid", "name"):
            assert key in e, (key, e)
        assert e["ts"] >= 0 and e["dur"] >= 0
        assert {"microbatch", "phase", "iteration"} <= set(e["args"])
    names = thread_names(events)
    assert all((e["pid"], e["tid"]) in names for e in xs), "every slice sits on a named track"


def test_chrome_trace_tracks_are_stages_and_links(tmp_path):
    tl = gpipe_timeline(5, 4)
    events = load_trace(write_chrome_trace(tl, tmp_path / "trace.json"))
    expected_stages = {stage_track_name(s, d) for s, d in enumerate(tl.stage_devices)}
    transfer = tl.kind == "transfer"
    expected_links = {f"{a}->{b}" for a, b in zip(tl.src[transfer], tl.dst[transfer])}
    assert set(thread_names(events).values()) == expected_stages | expected_links
    # transfers go on link tracks, compute/optimizer/failure on stage tracks
    names = thread_names(events)
    for e in events:
        if e["ph"] == "X":
            track = names[(e["pid"], e["tid"])]
            assert (track in expected_links) == (e["cat"] == "transfer"), (track, e)


def test_chrome_trace_microseconds_and_phase_names(tmp_path):
    tl = gpipe_timeline(2, 3, iterations=1, failure=False)
    events = [e for e in load_trace(write_chrome_trace(tl, tmp_path / "t.json")) if e["ph"] == "X"]
    first_f = next(e for e in events if e["cat"] == "compute" and e["name"] == "F")
    assert first_f["ts"] == 0 and first_f["dur"] == pytest.approx(2000.0)
    assert {e["name"] for e in events if e["cat"] == "compute"} == {"F", "B"}


def test_chrome_trace_is_deterministic(tmp_path):
    a = write_chrome_trace(gpipe_timeline(8, 8), tmp_path / "a.json").read_bytes()
    b = write_chrome_trace(gpipe_timeline(8, 8), tmp_path / "b.json").read_bytes()
    assert a == b


def test_back_to_back_events_share_one_lane_per_stage_and_link(tmp_path):
    """A simulated 1F1B run: every event starts where the previous one on its track ended.

    Separately rounded ts and dur used to make such neighbours overlap by 1 ns, which
    opened a spurious "#2" lane for every stage.
    """
    from hops import simulate

    doc = {"simulation": {"batches": 2, "microbatches": 16, "seed": 3},
           "pipeline": {"schedule": "1f1b", "compute_jitter": 0.05,
                        "stages": [{"device": f"g{i}", "weights_mb": 100,
                                    "compute": {"mode": "analytical", "tflop": 0.06, "memory_mb": 33}}
                                   for i in range(4)]},
           "hardware": {"devices": [{"id": f"g{i}", "gpu": "h100", "node": f"n{i}"} for i in range(4)],
                        "interconnect": {"same_node": "nvlink", "cross_node": "infiniband"}}}
    tl = simulate(doc).timeline
    events = load_trace(write_chrome_trace(tl, tmp_path / "trace.json"))
    transfer = tl.kind == "transfer"
    links = {f"{a}->{b}" for a, b in zip(tl.src[transfer], tl.dst[transfer])}
    names = sorted(thread_names(events).values())
    assert len(names) == tl.n_stages + len(links), names
    assert not [n for n in names if "#" in n]
    # and the slices still tile each track exactly: ts + dur of one is the next one's ts
    for spans in spans_by_track(events):
        assert all(round(prev[1], 3) <= nxt[0] for prev, nxt in zip(spans, spans[1:]))


def test_chrome_trace_gz_is_the_same_trace_compressed(tmp_path):
    import gzip

    tl = gpipe_timeline(6, 10)
    plain = write_chrome_trace(tl, tmp_path / "trace.json").read_bytes()
    packed = write_chrome_trace(tl, tmp_path / "trace.json.gz").read_bytes()
    assert packed[:2] == b"\x1f\x8b" and gzip.decompress(packed) == plain
    assert len(packed) < len(plain) / 4
    again = write_chrome_trace(tl, tmp_path / "again.json.gz").read_bytes()
    assert again == packed, "no timestamp or file name in the gzip header: same trace, same bytes"


def test_chrome_trace_slices_match_the_timeline(tmp_path):
    """Every event appears once with its own times (µs, exact to the ns), phase and ids."""
    tl = gpipe_timeline(3, 5)
    xs = [e for e in load_trace(write_chrome_trace(tl, tmp_path / "t.json")) if e["ph"] == "X"]
    t0 = float(tl.start_ms.min())
    assert [e["ts"] for e in xs] == [round((s - t0) * 1000, 3) for s in tl.start_ms.tolist()]
    assert [e["dur"] for e in xs] == pytest.approx([(e - s) * 1000 for s, e in zip(tl.start_ms, tl.end_ms)],
                                                   abs=1e-3)
    assert [(e["args"]["microbatch"], e["args"]["stage"], e["cat"]) for e in xs] == \
        list(zip(tl.microbatch.tolist(), tl.stage.tolist(), tl.kind.tolist()))
    for e, src, dst in zip(xs, tl.src.tolist(), tl.dst.tolist()):
        if e["cat"] == "transfer":
            assert (e["args"]["src"], e["args"]["dst"]) == (src, dst)
        else:
            assert "src" not in e["args"]


def test_overlapping_events_get_their_own_lane(tmp_path):
    """Perfetto mis-draws overlapping slices on one thread; they must be split into lanes."""
    rows = {c: [] for c in COLUMNS}
    for vals in (("compute", 0, "g0", 0, "F", 0.0, 4.0, "", "", 0),
                 ("allreduce", 0, "g0", -1, "", 2.0, 6.0, "", "", 0),       # overlaps compute
                 ("transfer", 0, "g0", 0, "F", 4.0, 8.0, "g0", "g1", 0),
                 ("transfer", 0, "g0", 1, "F", 5.0, 7.0, "g0", "g1", 0),    # concurrent on the link
                 ("compute", 1, "g1", 0, "F", 8.0, 10.0, "", "", 0)):
        for c, v in zip(COLUMNS, vals):
            rows[c].append(v)
    tl = Timeline.from_rows(rows, stage_devices=["g0", "g1"], microbatches_per_iteration=1)
    events = load_trace(write_chrome_trace(tl, tmp_path / "t.json"))
    for spans in spans_by_track(events):
        assert all(prev[1] <= nxt[0] for prev, nxt in zip(spans, spans[1:]))
    names = set(thread_names(events).values())
    assert {"stage 0 (g0)", "stage 0 (g0) #2", "g0->g1", "g0->g1 #2", "stage 1 (g1)"} == names



def odd_trace_timeline() -> Timeline:
    """Overlaps (extra lanes), a cluster row, a transfer without ends, names JSON must escape, -1 ids."""
    rows = {c: [] for c in COLUMNS}
    for vals in (("compute", 0, 'g"0', 0, "F", 0.0, 4.0, "", "", 0),
                 ("allreduce", 0, 'g"0', -1, "", 2.0, 6.0000001, "", "", 0),
                 ("transfer", 0, 'g"0', 0, "F", 4.0, 8.123, 'g"0', "gé1", 0),
                 ("transfer", 0, 'g"0', 1, "F", 5.0, 7.5, 'g"0', "gé1", 0),
                 ("transfer", 1, "gé1", 1, "B", 7.5, 7.5, "", "", 0),
                 ("failure", -1, "spare", -1, "", 1.0, 1000.25, "", "", -1),
                 ("compute", 1, "gé1", 0, "F", 8.0, 12345.6789, "", "", 1)):
        for c, v in zip(COLUMNS, vals):
            rows[c].append(v)
    return Timeline.from_rows(rows, stage_devices=['g"0', "gé1"], microbatches_per_iteration=1)


@pytest.mark.parametrize("case", ["gpipe", "odd", "empty", "chunks"])
def test_chrome_trace_blocks_are_the_bytes_of_one_json_dumps_per_event(tmp_path, monkeypatch, case):
    """The block formatter (hops.outputs.text_columns) against the plain writer it falls back to."""
    import hops.outputs.chrome_trace

    tl = {"gpipe": lambda: gpipe_timeline(5, 7), "odd": odd_trace_timeline,
          "chunks": lambda: with_chunks(gpipe_timeline(5, 7)),
          "empty": lambda: Timeline.from_rows({c: [] for c in COLUMNS}, stage_devices=["a"],
                                              microbatches_per_iteration=1)}[case]()
    fast = write_chrome_trace(tl, tmp_path / "fast.json").read_bytes()
    monkeypatch.setattr(hops.outputs.chrome_trace, "render", lambda *args, **kwargs: None)
    assert write_chrome_trace(tl, tmp_path / "plain.json").read_bytes() == fast
    assert len(load_trace(tmp_path / "fast.json")) >= len(tl)


# ---------------------------------------------------------------- PNGs

def assert_png(path):
    data = path.read_bytes()
    assert len(data) > 1000 and data[:8] == PNG_MAGIC


@pytest.mark.parametrize("stages", [2, 8, 64])
def test_timeline_png(tmp_path, stages):
    from hops.outputs.plots import plot_timeline

    tl = gpipe_timeline(stages, 12 if stages == 64 else 24)
    assert_png(plot_timeline(tl, tmp_path / "timeline.png"))


@pytest.mark.parametrize("stages", [2, 8, 64])
def test_dashboard_png(tmp_path, stages):
    from hops.outputs.plots import plot_dashboard

    tl = gpipe_timeline(stages, 12 if stages == 64 else 24)
    assert_png(plot_dashboard(full_summary(tl), tl, tmp_path / "dashboard.png"))


def test_dashboard_without_simulator_only_sections(tmp_path):
    """A measured trace has no memory or contention model; the dashboard still renders."""
    from hops.outputs.plots import plot_dashboard

    tl = gpipe_timeline(3, 6)
    assert_png(plot_dashboard(summarize(tl), tl, tmp_path / "d.png"))


def test_dense_timeline_and_title(tmp_path):
    from hops.outputs.plots import plot_timeline

    tl = gpipe_timeline(4, 400, iterations=1)   # bars far narrower than a pixel
    assert_png(plot_timeline(tl, tmp_path / "t.png", title="dense"))


def test_empty_timeline_does_not_crash(tmp_path):
    from hops.outputs.plots import plot_timeline

    tl = Timeline.from_rows({c: [] for c in COLUMNS}, stage_devices=["a", "b"], microbatches_per_iteration=1)
    assert_png(plot_timeline(tl, tmp_path / "t.png"))
    load_trace(write_chrome_trace(tl, tmp_path / "t.json"))


def test_importing_plots_does_not_import_matplotlib():
    code = ("import sys, hops.timeline, hops.metrics, hops.outputs.plots, hops.outputs.chrome_trace; "
            "sys.exit(1 if 'matplotlib' in sys.modules else 0)")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_plots_and_chrome_trace_are_there_after_import_hops_and_loaded_only_when_used(tmp_path):
    """README's "Using the library directly": hops.outputs.plots.plot_timeline(...) right after `import hops`."""
    code = ("import sys, hops; "
            "assert 'hops.outputs.plots' not in sys.modules and 'hops.outputs.chrome_trace' not in sys.modules; "
            "r = hops.simulate('conf/scenario/h100_pair.yaml'); "
            f"hops.outputs.plots.plot_timeline(r.timeline, {str(tmp_path / 't.png')!r}); "
            f"hops.outputs.chrome_trace.write_chrome_trace(r.timeline, {str(tmp_path / 'trace.json')!r}); "
            "assert 'plots' in dir(hops.outputs) and 'chrome_trace' in dir(hops.outputs)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, "MPLBACKEND": "Agg"})
    assert proc.returncode == 0, proc.stderr
    assert_png(tmp_path / "t.png")
    assert json.loads((tmp_path / "trace.json").read_text())["traceEvents"]


# ---------------------------------------------------------------- dashboard contents
def drawn_figure(monkeypatch, summary, tl, tmp_path, **kw):
    """Render the dashboard and return the matplotlib Figure it saved."""
    from matplotlib.figure import Figure

    from hops.outputs.plots import plot_dashboard

    seen = []
    orig = Figure.savefig
    monkeypatch.setattr(Figure, "savefig", lambda self, *a, **k: (seen.append(self), orig(self, *a, **k))[1])
    assert_png(plot_dashboard(summary, tl, tmp_path / "d.png", **kw))
    return seen[0]


def titles(fig) -> list[str]:
    return [ax.get_title(loc="left") for ax in fig.axes]


def test_dashboard_title_names_scenario_and_schedule(monkeypatch, tmp_path):
    tl = gpipe_timeline(3, 6)
    s = full_summary(tl)
    s.update(schedule="hops_hetero", scheduler_effective="1f1b",
             provenance={"scenario": "mixed_pp6", "scenario_file": None})
    fig = drawn_figure(monkeypatch, s, tl, tmp_path)
    assert fig.texts[0].get_text().startswith("HOPS mixed_pp6 · hops_hetero (chose 1f1b)")
    s["provenance"] = {"scenario": None, "scenario_file": "/data/exp2_run97/hops.base.yaml"}
    fig = drawn_figure(monkeypatch, s, tl, tmp_path)
    assert fig.texts[0].get_text().startswith("HOPS exp2_run97 · hops_hetero (chose 1f1b)")


@pytest.mark.parametrize("stages, microbatches", [(2, 3), (3, 6), (8, 64)])
def test_the_latency_histogram_counts_in_whole_microbatches(monkeypatch, tmp_path, stages, microbatches):
    tl = gpipe_timeline(stages, microbatches)
    fig = drawn_figure(monkeypatch, full_summary(tl), tl, tmp_path)
    (hist,) = [ax for ax in fig.axes if ax.get_xlabel().startswith("microbatch latency")]
    ticks = [t for t in hist.get_yticks() if hist.get_ylim()[0] <= t <= hist.get_ylim()[1]]
    assert len(ticks) >= 2 and all(float(t).is_integer() for t in ticks), ticks


def test_link_contention_panels_dropped_when_nothing_waited(monkeypatch, tmp_path):
    tl = gpipe_timeline(3, 6)
    s = full_summary(tl)
    assert {"Contended transfers", "Wait for link (total)"} <= set(titles(drawn_figure(monkeypatch, s, tl, tmp_path)))
    s["link_contention"] = {k: {"transfers": 10, "contended": 0, "wait_ms": 0.0} for k in s["link_contention"]}
    fig = drawn_figure(monkeypatch, s, tl, tmp_path)
    assert "Contended transfers" not in titles(fig) and "Wait for link (total)" not in titles(fig)
    (panel,) = [ax for ax in fig.axes if ax.get_title(loc="left") == "Link contention"]
    assert any("no link contention: all 40 transfers" in t.get_text() for t in panel.texts)


def test_memory_bars_show_the_capacity_line(monkeypatch, tmp_path):
    tl = gpipe_timeline(3, 6)
    s = full_summary(tl)
    s["peak_memory_mb"][tl.stage_devices[0]] = 30000.0  # over the 24576 MB capacity
    fig = drawn_figure(monkeypatch, s, tl, tmp_path)
    (ax,) = [a for a in fig.axes if a.get_title(loc="left") == "Peak memory vs capacity"]
    from matplotlib.collections import LineCollection

    lines = [c for c in ax.collections if isinstance(c, LineCollection)]
    xs = sorted({round(float(seg[0][0]), 3) for c in lines for seg in c.get_segments()})
    assert xs == [24.576], "a capacity line at 24.576 GB on every row"
    assert ax.get_xlim()[1] > 30.0, "the over-capacity bar is not clipped"


def row_names(ax) -> list[str]:
    """The row labels of a bar-per-row panel: its right-aligned texts left of the axes."""
    return [t.get_text() for t in ax.texts if t.get_horizontalalignment() == "right"]


def panel(fig, title):
    (ax,) = [a for a in fig.axes if a.get_title(loc="left") == title]
    return ax


@pytest.mark.parametrize("stages", [4, 64])
def test_row_labels_name_every_row_of_a_short_panel_and_every_kth_of_a_tall_one(monkeypatch, tmp_path, stages):
    from hops.outputs.plots.timeline_plot import MAX_ROW_LABELS

    tl = gpipe_timeline(stages, 12)
    fig = drawn_figure(monkeypatch, full_summary(tl), tl, tmp_path)
    devices = row_names(panel(fig, "Utilization per device"))
    links = row_names(panel(fig, "Utilization per link"))
    if stages == 4:
        assert devices == ["gpu0", "gpu1", "gpu2", "gpu3"]
        assert len(links) == 6  # 3 links each way
    else:
        assert devices == [f"gpu{i}" for i in range(0, 64, 2)]  # 32 of 64
        assert 0 < len(links) <= MAX_ROW_LABELS and all(name.count("→") == 1 for name in links)
        down = [tuple(int(d) for d in name.replace("gpu", "").split("→")) for name in links]
        assert all(b == a + 1 for a, b in down), "every named link row is a downstream one"


@pytest.mark.parametrize("stages, named", [(4, ["S0", "S1", "S2", "S3"]), (64, [f"S{i}" for i in range(0, 64, 2)]),
                                           (100, [f"S{i}" for i in range(0, 100, 4)])])
def test_the_timeline_names_every_stage_row_up_to_32_and_every_kth_above(monkeypatch, tmp_path, stages, named):
    tl = gpipe_timeline(stages, 4, iterations=1, failure=False)
    ax = drawn_timeline(monkeypatch, tl, tmp_path).axes[0]
    assert [name.split()[0] for name in row_names(ax)] == named


def test_label_stride_is_the_smallest_power_of_two_that_keeps_a_panel_to_32_names():
    from hops.outputs.plots.timeline_plot import label_stride

    assert [label_stride(n) for n in (0, 1, 32, 33, 64, 65, 126, 128, 129, 1000)] == [1, 1, 1, 2, 2, 4, 4, 4, 8, 32]


def test_panel_titles_clear_the_value_axis_repeated_on_top_of_a_tall_panel(monkeypatch, tmp_path):
    tl = gpipe_timeline(64, 12)
    fig = drawn_figure(monkeypatch, full_summary(tl), tl, tmp_path)
    renderer = fig.canvas.get_renderer()
    for title in ("Utilization per device", "Peak memory vs capacity", "Utilization per link",
                  "Contended transfers", "Wait for link (total)"):
        ax = panel(fig, title)
        top_labels = [t.label2.get_window_extent(renderer) for t in ax.xaxis.get_major_ticks()
                      if t.label2.get_visible() and t.label2.get_text()]
        assert top_labels, title
        assert ax.title.get_window_extent(renderer).y0 > max(b.y1 for b in top_labels), title


def test_the_latency_histogram_counts_every_microbatch_once(monkeypatch, tmp_path):
    from matplotlib.collections import PolyCollection

    tl = gpipe_timeline(4, 24)
    fig = drawn_figure(monkeypatch, full_summary(tl), tl, tmp_path)
    hist = panel(fig, "Latency distribution (48 microbatches)")
    (bars,) = [c for c in hist.collections if isinstance(c, PolyCollection)]
    heights = [float(p.vertices[:, 1].max()) for p in bars.get_paths()]
    assert sum(heights) == 48 and hist.get_ylim()[0] == 0 and hist.get_ylim()[1] >= max(heights)



# ---------------------------------------------------------------- chunks (virtual stages)
def with_chunks(tl: Timeline) -> Timeline:
    """The gpipe layout as if each stage ran two model chunks: odd microbatches on chunk 1."""
    task = (tl.kind == "compute") | (tl.kind == "transfer")
    return dataclasses.replace(tl, chunk=np.where(task, tl.microbatch % 2, -1))


def drawn_timeline(monkeypatch, tl, tmp_path):
    """Render the Gantt chart and return the matplotlib Figure it saved."""
    from matplotlib.figure import Figure

    from hops.outputs.plots import plot_timeline

    seen = []
    orig = Figure.savefig
    monkeypatch.setattr(Figure, "savefig", lambda self, *a, **k: (seen.append(self), orig(self, *a, **k))[1])
    assert_png(plot_timeline(tl, tmp_path / "t.png"))
    return seen[0]


def shades_of(fig, color) -> list[tuple[float, str | None]]:
    """(share of white mixed into `color`, hatch) of every task-bar collection drawn in a shade of it."""
    from matplotlib.collections import PolyCollection
    from matplotlib.colors import to_rgb

    base = np.asarray(to_rgb(color))
    out = []
    for coll in fig.axes[0].collections:
        if not isinstance(coll, PolyCollection) or coll.get_zorder() != 2:
            continue
        tint = (np.asarray(coll.get_facecolor()[0][:3]) - base) / (1 - base)
        if np.allclose(tint, tint[0], atol=0.01) and 0 <= tint[0] < 0.9:
            out.append((round(float(tint[0]), 2), coll.get_hatch()))
    return out


def legend_labels(fig) -> list[str]:
    return [t.get_text() for t in fig.legends[0].get_texts()]


def test_timeline_png_draws_each_chunk_in_its_own_shade_and_hatch_and_names_it(monkeypatch, tmp_path):
    from hops.outputs.plots.timeline_plot import PHASE_COLORS

    fig = drawn_timeline(monkeypatch, with_chunks(gpipe_timeline(3, 6, failure=False)), tmp_path)
    for phase in ("F", "B"):
        (tint0, hatch0), (tint1, hatch1) = shades_of(fig, PHASE_COLORS[phase])  # one collection per chunk
        assert tint0 == 0 < tint1 and hatch0 != hatch1  # chunk 0 in the phase colour, chunk 1 lighter
    assert {"chunk 0", "chunk 1"} <= set(legend_labels(fig))
    assert "3 stages x 2 chunks" in fig.get_suptitle()


def test_dense_chunked_timeline_still_tells_chunks_apart_by_shade(monkeypatch, tmp_path):
    from hops.outputs.plots.timeline_plot import PHASE_COLORS

    fig = drawn_timeline(monkeypatch, with_chunks(gpipe_timeline(3, 400, iterations=1, failure=False)), tmp_path)
    assert [tint for tint, _ in shades_of(fig, PHASE_COLORS["F"])] == [0, pytest.approx(0.45)]
    # no hatch at sub-pixel widths, where it would not show (the legend drops it as well)
    assert all(hatch is None for _, hatch in shades_of(fig, PHASE_COLORS["F"]))


def test_one_chunk_timeline_has_one_collection_per_phase_and_no_chunk_legend(monkeypatch, tmp_path):
    from hops.outputs.plots.timeline_plot import PHASE_COLORS

    tl = gpipe_timeline(3, 6)
    assert (tl.chunk[tl.kind == "compute"] == 0).all()  # built without a chunk column: one chunk per stage
    fig = drawn_timeline(monkeypatch, tl, tmp_path)
    assert shades_of(fig, PHASE_COLORS["F"]) == [(0, None)]
    assert not any(label.startswith("chunk") for label in legend_labels(fig))
    assert "chunks" not in fig.get_suptitle()


def test_chrome_trace_names_the_chunk_of_each_event_only_under_virtual_stages(tmp_path):
    tl = with_chunks(gpipe_timeline(3, 6))
    events = [e for e in load_trace(write_chrome_trace(tl, tmp_path / "t.json")) if e["ph"] == "X"]
    task = [e for e in events if e["args"]["kind"] in ("compute", "transfer")]
    assert task and all(e["args"]["chunk"] == e["args"]["microbatch"] % 2 for e in task)
    assert all("chunk" not in e["args"] for e in events if e not in task)  # optimizer, failure: no chunk
    one = load_trace(write_chrome_trace(gpipe_timeline(3, 6), tmp_path / "one.json"))
    assert all("chunk" not in e["args"] for e in one if e["ph"] == "X")  # one chunk per stage: as before


# ---------------------------------------------------------------- large runs: the timeline as a coverage image
def task_bars(tl: Timeline) -> int:
    """Bars the Gantt chart draws for the gpipe layout: everything but the failure."""
    return int((tl.kind != "failure").sum())


def lane_share(png, ax, tl: Timeline, stage: int, lane_y: float, color: str) -> float:
    """Mean share of `color` over the idle grey along one pixel row of the saved PNG, across the run.

    The row is the one through `stage + lane_y` (row units); a pixel is idle grey blended
    towards `color` by the share t of its time the lane is busy, so t is read back per pixel.
    """
    from matplotlib.colors import to_rgb

    from hops.outputs.plots.timeline_plot import IDLE_COLOR

    height = png.shape[0]
    (x_lo, y_px), (x_hi, _) = ax.transData.transform([(float(tl.start_ms.min()), stage + lane_y),
                                                      (float(tl.end_ms.max()), stage + lane_y)])
    row = png[height - 1 - int(y_px), int(np.ceil(x_lo)):int(x_hi), :3]
    idle, full = np.asarray(to_rgb(IDLE_COLOR)), np.asarray(to_rgb(color))
    t = (row - idle) @ (full - idle) / float((full - idle) @ (full - idle))
    return float(np.clip(t, 0.0, 1.0).mean())


def test_raster_opacity_is_the_share_of_each_pixel_column_a_lane_is_busy():
    from hops.outputs.plots.timeline_plot import _raster

    red, blue = (1.0, 0.0, 0.0), (0.0, 0.0, 1.0)
    # row 0: red bars over [2.5, 4.25) and [6.0, 6.1) px; row 1: a blue bar in the top half of the row
    layers = [(red, (0.0, 1.0), np.array([0, 0]), np.array([2.5, 6.0]), np.array([4.25, 6.1])),
              (blue, (0.0, 0.5), np.array([1]), np.array([0.0]), np.array([8.0]))]
    y_edges, image = _raster(layers, n_rows=2, width=8)
    assert y_edges.tolist() == [0.0, 0.5, 1.0, 1.5, 2.0]  # each row split at the lane edge
    alpha = image[..., 3] / 255
    expected_red = [0, 0, 0.5, 1, 0.25, 0, 0.1, 0]
    assert alpha[0] == pytest.approx(expected_red, abs=1 / 255)  # row 0, top half
    assert alpha[1] == pytest.approx(expected_red, abs=1 / 255)  # row 0, bottom half
    assert (image[0][alpha[0] > 0, :3] == (255, 0, 0)).all()
    assert alpha[2] == pytest.approx(np.ones(8)) and (image[2, :, :3] == (0, 0, 255)).all()
    assert (alpha[3] == 0).all()  # nothing drawn outside a layer's lane


def test_overlapping_bars_of_one_lane_saturate_and_later_layers_stack_on_top():
    from hops.outputs.plots.timeline_plot import _raster

    grey, black = (0.5, 0.5, 0.5), (0.0, 0.0, 0.0)
    layers = [(grey, (0.0, 1.0), np.array([0, 0]), np.array([0.0, 0.5]), np.array([1.0, 1.0])),  # 1.5 px in px 0
              (black, (0.0, 1.0), np.array([0]), np.array([0.0]), np.array([0.5]))]
    _, image = _raster(layers, n_rows=1, width=1)
    assert image[0, 0, 3] == 255  # never more than the whole pixel
    assert image[0, 0, :3] == pytest.approx([64, 64, 64], abs=1)  # half black over grey


@pytest.mark.parametrize("above", [False, True])
def test_a_dense_timeline_is_one_image_only_above_the_bar_threshold(monkeypatch, tmp_path, above):
    from matplotlib.collections import PolyCollection

    import hops.outputs.plots.timeline_plot as timeline_plot

    tl = gpipe_timeline(6, 400, iterations=1)  # bars far narrower than a pixel
    monkeypatch.setattr(timeline_plot, "RASTER_MIN_BARS", task_bars(tl) - 1 if above else task_bars(tl))
    ax = drawn_timeline(monkeypatch, tl, tmp_path).axes[0]
    bar_polygons = [c for c in ax.collections if isinstance(c, PolyCollection) and c.get_zorder() == 2]
    if above:
        assert len(ax.images) == 1 and not bar_polygons
    else:
        assert not ax.images and bar_polygons


def test_the_timeline_image_shows_every_stage_s_phases_at_their_share_of_time(monkeypatch, tmp_path):
    """Above the threshold the picture still reads as the chart: each stage row, each phase in its
    own colour and sub-lane, as strong as the share of time the stage spends in it."""
    import matplotlib.image

    import hops.outputs.plots.timeline_plot as timeline_plot
    from hops.outputs.plots.timeline_plot import _COMPUTE, PHASE_COLORS

    stages = 6
    tl = gpipe_timeline(stages, 400, iterations=1, failure=False)
    monkeypatch.setattr(timeline_plot, "RASTER_MIN_BARS", task_bars(tl) - 1)
    ax = drawn_timeline(monkeypatch, tl, tmp_path).axes[0]
    assert len(ax.images) == 1
    png = matplotlib.image.imread(tmp_path / "t.png")
    span = float(tl.end_ms.max() - tl.start_ms.min())
    half = (_COMPUTE[1] - _COMPUTE[0]) / 2  # dense: F in the top half of the compute lane, B below
    for stage in range(stages):
        for k, phase in enumerate(("F", "B")):
            mine = (tl.stage == stage) & (tl.kind == "compute") & (tl.phase == phase)
            busy = float((tl.end_ms - tl.start_ms)[mine].sum()) / span
            drawn = lane_share(png, ax, tl, stage, _COMPUTE[0] + (k + 0.5) * half, PHASE_COLORS[phase])
            assert drawn == pytest.approx(busy, abs=0.03), (stage, phase)
