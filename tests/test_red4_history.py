"""The red team of 2026-12-05, round 4: the head's history program cut by its session.

Run as the head runs it (`python3 -`, the program on stdin, spark_ops.headlib.head_program):
the session's signal in the lock wait, and stdout gone before the final JSON (EPIPE) once the
work is done (docs/reliability.md, "The red team of 2026-12-05, round 4"). The cuts inside the
write (the backup's link, the staged file's fsync, after the rename, the directory's and the
journal's fsync, twice in a row) were run under `strace -e inject=…:delay_enter=…` and held.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from spark_ops.headlib.flock import lock_free
from spark_ops.watchdog.contract import history_source

STAMPS = [1796400000 + 60 * i for i in range(6)]
OLD = "".join(f"{s}\n" for s in STAMPS)
NEW = "".join(f"{s}\n" for s in STAMPS if s != STAMPS[2])


@pytest.fixture(scope="module")
def program() -> bytes:
    """history.py as the head gets it."""
    return history_source().encode()


def _start(program: bytes, hist: Path, stdout: int | None = subprocess.PIPE) -> subprocess.Popen:  # type: ignore[type-arg]
    """`python3 - prune --stamp …` on hist, the program written to its stdin."""
    argv = [sys.executable, "-", "prune", "--history", str(hist), "--stamp", str(STAMPS[2])]
    p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=stdout, stderr=subprocess.PIPE)
    assert p.stdin is not None
    p.stdin.write(program)
    p.stdin.close()
    p.stdin = None
    return p


def _left(hist: Path) -> list[str]:
    """Staged files beside the history."""
    return [n for n in os.listdir(hist.parent) if ".tmp." in n]


def test_stdout_gone_before_the_final_print_keeps_the_programs_code(
    tmp_path: Path, program: bytes
) -> None:
    """The session went away (OpenSSH without a pty sends no signal: the program runs on and its
    print meets EPIPE) after the prune was done: the program ended with a BrokenPipeError
    traceback and exit 1 ("a bug") for a prune that is whole. Now its own code, nothing on
    stderr; the history pruned, its journal line written, no staged file, the lock free."""
    hist = tmp_path / "restarts"
    hist.write_text(OLD)
    read, write = os.pipe()
    os.close(read)  # the reader gone before the print
    p = _start(program, hist, stdout=write)
    os.close(write)
    _, err = p.communicate(timeout=60)
    assert (p.returncode, err) == (0, b"")
    assert hist.read_text() == NEW
    journal = (tmp_path / "restarts.journal.jsonl").read_text().splitlines()
    assert [json.loads(x)["action"] for x in journal] == ["prune"]
    assert _left(hist) == [] and lock_free(str(hist) + ".lock")


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGHUP", "SIGINT", "SIGKILL"])
def test_a_session_cut_in_the_lock_wait_leaves_all_as_it_was(
    tmp_path: Path, program: bytes, sig: str
) -> None:
    """Held: the embedded server's SIGTERM on channel close (sshd's SIGHUP with a pty, a Ctrl-C,
    a SIGKILL) while the prune waits for the history's lock (its flock waiter thread): the
    program ends, the history as it was, no staged file, the lock free once its holder lets go;
    the same prune again converges."""
    hist = tmp_path / "restarts"
    hist.write_text(OLD)
    fd = os.open(str(hist) + ".lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        p = _start(program, hist)
        give_up = time.monotonic() + 30
        while time.monotonic() < give_up and not _waiting(p.pid, hist):
            time.sleep(0.05)
        p.send_signal(getattr(signal, sig))
        p.communicate(timeout=30)
    finally:
        os.close(fd)
    assert p.returncode != 0
    assert hist.read_text() == OLD and _left(hist) == []
    assert lock_free(str(hist) + ".lock")
    again = _start(program, hist)
    out, _ = again.communicate(timeout=60)
    assert again.returncode == 0 and json.loads(out)["removed"][0]["stamp"] == STAMPS[2]
    assert hist.read_text() == NEW


def _waiting(pid: int, hist: Path) -> bool:
    """Whether pid has the history's lock file open (it waits for the flock)."""
    lock = os.stat(str(hist) + ".lock")
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            st = os.stat(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if (st.st_dev, st.st_ino) == (lock.st_dev, lock.st_ino):
            return True
    return False
