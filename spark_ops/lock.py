"""The cluster lock: one operator at a time, held by a live SSH channel on the head.

The head runs `flock` on a lock file and keeps it for as long as our channel's stdin stays open.
When spark-ops exits, crashes or is SIGKILLed, the connection drops, the remote `cat` sees end of
input and the lock is released by the kernel: a stale lock cannot outlive its holder. Who holds it
is written beside it, so a second operator is told who, since when and doing what.
"""

from __future__ import annotations

import getpass
import hashlib
import json
import os
import socket
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from spark_ops.errors import LockError, RemoteError
from spark_ops.remote import ClusterSession, sh_program

# The cluster is keyed by itself, not by an inventory's name or an SSH user's home: by the real
# path of its recipe on the head (`readlink -f`, so ~a/r.yaml, /home/a/r.yaml and a symlink to it
# are one cluster). Lock and audit log live in the state dir, by default /var/tmp/spark-ops: made
# sticky and world-writable like /tmp, its files 0666, so every operator's account shares them.
KEY_SH = r"""
cluster_key() {  # key= 16 hex digits naming the cluster of recipe $1 on this head
  r=$(readlink -f -- "$1" 2>/dev/null) || r=
  [ -n "$r" ] || r=$1
  key=$(printf '%s' "$r" | sha256sum | cut -c1-16)
}
shared_dir() {  # create state dir $1 shareable by every account (mode 1777), if it is missing
  if [ ! -d "$1" ]; then
    (umask 0; mkdir -p -- "$1") && chmod 1777 -- "$1" 2>/dev/null || true
  fi
}
shared_file() { [ -e "$1" ] || (umask 0; : >> "$1") 2>/dev/null || true; }  # create 0666
# Write stdin over (or, with `append`, onto) an existing shared file without O_CREAT: with
# fs.protected_regular (Ubuntu's default) no account may O_CREAT-open another's file in a sticky
# directory, even one it may write; dd's nocreat opens it as a plain writer.
put() {
  if [ "${2:-}" = append ]; then dd of="$1" oflag=append conv=nocreat,notrunc status=none
  else dd of="$1" conv=nocreat status=none; fi
}
"""

_HOLD = (
    KEY_SH
    + r"""
state=$1; recipe=$2; info=$3
cluster_key "$recipe"; shared_dir "$state"
lock="$state/cluster-$key.lock"; owner="$lock.owner"
shared_file "$lock"; shared_file "$owner"
exec 9<"$lock" 2>/dev/null || { echo "ERROR cannot open the cluster lock $lock"; exit 73; }
if flock -n 9; then
  printf '%s\n' "$info" | put "$owner" 2>/dev/null || true
  echo "LOCKED $lock"
  cat >/dev/null
  : | put "$owner" 2>/dev/null || true
else
  echo "BUSY $lock"
  cat -- "$owner" 2>/dev/null
  echo '{}'
fi
"""
)

# "free LOCK" or "held LOCK" and the owner record: the lock's state, taking nothing (doctor)
PROBE = (
    KEY_SH
    + r"""
state=$1; recipe=$2
cluster_key "$recipe"
lock="$state/cluster-$key.lock"; owner="$lock.owner"
[ -e "$lock" ] || { echo "free $lock"; exit 0; }
command -v flock >/dev/null 2>&1 || { echo "free $lock"; exit 0; }
if ( exec 9<"$lock" && flock -n 9 ); then echo "free $lock"; exit 0; fi
echo "held $lock"; cat -- "$owner"
"""
)


def cluster_key(real_recipe_path: str) -> str:
    """The key the head computes for a recipe's real path (KEY_SH's cluster_key)."""
    return hashlib.sha256(real_recipe_path.encode("utf-8", "surrogateescape")).hexdigest()[:16]


def lock_paths(state_dir: str, key: str) -> tuple[str, str]:
    """The lock file and its owner file for a cluster key, under the head's state dir."""
    base = f"{state_dir.rstrip('/')}/cluster-{key}.lock"
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
    info = holder_info(operation)
    program = sh_program(_HOLD, cluster.state_dir, cluster.recipe.path, json.dumps(info))
    async with session.held(cluster.head.name, program, ready="LOCKED") as lines:
        if not lines or lines[0].startswith("ERROR"):
            raise RemoteError(
                cluster.head.name,
                (lines[0][6:] if lines else "the lock program ended without an answer")
                + f" (state_dir {cluster.state_dir})",
                hint="the state dir must be a directory every operator's SSH user can write "
                "(the default /var/tmp/spark-ops is made sticky, mode 1777)",
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
            raise LockError(
                f"cluster {cluster.name} is locked by {describe_holder(other)}"
                + (f" ({cluster.head.name}:{where})" if where else ""),
                hint="wait for that operation to end; the lock frees itself if its holder dies",
            )
        session.log.info(
            "lock taken", host=cluster.head.name, operation=operation, lock=lines[0][7:]
        )
        yield info


async def lock_state(session: ClusterSession) -> tuple[bool, dict[str, Any], str]:
    """Whether the cluster lock is held now, its holder's record and its file (takes nothing)."""
    cluster = session.cluster
    res = await session.run(
        cluster.head.name, sh_program(PROBE, cluster.state_dir, cluster.recipe.path), check=False
    )
    first, _, rest = res.stdout.partition("\n")
    state, _, path = first.strip().partition(" ")
    if state != "held":
        return False, {}, path
    try:
        holder = json.loads(rest.strip() or "{}")
    except ValueError:
        holder = {}
    return True, holder if isinstance(holder, dict) else {}, path
