"""The watchdog contract as spark-ops uses it over SSH: force a restart, find its stamp, read and
prune.

Works with any watchdog that keeps a history of restart stamps (one Unix time per line, or JSON
lines) under a lock file: the reference `spark-watchdog` or an operator's own. The history is read
and changed on the head by `history.py`, sent with the headlib modules it imports as one program to
the head's python3 (`headlib.head_program`), so nothing has to be installed there. Times always
come from the head's clock.
"""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from typing import Any

from spark_ops.account import local_account
from spark_ops.errors import (
    CommandTimeout,
    HistoryError,
    HistoryLockBusy,
    RemoteError,
    SparkOpsError,
    TriggerFailed,
    WatchdogError,
)
from spark_ops.headlib import head_program
from spark_ops.remote.programs.watchdog import DETACHED_RESTART, HISTORY_PY
from spark_ops.remote.shell import REMOVE
from spark_ops.watchdog.command import fill_restart_command, reported_stamps
from spark_ops.watchdog.identify import (
    HistEntry,
    Identification,
    fmt_stamp,
    prune_command,
    stamp_json,
)
from spark_ops.watchdog.identify import identify as identify_entry
from spark_ops.watchdog.lease import Lease, pause_of
from spark_ops.watchdog.ownconfig import OwnConfigChecks
from spark_ops.watchdog.records import (
    BudgetView,
    Trigger,
    WatchdogStatus,
    status_object,
)

PLANNED_BY = "spark-ops"

_EXIT_MEANING = {
    3: "the history lock is held too long",
    4: "the history is unreadable",
    5: "stamp absent",
}


@cache  # the package's files do not change while it runs: built once, not on every call
def history_source() -> str:
    """The program sent to the head's python3: history.py with the headlib modules it imports."""
    text = resources.files("spark_ops.watchdog").joinpath("history.py").read_text(encoding="utf-8")
    return head_program(text, "history.py")


def operator() -> str:
    """Who is acting, for journal entries ('spark-ops:<user>')."""
    return f"{PLANNED_BY}:{local_account()}"


STATUS_TIMEOUT_S = (
    10.0  # the watchdog's own status is a glance: a hung one is reported, not awaited
)
_STATUS_SHOWN = 300  # characters of its output kept for the report


class WatchdogContract(OwnConfigChecks):
    """Operations on the head's watchdog files and commands, per the inventory."""

    def _common(self) -> list[str]:
        """History file arguments shared by every history.py call."""
        fmt = self.wd.history_format
        return ["--history", self.wd.history_file, "--format", fmt]

    @property
    def journal(self) -> str:
        """The journal on the head: the watchdog's, else spark-ops' own beside the history."""
        return self.wd.journal_path

    def _locking(self, lock_timeout: float | None = None) -> list[str]:
        """Lock and journal arguments for changes (the inventory's lock timeout by default)."""
        wait = self.wd.lock_timeout_s if lock_timeout is None else lock_timeout
        return [
            "--lock", self.wd.lock_path, "--lock-timeout", f"{wait:g}", "--journal", self.journal,
        ]  # fmt: skip

    async def history(
        self, command: str, *args: str, timeout: float | None = None
    ) -> dict[str, Any]:
        """Run a history.py subcommand on the head and return its JSON answer."""
        line = HISTORY_PY.line(self.wd.python, command, *args)
        res = await self.session.run(
            self.head, line, input=history_source(), check=False, timeout=timeout, sudo=True
        )
        try:
            data = json.loads(res.stdout.strip().splitlines()[-1]) if res.stdout.strip() else {}
        except ValueError:
            data = {}
        if res.exit_code != 0:
            why = data.get("message") or res.stderr.strip() or _EXIT_MEANING.get(res.exit_code or 0)
            if data.get("error") == "lock_timeout":
                raise HistoryLockBusy(
                    f"{self.head}: history.py {command} on {self.wd.history_file}: {why}",
                    lock=str(data.get("lock", "")),
                    holders=[h for h in data.get("holders", []) if isinstance(h, dict)],
                )
            raise HistoryError(
                f"{self.head}: history.py {command} on {self.wd.history_file} failed "
                f"(exit {res.exit_code}): {why}"
            )
        return data

    async def clock(self) -> float:
        """The head's time.time()."""
        return float((await self.history("clock"))["time"])

    async def stamps(self) -> list[float]:
        """Every well-formed stamp in the history, in file order."""
        data = await self.history("read", *self._common())
        return [float(e["stamp"]) for e in data.get("entries", []) if e.get("stamp") is not None]

    async def _pause(self, now: float) -> tuple[bool, Lease | None]:
        """Whether the pause file pauses the watchdog at `now` (the head's clock), and the lease
        it holds (lease.pause_of: a lapsed lease pauses nothing)."""
        if not self.wd.pause_file:
            return False, None
        try:
            text = await self.session.read_file(self.head, self.wd.pause_file)
        except SparkOpsError:  # a directory, not UTF-8, too big: the watchdog reads a pause
            return True, None  # (the history was just read over this session: it answers)
        return pause_of(text, now)

    async def _flag(self, path: str | None) -> tuple[bool, str]:
        """Whether a flag file exists on the head, and its first line."""
        if not path:
            return False, ""
        text = await self.session.read_file(self.head, path)
        if text is None:
            return False, ""
        first = (text.strip().splitlines() or [""])[0]
        try:
            record = json.loads(first)
        except ValueError:
            return True, first
        return True, str(record.get("reason", first)) if isinstance(record, dict) else first

    async def budget(self) -> BudgetView:
        """Used / allowed in the window (the watchdog's own limits), with reasons and flags."""
        limits = await self.limits()
        data = await self.history(
            "budget", *self._common(), "--max", str(limits.max_restarts),
            "--window", repr(limits.window_s),
        )  # fmt: skip
        await self.check_history_is_the_watchdogs(data)
        reasons = await self.journal_by_stamp()
        stamps = []
        for s in data.get("stamps", []):
            rec = reasons.get(float(s), {})
            stamps.append(
                {
                    "stamp": stamp_json(s),
                    "age_s": round(float(data["now"]) - float(s), 1),
                    "reason": rec.get("reason", ""),
                    "by": rec.get("by", ""),
                    "forced": rec.get("forced"),
                }
            )
        paused, lease = await self._pause(float(data["now"]))
        gave_up, why = await self._flag(self.wd.gave_up_file)
        return BudgetView(
            used=int(data["used"]),
            allowed=int(data["allowed"]),
            window_s=float(data["window"]),
            now=float(data["now"]),
            next_free_at=float(data["next_free_at"]),
            stamps=stamps,
            paused=paused,
            lease=lease.to_dict() if lease is not None else None,
            gave_up=gave_up,
            gave_up_reason=why,
            malformed=list(data.get("malformed", [])),
            history_file=self.wd.history_file,
            flagged=list(data.get("flagged", [])),
            limits_source=limits.source,
            disagreement=limits.disagreement,
        )

    async def journal_restarts(self) -> list[dict[str, Any]]:
        """The journal's restart records with a numeric stamp, in file order, from its last MiB
        (it only grows: the stamps in any window are at its end); odd lines skipped."""
        text = await self.session.read_tail(self.head, self.journal)
        out: list[dict[str, Any]] = []
        for line in (text or "").splitlines():
            try:
                rec = json.loads(line)
                if not isinstance(rec, dict) or rec.get("action", "restart") != "restart":
                    continue
                if rec.get("stamp") is not None:
                    float(rec["stamp"])
                    out.append(rec)
            except (ValueError, TypeError, AttributeError, OverflowError, RecursionError):
                continue  # an odd line is skipped, never a failed budget
        return out

    async def journal_by_stamp(self) -> dict[float, dict[str, Any]]:
        """The latest journal record per stamp (reasons for budget displays, planned or not)."""
        return {float(rec["stamp"]): rec for rec in await self.journal_restarts()}

    async def last_restart(self) -> dict[str, Any] | None:
        """The newest restart in the journal (pruned or not): time, reason, by, forced."""
        text = await self.session.read_tail(self.head, self.journal)
        last = None
        for line in (text or "").splitlines():
            try:
                rec = json.loads(line)
            except (ValueError, RecursionError):
                continue
            if isinstance(rec, dict) and rec.get("action", "restart") == "restart":
                last = rec
        return last

    def restart_command(self, reason: str) -> str:
        """The inventory's restart command with {reason} and {by} filled in (one pass, quoted)."""
        return fill_restart_command(self.wd.restart_command, {"reason": reason, "by": operator()})

    async def entries(self) -> list[HistEntry]:
        """Every well-formed history entry with its exact line, in file order."""
        data = await self.history("read", *self._common())
        return [HistEntry.from_read(e) for e in data.get("entries", [])]

    async def trigger(self, reason: str, *, timeout: float = 600.0) -> Trigger:
        """Force a restart through the watchdog, taking the head's clock before and after.

        Never raises for the command's own failure: the Trigger carries its exit code, so that the
        caller can tell whether a restart began before it reports (and undoes) anything.
        """
        command = self.restart_command(reason)
        before = await self.clock()
        line = DETACHED_RESTART.line(command)  # a lost connection never tears the restart
        res = await self.session.run(self.head, line, timeout=timeout, check=False, label=command)
        after = await self.clock()
        every = reported_stamps(res.stdout)
        printed = every[-1] if every else None
        output = res.stdout if res.exit_code == 0 else (res.stderr.strip() or res.stdout.strip())
        trusted = printed if self.wd.reports_stamp else None
        return Trigger(before, after, trusted, output[-2000:], res.exit_code, printed, tuple(every))

    def failure(self, trigger: Trigger) -> TriggerFailed:
        """The error of a restart command that exited non-zero."""
        return TriggerFailed(
            self.head,
            f"the watchdog's restart command failed (exit {trigger.exit_code}): "
            f"{trigger.output.strip()[-300:] or 'no output'}",
        )

    async def identify(
        self, trigger: Trigger, before: list[HistEntry], *, until: float | None = None
    ) -> Identification:
        """The entry this restart wrote (watchdog/identify.py's rules); AmbiguousStamp in a race.

        The window runs from the head's clock before the command to `until` (default: now), so a
        stamp an asynchronous watchdog appends after its command returned is still found.
        """
        now = await self.entries()
        end = until if until is not None else await self.clock()
        try:
            journal = await self.journal_restarts()
        except SparkOpsError:
            journal = []  # no evidence from it: several new entries are then refused
        return identify_entry(
            before,
            now,
            window=(trigger.before, max(trigger.after, end)),
            reported=trigger.stamp,
            reports_stamp=self.wd.reports_stamp,
            by_prefix=PLANNED_BY,
            printed=trigger.printed_all if self.wd.reports_stamp else (),
            journal=journal,
        )

    async def note_planned(
        self, entry: HistEntry, reason: str, *, lock_timeout: float | None = None
    ) -> dict[str, Any]:
        """Record on the head that this stamp is a planned restart (for `prune --planned`).

        A watchdog that keeps no journal gets spark-ops' own record beside its history; one whose
        journal already marks the stamp planned is left as it is. The record is written even when
        the history's lock stays held (history.py appends it without the lock then).
        """
        args = [
            *self._common(), *self._locking(lock_timeout), "--by", operator(), "--reason", reason,
        ]  # fmt: skip
        return await self.history("note", *args, "--stamp", _fmt(entry.stamp))

    async def prune_planned(
        self, entry: HistEntry, reason: str, *, also: tuple[HistEntry, ...] = ()
    ) -> dict[str, Any]:
        """Remove the planned restart's own entry (prune's report), or say it could not.

        When the history's lock stays held past watchdog.lock_timeout_s (the watchdog holding it
        longer than spark-ops waits: issue 20 #9), the stamp is recorded as planned on the head so
        that `budget prune --planned` finds it later, and HistoryLockBusy says which lock, who has
        it open, that this stamp was NOT pruned, and the command that removes it.
        """
        try:
            return await self.prune(raws=[e.raw for e in (*also, entry)], reason=reason)
        except HistoryLockBusy as busy:
            try:
                for other in also:
                    await self.note_planned(other, reason, lock_timeout=0)
                noted = await self.note_planned(entry, reason, lock_timeout=0)
                recorded = f"it is recorded as planned in {noted.get('journal', self.journal)}"
            except SparkOpsError as exc:
                recorded = f"recording it as planned failed too ({exc.message})"
            who = "; ".join(f"pid {h.get('pid')} ({h.get('command') or '?'})" for h in busy.holders)
            raise HistoryLockBusy(
                f"{self.head}: the history lock {busy.lock or self.wd.lock_path} stayed held for "
                f"more than {self.wd.lock_timeout_s:g} s"
                + (f" (open in: {who})" if who else " (by a process the head did not name)")
                + f": the planned restart's stamp {entry.raw.strip()} was NOT pruned; {recorded}",
                lock=busy.lock,
                holders=busy.holders,
                hint=f"once the lock is free, remove it with: {prune_command(entry)} "
                "(or `spark-ops budget prune --planned`); a watchdog that holds its history lock "
                "for long needs a longer watchdog.lock_timeout_s in the inventory",
            ) from None

    async def prune(
        self,
        *,
        stamps: list[float] | None = None,
        raws: list[str] | None = None,
        since: float | None = None,
        until: float | None = None,
        planned: bool = False,
        dry_run: bool = False,
        reason: str = "planned restart",
    ) -> dict[str, Any]:
        """Remove chosen stamps under the history lock (backup kept); history.py's report."""
        args = [*self._common(), *self._locking(), "--by", operator(), "--reason", reason]
        for s in stamps or []:
            args += ["--stamp", _fmt(s)]
        for raw in raws or []:
            args.append(f"--raw={raw}")  # one word even when the line starts with '-'
        if since is not None:
            args += ["--since", _fmt(since)]
        if until is not None:
            args += ["--until", _fmt(until)]
        if planned:
            args.append("--planned")
        if dry_run:
            args.append("--dry-run")
        args += ["--keep-backups", str(self.cluster.recipe.keep_backups)]
        result = await self.history("prune", *args)
        result["removed_stamps"] = [float(e["stamp"]) for e in result.get("removed", [])]
        return result

    async def own_status(self, timeout: float = STATUS_TIMEOUT_S) -> WatchdogStatus | None:
        """The watchdog's own status through watchdog.status_command (None when not set).

        Bounded by `timeout`; a command that fails, hangs or prints nothing is reported as not
        answering (never raised): the rest of `status` / `doctor` does not depend on it.
        """
        command = self.wd.status_command
        if not command:
            return None
        try:
            res = await self.session.run(
                self.head, command, check=False, timeout=timeout, label="watchdog status"
            )
        except CommandTimeout:
            return WatchdogStatus(command, False, text=f"no answer within {timeout:g} s")
        except RemoteError as exc:
            return WatchdogStatus(command, False, text=exc.message[:_STATUS_SHOWN])
        out = res.stdout.strip()
        if res.exit_code != 0:
            why = (res.stderr.strip() or out or "no output")[-_STATUS_SHOWN:]
            return WatchdogStatus(command, False, text=why, exit_code=res.exit_code)
        if not out:
            return WatchdogStatus(command, False, text="printed nothing", exit_code=0)
        obj = status_object(out)
        state = obj.get("state")
        return WatchdogStatus(
            command, True, str(state) if isinstance(state, str | int | float) else None,
            out[:_STATUS_SHOWN], 0, obj if len(out) <= 100_000 else {},
        )  # fmt: skip

    async def clear_gave_up(self) -> bool:
        """Remove the gave-up file once the window has room again; True when removed."""
        if not self.wd.gave_up_file:
            raise WatchdogError("the inventory names no watchdog.gave_up_file")
        view = await self.budget()
        if view.used >= view.allowed:
            raise WatchdogError(
                f"the budget is still full ({view.used}/{view.allowed}); clearing gave-up now "
                f"would "
                f"let the watchdog loop; next slot frees at {_fmt(view.next_free_at)}",
                hint="prune planned stamps first (spark-ops budget prune --planned)",
            )
        res = await self.session.call(
            self.head, REMOVE, self.wd.gave_up_file, sudo=True, check=True
        )
        return res.ok


_fmt = fmt_stamp
