"""The run journal: an intent record on the head before the first change, then each step's outcome.

Every command that changes the cluster (apply, restart, rollback, budget prune, the experiment's
applies) is one *run* with an id. Before anything is changed, its `intent` entry is appended to the
head's audit log: who, the command, what will be written (per node: path, digest before and
after), whether a planned restart will be triggered. Each step then appends its outcome under the
same run id (`step` entries); the run closes with its `end` entry, the audit entry spark-ops always
wrote. A run killed by SIGKILL leaves its intent and the steps it finished, so the audit says how
far it got, and the next run reads it back (`read_runs`, `Run.unfinished`): a restart triggered and
never pruned has its head-clock window recorded, which is how its stamp is found later.
"""

from __future__ import annotations

import math
import os
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from spark_ops import audit
from spark_ops.errors import SparkOpsError
from spark_ops.remote import ClusterSession, sha256
from spark_ops.watchdog.identify import stamp_json
from spark_ops.workflows.facts import RunSummary, WindowSummary
from spark_ops.workflows.operation import Operation
from spark_ops.workflows.plan import OperationKind, Plan, StepKind, StepRun

INTENT, STEP, END = "intent", "step", "end"
AUDIT_TAIL = 2000  # entries read back to find unfinished runs (a run writes about ten)
TRIGGER_WINDOW_S = 600.0  # a killed run's restart command may have stamped until then
STAMP_GRACE_S = 120.0  # an unmarked stamp is taken for a dead run's only this long after its
# restart command began (or returned: an asynchronous watchdog stamps after it returns)


def new_run_id() -> str:
    """A short unique run id: the local time and random hex."""
    return time.strftime("%Y%m%dT%H%M%S") + "-" + secrets.token_hex(3)


@dataclass
class RestartWindow:
    """A planned restart a run triggered: when, the lines it saw just before, whether pruned."""

    step: str
    lo: float
    hi: float  # the command's return (closed), or its longest time (the run died meanwhile)
    known: list[str]
    pruned: bool
    closed: bool = False  # the restart command returned while the run lived
    stamp: float | None = None  # identified while the run lived

    @property
    def grace_end(self) -> float:
        """Until when an unmarked new stamp may be this restart's."""
        return (self.hi if self.closed else self.lo) + STAMP_GRACE_S

    def summary(self) -> WindowSummary:
        """What status, doctor and --json show of it."""
        return WindowSummary(
            self.step, self.lo, self.hi, self.closed, stamp_json(self.stamp), self.pruned
        )

    def to_dict(self) -> dict[str, Any]:
        """Serialize for --json."""
        return self.summary().to_json()


@dataclass
class Run:
    """One run as the audit log holds it: its intent, step records and end (if it ended)."""

    run: str
    intent: dict[str, Any]
    steps: list[dict[str, Any]] = field(default_factory=list)
    end: dict[str, Any] | None = None
    settled_by: str | None = None

    @property
    def operation(self) -> str:
        """apply, restart, rollback, budget prune, ..."""
        what = self.intent.get("what")
        return str(what.get("operation", "?")) if isinstance(what, dict) else "?"

    @property
    def command(self) -> str:
        """The command line the operator ran, as recorded (shell-quoted)."""
        return str(self.intent.get("command") or f"spark-ops {self.operation}")

    @property
    def unfinished(self) -> bool:
        """Began (an intent) and neither ended nor was finished by a later run."""
        return self.end is None and self.settled_by is None

    def step(self, name: str) -> dict[str, Any] | None:
        """Every record of a step merged in order (the last status wins), or None."""
        found: dict[str, Any] | None = None
        for rec in self.steps:
            if rec.get("step") == name:
                found = {**(found or {}), **rec}
        return found

    @property
    def last_step(self) -> str:
        """The name and status of the last step recorded ('intent' when none)."""
        if not self.steps:
            return "its intent (no step recorded: a write may have landed; the recipe tells)"
        rec = self.steps[-1]
        return f"{rec.get('step')} {rec.get('status')}"

    @property
    def written(self) -> list[str]:
        """host:path of every recipe copy the run's write step committed."""
        rec = self.step("write") or {}  # a failed write names what its undo could not put back
        written = rec.get("written")
        return [str(w) for w in written] if isinstance(written, list) else []

    @property
    def planned_writes(self) -> list[tuple[str, str]]:
        """(host, path) of every write its intent announced (a record not of that shape: none)."""
        detail = self.intent.get("detail")
        writes = detail.get("writes") if isinstance(detail, dict) else None
        return [
            (w["host"], w["path"])
            for w in (writes if isinstance(writes, list) else [])
            if isinstance(w, dict) and isinstance(w.get("host"), str)
            and isinstance(w.get("path"), str)
        ]  # fmt: skip

    def restart_windows(self) -> list[RestartWindow]:
        """Every planned restart it triggered (apply's, a rollback's) and its clock window.

        A record whose values are not numbers (a hand-edited or forged line) opens no window.
        """
        out = []
        for rec in self.steps:
            name = str(rec.get("step", ""))
            if not name.startswith("restart") or "window_from" not in rec:
                continue
            merged = self.step(name) or rec
            lo = finite_number(rec.get("window_from"))
            if lo is None:
                continue
            hi = finite_number(merged.get("window_to"))
            prune = self.step("prune" + name[len("restart") :])
            known = rec.get("known")
            out.append(
                RestartWindow(
                    name,
                    lo,
                    hi if hi is not None else lo + TRIGGER_WINDOW_S,
                    [str(r) for r in known] if isinstance(known, list) else [],
                    prune is not None and prune.get("status") in ("done", "skipped"),
                    closed=hi is not None,
                    stamp=finite_number(merged.get("stamp")),
                )
            )
        return out

    @property
    def last_grace_end(self) -> float | None:
        """When the grace of its last restart command ends on the head's clock (None: no restart):
        until then the watchdog may be between stopping the engine and starting the new one."""
        windows = self.restart_windows()
        return windows[-1].grace_end if windows else None

    @property
    def pruned(self) -> bool:
        """Every planned stamp it made was pruned (or it recorded there was none)."""
        return all(w.pruned for w in self.restart_windows())

    def summary(self) -> RunSummary:
        """What status, doctor and --json show of an unfinished run."""
        return RunSummary(
            run=self.run,
            operation=self.operation,
            who=who if isinstance(who := self.intent.get("who"), str) else None,
            when=finite_number(self.intent.get("when")),
            last_step=self.last_step,
            written=self.written,
            restart_windows=[w.summary() for w in self.restart_windows()],
            stamp_pruned=self.pruned,
            command=self.command,
        )


def runs_of(entries: Sequence[dict[str, Any]]) -> list[Run]:
    """Group audit entries into runs (entries without a run id are older, single entries).

    A run that names dead runs in its intent (`settles`) finishes them only once it did: its
    settle step done, or its end recorded as ok. A settler killed in turn leaves them unfinished.
    Entries of the wrong shape (a hand-edited or forged line) are skipped, and so is every entry
    whose account the head's program did not write (`audit.is_attributed`): a forged intent never
    leads to a prune or a restart.
    """
    runs: dict[str, Run] = {}
    for e in entries:
        if not audit.is_attributed(e):
            continue
        rid = e.get("run")
        if not isinstance(rid, str):
            continue
        phase = e.get("phase")
        if phase == INTENT:
            runs[rid] = Run(rid, e)
        elif rid in runs and phase == STEP and isinstance(e.get("steps"), list):
            runs[rid].steps.extend(s for s in e["steps"] if isinstance(s, dict))
        elif rid in runs and phase == END:
            runs[rid].end = e
    for r in runs.values():
        settles = r.intent.get("settles")
        if not isinstance(settles, list) or not settles:
            continue
        settle = (r.step("settle") or {}).get("status")
        if settle == "done" or (r.end is not None and r.end.get("outcome") == "ok"):
            for other in settles:
                if isinstance(other, str) and other in runs and runs[other].end is None:
                    runs[other].settled_by = r.run
    return list(runs.values())


def grace_left(grace_end: float, now: float) -> float:
    """Seconds left of a restart's grace ending at `grace_end` at the head's clock `now`; 0 once
    it ended, and for a grace longer than STAMP_GRACE_S (its command later than now: a forged
    journal line, or the head's clock stepped back), which would hold off restarts for ever."""
    left = grace_end - now
    return left if 0 < left <= STAMP_GRACE_S else 0.0


def finite_number(value: Any) -> float | None:
    """A finite number from a record, or None (an integer past a float's range too)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:  # a hand-written 10**400
        return None
    return number if math.isfinite(number) else None


async def read_runs(session: ClusterSession, limit: int = AUDIT_TAIL) -> list[Run]:
    """The runs of the audit log's last `limit` entries, oldest first."""
    return runs_of(await audit.read(session, limit))


def holds_lock(run: Run, holder: dict[str, Any]) -> bool:
    """True when the lock's holder record names this run's process (it is live, not dead)."""
    who = str(run.intent.get("who", ""))
    return (
        bool(holder)
        and run.intent.get("pid") == holder.get("pid")
        and who.endswith("@" + str(holder.get("host", "")))
    )


def unfinished_runs(runs: Sequence[Run], *, exclude: str | None = None) -> list[Run]:
    """The runs that began and never ended (killed, or lost their connection)."""
    return [r for r in runs if r.unfinished and r.run != exclude]


def write_facts(plan: Plan) -> list[dict[str, Any]]:
    """Per node: path, digest before and after, for the intent record."""
    return [
        {"host": c.host, "path": c.path, "sha_before": c.old_sha, "sha_after": sha256(c.new_text)}
        for c in plan.changes
    ]


class RunJournal:
    """Append a run's intent, its steps and its end to the head's audit log, under one run id."""

    def __init__(self, op: Operation, operation: OperationKind, command: str = "") -> None:
        """Bind to an open Operation; nothing is written yet."""
        self.op = op
        self.operation = operation
        self.command = command
        self.run = new_run_id()
        self._sent: set[str] = set()

    async def intent(
        self,
        *,
        args: dict[str, Any] | None = None,
        nodes: Sequence[str] = (),
        diff: str = "",
        detail: dict[str, Any] | None = None,
        settles: Sequence[str] = (),
    ) -> None:
        """Record what the run will do, before it changes anything; raises when it cannot."""
        entry = audit.make_entry(
            self.operation, args=args, nodes=nodes, diff=diff, outcome="begun", detail=detail
        )
        entry.update(
            run=self.run, phase=INTENT, command=self.command, settles=list(settles),
            pid=os.getpid(),
        )  # fmt: skip
        await audit.record(self.op.session, entry)

    async def steps(
        self, steps: Sequence[StepRun], attach: dict[StepKind, dict[str, Any]] | None = None
    ) -> None:
        """Record the run's steps finished since the last call, with facts `attach`ed by kind.

        Never raises: a record that cannot be written is logged and the run goes on.
        """
        done = [s for s in steps if s.status in ("done", "skipped", "failed")]
        fresh = [s for s in done if s.name not in self._sent]
        records = [{**_step_record(s), **(attach or {}).get(s.name, {})} for s in fresh]
        if not records:
            return
        self._sent.update(s.name for s in fresh)
        await self._append({"run": self.run, "phase": STEP, "steps": records})

    async def note(self, step: str, status: str, **extra: Any) -> None:
        """Record one fact of a step as it happens (e.g. the restart window, before the trigger)."""
        await self._append(
            {"run": self.run, "phase": STEP, "steps": [{"step": step, "status": status, **extra}]}
        )

    async def end(self, entry: dict[str, Any]) -> None:
        """Close the run with its full audit entry (never raises)."""
        entry = dict(entry)
        entry.update(run=self.run, phase=END)
        await self._append(entry)

    async def _append(self, entry: dict[str, Any]) -> None:
        """Append one entry; a failure is logged, never raised."""
        try:
            await audit.record(self.op.session, entry)
        except SparkOpsError as exc:
            self.op.log.warning("audit journal not written", error=exc.message, run=self.run)


def _step_record(step: StepRun) -> dict[str, Any]:
    """One finished step as the journal keeps it."""
    rec: dict[str, Any] = {"step": step.name.value, "status": step.status}
    if step.detail:
        rec["detail"] = step.detail[:1000]
    return rec
