"""The typed facts a plan is made on and a run records: the budget gate a restart meets, the engine
instance it replaces, how --set / --flag keys were checked, the unfinished runs it finishes.

Each is a frozen dataclass whose `to_json` gives exactly the JSON the plan's `--json`, the journal
and the error reports have always shown, and whose `from_json` reads that JSON back (a saved plan,
a journal's intent). Readers use attributes, never string keys.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# A knob's value as a plan holds it (operation.jsonable: anything else is its text).
KnobValue = str | int | float | bool | None
# A stamp as JSON holds it (watchdog.identify.stamp_json: an integer has no `.0`).
StampValue = int | float | None


@dataclass(frozen=True)
class BudgetGate:
    """The budget a planned restart meets, read (gate.read_gate): the history's own count."""

    used: int
    allowed: int
    remaining: int
    window_s: float
    now: float
    next_free_at: float
    history_file: str
    spent: bool  # no slot left: used >= allowed
    settled: int  # stamps left by dead runs, removed first: not counted
    over_budget_given: bool
    limits_source: str  # the watchdog's own max / window, when readable
    inventory_disagrees: str | None

    def to_json(self) -> dict[str, Any]:
        """The gate as the plan's JSON and the journal hold it."""
        return {
            "used": self.used,
            "allowed": self.allowed,
            "remaining": self.remaining,
            "window_s": self.window_s,
            "now": self.now,
            "next_free_at": self.next_free_at,
            "history_file": self.history_file,
            "spent": self.spent,
            "settled": self.settled,
            "over_budget_given": self.over_budget_given,
            "limits_source": self.limits_source,
            "inventory_disagrees": self.inventory_disagrees,
        }


@dataclass(frozen=True)
class UnreadableBudget:
    """The budget a planned restart meets, unread: kept as its error and refused alike."""

    error: str
    over_budget_given: bool

    def to_json(self) -> dict[str, Any]:
        """The gate as the plan's JSON and the journal hold it."""
        return {"error": self.error, "over_budget_given": self.over_budget_given}


Gate = BudgetGate | UnreadableBudget

# What a gate read back lacks is taken as nothing known of it (a plan of an older version).
_GATE_DEFAULTS: dict[str, Any] = {
    "used": 0, "allowed": 0, "remaining": 0, "window_s": 0.0, "now": 0.0, "next_free_at": 0.0,
    "history_file": "", "spent": False, "settled": 0, "over_budget_given": False,
    "limits_source": "", "inventory_disagrees": None,
}  # fmt: skip


def gate_from_json(data: dict[str, Any]) -> Gate:
    """A gate from its JSON: an `error` makes it unreadable; a name it does not know is refused."""
    if "error" in data:
        return UnreadableBudget(str(data["error"]), bool(data.get("over_budget_given", False)))
    unknown = set(data) - set(_GATE_DEFAULTS)
    if unknown:
        raise TypeError(f"budget gate: unknown fact(s) {sorted(unknown)}")
    return BudgetGate(**{**_GATE_DEFAULTS, **data})


@dataclass(frozen=True)
class EngineFact:
    """The running engine a restart replaces: its instance key, and whether it is alive."""

    instance: str
    alive: bool

    def to_json(self) -> dict[str, Any]:
        """As the plan's JSON holds it."""
        return {"instance": self.instance, "alive": self.alive}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> EngineFact:
        """From the plan's JSON."""
        return cls(str(data["instance"]), bool(data["alive"]))


@dataclass(frozen=True)
class KeysChecked:
    """--set / --flag keys checked against the serve parser of the head's vLLM."""

    version: str | None
    method: str
    detail: str
    cached: bool
    options: int | None  # how many option strings the parser has

    def to_json(self) -> dict[str, Any]:
        """As the plan's JSON holds it."""
        return {
            "version": self.version,
            "method": self.method,
            "detail": self.detail,
            "cached": self.cached,
            "options": self.options,
        }


@dataclass(frozen=True)
class KeysTrusted:
    """--set / --flag keys written unchecked (--trust-keys): no parser answered, and why."""

    trusted: list[str]
    why: str

    def to_json(self) -> dict[str, Any]:
        """As the plan's JSON holds it."""
        return {"trusted": list(self.trusted), "why": self.why}


Keys = KeysChecked | KeysTrusted


def keys_from_json(data: dict[str, Any]) -> Keys:
    """How the keys were checked, from the plan's JSON."""
    if "trusted" in data:
        return KeysTrusted([str(k) for k in data["trusted"]], str(data["why"]))
    return KeysChecked(**data)


@dataclass(frozen=True)
class WindowSummary:
    """A planned restart a run triggered, as status, doctor and --json show it."""

    step: str
    lo: float  # "from": when its restart command began (head clock)
    hi: float  # "to": its return, or its longest time (the run died meanwhile)
    closed: bool
    stamp: StampValue
    pruned: bool

    def to_json(self) -> dict[str, Any]:
        """As the JSON holds it."""
        return {
            "step": self.step, "from": self.lo, "to": self.hi, "closed": self.closed,
            "stamp": self.stamp, "pruned": self.pruned,
        }  # fmt: skip

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> WindowSummary:
        """From the JSON."""
        return cls(
            data["step"], data["from"], data["to"], data["closed"], data["stamp"], data["pruned"]
        )


@dataclass(frozen=True)
class RunSummary:
    """An unfinished run as status, doctor and --json show it (journal.Run.summary)."""

    run: str
    operation: str
    who: str | None
    when: float | None  # head clock, as the head wrote the intent
    last_step: str
    written: list[str]
    restart_windows: list[WindowSummary]
    stamp_pruned: bool
    command: str

    def to_json(self) -> dict[str, Any]:
        """As the JSON holds it."""
        return {
            "run": self.run,
            "operation": self.operation,
            "who": self.who,
            "when": self.when,
            "last_step": self.last_step,
            "written": list(self.written),
            "restart_windows": [w.to_json() for w in self.restart_windows],
            "stamp_pruned": self.stamp_pruned,
            "command": self.command,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RunSummary:
        """From the JSON."""
        windows = [WindowSummary.from_json(w) for w in data["restart_windows"]]
        return cls(**{**data, "restart_windows": windows})


@dataclass(frozen=True)
class HistoryProblem:
    """A restart the watchdog recorded elsewhere than watchdog.history_file: the budget unknown."""

    history_file: str
    recorded_stamp: float
    message: str
    hint: str

    def to_json(self) -> dict[str, Any]:
        """As the outcome's JSON holds it."""
        return {
            "history_file": self.history_file,
            "recorded_stamp": self.recorded_stamp,
            "message": self.message,
            "hint": self.hint,
        }
