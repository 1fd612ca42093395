"""A restart history's journal: one JSON line per change beside the history, append-only.

Each change to the history appends its lines (one O_APPEND write, fsynced, so another appender's
line never lands inside it); ``planned_stamps`` reads back the planned restarts whose stamps are
still to prune. Standard library only (spark_ops/headlib/__init__.py says why).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from typing import Any

from spark_ops.headlib.atomic import open_owned
from spark_ops.headlib.history_format import (
    DEFAULT_PLANNED_BY,
    HistoryFailure,
    Stamp,
    plain_number,
    read_bytes,
    split_lines,
)


def default_journal(history: str) -> str:
    """Return the default journal path for a history file."""
    return history + ".journal.jsonl"


def journal_line(
    *, stamp: Stamp, action: str, reason: str, forced: bool, by: str, **extra: Any
) -> bytes:
    """Build one journal line."""
    record = {
        "time": round(time.time(), 3),
        "stamp": stamp,
        "reason": reason,
        "forced": forced,
        "by": by,
        "action": action,
        **extra,
    }
    return json.dumps(record, sort_keys=False).encode() + b"\n"


def append_journal(journal: str, lines: Sequence[bytes]) -> None:
    """Append lines to the journal and fsync it (caller holds the history lock)."""
    if not lines:
        return
    try:
        fd = open_owned(journal, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        try:
            os.write(fd, b"".join(lines))
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as exc:
        raise HistoryFailure(
            f"cannot append to journal {journal}: {exc.strerror}", journal=journal
        ) from None


def read_journal(journal: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Read a journal: (records, malformed lines with line numbers); missing file is empty."""
    data, _ = read_bytes(journal)
    records: list[dict[str, Any]] = []
    malformed: list[dict[str, Any]] = []
    for i, raw in enumerate(split_lines(data), start=1):
        if not raw.strip():
            continue
        try:
            rec = json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            rec = None
        if isinstance(rec, dict):
            rec["_line"] = i
            records.append(rec)
        else:
            malformed.append({"line": i, "raw": raw.decode("utf-8", "replace")})
    return records, malformed


def is_planned(rec: dict[str, Any], planned_by: str) -> bool:
    """Tell whether a journal record is a planned restart (forced, by spark-ops, or marked)."""
    if rec.get("action", "restart") not in ("restart", "append"):
        return False
    if rec.get("planned") is True:
        return True
    by = rec.get("by")
    return rec.get("forced") is True and isinstance(by, str) and by.startswith(planned_by)


def planned_stamps(journal: str, planned_by: str = DEFAULT_PLANNED_BY) -> dict[Stamp, int]:
    """Return planned restart stamps from the journal, with how many are still to prune."""
    records, _ = read_journal(journal)
    counts: dict[Stamp, int] = {}
    for rec in records:
        ts = rec.get("stamp")
        if isinstance(ts, bool) or not isinstance(ts, (int, float)):
            continue
        ts = plain_number(ts)
        if is_planned(rec, planned_by):
            counts[ts] = counts.get(ts, 0) + 1
        elif rec.get("action") == "prune" and counts.get(ts, 0) > 0:
            counts[ts] -= 1
    return {k: v for k, v in counts.items() if v > 0}
