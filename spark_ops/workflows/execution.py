"""What a run of a plan holds while it executes, and what a step's runner is.

An `Execution` is everything a run needs (the Operation, the plan, the options, the Outcome being
filled, the step runner, the journal, the boot reporter) and what the steps pass on to each
other (the restart attempt in progress, the failure that stands). A step is one `Row` of the
executor's table (workflows/execute.py): its runner, the work before it starts, whether it is one
atomic unit, whether it runs on every path out. Runners live in workflows/steps.py (the recipe,
the drain, the checks, the budget) and workflows/restart.py (restart, boot, prune).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from spark_ops.engine.watch import EngineWatch
from spark_ops.errors import SparkOpsError
from spark_ops.readiness import BootEvent
from spark_ops.watchdog.contract import Trigger
from spark_ops.watchdog.identify import HistEntry, Identification
from spark_ops.workflows import interrupt
from spark_ops.workflows.disruption import Leases
from spark_ops.workflows.journal import RunJournal
from spark_ops.workflows.operation import ApplyOptions, Operation, Outcome
from spark_ops.workflows.plan import Plan, StepKind, StepRunner

if TYPE_CHECKING:
    from spark_ops.workflows.prove import ProofReporter

EventReporter = Callable[[BootEvent], None]


@dataclass
class Attempt:
    """One restart in progress (apply's, or a rollback's): what was seen before it, what it did."""

    before: list[HistEntry]  # the history just before the trigger
    flags_before: dict[str, bool]  # the watchdog's pause / gave-up files before it
    start_at: int | None  # the engine log's size, where following begins
    clock_before: float  # the head's clock before the trigger
    watch: EngineWatch  # the outgoing engine instance, and which one runs now
    trigger: Trigger | None = None  # the restart command's outcome, once it returned
    found: Identification | None = None  # this restart's history entry, once identified
    stamp_error: SparkOpsError | None = None  # why none can be pruned (ambiguous)


@dataclass
class Execution:
    """A run of a plan: what every step needs, and what the steps hand on to each other."""

    op: Operation
    plan: Plan
    opts: ApplyOptions
    out: Outcome
    run: StepRunner
    journal: RunJournal
    on_event: EventReporter | None = None
    on_proof: ProofReporter | None = None  # told of measure-before's proof (a rollout journals it)
    paused: bool = False  # the drain stopped new work (/pause): resumed if no restart began
    attempt: Attempt | None = None  # the restart in progress
    entered: set[StepKind] = field(default_factory=set)  # the steps the loop reached
    failure: BaseException | None = None  # the failure that stands (a later one replaces it)
    quiet: bool = False  # a boot under way was waited out before the first disruption
    leases: Leases = field(init=False)  # the watchdog leases this run holds (ended on every way)

    def __post_init__(self) -> None:
        """The run's leases carry its journal run id (a dead run's are found by it)."""
        self.leases = Leases(self.op, self.journal.run)

    def began(self, kind: StepKind) -> bool:
        """True when the run holds this step and it has started (it is no longer pending)."""
        return any(s.name == kind and s.status != "pending" for s in self.run.steps)


@dataclass(frozen=True)
class Done:
    """What a runner returns: the step's detail line, its status, facts for its journal record."""

    detail: str = ""
    status: str = "done"  # done | skipped | failed
    journal: dict[str, Any] | None = None  # attached to the step's journal record


Runner = Callable[[Execution, StepKind], Awaitable[Done]]
Prepare = Callable[[Execution, StepKind], Awaitable[None]]
Predicate = Callable[[Execution], bool]


@dataclass(frozen=True)
class Row:
    """One kind of step in the executor's table: its runner and how the loop runs it."""

    run: Runner  # the step's work, between its start and its finish
    prepare: Prepare | None = None  # reads before the step starts (outside its atomic unit)
    atomic: bool = False  # start to journal record as one unit: a signal waits for its end
    always: bool = False  # runs on every path out (a finally), when `when` holds
    when: Predicate | None = None  # whether it runs at all (else it stays pending)
    engine: bool = False  # needs the engine's API resolved (a tunnel) before anything changes
    fails: bool = False  # a runner's error marks the step failed (else the runner says)
    recovers: Predicate | None = None  # runs only to recover the failure that stands

    def wanted(self, ex: Execution) -> bool:
        """Whether the loop runs this step now, given the failure that stands."""
        if self.recovers is not None:
            return ex.failure is not None and self.recovers(ex)
        if ex.failure is not None and not self.always:
            return False
        return self.when is None or self.when(ex)


def failure_text(exc: BaseException) -> str:
    """A failed step's detail: the error's message, or the signal that interrupted it."""
    if isinstance(exc, asyncio.CancelledError | KeyboardInterrupt):
        return f"interrupted ({interrupt.received() or 'Ctrl-C'})"
    return getattr(exc, "message", None) or repr(exc)
