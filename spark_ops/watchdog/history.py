"""A watchdog's restart history changed: append, note and prune, under its locks, atomically.

The program spark-ops runs on the head, standard library only, with spark_ops.headlib: spark-ops
sends it with headlib's modules as one program (``headlib.head_program``) to ``python3 -I -
SUBCOMMAND ARGS`` on a node where spark-ops is not installed. Each subcommand prints one JSON
object on stdout. The format and its reading (``read``, ``budget``) are headlib's
``history_format``, the journal beside the history headlib's ``history_journal``, the locks a
change takes headlib's ``flock.history_locks``; their names are importable from here too. Exit
codes: 0 ok, 2 usage, 3 lock timeout, 4 unreadable / IO error, 5 a stamp asked for with
``--strict`` is absent (nothing changed).

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
import socket
import sys
import time
from collections.abc import Sequence
from typing import Any, NoReturn

from spark_ops.headlib.atomic import atomic_write, clean_stale_tmp
from spark_ops.headlib.backup import DEFAULT_KEEP_BACKUPS, write_backup
from spark_ops.headlib.errors import LockTimeout
from spark_ops.headlib.flock import (
    DEFAULT_LOCK_TIMEOUT,
    default_lock,  # noqa: F401 - re-exported (callers import it from here)
    history_locked,
    history_locks,  # noqa: F401 - re-exported (callers import it from here)
    link_chain,  # noqa: F401 - re-exported (callers import it from here)
)
from spark_ops.headlib.history_format import (
    DEFAULT_PLANNED_BY,
    EXIT_USAGE,
    FORMATS,
    MAX_RESTARTS,
    MAX_WINDOW_S,
    Entry,
    History,
    HistoryFailure,
    Stamp,
    UsageFailure,
    budget,
    budget_of,  # noqa: F401 - re-exported (callers import it from here)
    check_format,
    flagged_lines,  # noqa: F401 - re-exported (callers import it from here)
    parse_history,
    parse_stamp,
    read_bytes,
    read_history,
)
from spark_ops.headlib.history_journal import (
    append_journal,
    default_journal,
    is_planned,
    journal_line,
    planned_stamps,
    read_journal,
)
from spark_ops.headlib.proc import exit_on_hangup, signals_held

EXIT_OK = 0
EXIT_NOT_FOUND = 5  # 3 (lock timeout) and 4 (IO) are headlib.errors'


class StampNotFound(HistoryFailure):
    """With --strict, a stamp asked for is not in the history; nothing was changed."""

    exit_code = EXIT_NOT_FOUND
    kind = "not_found"


def clock() -> dict[str, Any]:
    """Return this node's wall clock and host name."""
    return {"ok": True, "time": time.time(), "host": socket.gethostname()}


def _join(lines: Sequence[bytes]) -> bytes:
    """Join lines into file content, each ended by a newline."""
    return b"".join(line + b"\n" for line in lines)


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
    check_format(fmt)
    journal = journal or default_journal(path)
    with history_locked(path, lock, lock_timeout):
        clean_stale_tmp(path)
        data, _exists = read_bytes(path)
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
                append_journal(
                    journal,
                    [journal_line(stamp=stamp, action=action, reason=reason, forced=forced, by=by)],
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
        append_journal(
            journal or default_journal(path),
            [
                journal_line(
                    stamp=stamp, action=action, reason=reason, forced=forced, by=by, **extra
                )
            ],
        )


def _marked(entry: Entry, planned_by: str) -> bool:
    """Tell whether a jsonl record says it is a planned restart: the journal's rule
    (is_planned; identify.record_kind on spark-ops' side, one table of cases for both)."""
    return entry.record is not None and is_planned(entry.record, planned_by)


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
        known = any(is_planned(rec, planned_by) and rec.get("stamp") == stamp for rec in records)
        if not known:
            extra = {"lock_busy": busy.details.get("lock")} if busy is not None else {}
            line = journal_line(
                stamp=stamp, action="restart", reason=reason, forced=True, by=by, **extra
            )
            append_journal(journal, [line])
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
    check_format(fmt)
    if not stamps and not raws and since is None and until is None and not planned:
        raise UsageFailure("prune needs --stamp, --raw, --since/--until or --planned")
    if keep_backups < 1:
        raise UsageFailure(f"--keep-backups {keep_backups} is not allowed: must be >= 1")
    journal = journal or default_journal(path)
    with history_locked(path, lock, lock_timeout):
        clean_stale_tmp(path)
        data, exists = read_bytes(path)
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
                    append_journal(
                        journal,
                        [
                            journal_line(
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
