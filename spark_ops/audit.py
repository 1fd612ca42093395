"""The audit log: one JSON line per operation, kept on the head so every operator sees the same
history.

The file is `<state_dir>/cluster-<key>.audit.jsonl` on the head, keyed like the cluster lock by
the watchdog it drives (the real path of its restart history there: spark_ops/lock.py), not by an
inventory's name or recipe path: two inventories driving one watchdog read and write one audit
when they share the state dir (by default /var/tmp/spark-ops, which only the operators' accounts
may write: spark_ops/lock.py; the lock itself is always there, whatever the state dir). Each entry
is appended as one line by a single `>>` write under `flock` on its `.lock`, with the time taken
from the head's clock, so entries from several operators' machines never interleave and are
ordered by one clock.

Each line begins `{"when": T, "account": NAME, "uid": N, ...`: the head program writes the account
it runs as (the system's word), and the entry's own text cannot set it (a second "account" or
"uid" key makes the line unattributed). A line read back without that beginning, or with a key
twice, is `unattributed`: `log` marks it and the journal never settles from it (issue 34).
"""

from __future__ import annotations

import json
import socket
from collections.abc import Sequence
from typing import Any

from spark_ops.account import local_account
from spark_ops.errors import RemoteError
from spark_ops.inventory import Cluster
from spark_ops.lock import first_unsafe
from spark_ops.remote import ClusterSession
from spark_ops.remote.programs.lock import AUDIT_APPEND, AUDIT_READ

ATTRIBUTION = ("when", "account", "uid")  # the keys the head's program writes first, in order
MAX_LINE = 1 << 20  # a longer line is not one spark-ops wrote: shown cut, unattributed


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
    for key in ATTRIBUTION:  # the head writes these, never the entry
        data.pop(key, None)
    data.setdefault("who", who())
    # ASCII JSON: any value (a lone surrogate from an undecodable argv byte, a NUL) is escaped,
    # so an entry can always be sent and appended whole
    line = json.dumps(data, default=str, ensure_ascii=True, separators=(", ", ": "))
    cluster = session.cluster
    history = cluster.watchdog.history_file
    res = await session.call(
        cluster.head.name, AUDIT_APPEND, cluster.state_dir, history, input=line + "\n",
        label="audit",
    )  # fmt: skip
    unsafe = first_unsafe(cluster.head.name, res.stdout)
    if unsafe is not None:
        raise unsafe
    res.check()


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
    unsafe = first_unsafe(cluster.head.name, body)
    if unsafe is not None:
        raise unsafe
    if not res.ok:
        raise RemoteError(
            cluster.head.name,
            f"cannot read the audit log {path} (exit {res.exit_code}): {res.stderr.strip()[-300:]}",
            hint="check state_dir in the inventory and that the SSH user can read it",
        )
    return parse_lines(body)


def parse_lines(body: str) -> list[dict[str, Any]]:
    """The audit file's lines as entries: {"malformed": line} for what is not one JSON object, and
    `"unattributed": True` on an entry whose account the head's program did not write."""
    out: list[dict[str, Any]] = []
    for raw in body.splitlines():
        if not raw.strip():
            continue
        if len(raw) > MAX_LINE:
            out.append({"malformed": raw[:200]})
            continue
        try:
            value = json.loads(raw, object_pairs_hook=_Object, parse_constant=_no_constant)
        except (ValueError, RecursionError):
            out.append({"malformed": raw})
            continue
        out.append(attributed(value) if isinstance(value, _Object) else {"malformed": raw})
    return out


def _no_constant(_name: str) -> None:
    """NaN and ±Infinity (JSON has none; a hand-edited line may) read as null: every reader and
    every --json output gets numbers or null, never a value strict JSON cannot hold."""
    return None


class _Object(dict[str, Any]):
    """A JSON object that remembers whether a key came twice."""

    def __init__(self, pairs: list[tuple[str, Any]]) -> None:
        """Keep the first position and the last value of each key, as json does."""
        super().__init__(pairs)
        self.twice = len(self) != len(pairs)


def attributed(value: _Object) -> dict[str, Any]:
    """One entry, marked unattributed unless the head's program wrote its account."""
    entry = dict(value)
    account, uid = entry.get("account"), entry.get("uid")
    if (
        value.twice
        or list(entry)[: len(ATTRIBUTION)] != list(ATTRIBUTION)
        or not isinstance(account, str)
        or not account
        or isinstance(uid, bool)
        or not isinstance(uid, int)
    ):
        entry["unattributed"] = True
    return entry


def is_attributed(entry: dict[str, Any]) -> bool:
    """Whether the head's program wrote this entry's account (settle acts only on these)."""
    return "malformed" not in entry and not entry.get("unattributed")


async def read_log(cluster: Cluster, limit: int = 20) -> list[dict[str, Any]]:
    """Connect to the head only and read the last `limit` entries (`spark-ops log`)."""
    async with ClusterSession(cluster) as session:
        await session.connect([cluster.head.name])
        return await read(session, limit)
