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

import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from spark_ops import audit
from spark_ops.errors import SparkOpsError
from spark_ops.remote import ClusterSession, sha256
from spark_ops.watchdog.identify import HistEntry, new_entries
from spark_ops.workflows.operation import Operation
from spark_ops.workflows.plan import Plan, Step

INTENT, STEP, END = "intent", "step", "end"
AUDIT_TAIL = 400  # entries read back to find unfinished runs (a run writes about ten)
TRIGGER_WINDOW_S = 600.0  # a killed run's restart command may have stamped until then


def new_run_id() -> str:
    """A short unique run id: the local time and random hex."""
    return time.strftime("%Y%m%dT%H%M%S") + "-" + secrets.token_hex(3)


@dataclass
class RestartWindow:
    """A planned restart a run triggered: when, the lines it saw just before, whether pruned."""

    step: str
    lo: float
    hi: float
    known: list[str]
    pruned: bool

    def to_dict(self) -> dict[str, Any]:
        """Serialize for --json."""
        return {"step": self.step, "from": self.lo, "to": self.hi, "pruned": self.pruned}


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
        return str((self.intent.get("what") or {}).get("operation", "?"))

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
            return "intent recorded, no step finished"
        rec = self.steps[-1]
        return f"{rec.get('step')} {rec.get('status')}"

    @property
    def written(self) -> list[str]:
        """host:path of every recipe copy the run's write step committed."""
        rec = self.step("write") or {}  # a failed write names what its undo could not put back
        return list(rec.get("written") or [])

    def restart_windows(self) -> list[RestartWindow]:
        """Every planned restart it triggered (apply's, a rollback's) and its clock window."""
        out = []
        for rec in self.steps:
            name = str(rec.get("step", ""))
            if not name.startswith("restart") or "window_from" not in rec:
                continue
            merged = self.step(name) or rec
            lo = float(rec["window_from"])
            hi = merged.get("window_to")
            prune = self.step("prune" + name[len("restart") :])
            out.append(
                RestartWindow(
                    name,
                    lo,
                    float(hi) if hi is not None else lo + TRIGGER_WINDOW_S,
                    [str(r) for r in rec.get("known") or []],
                    prune is not None and prune.get("status") in ("done", "skipped"),
                )
            )
        return out

    @property
    def pruned(self) -> bool:
        """Every planned stamp it made was pruned (or it recorded there was none)."""
        return all(w.pruned for w in self.restart_windows())

    def summary(self) -> dict[str, Any]:
        """What status, doctor and --json show of an unfinished run."""
        return {
            "run": self.run,
            "operation": self.operation,
            "who": self.intent.get("who"),
            "when": self.intent.get("when"),
            "last_step": self.last_step,
            "written": self.written,
            "restart_windows": [w.to_dict() for w in self.restart_windows()],
            "stamp_pruned": self.pruned,
            "command": self.command,
        }


def runs_of(entries: Sequence[dict[str, Any]]) -> list[Run]:
    """Group audit entries into runs (entries without a run id are older, single entries)."""
    runs: dict[str, Run] = {}
    for e in entries:
        rid = e.get("run")
        if not isinstance(rid, str):
            continue
        phase = e.get("phase")
        if phase == INTENT:
            runs[rid] = Run(rid, e)
            for other in e.get("settles") or []:
                if other in runs and runs[other].end is None:
                    runs[other].settled_by = rid
        elif rid in runs and phase == STEP:
            runs[rid].steps.extend(e.get("steps") or [])
        elif rid in runs and phase == END:
            runs[rid].end = e
    return list(runs.values())


async def read_runs(session: ClusterSession, limit: int = AUDIT_TAIL) -> list[Run]:
    """The runs of the audit log's last `limit` entries, oldest first."""
    return runs_of(await audit.read(session, limit))


def unfinished_runs(runs: Sequence[Run], *, exclude: str | None = None) -> list[Run]:
    """The runs that began and never ended (killed, or lost their connection)."""
    return [r for r in runs if r.unfinished and r.run != exclude]


def left_stamps(run: Run, entries: Sequence[HistEntry]) -> list[HistEntry]:
    """History entries inside a dead run's unpruned restart windows that were not there before.

    A window runs from the head's clock before the run's restart command to its return (or, if
    the run died first, the command's longest time). Lines the run saw just before its restart,
    and older ones, are not its own.
    """
    out: list[HistEntry] = []
    for w in run.restart_windows():
        if w.pruned:
            continue
        before = [e for e in entries if e.stamp < w.lo - 1.0 or e.raw in w.known]
        out.extend(
            e
            for e in new_entries(before, list(entries))
            if w.lo - 1.0 <= e.stamp <= w.hi + 1.0 and e not in out
        )
    return out


def write_facts(plan: Plan) -> list[dict[str, Any]]:
    """Per node: path, digest before and after, for the intent record."""
    return [
        {"host": c.host, "path": c.path, "sha_before": c.old_sha, "sha_after": sha256(c.new_text)}
        for c in plan.changes
    ]


class RunJournal:
    """Append a run's intent, its steps and its end to the head's audit log, under one run id."""

    def __init__(self, op: Operation, operation: str, command: str = "") -> None:
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
        entry.update(run=self.run, phase=INTENT, command=self.command, settles=list(settles))
        await audit.record(self.op.session, entry)

    async def steps(self, plan: Plan, attach: dict[str, dict[str, Any]] | None = None) -> None:
        """Record the steps finished since the last call, with facts `attach`ed by step name.

        Never raises: a record that cannot be written is logged and the run goes on.
        """
        done = [s for s in plan.steps if s.status in ("done", "skipped", "failed")]
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


def _step_record(step: Step) -> dict[str, Any]:
    """One finished step as the journal keeps it."""
    rec: dict[str, Any] = {"step": step.name, "status": step.status}
    if step.detail:
        rec["detail"] = step.detail[:1000]
    return rec
