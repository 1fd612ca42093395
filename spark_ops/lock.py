"""The cluster lock: one operator at a time per watchdog, held by a live SSH channel on the head.

The head runs `flock` on a lock file and keeps it for as long as our channel's stdin stays open.
When spark-ops exits, crashes or is SIGKILLed, the connection drops, the remote `cat` sees end of
input and the lock is released by the kernel: a stale lock cannot outlive its holder. Who holds it
is written beside it, so a second operator is told who, since when and doing what.

What the lock serializes is the watchdog: two runs restarting through one watchdog at the same
moment each take the other's restart for their own (issue 20 #8). So the lock is keyed by what
names that watchdog on the head, never by what an inventory happens to say:

- where: one fixed directory on the head, LOCK_DIR (/var/tmp/spark-ops), which only the
  operators may write: its owner, root and the group the operators share (made 2770 with the
  account's own group when missing; `doctor` prints the one-time set-up that shares it, and a
  directory or file any other account could write is refused: `UnsafeState`, issue 34). It is not
  the inventory's `state_dir`: two inventories with two state dirs still meet in LOCK_DIR. The
  directory lives on the head's own disk, so the head itself is part of the key.
- who holds it: the holder writes its owner record as a file of its own (0640, renamed over the
  last one), so the account named is that file's owner as the head's file system says, never
  the record's own text; the record adds the operator's machine, pid and operation.
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
from spark_ops.remote.programs.lock import HOLD, LOCK_PROBE, OPERATORS_GROUP

LOCK_DIR = SHARED_STATE_DIR  # the head-wide directory of cluster locks (never the state_dir)
KEY_PREFIX = "history:"  # what the key hashes: this prefix, then the history's real path


class UnsafeState(RemoteError):
    """A state directory or file on the head that an account outside the operators could write."""


def setup_commands(directory: str) -> str:
    """The one-time set-up that lets every operator's account, and no other, write `directory`."""
    return (
        f"sudo groupadd -f {OPERATORS_GROUP} && sudo usermod -aG {OPERATORS_GROUP} USER "
        f"(each operator's SSH user; log in again) && sudo install -d -m 2770 -g "
        f"{OPERATORS_GROUP} {directory}"
    )


def unsafe_error(host: str, line: str) -> UnsafeState | None:
    """The refusal an `UNSAFE dir|file PATH<TAB>why` line of a head program stands for, or None."""
    if not line.startswith("UNSAFE "):
        return None
    head, _, why = line[7:].partition("\t")
    kind, _, where = head.partition(" ")
    if kind == "dir":
        fix = (
            f"sudo chgrp -R {OPERATORS_GROUP} {where} && sudo chmod 2770 {where} && sudo chmod "
            f"o-w,g+rw {where}/cluster-* (the group once: {setup_commands(where)})"
        )
    else:
        fix = (
            f"sudo chgrp {OPERATORS_GROUP} {where} && sudo chmod 0660 {where}, or remove it "
            "if nobody's operation wrote it"
        )
    return UnsafeState(
        host,
        f"refusing the shared state {kind} {where}: it {why or 'is not the operators own'}; only"
        " the operators' accounts may write the cluster lock, its owner record and the audit log",
        hint=fix,
    )


def first_unsafe(host: str, text: str) -> UnsafeState | None:
    """The refusal among a head program's output lines, if any."""
    for line in text.splitlines():
        err = unsafe_error(host, line)
        if err is not None:
            return err
    return None


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
    """One line saying who holds the lock: the head's account (its file system's word), record."""
    account = info.get("account")
    acct = (
        f"account {account} on the head"
        if isinstance(account, str) and account not in ("", "?")
        else "an account the head could not name"
    )
    record = {k: v for k, v in info.items() if k != "account"}
    if not record:
        return f"{acct} (another spark-ops process: it left no owner record)"
    since = record.get("since")
    age = f", for {int(time.time() - since)} s" if isinstance(since, int | float) else ""
    return (
        f"{acct}: {record.get('user', '?')}@{record.get('host', '?')} (pid "
        f"{record.get('pid', '?')}, {record.get('operation', '?')}{age})"
    )


def parse_holder(lines: list[str]) -> dict[str, Any]:
    """The holder from a program's `ACCOUNT name` line and owner record (the account wins)."""
    account = "?"
    record: dict[str, Any] = {}
    for line in lines:
        if line.startswith("ACCOUNT "):
            account = line[8:].strip() or "?"
            continue
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            record = value
            break
    record.pop("account", None)  # never the record's own claim
    return {**record, "account": account}


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
        unsafe = first_unsafe(cluster.head.name, "\n".join(lines))
        if unsafe is not None:
            raise unsafe
        if not lines or lines[0].startswith("ERROR"):
            raise RemoteError(
                cluster.head.name,
                (lines[0][6:] if lines else "the lock program ended without an answer")
                + f" (lock dir {LOCK_DIR})",
                hint=f"{LOCK_DIR} must be a directory every operator's SSH user can write and no "
                f"other account can: {setup_commands(LOCK_DIR)}",
            )
        if not lines[0].startswith("LOCKED"):
            where = lines[0].partition(" ")[2] if lines else ""
            raise locked_error(cluster, parse_holder(lines[1:]), where)
        session.log.info(
            "lock taken", host=cluster.head.name, operation=operation, lock=lines[0][7:]
        )
        yield info


async def lock_state(session: ClusterSession) -> tuple[bool, dict[str, Any], str]:
    """Whether the cluster lock is held now, its holder's record and its file (takes nothing)."""
    cluster = session.cluster
    res = await session.call(cluster.head.name, LOCK_PROBE, *key_args(cluster))
    unsafe = first_unsafe(cluster.head.name, res.stdout)
    if unsafe is not None:
        raise unsafe
    first, _, rest = res.stdout.partition("\n")
    state, _, path = first.strip().partition(" ")
    if state != "held":
        return False, {}, path
    return True, parse_holder(rest.splitlines()), path


async def refuse_if_locked(session: ClusterSession) -> None:
    """Raise the LockError cluster_lock would, when someone holds the lock now (takes nothing).

    A run asks this before it plans and asks its question, so that nobody confirms a plan that
    cannot run; the lock itself is taken only after the answer.
    """
    held, holder, path = await lock_state(session)
    if held:
        raise locked_error(session.cluster, holder, path)
