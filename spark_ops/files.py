"""Local files written the one way spark-ops writes files: atomically, with an optional backup.

The implementation is spark_ops/headlib's `atomic_write` and `write_backup` (temp file in the
same directory, write, fsync, rename, directory fsync; mode and owner kept; a symlink is written
through; backups named and rotated by the one rule the remote writer shares). It lives there
because it also runs on the head, in history.py's program; this module is how the rest of
spark-ops calls it, with errors of the caller's concern naming the file.
"""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

from spark_ops.errors import OutputError, SparkOpsError
from spark_ops.headlib.atomic import atomic_write
from spark_ops.headlib.backup import DEFAULT_KEEP_BACKUPS, write_backup
from spark_ops.headlib.errors import HeadFailure

__all__ = [
    "DEFAULT_KEEP_BACKUPS",
    "NotRegularFile",
    "read_regular",
    "remove_file",
    "sha256_of",
    "write_file",
]


class NotRegularFile(OSError):
    """The path names a FIFO, a device or a directory: nothing was read (and nothing waited on)."""


def read_regular(path: str | os.PathLike[str], *, limit: int, follow: bool = True) -> bytes:
    """Up to limit + 1 bytes of a regular file (a caller tells "too big" by the length), opened
    without blocking: a FIFO or a device is NotRegularFile, never waited on; with follow=False a
    symlink is refused too (ELOOP). Other failures are the OSError of the open."""
    flags = os.O_RDONLY | os.O_NONBLOCK | (0 if follow else os.O_NOFOLLOW)
    fd = os.open(path, flags)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # a directory too (fdopen would refuse it)
            raise NotRegularFile(f"{path}: not a regular file")
        f = os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
    with f:
        return f.read(limit + 1)


def write_file(
    path: str | os.PathLike[str],
    data: bytes | str,
    *,
    error: type[SparkOpsError] = OutputError,
    keep_backups: int = 0,
    expect_sha256: str | None = None,
    make_parents: bool = False,
) -> Path | None:
    """Replace path atomically with data; keep a backup when keep_backups > 0 (its path returned).

    expect_sha256: the digest of the content the caller read; if the file holds something else
    now (a colleague changed it meanwhile), nothing is written and `error` says so. Any failure
    raises `error` naming the file; nothing half-written is left behind.
    """
    target = Path(path)
    payload = data.encode("utf-8") if isinstance(data, str) else data
    try:
        if make_parents:
            target.parent.mkdir(parents=True, exist_ok=True)
        backup: str | None = None
        if expect_sha256 is not None or keep_backups > 0:
            try:
                old: bytes | None = target.read_bytes()
            except FileNotFoundError:
                old = None
            if expect_sha256 is not None and sha256_of(old) != expect_sha256:
                raise error(
                    f"{target}: changed since it was read; not written",
                    hint="run the command again to work on the current content",
                )
            if keep_backups > 0 and old is not None:
                backup = write_backup(str(target), old, keep_backups)
        atomic_write(str(target), payload)
    except OSError as exc:
        raise error(f"{target}: not written: {exc.strerror or exc}") from exc
    except HeadFailure as exc:
        raise error(f"{target}: not written: {exc.message}") from exc
    return Path(backup) if backup else None


def remove_file(
    path: str | os.PathLike[str],
    *,
    expect_sha256: str,
    limit: int,
    error: type[SparkOpsError] = OutputError,
) -> None:
    """Remove a regular file of spark-ops' own that still holds what the caller read.

    The file is read again without following a link (a symlink, a FIFO or a directory in its
    place is refused); if its digest is not `expect_sha256` (a colleague or a running command
    rewrote it meanwhile) nothing is removed. Then unlink and fsync the directory, so that the
    removal survives a crash. Any refusal or failure raises `error` naming the file.
    """
    target = Path(path)
    try:
        now = read_regular(target, limit=limit, follow=False)
    except FileNotFoundError:
        raise error(f"{target}: gone already; nothing removed") from None
    except OSError as exc:
        raise error(
            f"{target}: not a regular file of spark-ops' own ({exc.strerror or exc}); "
            "nothing removed"
        ) from exc
    if sha256_of(now) != expect_sha256:
        raise error(
            f"{target}: changed since it was read; nothing removed",
            hint="run the command again to see what it holds now",
        )
    try:
        target.unlink()
        fd = os.open(target.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as exc:
        raise error(f"{target}: not removed: {exc.strerror or exc}") from exc


def sha256_of(data: bytes | None) -> str:
    """The digest write_file's expect_sha256 compares with ('absent' for a file that is not)."""
    return "absent" if data is None else hashlib.sha256(data).hexdigest()
