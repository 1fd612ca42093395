"""init's look for the watchdog on the head: the reference spark-watchdog (its config names every
file), a watchdog that only loops (recognised from what runs), or a community bash script and
its stamps history."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from spark_ops.discover.head import HeadProbe, api_url, tilde
from spark_ops.discover.options import BASH_WATCHDOGS, HISTORY_GLOBS, WATCHDOG_CONFIG
from spark_ops.errors import SparkOpsError
from spark_ops.remote.programs.discover import FIND_FILES, HAS_RESTART_NOW, WATCHDOG_ON_PATH
from spark_ops.watchdog.config import WatchdogConfigError, parse_config
from spark_ops.watchdog.loop import (
    LoopFacts,
    other_engines,
    pick_loop,
    several_loops,
    split_loops,
    url_port,
    volatile_history,
)
from spark_ops.yamlsafe import load_yaml


class WatchdogProbe(HeadProbe):
    """The watchdog's commands, files and budget, as init writes them into the inventory."""

    async def read_watchdog_config(self) -> dict[str, Any] | None:
        """The reference watchdog's config on the head as {inventory key: value}; None if absent."""
        text = await self.session.read_file(self.head, WATCHDOG_CONFIG)
        if text is None:
            return None
        where = f"{self.head}:{WATCHDOG_CONFIG}"
        try:
            data = load_yaml(text, source=where, error=WatchdogConfigError)
        except WatchdogConfigError as exc:
            self.warn("watchdog", f"{exc.message}; its values were not read")
            return {}
        source = f"{self.home}/{WATCHDOG_CONFIG[2:]}" if self.home else WATCHDOG_CONFIG
        try:
            cfg = parse_config(data, source=source)
        except SparkOpsError as exc:
            self.warn("watchdog", f"{where} is not a valid spark-watchdog config: {exc.message}")
            return {}
        p = cfg.paths
        return {
            "watchdog.history_file": self._path(p.history),
            "watchdog.history_format": p.format,
            "watchdog.lock_file": self._path(p.lock),
            "watchdog.journal_file": self._path(p.journal),
            "watchdog.pause_file": self._path(p.pause),
            "watchdog.gave_up_file": self._path(p.gave_up),
            "watchdog.budget.max_restarts": cfg.budget.max,
            "watchdog.budget.window_s": int(cfg.budget.window),
            "watchdog.probe.interval_s": cfg.probe.interval,
            "watchdog.probe.timeout_s": cfg.probe.timeout,
            "watchdog.probe.failures": cfg.probe.failures,
            "engine.log.path": self._path(p.engine_log),
            "engine.pid_file": self._path(p.pid) if p.pid else None,
            "engine.api.url": cfg.engine.base_url,
            "recipe.path": self._path(cfg.action.recipe) if cfg.action.recipe else None,
            "engine.model": cfg.engine.model,
        }

    async def find_watchdog(self, config: dict[str, Any] | None) -> None:
        """Restart command, history, lock, journal, pause / gave-up files and budget: of the
        reference watchdog, else of a bash script (a loop that runs: `_loop_watchdog`)."""
        if config is not None:
            await self._reference_watchdog(config)
        else:
            await self._bash_watchdog()

    async def _reference_watchdog(self, cfg: dict[str, Any]) -> None:
        """The reference spark-watchdog: its config names every file."""
        ok, where = await self.sh(WATCHDOG_ON_PATH)
        base = f"spark-watchdog --config {WATCHDOG_CONFIG}"
        restart = f"{base} --restart-now --force --reason {{reason}} --by {{by}}"
        if ok:
            self.found(
                "watchdog.restart_command",
                restart,
                f"spark-watchdog at {where.strip()}, config {WATCHDOG_CONFIG}",
            )
        else:
            self.values["watchdog.restart_command"] = restart
            self.warn(
                "watchdog.restart_command",
                f"{WATCHDOG_CONFIG} exists but spark-watchdog is not on the head's PATH for "
                "SSH commands; use its absolute path",
                restart,
            )
        self.values["watchdog.status_command"] = f"{base} --status --json"
        self.values["watchdog.reports_stamp"] = True
        if not cfg:
            self.missing(
                "watchdog.history_file",
                f"{WATCHDOG_CONFIG} could not be read; set the history file the watchdog writes",
            )
            return
        for key in (
            "watchdog.history_file",
            "watchdog.lock_file",
            "watchdog.journal_file",
            "watchdog.pause_file",
            "watchdog.gave_up_file",
            "watchdog.budget.max_restarts",
            "watchdog.budget.window_s",
        ):
            self.found(key, cfg[key], f"from {WATCHDOG_CONFIG}")
        self.values["watchdog.history_format"] = cfg["watchdog.history_format"]
        for key in ("watchdog.probe.interval_s", "watchdog.probe.timeout_s"):
            self.values[key] = cfg[key]
        self.found(
            "watchdog.probe.failures",
            cfg["watchdog.probe.failures"],
            f"from {WATCHDOG_CONFIG}: a probe every {cfg['watchdog.probe.interval_s']:g} s, "
            f"timeout {cfg['watchdog.probe.timeout_s']:g} s (bench and experiment lease beyond it)",
        )
        if cfg.get("engine.pid_file"):
            self.found("engine.pid_file", cfg["engine.pid_file"], f"from {WATCHDOG_CONFIG}")
        for key in ("engine.log.path", "engine.api.url", "recipe.path", "engine.model"):
            if cfg.get(key):
                self.values[f"config:{key}"] = cfg[key]

    async def _loop_watchdog(self, loops: list[LoopFacts]) -> bool:
        """A watchdog that only loops, recognised from what runs on the head (its process, its
        script, its environment): every value it names. False when every loop there probes
        another engine's port (none is this cluster's: said, and nothing of theirs taken)."""
        args = self.values.get("recipe.args")  # not read: the engine's port is not known
        port = url_port(api_url(args)) if args is not None else None
        mine, others = split_loops(loops, port)
        if others:
            self.warn("watchdog.kind", other_engines(others, port))
        facts = pick_loop(loops, port=port)
        if facts is None:
            return False
        if len(mine) > 1:
            self.warn("watchdog.kind", several_loops(mine, facts), "loop")
        where = f"{facts.script} (pid {facts.pid}, running on {self.head})"
        self.found("watchdog.kind", "loop", f"{where} only loops: it has no forced restart")
        if facts.restart_command:
            self.found(
                "watchdog.restart_command", facts.restart_command,
                f"the launcher's stop and start, as {facts.script} runs them",
            )  # fmt: skip
        else:
            self.missing(
                "watchdog.restart_command",
                f"{facts.script}'s restart was not read; write the launcher's stop and start",
            )
        if facts.history_file:
            self.found("watchdog.history_file", facts.history_file, f"the stamps {where} appends")
            self.values["watchdog.history_format"] = "stamps"
            reboot = await volatile_history(self.session, self.head, facts.history_file)
            if reboot:
                self.warn("watchdog.history_file", reboot, facts.history_file)
        for key, value in (
            ("watchdog.pause_file", facts.pause_file),
            ("watchdog.gave_up_file", facts.gave_up_file),
            ("watchdog.grace_s", facts.grace_s),
        ):
            if value is not None:
                self.found(key, value, f"from {facts.script}")
        self.values["watchdog.reports_stamp"] = False
        self.values["watchdog.history_locked"] = facts.history_locked
        if not facts.history_locked:
            self.warn("watchdog.history_locked", f"{facts.script} appends without a lock", False)
        self.values["watchdog.restarts_missing_engine"] = facts.restarts_missing_engine
        if not facts.restarts_missing_engine:
            self.warn(
                "watchdog.restarts_missing_engine",
                f"{facts.script} reads a missing engine as stopped on purpose: after a crash "
                "nothing restarts it (`spark-ops restart` does)",
                False,
            )
        if facts.max_restarts is not None and facts.window_s:
            self.found("watchdog.budget.max_restarts", facts.max_restarts, f"from {facts.script}")
            self.found("watchdog.budget.window_s", int(facts.window_s), f"from {facts.script}")
        return True

    async def _bash_watchdog(self) -> None:
        """A bash watchdog of the community kind: find the script and its stamps history."""
        script = None
        for path in BASH_WATCHDOGS:
            if await self.exists(path):
                script = path
                break
        if script is None:
            self.missing(
                "watchdog.restart_command",
                f"no {WATCHDOG_CONFIG} and no watchdog script at {', '.join(BASH_WATCHDOGS)}; "
                "write your watchdog's forced-restart command (docs/adopting-a-watchdog.md)",
            )
        else:
            ok = await self.session.call(self.head, HAS_RESTART_NOW, script)
            if ok:
                cmd = f"{script} --restart-now --force"
                self.found("watchdog.restart_command", cmd, f"{script} accepts --restart-now")
            else:
                self.missing(
                    "watchdog.restart_command",
                    f"{script} found but it has no --restart-now switch; write the command "
                    "that forces a restart through it (docs/adopting-a-watchdog.md)",
                )
        out = (await self.session.call(self.head, FIND_FILES, *HISTORY_GLOBS)).stdout
        found = [tilde(p.strip(), self.home) for p in out.splitlines() if p.strip()]
        if len(found) == 1:
            self.found("watchdog.history_file", found[0], "the only restart history found")
            self.values["watchdog.history_format"] = "auto"
            parent = str(Path(found[0]).parent)
            for key, name in (
                ("watchdog.pause_file", "pause"),
                ("watchdog.gave_up_file", "gave-up"),
            ):
                if await self.exists(f"{parent}/{name}"):
                    self.found(key, f"{parent}/{name}", "present beside the history")
            if "watchdog.pause_file" not in self.values:
                self.warn(
                    "watchdog.pause_file",
                    "optional, not found beside the history: set watchdog.pause_file (and "
                    "gave_up_file) if your watchdog has them, so doctor and budget report them",
                )
        elif found:
            self.missing(
                "watchdog.history_file",
                f"several restart histories found ({', '.join(found)}); keep the right one",
            )
        else:
            self.missing(
                "watchdog.history_file",
                "no restart history found; set the file your watchdog writes stamps to",
            )
