"""Run a command on a pseudo-terminal, as a user's shell runs it (tests capture pipes otherwise).

What only a terminal shows — progress lines, launchers that pickle what a terminal-aware
object holds — is invisible when stdout and stderr are pipes, so these tests give the
process a pty (with a window size, as a real terminal has; tqdm draws nothing on a
0 x 0 one) and read everything it writes there.
"""
from __future__ import annotations

import fcntl
import os
import select
import signal
import struct
import subprocess
import termios
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def on_terminal(argv: list[str], *, env: dict | None = None, cwd: Path = REPO, timeout: float = 300,
                cols: int = 120, rows: int = 30) -> tuple[int, str]:
    """(exit code, everything written to the terminal: stdout and stderr interleaved, as shown)."""
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
    env = {k: v for k, v in (os.environ if env is None else env).items() if k != "HYDRA_FULL_ERROR"}
    proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, cwd=cwd, env=env,
                            start_new_session=True)
    os.close(slave)
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout
    try:
        while True:
            ready, _, _ = select.select([master], [], [], 0.5)
            if ready:
                try:
                    data = os.read(master, 1 << 16)
                except OSError:  # EIO: every process holding the terminal has closed it
                    break
                if not data:
                    break
                chunks.append(data)
            elif proc.poll() is not None:  # exited, and nothing more came for 0.5 s (e.g. a lingering worker)
                break
            if time.monotonic() > deadline:
                os.killpg(proc.pid, signal.SIGKILL)
                raise TimeoutError(f"{argv} still running after {timeout:.0f} s:\n"
                                   + b"".join(chunks).decode(errors="replace")[-3000:])
        code = proc.wait(timeout=60)
    finally:
        os.close(master)
    return code, b"".join(chunks).decode(errors="replace")


def lines_as_shown(text: str) -> list[str]:
    """The terminal's lines after carriage returns overwrote them (what the user reads at the end)."""
    shown = []
    for line in text.replace("\r\n", "\n").split("\n"):
        screen: list[str] = []
        for part in line.split("\r"):  # each \r returns to column 0; later text overwrites earlier
            if part.startswith("\x1b[K"):  # erase to the end of the line (from column 0 here)
                screen, part = [], part[3:]
            screen[: len(part)] = list(part)
        shown.append("".join(screen).rstrip())
    return shown
