"""Convergence by state: what a run must do is read from the engine and the records, not the file.

A recipe that already holds the asked content is not "nothing to do" when the engine runs other
values (a run killed after its write, before its restart): that is "restart needed". A run that
began and never ended (killed, its connection lost) is read back from the head's audit log; the
planned stamp it left inside its recorded restart window is pruned by the next run, which says it
is finishing that run, and `budget prune --planned` finds it too.
"""

from __future__ import annotations

from typing import Any

from spark_ops.errors import AmbiguousStamp, SparkOpsError
from spark_ops.remote import ClusterSession, engine_log_recent
from spark_ops.verify import check_effective_args, parse_non_default_args
from spark_ops.watchdog.identify import HistEntry, identify, new_entries, prune_command
from spark_ops.workflows.journal import Run, read_runs, unfinished_runs
from spark_ops.workflows.operation import Operation
from spark_ops.workflows.plan import Plan, Step


async def effective_args(session: ClusterSession) -> dict[str, Any] | None:
    """The engine's effective flags: the last `non-default args` line of its log (or None)."""
    cluster = session.cluster
    cmd = engine_log_recent(cluster.engine) + " | grep -a 'non-default args' | tail -n 1"
    try:
        res = await session.run(cluster.head.name, cmd, check=False, timeout=20)
        return parse_non_default_args(res.stdout) if res.stdout.strip() else None
    except SparkOpsError:
        return None


async def engine_differs(op: Operation, expected: dict[str, Any]) -> str | None:
    """Why the running engine does not run the recipe's values; None when it does, or unknown."""
    want = {k: v for k, v in expected.items() if v is not None}
    try:
        await op.api_url()
        async with op.engine(timeout=5) as api:
            up = await api.health()
    except SparkOpsError:
        up = False
    args = await effective_args(op.session)
    if args is None:
        return None if up else "the engine does not answer and its log names no start-up args"
    check = check_effective_args(args, want, host=op.cluster.head.name)
    if check.ok and up:
        return None
    if check.ok:
        return "the engine does not answer (it was last started with the recipe's values)"
    return f"the engine runs other values than the recipe: {check.detail}"


def left_by(run: Run, entries: list[HistEntry]) -> tuple[list[HistEntry], list[str]]:
    """The planned stamps a dead run left in its restart windows, and notes on ambiguous ones."""
    found: list[HistEntry] = []
    notes: list[str] = []
    for w in run.restart_windows():
        if w.pruned:
            continue
        before = [e for e in entries if e.stamp < w.lo - 1.0 or e.raw in w.known]
        if not new_entries(before, entries):
            continue
        try:
            ident = identify(before, entries, window=(w.lo, w.hi), reported=None,
                             reports_stamp=False)  # fmt: skip
        except AmbiguousStamp as exc:
            notes.append(f"run {run.run}: {exc.message} ({exc.hint})")
            continue
        if ident.entry is not None and ident.entry not in found:
            found.append(ident.entry)
    return found, notes


async def dead_runs(op: Operation) -> list[Run]:
    """Runs the head's audit log shows begun and never ended (under the lock: none is live)."""
    try:
        return unfinished_runs(await read_runs(op.session))
    except SparkOpsError as exc:
        op.log.warning("audit log not read: unfinished runs unknown", error=exc.message)
        return []


async def plan_settle(op: Operation, plan: Plan) -> list[Run]:
    """Put a `settle` step first when dead runs are found: it prunes the stamps they left."""
    dead = await dead_runs(op)
    if not dead:
        return []
    if not op.locked:  # a preview: a run shown unfinished may still be running
        for r in dead:
            plan.warnings.append(
                f"run {r.run} ({r.operation}) has not ended (still running, or killed); "
                f"last recorded: {r.last_step}"
            )
        return dead
    entries = await op.watchdog.entries()
    left: list[HistEntry] = []
    for r in dead:
        stamps, notes = left_by(r, entries)
        left.extend(e for e in stamps if e not in left)
        plan.warnings.extend(notes)
        who = r.intent.get("who", "?")
        plan.warnings.append(
            f"run {r.run} ({r.operation} by {who}) did not finish; last recorded: {r.last_step}; "
            "this run finishes it"
        )
    plan.facts["settles"] = [r.run for r in dead]
    plan.facts["left_stamps"] = [e.raw for e in left]
    plan.facts["unfinished"] = [r.summary() for r in dead]
    what = (
        "remove the planned stamp(s) they left: " + ", ".join(repr(e.raw.strip()) for e in left)
        if left
        else "nothing of theirs is left in the history"
    )
    ids = ", ".join(r.run for r in dead)
    plan.steps.insert(0, Step("settle", f"finish run(s) {ids}: {what}", [op.cluster.head.name]))
    return dead


def settle_commands(entries: list[HistEntry]) -> list[str]:
    """The commands that remove stamps by exact line (shown when they cannot be pruned now)."""
    return [prune_command(e) for e in entries]
