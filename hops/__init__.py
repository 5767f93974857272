"""HOPS: a discrete-event simulator of pipeline-parallel training on heterogeneous clusters.

Importing this package loads only numpy and pyyaml: Hydra, MLflow and matplotlib stay out
of the core so it can be used from a notebook or a tight loop. The output modules
`hops.outputs.plots` and `hops.outputs.chrome_trace` are attributes of the package all the same, imported
on first use (`hops.outputs.plots.plot_timeline(...)` right after `import hops` works).
"""
from hops.api import Result, simulate
from hops.errors import HopsError, ScenarioError, TraceError
from hops.model.hardware import Catalog
from hops.scenario import Scenario, load_scenario
from hops.timeline import Timeline

__all__ = ["simulate", "Result", "Scenario", "load_scenario", "Catalog", "Timeline", "HopsError",
           "ScenarioError", "TraceError"]

