"""Convergence by state: what a run must do is read from the engine and the records, not the file.

A recipe that already holds the asked content is not "nothing to do" when the engine runs other
values (a run killed after its write, before its restart): that is "restart needed". A run that
began and never ended (killed, its connection lost) is read back from the head's audit log; the
planned stamp it left inside its recorded restart window is pruned by the next run, which says it
is finishing that run, and `budget prune --planned` finds it too.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from spark_ops.engine.instance import current_instance
from spark_ops.errors import SparkOpsError
from spark_ops.remote import ClusterSession, engine_log_last_args
from spark_ops.verify import check_effective_args, parse_non_default_args
from spark_ops.watchdog.contract import PLANNED_BY
from spark_ops.watchdog.identify import HistEntry, new_entries, prune_command, record_kind
from spark_ops.workflows.journal import (
    STAMP_GRACE_S,
    Run,
    grace_left,
    read_runs,
    unfinished_runs,
)
from spark_ops.workflows.operation import Operation
from spark_ops.workflows.plan import OperationKind, Plan, Step, StepKind


async def effective_args(session: ClusterSession) -> dict[str, Any] | None:
    """The engine's effective flags: the last `non-default args` line of its log (or None)."""
    cluster = session.cluster
    cmd = engine_log_last_args(cluster.engine)
    try:
        res = await session.run(cluster.head.name, cmd, check=False, timeout=20)
        return parse_non_default_args(res.stdout) if res.stdout.strip() else None
    except SparkOpsError:
        return None


async def engine_differs(op: Operation, expected: dict[str, Any]) -> str | None:
    """Why the running engine does not run the recipe's values; None when it does, or unknown."""
    want = {k: v for k, v in expected.items() if v is not None}
    up = await engine_answers(op)
    args = await effective_args(op.session)
    if args is None:
        return None if up else "the engine does not answer and its log names no start-up args"
    check = check_effective_args(args, want, host=op.cluster.head.name)
    if check.ok and up:
        return None
    if check.ok:
        if await _booting(op):
            return None  # a boot of these values is under way: another restart would waste it
        return "the engine does not answer (it was last started with the recipe's values)"
    return f"the engine runs other values than the recipe: {check.detail}"


async def _booting(op: Operation) -> bool:
    """True when the engine's instance runs (it booting, not dead), e.g. a killed run's boot."""
    try:
        instance = await current_instance(op.session, op.cluster)
    except SparkOpsError:
        return False
    return instance is not None and instance.alive


async def boot_of_dead_run(op: Operation) -> Run | None:
    """The dead run whose restart may be booting now, or None: its checks are owed (checks_owed),
    the engine does not answer, and either its instance runs or the run's last restart is recent
    enough (STAMP_GRACE_S after its command) that the watchdog may be between stopping the engine
    and starting the new one. The log may still name the engine that restart replaces, so its
    values call for no second restart: it would waste the watchdog's, and a worker's rank not
    started yet refuses it. What waits for that boot is the owed checks' step (before_checks)."""
    owed = await checks_owed(op)
    if owed is None or await engine_answers(op):
        return None
    if await _booting(op):
        return owed
    grace_end = owed.last_grace_end
    if grace_end is None:
        return None
    try:
        now = await op.watchdog.clock()
    except SparkOpsError:
        return None
    return owed if grace_left(grace_end, now) > 0 else None


async def engine_answers(op: Operation) -> bool:
    """Whether the engine's health endpoint answers now (a few seconds at most)."""
    try:
        await op.api_url()
        async with op.engine(timeout=5) as api:
            return bool(await api.health())
    except SparkOpsError:
        return False


async def booting_note(op: Operation, expected: dict[str, Any]) -> str | None:
    """A plan warning when the engine is still booting the recipe's values (nothing to restart)."""
    if await engine_answers(op) or not await _booting(op):
        return None
    return (
        "the engine does not answer yet but its instance runs and was started with the recipe's "
        "values: a boot is under way (`spark-ops status` follows it); no restart is planned. If it "
        "never serves, `spark-ops restart` starts it again"
    )


def left_by(
    run: Run, entries: list[HistEntry], marks: dict[float, dict[str, Any]]
) -> tuple[list[HistEntry], list[str]]:
    """The planned stamps a dead run left in its restart windows, and notes on those it cannot.

    The rules, in order, per window: the stamp the run identified while it lived, by value; else
    the one new entry a journal marks planned; never one a journal marks automatic (the watchdog
    restarting an engine that went down meanwhile); else the one unmarked new entry within
    STAMP_GRACE_S of the restart command (its start if the run died during it, its return if
    not). Several candidates are listed, never pruned; a later unmarked one is named with the
    command that removes it.
    """
    found: list[HistEntry] = []
    notes: list[str] = []
    for w in run.restart_windows():
        if w.pruned:
            continue
        before = [e for e in entries if e.stamp < w.lo - 1.0 or e.raw in w.known]
        hi = max(w.hi, w.grace_end)  # an asynchronous watchdog stamps after its command returned
        new = [e for e in new_entries(before, entries) if w.lo - 1.0 <= e.stamp <= hi + 1.0]
        new = [e for e in new if e not in found]
        if w.stamp is not None:
            exact = [e for e in new if abs(e.stamp - w.stamp) < 1e-6]
            found.extend(exact[-1:])  # gone already: pruned by hand, nothing left
            continue
        kinds = [(e, record_kind(marks.get(e.stamp) or e.record, PLANNED_BY)) for e in new]
        planned = [e for e, k in kinds if k == "planned"]
        unmarked = [e for e, k in kinds if k is None]
        near = [e for e in unmarked if e.stamp <= w.grace_end + 1.0]
        pick = planned if planned else near
        if len(pick) == 1:
            found.append(pick[0])
        elif pick:
            notes.append(
                f"run {run.run}: {len(pick)} new stamps in its restart window cannot be told "
                "apart; none pruned: " + " | ".join(prune_command(e) for e in pick)
            )
        later = [e for e in unmarked if e not in near]
        if later:
            notes.append(
                f"run {run.run}: stamp(s) {', '.join(repr(e.raw.strip()) for e in later)} came "
                f"more than {STAMP_GRACE_S:.0f} s after its restart command and carry no record: "
                "not taken for its own; if one is, " + " | ".join(prune_command(e) for e in later)
            )
    return found, notes


async def dead_runs(op: Operation) -> list[Run]:
    """Runs the head's audit log shows begun and never ended (under the lock: none is live)."""
    try:
        return unfinished_runs(await read_runs(op.session))
    except SparkOpsError as exc:
        op.log.warning("audit log not read: unfinished runs unknown", error=exc.message)
        return []


def unchecked_restart(runs: Sequence[Run]) -> Run | None:
    """The last run that triggered a restart and stopped before its checks ran (killed, or
    interrupted by a signal), unless a later run's checks ran since; None otherwise.

    Its re-run finds the recipe and the engine agreeing and plans no restart, yet the checks that
    run skipped (effective args, KV pool, free memory, Xid, still serving) are still owed.
    """
    owed: Run | None = None
    for r in runs:
        verify = r.step("verify") or {}
        ran = verify.get("status") == "done" or (
            verify.get("status") == "failed"
            and not str(verify.get("detail", "")).startswith("interrupted")
        )
        if ran:
            owed = None
        elif r.restart_windows():
            outcome = str((r.end or {}).get("outcome", ""))
            owed = r if r.end is None or outcome.startswith("interrupted") else None
    return owed


async def checks_owed(op: Operation) -> Run | None:
    """The run whose restart was never checked (unchecked_restart), read from the head's log."""
    try:
        return unchecked_restart(await read_runs(op.session))
    except SparkOpsError as exc:
        op.log.warning("audit log not read: unchecked restarts unknown", error=exc.message)
        return None


async def plan_settle(op: Operation, plan: Plan) -> list[Run]:
    """Put a `settle` step first when dead runs are found: it prunes the stamps they left.

    Without the lock (the plan shown before the question) the step is shown all the same, with a
    warning that it runs under the lock only (a run still alive holds it: this one is then refused).
    """
    dead = await dead_runs(op)
    if not dead:
        return []
    entries = await op.watchdog.entries()
    marks = await op.watchdog.journal_by_stamp()
    left: list[HistEntry] = []
    settles: list[str] = []
    for r in dead:
        stamps, notes = left_by(r, entries, marks)
        left.extend(e for e in stamps if e not in left)
        plan.warnings.extend(notes)
        if not notes:  # a run with a stamp in doubt stays unfinished until that is resolved
            settles.append(r.run)
        who = r.intent.get("who", "?")
        unproven = unproven_change(r)
        if unproven and plan.operation is OperationKind.ROLLBACK and plan.changes:
            plan.warnings.append(  # the remedy unproven_change names: the change goes
                f"run {r.run} was an apply --prove interrupted before its gate's verdict: this "
                "rollback replaces its unproven change"
            )
        elif unproven:
            plan.warnings.append(unproven)
            plan.facts.unproven = [*(plan.facts.unproven or []), r.run]
        plan.warnings.append(
            f"run {r.run} ({r.operation} by {who}) did not finish; last recorded: {r.last_step}; "
            + (
                "this run finishes it"
                if op.locked
                else "this run finishes it once it holds the cluster lock (a run still alive holds "
                "that lock, and this one is then refused)"
            )
        )
    plan.facts.settles = settles
    plan.facts.left_stamps = [e.raw for e in left]
    plan.facts.left_stamp_values = [e.stamp for e in left]  # the budget gate counts without
    plan.facts.unfinished = [r.summary() for r in dead]
    what = (
        "remove the planned stamp(s) they left: " + ", ".join(repr(e.raw.strip()) for e in left)
        if left
        else "nothing of theirs is left in the history"
    )
    ids = ", ".join(r.run for r in dead)
    plan.steps.insert(
        0, Step(StepKind.SETTLE, f"finish run(s) {ids}: {what}", (op.cluster.head.name,))
    )
    return dead


def unproven_change(r: Any) -> str:
    """The warning for a dead `apply --prove` that wrote its change and never gave its verdict
    (measure-after not done): finishing it leaves the change in place, not proven ("" else)."""
    what = r.intent.get("what")
    args = what.get("args") if isinstance(what, dict) else None
    if not isinstance(args, dict) or not isinstance(args.get("prove"), dict) or not r.written:
        return ""
    after = r.step("measure-after") or {}
    if after.get("status") in ("done", "failed"):
        return ""
    return (
        f"run {r.run} was an apply --prove that wrote its change and was interrupted before its "
        "gate gave a verdict (measure-after not done): finishing it leaves the change in place, "
        "NOT proven; to prove it, `spark-ops rollback` (the recipe before it) and apply it again "
        "with --prove"
    )
