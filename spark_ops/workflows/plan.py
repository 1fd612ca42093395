"""Plans as data: what an operation will change where (as diffs), the steps it will take, and the
facts it was planned on; and, beside it, the record of a run of it.

`--dry-run` prints a Plan, `--json` serializes it. Executing a plan never changes it: the steps as
they ran (`StepRun`) and what the run found (`RunFacts`) are kept beside it, in the Outcome, so the
plan executed is the plan shown.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from spark_ops.recipe.render import Renderings
from spark_ops.workflows.facts import (
    EngineFact,
    Gate,
    Keys,
    KnobValue,
    RunSummary,
    gate_from_json,
    keys_from_json,
)
from spark_ops.workflows.preflight import PreflightAnswer

if TYPE_CHECKING:
    from spark_ops.remote import WriteOutcome


@dataclass
class FileChange:
    """One file to rewrite on one node: the diff, and the digest of the content planned from."""

    host: str
    path: str
    old_sha: str
    diff: str
    new_text: str = field(repr=False)
    old_text: str = field(default="", repr=False)

    def to_dict(self) -> dict[str, Any]:
        """Serialize without the full texts."""
        return {"host": self.host, "path": self.path, "old_sha256": self.old_sha, "diff": self.diff}


class OperationKind(StrEnum):
    """What a run does (the value is the name the JSON, the journal and the audit show): a plan's
    operation (apply, restart, rollback), or a run journalled apart from any plan."""

    APPLY = "apply"
    RESTART = "restart"
    ROLLBACK = "rollback"
    BUDGET_PRUNE = "budget prune"  # workflows/budget.py
    EXPERIMENT_LOAD = "experiment-load"  # an experiment's sweep under the lease
    BENCH_LOAD = "bench-load"  # bench's load under the lease (workflows/probe_load.py)

    @property
    def planned(self) -> bool:
        """True for the operations a Plan holds."""
        return self in (OperationKind.APPLY, OperationKind.RESTART, OperationKind.ROLLBACK)


class StepKind(StrEnum):
    """Every step a plan or its run can hold (the value is the name the JSON and audit show)."""

    SETTLE = "settle"
    MEASURE = "measure-before"  # apply --prove: the load point measured on the running engine
    WRITE = "write"
    LEASE = "lease"  # pause the watchdog for the disruption (watchdog/lease.py)
    DRAIN = "drain"
    RESTART = "restart"
    BOOT = "boot"
    PRUNE = "prune"
    VERIFY = "verify"
    PROVE = "measure-after"  # apply --prove: the same point again, and the gate's verdict
    BUDGET = "budget"
    ROLLBACK = "rollback"
    RESTART_ROLLBACK = "restart-rollback"
    BOOT_ROLLBACK = "boot-rollback"
    PRUNE_ROLLBACK = "prune-rollback"
    RELEASE = "release"  # end the lease (on every path out)


@dataclass(frozen=True)
class Step:
    """One planned step: what it is, what it will do, on which hosts."""

    name: StepKind
    description: str
    hosts: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        """Take a step's name as given in text ("boot") and its hosts as any sequence."""
        object.__setattr__(self, "name", StepKind(self.name))
        object.__setattr__(self, "hosts", tuple(self.hosts))

    def to_dict(self) -> dict[str, Any]:
        """Serialize for --json (a planned step is pending)."""
        return StepRun(self).to_dict()


@dataclass
class StepRun:
    """A step as a run went through it: the planned step and its outcome."""

    step: Step
    status: str = "pending"  # pending | running | done | skipped | failed
    detail: str = ""
    seconds: float | None = None  # how long it took, once finished
    started: float | None = field(default=None, repr=False)  # monotonic clock, while running

    @property
    def name(self) -> StepKind:
        """The step's kind."""
        return self.step.name

    @property
    def description(self) -> str:
        """What the step does."""
        return self.step.description

    @property
    def hosts(self) -> tuple[str, ...]:
        """Where it runs."""
        return self.step.hosts

    def to_dict(self) -> dict[str, Any]:
        """Serialize for --json."""
        data: dict[str, Any] = {
            "name": self.name.value,
            "description": self.description,
            "hosts": list(self.hosts),
            "status": self.status,
        }
        if self.detail:
            data["detail"] = self.detail
        if self.seconds is not None:
            data["seconds"] = round(self.seconds, 3)
        return data


def _compared(label: str, *, known_only: bool = False) -> dict[str, Any]:
    """A fact's metadata: compared between the plan shown and the plan made under the lock, and
    named `label` when it differs; `known_only`: only when both plans know it (not None)."""
    return {"label": label, "known_only": known_only}


@dataclass
class PlanFacts:
    """What a plan was made on, read from the cluster while planning (None: not read, not known).

    The fields with a label are compared between the plan shown and the plan made under the lock
    (gate.plan_differences); the budget by its own rule.
    """

    knobs_before: dict[str, KnobValue] | None = field(
        default=None, metadata=_compared("the recipe's knobs")
    )
    knobs_after: dict[str, KnobValue] | None = field(
        default=None, metadata=_compared("the knobs after the change")
    )
    vllm_version: str | None = field(
        default=None, metadata=_compared("the engine's vLLM version", known_only=True)
    )
    keys: Keys | None = None  # how --set / --flag keys were checked
    restart_needed: str | None = field(default=None, metadata=_compared("why a restart is needed"))
    preflight: PreflightAnswer | None = None  # the head's vLLM on the edited command line
    backups: dict[str, str] | None = field(  # host -> the backup path
        default=None, metadata=_compared("the backup a rollback restores")
    )
    settles: list[str] | None = field(  # run ids of dead runs this run finishes
        default=None, metadata=_compared("the unfinished runs this run finishes")
    )
    left_stamps: list[str] | None = field(  # the history lines they left
        default=None, metadata=_compared("the stamps unfinished runs left")
    )
    left_stamp_values: list[float] | None = None  # their stamps: the gate counts without
    unfinished: list[RunSummary] | None = None  # the dead runs' summaries
    unproven: list[str] | None = None  # dead apply --prove runs whose change stays, never proven
    checks_owed: str | None = field(  # the run whose restart this run verifies (no restart here)
        default=None, metadata=_compared("the stopped run whose checks this run runs")
    )
    budget: Gate | None = None  # the gate a restart meets (gate.read_gate)
    engine: EngineFact | None = field(  # the running engine's instance key, alive
        default=None, metadata=_compared("the running engine", known_only=True)
    )

    @staticmethod
    def compared() -> list[tuple[str, str, bool]]:
        """(field, label, known_only) of every fact compared between two plans."""
        return [
            (f.name, f.metadata["label"], f.metadata["known_only"])
            for f in dataclasses.fields(PlanFacts)
            if f.metadata.get("label")
        ]

    def to_json(self) -> dict[str, Any]:
        """The facts as --json shows them: the known ones, by name."""
        return {
            f.name: as_json(getattr(self, f.name))
            for f in dataclasses.fields(self)
            if getattr(self, f.name) is not None
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PlanFacts:
        """Facts from their JSON form (unknown names refused: a typo is no fact)."""
        typed: dict[str, Callable[[Any], Any]] = {
            "keys": keys_from_json,
            "unfinished": lambda runs: [RunSummary.from_json(r) for r in runs],
            "budget": gate_from_json,
            "engine": EngineFact.from_json,
            "preflight": PreflightAnswer.from_json,
        }
        return cls(
            **{k: typed[k](v) if k in typed and v is not None else v for k, v in data.items()}
        )


def as_json(value: Any) -> Any:
    """A fact as JSON holds it: a typed fact by its to_json, containers copied through."""
    if hasattr(value, "to_json"):
        return value.to_json()
    if isinstance(value, dict):
        return {k: as_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [as_json(v) for v in value]
    return value


@dataclass
class RunFacts:
    """What a run of a plan found and did, kept beside the plan (never written into it)."""

    run: str | None = None  # the run id of the journal
    written: list[str] | None = None  # host:path of every recipe copy written
    write_backups: list[WriteOutcome] | None = None  # the backups the write made
    kv_pool_before: int | None = None  # the old engine's KV pool, in tokens
    kv_memory_before: int | None = None  # the old engine's KV cache memory (its own report)
    restart_at: float | None = None  # head clock when the restart command began
    printed_stamp: float | None = None  # the stamp the watchdog printed for it
    interrupted_at: str | None = None  # where the first signal found the run

    def to_json(self) -> dict[str, Any]:
        """The known ones, by name."""
        data = {
            f.name: as_json(getattr(self, f.name))
            for f in dataclasses.fields(self)
            if getattr(self, f.name) is not None
        }
        if self.write_backups is not None:
            data["write_backups"] = [w.to_dict() for w in self.write_backups]
        return data


@dataclass
class Plan:
    """What an operation will do: file changes, steps, warnings and the facts it was planned on."""

    operation: OperationKind
    cluster: str
    changes: list[FileChange] = field(default_factory=list)
    steps: list[Step] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    facts: PlanFacts = field(default_factory=PlanFacts)
    # each recipe text the plan read or made, rendered once (never serialized, never compared)
    rendered: Renderings = field(default_factory=Renderings, compare=False, repr=False)

    def __post_init__(self) -> None:
        """Take the operation as given in text ("restart"); one no plan holds is refused."""
        self.operation = OperationKind(self.operation)
        if not self.operation.planned:
            raise ValueError(f"{self.operation.value!r} is not an operation a plan holds")

    def has(self, kind: StepKind) -> bool:
        """True when the plan holds a step of this kind."""
        return any(s.name == kind for s in self.steps)

    @property
    def restarts(self) -> bool:
        """True when the plan restarts the engine."""
        return self.has(StepKind.RESTART)

    def add(self, name: StepKind | str, description: str, hosts: Iterable[str] = ()) -> Step:
        """Append a step."""
        s = Step(StepKind(name), description, tuple(hosts))
        self.steps.append(s)
        return s

    def to_dict(
        self, runs: Iterable[StepRun] | None = None, found: RunFacts | None = None
    ) -> dict[str, Any]:
        """Serialize the plan; with a run's steps and facts, as that run left them."""
        steps = list(runs) if runs is not None else [StepRun(s) for s in self.steps]
        return {
            "operation": self.operation.value,
            "cluster": self.cluster,
            "changes": [c.to_dict() for c in self.changes],
            "steps": [s.to_dict() for s in steps],
            "warnings": self.warnings,
            "facts": {**self.facts.to_json(), **(found.to_json() if found else {})},
        }


class StepRunner:
    """Marks a run's steps running / done / failed with timings, calling a reporter on each."""

    def __init__(self, steps: list[StepRun], report: Callable[[StepRun], None] | None = None):
        """Bind to a run's steps and an optional callable(step)."""
        self.steps = steps
        self.report = report

    def _emit(self, step: StepRun) -> None:
        """Tell the reporter a step changed."""
        if self.report is not None:
            self.report(step)

    def has(self, kind: StepKind) -> bool:
        """True when the run holds a step of this kind."""
        return any(s.name == kind for s in self.steps)

    def step(self, kind: StepKind) -> StepRun:
        """The run's step of this kind."""
        for s in self.steps:
            if s.name == kind:
                return s
        raise KeyError(kind)

    def add(self, step: Step) -> StepRun:
        """A step the run adds (a rollback's), not planned."""
        s = StepRun(step)
        self.steps.append(s)
        return s

    def start(self, kind: StepKind) -> StepRun:
        """Mark a step as running."""
        s = self.step(kind)
        s.status = "running"
        s.started = time.monotonic()
        s.seconds = None
        self._emit(s)
        return s

    def finish(self, kind: StepKind, detail: str = "", status: str = "done") -> StepRun:
        """Mark a step finished with a detail line."""
        s = self.step(kind)
        s.seconds = time.monotonic() - s.started if s.started is not None else None
        s.started = None
        s.status = status
        s.detail = detail
        self._emit(s)
        return s

    def fail(self, kind: StepKind, detail: str) -> StepRun:
        """Mark a step failed."""
        return self.finish(kind, detail, status="failed")

    def skip(self, kind: StepKind, detail: str) -> StepRun:
        """Mark a step skipped."""
        return self.finish(kind, detail, status="skipped")
