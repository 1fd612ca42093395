"""One exception tree rooted in SparkOpsError, and the exit codes (only the CLI maps them)."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import Any, Protocol


class ExitStatus(enum.IntEnum):
    """Process exit codes of spark-ops; documented in docs/exit-codes.md."""

    OK = 0
    ERROR = 1  # an unexpected failure
    USAGE = 2  # bad command line (click's own code)
    INVENTORY = 3  # inventory missing or invalid
    UNREACHABLE = 4  # a node could not be reached or authenticated
    RECIPE = 5  # recipe unreadable, or a knob value vLLM would reject
    LOCKED = 6  # another operator holds the cluster lock
    BOOT_FAILED = 7  # the engine failed to come up (fail-fast)
    TIMEOUT = 8  # a deadline passed
    ABORTED = 9  # the operator declined, or interrupted
    BUDGET = 10  # restart history / budget problem (ambiguous stamp, unparseable file)
    CHECK_FAILED = 11  # doctor / verify found a problem
    REMOTE = 12  # a remote command failed
    DEGRADED = 13  # status: the engine serves, but something needs a look (node down, budget ...)
    NOT_SERVING = 14  # status: the engine does not answer
    RESTARTING = 15  # status: a run holds the lock (a restart under way)
    OVER_BUDGET = 16  # a restart refused: the watchdog's restart budget is spent (--over-budget)
    PLAN_CHANGED = 17  # the cluster changed between the plan shown and the answer: nothing run
    OUTPUT = 18  # stdout (or a file written) could not take the output: closed pipe, full disk
    CONFLICT = 19  # local state forbids it: already running, nothing running, a run recorded
    MISSING = 20  # an optional module this option needs is not installed
    EXPERIMENTING = 21  # status: an experiment holds the lock (its restarts and sweeps go on)
    WEDGED = 22  # status: /health answers, token counters frozen with requests running
    REGRESSED = 23  # apply --prove / rollout: the gate failed, the change was rolled back
    ROLLOUT_STOPPED = 24  # rollout: stopped (a regression) or clusters skipped; others untouched


class SparkOpsError(Exception):
    """Base of every error spark-ops raises on purpose."""

    exit_status: ExitStatus = ExitStatus.ERROR

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        """Keep a human message and an optional hint on how to fix it."""
        super().__init__(message)
        self.message = message
        self.hint = hint

    def to_dict(self) -> dict[str, object]:
        """Serialize for --json output."""
        data: dict[str, object] = {"error": type(self).__name__, "message": self.message}
        if self.hint:
            data["hint"] = self.hint
        return data


class InventoryError(SparkOpsError):
    """The inventory file is missing or invalid (names the file and the key)."""

    exit_status = ExitStatus.INVENTORY


class FleetError(InventoryError):
    """The fleet file is missing or invalid, or names no such cluster (names the file and key)."""


class NeedsCluster(SparkOpsError):
    """Under a fleet, a command that changes things was given no --cluster (names the clusters)."""

    exit_status = ExitStatus.USAGE


class RecipeError(SparkOpsError):
    """A recipe cannot be read, edited or rendered."""

    exit_status = ExitStatus.RECIPE


class KnobError(RecipeError):
    """A knob value vLLM would reject."""


class UnsupportedRecipe(RecipeError):
    """The recipe has a shape spark-ops refuses to edit rather than guess."""


class RemoteError(SparkOpsError):
    """A remote operation failed on a host."""

    exit_status = ExitStatus.REMOTE

    def __init__(self, host: str, message: str, *, hint: str | None = None) -> None:
        """Prefix the message with the host it concerns."""
        super().__init__(f"{host}: {message}", hint=hint)
        self.host = host


class WriteError(RemoteError):
    """An all-or-nothing write stopped; `written` names the copies it left changed ("host:path").

    Empty when every node was put back (the usual case): the caller's audit lists `written` as
    what this run changed, whatever the error.
    """

    def __init__(
        self, host: str, message: str, *, hint: str | None = None, written: Sequence[str] = ()
    ) -> None:
        """Keep the message, the hint and the copies left written."""
        super().__init__(host, message, hint=hint)
        self.written = list(written)

    def to_dict(self) -> dict[str, object]:
        """Serialize with the copies left written."""
        data = super().to_dict()
        data["written"] = self.written
        return data


class FileChanged(WriteError):
    """Someone changed a file between the read the plan was made from and the rename over it."""

    def __init__(
        self, host: str, path: str, expected: str, found: str, *, when: str, undone: str
    ) -> None:
        """Name the node, the path, the digest the plan expected and the one found."""
        super().__init__(
            host,
            f"{path} changed {when}: someone else (a colleague, an editor) changed it (sha256 "
            f"expected {_digest(expected)}, found {_digest(found)}); nothing written{undone}",
            hint="look at their change, then run the command again: its plan is then made from "
            "the new content",
        )
        self.path = path
        self.expected = expected
        self.found = found


class WriteNotUndone(WriteError):
    """A write failed on one node and putting another node back failed too: copies disagree."""

    def __init__(
        self,
        host: str,
        message: str,
        *,
        states: dict[str, str],
        written: Sequence[str],
        hint: str | None = None,
    ) -> None:
        """Keep each copy's state ("host:path" -> new / old / changed by someone / unknown)."""
        super().__init__(host, message, hint=hint, written=written)
        self.states = dict(states)

    def to_dict(self) -> dict[str, object]:
        """Serialize with every copy's state."""
        data = super().to_dict()
        data["states"] = self.states
        return data


def _digest(sha: str) -> str:
    """A sha256 as errors show it: its first 12 hex digits, or the word for a missing file."""
    return "(no file)" if sha == "absent" else sha[:12]


class ConnectError(RemoteError):
    """A node did not answer SSH, or refused us."""

    exit_status = ExitStatus.UNREACHABLE

    def __init__(self, host: str, message: str, *, hint: str | None = None) -> None:
        """Keep the message; without a hint of its own, say what to do about a node down."""
        super().__init__(
            host,
            message,
            hint=hint
            or f"is {host} up, and its sshd listening? `spark-ops doctor` checks every node and "
            "names the fix",
        )


class HostKeyError(ConnectError):
    """A node's host key is unknown or changed."""


class AuthError(ConnectError):
    """A node refused our credentials."""


class CommandError(RemoteError):
    """A remote command exited non-zero."""

    def __init__(self, host: str, command: str, exit_code: int | None, stderr: str = "") -> None:
        """Keep the command, its exit code and the tail of its stderr."""
        tail = [one_line(line, 300) for line in stderr.strip().splitlines()[-3:]]
        detail = f": {' | '.join(tail)}" if tail else ""
        shown = one_line(command, 200)  # named, never shown whole
        super().__init__(host, f"command failed (exit {exit_code}): {shown}{detail}")
        self.command = command
        self.exit_code = exit_code
        self.stderr = stderr


def one_line(text: str, limit: int) -> str:
    """Text for one line of an error: control characters escaped (a newline or an escape
    sequence never forges a line on the terminal), cut to `limit` saying how long it was."""
    cut = text if len(text) <= limit else text[:limit]
    shown = "".join(c if c.isprintable() else repr(c)[1:-1] for c in cut)
    return shown if cut is text else f"{shown}… ({len(text):,} characters)"


class CommandTimeout(RemoteError):
    """A remote command ran past its timeout."""

    exit_status = ExitStatus.TIMEOUT

    @classmethod
    def after(cls, host: str, seconds: float, command: str) -> CommandTimeout:
        """The error for `command` (as the caller names it) past `seconds` on host."""
        return cls(host, f"command timed out after {seconds:.0f}s: {one_line(command, 120)}")


class LockError(SparkOpsError):
    """Another operator holds the cluster lock."""

    exit_status = ExitStatus.LOCKED


class WatchdogError(SparkOpsError):
    """The watchdog contract was not met (trigger failed, files unreadable)."""

    exit_status = ExitStatus.BUDGET


class HistoryError(WatchdogError):
    """The restart history cannot be read or changed safely."""


class HistoryLockBusy(HistoryError):
    """The history's lock stayed held past the timeout (the watchdog, or another writer)."""

    def __init__(
        self,
        message: str,
        *,
        lock: str = "",
        holders: Sequence[dict[str, object]] = (),
        hint: str | None = None,
    ) -> None:
        """Keep the lock file and the processes the head saw with it open."""
        super().__init__(message, hint=hint)
        self.lock = lock
        self.holders = list(holders)


class TriggerFailed(RemoteError):
    """The watchdog's restart command exited non-zero (docs/exit-codes.md: 12)."""


class AmbiguousStamp(WatchdogError):
    """More than one new stamp appeared around a planned restart: none is pruned."""


class BootUnderWayError(SparkOpsError):
    """A restart refused: the engine is booting (a watchdog's own restart, a colleague's), and
    killing that boot is never the quiet moment a restart waits for."""

    exit_status = ExitStatus.RESTARTING


class BudgetFact(Protocol):
    """A budget a refusal was made on (workflows/facts.py's gates): what its JSON is."""

    def to_json(self) -> dict[str, Any]:
        """The budget as JSON."""


class OverBudget(SparkOpsError):
    """A planned restart refused: the watchdog's budget has no slot left (or cannot be read)."""

    exit_status = ExitStatus.OVER_BUDGET

    def __init__(
        self, message: str, *, budget: BudgetFact | None = None, hint: str | None = None
    ) -> None:
        """Keep the budget the refusal was made on (used, allowed, next free slot): the gate
        itself (workflows/facts.py), read by its attributes."""
        super().__init__(message, hint=hint)
        self.gate = budget

    @property
    def budget(self) -> dict[str, object]:
        """The budget as the error's JSON holds it ({} when none was given)."""
        return self.gate.to_json() if self.gate is not None else {}

    def to_dict(self) -> dict[str, object]:
        """Serialize with the budget."""
        data = super().to_dict()
        data["budget"] = self.budget
        return data


class PlanChanged(SparkOpsError):
    """The cluster changed between the plan shown and the answer: the run executes nothing."""

    exit_status = ExitStatus.PLAN_CHANGED

    def __init__(self, message: str, *, changes: Sequence[str], hint: str | None = None) -> None:
        """Keep one line per difference between the plan shown and the plan now."""
        super().__init__(message, hint=hint)
        self.changes = list(changes)

    def to_dict(self) -> dict[str, object]:
        """Serialize with what changed."""
        data = super().to_dict()
        data["changes"] = self.changes
        return data


class BootError(SparkOpsError):
    """The engine failed to come up; carries the phase and the log lines that show why."""

    exit_status = ExitStatus.BOOT_FAILED

    def __init__(
        self, message: str, *, phase: str = "", lines: Sequence[str] = (), hint: str | None = None
    ) -> None:
        """Keep the phase reached and the evidence lines."""
        super().__init__(message, hint=hint)
        self.phase = phase
        self.lines = list(lines)

    def to_dict(self) -> dict[str, object]:
        """Serialize with phase and evidence."""
        data = super().to_dict()
        data.update(phase=self.phase, lines=self.lines)
        return data


class BootTimeout(BootError):
    """The boot deadline passed before the engine served a completion."""

    exit_status = ExitStatus.TIMEOUT


class VerifyError(SparkOpsError):
    """A post-boot or preflight check failed."""

    exit_status = ExitStatus.CHECK_FAILED


class BenchError(SparkOpsError):
    """A throughput sweep could not run: an option, a file or a result it was given is wrong."""

    exit_status = ExitStatus.USAGE


class BenchUnreachable(BenchError):
    """The server a sweep targets does not answer, or answers nothing usable."""

    exit_status = ExitStatus.NOT_SERVING


class MissingModule(SparkOpsError):
    """An option needs an optional Python module that is not installed (names the extra)."""

    exit_status = ExitStatus.MISSING


class ConflictError(SparkOpsError):
    """Local state forbids the command now (already running, nothing running, a run recorded)."""

    exit_status = ExitStatus.CONFLICT


class OutputError(SparkOpsError):
    """stdout or an output file could not be written (a closed pipe, a full disk)."""

    exit_status = ExitStatus.OUTPUT


class Aborted(SparkOpsError):
    """The operator declined or interrupted the operation."""

    exit_status = ExitStatus.ABORTED


class Interrupted(Aborted):
    """SIGINT or SIGTERM stopped a run after its current atomic unit; says where things stand."""

    def __init__(
        self, message: str, *, standing: Sequence[str] = (), hint: str | None = None
    ) -> None:
        """Keep the plain lines on the recipe, engine, stamp and checks."""
        super().__init__(message, hint=hint)
        self.standing = list(standing)

    def to_dict(self) -> dict[str, object]:
        """Serialize with where the cluster stands."""
        data = super().to_dict()
        data["standing"] = self.standing
        return data


class InputError(SparkOpsError):
    """A value given to spark-ops cannot be sent or written safely (refused before any change)."""

    exit_status = ExitStatus.USAGE


def excerpt(value: object, limit: int = 60) -> str:
    """A value as it may appear in an error: its repr cut to about `limit` characters, never whole.

    A mapping or a sequence is named by its type and size: walking one built from YAML aliases
    would expand gigabytes.
    """
    if isinstance(value, dict | list | tuple | set):
        return f"<{type(value).__name__} of {len(value)} items>"
    if isinstance(value, int) and value.bit_length() > 4 * limit:  # repr: past 4,300 digits, fails
        return f"<an integer of {value.bit_length():,} bits>"
    if not isinstance(value, str):
        shown = repr(value)
        return shown if len(shown) <= limit else shown[:limit] + "…"
    if len(value) <= limit:
        return repr(value)
    return repr(value[:limit]) + f"… ({len(value):,} characters)"
