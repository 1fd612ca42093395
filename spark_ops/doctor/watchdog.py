"""Doctor checks of the watchdog: restart command, history and lock, flags, restart budget."""

from __future__ import annotations

import shlex

from spark_ops.doctor.report import Checker, parse_kv
from spark_ops.errors import SparkOpsError
from spark_ops.remote.programs.doctor import FIND_COMMAND, WRITABLE
from spark_ops.remote.programs.node import HOME
from spark_ops.watchdog.contract import BudgetView, WatchdogContract
from spark_ops.watchdog.history import DEFAULT_PLANNED_BY
from spark_ops.watchdog.identify import fmt_stamp, record_kind


def command_program(command: str) -> tuple[str | None, str | None]:
    """(directory, program) a shell command runs: skips `cd DIR &&`, VAR=value, sudo, env."""
    try:
        words = shlex.split(command)
    except ValueError:
        words = command.split()
    directory = None
    i = 0
    while i < len(words):
        w = words[i]
        if w == "cd" and i + 2 < len(words) and words[i + 2] in ("&&", ";"):
            directory = words[i + 1]
            i += 3
        elif "=" in w and not w.startswith(("/", "~", ".")) and w.split("=", 1)[0].isidentifier():
            i += 1
        elif w in ("sudo", "env", "exec", "nice", "nohup"):
            i += 1
            while i < len(words) and words[i].startswith("-"):
                i += 1
        else:
            return directory, w
    return directory, None


class WatchdogChecks(Checker):
    """The watchdog on the head: its restart command, history file, lock, flags and budget."""

    async def check_watchdog(self) -> None:
        """Restart command present; history readable and writable under its lock; pause, gave-up."""
        if not self.up(self.head):
            return
        wd = self.cluster.watchdog
        directory, prog = command_program(wd.restart_command)
        if prog is None:
            self.report.add(
                "watchdog-command",
                self.head,
                "fail",
                f"watchdog.restart_command {wd.restart_command!r} names no program",
                "set watchdog.restart_command to your watchdog's forced-restart command",
            )
        else:
            where = (directory,) if directory else ()
            res = await self.session.call(self.head, FIND_COMMAND, prog, *where)
            if res.ok and res.stdout.strip():
                self.report.add(
                    "watchdog-command",
                    self.head,
                    "ok",
                    f"{prog} found at {res.stdout.strip()}"
                    + (f" (in {directory})" if directory else ""),
                )
            else:
                self.report.add(
                    "watchdog-command",
                    self.head,
                    "fail",
                    f"{prog} (first word of watchdog.restart_command) is not found on the head's "
                    "PATH for a non-interactive SSH command",
                    "install the watchdog on the head, or use an absolute path in "
                    "watchdog.restart_command",
                )
        contract = WatchdogContract(self.session)
        try:
            data = await contract.history("read", *contract._common())
        except SparkOpsError as exc:
            self.report.add(
                "history",
                self.head,
                "fail",
                exc.message,
                f"check watchdog.history_file ({wd.history_file}) and "
                f"watchdog.history_format ({wd.history_format}); "
                f"python3 must run on the head as {wd.python}",
            )
            return
        count = int(data.get("count", 0))
        malformed = data.get("malformed") or []
        exists = data.get("exists", True)
        detail = f"{wd.history_file}: {count} stamp(s), format {data.get('format')}"
        if not exists:
            await self._history_absent()
        elif malformed:
            first = malformed[0]
            self.report.add(
                "history",
                self.head,
                "warn",
                f"{detail}; {len(malformed)} malformed line(s), e.g. line {first.get('line')}: "
                f"{str(first.get('raw', first)).strip()[:80]}",
                "malformed lines are kept and ignored; fix them by hand under the lock if they "
                "should count",
            )
        else:
            self.report.add("history", self.head, "ok", detail)
        await self._check_writable()
        await self._check_flags()
        await self._check_status(contract)

    async def _history_absent(self) -> None:
        """A history that does not exist: a first install, or watchdog.history_file names the
        wrong file (then the watchdog's stamps, planned ones too, are never seen nor pruned)."""
        wd = self.cluster.watchdog
        said, where = await self._configured_history()
        if said is None:
            self.report.add(
                "history",
                self.head,
                "warn",
                f"{wd.history_file} does not exist: no restart recorded yet, or not the file the "
                f"watchdog writes ({where})",
                "compare watchdog.history_file with the history file your watchdog's config "
                "names; a planned restart recorded elsewhere is never pruned",
            )
            return
        home = await self._home()
        mine = home + wd.history_file[1:] if wd.history_file.startswith("~") else wd.history_file
        if said == mine:
            self.report.add(
                "history",
                self.head,
                "warn",
                f"{wd.history_file} does not exist yet: no restart recorded (the watchdog's "
                f"config {where} names the same file)",
                "nothing to do before the first restart",
            )
            return
        shown = "~" + said[len(home) :] if home and said.startswith(home + "/") else said
        self.report.add(
            "history",
            self.head,
            "warn",
            f"{wd.history_file} does not exist, and the watchdog's config {where} says its "
            f"history is {shown}",
            f"set watchdog.history_file: {shown} in the inventory (and lock_file / journal_file "
            "beside it): planned restarts recorded there are not seen nor pruned",
        )

    async def _home(self) -> str:
        """The SSH user's home on the head ('' when it cannot be told)."""
        home = await self.session.call(self.head, HOME)
        return home.strip() if home is not None else ""

    async def _configured_history(self) -> tuple[str | None, str]:
        """(the history the watchdog's own config names, where that config is), when readable;
        else (None, why). Which config: WatchdogContract.own_config's one rule."""
        own = await WatchdogContract(self.session).own_config(await self._home())
        if own.config is None:
            return None, own.why
        return own.config.paths.history, own.where

    async def _check_status(self, contract: WatchdogContract) -> None:
        """The watchdog's own status command (watchdog.status_command) answers in time."""
        own = await contract.own_status()
        if own is None:
            return
        if own.answered:
            said = f"state {own.state}" if own.state else repr(own.text.splitlines()[0][:80])
            self.report.add("watchdog-status", self.head, "ok", f"answers: {said}")
            return
        code = f" (exit {own.exit_code})" if own.exit_code not in (None, 0) else ""
        self.report.add(
            "watchdog-status",
            self.head,
            "warn",
            f"watchdog.status_command{code}: {own.text[:200]}",
            f"run it on the head by hand: {own.command[:200]}; or remove watchdog.status_command "
            "(only status and doctor use it)",
        )

    async def _check_writable(self) -> None:
        """The history (or its directory) writable, the lock file lockable now, as the SSH user."""
        wd = self.cluster.watchdog
        res = await self.session.call(self.head, WRITABLE, wd.history_file, wd.lock_path, sudo=True)
        kv = parse_kv(res.stdout)
        user = self.cluster.head.user or "the SSH user"
        problems = []
        if kv.get("file") == "not-writable":
            problems.append(f"{wd.history_file} is not writable by {user}")
        if kv.get("dir") != "writable":
            problems.append(
                f"its directory is {kv.get('dir', 'unknown').replace('-', ' ')} for {user} "
                "(the history is replaced by a rename there)"
            )
        lock = kv.get("lock", "unknown")
        if lock in ("unreadable", "absent-not-creatable", "no-flock", "unknown"):
            problems.append(f"lock file {wd.lock_path}: {lock.replace('-', ' ')}")
        if kv.get("lockfile") == "not-writable":
            problems.append(f"lock file {wd.lock_path} is not writable")
        if problems:
            self.report.add(
                "history-writable",
                self.head,
                "fail",
                "; ".join(problems),
                f"let {user} write {wd.history_file} and its directory (chown/chmod, or "
                "chattr -i if immutable), or set sudo: true for the head in the inventory",
            )
        elif lock == "held":
            self.report.add(
                "history-writable",
                self.head,
                "warn",
                f"writable, but {wd.lock_path} is locked right now (the watchdog may be writing)",
                "run doctor again in a moment; if it stays locked, find the holder: "
                f"fuser -v {wd.lock_path}",
            )
        else:
            self.report.add(
                "history-writable",
                self.head,
                "ok",
                f"history and its directory writable; lock {wd.lock_path} "
                f"{'free' if lock == 'free' else 'can be created'}",
            )

    async def _check_flags(self) -> None:
        """Report the pause and gave-up flags (warnings: apply forces the restart anyway)."""
        wd = self.cluster.watchdog
        for name, path, fix in (
            (
                "pause",
                wd.pause_file,
                "the watchdog will not recover a failed boot while paused; "
                "remove the file when done",
            ),
            (
                "gave-up",
                wd.gave_up_file,
                "the watchdog no longer restarts a failed engine: see why (`spark-ops budget`); "
                "with no room in the window the budget check's fix makes room first; then clear "
                "it: spark-ops budget prune --clear-gave-up",
            ),
        ):
            if not path:
                continue
            try:
                contract = WatchdogContract(self.session)
                wrong = await contract.pause_file_disagrees() if name == "pause" else ""
            except SparkOpsError:  # unknown: the flag itself is still reported below
                wrong = ""
            if wrong:  # a lease there would pause nothing
                self.report.add(f"watchdog-{name}", self.head, "warn", wrong)
                continue
            text = await self.session.read_file(self.head, path)
            if text is None:
                self.report.add(f"watchdog-{name}", self.head, "ok", f"{path} absent")
            else:
                first = (text.strip().splitlines() or [""])[0][:120]
                self.report.add(
                    f"watchdog-{name}",
                    self.head,
                    "warn",
                    f"{path} present{': ' + first if first else ''}",
                    fix,
                )

    async def check_probe(self) -> None:
        """The inventory describes the watchdog's probe (watchdog.probe), as its config says:
        without it bench and experiment cannot compute whether a load level starves the probe
        (such a level is then leased, or refused without a pause file)."""
        if not self.up(self.head):
            return
        wd = self.cluster.watchdog
        own = await WatchdogContract(self.session).own_config(await self._home())
        cfg = own.config.probe if own.config is not None else None
        said = (
            f"watchdog.probe: {{interval_s: {cfg.interval:g}, timeout_s: {cfg.timeout:g}, "
            f"failures: {cfg.failures}}}"
            if cfg is not None
            else "watchdog.probe: {interval_s, timeout_s, failures}"
        )
        where = f" (the watchdog's config {own.where})" if cfg is not None else (
            " to the watchdog's own probe: how often it probes, how long one probe waits, how "
            "many failures in a row make it restart the engine"
        )  # fmt: skip
        probe = wd.probe
        if probe is None:
            self.report.add(
                "watchdog-probe",
                self.head,
                "warn",
                "the inventory has no watchdog.probe: bench and experiment cannot compute whether "
                "a load level starves the watchdog's probe, so a level at or above max_num_seqs "
                "runs leased (or is refused without watchdog.pause_file)",
                f"set {said} in the inventory{where}",
            )
            return
        text = (
            f"every {probe.interval_s:g} s, timeout {probe.timeout_s:g} s, a restart after "
            f"{probe.failures} failures"
        )
        mine = (probe.interval_s, probe.timeout_s, probe.failures)
        if cfg is not None and mine != (float(cfg.interval), float(cfg.timeout), cfg.failures):
            self.report.add(
                "watchdog-probe",
                self.head,
                "warn",
                f"watchdog.probe ({text}) is not the probe of the watchdog's config {own.where} "
                f"(every {cfg.interval:g} s, timeout {cfg.timeout:g} s, a restart after "
                f"{cfg.failures} failures): bench and experiment reckon load with the wrong one",
                f"set {said} in the inventory",
            )
            return
        same = " (as the watchdog's config says)" if cfg is not None else ""
        self.report.add("watchdog-probe", self.head, "ok", f"{text}{same}")

    async def check_budget(self) -> None:
        """The restart budget left: none left fails (a failed boot could not be recovered)."""
        if not self.up(self.head):
            return
        try:
            view = await WatchdogContract(self.session).budget()
        except SparkOpsError as exc:
            self.report.add(
                "budget",
                self.head,
                "fail",
                exc.message,
                "fix the history first (see the history check)",
            )
            return
        left = max(0, view.allowed - view.used)
        detail = f"{view.used}/{view.allowed} automatic restarts used in {view.window_s / 3600:g} h"
        if left == 0:
            wait = max(0.0, view.next_free_at - view.now)
            self.report.add(
                "budget",
                self.head,
                "fail",
                f"{detail}: none left; if apply's boot failed the watchdog could not recover "
                f"the engine (next slot frees in {wait / 60:.0f} min)",
                budget_fix(view),
            )
        else:
            self.report.add("budget", self.head, "ok", f"{detail}, {left} left")


def budget_fix(view: BudgetView) -> str:
    """The fix for a spent budget that really frees a slot: `--planned` only when planned stamps
    left by earlier runs are in the window; else wait, or remove one stamp by its value (an
    automatic one is the watchdog's record of a failure, a forced one someone's restart)."""
    inside = [s for s in view.stamps if float(s.get("stamp", 0)) > view.now - view.window_s]
    planned = [s for s in inside if record_kind(s, DEFAULT_PLANNED_BY) == "planned"]
    wait = max(0.0, view.next_free_at - view.now)
    gave_up = " --clear-gave-up" if view.gave_up else ""
    if planned and view.used - len(planned) < view.allowed:
        return (
            f"remove the {len(planned)} planned stamp(s) earlier runs left: spark-ops budget "
            f"prune --planned{gave_up}"
        )
    # a restart someone forced (by hand, not planned by spark-ops) records no failure: removing
    # it hides none, so it goes first; else the oldest, an automatic one (a failure's record)
    forced = [s for s in inside if s.get("forced") is True]
    pick = min(forced or inside, key=lambda s: float(s.get("stamp", 0)), default=None)
    if pick is None:
        return f"wait {wait / 60:.0f} min for the window to free a slot"
    if pick.get("forced") is True:
        why = f", {pick['reason']}" if pick.get("reason") else ""
        which = f"the restart forced by {pick.get('by') or '?'}{why}"
    else:
        which = "the oldest stamp (automatic: the watchdog's record of a failure)"
    return (
        f"wait {wait / 60:.0f} min for the window to free a slot; or, once the cause is "
        f"understood, remove {which}: spark-ops budget prune --stamp "
        f"{fmt_stamp(float(pick['stamp']))}{gave_up}"
    )
