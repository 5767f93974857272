"""What a sweep's launcher needs before its first job: a Ray cluster that answers.

`RAY_ADDRESS=HOST:PORT ... hydra/launcher=hops_ray` joins an existing cluster. When nothing
listens there, ray.init retries its GCS connection for minutes, printing a warning each time,
and the sweep looks hung. A TCP probe of the address first turns that into one line.
"""
from __future__ import annotations

import socket
import sys
from typing import Any

from hops.errors import EXIT_USER_ERROR

try:  # the callback base class (Hydra is there whenever this callback is configured)
    from hydra.experimental.callback import Callback
except ImportError:  # pragma: no cover
    Callback = object  # type: ignore[misc,assignment]

PROBE_TIMEOUT_S = 5.0


def ray_address_problem(address: Any, timeout_s: float = PROBE_TIMEOUT_S) -> str | None:
    """None when `address` (ray.init's: HOST:PORT, "auto", "local", a ray:// URL or None) needs
    no probe or answers; otherwise why not, in words for the user."""
    if address is None or str(address).strip() in ("", "auto", "local") or "://" in str(address):
        return None  # a private local Ray, the node's own cluster, or Ray Client: ray.init decides
    host, sep, port = str(address).strip().rpartition(":")
    if not sep or not port.isdigit():
        return f"RAY_ADDRESS={address!r} is not HOST:PORT (the head's GCS address, e.g. 10.0.0.5:6379)"
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as exc:
        return (f"no Ray cluster answers at {address} ({exc.strerror or exc}; waited at most {timeout_s:g} s): "
                f"start its head with `ray start --head --port={port}`, or unset RAY_ADDRESS for a private local Ray")
    return None


class ReachableRay(Callback):
    """Hydra callback: under a Ray launcher, probe the cluster's address before the sweep starts.

    Hydra turns an exception in a callback into a warning and carries on, so the refusal ends
    the process here: one line, exit code 2."""

    def on_multirun_start(self, config, **kwargs: Any) -> None:
        launcher = config.hydra.get("launcher") or {}
        if "ray" not in str(launcher.get("_target_", "")).lower():
            return
        problem = ray_address_problem(((launcher.get("ray") or {}).get("init") or {}).get("address"))
        if problem is not None:
            print(f"error: hydra/launcher=hops_ray: {problem}", file=sys.stderr)
            raise SystemExit(EXIT_USER_ERROR)
