"""A restart history's format and its reading: parse, read, the budget of a sliding window.

Two formats: ``stamps`` (one Unix time per line, as a bash watchdog writes them) and ``jsonl``
(one JSON object per line with a numeric ``ts`` key). Lines that parse in neither are kept verbatim
and reported, never dropped. Standard library only (spark_ops/headlib/__init__.py says why):
history.py's program reads with it on the head, spark-ops and the reference watchdog where they
run.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Union

from spark_ops.headlib.errors import HeadFailure

EXIT_USAGE = 2

FORMATS = ("auto", "stamps", "jsonl")
# The budget a watchdog may state: at least one restart (a watchdog that must never restart is
# paused, not given a budget of 0), at most this many, in a window of at most 31 days; beyond
# that a window is no budget (and its times overflow a date).
MAX_RESTARTS = 1000
MAX_WINDOW_S = 31 * 86400
DEFAULT_PLANNED_BY = "spark-ops"

_STAMP_RE = re.compile(rb"^[ \t]*(\d{1,15})(\.\d{1,9})?[ \t\r]*$")

Stamp = Union[int, float]  # noqa: UP007 - runtime alias, valid on the nodes' Python 3.8+


HistoryFailure = HeadFailure  # a history operation failed (headlib's one failure)


class UsageFailure(HistoryFailure):
    """The command line or an argument value is not allowed."""

    exit_code = EXIT_USAGE
    kind = "usage"


@dataclass
class Entry:
    """One well-formed history line: its 1-based line number, stamp and JSON record (jsonl)."""

    line: int
    stamp: Stamp
    record: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        """Serialize for JSON output."""
        data: dict[str, Any] = {"line": self.line, "stamp": self.stamp}
        if self.record is not None:
            data["record"] = self.record
        return data


@dataclass
class History:
    """The parsed content of a history file; ``lines`` are the raw bytes of every line."""

    path: str
    format: str
    exists: bool
    lines: list[bytes] = field(default_factory=list)
    entries: list[Entry] = field(default_factory=list)
    malformed: list[dict[str, Any]] = field(default_factory=list)

    def stamps(self) -> list[Stamp]:
        """Return the stamps in file order."""
        return [e.stamp for e in self.entries]

    def to_dict(self) -> dict[str, Any]:
        """Serialize for the ``read`` subcommand."""
        return {
            "ok": True,
            "path": self.path,
            "exists": self.exists,
            "format": self.format,
            "count": len(self.entries),
            "entries": [
                {**e.to_dict(), "raw": self.lines[e.line - 1].decode("utf-8", "replace")}
                for e in self.entries
            ],
            "malformed": self.malformed,
        }


def plain_number(value: float) -> Stamp:
    """Return an int when the number is integral, else the float."""
    return int(value) if float(value).is_integer() else value


def parse_stamp(text: str) -> Stamp:
    """Parse a stamp given on the command line (a non-negative number of seconds)."""
    try:
        value = float(text)
    except (TypeError, ValueError):
        raise UsageFailure(
            f"stamp {text!r} is not a number; allowed: Unix seconds such as 1764470000"
        ) from None
    if not math.isfinite(value) or value < 0:
        raise UsageFailure(f"stamp {text!r} is not allowed: must be finite and >= 0")
    return plain_number(value)


def _parse_stamp_line(raw: bytes) -> Stamp | None:
    """Parse a line of the stamps format; None when it is not one."""
    m = _STAMP_RE.match(raw)
    if not m:
        return None
    if m.group(2):
        return plain_number(float(m.group(1) + m.group(2)))
    return int(m.group(1))


def _parse_json_line(raw: bytes) -> tuple[Stamp, dict[str, Any]] | None:
    """Parse a line of the jsonl format; None when it is not an object with a numeric ``ts``."""
    text = raw.strip()
    if not text.startswith(b"{"):
        return None
    try:
        record = json.loads(text)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    return _record_stamp(record)


def _record_stamp(record: Any) -> tuple[Stamp, dict[str, Any]] | None:
    """Return (stamp, record) when record is an object with a numeric ``ts``, else None."""
    if not isinstance(record, dict):
        return None
    ts = record.get("ts")
    if isinstance(ts, bool) or not isinstance(ts, (int, float)):
        return None
    if not math.isfinite(ts) or ts < 0:
        return None
    return plain_number(ts), record


def _batch_json(lines: Sequence[bytes]) -> list[Any] | None:
    """Decode all lines in one json.loads call (fast path); None when any line is not one object.

    Each element is aligned with its line (None for blank lines). The caller falls back to
    line-by-line parsing when this returns None, so malformed lines are still found one by one.
    """
    index = [i for i, raw in enumerate(lines) if raw.strip()]
    parts = [lines[i].strip() for i in index]
    if not all(p.startswith(b"{") and p.endswith(b"}") for p in parts):
        return None
    try:
        decoded = json.loads(b"[" + b",".join(parts) + b"]")
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    if len(decoded) != len(parts) or not all(isinstance(d, dict) for d in decoded):
        return None
    out: list[Any] = [None] * len(lines)
    for i, record in zip(index, decoded):  # noqa: B905 - lengths checked above; 3.8-compatible
        out[i] = record
    return out


def split_lines(data: bytes) -> list[bytes]:
    """Split file content into lines without their newline; a final newline ends the last line."""
    if not data:
        return []
    lines = data.split(b"\n")
    if lines[-1] == b"":
        lines.pop()
    return lines


def _detect(lines: Sequence[bytes]) -> str:
    """Pick the format from the first line that parses in either; stamps when none does."""
    for raw in lines:
        if not raw.strip():
            continue
        if _parse_stamp_line(raw) is not None:
            return "stamps"
        if _parse_json_line(raw) is not None:
            return "jsonl"
    return "stamps"


def check_format(fmt: str) -> None:
    """Reject a format name outside FORMATS."""
    if fmt not in FORMATS:
        raise UsageFailure(f"format {fmt!r} is not allowed; allowed: {', '.join(FORMATS)}")


def parse_history(
    data: bytes, *, path: str = "", fmt: str = "auto", exists: bool = True
) -> History:
    """Parse history content; malformed lines are reported with their line numbers."""
    check_format(fmt)
    lines = split_lines(data)
    used = _detect(lines) if fmt == "auto" else fmt
    hist = History(path=path, format=used, exists=exists, lines=lines)
    records = _batch_json(lines) if used == "jsonl" else None
    for i, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue  # blank lines are kept as they are, and are not an error
        if used == "stamps":
            stamp = _parse_stamp_line(raw)
            if stamp is not None:
                hist.entries.append(Entry(i, stamp))
                continue
        else:
            parsed = _record_stamp(records[i - 1]) if records else _parse_json_line(raw)
            if parsed is not None:
                hist.entries.append(Entry(i, parsed[0], parsed[1]))
                continue
        hist.malformed.append({"line": i, "raw": raw.decode("utf-8", "replace")})
    return hist


def read_history(path: str, fmt: str = "auto") -> History:
    """Read and parse a history file; a missing file is an empty history."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return parse_history(b"", path=path, fmt=fmt, exists=False)
    except OSError as exc:
        raise HistoryFailure(f"cannot read history {path}: {exc.strerror}", path=path) from None
    return parse_history(data, path=path, fmt=fmt)


def read_bytes(path: str) -> tuple[bytes, bool]:
    """Read a file's bytes; (b'', False) when it does not exist."""
    try:
        with open(path, "rb") as f:
            return f.read(), True
    except FileNotFoundError:
        return b"", False
    except OSError as exc:
        raise HistoryFailure(f"cannot read history {path}: {exc.strerror}", path=path) from None


def budget_of(
    stamps: Sequence[Stamp], *, allowed: int, window: float, now: float
) -> dict[str, Any]:
    """Compute the sliding-window budget: stamps newer than now - window count as used."""
    inside = sorted(s for s in stamps if s > now - window)
    used = len(inside)
    if used < allowed:
        next_free: float = now
    else:
        next_free = inside[used - allowed] + window
    return {
        "used": used,
        "allowed": allowed,
        "remaining": max(0, allowed - used),
        "over_budget": used >= allowed,
        "window": plain_number(window),
        "now": plain_number(now),
        "stamps": inside,
        "next_free_at": plain_number(next_free),
    }


def budget(
    path: str,
    *,
    allowed: int = 2,
    window: float = 21600,
    now: float | None = None,
    fmt: str = "auto",
) -> dict[str, Any]:
    """Read the history and compute the budget at ``now`` (this node's clock by default)."""
    if allowed < 0 or window <= 0:
        raise UsageFailure(f"budget --max {allowed} / --window {window}: need max >= 0, window > 0")
    hist = read_history(path, fmt)
    result = budget_of(
        hist.stamps(), allowed=allowed, window=window, now=time.time() if now is None else now
    )
    return {
        "ok": True,
        "path": path,
        "exists": hist.exists,
        "format": hist.format,
        **result,
        "malformed": hist.malformed,
        "flagged": flagged_lines(hist),
    }


_PLAIN_STAMP_RE = re.compile(rb"^\d{1,15}(\.\d{1,9})?$")


def flagged_lines(hist: History) -> list[dict[str, Any]]:
    """Stamps counted here that a watchdog may not count: spaces around the number or a CR.

    A bash watchdog reading the file with `read` drops spaces and tabs but keeps a CR, which
    `[ "$ts" -gt … ]` rejects and awk compares as text: such a line is flagged, not trusted to be
    counted alike by both.
    """
    if hist.format != "stamps":
        return []
    out = []
    for e in hist.entries:
        raw = hist.lines[e.line - 1]
        if not _PLAIN_STAMP_RE.match(raw):
            why = "a carriage return" if b"\r" in raw else "spaces around the number"
            out.append({"line": e.line, "raw": raw.decode("utf-8", "replace"), "why": why})
    return out
