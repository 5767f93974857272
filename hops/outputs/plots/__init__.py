"""Pictures of a run (timeline Gantt chart, metrics dashboard).

matplotlib is imported only inside the plotting functions, so `import hops`
and `import hops.outputs.plots` stay cheap and work on hosts without a display or
without matplotlib at all; only the call that draws pays for it.
"""
from __future__ import annotations

from hops.outputs.plots.dashboard import plot_dashboard
from hops.outputs.plots.timeline_plot import PHASE_COLORS, plot_timeline

__all__ = ["plot_timeline", "plot_dashboard", "PHASE_COLORS"]
