"""Gantt chart of a Timeline: the picture people check first when a schedule looks wrong.

Design choices, and why:
- One row per stage (not per device) because schedules are defined per stage; the
  device is printed next to the stage index so heterogeneity stays visible. Above 32
  stages every 2nd, 4th, ... row is named (label_stride), as in the dashboard's panels.
- Each row has a thick compute lane and a thin communication lane underneath
  (transfers sent by that stage, all-reduces), so communication never hides compute.
- The compute lane has a grey background across the whole run: anything grey is idle
  time, i.e. the bubble is literally visible.
- Bars are drawn as a handful of PolyCollections (one per colour) built with numpy,
  never one artist per task. When bars are narrower than a few pixels, same-colour bars
  less than half a pixel apart are merged, and bars are widened to ~1 px where a row has
  few of them, so short transfers do not vanish.
- With virtual stages (interleaved 1F1B, ZB-V) a stage's row holds several model chunks,
  and the phase colour alone cannot say which chunk a bar ran: each chunk gets a lighter
  shade of the phase colour and, when bars are wide enough to show it, its own hatch, with
  a legend entry per chunk. A one-chunk timeline is drawn exactly as before.
- A large run has far more bars than the chart has pixels (PP64 x 1024 x 4: a million
  bars on ~2200 pixel columns). In a dense chart with more than RASTER_MIN_BARS bars, each
  lane's bars are summed into its pixel columns with numpy and drawn as one image (with the
  lanes' exact edges): a pixel takes the lane's colour at an opacity equal to the share of
  that pixel's time the lane is busy, which is what the dense chart's note promises ("faint
  colour = low share of time"). Colours, sub-lanes, legend, axes and overlays stay the same;
  the drawing costs a few numpy passes instead of building, measuring and filling a polygon
  per bar (3.5 s at that size, 0.8x the simulation itself). Below the threshold bars stay
  polygons as before, where merging and Agg's snapping of thin rectangles to whole pixels
  can make a dense lane look busier than its share.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from hops.timeline import Timeline

# Colour-blind-friendly-ish palette; the same colours are used by the dashboard.
PHASE_COLORS = {
    "F": "#4C72B0",      # forward
    "B": "#DD8452",      # backward (input grad, or full backward)
    "W": "#55A868",      # weight-gradient half of a split backward
    "BW": "#C44E52",     # fused backward
    "OPT": "#3B3B3B",    # optimizer step
    "other": "#9E9E9E",  # compute without a phase
}
COMM_COLORS = {
    "send F": "#1B3A6B",     # activations, downstream
    "send B": "#8C3B0E",     # gradients, upstream
    "allreduce": "#17A2B8",
    "collective": "#8E6BBF",  # tensor-parallel collectives inside a pass
}
FAILURE_COLOR = "#E41A1C"
CHUNK_HATCHES = (None, "//", "\\\\", "xx", "..", "++")  # chunk k's hatch (cycled); chunk 0 plain
CHUNK_MAX_TINT = 0.45  # the last chunk's share of white mixed into the phase colour
CHUNK_LEGEND_COLOR = "#6F6F6F"
IDLE_COLOR = "#E6E6E6"
COMM_BG_COLOR = "#F5F5F5"

# Vertical layout of one stage row, in row units (y axis is inverted: stage 0 on top).
_COMPUTE = (0.06, 0.70)
_COMM = (0.74, 0.93)

_MAX_LABELS = 2500          # per-bar text is the slowest thing matplotlib draws
MAX_ROW_LABELS = 32         # row names per panel; a taller panel names every 2nd, 4th, ... row
_DENSE_PX = 4.0             # below this median bar width we stop drawing bar edges
RASTER_MIN_BARS = 20_000    # dense charts with more bars are drawn as a coverage image
# zlib level 3, not Pillow's 6: 0.06-0.1 s less per large chart for files ~6-16% larger
PNG_OPTIONS = {"compress_level": 3}


def _event_rows(tl: Timeline) -> np.ndarray:
    """Row (stage) of every event; events without a stage go to their device's first stage.

    Transfers are attributed to their sending side so the sub-row reads as "what this
    stage is sending"; -1 means the event cannot be placed on any stage.
    """
    n = tl.n_stages
    row = np.asarray(tl.stage, dtype=np.int64).copy()
    bad = (row < 0) | (row >= n)
    if bad.any():
        first: dict[str, int] = {}
        for s, d in enumerate(tl.stage_devices):
            first.setdefault(str(d), s)
        key = np.where((tl.kind == "transfer") & (tl.src != ""), tl.src, tl.device)
        row[bad] = [first.get(str(k), -1) for k in key[bad]]
    return row


def _categories(tl: Timeline, compute: np.ndarray) -> tuple[np.ndarray, list[str]]:
    """Colour category index per event (into the returned name list); -1 = not a bar.

    `compute` is tl.kind == "compute", which the caller needs too. Each other test runs on the
    events still undecided only: a comparison of a million strings costs ~5-10 ms, and a large
    run's compute and transfer events are about half of it each.
    """
    names = list(PHASE_COLORS) + list(COMM_COLORS)
    idx = {name: i for i, name in enumerate(names)}
    cat = np.full(len(tl), -1, dtype=np.int64)
    phase = tl.phase[compute]
    sub = np.full(len(phase), idx["other"], dtype=np.int64)
    for ph in ("F", "B", "W", "BW", "OPT"):
        sub[phase == ph] = idx[ph]
    cat[compute] = sub
    rest = np.flatnonzero(~compute)
    kind = tl.kind[rest]
    sub = np.full(len(rest), -1, dtype=np.int64)
    transfer = kind == "transfer"
    sub[transfer] = np.where(tl.phase[rest[transfer]] == "F", idx["send F"], idx["send B"])
    for k, name in (("optimizer", "OPT"), ("allreduce", "allreduce"), ("collective", "collective")):
        sub[kind == k] = idx[name]
    cat[rest] = sub
    return cat, names


def chunk_shade(color: str, chunk: int, n_chunks: int) -> tuple:
    """The phase colour for chunk `chunk` of `n_chunks`: chunk 0 as is, later chunks lighter.

    Lighter, not another hue: the hue already says the phase, and the shade must stay
    darker than the idle grey so a chunk never reads as idle time.
    """
    from matplotlib.colors import to_rgb

    t = CHUNK_MAX_TINT * chunk / max(n_chunks - 1, 1)
    return tuple(c + (1.0 - c) * t for c in to_rgb(color))


def chunk_hatch(chunk: int) -> str | None:
    return CHUNK_HATCHES[chunk % len(CHUNK_HATCHES)]


def _bar_chunks(tl: Timeline, cat: np.ndarray, n_phase_cats: int) -> np.ndarray:
    """Chunk of every compute bar (0 for the rest: a transfer's colour already says its direction)."""
    chunk = np.where((cat >= 0) & (cat < n_phase_cats), tl.chunk, 0)
    return np.clip(chunk, 0, None)


def _distinct(ids: np.ndarray) -> np.ndarray:
    """The sorted distinct values of non-negative integer ids (microbatches, iterations).

    They count from 0, so a bincount finds them in a few ms where np.unique's sort of a large
    run's million events takes ~20; ids far above their count fall back to the sort.
    """
    if len(ids) and int(ids.max()) > 4 * len(ids) + 1024:
        return np.unique(ids)
    return np.flatnonzero(np.bincount(ids))


def idx_of(names: list[str], name: str) -> int:
    return names.index(name) if name in names else -1


def _merge_touching(row, cat, s, e, eps):
    """Coalesce same-(row, colour) bars separated by less than eps; invisible at this zoom."""
    if len(s) == 0:
        return row, cat, s, e
    order = np.lexsort((s, cat, row))
    row, cat, s, e = row[order], cat[order], s[order], e[order]
    lo = float(min(s.min(), e.min()))
    span = float(max(s.max(), e.max())) - lo
    big = 4.0 * (span + eps + 1.0)
    key = (row - row.min()) * (int(cat.max()) + 2) + cat
    s_off = (s - lo) + key * big
    e_off = (e - lo) + key * big
    prev = np.concatenate(([-np.inf], np.maximum.accumulate(e_off)[:-1]))
    idx = np.flatnonzero(s_off > prev + eps)
    return row[idx], cat[idx], s[idx], np.maximum.reduceat(e, idx)


def _bars(s, e, y0, y1):
    """(N, 4, 2) rectangle vertices; the fast path PolyCollection accepts directly."""
    v = np.empty((len(s), 4, 2))
    v[:, 0, 0] = v[:, 1, 0] = s
    v[:, 2, 0] = v[:, 3, 0] = e
    v[:, 0, 1] = v[:, 3, 1] = y0
    v[:, 1, 1] = v[:, 2, 1] = y1
    return v


def _coverage(rows, ps, pe, n_rows: int, width: int) -> np.ndarray:
    """(n_rows, width) share of each pixel column covered by the bars [ps, pe) (pixel units) of
    each row, capped at 1 where bars of one lane overlap.

    A bar inside one column adds its width there; a longer one adds its partial first and
    last columns and +1 to every column between (a difference array, summed along the row).
    """
    ps = np.clip(ps, 0.0, width)
    pe = np.clip(pe, ps, width)
    i0 = np.minimum(ps.astype(np.int64), width - 1)
    i1 = np.minimum(pe.astype(np.int64), width - 1)
    base = np.asarray(rows, dtype=np.int64) * (width + 1)
    one = i0 == i1
    many = ~one
    size = n_rows * (width + 1)
    part = np.bincount(np.concatenate([base[one] + i0[one], base[many] + i0[many], base[many] + i1[many]]),
                       weights=np.concatenate([pe[one] - ps[one], i0[many] + 1 - ps[many], pe[many] - i1[many]]),
                       minlength=size)
    steps = (np.bincount(base[many] + i0[many] + 1, minlength=size)
             - np.bincount(base[many] + i1[many], minlength=size))
    cov = part.reshape(n_rows, width + 1) + np.cumsum(steps.reshape(n_rows, width + 1), axis=1)
    return np.clip(cov[:, :width], 0.0, 1.0)


def _raster(layers, n_rows: int, width: int) -> tuple[np.ndarray, np.ndarray]:
    """The bar layers as an RGBA image of `width` pixel columns: (y edges, (len(y edges) - 1, width, 4) bytes).

    `layers` are (rgb, (lane top, lane bottom) as fractions of a row, rows, pixel start,
    pixel end). Each layer is composited over the ones before it at the opacity of its
    coverage, as its polygons would be. Lanes may nest (the optimizer spans the phase
    sub-lanes), so the image has one band per stretch between lane edges on every stage
    row (transparent between lanes), with exact edges: lanes sit where polygons would.
    """
    edges = sorted({0.0, 1.0, *(y for _, lane, *_ in layers for y in lane)})
    color = np.zeros((n_rows, len(edges) - 1, width, 3))
    alpha = np.zeros((n_rows, len(edges) - 1, width))
    for rgb, (top, bottom), rows, ps, pe in layers:
        lane = slice(edges.index(top), edges.index(bottom))  # views: composited in place
        a = _coverage(rows, ps, pe, n_rows, width)[:, None, :]
        keep = 1.0 - a
        alpha[:, lane] *= keep
        alpha[:, lane] += a
        color[:, lane] *= keep[..., None]
        color[:, lane] += a[..., None] * np.asarray(rgb)
    # un-premultiply; where alpha is 0 so is color, and 0 / tiny keeps it 0 without a masked divide
    np.divide(color, np.maximum(alpha, np.finfo(float).tiny)[..., None], out=color)
    image = np.empty(alpha.shape + (4,), dtype=np.uint8)
    for channels, share in ((image[..., :3], color), (image[..., 3], alpha)):
        share *= 255.0
        np.clip(share, 0.0, 255.0, out=share)
        channels[...] = np.rint(share, out=share)
    y_edges = np.append((np.arange(n_rows)[:, None] + np.asarray(edges[:-1])).ravel(), float(n_rows))
    return y_edges, image.reshape(-1, width, 4)


def _short(name: str, width: int = 22) -> str:
    return name if len(name) <= width else name[: width // 2 - 1] + "…" + name[-(width // 2):]


def label_stride(n_rows: int) -> int:
    """Every how many rows a panel of `n_rows` names one: 1 up to MAX_ROW_LABELS rows, then the
    smallest power of two that keeps it to MAX_ROW_LABELS names.

    Each name is a text, ~1.5-2 ms to lay out and draw; a PP64 run's charts have ~250 of them,
    half the dashboard's drawing time. Rows run in pipeline order, so every 2nd or 4th name
    locates the rest. A power of two keeps the named rows of a link panel (downstream and
    upstream rows alternate) all in one direction.
    """
    stride = 1
    while n_rows > stride * MAX_ROW_LABELS:
        stride *= 2
    return stride


def row_labels(ax, ys, labels, fontsize: float, stride: int = 1) -> None:
    """Row names where the y tick labels would be, drawn as plain texts: every `stride`-th row's,
    or every label_stride()-th's if that is more.

    A matplotlib tick costs ~2 ms to build and draw (two lines, two texts, a grid line), and
    these charts label a row per stage, device or link: dozens to hundreds of them.
    """
    from matplotlib import rcParams
    from matplotlib.transforms import offset_copy

    ax.set_yticks([])
    at = offset_copy(ax.get_yaxis_transform(), fig=ax.figure, x=-rcParams["ytick.major.pad"], units="points")
    step = max(stride, label_stride(len(labels)))
    for y, label in zip(ys[::step], labels[::step]):
        ax.text(0, y, label, transform=at, ha="right", va="center_baseline", fontsize=fontsize)


def _chunk_handles(chunks: list[int], n_chunks: int, dense: bool) -> list:
    """One legend entry per chunk drawn (more than one chunk per stage): its shade and hatch."""
    from matplotlib.patches import Patch

    return [Patch(facecolor=chunk_shade(CHUNK_LEGEND_COLOR, k, n_chunks), edgecolor="white",
                  hatch=None if dense else chunk_hatch(k), label=f"chunk {k}") for k in chunks]


def plot_timeline(timeline: Timeline, path, title: str | None = None) -> Path:
    """Write a PNG Gantt chart of `timeline` to `path` and return the path."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.collections import PolyCollection
    from matplotlib.colors import to_rgb
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    tl = timeline
    path = Path(path)
    n_st = max(tl.n_stages, 1)
    dpi = 110

    # ---- time axis: shift wall-clock traces to start at 0, switch to seconds when long
    valid = np.isfinite(tl.start_ms) & np.isfinite(tl.end_ms)
    if valid.any():
        t_lo, t_hi = float(tl.start_ms[valid].min()), float(tl.end_ms[valid].max())
    else:
        t_lo, t_hi = 0.0, 1.0
    shift = t_lo if (t_lo != 0.0 and abs(t_lo) > 0.05 * max(t_hi - t_lo, 1e-9)) else 0.0
    lo = t_lo - shift if shift else min(t_lo, 0.0)
    hi = t_hi - shift
    unit, scale = ("s", 1e-3) if hi - lo > 20_000 else ("ms", 1.0)
    x0, x1 = lo * scale, max(hi, lo + 1e-6) * scale
    xs = (tl.start_ms - shift) * scale
    xe = (tl.end_ms - shift) * scale

    rows = _event_rows(tl)
    compute = tl.kind == "compute"
    cat, names = _categories(tl, compute)
    n_ch = tl.n_chunks
    chunk = _bar_chunks(tl, cat, len(PHASE_COLORS))
    n_compute_row = int(np.bincount(rows[(cat >= 0) & (rows >= 0) & compute],
                                    minlength=n_st).max()) if len(tl) else 0

    # ---- figure geometry (inches): height grows with stages, fonts capped
    row_h = float(np.clip(6.0 / n_st, 0.2, 0.6))
    label_fs = float(np.clip(row_h * 72 * 0.5, 6.0, 9.5))
    labels = [f"S{s}  {_short(str(d))}" for s, d in enumerate(tl.stage_devices)] or ["S0"]
    left_in = 0.45 + max(len(l) for l in labels) * label_fs * 0.6 / 72
    top_in, bottom_in, right_in = 1.05, 0.65, 0.3
    width_in = float(np.clip(11.0 + n_compute_row / 80.0, 12.0, 22.0))
    height_in = top_in + bottom_in + row_h * n_st
    fig = Figure(figsize=(width_in, height_in), dpi=dpi)
    FigureCanvasAgg(fig)
    ax = fig.add_axes([left_in / width_in, bottom_in / height_in,
                       1 - (left_in + right_in) / width_in, (row_h * n_st) / height_in])
    ax_px = (width_in - left_in - right_in) * dpi
    px_per_x = ax_px / max(x1 - x0, 1e-12)

    # ---- limits first: the raster below is sized to the pixels they give [x0, x1] x [0, n_st]
    pad = 0.005 * (x1 - x0)
    ax.set_xlim(x0 - pad, x1 + pad)
    ax.set_ylim(n_st, -0.02)

    # ---- idle background (compute lane) and comm lane background
    # (autolim off: the limits are set, and measuring a huge collection's extent is slow)
    ys = np.arange(n_st, dtype=float)
    bg_s, bg_e = np.full(n_st, x0), np.full(n_st, x1)
    ax.add_collection(PolyCollection(_bars(bg_s, bg_e, ys + _COMPUTE[0], ys + _COMPUTE[1]),
                                     facecolors=IDLE_COLOR, edgecolors="none", zorder=0), autolim=False)
    ax.add_collection(PolyCollection(_bars(bg_s, bg_e, ys + _COMM[0], ys + _COMM[1]),
                                     facecolors=COMM_BG_COLOR, edgecolors="none", zorder=0), autolim=False)

    # ---- task bars
    bar = (cat >= 0) & (rows >= 0) & valid
    widths_px = (xe - xs)[bar & compute] * px_per_x
    dense = len(widths_px) == 0 or float(np.median(widths_px)) < _DENSE_PX
    raster = dense and int(bar.sum()) > RASTER_MIN_BARS
    # merge and draw per (colour, chunk): bars of two chunks never merge into one
    b_row, b_key, b_s, b_e = rows[bar], cat[bar] * n_ch + chunk[bar], xs[bar], xe[bar]
    if dense and not raster:  # the raster sums each pixel's busy time: nothing merged across gaps
        b_row, b_key, b_s, b_e = _merge_touching(b_row, b_key, b_s, b_e, 0.5 / px_per_x)
    b_cat, b_chunk = b_key // n_ch, b_key % n_ch
    min_w = 0.9 / px_per_x
    # Widen to ~1 px only where bars are few per row: widening thousands of sub-pixel
    # bars would paint a mostly idle stage as busy, while AA blending already shows them.
    per_row = np.bincount(cat[bar] * n_st + rows[bar], minlength=len(names) * n_st).reshape(len(names), n_st)
    widen_cat = (per_row.max(axis=1) > 0) & (per_row.max(axis=1) < ax_px / 6)
    b_e = np.where(widen_cat[b_cat], np.maximum(b_e, b_s + min_w), b_e)
    # Dense: a pixel column holds several tasks, and blended blue+orange reads as grey
    # (idle). Give each compute phase its own sub-lane so colours never mix.
    drawn = set(np.flatnonzero(per_row.any(axis=1)).tolist())
    dense_phases = [p for p in ("F", "B", "BW", "W") if idx_of(names, p) in drawn] if dense else []
    c0, c1 = _COMPUTE
    sub_h = (c1 - c0) / max(len(dense_phases), 1)
    present = []
    layers = []  # raster: (rgb, lane, rows, start, end) in drawing order
    n_comm_cats = len(COMM_COLORS)
    for ci, name in enumerate(names):
        m = b_cat == ci
        if not m.any():
            continue
        present.append(name)
        is_comm = ci >= len(names) - n_comm_cats
        lane = _COMM if is_comm else _COMPUTE
        if name in dense_phases:
            k = dense_phases.index(name)
            lane = (c0 + k * sub_h, c0 + (k + 1) * sub_h)
        color = COMM_COLORS[name] if is_comm else PHASE_COLORS[name]
        edge = "none" if (dense or is_comm) else "white"
        for k in np.unique(b_chunk[m]).tolist() if n_ch > 1 else [0]:
            mk = m & (b_chunk == k)
            face = color if n_ch == 1 else chunk_shade(color, k, n_ch)
            if raster:
                layers.append((to_rgb(face), lane, b_row[mk], b_s[mk], b_e[mk]))
                continue
            r = b_row[mk].astype(float)
            style = {} if n_ch == 1 else {"hatch": None if dense else chunk_hatch(k)}
            ax.add_collection(PolyCollection(
                _bars(b_s[mk], b_e[mk], r + lane[0], r + lane[1]),
                facecolors=face, edgecolors=edge,
                linewidths=0.4 if edge != "none" else 0.0, zorder=2, antialiaseds=True, **style), autolim=False)
    if layers:
        (px0, _), (px1, _) = ax.transData.transform([(x0, 0.0), (x1, 0.0)])
        w = max(int(round(abs(px1 - px0))), 1)
        to_px = w / (x1 - x0)
        y_edges, image = _raster([(rgb, lane, r, (s_ - x0) * to_px, (e_ - x0) * to_px)
                                  for rgb, lane, r, s_, e_ in layers], n_st, w)
        ax.pcolorfast(np.linspace(x0, x1, w + 1), y_edges, image, zorder=2)
    if len(dense_phases) > 1:
        fig.text(1 - right_in / width_in, 0.12 / height_in,
                 "bars are narrower than a pixel: each phase has its own sub-lane "
                 f"({', '.join(dense_phases)} top to bottom); faint colour = low share of time",
                 ha="right", va="bottom", fontsize=8, color="#555555")

    # ---- failures: translucent red over the whole row (or over every row if unplaced)
    fail = (tl.kind == "failure") & valid
    if fail.any():
        placed = fail & (rows >= 0)
        if placed.any():
            r = rows[placed].astype(float)
            fe = np.maximum(xe[placed], xs[placed] + 2 * min_w)
            ax.add_collection(PolyCollection(
                _bars(xs[placed], fe, r, r + 1.0), facecolors=(0.894, 0.102, 0.11, 0.28),
                edgecolors=FAILURE_COLOR, linewidths=0.8, hatch="///", zorder=3), autolim=False)
        for s_, e_ in zip(xs[fail & (rows < 0)], xe[fail & (rows < 0)]):
            ax.axvspan(s_, max(e_, s_ + 2 * min_w), color=FAILURE_COLOR, alpha=0.2, zorder=3, lw=0)
        present.append("failure")

    # ---- microbatch numbers: per phase, one font size, and only if most bars of that
    # phase can take it (labelling 0-9 but not 10+ looks like missing data)
    if not dense:
        lab_all = bar & compute & (tl.microbatch >= 0)
        digits = len(str(int(tl.microbatch[lab_all].max()))) if lab_all.any() else 1
        px_per_pt = 0.62 * dpi / 72 * digits
        budget = _MAX_LABELS
        for ph in np.unique(tl.phase[lab_all]):
            lab = lab_all & (tl.phase == ph)
            w_px = (xe[lab] - xs[lab]) * px_per_x
            text_fs = min(8.0, row_h * 72 * 0.38, 0.95 * (float(np.percentile(w_px, 20)) - 3) / px_per_pt)
            fits = w_px >= text_fs * px_per_pt + 2.5
            if text_fs < 5.0 or not 0 < fits.sum() <= budget:
                continue
            budget -= int(fits.sum())
            cx = ((xs[lab] + xe[lab]) / 2)[fits]
            cy = rows[lab][fits] + sum(_COMPUTE) / 2
            for x, y, m in zip(cx, cy, tl.microbatch[lab][fits]):
                ax.text(x, y, str(int(m)), ha="center", va="center", fontsize=text_fs,
                        color="white", zorder=4, clip_on=True)

    # ---- iteration boundaries: where the optimizer step splits one batch from the next
    its = tl.iteration[(tl.iteration >= 0) & valid]
    if len(its):
        uniq = _distinct(its)
        if 1 < len(uniq) <= 64:
            starts = [xs[(tl.iteration == i) & valid].min() for i in uniq]
            ax.vlines(starts[1:], -0.1, n_st, colors="#555555", linestyles=(0, (4, 3)),
                      linewidths=0.8, zorder=5)
            if len(uniq) <= 24:
                for i, x in zip(uniq, starts):
                    ax.text(x, -0.12, f" it {int(i)}", fontsize=7, color="#555555", va="bottom",
                            ha="left", clip_on=False)

    # ---- axes, labels, legend
    row_labels(ax, ys + sum(_COMPUTE) / 2, labels[:n_st], label_fs)
    ax.tick_params(axis="y", length=0)
    ax.tick_params(axis="x", labelsize=9)
    if n_st > 24:  # long charts: time axis on top as well so it is visible without scrolling
        ax.tick_params(axis="x", labeltop=True, top=True)
    ax.set_xlabel(f"time ({unit})" + (f" since {shift:.3f} ms" if shift else ""), fontsize=10)
    ax.grid(axis="x", color="white", linewidth=0.6, zorder=1)
    ax.set_axisbelow(True)
    for sp in ("top", "right", "left"):
        ax.spines[sp].set_visible(False)

    legend_names = {"F": "forward", "B": "backward", "W": "weight grad", "BW": "backward (fused)",
                    "OPT": "optimizer", "other": "compute", "send F": "send activations",
                    "send B": "send gradients", "allreduce": "all-reduce",
                    "collective": "TP collectives"}
    handles = [Patch(facecolor=PHASE_COLORS.get(n, COMM_COLORS.get(n)), label=legend_names[n])
               for n in present if n != "failure"]
    if "failure" in present:
        handles.append(Patch(facecolor=(0.894, 0.102, 0.11, 0.28), edgecolor=FAILURE_COLOR,
                             hatch="///", label="failure"))
    handles.append(Patch(facecolor=IDLE_COLOR, label="idle"))
    if n_ch > 1:
        handles += _chunk_handles(np.unique(b_chunk[b_cat < len(PHASE_COLORS)]).tolist(), n_ch, dense)
    fig.legend(handles=handles, loc="upper center", ncol=len(handles), fontsize=9, frameon=False,
               bbox_to_anchor=(0.5, 1 - 0.48 / height_in), handlelength=1.4, columnspacing=1.2)

    if title is None:
        meta = tl.meta or {}
        sched = meta.get("schedule") or meta.get("scheduler") or "pipeline"
        n_mb = len(_distinct(tl.microbatch[tl.microbatch >= 0]))
        title = f"{sched}: {tl.n_stages} stages" + (f" x {n_ch} chunks" if n_ch > 1 else "") + \
            f", {n_mb} microbatches"
        n_it = len(_distinct(tl.iteration[tl.iteration >= 0]))
        if n_it > 1:
            title += f" ({n_it} iterations x {tl.microbatches_per_iteration})"
        if "seed" in meta:
            title += f", seed {meta['seed']}"
    fig.suptitle(title, y=1 - 0.1 / height_in, va="top", fontsize=12)
    fig.savefig(path, dpi=dpi, facecolor="white", metadata={"Software": None}, pil_kwargs=PNG_OPTIONS)
    return path
