"""The audit log: one JSON line per operation, kept on the head so every operator sees the same
history.

The file is `<state_dir>/cluster-<key>.audit.jsonl` on the head, keyed like the cluster lock by
the watchdog it drives (the real path of its restart history there: spark_ops/lock.py), not by an
inventory's name or recipe path: two inventories driving one watchdog read and write one audit
when they share the state dir (by default /var/tmp/spark-ops, shared by every account; the lock
itself is always there, whatever the state dir). Each entry is appended as one line by a single
`>>` write under `flock` on its `.lock`, with the time taken from the head's clock, so entries from
several operators' machines never interleave and are ordered by one clock.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Sequence
from typing import Any

from spark_ops.account import local_account
from spark_ops.errors import RemoteError
from spark_ops.inventory import Cluster
from spark_ops.remote import ClusterSession
from spark_ops.remote.programs.lock import AUDIT_APPEND, AUDIT_READ


def who() -> str:
    """The operator as user@host of the machine spark-ops runs on."""
    return f"{local_account()}@{socket.gethostname()}"


def make_entry(
    operation: str,
    *,
    args: dict[str, Any] | None = None,
    nodes: Sequence[str] = (),
    diff: str = "",
    outcome: str = "",
    detail: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Build an audit entry (the head adds "when" as it writes it)."""
    entry: dict[str, Any] = {
        "who": who(),
        "what": {"operation": operation, "args": dict(args or {})},
        "nodes": list(nodes),
        "diff": diff,
        "outcome": outcome,
    }
    if detail:
        entry["detail"] = detail
    return entry


async def record(session: ClusterSession, entry: dict[str, Any]) -> None:
    """Append one entry as one JSON line to the head's audit file, under its lock, at head time."""
    data = dict(entry)
    data.pop("when", None)
    data.setdefault("who", who())
    # ASCII JSON: any value (a lone surrogate from an undecodable argv byte, a NUL) is escaped,
    # so an entry can always be sent and appended whole
    line = json.dumps(data, default=str, ensure_ascii=True, separators=(", ", ": "))
    cluster = session.cluster
    history = cluster.watchdog.history_file
    await session.call(
        cluster.head.name, AUDIT_APPEND, cluster.state_dir, history, input=line + "\n",
        label="audit",
    )  # fmt: skip


async def read(session: ClusterSession, limit: int = 20) -> list[dict[str, Any]]:
    """The last `limit` entries, oldest first; a non-JSON line comes back as {"malformed": line}."""
    if limit < 1:
        raise ValueError(f"limit must be >= 1, got {limit}")
    cluster = session.cluster
    history = cluster.watchdog.history_file
    res = await session.call(cluster.head.name, AUDIT_READ, cluster.state_dir, history, limit)
    path, _, body = res.stdout.partition("\n")
    if res.exit_code == 44:
        return []
    if not res.ok:
        raise RemoteError(
            cluster.head.name,
            f"cannot read the audit log {path} (exit {res.exit_code}): {res.stderr.strip()[-300:]}",
            hint="check state_dir in the inventory and that the SSH user can read it",
        )
    out: list[dict[str, Any]] = []
    for raw in body.splitlines():
        if not raw.strip():
            continue
        try:
            value = json.loads(raw)
        except ValueError:
            out.append({"malformed": raw})
            continue
        out.append(value if isinstance(value, dict) else {"malformed": raw})
    return out


async def read_log(cluster: Cluster, limit: int = 20) -> list[dict[str, Any]]:
    """Connect to the head only and read the last `limit` entries (`spark-ops log`)."""
    async with ClusterSession(cluster) as session:
        await session.connect([cluster.head.name])
        return await read(session, limit)
