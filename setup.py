"""Package layout that pyproject.toml cannot express on its own.

The Hydra config tree lives at the repository root (conf/, a fixed part of the layout)
but has to ship inside the wheel, so `pip install .` gives a working `hops` command:
it is installed as the package data of `hops.conf`. Everything else is in pyproject.toml.
"""
from setuptools import find_packages, setup

setup(packages=[*find_packages(include=["hops*", "autoresearch*", "experiments*", "hydra_plugins*"]), "hops.conf"],
      package_dir={"hops.conf": "conf"})
