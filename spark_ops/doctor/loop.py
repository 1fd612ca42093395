"""Doctor checks of the watchdogs that only loop and of restart policies: whether the loop runs
and is the one the inventory describes, whether its budget survives a reboot, whether it brings
a crashed engine back, whether it locks its history, and the budget a systemd unit's or a
container's restart policy implies."""

from __future__ import annotations

from spark_ops.doctor.report import Checker
from spark_ops.watchdog.loop import (
    LoopFacts,
    find_loop_watchdogs,
    no_recovery,
    other_engines,
    pick_loop,
    probed_port,
    several_loops,
    split_loops,
    unlocked_appends,
    url_port,
    volatile_history,
)
from spark_ops.watchdog.policy import RestartPolicy, engine_policy


def _per(max_restarts: int | None, window_s: float | None) -> str:
    """A budget in words."""
    if max_restarts is None:
        return "?"
    return f"{max_restarts} per {window_s / 3600:g} h" if window_s else f"{max_restarts}"


class LoopChecks(Checker):
    """A loop-only watchdog (watchdog.kind: loop) and the engine's restart policy."""

    async def check_loop_watchdog(self) -> None:
        """The loop runs as described; its budget across reboots; what it does after a crash."""
        if not self.up(self.head):
            return
        wd = self.cluster.watchdog
        if wd.loops_only:
            loops = await find_loop_watchdogs(self.session, self.head)
            port = url_port(self.cluster.engine.api_url)
            facts = pick_loop(loops, port=port, history=wd.history_file)
            mine, others = split_loops(loops, port)
            if facts is not None and len([f for f in mine if f is not facts]) >= 1:
                several = [facts, *(f for f in mine if f is not facts)]
                self.report.add(
                    "watchdog-loops", self.head, "warn", several_loops(several, facts),
                    "stop the loops that do not watch this engine (one watchdog per engine)",
                )  # fmt: skip
            self._loop_running(facts, port, others)
        reboot = await volatile_history(self.session, self.head, wd.history_file)
        if reboot:
            self.report.add(
                "watchdog-reboot", self.head, "warn", reboot,
                "keep the watchdog's stamps in a directory a reboot keeps (e.g. ~/.local/state/), "
                "in its script and in watchdog.history_file",
            )  # fmt: skip
        if not wd.restarts_missing_engine:
            self.report.add(
                "watchdog-recovery", self.head, "warn",
                "after a crash that leaves no engine running, " + no_recovery(wd.restart_command),
                "after a crash run `spark-ops restart`; or give the engine a restart policy "
                "with a start limit",
            )  # fmt: skip
        if not wd.history_locked:
            self.report.add(
                "watchdog-lock", self.head, "warn", unlocked_appends(wd.history_file, wd.lock_path),
                f"make the watchdog append under flock on {wd.lock_path} "
                "(docs/adopting-a-watchdog.md, step 1)",
            )  # fmt: skip

    def _loop_running(
        self, facts: LoopFacts | None, port: str | None, others: list[LoopFacts]
    ) -> None:
        """Whether a loop watchdog runs on the head, and whether it is the one described (the
        loops there that probe another port than this engine's `port`: `others`)."""
        wd = self.cluster.watchdog
        if facts is None:
            runs = (
                "no loop on the head probes this engine (" + other_engines(others, port) + ")"
                if others
                else "no process on the head runs a loop watchdog's script (a loop that appends "
                "`date +%s` to its stamps)"
            )
            self.report.add(
                "watchdog-loop", self.head, "warn",
                f"watchdog.kind is loop, but {runs}: nothing restarts a failed engine",
                "start the watchdog, or run doctor as the user it runs as",
            )  # fmt: skip
            return
        differ = []
        if port is not None and probed_port(facts) not in (None, port):
            differ.append(f"its probe names port {probed_port(facts)}, not the engine's {port}")
        if facts.history_file and facts.history_file != wd.history_file:
            differ.append(f"its stamps go to {facts.history_file}, not {wd.history_file}")
        if facts.max_restarts is not None and (facts.max_restarts, facts.window_s) != (
            wd.max_restarts,
            float(wd.window_s),
        ):
            differ.append(
                f"its budget is {_per(facts.max_restarts, facts.window_s)}, the inventory's "
                f"{_per(wd.max_restarts, wd.window_s)}"
            )
        if facts.pause_file and wd.pause_file and facts.pause_file != wd.pause_file:
            differ.append(f"its pause file is {facts.pause_file}, not {wd.pause_file}")
        what = f"{facts.script} (pid {facts.pid})"
        if differ:
            self.report.add(
                "watchdog-loop", self.head, "warn",
                f"{what} runs, but " + "; ".join(differ),
                "set the watchdog: section from the script (spark-ops init writes it)",
            )  # fmt: skip
            return
        every = f"probes every {facts.interval_s:g} s, " if facts.interval_s else ""
        fails = f"restarts after {facts.failures} failures, " if facts.failures else ""
        grace = f"grace {facts.grace_s:g} s, " if facts.grace_s is not None else ""
        self.report.add(
            "watchdog-loop", self.head, "ok",
            f"{what} runs: {every}{fails}{grace}budget "
            f"{_per(facts.max_restarts, facts.window_s)}; no forced restart (planned restarts "
            "run restart_command, the launcher's stop and start)",
        )  # fmt: skip

    async def check_restart_policy(self) -> None:
        """The engine's unit or container restart policy, read as the budget it implies."""
        if not self.up(self.head):
            return
        policy = await engine_policy(self.session)
        if policy is None:
            return
        if not isinstance(policy, RestartPolicy):
            self.report.add(
                "restart-policy", self.head, "warn", f"could not be read: {policy}",
                "check engine.log in the inventory",
            )  # fmt: skip
            return
        if policy.unlimited:
            fix = (
                "give the unit a start limit that can trip: StartLimitIntervalSec= longer than "
                "(StartLimitBurst + 1) x (RestartSec + the engine's time to fail)"
                if policy.kind == "systemd"
                else f"docker update --restart on-failure:3 {policy.name}"
            )
            self.report.add("restart-policy", self.head, "warn", policy.describe(), fix)
            return
        self.report.add("restart-policy", self.head, "ok", policy.describe())
