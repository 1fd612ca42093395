"""The one atomic writer: temp file beside the target, write, fsync, rename, directory fsync.

Mode and owner are kept (as root, a new file gets its directory's owner); a symlink is written
through (its target replaced, the link kept). The staged files a killed writer leaves are removed
only when provably that dead writer's own (`clean_stale_tmp`). Standard library only
(spark_ops/headlib/__init__.py says why).
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
import tempfile
import time

from spark_ops.headlib.errors import HeadFailure
from spark_ops.headlib.proc import process_exists


def owner_for(path: str) -> tuple[int, int] | None:
    """As root, the (uid, gid) a file at path should get: its current owner, else its directory's.

    spark-ops runs this script with sudo while the watchdog may run as another user: files that
    root creates or replaces must stay writable for that user. None when not root.
    """
    if os.geteuid() != 0:
        return None
    for candidate in (path, os.path.dirname(os.path.abspath(path))):
        try:
            st = os.stat(candidate)
        except OSError:
            continue
        return st.st_uid, st.st_gid
    return None


def open_owned(path: str, flags: int) -> int:
    """Open (maybe creating) path; a file created by root gets its directory's owner."""
    existed = os.path.exists(path)
    owner = None if existed else owner_for(path)
    fd = os.open(path, flags | os.O_CLOEXEC, 0o644)
    if owner is not None:
        with contextlib.suppress(OSError):
            os.fchown(fd, *owner)
    return fd


def fsync_dir(directory: str) -> None:
    """fsync a directory so that a rename in it is durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_target(path: str) -> str:
    """The file a write to path replaces: path itself, or the end of its symlink chain.

    Operators symlink the active recipe or history; a rename over the link would turn it into a
    regular file while the watchdog keeps reading the target. The link stays, the target changes.
    """
    return os.path.realpath(path) if os.path.islink(path) else path


def _tmp_prefix(path: str) -> str:
    """Return the prefix of temporary files written beside path (the writer's pid in it)."""
    return "." + os.path.basename(path) + f".tmp.{os.getpid()}."


STALE_TMP_S = 600.0  # a staged file younger than this is never taken for a killed writer's


def _staged_by(path: str, name: str) -> int | None:
    """The writer's pid when name is one of atomic_write's staged files for path, else None.

    The shape is `.<file>.tmp.<pid>.<8 characters of mkstemp>`; anything else (an older
    spark-ops' `.<file>.tmp.<random>`, another program's temp file) is not ours.
    """
    m = re.match(
        re.escape("." + os.path.basename(path) + ".tmp.") + r"([0-9]{1,10})\.[a-z0-9_]{8}$", name
    )
    return int(m.group(1)) if m else None


def clean_stale_tmp(path: str) -> list[str]:
    """Remove the staged files killed writers left beside path; return what was removed.

    Call only while holding the history's locks. A file is removed only when it is provably a
    dead writer's own: atomic_write's name shape with a pid, a regular file owned by this user (or
    by the owner root gives its files here), its writer no longer running, and untouched for
    STALE_TMP_S (a writer in another pid namespace is not seen by the pid check). Every other
    file, a recent one above all, is another writer's: it is left alone.
    """
    target = write_target(path)
    directory = os.path.dirname(os.path.abspath(target))
    owners = {os.geteuid()}
    root_gives = owner_for(target)
    if root_gives is not None:
        owners.add(root_gives[0])
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    removed = []
    now = time.time()
    for name in names:
        pid = _staged_by(target, name)
        if pid is None or pid == os.getpid():
            continue
        full = os.path.join(directory, name)
        try:
            st = os.lstat(full)
        except OSError:
            continue
        if not stat.S_ISREG(st.st_mode) or st.st_uid not in owners:
            continue
        if now - st.st_mtime < STALE_TMP_S or process_exists(pid):
            continue
        with contextlib.suppress(OSError):
            os.unlink(full)
            removed.append(full)
    return removed


def atomic_write(path: str, data: bytes, *, mode: int | None = None) -> None:
    """Write data to path atomically: temp file in the same directory, fsync, rename, fsync dir.

    A symlink is written through: its target is replaced, the link itself is kept.
    """
    path = write_target(path)
    directory = os.path.dirname(os.path.abspath(path))
    if mode is None:
        try:
            mode = stat.S_IMODE(os.stat(path).st_mode)
        except FileNotFoundError:
            mode = 0o644
    owner = owner_for(path)
    try:
        fd, tmp = tempfile.mkstemp(prefix=_tmp_prefix(path), dir=directory)
    except OSError as exc:
        raise HeadFailure(f"cannot write beside {path}: {exc.strerror}", path=path) from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fchmod(f.fileno(), mode)
            if owner is not None:
                with contextlib.suppress(OSError):
                    os.fchown(f.fileno(), *owner)
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(exc, OSError):
            raise HeadFailure(f"cannot write {path}: {exc.strerror}", path=path) from None
        raise
    fsync_dir(directory)
