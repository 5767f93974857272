"""HOPS: a discrete-event simulator of pipeline-parallel training on heterogeneous clusters.

Importing this package loads only numpy and pyyaml: Hydra, MLflow and matplotlib stay out
of the core so it can be used from a notebook or a tight loop. The output modules
`hops.plots` and `hops.chrome_trace` are attributes of the package all the same, imported
on first use (`hops.plots.plot_timeline(...)` right after `import hops` works).
"""
import importlib

from .api import Result, simulate
from .errors import HopsError, ScenarioError, TraceError
from .hardware import Catalog
from .scenario import Scenario, load_scenario
from .timeline import Timeline

__all__ = ["simulate", "Result", "Scenario", "load_scenario", "Catalog", "Timeline", "HopsError",
           "ScenarioError", "TraceError"]

_LAZY = ("plots", "chrome_trace")  # submodules loaded on first attribute access (PEP 562)


def __getattr__(name: str):
    if name in _LAZY:
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})

