"""The watchdog contract's records: the restart budget as the head sees it, what a forced
restart did, and what the watchdog's own status command said."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from spark_ops.watchdog.identify import stamp_json
from spark_ops.watchdog.lease import pause_shown


@dataclass
class BudgetView:
    """The restart budget as the head sees it, with journal reasons and pause / gave-up."""

    used: int
    allowed: int
    window_s: float
    now: float
    next_free_at: float
    stamps: list[dict[str, Any]] = field(default_factory=list)
    paused: bool = False  # a pause in force (a lapsed lease pauses nothing)
    lease: dict[str, Any] | None = None  # the lease the pause file holds, live or lapsed
    gave_up: bool = False
    gave_up_reason: str = ""
    malformed: list[dict[str, Any]] = field(default_factory=list)
    history_file: str = ""
    flagged: list[dict[str, Any]] = field(default_factory=list)  # counted here, maybe not there
    limits_source: str = ""  # whose max / window were counted (the watchdog's config, else ours)
    disagreement: str = ""  # the inventory's watchdog.budget differs from the watchdog's own

    def to_dict(self) -> dict[str, Any]:
        """Serialize for --json."""
        data = {
            "used": self.used,
            "allowed": self.allowed,
            "remaining": max(0, self.allowed - self.used),
            "window_s": self.window_s,
            "now": self.now,
            "next_free_at": self.next_free_at,
            "stamps": self.stamps,
            "paused": self.paused,
            "lease": self.lease,
            "gave_up": self.gave_up,
            "gave_up_reason": self.gave_up_reason,
            "malformed": self.malformed,
            "history_file": self.history_file,
            "flagged": self.flagged,
            "limits_source": self.limits_source,
            "inventory_disagrees": self.disagreement or None,
        }
        shown = pause_shown(data)  # the words every view shows (status, budget, serve)
        data["pause"] = {"state": shown[0], "text": shown[1]} if shown else None
        return data


@dataclass
class Trigger:
    """What a forced restart did: the head's clock around it, its output and its exit."""

    before: float
    after: float
    stamp: float | None  # the stamp it printed; None unless the inventory says reports_stamp
    output: str
    exit_code: int | None = 0
    printed: float | None = None  # a stamp it printed, trusted or not: a restart was recorded
    printed_all: tuple[float, ...] = ()  # every stamp it printed (a command restarting twice)

    def to_dict(self) -> dict[str, Any]:
        """Serialize for reports."""
        return {
            "before": self.before,
            "after": self.after,
            "stamp": stamp_json(self.stamp),
            "exit_code": self.exit_code,
            "printed": self.printed,
            "printed_all": [stamp_json(s) for s in self.printed_all],
        }


@dataclass
class WatchdogStatus:
    """What the watchdog's own status command said (watchdog.status_command), as far as it did.

    `answered` is False when it failed, timed out or printed nothing; `state` is the `state` of a
    JSON object on its last line (the reference watchdog's `--status --json`), else None; `text`
    is a short excerpt of what it printed (or why there is nothing).
    """

    command: str
    answered: bool
    state: str | None = None
    text: str = ""
    exit_code: int | None = None
    fields: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """Serialize for --json."""
        return {
            "command": self.command, "answered": self.answered, "state": self.state,
            "text": self.text, "exit_code": self.exit_code, "fields": self.fields,
        }  # fmt: skip


def status_object(output: str) -> dict[str, Any]:
    """The JSON object on the last non-empty line of a status output, or {}."""
    lines = [x for x in output.strip().splitlines() if x.strip()]
    if not lines or not lines[-1].lstrip().startswith("{"):
        return {}
    try:
        obj = json.loads(lines[-1])
    except ValueError:
        return {}
    return obj if isinstance(obj, dict) else {}
