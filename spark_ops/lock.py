"""The cluster lock: one operator at a time, held by a live SSH channel on the head.

The head runs `flock` on a lock file and keeps it for as long as our channel's stdin stays open.
When spark-ops exits, crashes or is SIGKILLed, the connection drops, the remote `cat` sees end of
input and the lock is released by the kernel: a stale lock cannot outlive its holder. Who holds it
is written beside it, so a second operator is told who, since when and doing what.
"""

from __future__ import annotations

import getpass
import json
import os
import shlex
import socket
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from spark_ops.errors import LockError
from spark_ops.remote import ClusterSession, quote_path

_HOLD = r"""
lock=$1; owner=$2; info=$3
mkdir -p -- "$(dirname -- "$lock")"
exec 9>>"$lock"
if flock -n 9; then
  printf '%s\n' "$info" > "$owner.part" && mv -f -- "$owner.part" "$owner"
  echo LOCKED
  cat >/dev/null
  rm -f -- "$owner"
else
  echo BUSY
  cat -- "$owner" 2>/dev/null || echo '{}'
fi
"""


def lock_paths(state_dir: str, cluster: str) -> tuple[str, str]:
    """The lock file and its owner file on the head."""
    base = f"{state_dir.rstrip('/')}/{cluster}.lock"
    return base, base + ".owner"


def local_user() -> str:
    """The operator's user name on the machine spark-ops runs on."""
    try:
        return getpass.getuser()
    except Exception:
        return os.environ.get("USER", "unknown")


def holder_info(operation: str) -> dict[str, Any]:
    """Describe this process as a lock holder."""
    return {
        "user": local_user(),
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "operation": operation,
        "since": int(time.time()),
    }


def describe_holder(info: dict[str, Any]) -> str:
    """One line saying who holds the lock."""
    if not info:
        return "another spark-ops process (it left no owner record)"
    since = info.get("since")
    age = f", for {int(time.time() - since)} s" if isinstance(since, int | float) else ""
    return (
        f"{info.get('user', '?')}@{info.get('host', '?')} (pid {info.get('pid', '?')}, "
        f"{info.get('operation', '?')}{age})"
    )


@asynccontextmanager
async def cluster_lock(session: ClusterSession, operation: str) -> AsyncIterator[dict[str, Any]]:
    """Hold the cluster lock on the head for the duration of the block, or raise LockError."""
    cluster = session.cluster
    lock, owner = lock_paths(cluster.state_dir, cluster.name)
    info = holder_info(operation)
    program = (
        f"sh -c {shlex.quote(_HOLD)} sh {quote_path(lock)} {quote_path(owner)} "
        f"{shlex.quote(json.dumps(info))}"
    )
    async with session.held(cluster.head.name, program, ready="LOCKED") as lines:
        if not lines or lines[0] != "LOCKED":
            other: dict[str, Any] = {}
            for line in lines[1:]:
                try:
                    other = json.loads(line)
                    break
                except ValueError:
                    continue
            raise LockError(
                f"cluster {cluster.name} is locked by {describe_holder(other)}",
                hint="wait for that operation to end; the lock frees itself if its holder dies",
            )
        session.log.info("lock taken", host=cluster.head.name, operation=operation)
        yield info
