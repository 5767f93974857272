"""Training progress over wall-clock time, with a marker for every interruption by kind.

Top: the model's iteration counter (it drops back to the last checkpoint on a
restart failure) against the fault-free pace (dashed). Bottom: how far behind
the fault-free pace the job is, in hours of training; every interruption is a
step up, so individual failures stay visible over weeks-long horizons.
"""
from __future__ import annotations

from pathlib import Path

MARKERS = {  # kind -> (color, marker, label)
    "device_failure": ("#d62728", "x", "device failure"),
    "job_failure": ("#9467bd", "x", "job failure (software/unknown)"),
    "link_failure": ("#ff7f0e", "x", "link failure"),
    "planned": ("#2ca02c", "|", "planned interruption"),
}


def plot_progress(result, path: str | Path, *, title: str | None = None) -> Path:
    """Write the progress picture of a HorizonResult to `path` (PNG) and return the path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    scale, unit = (24.0, "days") if result.horizon_ms / 3_600_000.0 > 72 else (1.0, "hours")
    t = np.asarray(result.progress_t_hours) / scale
    it = np.asarray(result.progress_iterations)
    h = result.horizon_ms / 3_600_000.0 / scale

    fig, (ax, gap) = plt.subplots(2, 1, figsize=(10, 6.5), dpi=110, sharex=True,
                                  gridspec_kw={"height_ratios": [3, 2]})
    behind_h = (np.asarray(result.progress_t_hours) * 3_600_000.0 / result.iteration_ms - it) \
        * result.iteration_ms / 3_600_000.0
    gap.plot(t, behind_h, lw=1.0, color="#1f77b4")
    ax.plot([0, h], [0, result.iterations_without_faults], ls="--", lw=1, color="0.5", label="without faults")
    ax.plot(t, it, lw=1.2, color="#1f77b4", label="with faults")
    for kind, (color, marker, label) in MARKERS.items():
        evs = [e for e in result.events if e.kind == kind]
        if evs:
            x = [e.t_ms / 3_600_000.0 / scale for e in evs]
            ax.scatter(x, [e.iteration for e in evs], s=18,
                       color=color, marker=marker, lw=1, zorder=3, label=f"{label} ({len(evs)})")
            behind = [(e.t_ms / result.iteration_ms - e.iteration) * result.iteration_ms / 3_600_000.0 for e in evs]
            gap.scatter(x, behind, s=12, color=color, marker=marker, lw=1, zorder=3)
    gap.set_xlabel(f"wall clock ({unit})")
    gap.set_ylabel("behind fault-free pace (h)")
    gap.set_ylim(bottom=0)
    gap.grid(alpha=0.3)
    ax.set_ylabel("completed iterations")
    ax.set_xlim(0, h)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.set_title(title or f"Training progress: goodput {result.goodput_ratio:.1%}, "
                          f"{result.failure_count} failures")
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
