"""What this machine's /proc says about a process: whether it exists, its command line.

Standard library only (spark_ops/headlib/__init__.py says why).
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from types import FrameType

# What a cut session (or an operator's Ctrl-C) ends a head program with: held by signals_held
HELD_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)


def process_exists(pid: int) -> bool:
    """Whether a process with this pid runs on this machine (another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # EPERM: it exists, owned by someone else
    return True


def command_of(pid: int) -> str:
    """A process's command line on one printable line, cut to 160 characters ('' if unreadable)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            raw = f.read(4096)
    except OSError:
        return ""
    text = " ".join(raw.replace(b"\0", b" ").decode("utf-8", "replace").split())
    return "".join(c if c.isprintable() else "?" for c in text)[:160]


def exit_on_hangup() -> None:
    """Make SIGTERM and SIGHUP raise SystemExit, so a writer whose session went away still runs
    its clean-up (atomic_write removes its staged file) before it ends.

    A dropped SSH session ends the command it ran with one of them (the embedded server sends
    SIGTERM to its process group, sshd SIGHUP with a terminal); Python's default for both ends the
    process at once, leaving the staged file of a write cut short beside the history.
    """

    def _raise(signum: int, _frame: FrameType | None) -> None:
        """End the program the way an exception does."""
        raise SystemExit(128 + signum)

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _raise)


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """Hold SIGTERM, SIGHUP and SIGINT while the block runs (a file's rename and the journal line
    that says it), each delivered once it ends: a cut session ends the program before both or
    after both, never between (the history pruned and its journal silent)."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, HELD_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
