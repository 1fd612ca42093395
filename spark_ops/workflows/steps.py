"""The runners of the plan's steps around the restart: settle, write, drain, prune, verify,
budget, and a failed boot's rollback (the restart and the boot are workflows/restart.py's).

Each runner does its step's work between the start and the finish the loop reports, and returns
the step's detail line (`Done`); workflows/execute.py's table says how the loop runs it.
"""

from __future__ import annotations

from typing import Any

from spark_ops.errors import AmbiguousStamp, BootError, SparkOpsError, WriteError
from spark_ops.headlib.backup import ROLLED_BACK
from spark_ops.remote import FileWrite, sha256
from spark_ops.watchdog.contract import Trigger
from spark_ops.watchdog.identify import (
    SLACK_S,
    HistEntry,
    fmt_stamp,
    new_entries,
    prune_command,
    stamps_text,
)
from spark_ops.workflows.converge import dead_runs
from spark_ops.workflows.disruption import restart_lease_seconds, settle_leases
from spark_ops.workflows.execution import Done, Execution
from spark_ops.workflows.facts import HistoryProblem
from spark_ops.workflows.journal import Run
from spark_ops.workflows.operation import Operation, Outcome
from spark_ops.workflows.plan import OperationKind, Step, StepKind
from spark_ops.workflows.postboot import verify_boot
from spark_ops.workflows.prove import Regressed
from spark_ops.workflows.restart import identify


async def settle(ex: Execution, kind: StepKind) -> Done:
    """Finish the dead runs the plan names: remove the planned stamps they left, by exact line."""
    facts = ex.plan.facts
    dead = await dead_runs(ex.op)
    ended = "; ".join(s for s in (await settle_leases(ex.op, dead), await _discard(ex, dead)) if s)
    raws = [str(r) for r in facts.left_stamps or []]
    if not raws:
        left = f"nothing was left by {', '.join(facts.settles or [])}"
        return Done(f"{ended}; no stamp was left" if ended else left)
    reason = f"planned restart ({ex.op.name}, left)"
    result = await ex.op.watchdog.prune(raws=raws, reason=reason)
    removed = result["removed_stamps"]
    ex.out.pruned.extend(removed)
    pruned = f"removed the stamp(s) left by a dead run: {removed}"
    return Done(f"{ended}; {pruned}" if ended else pruned)  # what else it did is said too


async def _discard(ex: Execution, dead: list[Run]) -> str:
    """Remove the staged files the dead runs left (killed between staging and renaming): only
    files whose name carries a dead run's id, beside the targets its intent named."""
    removed: list[str] = []
    kept: list[str] = []
    for r in dead:
        for host, path in r.planned_writes:
            try:
                gone = await ex.op.session.discard_run(host, path, r.run)
            except SparkOpsError as exc:  # left for the writer's own 10-minute clean-up; said
                ex.op.log.warning("staged files not removed", host=host, error=exc.message)
                kept.append(f"{host}:{path} ({exc.message})")
                continue
            removed.extend(f"{host}:{f}" for f in gone)
    said = [f"removed the staged file(s) a dead run left: {', '.join(removed)}"] if removed else []
    if kept:
        said.append(f"staged files of a dead run not looked for beside {'; '.join(kept)}")
    return "; ".join(said)


async def lease(ex: Execution, kind: StepKind) -> Done:
    """Pause the watchdog with a lease for the restart; the journal records it (its run id is in
    the lease, so a dead run's is found by the next run's settle step)."""
    op = ex.op
    await ex.journal.note(kind.value, "taking", path=op.cluster.watchdog.pause_file)
    why = f"planned restart ({op.name}, run {ex.leases.run})"
    held = await ex.leases.take(why, restart_lease_seconds(op.cluster, ex.opts))
    status = "done" if held.state in ("held", "found") else "skipped"
    return Done(held.text(), status, {"lease": held.to_dict()})


async def release(ex: Execution, kind: StepKind) -> Done:
    """End the run's lease on every way out (never raises: a lease not ended lapses)."""
    said = await ex.leases.end_all() if ex.leases.held else []
    return Done("; ".join(said) or "no lease of this run to end")


async def write(ex: Execution, kind: StepKind) -> Done:
    """The all-or-nothing recipe write; a write stopped half-way says what it left written."""
    op, out = ex.op, ex.out
    label = (
        ROLLED_BACK if ex.plan.operation is OperationKind.ROLLBACK else ""
    )  # the version rolled away
    writes = [
        FileWrite(ch.host, ch.path, ch.new_text, ch.old_sha, op.cluster.recipe.keep_backups,
                  label=label, run=ex.journal.run)
        for ch in ex.plan.changes
    ]  # fmt: skip
    try:
        done = await op.session.write_atomic(writes)
    except WriteError as exc:  # an undo that could not finish: what it left written
        out.found.written = list(exc.written)
        await ex.journal.note(
            "write", "failed", written=list(exc.written), detail=exc.message[:1000]
        )
        raise
    out.found.written = [f"{d.host}:{d.path}" for d in done]  # named by the audit entry
    out.found.write_backups = list(done)
    detail = "; ".join(f"{d.host}: backup {d.backup}" for d in done)
    return Done(detail, journal={"written": out.found.written})


async def drain(ex: Execution, kind: StepKind) -> Done:
    """Wait for the requests in flight (and stop new work where the engine offers /pause)."""
    async with ex.op.engine() as api:
        drained = await api.drain(ex.opts.drain_timeout_s)
    ex.paused = bool(drained["paused"])
    return Done(drain_text(drained), "done" if drained["drained"] else "skipped")


def drain_text(d: dict[str, Any]) -> str:
    """One line on what draining waited for (and whether new work was stopped)."""
    stopped = (
        "new work stopped (/pause)"
        if d.get("paused")
        else "the engine offers no /pause (VLLM_SERVER_DEV_MODE): new work still admitted"
    )
    if d.get("running_at_end") is None and not d.get("drained"):  # no /metrics answer
        return "the engine does not answer: nothing to drain"
    if d.get("running_at_start") == 0:
        return f"no request in flight; {stopped}"
    state = "drained" if d.get("drained") else "not drained (timeout)"
    return (
        f"{d.get('running_at_start')} request(s) in flight; {state} after {d.get('seconds')} s; "
        f"{stopped}"
    )


async def prepare_prune(ex: Execution, kind: StepKind) -> None:
    """Before the prune: a restart interrupted while triggering, or whose stamp was not found
    yet, is identified again now (the boot has had time to let the watchdog write it), and every
    restart is counted again (a command that restarted twice left two entries)."""
    a = ex.attempt
    assert a is not None
    if a.trigger is None:  # interrupted while triggering: a stamp may exist anyway
        after = await ex.op.watchdog.clock()
        a.trigger = Trigger(a.clock_before, after, None, "")
    if a.stamp_error is None:  # counted again at the end: a second restart in the window
        a.found, a.stamp_error = await identify(ex.op, a.trigger, a.before, ex.opts.reason)
        ex.out.stamp = a.found.stamp if a.found else None


async def prune(ex: Execution, kind: StepKind) -> Done:
    """Remove exactly our entry; say why (and what to run) when none can be removed."""
    done = await _prune(ex, kind)
    if kind is StepKind.PRUNE_ROLLBACK and ex.failure is None:
        ex.out.rolled_back = True  # the previous recipe booted and its stamp is gone
    return done


async def _prune(ex: Execution, kind: StepKind) -> Done:
    """The prune itself: a refusal marks the step failed and raises."""
    op, run, out, a = ex.op, ex.run, ex.out, ex.attempt
    assert a is not None
    found, stamp_error = a.found, a.stamp_error
    if stamp_error is not None:
        run.fail(kind, stamp_error.message + (f" ({stamp_error.hint})" if stamp_error.hint else ""))
        raise stamp_error
    if found is None or found.entry is None:
        if found is not None and found.outside:
            error = AmbiguousStamp(
                "the planned restart's stamp cannot be identified: " + "; ".join(found.notes),
                hint="if one of them is the planned restart's, run the command shown for it",
            )
            run.fail(kind, error.message)
            raise error
        evidence = await restart_recorded(op, out)
        if evidence is not None:  # the watchdog recorded a restart, but not in this file
            out.history_problem = history_unmoved(op, *evidence)
            return Done(out.history_problem.message, "failed")
        return Done(
            f"the watchdog left no new stamp in {op.cluster.watchdog.history_file}: nothing to "
            "prune (right when the restart command bypasses the watchdog; if it goes through "
            "it, that file is not the watchdog's history: `spark-ops doctor` names the one its "
            "config does)",
            "skipped",
        )
    entry = found.entry
    try:
        result = await op.watchdog.prune_planned(
            entry, reason=f"planned restart ({op.name})", also=tuple(found.entries[:-1])
        )
    except SparkOpsError as exc:  # the history lock held too long: recorded, and said (#9)
        run.fail(kind, exc.message + (f" ({exc.hint})" if exc.hint else ""))
        raise
    removed = result["removed_stamps"]
    out.pruned.extend(removed)
    if len(removed) < len(found.entries):  # every identified entry, counted
        taken = [HistEntry(0.0, str(r.get("raw"))) for r in result.get("removed", [])]
        missing = new_entries(taken, found.entries)
        error = AmbiguousStamp(
            f"the planned stamp(s) {', '.join(repr(e.raw.strip()) for e in missing)} were not "
            f"all found when pruning ({len(removed)} of {len(found.entries)} removed; the "
            "history changed meanwhile)",
            hint="see `spark-ops budget`; remove them with: "
            + " | ".join(prune_command(e) for e in missing),
        )
        run.fail(kind, error.message)
        raise error
    return Done(f"removed {stamps_text(removed)}; backup {result.get('backup')}")


async def restart_recorded(op: Operation, out: Outcome) -> tuple[float, str] | None:
    """(stamp, how it is known, in words) when the watchdog recorded this restart although the
    history did not change: the stamp its restart command printed, else a restart record its journal
    (watchdog.journal_file) gained since the restart began."""
    printed = out.found.printed_stamp
    if printed is not None:
        return float(printed), f"the watchdog printed stamp {fmt_stamp(printed)} for this restart"
    began = out.found.restart_at
    try:
        last = await op.watchdog.last_restart()
    except SparkOpsError:
        return None
    if began is None or not last or last.get("stamp") is None:
        return None
    try:
        stamp = float(last["stamp"])
    except (TypeError, ValueError):
        return None
    if stamp < float(began) - SLACK_S:
        return None
    return (
        stamp,
        f"the watchdog's journal ({op.watchdog.journal}) recorded stamp {fmt_stamp(stamp)}",
    )


def history_unmoved(op: Operation, recorded: float, how: str) -> HistoryProblem:
    """The report of a restart the watchdog recorded elsewhere: watchdog.history_file is wrong."""
    wd = op.cluster.watchdog
    stamp = fmt_stamp(recorded)
    return HistoryProblem(
        history_file=wd.history_file,
        recorded_stamp=recorded,
        message=(
            f"watchdog.history_file is wrong: {how}, "
            f"but {wd.history_file} on {op.cluster.head.name} did not change; the "
            f"watchdog keeps its history elsewhere, where stamp {stamp} now counts against the "
            "budget and was not pruned"
        ),
        hint=(
            "set watchdog.history_file (and lock_file / journal_file) in the inventory to the "
            "files the watchdog's own config names (`spark-ops doctor` shows them), then remove "
            f"the planned stamp: spark-ops budget prune --stamp {stamp}"
        ),
    )


async def verify(ex: Execution, kind: StepKind) -> Done:
    """After a good boot: effective args, KV pool, free memory, Xid lines, still serving."""
    ex.out.checks = checks = await verify_boot(ex.op, ex.plan, ex.out)
    bad = [ch for ch in checks if not ch.ok]
    passed = f"{len(checks) - len(bad)}/{len(checks)} checks passed"
    return Done(passed, "done" if not bad else "failed")


async def budget(ex: Execution, kind: StepKind) -> Done:
    """Report the budget as the head sees it now (none left is a warning, never a green ✓)."""
    op, out = ex.op, ex.out
    if out.history_problem is not None:
        return Done(
            f"unknown: watchdog.history_file ({op.cluster.watchdog.history_file}) is not the "
            "history the watchdog writes (see the prune step), so what it counts is not the "
            "watchdog's budget",
            "failed",
        )
    try:
        view = await op.watchdog.budget()
    except SparkOpsError as exc:
        return Done(exc.message, "failed")
    out.budget = view
    text = f"{view.used}/{view.allowed} used in the window"
    if view.used < view.allowed:
        return Done(text)
    spent = (
        f"restart budget {text}: no slot left, the watchdog cannot restart the engine if it "
        "fails now"
    )
    out.warnings.append(spent)
    return Done(spent, "skipped")


def rollback_wanted(ex: Execution) -> bool:
    """A failed boot is recorded; it is rolled back when the options ask and files changed. A
    regression (apply --prove's gate failed) is always rolled back."""
    if isinstance(ex.failure, Regressed):
        ex.out.error = ex.failure
        return bool(ex.plan.changes)
    if not isinstance(ex.failure, BootError):
        return False
    ex.out.error = ex.failure
    return ex.opts.rollback_on_failure and bool(ex.plan.changes)


async def prepare_rollback(ex: Execution, kind: StepKind) -> None:
    """The rollback's own steps join the run (the run's, not the plan shown)."""
    for step, desc in (
        (StepKind.ROLLBACK, "restore the previous recipe on every node"),
        (StepKind.RESTART_ROLLBACK, "force a restart with the previous recipe"),
        (StepKind.BOOT_ROLLBACK, "follow the boot of the previous recipe"),
        (StepKind.PRUNE_ROLLBACK, "remove the rollback restart's stamp"),
    ):
        ex.run.add(Step(step, desc, (ex.op.cluster.head.name,)))
    ex.failure = None  # recovered by the steps that follow, or replaced by their failure


async def restore(ex: Execution, kind: StepKind) -> Done:
    """Write the old text back everywhere (the rollback's restart follows)."""
    keep, run = ex.op.cluster.recipe.keep_backups, ex.journal.run
    writes = [
        FileWrite(ch.host, ch.path, ch.old_text, sha256(ch.new_text), keep, ROLLED_BACK, run)
        for ch in ex.plan.changes
    ]
    done = await ex.op.session.write_atomic(writes)
    written = [f"{d.host}:{d.path}" for d in done]
    return Done("previous recipe restored", journal={"written": written})
