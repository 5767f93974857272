"""User-facing errors: one line that names where the problem is and what was expected."""


class HopsError(Exception):
    """Base for every error caused by user input rather than a bug in HOPS."""


class ScenarioError(HopsError, ValueError):
    """A scenario field is missing, mistyped or inconsistent; the message starts with its path."""

    def __init__(self, path: str, message: str, source: str | None = None):
        self.path = path
        self.source = source
        self.message = message
        prefix = f"{source}: " if source else ""
        super().__init__(f"{prefix}{path}: {message}")

    def __reduce__(self):  # picklable, so errors cross process pools (joblib sweeps, --jobs)
        return (type(self), (self.path, self.message, self.source))


class TraceError(HopsError, ValueError):
    """A trace or benchmark file cannot be imported; the message names file and line."""
