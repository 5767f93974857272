"""One-page dashboard of a run's summary, meant to be read at a glance.

Layout choices, and why:
- Panels are placed in inches, not grid fractions, so each bar row keeps a fixed
  readable height whether there are 2 or 130 rows; the figure grows instead of
  the text shrinking to nothing.
- Devices and links are horizontal bar charts whose rows share one label column
  (utilization next to memory, utilization next to contention): labels are long
  ("h100_node0_gpu0->a10g_node0_gpu0") and horizontal text never needs rotating.
- Rows follow pipeline order (first stage that uses the device), not alphabetical
  order, so "gpu10" does not land between "gpu1" and "gpu2" and neighbouring rows
  are neighbouring stages.
- A panel of more than 32 rows names every 2nd, 4th, ... row (timeline_plot.label_stride):
  rows follow the pipeline, so the names in between are implied, and each name drawn costs
  ~1.5-2 ms (a PP64 run's 190 names were half the dashboard's drawing time).
- Links are coloured by direction with the timeline's transfer colours:
  downstream (activations) vs upstream (gradients).
- Missing summary sections draw a "not in summary" note instead of failing: a
  measured trace has no memory or contention model, and it still deserves a picture.
"""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from hops.timeline import Timeline
from hops.outputs.plots.timeline_plot import COMM_COLORS, PHASE_COLORS, PNG_OPTIONS, _bars, _short, row_labels

_BAR = PHASE_COLORS["F"]
_DPI = 110
_TALL = 40      # rows above which value axes are repeated on top of a panel
_TOP_TICKS_PT = 13


def _natural(s: str):
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", s)]


def _device_order(devices, stage_devices) -> list[str]:
    first = {}
    for s, d in enumerate(stage_devices):
        first.setdefault(str(d), s)
    return sorted(set(map(str, devices)), key=lambda d: (first.get(d, 1 << 30), _natural(d)))


def _link_order(links, stage_devices) -> list[tuple[str, int]]:
    """(link, direction) pairs: direction +1 downstream, -1 upstream, 0 unknown."""
    first = {}
    for s, d in enumerate(stage_devices):
        first.setdefault(str(d), s)
    out = []
    for k in set(links):
        a, _, b = k.partition("->")
        sa, sb = first.get(a), first.get(b)
        if sa is not None and sb is not None:
            out.append(((min(sa, sb), 0 if sb > sa else 1, _natural(k)), k, 1 if sb > sa else -1))
        else:
            out.append(((1 << 30, 0, _natural(k)), k, 0))
    return [(k, d) for _, k, d in sorted(out)]


def _latencies(tl: Timeline) -> np.ndarray:
    from hops.metrics import _microbatch_latencies, measured_window

    try:
        w = measured_window(tl)[0]
    except ValueError:
        w = tl
    return _microbatch_latencies(w)


def _row_metrics(n: int) -> tuple[float, float, int]:
    """(row height in, font size pt, label stride) for a horizontal bar panel with n rows."""
    row_in = float(np.clip(5.0 / max(n, 1), 0.13, 0.3))
    fs = float(np.clip(row_in * 72 * 0.62, 6.0, 9.0))
    stride = max(1, int(np.ceil(fs * 1.1 / (row_in * 72))))
    return row_in, fs, stride


def _bar_collection(ax, at, length, *, thickness: float, color, start=None, label: str | None = None,
                    vertical: bool = False):
    """Horizontal bars centred on y = `at`, from `start` (default 0) to `start + length`, as one
    PolyCollection; `vertical` makes them columns centred on x = `at`.

    ax.barh / ax.bar make a Rectangle artist per bar (about a millisecond each to build and
    draw); a run with 64 devices and 126 links has hundreds. The panels set their own limits,
    so the collection does not touch them.
    """
    from matplotlib.collections import PolyCollection

    at = np.asarray(at, dtype=float)
    lo = np.zeros(len(at)) if start is None else np.asarray(start, dtype=float)
    v = _bars(lo, lo + np.asarray(length, dtype=float), at - thickness / 2, at + thickness / 2)
    ax.add_collection(PolyCollection(v[..., ::-1] if vertical else v, facecolors=color, edgecolors="none",
                                     label=label), autolim=False)


def _title(ax, text: str, pad: float | None = None) -> None:
    """A panel's title, left, `pad` points above the axes (matplotlib's default pad if None).

    Its position is given (y=1), so matplotlib skips its search for tick labels above the axes
    (the tight boxes of both axes, on every panel at every draw): the pads here already clear
    the top tick labels of a tall panel.
    """
    ax.set_title(text, fontsize=10, loc="left", pad=pad, y=1.0)


def _note(ax, text):
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="#777777", fontsize=9)
    ax.set_xticks([])
    ax.set_yticks([])


def _hbar_axis(ax, labels, fs, stride, show_labels):
    """Limits, row labels and grid of a bar-per-row panel; panels to the right of a labelled
    one share its rows, unlabelled."""
    n = len(labels)
    ax.set_ylim(n - 0.5, -0.5)
    if show_labels:
        row_labels(ax, range(n), labels, fs, stride)
    else:
        ax.set_yticks([])
    ax.tick_params(axis="x", labelsize=8)
    if n > _TALL:  # tall panel: repeat the value axis on top so it is readable without scrolling
        ax.tick_params(axis="x", top=True, labeltop=True)
    ax.grid(axis="x", color="#DDDDDD", linewidth=0.6)
    ax.set_axisbelow(True)
    for sp in ("top", "right"):
        ax.spines[sp].set_visible(False)


def _histogram(ax, values, bins: int) -> None:
    """ax.hist's bars as one PolyCollection: ax.hist makes a Rectangle artist per bin (up to 60,
    ~1 ms each to build and draw). Same bars, colours and limits (sticky at a count of 0)."""
    from matplotlib.collections import PolyCollection

    counts, edges = np.histogram(values, bins=bins)
    bars = PolyCollection(_bars(edges[:-1], edges[:-1] + np.diff(edges), np.zeros(len(counts)), counts),
                          facecolors=_BAR, edgecolors="white", linewidths=0.4, alpha=0.85)
    bars.sticky_edges.y.append(0)
    ax.add_collection(bars)


def _annotate(ax, y, x, texts, fs, xmax):
    for yi, xi, t in zip(y, x, texts):
        ax.text(min(xi, xmax) + 0.01 * xmax, yi, t, va="center", ha="left", fontsize=fs * 0.9, color="#333333",
                clip_on=False)


def plot_dashboard(summary: dict, timeline: Timeline, path, *, title: str | None = None) -> Path:
    """Write the dashboard PNG for `summary` (summary.json dict) and its `timeline`; returns the path.

    The header names the scenario and the schedule that ran (`title` replaces that part).
    """
    from hops.outputs.files import scenario_label, schedule_text

    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch
    from matplotlib.ticker import MaxNLocator, PercentFormatter
    from matplotlib.transforms import offset_copy

    path = Path(path)
    tl = timeline
    util = summary.get("utilization", {}) or {}
    dev_util = util.get("per_device", {}) or {}
    link_util = util.get("per_link", {}) or {}
    peak = summary.get("peak_memory_mb", {}) or {}
    cap = summary.get("memory_capacity_mb", {}) or {}
    contention = summary.get("link_contention", {}) or {}

    devices = _device_order(list(dev_util) + list(peak) + list(cap), tl.stage_devices)
    links = _link_order(list(link_util) + list(contention), tl.stage_devices)
    n_dev, n_link = len(devices), len(links)
    d_row, d_fs, d_stride = _row_metrics(n_dev)
    l_row, l_fs, l_stride = _row_metrics(n_link)
    dev_labels = [_short(d, 24) for d in devices]
    link_labels = ["→".join(_short(p, 18) for p in k.split("->", 1)) for k, _ in links]

    # ---- geometry in inches (x from left, y from top)
    title_h, top_h, gap = 0.95, 2.9, 0.95 + (0.2 if max(n_dev, n_link) > _TALL else 0.0)
    d_lab = 0.25 + max([len(s) for s in dev_labels] + [4]) * d_fs * 0.58 / 72
    l_lab = 0.25 + max([len(s) for s in link_labels] + [4]) * l_fs * 0.58 / 72
    d_w, m_w, lk_w, sep = 2.9, 3.3, 2.5, 0.45
    dev_block = d_lab + d_w + sep + m_w
    link_block = l_lab + 3 * lk_w + 2 * sep
    width = max(16.0, 0.35 + dev_block + 0.9 + link_block + 0.5)
    dev_h = max(1.2, d_row * max(n_dev, 1))
    link_h = max(1.2, l_row * max(n_link, 1))
    bottom_h = max(dev_h, link_h)
    height = title_h + top_h + gap + bottom_h + 0.6

    fig = Figure(figsize=(width, height), dpi=_DPI)
    FigureCanvasAgg(fig)

    def lift(n_rows):
        return _TOP_TICKS_PT if n_rows > _TALL else 0

    def above(ax, n_rows):
        """Axes coordinates shifted up past the top tick labels, for legends above a panel."""
        return offset_copy(ax.transAxes, fig=fig, y=lift(n_rows), units="points")

    def axes(x, y, w, h):
        return fig.add_axes([x / width, 1 - (y + h) / height, w / width, h / height])

    # ---- header
    sched = schedule_text(summary) if "schedule" in summary else (tl.meta or {}).get("schedule", "?")
    seed = summary.get("seed", tl.meta.get("seed", "?") if tl.meta else "?")
    scen = scenario_label(summary)
    name = title or (f"HOPS {scen} · {sched}" if scen else f"HOPS run: {sched}")
    thr = summary.get("throughput", {}) or {}
    lat = summary.get("latency_ms", {}) or {}
    fig.text(0.35 / width, 1 - 0.18 / height, f"{name}   seed {seed}   {tl.n_stages} stages, "
             f"{len(devices)} devices, {n_link} links", fontsize=13, weight="bold", va="top")
    head = (f"throughput {thr.get('samples_per_s', float('nan')):,.1f} samples/s "
            f"({thr.get('microbatches_per_s', float('nan')):,.2f} microbatches/s)    "
            f"makespan {summary.get('makespan_ms', float('nan')):,.1f} ms    "
            f"bubble {100 * summary.get('bubble_ratio', float('nan')):.1f}%    "
            f"latency mean/p50/p99 {lat.get('mean', float('nan')):,.1f} / {lat.get('p50', float('nan')):,.1f}"
            f" / {lat.get('p99', float('nan')):,.1f} ms")
    fig.text(0.35 / width, 1 - 0.55 / height, head, fontsize=10, va="top", color="#222222")

    # ---- latency histogram
    half = (width - 0.35 - 0.5 - 1.0) / 2
    ax = axes(0.9, title_h, half - 0.55, top_h)
    latencies = _latencies(tl)
    if len(latencies):
        bins = int(np.clip(np.sqrt(len(latencies)) * 2, 10, 60))
        lo, hi = float(np.min(latencies)), float(np.max(latencies))
        if hi - lo <= 1e-9 * max(abs(hi), 1.0):  # equal up to rounding (one stage): one bar, not an error
            bins, latencies = 1, np.full(len(latencies), (lo + hi) / 2)
        _histogram(ax, latencies, bins)
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))  # counts of microbatches: no 0.5 ticks
        marks = [("p50", lat.get("p50", np.percentile(latencies, 50)), "-"),
                 ("p99", lat.get("p99", np.percentile(latencies, 99)), "--"),
                 ("mean", lat.get("mean", float(np.mean(latencies))), ":")]
        for name, v, ls in marks:
            ax.axvline(v, color="#C44E52" if name != "mean" else "#333333", linestyle=ls, linewidth=1.4,
                       label=f"{name} {v:,.1f} ms")
        ax.legend(fontsize=8, frameon=False, loc="lower right", bbox_to_anchor=(1.0, 1.0), ncol=3,
                  borderaxespad=0.15)
        ax.set_xlabel("microbatch latency: first forward start to last backward end (ms)", fontsize=9)
        ax.set_ylabel("microbatches", fontsize=9)
        ax.tick_params(labelsize=8)
        for sp in ("top", "right"):
            ax.spines[sp].set_visible(False)
    else:
        _note(ax, "no complete microbatch in the measured window")
    _title(ax, f"Latency distribution ({len(latencies)} microbatches)")

    # ---- bubble per stage
    ax = axes(0.9 + half + 0.55, title_h, half - 0.55, top_h)
    bubbles = np.asarray(summary.get("bubble_per_stage", []) or [], dtype=float)
    if len(bubbles):
        x = np.arange(len(bubbles))
        bar_w = 0.8 if len(x) > 1 else 0.4
        parts = summary.get("time_breakdown_ms_per_iteration") or []
        if len(parts) == len(bubbles):  # the bubble, read: idle before the flush vs iteration-end idle
            wall = np.array([sum(v for k, v in r.items() if k != "stage") for r in parts])
            wall = np.where(wall > 0, wall, 1.0)
            pipe = np.array([r["pipeline_idle_ms"] for r in parts]) / wall
            end = np.array([r["iteration_end_ms"] for r in parts]) / wall
            _bar_collection(ax, x, pipe, thickness=bar_w, color="#8C8C8C", label="pipeline idle", vertical=True)
            _bar_collection(ax, x, end, start=pipe, thickness=bar_w, color="#DD8452", label="iteration-end idle",
                            vertical=True)
        else:
            _bar_collection(ax, x, bubbles, thickness=bar_w, color="#8C8C8C", vertical=True)
        if "bubble_ratio" in summary:
            ax.axhline(summary["bubble_ratio"], color="#C44E52", linewidth=1.2,
                       label=f"overall {100 * summary['bubble_ratio']:.1f}%")
            ax.legend(fontsize=8, frameon=False, loc="lower right", bbox_to_anchor=(1.0, 1.0),
                      borderaxespad=0.15)
        ax.yaxis.set_major_formatter(PercentFormatter(1.0, decimals=0))
        ax.set_ylim(0, max(1.0, float(bubbles.max()) * 1.05) if bubbles.max() > 0.8 else
                    min(1.0, float(bubbles.max()) * 1.25 + 0.02))
        if len(x) <= 12:
            ax.set_xticks(x, [f"S{i}\n{_short(str(d), 26 if len(x) <= 6 else 14)}" for i, d in
                              zip(x, tl.stage_devices)] if len(tl.stage_devices) == len(x) else
                          [f"S{i}" for i in x], fontsize=7.5)
        else:
            ax.xaxis.set_major_locator(MaxNLocator(nbins=16, integer=True))
            ax.tick_params(axis="x", labelsize=8)
            ax.set_xlabel("stage", fontsize=9)
        if len(x) <= 24:
            for xi, b in zip(x, bubbles):
                ax.text(xi, b, f"{100 * b:.0f}%", ha="center", va="bottom", fontsize=7, color="#333333")
        ax.set_xlim(-0.6, len(x) - 0.4)
        ax.tick_params(axis="y", labelsize=8)
        for sp in ("top", "right"):
            ax.spines[sp].set_visible(False)
    else:
        _note(ax, "bubble_per_stage not in summary")
    _title(ax, "Bubble per stage: idle share (pipeline / iteration end)")

    # ---- device block: utilization | peak memory vs capacity
    y0 = title_h + top_h + gap
    x = 0.35 + d_lab
    ax_u = axes(x, y0, d_w, dev_h if n_dev else 1.2)
    ax_m = axes(x + d_w + sep, y0, m_w, dev_h if n_dev else 1.2)
    if n_dev:
        y = np.arange(n_dev)
        u = np.array([dev_util.get(d, np.nan) for d in devices], dtype=float)
        _bar_collection(ax_u, y, np.nan_to_num(u), color=_BAR, thickness=0.72)
        ax_u.set_xlim(0, 1.0)
        ax_u.xaxis.set_major_formatter(PercentFormatter(1.0, decimals=0))
        _hbar_axis(ax_u, dev_labels, d_fs, d_stride, True)
        if n_dev <= 40:
            _annotate(ax_u, y, np.nan_to_num(u), [f"{100 * v:.0f}%" if np.isfinite(v) else "n/a" for v in u],
                      d_fs, 1.0)
        if peak or cap:
            p = np.array([peak.get(d, np.nan) for d in devices], dtype=float) / 1000  # MB -> GB as summary.json counts them (80 GB = 80000 MB)
            c = np.array([cap.get(d, np.nan) for d in devices], dtype=float) / 1000  # MB -> GB as summary.json counts them (80 GB = 80000 MB)
            ratio = p / c
            colors = np.where(ratio > 1.0, "#C44E52", np.where(ratio > 0.9, "#DD8452", "#55A868"))
            _bar_collection(ax_m, y, np.nan_to_num(c), color="#E3E3E3", thickness=0.82)
            _bar_collection(ax_m, y, np.nan_to_num(p), color=colors, thickness=0.5)
            # the capacity as a line on every row, so a bar running past it shows where it ends
            ax_m.vlines(c, y - 0.41, y + 0.41, colors="#333333", linewidth=1.1, zorder=3)
            xmax = float(np.nanmax(np.concatenate([p, c, [1e-3]]))) * 1.12
            ax_m.set_xlim(0, xmax)
            _hbar_axis(ax_m, dev_labels, d_fs, d_stride, False)
            if n_dev <= 40:
                _annotate(ax_m, y, np.nan_to_num(np.fmax(p, c)),
                          [f"{100 * r:.0f}%" if np.isfinite(r) else "" for r in ratio], d_fs, xmax / 1.12)
            ax_m.set_xlabel("GB", fontsize=8)
            ax_m.legend(handles=[Patch(facecolor="#E3E3E3", edgecolor="#333333", label="capacity"),
                                 Patch(color="#55A868", label="peak"),
                                 Patch(color="#DD8452", label="peak > 90%"),
                                 Patch(color="#C44E52", label="peak > capacity")],
                        fontsize=7, frameon=False, loc="lower left", bbox_to_anchor=(0.0, 1.0), ncol=4,
                        bbox_transform=above(ax_m, n_dev),
                        handlelength=1.0, columnspacing=0.8, borderaxespad=0.15)
        else:
            _note(ax_m, "peak_memory_mb not in summary")
    else:
        _note(ax_u, "no devices in summary")
        _note(ax_m, "no devices in summary")
    _title(ax_u, "Utilization per device", 18 + lift(n_dev))
    _title(ax_m, "Peak memory vs capacity", 18 + lift(n_dev))

    # ---- link block: utilization | contended transfers | wait
    x = 0.35 + dev_block + 0.9 + l_lab
    lk_h = link_h if n_link else 1.2
    keys = [k for k, _ in links]
    tot, con, wait = (np.array([contention.get(k, {}).get(field, np.nan) for k in keys], dtype=float)
                      for field in ("transfers", "contended", "wait_ms"))
    # two panels of zero bars say less than one sentence: one panel for the sentence instead
    quiet = bool(n_link and contention and not np.nansum(con) and not np.nansum(wait))
    ax_lu = axes(x, y0, lk_w, lk_h)
    if quiet:
        ax_lc = ax_lw = axes(x + lk_w + sep, y0, 2 * lk_w + sep, lk_h)
    else:
        ax_lc = axes(x + lk_w + sep, y0, lk_w, lk_h)
        ax_lw = axes(x + 2 * (lk_w + sep), y0, lk_w, lk_h)
    if n_link:
        y = np.arange(n_link)
        colors = [COMM_COLORS["send F"] if d > 0 else COMM_COLORS["send B"] if d < 0 else "#777777"
                  for _, d in links]
        lu = np.array([link_util.get(k, np.nan) for k in keys], dtype=float)
        _bar_collection(ax_lu, y, np.nan_to_num(lu), color=colors, thickness=0.72)
        xmax = max(float(np.nanmax(np.append(lu, 0.0))) * 1.25, 0.01)
        ax_lu.set_xlim(0, min(1.0, xmax) if xmax <= 1 else xmax)
        ax_lu.xaxis.set_major_formatter(PercentFormatter(1.0, decimals=None))
        ax_lu.xaxis.set_major_locator(MaxNLocator(nbins=4))
        _hbar_axis(ax_lu, link_labels, l_fs, l_stride, True)
        if n_link <= 40:
            _annotate(ax_lu, y, np.nan_to_num(lu), [f"{100 * v:.1f}%" if np.isfinite(v) else "n/a" for v in lu],
                      l_fs, ax_lu.get_xlim()[1])
        ax_lu.legend(handles=[Patch(color=COMM_COLORS["send F"], label="downstream"),
                              Patch(color=COMM_COLORS["send B"], label="upstream")],
                     fontsize=7, frameon=False, loc="lower left", bbox_to_anchor=(0.0, 1.0), ncol=2,
                     bbox_transform=above(ax_lu, n_link),
                     handlelength=1.0, borderaxespad=0.15)
        if quiet:
            _note(ax_lc, f"no link contention: all {int(np.nansum(tot)):,} transfers started as soon as\n"
                         f"their data was ready (0 contended, 0 ms waiting for a busy link)")
        elif contention:
            _bar_collection(ax_lc, y, np.nan_to_num(tot), color="#E3E3E3", thickness=0.82)
            _bar_collection(ax_lc, y, np.nan_to_num(con), color="#C44E52", thickness=0.5)
            cmax = max(float(np.nanmax(np.append(tot, 1.0))), 1.0) * 1.15
            ax_lc.set_xlim(0, cmax)
            ax_lc.xaxis.set_major_locator(MaxNLocator(nbins=4, integer=True))
            _hbar_axis(ax_lc, link_labels, l_fs, l_stride, False)
            if n_link <= 40:
                _annotate(ax_lc, y, np.nan_to_num(tot),
                          [f"{int(c)}/{int(t)}" if np.isfinite(c) and np.isfinite(t) else "" for c, t in
                           zip(con, tot)], l_fs, cmax / 1.15)
            ax_lc.legend(handles=[Patch(color="#E3E3E3", label="all"), Patch(color="#C44E52", label="contended")],
                         fontsize=7, frameon=False, loc="lower left", bbox_to_anchor=(0.0, 1.0), ncol=2,
                         bbox_transform=above(ax_lc, n_link),
                         handlelength=1.0, borderaxespad=0.15)
            _bar_collection(ax_lw, y, np.nan_to_num(wait), color="#8172B3", thickness=0.72)
            wmax = float(np.nanmax(np.append(wait, 0.0))) * 1.2 or 1.0   # all-zero: plain 0..1 ms axis
            ax_lw.set_xlim(0, wmax)
            ax_lw.xaxis.set_major_locator(MaxNLocator(nbins=4))
            _hbar_axis(ax_lw, link_labels, l_fs, l_stride, False)
            if n_link <= 40:
                _annotate(ax_lw, y, np.nan_to_num(wait), [f"{w:,.1f}" if np.isfinite(w) else "" for w in wait],
                          l_fs, wmax / 1.2)
            ax_lw.set_xlabel("ms", fontsize=8)
        else:
            _note(ax_lc, "link_contention not in summary")
            _note(ax_lw, "link_contention not in summary")
    else:
        for a in (ax_lu, ax_lc, ax_lw):
            _note(a, "no transfers")
    _title(ax_lu, "Utilization per link", 18 + lift(n_link))
    if ax_lc is ax_lw:
        _title(ax_lc, "Link contention", 18 + lift(n_link))
    else:
        _title(ax_lc, "Contended transfers", 18 + lift(n_link))
        _title(ax_lw, "Wait for link (total)", 18 + lift(n_link))

    fig.savefig(path, dpi=_DPI, facecolor="white", metadata={"Software": None}, pil_kwargs=PNG_OPTIONS)
    return path
