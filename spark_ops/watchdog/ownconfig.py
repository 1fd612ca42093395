"""The watchdog's own config as the contract reads it on the head, and the inventory checked
against it: whose restart budget is counted (BudgetLimits), and whether the history and pause
files the inventory names are the ones the watchdog uses (a budget or a lease read from another
file would be false)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from spark_ops.errors import HistoryError, SparkOpsError
from spark_ops.remote import ClusterSession
from spark_ops.remote.programs.node import HOME
from spark_ops.watchdog.config import (
    WatchdogConfig,
    WatchdogConfigError,
    config_of_commands,
    parse_config,
    runs_reference_watchdog,
)
from spark_ops.yamlsafe import load_yaml


@dataclass(frozen=True)
class BudgetLimits:
    """The restart budget the watchdog enforces: its own config's when spark-ops can read it
    (the `--config FILE` of its commands, or the reference watchdog's default), else the
    inventory's `watchdog.budget`; `disagreement` says when the inventory says otherwise."""

    max_restarts: int
    window_s: float
    source: str
    disagreement: str = ""


def _per(max_restarts: int, window_s: float) -> str:
    """A budget in words: "2 per 6 h"."""
    return f"{max_restarts} per {window_s / 3600:g} h"


def _at_home(path: str, home: str) -> str:
    """A head path with its leading ~/ as the SSH user's home."""
    return home + path[1:] if path.startswith("~/") and home else path


def _shown(path: str, home: str) -> str:
    """A head path under the SSH user's home as ~/... (as an operator writes it)."""
    return "~" + path[len(home) :] if home and path.startswith(home + "/") else path


@dataclass(frozen=True)
class OwnConfig:
    """The watchdog's own config as read on the head: parsed, or why not."""

    path: str | None  # the file (None: the commands name none and are not the reference's)
    where: str  # head:path, for messages
    config: WatchdogConfig | None
    why: str = ""  # why config is None


class OwnConfigChecks:
    """The contract's side of the watchdog's own config: read it, and check the inventory's
    budget, history and pause file against it."""

    def __init__(self, session: ClusterSession) -> None:
        """Bind to a connected session."""
        self.session = session
        self.cluster = session.cluster
        self.wd = session.cluster.watchdog
        self.head = session.cluster.head.name

    async def own_config(self, home: str = "") -> OwnConfig:
        """The watchdog's own config, read on the head and parsed (config_of_commands says which
        file); never raises. `home`: the SSH user's home, to place a `~/` config's paths."""
        path = config_of_commands(self.wd.restart_command, self.wd.status_command)
        if path is None:
            return OwnConfig(
                None, "", None,
                "the watchdog's commands name no config (--config FILE) and do not run the "
                "reference spark-watchdog",
            )  # fmt: skip
        where = f"{self.head}:{path}"
        if not path.startswith(("/", "~/")):
            return OwnConfig(
                path, where, None,
                f"its config {path!r} is a relative path: which file depends on the directory "
                "the command runs in (name it with an absolute path or ~/)",
            )  # fmt: skip
        try:
            text = await self.session.read_file(self.head, path, sudo=True)
        except SparkOpsError as exc:
            return OwnConfig(path, where, None, f"its config {where} cannot be read: {exc.message}")
        if text is None:
            return OwnConfig(path, where, None, f"no watchdog config at {where}")
        source = _at_home(path, home)  # (path starts with / or ~/)
        try:
            data = load_yaml(text, source=where, error=WatchdogConfigError)
            return OwnConfig(path, where, parse_config(data, source=source))
        except SparkOpsError as exc:
            return OwnConfig(path, where, None, f"its config {where} cannot be read: {exc.message}")

    async def _own_at_home(self) -> tuple[str, OwnConfig]:
        """The SSH user's home on the head, and the watchdog's own config read there."""
        home_res = await self.session.call(self.head, HOME)
        home = home_res.strip() if home_res else ""
        return home, await self.own_config(home)

    async def limits(self) -> BudgetLimits:
        """The budget the watchdog itself enforces (see BudgetLimits); never raises."""
        ours = BudgetLimits(
            self.wd.max_restarts, float(self.wd.window_s), "the inventory's watchdog.budget"
        )
        found = await self.own_config()
        reference = runs_reference_watchdog(self.wd.restart_command) or runs_reference_watchdog(
            self.wd.status_command or ""
        )
        if found.config is None and not reference:
            return ours  # another watchdog (its --config is its own format): the inventory's
        if found.config is None:  # the reference watchdog, whose config could not be read
            return BudgetLimits(
                ours.max_restarts, ours.window_s, ours.source,
                f"{found.why}: counted against the inventory's watchdog.budget "
                f"({_per(ours.max_restarts, ours.window_s)}), which the watchdog may not enforce",
            )  # fmt: skip
        own, where = found.config.budget, found.where
        theirs = BudgetLimits(own.max, float(own.window), f"the watchdog's config {where}")
        if (own.max, float(own.window)) == (ours.max_restarts, ours.window_s):
            return theirs
        return BudgetLimits(
            own.max, float(own.window), theirs.source,
            f"the inventory's watchdog.budget ({_per(ours.max_restarts, ours.window_s)}) "
            f"disagrees with the watchdog's config {where} ({_per(own.max, own.window)}), which "
            "the watchdog enforces: counted against the watchdog's; set watchdog.budget: "
            f"{{max_restarts: {own.max}, window_s: {own.window:g}}} in the inventory",
        )  # fmt: skip

    async def check_history_is_the_watchdogs(self, data: dict[str, Any]) -> None:
        """Refuse a budget read from a file the watchdog does not count (issue 30 #6): another
        file than the one the watchdog's own config names, or a history that does not exist
        with no config to tell. HistoryError names watchdog.history_file. (A history that did
        not move when the watchdog restarted is caught by the restart itself: execute's
        history_unmoved; a journal record alone is no proof, an operator may edit by hand.)

        budget(), and so every view (`budget`, `status`, `doctor`, the gate, `serve`,
        `/metrics`), goes through it: none shows "0/2 used" counted from the wrong file.
        """
        wd, key = self.wd, "watchdog.history_file"
        home, own = await self._own_at_home()
        said = own.config.paths.history if own.config is not None else None
        shown = _shown(said or "", home)
        fix = (
            f"set {key}: {shown} in the inventory (and lock_file / journal_file beside it)"
            if said
            else f"set {key} to the history file your watchdog writes (its config names it)"
        )
        if said is not None and said != _at_home(wd.history_file, home):
            raise HistoryError(
                f"{key} is wrong: {wd.history_file} on {self.head} is not the history the "
                f"watchdog counts; its config {own.where} says {shown}: the budget read here is "
                "not the watchdog's",
                hint=fix,
            )
        if not data.get("exists", True) and said is None and not wd.loops_only:
            # (a loop watchdog's stamps file, named by its own script, appears at its first
            # restart and is gone after a reboot when under /tmp: missing is 0 used)
            raise HistoryError(
                f"{key}: {wd.history_file} does not exist on {self.head}, so the budget the "
                f"watchdog counts is unknown ({own.why})",
                hint=f"{fix}; a watchdog that never restarted yet: create it empty "
                f"(touch {wd.history_file})",
            )

    async def pause_file_disagrees(self) -> str:
        """Why the inventory's watchdog.pause_file is not the pause file the watchdog reads (its
        own config names another: a lease there pauses nothing), or "" when it is, or when no
        config tells (red team F4)."""
        wd = self.wd
        if not wd.pause_file:
            return ""
        home, own = await self._own_at_home()
        said = own.config.paths.pause if own.config is not None else ""
        if not said or said == _at_home(wd.pause_file, home):
            return ""
        shown = _shown(said, home)
        return (
            f"watchdog.pause_file is wrong: {wd.pause_file} on {self.head} is not the pause file "
            f"the watchdog reads; its config {own.where} says {shown}: a lease there pauses "
            f"nothing (set watchdog.pause_file: {shown} in the inventory)"
        )
