"""A Ray launcher pointed at an address where no cluster answers ends in one line within
seconds, instead of ray.init's minutes of retries (hops/run/launchers.py)."""
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hops.run.launchers import ray_address_problem

REPO = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("address", [None, "", "auto", "local", "ray://head:10001"])
def test_addresses_ray_init_resolves_itself_are_not_probed(address):
    assert ray_address_problem(address) is None


def test_an_address_with_a_listener_passes():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        assert ray_address_problem(f"127.0.0.1:{server.getsockname()[1]}") is None


def test_an_address_nobody_listens_on_says_how_to_start_the_head():
    port = free_port()
    problem = ray_address_problem(f"127.0.0.1:{port}")
    assert problem.startswith(f"no Ray cluster answers at 127.0.0.1:{port}")
    assert f"ray start --head --port={port}" in problem


def test_an_address_without_a_port_is_named():
    assert ray_address_problem("headnode") == ("RAY_ADDRESS='headnode' is not HOST:PORT (the head's GCS address, "
                                               "e.g. 10.0.0.5:6379)")


def test_a_sweep_on_an_unreachable_cluster_is_one_line_in_seconds(tmp_path):
    port = free_port()
    env = {**os.environ, "RAY_ADDRESS": f"127.0.0.1:{port}", "MPLBACKEND": "Agg"}
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "hops.run", "-m", "hydra/launcher=hops_ray", "simulation.seed=1,2",
                           "output.plots=false", f"hydra.sweep.dir={tmp_path / 'sweep'}"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr[-2000:]
    assert proc.stderr.startswith(f"error: hydra/launcher=hops_ray: no Ray cluster answers at 127.0.0.1:{port}")
    assert time.monotonic() - start < 60
