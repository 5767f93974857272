"""Shared pytest fixtures.

Tests on real traces need data that is not in the repo. Locally a missing
fixture root is a skip (a fresh clone still runs the synthetic specs); in CI it
is a failure, because a green CI run that silently skipped every real-data
check would certify nothing.
"""
import os
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def fixtures_root() -> Path:
    root = os.environ.get("HOPS_FIXTURES")
    if not root:
        msg = "HOPS_FIXTURES is not set: point it at a fixture root (see fixtures/README.md)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(msg)
        pytest.skip(msg)
    path = Path(root).resolve()  # absolute: tests chdir and build symlinked fixture roots
    if not path.is_dir():
        pytest.fail(f"HOPS_FIXTURES={root} is not a directory")
    return path
