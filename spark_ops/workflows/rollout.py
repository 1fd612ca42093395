"""`spark-ops rollout`: one change over the fleet, a cluster at a time, each step an apply --prove.

The plan comes first (`plan_rollout`): the order (the canary, the fleet's first cluster or the one
named, then the rest in the fleet's order), the gate, and every cluster's restart budget and
doctor verdict. A cluster whose budget has no slot left, that doctor fails, or that cannot be read
is skipped and named, never forced. Then `run_rollout` applies the change to the canary, then to
the rest one at a time (or `parallel` at a time after the canary), each an apply with the proof
(workflows/prove.py): a regression rolls that cluster back and stops the rollout, the clusters not
reached named as such; any other failure of an apply stops it too.

The rollout keeps its own journal on this machine (`RolloutJournal`, a JSON file written
atomically by the one local writer, spark_ops/files.py), a state per cluster written before and
after each step: a rollout interrupted between clusters (SIGINT, SIGKILL) resumes from it and
converges; clusters done are not done again, and a cluster whose apply was interrupted is applied
again, which is apply's own convergence (it finishes the dead run, and finds the change made or
makes it). A change it finds in place is never kept unproven: it is proven against the measurement
the journal took before it (measure-before reports it the moment it ends, before the write), or,
with none, the cluster is left `unproven` and the rollout stops (docs/fleet.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from spark_ops.errors import ExitStatus, Interrupted, SparkOpsError
from spark_ops.files import read_regular, write_file
from spark_ops.fleet import Fleet, Member, across
from spark_ops.headlib.errors import HeadFailure, LockTimeout
from spark_ops.headlib.flock import lock_holders, locked
from spark_ops.inventory import Cluster
from spark_ops.workflows.budget import budget_view
from spark_ops.workflows.execute import execute
from spark_ops.workflows.gate import budget_refusal
from spark_ops.workflows.operation import ApplyOptions, Operation, Outcome
from spark_ops.workflows.plan import StepRun
from spark_ops.workflows.plans import plan_apply, plan_rollback
from spark_ops.workflows.prove import (
    Proof,
    ProofReporter,
    Regressed,
    add_resumed_proof,
    regressed,
)

DONE = ("kept", "rolled-back", "skipped", "failed")  # a cluster's final states
MAX_JOURNAL_BYTES = 4 << 20


class RolloutError(SparkOpsError):
    """A rollout that cannot start or resume: no fleet, an unknown canary, no journal."""

    exit_status = ExitStatus.USAGE


@dataclass
class ClusterStep:
    """One cluster of the rollout: where it stands and why, with its gate's proof once run."""

    name: str
    role: str  # canary | next
    state: str = "pending"  # pending | running | kept | rolled-back | skipped | failed | unproven
    reason: str = ""
    budget: str = ""  # used/allowed when planned
    doctor: str = ""  # ready | NOT READY (checks) | error
    proof: Proof | None = None
    exit: int | None = None
    restarted: bool = False

    def to_dict(self) -> dict[str, Any]:
        """Serialize for the journal and --json."""
        return {**self.__dict__, "proof": self.proof.to_dict() if self.proof else None}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ClusterStep:
        """Rebuild from to_dict() output."""
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        proof = known.pop("proof", None)
        return cls(**known, proof=Proof.from_dict(proof) if isinstance(proof, dict) else None)


@dataclass
class Rollout:
    """The rollout's plan and its progress: what the journal holds and the report shows."""

    key: str
    fleet: str
    command: str
    args: dict[str, Any]  # the command line's options, as parsed (a resume runs them again)
    parallel: int
    clusters: list[ClusterStep]
    started: float = field(default_factory=time.time)
    stopped: str = ""  # why the rollout stopped before its end (a regression, a failure)
    finished: bool = False

    def step(self, name: str) -> ClusterStep:
        """The cluster called name."""
        return next(c for c in self.clusters if c.name == name)

    def to_dict(self) -> dict[str, Any]:
        """Serialize for the journal and --json."""
        return {
            "key": self.key, "fleet": self.fleet, "command": self.command, "args": self.args,
            "parallel": self.parallel, "started": self.started, "stopped": self.stopped,
            "finished": self.finished, "clusters": [c.to_dict() for c in self.clusters],
        }  # fmt: skip

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Rollout:
        """Rebuild from to_dict() output."""
        return cls(
            key=str(data["key"]), fleet=str(data["fleet"]), command=str(data["command"]),
            args=dict(data["args"]), parallel=int(data["parallel"]),
            clusters=[ClusterStep.from_dict(c) for c in data["clusters"]],
            started=float(data["started"]), stopped=str(data.get("stopped", "")),
            finished=bool(data.get("finished")),
        )  # fmt: skip


def rollout_key(fleet: str, args: dict[str, Any]) -> str:
    """The rollout's identity: its fleet file and its options (the same command finds it)."""
    text = json.dumps({"fleet": fleet, "args": args}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class RolloutJournal:
    """The rollout's journal on this machine: one JSON file per rollout, written atomically."""

    directory: Path

    @contextlib.contextmanager
    def held(self, fleet: str) -> Iterator[None]:
        """Hold this fleet's rollout lock on this machine for a rollout's run (flock: freed when
        the process dies, however): a second rollout of the same fleet at once is refused,
        never run over the first's journal (it would mark it finished, stopped on the lock)."""
        where = self.directory.expanduser()
        try:
            where.mkdir(parents=True, exist_ok=True)
        except OSError as exc:  # a file on its path, read-only or immutable, no permission
            raise RolloutError(
                f"{where}: the rollout's journal directory cannot be made ({exc.strerror})",
                hint="give --journal-dir (or SPARK_OPS_ROLLOUT_DIR) a directory you may write",
            ) from None
        real = str(Path(fleet).expanduser().resolve())
        path = str(where / f"fleet-{hashlib.sha256(real.encode()).hexdigest()[:16]}.lock")
        if Path(path).is_symlink():  # never a lock taken through a link someone left there
            raise RolloutError(
                f"{path}: the fleet's rollout lock cannot be opened (a symlink)",
                hint=f"remove {path} if it is not a regular file of yours",
            )
        stack = contextlib.ExitStack()
        try:
            stack.enter_context(locked(path, timeout=0, follow=False))  # no link, even one just put
        except LockTimeout:
            holders = [h for h in lock_holders(path) if h.get("holds")] or lock_holders(path)
            held_by = ", ".join(f"pid {h['pid']}" for h in holders) or "?"
            raise RolloutError(
                f"a rollout of {fleet} is running on this machine already ({held_by}); "
                "two at once would write over each other's journal",
                hint=f"wait for it to end (its lock: {path}), or resume it once it is gone",
            ) from None
        except HeadFailure as exc:  # a directory there, no permission
            raise RolloutError(
                f"{path}: the fleet's rollout lock cannot be opened ({exc.message})",
                hint=f"remove {path} if it is not a regular file of yours",
            ) from None
        with stack:
            yield

    def path(self, key: str) -> Path:
        """The journal file of the rollout with this key."""
        return self.directory.expanduser() / f"rollout-{key}.json"

    def save(self, rollout: Rollout) -> None:
        """Write the rollout's state (temp file, fsync, rename: whole or the previous one)."""
        text = json.dumps(rollout.to_dict(), indent=1, sort_keys=True, default=str)
        write_file(self.path(rollout.key), text + "\n", make_parents=True)

    def load(self, key: str) -> Rollout | None:
        """The rollout with this key, or None when there is no journal of it; RolloutError
        naming the file when it is not a rollout's journal (truncated, hand-edited)."""
        path = self.path(key)
        try:
            raw = read_regular(path, limit=MAX_JOURNAL_BYTES)
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            raise _unreadable(path, str(exc)) from None
        try:
            data = json.loads(raw)
            if not isinstance(data, dict):
                raise TypeError(f"a JSON {type(data).__name__}, not an object")
            return Rollout.from_dict(data)
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise _unreadable(path, f"{type(exc).__name__}: {exc}") from None

    def unfinished(self, fleet: str) -> Rollout | None:
        """The latest unfinished rollout of this fleet (`--resume` without its options). A
        journal that cannot be read is not this fleet's as far as is known: when no readable
        one is found, the error names the unreadable ones (one of them may be it)."""
        found, bad = [], []
        for p in sorted(self.directory.expanduser().glob("rollout-*.json")):
            try:
                data = self.load(p.stem.removeprefix("rollout-"))
            except RolloutError as exc:
                bad.append(exc.message)
                continue
            if data is not None and data.fleet == fleet and not data.finished:
                found.append(data)
        if not found and bad:
            raise RolloutError(
                f"no readable unfinished rollout of {fleet}; unreadable: " + "; ".join(bad),
                hint="move each unreadable journal away (or fix it), then resume again",
            )
        return max(found, key=lambda r: r.started) if found else None


def _unreadable(path: Path, why: str) -> RolloutError:
    """A journal file that is not a rollout's journal, named."""
    return RolloutError(
        f"{path}: not a rollout journal ({why[:300]})",
        hint=f"move {path} away (or fix it): a rollout is resumed only from its whole journal",
    )


def order_of(fleet: Fleet, canary: str | None) -> list[Member]:
    """The canary first (the fleet's first cluster unless named), then the rest in order."""
    first = fleet.member(canary) if canary is not None else fleet.members[0]
    return [first, *(m for m in fleet.members if m.name != first.name)]


class Report(Protocol):
    """What a rollout needs of a doctor report: whether it passed, and the checks that failed."""

    @property
    def ok(self) -> bool:
        """True when no check failed."""

    def failed(self) -> Sequence[Any]:
        """The failed checks (each with a name)."""


Doctor = Callable[[Cluster], Awaitable[Report]]  # the CLI passes doctor's run (its own part)


async def _readiness(cluster: Cluster, run_doctor: Doctor) -> tuple[str, str]:
    """A cluster's budget (used/allowed, or why a restart is refused) and doctor verdict."""
    async with Operation.open(cluster, "rollout", lock=False, nodes=[cluster.head.name]) as op:
        view = await budget_view(op)
    report = await run_doctor(cluster)
    budget = f"{view.used}/{view.allowed}"
    skip = ""
    if view.used >= view.allowed:
        skip = f"restart budget {budget} used: no slot left (never forced)"
    if not report.ok:
        failed = ", ".join(sorted({c.name for c in report.failed()}))
        skip = skip or f"doctor fails: {failed}"
    return budget + ("" if not skip else f"\t{skip}"), "ready" if report.ok else "NOT READY"


async def plan_rollout(
    fleet: Fleet, canary: str | None, parallel: int, command: str, args: dict[str, Any],
    doctor: Doctor, done: Rollout | None = None,
) -> Rollout:  # fmt: skip
    """The rollout as planned now: order, each cluster's budget and doctor verdict, and the
    clusters skipped with their reason; the states of a resumed rollout kept."""
    members = order_of(fleet, canary)
    key = rollout_key(fleet.path, args)
    ro = done or Rollout(
        key, fleet.path, command, args, parallel,
        [ClusterStep(m.name, "canary" if i == 0 else "next") for i, m in enumerate(members)],
    )  # fmt: skip
    todo = [m for m in members if ro.step(m.name).state not in DONE]
    sub = Fleet(fleet.path, tuple(todo))
    for reading in await across(sub, lambda c: _readiness(c, doctor)):
        step = ro.step(reading.member.name)
        if reading.error is not None:
            step.budget, step.doctor = "-", "error"
            step.state, step.reason = "skipped", f"cannot be read: {reading.error.message}"
            continue
        assert reading.value is not None
        budget, step.doctor = reading.value
        step.budget, _, skip = budget.partition("\t")
        if skip and step.state in ("running", UNPROVEN):  # its apply began: it finishes it (its
            step.reason = f"resumed although {skip}"  # own gates refuse), never skipped unproven
        elif skip:
            step.state, step.reason = "skipped", skip
        elif step.state == "skipped":  # a resumed plan reads again: ready now
            step.state, step.reason = "pending", ""
    return ro


StepSay = Callable[[str, StepRun], None]


async def apply_one(
    member: Member, opts: ApplyOptions, say: StepSay | None = None, *, resumed: bool = False,
    saved: Proof | None = None, on_proof: ProofReporter | None = None,
) -> ClusterStep:  # fmt: skip
    """One cluster's apply with the proof, under its lock; its final state (never raises for
    a SparkOpsError: the failure is the state).

    `resumed`: the rollout's journal had this cluster running (its apply was interrupted). A
    change then found in place is proven against `saved`, the measurement journalled before it
    was made (measure-after and the verdict; a regression rolls it back with `rollback`'s plan),
    or, with none saved, left `unproven`: never kept without a proof."""
    step = ClusterStep(member.name, "")
    try:
        async with Operation.open(member.cluster, "apply") as op:
            plan = await plan_apply(op, opts)
            in_place = resumed and not plan.changes
            before = _saved_before(saved, opts) if in_place else None
            if in_place and before is None:
                step.state, step.reason = UNPROVEN, UNPROVEN_WHY
                step.exit = int(ExitStatus.ROLLOUT_STOPPED)
                return step
            if not plan.steps and not in_place:
                step.state, step.reason = (
                    "kept",
                    "the recipe holds the change and the engine runs it",
                )
                return step
            if before is not None:
                assert opts.prove is not None
                add_resumed_proof(plan, opts.prove, op.cluster.head.name)
            refusal = budget_refusal(plan)
            if refusal is not None:
                step.state, step.reason = "skipped" if before is None else UNPROVEN, refusal.message
                return step
            report = (lambda s: say(member.name, s)) if say is not None else None
            try:
                out: Outcome = await execute(
                    op, plan, opts, on_step=report, on_proof=on_proof, proof=before
                )
            except Regressed as exc:
                if before is None:  # an apply's own regression is rolled back by its own steps
                    raise
                return await _roll_back(op, opts, step, exc, report)
    except Interrupted:  # the journal keeps the cluster running: a resume applies it again
        raise
    except SparkOpsError as exc:
        step.state, step.reason, step.exit = "failed", exc.message, int(exc.exit_status)
        return step
    step.proof, step.restarted = out.proof, out.stamp is not None or bool(out.pruned)
    if out.rolled_back and regressed(out.proof):
        step.state, step.reason = "rolled-back", "the gate failed: the previous recipe serves"
        step.exit = int(ExitStatus.REGRESSED)
    elif out.rolled_back:
        step.state, step.reason = "rolled-back", "the new recipe failed to boot"
        step.exit = int(ExitStatus.BOOT_FAILED)
    elif out.ok and out.checks_ok:
        step.state, step.reason, step.exit = "kept", "the gate passed", 0
        if before is not None:
            step.reason = "the gate passed (the change found in place, against the saved before)"
    else:
        bad = ", ".join(sorted({c.name for c in out.checks if not c.ok}))
        step.state, step.reason = "failed", f"checks failed: {bad}"
        step.exit = int(ExitStatus.CHECK_FAILED)
    return step


UNPROVEN = "unproven"
UNPROVEN_WHY = (
    "its interrupted apply left the change in place and no measurement from before it was "
    "journalled: not proven, not kept"
)


def _saved_before(saved: Proof | None, opts: ApplyOptions) -> Proof | None:
    """The measurement journalled before the change, when taken at this rollout's point."""
    if saved is None or saved.proving != opts.prove:
        return None
    return Proof(saved.proving, saved.before)


async def _roll_back(
    op: Operation, opts: ApplyOptions, step: ClusterStep, exc: Regressed,
    report: Callable[[StepRun], None] | None,
) -> ClusterStep:  # fmt: skip
    """A change found in place regressed: restore the recipe it replaced (`rollback`'s plan)."""
    step.proof = exc.proof
    undo = replace(opts, prove=None, reason="planned restart (spark-ops rollout: regressed)")
    out = await execute(op, await plan_rollback(op, undo), undo, on_step=report)
    step.restarted = True
    if not (out.ok and out.checks_ok):
        step.state, step.reason = "failed", f"{exc.message}; the rollback did not finish cleanly"
        step.exit = int(ExitStatus.REGRESSED)
        return step
    step.state, step.reason = "rolled-back", "the gate failed: the previous recipe serves"
    step.exit = int(ExitStatus.REGRESSED)
    return step


def unproven_hint(rollout: Rollout, name: str) -> str:
    """What to run for a cluster left unproven: roll it back, then apply it again with the proof."""
    fleet = f"spark-ops --fleet {rollout.fleet}"
    return (
        f"run `{fleet} --cluster {name} rollback` (the recipe before the change), then "
        f"`{fleet} rollout --resume` (or `{fleet} --cluster {name} apply … --prove`) to make it "
        "again with its proof"
    )


def batches(rollout: Rollout) -> list[list[str]]:
    """The clusters still to apply, in steps: the canary alone, then `parallel` at a time."""
    todo = [c.name for c in rollout.clusters if c.state in ("pending", "running", UNPROVEN)]
    canary = rollout.clusters[0].name
    out: list[list[str]] = [[canary]] if canary in todo else []
    rest = [n for n in todo if n != canary]
    size = max(1, rollout.parallel)
    out += [rest[i : i + size] for i in range(0, len(rest), size)]
    return out


async def run_rollout(
    fleet: Fleet, rollout: Rollout, opts: ApplyOptions, journal: RolloutJournal,
    say: StepSay | None = None, on_cluster: Callable[[ClusterStep], None] | None = None,
) -> Rollout:  # fmt: skip
    """Apply to each cluster in its turn, journalled before and after (and its measurement before
    the change as soon as it is taken); stop at a regression, a failure or a change left unproven
    (the clusters not reached stay pending and are named so)."""
    rollout.stopped = ""
    for batch in batches(rollout):
        resumed = {n: rollout.step(n).state in ("running", UNPROVEN) for n in batch}
        saved = {n: rollout.step(n).proof for n in batch}
        for name in batch:
            rollout.step(name).state = "running"
        journal.save(rollout)
        results = await asyncio.gather(*(
            apply_one(fleet.member(n), opts, say, resumed=resumed[n], saved=saved[n],
                      on_proof=_journalling(rollout, journal, n))
            for n in batch
        ))  # fmt: skip
        for done in results:
            step = rollout.step(done.name)
            step.state, step.reason, step.proof = done.state, done.reason, done.proof or step.proof
            step.exit, step.restarted = done.exit, done.restarted
            if done.state == UNPROVEN:
                step.reason = f"{done.reason}; {unproven_hint(rollout, done.name)}"
            if on_cluster is not None:
                on_cluster(step)
        stop = [r for r in results if r.state in ("rolled-back", "failed", UNPROVEN)]
        if stop:
            rollout.stopped = "; ".join(f"{r.name} {r.state}: {r.reason}" for r in stop)
            rollout.finished = all(r.state != UNPROVEN for r in stop)  # unproven: resumable
        journal.save(rollout)
        if stop:
            return rollout
    rollout.finished = True
    journal.save(rollout)
    return rollout


def _journalling(rollout: Rollout, journal: RolloutJournal, name: str) -> ProofReporter:
    """Journal a cluster's proof the moment measure-before ends (before its change is written)."""

    def saved(proof: Proof) -> None:
        """Keep the measurement before the change in the rollout's journal."""
        rollout.step(name).proof = proof
        journal.save(rollout)

    return saved


def exit_of(rollout: Rollout) -> int:
    """REGRESSED when a cluster was rolled back by its gate, a failed apply's own code, 24 when
    clusters were skipped, unproven or not reached, else 0."""
    states = [c.state for c in rollout.clusters]
    for c in rollout.clusters:
        if c.state in ("rolled-back", "failed") and c.exit:
            return c.exit
    if any(s != "kept" for s in states):
        return int(ExitStatus.ROLLOUT_STOPPED)
    return 0


def shown_state(step: ClusterStep, rollout: Rollout) -> str:
    """A cluster's state as the report says it (a pending one of a stopped rollout: not reached)."""
    if step.state == "pending" and rollout.stopped:
        return "not reached"
    return step.state


def pending_names(rollout: Rollout) -> Sequence[str]:
    """The clusters not reached (or still to do)."""
    return [c.name for c in rollout.clusters if c.state in ("pending", "running")]
