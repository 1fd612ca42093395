"""The one flock of spark-ops in Python: hold a lock file, probe it, say who has it open.

`locked` takes an exclusive flock (waking as soon as the holder lets go, bounded by a timeout; a
lock file this account may not write is locked through a read-only descriptor); `lock_free` is the
one probe (the Python twin of remote.programs.lock.LOCK_FREE_SH); a timeout names the processes
that have the lock file open (`lock_holders`); `history_locks` / `history_locked` are the locks a
change to a restart history takes (its default `<name>.lock` beside every name of its symlink
chain). Standard library only (spark_ops/headlib/__init__.py says why).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
import time
from collections.abc import Iterator
from typing import Any

from spark_ops.headlib.atomic import open_owned
from spark_ops.headlib.errors import HeadFailure, LockTimeout
from spark_ops.headlib.proc import command_of, process_exists

DEFAULT_LOCK_TIMEOUT = 10.0


def _flock_wait(fd: int, timeout: float) -> bool:
    """Wait up to timeout for an exclusive flock on fd; on timeout the waiter thread owns fd.

    A blocking flock in a helper thread is woken by the kernel as soon as the holder lets go,
    which polling would miss under contention; it needs no signals, so it works in any thread.
    """
    done = threading.Event()
    guard = threading.Lock()
    state = {"got": False, "abandoned": False}

    def waiter() -> None:
        """Block on the lock; hand it over, or drop it if the caller gave up meanwhile."""
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            ok = True
        except OSError:
            ok = False
        with guard:
            if state["abandoned"]:
                os.close(fd)  # closing releases the lock if we got it
                return
            state["got"] = ok
            done.set()

    threading.Thread(target=waiter, name="history-lock", daemon=True).start()
    done.wait(timeout)
    with guard:
        if state["got"]:
            return True
        state["abandoned"] = True
        return False


def _open_lock(lock_path: str, follow: bool = True) -> int:
    """Open a lock file as every taker does: created when missing, read-only if need be; a
    symlink there refused (ELOOP) when not to be followed."""
    no_link = 0 if follow else os.O_NOFOLLOW
    try:
        try:
            return open_owned(lock_path, os.O_RDWR | os.O_CREAT | no_link)
        except PermissionError:
            return os.open(lock_path, os.O_RDONLY | os.O_CLOEXEC | no_link)  # flock: read-only ok
    except OSError as exc:
        raise HeadFailure(
            f"cannot open lock file {lock_path}: {exc.strerror}", lock=lock_path
        ) from None


def lock_free(lock_path: str) -> bool:
    """Whether nobody holds lock_path's flock right now: taken and let go at once, never waited for.

    The Python twin of remote.programs.lock.LOCK_FREE_SH. The file is opened as `locked` opens it
    (created when missing); one that cannot be opened raises HeadFailure.
    """
    fd = _open_lock(lock_path)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)  # closing lets the lock go
    return True


@contextlib.contextmanager
def locked(
    lock_path: str, timeout: float = DEFAULT_LOCK_TIMEOUT, *, follow: bool = True
) -> Iterator[None]:
    """Hold an exclusive flock on lock_path; raise LockTimeout naming it after timeout seconds
    (follow=False: a symlink at lock_path is refused as the file is opened, never followed)."""
    fd = _open_lock(lock_path, follow)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        if timeout <= 0 or not _flock_wait(fd, timeout):
            if timeout <= 0:
                os.close(fd)
            raise lock_timeout_error(lock_path, timeout) from None
    try:
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def lock_timeout_error(
    lock_path: str, timeout: float, holders: list[dict[str, Any]] | None = None
) -> LockTimeout:
    """The LockTimeout for lock_path: the lock, the wait and who has the lock file open."""
    holders = lock_holders(lock_path) if holders is None else holders
    who = "; ".join(
        f"pid {h['pid']} ({h['command'] or '?'}){' holds it' if h['holds'] else ''}"
        for h in holders
    )
    return LockTimeout(
        f"lock {lock_path} is held by another process; gave up after {timeout:g} s"
        + (f"; processes with it open: {who}" if who else ""),
        lock=lock_path,
        timeout=timeout,
        holders=holders,
    )


_HOLDERS_SCAN_S = 2.0  # at most this long looking through /proc for who has the lock open


def lock_holders(lock_path: str, limit: int = 8) -> list[dict[str, Any]]:
    """The processes of this machine with lock_path open (a holder, or a waiter), from /proc.

    `holds` is True for the process /proc/locks names as the flock's taker, when it still runs
    (flock(1) takes the lock for its shell and exits: the shell then shows as having it open).
    Best effort, bounded in time; empty where /proc cannot be read.
    """
    try:
        st = os.stat(lock_path)
    except OSError:
        return []
    takers = _flock_takers(st)
    me = os.getpid()
    found: dict[int, dict[str, Any]] = {}
    give_up = time.monotonic() + _HOLDERS_SCAN_S
    try:
        pids = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
    except OSError:
        pids = []
    for pid in pids:
        if len(found) >= limit or time.monotonic() > give_up:
            break
        if pid == me:
            continue
        fd_dir = f"/proc/{pid}/fd"
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        for fd in fds:
            try:
                other = os.stat(os.path.join(fd_dir, fd))
            except OSError:
                continue
            if (other.st_dev, other.st_ino) == (st.st_dev, st.st_ino):
                found[pid] = {"pid": pid, "command": command_of(pid), "holds": pid in takers}
                break
    for pid in takers:
        if pid not in found and pid != me and len(found) < limit and process_exists(pid):
            found[pid] = {"pid": pid, "command": command_of(pid), "holds": True}
    return sorted(found.values(), key=lambda h: (not h["holds"], h["pid"]))


def _flock_takers(st: os.stat_result) -> set[int]:
    """The pids /proc/locks names as holding a lock on the file of st (waiters left out)."""
    out: set[int] = set()
    try:
        with open("/proc/locks") as f:
            lines = f.read().splitlines()
    except OSError:
        return out
    for line in lines:
        fields = line.split()
        if len(fields) < 6 or fields[1] == "->":  # "N: -> FLOCK ..." is a blocked waiter
            continue
        dev = fields[5].split(":")
        if len(dev) != 3 or not fields[4].lstrip("-").isdigit():
            continue
        try:
            same = (int(dev[0], 16), int(dev[1], 16), int(dev[2])) == (
                os.major(st.st_dev), os.minor(st.st_dev), st.st_ino
            )  # fmt: skip
        except ValueError:
            continue
        if same and int(fields[4]) > 0:
            out.add(int(fields[4]))
    return out


def default_lock(history: str) -> str:
    """Return the default lock path for a history file."""
    return history + ".lock"


def link_chain(path: str, limit: int = 40) -> list[str]:
    """The names a path reaches its file by: path, then each symlink's target in turn."""
    names = [path]
    current = path
    for _ in range(limit):
        try:
            target = os.readlink(current)
        except OSError:
            break  # not a link, or missing: the end of the chain
        current = os.path.join(os.path.dirname(current), target)
        names.append(current)
    return names


def history_locks(path: str, lock: str | None = None) -> list[str]:
    """The lock files a change to the history at path takes, in the order it takes them.

    A watchdog locks `<history>.lock` by the name it was given for the history. Reached through a
    symlink, one history has several names, and a writer locking beside the link and one locking
    beside the target would exclude nobody (issue 20 #7: appends lost during a prune). So the
    default lock is taken beside every name of the chain (the path, each link on the way, the
    file it ends at), each file once (by real path), in the order of their real paths: one global
    order, so two writers naming the chain differently never deadlock. A lock named explicitly
    (the inventory's `lock_file`, the watchdog's own) is exactly that one file.
    """
    if lock and lock != default_lock(path):
        return [lock]
    by_real: dict[str, str] = {}
    for name in link_chain(path):
        candidate = default_lock(name)
        by_real.setdefault(os.path.realpath(candidate), candidate)
    return [by_real[real] for real in sorted(by_real)]


@contextlib.contextmanager
def history_locked(
    path: str, lock: str | None = None, timeout: float = DEFAULT_LOCK_TIMEOUT
) -> Iterator[list[str]]:
    """Hold every lock of history_locks(path, lock), within one timeout in all; yield them."""
    locks = history_locks(path, lock)
    give_up = time.monotonic() + timeout
    with contextlib.ExitStack() as stack:
        for one in locks:
            left = max(0.0, give_up - time.monotonic()) if timeout > 0 else 0.0
            try:
                stack.enter_context(locked(one, left))
            except LockTimeout as exc:  # the whole wait is shown, not what was left of it
                raise lock_timeout_error(one, timeout, exc.details.get("holders")) from None
        yield locks
