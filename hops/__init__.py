"""HOPS: a discrete-event simulator of pipeline-parallel training on heterogeneous clusters.

Importing this package loads only numpy and pyyaml: Hydra, MLflow and matplotlib stay out
of the core so it can be used from a notebook or a tight loop.
"""
from .api import Result, simulate
from .errors import HopsError, ScenarioError, TraceError
from .hardware import Catalog
from .scenario import Scenario, load_scenario
from .timeline import Timeline

__all__ = ["simulate", "Result", "Scenario", "load_scenario", "Catalog", "Timeline", "HopsError",
           "ScenarioError", "TraceError"]
