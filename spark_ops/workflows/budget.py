"""The restart budget as the head sees it, and pruning chosen stamps: a plan, then exactly it.

`plan_prune` resolves the operator's selection (exact stamps, exact lines, a time range, the
journal's planned restarts) on the head into the exact history lines it matches now. The CLI shows
that plan and confirms it; `execute_prune` then removes exactly those lines, by value, and nothing
the selection would match by then: a stamp the watchdog appended after the preview is kept, and
the report names it.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from spark_ops import audit
from spark_ops.errors import HistoryError, InputError, Interrupted, SparkOpsError
from spark_ops.watchdog.contract import PLANNED_BY, BudgetView
from spark_ops.watchdog.identify import (
    HistEntry,
    fmt_stamp,
    record_kind,
    stamps_json,
    stamps_text,
)
from spark_ops.workflows import interrupt
from spark_ops.workflows.converge import dead_runs, left_by
from spark_ops.workflows.journal import RunJournal, read_runs
from spark_ops.workflows.operation import Operation
from spark_ops.workflows.plan import OperationKind

MAX_PRUNE_BYTES = 64_000  # the exact lines travel on one command line (Linux: 128 KiB per word)


async def budget_view(op: Operation) -> BudgetView:
    """The budget as the head sees it."""
    return await op.watchdog.budget()


@dataclass(frozen=True)
class PruneSelection:
    """What the operator asked to prune; times already resolved against the head's clock."""

    stamps: tuple[float, ...] = ()
    raws: tuple[str, ...] = ()
    since: float | None = None
    until: float | None = None
    planned: bool = False

    @property
    def empty(self) -> bool:
        """True when it selects nothing at all."""
        return not (self.stamps or self.raws or self.planned) and self.since is None

    def to_dict(self) -> dict[str, Any]:
        """Serialize for --json and the audit log."""
        return {
            "stamps": list(self.stamps), "raws": list(self.raws), "since": self.since,
            "until": self.until, "planned": self.planned,
        }  # fmt: skip


@dataclass
class PrunePlan:
    """The exact history lines a prune will remove, as the head's history held them at preview."""

    history_file: str
    selection: PruneSelection
    chosen: list[HistEntry] = field(default_factory=list)
    kept_raws: list[str] = field(default_factory=list)  # every other line seen at preview
    not_found: list[Any] = field(default_factory=list)  # asked for, absent at preview
    clear_gave_up: bool = False
    settles: list[str] = field(default_factory=list)  # dead runs whose left stamps it removes
    dead: list[str] = field(default_factory=list)  # dead runs whose stamps the preview looked at
    notes: list[str] = field(default_factory=list)  # dead runs' stamps it cannot take for planned
    warnings: list[str] = field(default_factory=list)  # chosen stamps that are not planned ones
    command: str = ""  # the command line as run (the audit's intent names it)

    @property
    def stamps(self) -> list[float]:
        """The stamps of the chosen lines, in file order."""
        return [e.stamp for e in self.chosen]

    def to_dict(self) -> dict[str, Any]:
        """Serialize for --dry-run --json (and inside the report)."""
        return {
            "history_file": self.history_file,
            "selection": self.selection.to_dict(),
            "remove": [e.to_dict() for e in self.chosen],
            "remove_stamps": self.stamps,
            "kept": len(self.kept_raws),
            "not_found": list(self.not_found),
            "clear_gave_up": self.clear_gave_up,
            "settles": list(self.settles),
            "notes": list(self.notes),
            "warnings": list(self.warnings),
        }


@dataclass
class PruneReport:
    """What executing a PrunePlan did: removed, vanished meanwhile, appended meanwhile and kept."""

    plan: PrunePlan
    removed: list[HistEntry] = field(default_factory=list)
    vanished: list[str] = field(default_factory=list)  # confirmed, gone before the prune ran
    appended_kept: list[str] = field(default_factory=list)  # appeared after the preview, kept
    backup: str | None = None
    gave_up_cleared: bool | None = None
    budget: BudgetView | None = None

    @property
    def removed_stamps(self) -> list[float]:
        """The stamps removed, in file order."""
        return [e.stamp for e in self.removed]

    def to_dict(self) -> dict[str, Any]:
        """Serialize for --json."""
        return {
            "plan": self.plan.to_dict(),
            "removed": [e.to_dict() for e in self.removed],
            "removed_stamps": stamps_json(self.removed_stamps),
            "vanished": list(self.vanished),
            "appended_kept": list(self.appended_kept),
            "backup": self.backup,
            "gave_up_cleared": self.gave_up_cleared,
            "budget": self.budget.to_dict() if self.budget is not None else None,
        }


async def resolve_times(
    op: Operation,
    since: float | None,
    since_ago: float | None,
    until: float | None,
    until_ago: float | None,
) -> tuple[float | None, float | None]:
    """Absolute (since, until): durations ago are counted back from the head's clock."""
    if since_ago is None and until_ago is None:
        return since, until
    now = await op.watchdog.clock()
    lo = now - since_ago if since_ago is not None else since
    hi = now - until_ago if until_ago is not None else until
    return lo, hi


async def _ours(op: Operation) -> set[float]:
    """The stamps spark-ops' runs recorded as their own planned restarts (the head's audit)."""
    try:
        runs = await read_runs(op.session)
    except SparkOpsError:
        return set()
    return {w.stamp for r in runs for w in r.restart_windows() if w.stamp is not None}


async def _say_automatic(op: Operation, plan: PrunePlan) -> None:
    """A warning for each chosen stamp that no record calls a restart spark-ops planned (the
    watchdog's journal, the line's own record, a spark-ops run's journal): an automatic restart
    is the watchdog's record of a failure, one forced by someone else or one nobody recorded
    may be too, and removing it hands the watchdog a restart back within its window."""
    try:
        marks = await op.watchdog.journal_by_stamp()
    except SparkOpsError:
        marks = {}
    ours = await _ours(op)
    back = "removing it gives the watchdog a restart back within this window"
    for entry in plan.chosen:
        rec = marks.get(entry.stamp) or entry.record or {}
        kind = record_kind(rec, PLANNED_BY)
        if kind == "planned" or any(abs(entry.stamp - s) < 1e-6 for s in ours):
            continue
        stamp = fmt_stamp(entry.stamp)
        why = f"{rec.get('reason') or '?'}, by {rec.get('by') or '?'}"
        if kind == "automatic" and rec.get("forced") is True:
            text = f"{stamp} is a restart forced by someone else ({why}), not one spark-ops planned"
        elif kind == "automatic":
            text = (
                f"{stamp} is an automatic restart ({why}): the watchdog's record of a failure, "
                "not one spark-ops planned"
            )
        else:
            text = (
                f"{stamp} is not a restart spark-ops planned (neither the watchdog's journal nor "
                "a spark-ops run records it as planned): it may be an automatic restart, the "
                "watchdog's record of a failure"
            )
        plan.warnings.append(f"{text}; {back}")


async def plan_prune(
    op: Operation, selection: PruneSelection, *, clear_gave_up: bool = False
) -> PrunePlan:
    """The exact lines the selection matches in the head's history now (nothing is changed)."""
    plan = PrunePlan(op.watchdog.wd.history_file, selection, clear_gave_up=clear_gave_up)
    if selection.empty:
        if not clear_gave_up:
            raise InputError(
                "choose what to prune: --stamp S, --raw LINE, --since T, --planned or "
                "--clear-gave-up"
            )
        return plan
    preview = await op.watchdog.prune(
        stamps=list(selection.stamps), raws=list(selection.raws), since=selection.since,
        until=selection.until, planned=selection.planned, dry_run=True,
        reason="operator prune",
    )  # fmt: skip
    plan.chosen = [HistEntry.from_read(e) for e in preview.get("removed", [])]
    plan.kept_raws = [str(r) for r in preview.get("kept_raws", [])]
    plan.not_found = list(preview.get("not_found", []))
    if selection.planned:
        await _dead_runs_stamps(op, plan)
    elif plan.chosen:
        await _say_automatic(op, plan)
    size = sum(len(e.raw.encode("utf-8", "replace")) + 8 for e in plan.chosen)
    if size > MAX_PRUNE_BYTES:
        raise HistoryError(
            f"{plan.history_file}: the selection matches {len(plan.chosen)} line(s), "
            f"{size} bytes in all: more than one prune can name exactly ({MAX_PRUNE_BYTES})",
            hint="narrow it (--since/--until over a shorter span) and prune in several steps",
        )
    return plan


async def _dead_runs_stamps(op: Operation, plan: PrunePlan) -> None:
    """Add the planned stamps dead runs left in their recorded windows (no journal needed)."""
    dead = await dead_runs(op)
    if not dead:
        return
    entries = await op.watchdog.entries()
    marks = await op.watchdog.journal_by_stamp()
    for run in dead:
        plan.dead.append(run.run)
        stamps, ambiguous = left_by(run, entries, marks)
        plan.notes.extend(ambiguous)
        plan.chosen.extend(e for e in stamps if e.raw not in {c.raw for c in plan.chosen})
        booted = (run.step("boot") or {}).get("status") == "done"
        if op.locked and not ambiguous and (booted or not (run.written or run.planned_writes)):
            plan.settles.append(run.run)  # nothing but its stamp was left; a write is apply's,
            # one announced and not committed too (its staged files: apply's settle removes them)
    chosen = Counter(e.raw for e in plan.chosen)
    plan.kept_raws = list((Counter(plan.kept_raws) - chosen).elements())


async def settle_under_lock(op: Operation, plan: PrunePlan) -> None:
    """Once the lock is held (after the question), which dead runs this prune finishes.

    Only a run the preview showed counts, and only as the lock sees it now: a run is settled
    when nothing but its stamp was left (its lines are the ones confirmed; nothing is added).
    """
    if not (plan.selection.planned and plan.dead) or not op.locked:
        return
    fresh = PrunePlan(plan.history_file, plan.selection)
    await _dead_runs_stamps(op, fresh)
    plan.settles = [r for r in fresh.settles if r in plan.dead]


async def execute_prune(op: Operation, plan: PrunePlan) -> PruneReport:
    """Remove exactly the plan's lines (by their exact text), audit it, report what changed."""
    report = PruneReport(plan)
    journal = RunJournal(op, OperationKind.BUDGET_PRUNE, plan.command)
    if plan.chosen or plan.clear_gave_up:
        await journal.intent(
            args=plan.selection.to_dict(),
            detail={"remove": [e.raw for e in plan.chosen], "history": plan.history_file},
            settles=plan.settles,
        )
    outcome = "failed"
    try:
        await _execute_prune(op, plan, report)
        outcome = "ok"
    except (asyncio.CancelledError, KeyboardInterrupt):
        interrupt.absorb()
        outcome = f"interrupted ({interrupt.received() or 'Ctrl-C'})"
        raise Interrupted(
            f"{outcome}: the prune itself is one atomic unit on the head",
            standing=[f"history: removed {stamps_text(report.removed_stamps)}"],
        ) from None
    except SparkOpsError as exc:
        outcome = f"failed: {exc.message}"
        raise
    finally:
        if plan.chosen or plan.clear_gave_up:
            detail = {
                "removed": stamps_json(report.removed_stamps),
                "backup": report.backup,
                "appended_kept": report.appended_kept,
                "vanished": report.vanished,
            }
            entry = audit.make_entry(
                OperationKind.BUDGET_PRUNE,
                args=plan.selection.to_dict(),
                outcome=outcome,
                detail=detail,
            )
            await journal.end(entry)
    return report


async def _execute_prune(op: Operation, plan: PrunePlan, report: PruneReport) -> None:
    """The prune itself (one atomic unit), then the gave-up file, then the budget."""
    if plan.chosen:

        async def unit() -> None:
            """Remove the lines and read what changed."""
            raws = [e.raw for e in plan.chosen]
            result = await op.watchdog.prune(raws=raws, reason="operator prune")
            report.removed = [HistEntry.from_read(e) for e in result.get("removed", [])]
            report.vanished = [str(r) for r in result.get("not_found", [])]
            report.backup = result.get("backup")
            seen = Counter([*plan.kept_raws, *(e.raw for e in plan.chosen)])
            report.appended_kept = list(
                (Counter(str(r) for r in result.get("kept_raws", [])) - seen).elements()
            )

        await interrupt.atomic(unit())
    if plan.clear_gave_up:
        report.gave_up_cleared = await op.watchdog.clear_gave_up()
    report.budget = await op.watchdog.budget()
