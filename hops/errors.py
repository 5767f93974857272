"""User-facing errors: one line that names where the problem is and what was expected."""

EXIT_USER_ERROR = 2  # the exit status of a command that ends on a user error (its one line is on stderr)
EXIT_INTERRUPTED = 130  # Ctrl-C: the shell's 128 + SIGINT
ECHO_CHARS = 80  # an echoed value longer than this is cut: the line names the problem, not the payload


def echo(value) -> str:
    """`repr(value)` for an error message, cut to ECHO_CHARS with the length it had.

    A scenario or trace can hold a 10 kB string where a name belongs; echoing it whole
    makes a one-line error a page long.
    """
    text = repr(value)
    if len(text) <= ECHO_CHARS:
        return text
    return f"{text[:ECHO_CHARS - 20]}... ({len(text):,} characters)"


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
