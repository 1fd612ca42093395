"""A watchdog's restart history: read, budget, append and prune, under a lock, written atomically.

Standard library only, with spark_ops.headlib (atomic writer, backup rule, flock): spark-ops runs
this file on a node where it is not installed by sending it with headlib's modules as one program
(``headlib.head_program``) to ``python3 - SUBCOMMAND ARGS``. Each subcommand prints one JSON
object on stdout.

Two formats: ``stamps`` (one Unix time per line, as a bash watchdog writes them) and ``jsonl``
(one JSON object per line with a numeric ``ts`` key). Lines that parse in neither are kept verbatim
and reported, never dropped. Exit codes: 0 ok, 2 usage, 3 lock timeout, 4 unreadable / IO error,
5 a stamp asked for with ``--strict`` is absent (nothing changed).

Other writers (issue 20 #7, #9): every change holds the locks of ``history_locks`` — with the
default lock, ``<name>.lock`` beside each name of the history's symlink chain, so a watchdog that
locks beside the link or beside the target is excluded alike; a lock timeout names the processes
that have the lock file open (headlib's ``lock_holders``). Only staged files that are provably a
dead writer's own are ever removed (headlib's ``clean_stale_tmp``). ``note`` records a planned
stamp even when the lock stays held (one O_APPEND line to the append-only journal).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import socket
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn, Union

from spark_ops.headlib.atomic import atomic_write, clean_stale_tmp, open_owned
from spark_ops.headlib.backup import DEFAULT_KEEP_BACKUPS, write_backup
from spark_ops.headlib.errors import HeadFailure, LockTimeout
from spark_ops.headlib.flock import DEFAULT_LOCK_TIMEOUT, lock_timeout_error, locked
from spark_ops.headlib.proc import exit_on_hangup, signals_held

EXIT_OK = 0
EXIT_USAGE = 2
EXIT_NOT_FOUND = 5  # 3 (lock timeout) and 4 (IO) are headlib.errors'

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


class StampNotFound(HistoryFailure):
    """With --strict, a stamp asked for is not in the history; nothing was changed."""

    exit_code = EXIT_NOT_FOUND
    kind = "not_found"


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


def _num(value: float) -> Stamp:
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
    return _num(value)


def _parse_stamp_line(raw: bytes) -> Stamp | None:
    """Parse a line of the stamps format; None when it is not one."""
    m = _STAMP_RE.match(raw)
    if not m:
        return None
    if m.group(2):
        return _num(float(m.group(1) + m.group(2)))
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
    return _num(ts), record


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


def _split_lines(data: bytes) -> list[bytes]:
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


def _check_format(fmt: str) -> None:
    """Reject a format name outside FORMATS."""
    if fmt not in FORMATS:
        raise UsageFailure(f"format {fmt!r} is not allowed; allowed: {', '.join(FORMATS)}")


def parse_history(
    data: bytes, *, path: str = "", fmt: str = "auto", exists: bool = True
) -> History:
    """Parse history content; malformed lines are reported with their line numbers."""
    _check_format(fmt)
    lines = _split_lines(data)
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


def default_lock(history: str) -> str:
    """Return the default lock path for a history file."""
    return history + ".lock"


def default_journal(history: str) -> str:
    """Return the default journal path for a history file."""
    return history + ".journal.jsonl"


def link_chain(path: str, limit: int = 40) -> list[str]:
    """The names a path reaches its file by: path, then each symlink's target in turn."""
    names = [path]
    current = path
    for _ in range(limit):
        try:
            target = os.readlink(current)
        except OSError:
            break  # not a link, or missing: the end of the chain
        current = os.path.join(os.path.dirname(current), target)
        names.append(current)
    return names


def history_locks(path: str, lock: str | None = None) -> list[str]:
    """The lock files a change to the history at path takes, in the order it takes them.

    A watchdog locks `<history>.lock` by the name it was given for the history. Reached through a
    symlink, one history has several names, and a writer locking beside the link and one locking
    beside the target would exclude nobody (issue 20 #7: appends lost during a prune). So the
    default lock is taken beside every name of the chain (the path, each link on the way, the
    file it ends at), each file once (by real path), in the order of their real paths: one global
    order, so two writers naming the chain differently never deadlock. A lock named explicitly
    (the inventory's `lock_file`, the watchdog's own) is exactly that one file.
    """
    if lock and lock != default_lock(path):
        return [lock]
    by_real: dict[str, str] = {}
    for name in link_chain(path):
        candidate = default_lock(name)
        by_real.setdefault(os.path.realpath(candidate), candidate)
    return [by_real[real] for real in sorted(by_real)]


@contextlib.contextmanager
def history_locked(
    path: str, lock: str | None = None, timeout: float = DEFAULT_LOCK_TIMEOUT
) -> Iterator[list[str]]:
    """Hold every lock of history_locks(path, lock), within one timeout in all; yield them."""
    locks = history_locks(path, lock)
    give_up = time.monotonic() + timeout
    with contextlib.ExitStack() as stack:
        for one in locks:
            left = max(0.0, give_up - time.monotonic()) if timeout > 0 else 0.0
            try:
                stack.enter_context(locked(one, left))
            except LockTimeout as exc:  # the whole wait is shown, not what was left of it
                raise lock_timeout_error(one, timeout, exc.details.get("holders")) from None
        yield locks


def _join(lines: Sequence[bytes]) -> bytes:
    """Join lines into file content, each ended by a newline."""
    return b"".join(line + b"\n" for line in lines)


def _read_bytes(path: str) -> tuple[bytes, bool]:
    """Read a file's bytes; (b'', False) when it does not exist."""
    try:
        with open(path, "rb") as f:
            return f.read(), True
    except FileNotFoundError:
        return b"", False
    except OSError as exc:
        raise HistoryFailure(f"cannot read history {path}: {exc.strerror}", path=path) from None


def _journal_line(
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


def _append_journal(journal: str, lines: Sequence[bytes]) -> None:
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
    data, _ = _read_bytes(journal)
    records: list[dict[str, Any]] = []
    malformed: list[dict[str, Any]] = []
    for i, raw in enumerate(_split_lines(data), start=1):
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


def _is_planned(rec: dict[str, Any], planned_by: str) -> bool:
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
        ts = _num(ts)
        if _is_planned(rec, planned_by):
            counts[ts] = counts.get(ts, 0) + 1
        elif rec.get("action") == "prune" and counts.get(ts, 0) > 0:
            counts[ts] -= 1
    return {k: v for k, v in counts.items() if v > 0}


def clock() -> dict[str, Any]:
    """Return this node's wall clock and host name."""
    return {"ok": True, "time": time.time(), "host": socket.gethostname()}


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
        "window": _num(window),
        "now": _num(now),
        "stamps": inside,
        "next_free_at": _num(next_free),
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


def append(
    path: str,
    *,
    stamp: Stamp | None = None,
    reason: str = "",
    by: str = "",
    forced: bool = False,
    action: str = "restart",
    fmt: str = "auto",
    lock: str | None = None,
    lock_timeout: float = DEFAULT_LOCK_TIMEOUT,
    journal: str | None = None,
    write_journal: bool = True,
) -> dict[str, Any]:
    """Append a stamp (and a journal entry) under the lock; returns the stamp and line number."""
    _check_format(fmt)
    journal = journal or default_journal(path)
    with history_locked(path, lock, lock_timeout):
        clean_stale_tmp(path)
        data, _exists = _read_bytes(path)
        hist = parse_history(data, path=path, fmt=fmt)
        if stamp is None:
            stamp = int(time.time())
        if hist.format == "jsonl":
            rec: dict[str, Any] = {"ts": stamp, "reason": reason, "by": by, "forced": forced}
            line = json.dumps(rec).encode()
        else:
            line = str(stamp).encode()
        lines = [*hist.lines, line]
        with signals_held():  # the stamp and its journal line both, or neither
            atomic_write(path, _join(lines))
            if write_journal:
                _append_journal(
                    journal,
                    [
                        _journal_line(
                            stamp=stamp, action=action, reason=reason, forced=forced, by=by
                        )
                    ],
                )
    return {
        "ok": True,
        "path": path,
        "format": hist.format,
        "stamp": stamp,
        "line": len(lines),
        "journal": journal if write_journal else None,
    }


def journal_event(
    path: str,
    *,
    stamp: Stamp,
    action: str,
    reason: str = "",
    forced: bool = False,
    by: str = "",
    lock: str | None = None,
    lock_timeout: float = DEFAULT_LOCK_TIMEOUT,
    journal: str | None = None,
    **extra: Any,
) -> None:
    """Append one journal entry (e.g. a failed restart) under the history's locks."""
    with history_locked(path, lock, lock_timeout):
        _append_journal(
            journal or default_journal(path),
            [
                _journal_line(
                    stamp=stamp, action=action, reason=reason, forced=forced, by=by, **extra
                )
            ],
        )


def _marked(entry: Entry, planned_by: str) -> bool:
    """Tell whether a jsonl record says it is a planned restart: the journal's rule
    (_is_planned; identify.record_kind on spark-ops' side, one table of cases for both)."""
    return entry.record is not None and _is_planned(entry.record, planned_by)


def note_planned(
    path: str,
    *,
    stamp: Stamp,
    reason: str = "",
    by: str = "",
    lock: str | None = None,
    lock_timeout: float = DEFAULT_LOCK_TIMEOUT,
    journal: str | None = None,
    planned_by: str = DEFAULT_PLANNED_BY,
) -> dict[str, Any]:
    """Record in the journal that ``stamp`` is a planned restart, unless a record already says so.

    For a watchdog that keeps no journal, this is how ``prune --planned`` later finds the stamp of
    a planned restart whose prune did not happen (the tool killed, the boot interrupted, the lock
    held too long). When the history's locks stay held past the timeout, the record is appended
    anyway, without them (issue 20 #9): a journal is append-only for every writer (history.py
    appends one line per O_APPEND write, which the kernel never interleaves with another
    appender's), so the line lands whole, and nothing here rewrites the history. The answer says
    so (`locked: false`, and the busy lock).
    """
    journal = journal or default_journal(path)
    busy: LockTimeout | None = None
    with contextlib.ExitStack() as stack:
        try:
            stack.enter_context(history_locked(path, lock, lock_timeout))
        except LockTimeout as exc:
            busy = exc
        records, _ = read_journal(journal)
        known = any(_is_planned(rec, planned_by) and rec.get("stamp") == stamp for rec in records)
        if not known:
            extra = {"lock_busy": busy.details.get("lock")} if busy is not None else {}
            line = _journal_line(
                stamp=stamp, action="restart", reason=reason, forced=True, by=by, **extra
            )
            _append_journal(journal, [line])
    out = {"ok": True, "journal": journal, "stamp": stamp, "written": not known}
    if busy is not None:
        out.update(locked=False, lock=busy.details.get("lock"), message=busy.message)
    return out


def _select(
    hist: History,
    stamps: Sequence[Stamp],
    since: float | None,
    until: float | None,
    planned: dict[Stamp, int],
    raws: Sequence[str] = (),
    planned_by: str = DEFAULT_PLANNED_BY,
) -> tuple[set[int], list[Any], list[Stamp]]:
    """Choose entry indexes to remove; returns (indexes, stamps/raws not found, planned absent).

    A raw line selects the latest entry with exactly that text (the planned record, told apart
    from an automatic one of the same ``ts`` by its other fields); a planned stamp prefers a
    record marked forced / planned over an unmarked one of the same value.
    """
    chosen: set[int] = set()
    by_value: dict[Stamp, list[int]] = {}
    by_raw: dict[str, list[int]] = {}
    for idx, entry in enumerate(hist.entries):
        by_value.setdefault(entry.stamp, []).append(idx)
        by_raw.setdefault(hist.lines[entry.line - 1].decode("utf-8", "replace"), []).append(idx)

    def take(candidates: Sequence[int], prefer_marked: bool = False) -> bool:
        """Select the latest not-yet-chosen entry (a marked one first when asked)."""
        free = [idx for idx in reversed(candidates) if idx not in chosen]
        if prefer_marked:
            free.sort(key=lambda idx: not _marked(hist.entries[idx], planned_by))
        if free:
            chosen.add(free[0])
            return True
        return False

    not_found: list[Any] = [r for r in raws if not take(by_raw.get(r, []))]
    not_found += [s for s in stamps if not take(by_value.get(s, []))]
    planned_absent: list[Stamp] = []
    for value, count in planned.items():
        for _ in range(count):
            if not take(by_value.get(value, []), prefer_marked=True):
                planned_absent.append(value)
    if since is not None or until is not None:
        lo = -math.inf if since is None else since
        hi = math.inf if until is None else until
        for idx, entry in enumerate(hist.entries):
            if lo <= entry.stamp <= hi:
                chosen.add(idx)
    return chosen, not_found, planned_absent


def prune(
    path: str,
    *,
    stamps: Sequence[Stamp] = (),
    since: float | None = None,
    until: float | None = None,
    planned: bool = False,
    planned_by: str = DEFAULT_PLANNED_BY,
    raws: Sequence[str] = (),
    dry_run: bool = False,
    strict: bool = False,
    reason: str = "",
    by: str = "",
    fmt: str = "auto",
    lock: str | None = None,
    lock_timeout: float = DEFAULT_LOCK_TIMEOUT,
    journal: str | None = None,
    write_journal: bool = True,
    keep_backups: int = DEFAULT_KEEP_BACKUPS,
) -> dict[str, Any]:
    """Remove chosen stamps under the lock; back up the old content; rewrite atomically."""
    _check_format(fmt)
    if not stamps and not raws and since is None and until is None and not planned:
        raise UsageFailure("prune needs --stamp, --raw, --since/--until or --planned")
    if keep_backups < 1:
        raise UsageFailure(f"--keep-backups {keep_backups} is not allowed: must be >= 1")
    journal = journal or default_journal(path)
    with history_locked(path, lock, lock_timeout):
        clean_stale_tmp(path)
        data, exists = _read_bytes(path)
        hist = parse_history(data, path=path, fmt=fmt, exists=exists)
        plan = planned_stamps(journal, planned_by) if planned else {}
        chosen, not_found, planned_absent = _select(
            hist, stamps, since, until, plan, raws, planned_by
        )
        if strict and not_found:
            raise StampNotFound(
                f"stamps {not_found} are not in history {path}; nothing was changed (--strict)",
                not_found=not_found,
                path=path,
            )
        removed = [hist.entries[i] for i in sorted(chosen)]
        drop_lines = {e.line for e in removed}
        backup = None
        if removed and not dry_run:
            kept_lines = [raw for i, raw in enumerate(hist.lines, start=1) if i not in drop_lines]
            backup = write_backup(path, data, keep_backups)
            with signals_held():  # the stamps gone and their prune lines both, or neither
                atomic_write(path, _join(kept_lines))
                if write_journal:
                    _append_journal(
                        journal,
                        [
                            _journal_line(
                                stamp=e.stamp, action="prune", reason=reason, forced=False, by=by
                            )
                            for e in removed
                        ],
                    )
    return {
        "ok": True,
        "path": path,
        "format": hist.format,
        "dry_run": dry_run,
        "removed": [
            {**e.to_dict(), "raw": hist.lines[e.line - 1].decode("utf-8", "replace")}
            for e in removed
        ],
        "kept": len(hist.entries) - len(removed),
        "kept_raws": [
            hist.lines[e.line - 1].decode("utf-8", "replace")
            for i, e in enumerate(hist.entries)
            if i not in chosen
        ],
        "not_found": not_found,
        "planned_absent": planned_absent,
        "backup": backup,
        "malformed": hist.malformed,
    }


class _Parser(argparse.ArgumentParser):
    """An argparse parser whose errors print one JSON object and exit 2."""

    def error(self, message: str) -> NoReturn:
        """Report a usage error as JSON on stdout and text on stderr, exit 2."""
        print(json.dumps({"ok": False, "error": "usage", "message": message}))
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        sys.exit(EXIT_USAGE)


def _stamp_arg(text: str) -> Stamp:
    """argparse type for stamps."""
    try:
        return parse_stamp(text)
    except UsageFailure as exc:
        raise argparse.ArgumentTypeError(exc.message) from None


def _nonneg_float(text: str) -> float:
    """argparse type for a non-negative number of seconds."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not allowed: must be >= 0")
    return value


def _budget_window(text: str) -> float:
    """argparse type for a budget's window: seconds in (0, MAX_WINDOW_S]."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 < value <= MAX_WINDOW_S:  # NaN fails this too
        raise argparse.ArgumentTypeError(f"{text!r} is not allowed: must be in (0, {MAX_WINDOW_S}]")
    return value


def _budget_max(text: str) -> int:
    """argparse type for a budget's maximum: restarts in 1..MAX_RESTARTS."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if not 1 <= value <= MAX_RESTARTS:
        raise argparse.ArgumentTypeError(f"{text!r} is not allowed: must be in 1..{MAX_RESTARTS}")
    return value


def build_parser() -> argparse.ArgumentParser:
    """Build the command-line parser."""
    common = _Parser(add_help=False)
    common.add_argument("--history", required=True, help="the restart history file")
    common.add_argument("--format", choices=FORMATS, default="auto")
    locking = _Parser(add_help=False)
    locking.add_argument("--lock", help="lock file (default <history>.lock)")
    locking.add_argument(
        "--lock-timeout", type=_nonneg_float, default=DEFAULT_LOCK_TIMEOUT, help="seconds"
    )
    locking.add_argument("--journal", help="journal file (default <history>.journal.jsonl)")
    locking.add_argument("--no-journal", action="store_true", help="do not write the journal")
    locking.add_argument("--reason", default="")
    locking.add_argument("--by", default="")

    parser = _Parser(prog="history.py", description=__doc__.splitlines()[0] if __doc__ else "")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    sub.add_parser("clock", help="this node's time.time()")
    sub.add_parser("read", parents=[common], help="entries and malformed lines")
    p = sub.add_parser("budget", parents=[common], help="restarts used in the sliding window")
    p.add_argument("--max", type=_budget_max, default=2, dest="allowed")
    p.add_argument("--window", type=_budget_window, default=21600.0)
    p.add_argument("--now", type=_nonneg_float)
    p = sub.add_parser("append", parents=[common, locking], help="append a stamp")
    p.add_argument("--stamp", type=_stamp_arg, help="default: now")
    p.add_argument("--forced", action="store_true")
    p.add_argument("--action", default="restart", help="journal action (default restart)")
    p = sub.add_parser("note", parents=[common, locking], help="journal a planned restart")
    p.add_argument("--stamp", type=_stamp_arg, required=True)
    p = sub.add_parser("prune", parents=[common, locking], help="remove chosen stamps")
    p.add_argument("--stamp", type=_stamp_arg, action="append", default=[], dest="stamps")
    p.add_argument("--raw", action="append", default=[], dest="raws", help="an exact line")
    p.add_argument("--since", type=_nonneg_float)
    p.add_argument("--until", type=_nonneg_float)
    p.add_argument("--planned", action="store_true", help="stamps the journal marks planned")
    p.add_argument("--planned-by", default=DEFAULT_PLANNED_BY, help="prefix of 'by' (spark-ops)")
    p.add_argument("--dry-run", action="store_true")
    p.add_argument("--strict", action="store_true", help="fail (exit 5) if a --stamp is absent")
    p.add_argument("--keep-backups", type=int, default=DEFAULT_KEEP_BACKUPS)
    return parser


def run(argv: Sequence[str]) -> tuple[int, dict[str, Any]]:
    """Run one subcommand; return (exit code, JSON object)."""
    args = build_parser().parse_args(list(argv))
    cmd = args.command
    if cmd == "clock":
        return EXIT_OK, clock()
    if cmd == "read":
        return EXIT_OK, read_history(args.history, args.format).to_dict()
    if cmd == "budget":
        return EXIT_OK, budget(
            args.history, allowed=args.allowed, window=args.window, now=args.now, fmt=args.format
        )
    locking = {
        "fmt": args.format,
        "lock": args.lock,
        "lock_timeout": args.lock_timeout,
        "journal": args.journal,
        "write_journal": not args.no_journal,
        "reason": args.reason,
        "by": args.by,
    }
    if cmd == "note":
        return EXIT_OK, note_planned(
            args.history, stamp=args.stamp, reason=args.reason, by=args.by, lock=args.lock,
            lock_timeout=args.lock_timeout, journal=args.journal,
        )  # fmt: skip
    if cmd == "append":
        return EXIT_OK, append(
            args.history, stamp=args.stamp, forced=args.forced, action=args.action, **locking
        )
    return EXIT_OK, prune(
        args.history,
        stamps=args.stamps,
        since=args.since,
        until=args.until,
        planned=args.planned,
        planned_by=args.planned_by,
        raws=args.raws,
        dry_run=args.dry_run,
        strict=args.strict,
        keep_backups=args.keep_backups,
        **locking,
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry: print one JSON object on stdout and return the exit code."""
    try:
        code, result = run(sys.argv[1:] if argv is None else argv)
    except HistoryFailure as exc:
        try:
            sys.stderr.write(f"history.py: {exc.message}\n")
            sys.stderr.flush()
        except BrokenPipeError:  # the session went away: the failure's code stands
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stderr.fileno())
        code, result = exc.exit_code, exc.to_dict()
    try:
        print(json.dumps(result), flush=True)
    except BrokenPipeError:  # the session went away after the work was done: its code stands
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no flush error at exit
    return code


if __name__ == "__main__":
    exit_on_hangup()  # a session cut mid-write removes its staged file (never left beside)
    sys.exit(main())
