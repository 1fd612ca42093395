"""The audit log as operations: one entry per operation, its steps inside (`spark-ops log`).

The head's audit file holds a run as several lines (its intent, its step records, its end), and
older or one-line operations as one line each. `log -n N` asks for N operations, not N lines: the
tail is read, grown until it holds more than N operations (the oldest of a window may be cut), or
the whole file was read.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from spark_ops import audit
from spark_ops.inventory import Cluster
from spark_ops.remote import ClusterSession
from spark_ops.workflows.journal import END, INTENT, STEP, runs_of

FIRST_READ = 16  # raw lines read per operation asked for, at first (a run writes about ten)
MAX_LINES = 200_000  # the most raw lines one `log` reads back


def operations_of(entries: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Group raw audit entries into operations, oldest first, each with its `steps` inside.

    A run shows as its end (outcome, nodes, diff) over its intent (who, what, command), with
    `started` (its intent's time), `steps` and, when it never ended, `unfinished` and
    `last_step`. A line without a run id is an operation of its own; an unreadable line stays
    `{"malformed": line}`.
    """
    runs = {r.run: r for r in runs_of(entries)}
    order: list[str | int] = []
    ops: dict[str | int, dict[str, Any]] = {}
    for i, e in enumerate(entries):
        rid = e.get("run")
        if (
            e.get("unattributed")  # a line the head's program did not write joins no run
            or not isinstance(rid, str)
            or e.get("phase") not in (INTENT, STEP, END)
        ):
            order.append(i)
            ops[i] = dict(e) if "malformed" in e else {**e, "steps": []}
            continue
        if rid not in ops:
            order.append(rid)
            ops[rid] = {"run": rid, "steps": []}
        op = ops[rid]
        phase = e.get("phase")
        if phase == STEP:
            _add_steps(op["steps"], e.get("steps"))
            continue
        op.update({k: v for k, v in e.items() if k not in ("phase", "steps")})
        if phase == INTENT:
            op["started"] = e.get("when")
    for rid, run in runs.items():
        found = ops.get(rid)
        if found is not None and run.end is None:
            found["unfinished"] = run.unfinished
            found["last_step"] = run.last_step
            if run.settled_by:
                found["settled_by"] = run.settled_by
    return [ops[k] for k in order]


def _add_steps(steps: list[dict[str, Any]], records: Any) -> None:
    """Fold step records into an operation's steps: one per step, its latest record over the
    earlier ones (running, then triggered, then done), in the order the steps began."""
    for rec in records if isinstance(records, list) else []:
        if not isinstance(rec, dict):
            continue
        same = next((s for s in steps if s.get("step") == rec.get("step")), None)
        if same is None:
            steps.append(dict(rec))
        else:
            same.update(rec)


async def read_operations(session: ClusterSession, limit: int) -> list[dict[str, Any]]:
    """The last `limit` operations of the head's audit log, oldest first."""
    want = max(limit * FIRST_READ, 64)
    while True:
        entries = await audit.read(session, want)
        ops = operations_of(entries)
        if len(ops) > limit or len(entries) < want or want >= MAX_LINES:
            return ops[-limit:]
        want = min(want * 4, MAX_LINES)


async def read_log_operations(cluster: Cluster, limit: int) -> list[dict[str, Any]]:
    """Connect to the head only and read the last `limit` operations (`spark-ops log`)."""
    async with ClusterSession(cluster) as session:
        await session.connect([cluster.head.name])
        return await read_operations(session, limit)


def _says(value: object) -> bool:
    """An argument that was given: not None, False, nor an empty list, text or mapping."""
    return value is not None and value is not False and value not in ([], "", {})


def args_text(what: object) -> str:
    """An operation's arguments that say something as `key=value` words, raw (each renderer
    escapes it for its reader); a nested value (--prove's) as compact JSON, as the audit holds it,
    never Python's repr. `what` is an audit line's `what` (anything: the file is hand-editable)."""
    raw = what.get("args") if isinstance(what, dict) else None
    args: dict[str, Any] = raw if isinstance(raw, dict) else {}
    words = []
    for key, value in args.items():
        if not _says(value):
            continue
        if isinstance(value, dict | list):
            try:
                value = json.dumps(value, separators=(",", ":"), default=str)
            except RecursionError:  # a hand-written line nested as deep as the reader parses
                value = "(nested too deep to show)"
        words.append(f"{key}={value}")
    return " ".join(words)
