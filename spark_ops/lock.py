"""The cluster lock: one operator at a time per watchdog, held by a live SSH channel on the head.

The head runs `flock` on a lock file and keeps it for as long as our channel's stdin stays open.
When spark-ops exits, crashes or is SIGKILLed, the connection drops, the remote `cat` sees end of
input and the lock is released by the kernel: a stale lock cannot outlive its holder. Who holds it
is written beside it, so a second operator is told who, since when and doing what.

What the lock serializes is the watchdog: two runs restarting through one watchdog at the same
moment each take the other's restart for their own (issue 20 #8). So the lock is keyed by what
names that watchdog on the head, never by what an inventory happens to say:

- where: one fixed directory on the head, LOCK_DIR (/var/tmp/spark-ops, made sticky and
  world-writable like /tmp, its files 0666, so every operator's account shares it). It is not the
  inventory's `state_dir`: two inventories with two state dirs still meet in LOCK_DIR. The
  directory lives on the head's own disk, so the head itself is part of the key.
- which file: `cluster-<key>.lock`, key = the first 16 hex digits of sha256("history:" + the real
  path of the watchdog's restart history on the head) — `readlink -f`, so `~/h`, `/home/a/h` and a
  symlink to it are one watchdog; when the path cannot be resolved (a directory the SSH user may
  not search), the path as the shell expanded it. The history is the watchdog's identity: every
  watchdog the stamp contract knows keeps exactly one, and two watchdogs sharing one history would
  be one budget. The recipe path, the inventory's cluster name, the restart command's text (one
  watchdog is often driven by two spellings of it) and the state dir take no part.

The audit log (spark_ops/audit.py) uses the same key, so two inventories driving one watchdog see
one audit (its file stays in each inventory's `state_dir`, by default LOCK_DIR as well).
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from spark_ops.account import local_account
from spark_ops.errors import LockError, RemoteError
from spark_ops.inventory import SHARED_STATE_DIR, Cluster
from spark_ops.remote import ClusterSession
from spark_ops.remote.programs.lock import HOLD, LOCK_PROBE

LOCK_DIR = SHARED_STATE_DIR  # the head-wide directory of cluster locks (never the state_dir)
KEY_PREFIX = "history:"  # what the key hashes: this prefix, then the history's real path


def cluster_key(real_history_path: str) -> str:
    """The key the head computes for a restart history's real path (KEY_SH's cluster_key)."""
    data = (KEY_PREFIX + real_history_path).encode("utf-8", "surrogateescape")
    return hashlib.sha256(data).hexdigest()[:16]


def lock_paths(key: str, lock_dir: str = LOCK_DIR) -> tuple[str, str]:
    """The lock file and its owner file for a cluster key, in the head-wide lock dir."""
    base = f"{lock_dir.rstrip('/')}/cluster-{key}.lock"
    return base, base + ".owner"


def key_args(cluster: Cluster) -> tuple[str, str]:
    """The arguments of the lock programs (HOLD, PROBE): the lock dir and the watchdog's history."""
    return LOCK_DIR, cluster.watchdog.history_file


def holder_info(operation: str) -> dict[str, Any]:
    """Describe this process as a lock holder."""
    return {
        "user": local_account(),
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


def locked_error(cluster: Cluster, holder: dict[str, Any], where: str) -> LockError:
    """The refusal while someone else holds the cluster lock: who, since when, doing what."""
    return LockError(
        f"cluster {cluster.name} is locked by {describe_holder(holder)}"
        + (f" ({cluster.head.name}:{where})" if where else ""),
        hint="wait for that operation to end; the lock frees itself if its holder dies "
        f"(it is the lock of the watchdog whose history is {cluster.watchdog.history_file}:"
        " every inventory driving that watchdog shares it)",
    )


@asynccontextmanager
async def cluster_lock(session: ClusterSession, operation: str) -> AsyncIterator[dict[str, Any]]:
    """Hold the cluster lock on the head for the duration of the block, or raise LockError."""
    cluster = session.cluster
    info = holder_info(operation)
    program = HOLD.line(*key_args(cluster), json.dumps(info))
    async with session.held(cluster.head.name, program, ready="LOCKED") as lines:
        if not lines or lines[0].startswith("ERROR"):
            raise RemoteError(
                cluster.head.name,
                (lines[0][6:] if lines else "the lock program ended without an answer")
                + f" (lock dir {LOCK_DIR})",
                hint=f"{LOCK_DIR} must be a directory every operator's SSH user can write "
                "(spark-ops makes it sticky, mode 1777, when it creates it)",
            )
        if not lines[0].startswith("LOCKED"):
            other: dict[str, Any] = {}
            for line in lines[1:]:
                try:
                    other = json.loads(line)
                    break
                except ValueError:
                    continue
            where = lines[0].partition(" ")[2] if lines else ""
            raise locked_error(cluster, other, where)
        session.log.info(
            "lock taken", host=cluster.head.name, operation=operation, lock=lines[0][7:]
        )
        yield info


async def lock_state(session: ClusterSession) -> tuple[bool, dict[str, Any], str]:
    """Whether the cluster lock is held now, its holder's record and its file (takes nothing)."""
    cluster = session.cluster
    res = await session.call(cluster.head.name, LOCK_PROBE, *key_args(cluster))
    first, _, rest = res.stdout.partition("\n")
    state, _, path = first.strip().partition(" ")
    if state != "held":
        return False, {}, path
    try:
        holder = json.loads(rest.strip() or "{}")
    except ValueError:
        holder = {}
    return True, holder if isinstance(holder, dict) else {}, path


async def refuse_if_locked(session: ClusterSession) -> None:
    """Raise the LockError cluster_lock would, when someone holds the lock now (takes nothing).

    A run asks this before it plans and asks its question, so that nobody confirms a plan that
    cannot run; the lock itself is taken only after the answer.
    """
    held, holder, path = await lock_state(session)
    if held:
        raise locked_error(session.cluster, holder, path)
