"""What this machine's /proc says about a process: whether it exists, its command line.

Standard library only (spark_ops/headlib/__init__.py says why).
"""

from __future__ import annotations

import os


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
