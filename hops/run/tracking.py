"""An MLflow tracking server that is not there fails in seconds, in one line.

MLflow's HTTP client retries a refused connection 7 times with exponential backoff
(MLFLOW_HTTP_REQUEST_MAX_RETRIES / _BACKOFF_FACTOR: about 4 minutes) before it raises,
and then with a traceback. Those retries are right for a server that blips during a long
calibration, so they stay; what changes is the start: every command that logs (hops.run
with output.mlflow=true, every autoresearch command) first asks the server for any HTTP
answer, with a short timeout, and refuses at once if none comes. No MLflow import here:
a plain HTTP request is enough to know whether anything listens.
"""
from __future__ import annotations

import re

from hops.errors import HopsError

PROBE_TIMEOUT_S = 5.0


class TrackingServerError(HopsError):
    """MLFLOW_TRACKING_URI names a server that does not answer."""


def redact(uri: str) -> str:
    """A URI without its password (user:***@host), for messages and logged params."""
    return re.sub(r"//([^:/@]+):[^@/]*@", r"//\1:***@", uri)


def check_reachable(uri: str, timeout_s: float = PROBE_TIMEOUT_S) -> None:
    """Raise TrackingServerError unless an http(s) tracking URI answers within `timeout_s`.

    Any HTTP status counts as an answer (a proxy may refuse the probe path and still serve
    MLflow); only no answer at all (refused, unresolvable, timed out) is an error. Other
    schemes (sqlite, file, databricks, ...) are not servers to probe.
    """
    if not uri.lower().startswith(("http://", "https://")):
        return
    import socket
    import urllib.error
    import urllib.request

    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(uri)  # urllib takes no user:password@ in a URL; an answer without credentials will do
    host = f"[{parts.hostname}]" if parts.hostname and ":" in parts.hostname else parts.hostname or ""
    netloc = host + (f":{parts.port}" if parts.port else "")
    probe = urlunsplit((parts.scheme, netloc, parts.path.rstrip("/") + "/health", "", ""))
    try:
        urllib.request.urlopen(probe, timeout=timeout_s).close()
    except urllib.error.HTTPError:
        return  # it answered
    except (urllib.error.URLError, OSError, socket.timeout) as exc:
        reason = getattr(exc, "reason", exc)
        raise TrackingServerError(
            f"MLflow tracking server {redact(uri)} does not answer ({reason}; waited at most {timeout_s:g} s); "
            f"start it, or unset MLFLOW_TRACKING_URI to log to the local store under mlruns/") from None
