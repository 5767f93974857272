"""What a run writes: files on disk (atomically), the events CSV, the Chrome trace and the plots.

The writers load matplotlib and large formatting tables, so each is imported on first
attribute access (PEP 562): `hops.outputs.plots.plot_timeline(...)` works right after
`import hops` without `import hops` paying for matplotlib.
"""
import importlib

_LAZY = ("files", "text_columns", "chrome_trace", "plots")


def __getattr__(name: str):
    if name in _LAZY:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
