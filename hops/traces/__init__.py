"""Importers that turn measured runs into the same shapes the simulator produces.

A trace becomes a Timeline and a link benchmark becomes scenario `overrides`, so
measured and simulated runs are scored by the same code (README, Real traces and calibration).
"""
from hops.traces.link_bench import fit_link_bench, link_overrides
from hops.traces.megatron import load_trace

__all__ = ["load_trace", "fit_link_bench", "link_overrides"]
