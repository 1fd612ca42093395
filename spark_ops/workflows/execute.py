"""Executing a plan step by step: write, drain, restart, boot, prune, verify, budget, audit."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

from spark_ops.errors import (
    AmbiguousStamp,
    BootError,
    SparkOpsError,
)
from spark_ops.plan import Plan, StepRunner
from spark_ops.postboot import kv_pool, verify_boot
from spark_ops.remote import FileWrite, quote_path, sha256
from spark_ops.watchdog.contract import Trigger
from spark_ops.watchdog.history import ROLLED_BACK
from spark_ops.workflows.operation import ApplyOptions, Operation, Outcome

StepReporter = Callable[[Any], None]
EventReporter = Callable[[Any], None]


async def execute(
    op: Operation,
    plan: Plan,
    opts: ApplyOptions,
    *,
    on_step: StepReporter | None = None,
    on_event: EventReporter | None = None,
) -> Outcome:
    """Run an apply or restart plan step by step; the audit log on the head records the outcome."""
    out = Outcome(plan, ok=False)
    failure: BaseException | None = None
    try:
        await _execute(op, plan, opts, out, StepRunner(plan, on_step), on_event)
    except BaseException as exc:
        failure = exc
        raise
    finally:
        try:
            entry = audit_entry(plan, opts, out, failure)
        except Exception as exc:  # an entry is written whatever went wrong: a minimal one
            entry = audit_minimal(plan, failure, exc)
        await _audit(op, entry)
    return out


def audit_minimal(plan: Plan, failure: BaseException | None, exc: Exception) -> dict[str, Any]:
    """The audit entry when building the full one failed: operation, what was written, why."""
    from spark_ops import audit

    return audit.make_entry(
        plan.operation,
        nodes=[c.host for c in plan.changes],
        outcome=f"failed: {type(failure).__name__ if failure else 'unknown'}",
        detail={"written": plan.facts.get("written", []), "entry_error": repr(exc)[:300]},
    )


def audit_entry(plan: Plan, opts: Any, out: Any, failure: BaseException | None) -> dict[str, Any]:
    """The audit entry of an executed plan."""
    from spark_ops import audit

    return audit.entry_for(plan, opts, out, error=failure)


async def _audit(op: Operation, entry: dict[str, Any]) -> None:
    """Append to the head's audit log; a failure to do so is logged, never raised."""
    from spark_ops import audit

    try:
        await audit.record(op.session, entry)
    except SparkOpsError as exc:
        op.log.warning("audit log not written", error=exc.message)
    except Exception as exc:  # never hide the failure being audited behind the audit's own
        op.log.error("audit log not written", error=repr(exc)[:300])


async def _execute(
    op: Operation,
    plan: Plan,
    opts: ApplyOptions,
    out: Outcome,
    run: StepRunner,
    on_event: EventReporter | None,
) -> None:
    """The steps of apply / restart; our stamp is pruned even if the boot fails."""
    steps = {s.name for s in plan.steps}
    await op.api_url()
    if "write" in steps:
        run.start("write")
        label = ROLLED_BACK if plan.operation == "rollback" else ""  # the version rolled away
        writes = [
            FileWrite(ch.host, ch.path, ch.new_text, ch.old_sha, op.cluster.recipe.keep_backups,
                      label=label)
            for ch in plan.changes
        ]  # fmt: skip
        done = await op.session.write_atomic(writes)
        plan.facts["written"] = [f"{d.host}:{d.path}" for d in done]  # named by the audit entry
        run.finish("write", "; ".join(f"{d.host}: backup {d.backup}" for d in done))
    try:
        try:
            await _restart_and_wait(op, plan, run, out, opts, on_event)
            out.ok = True
        except BootError as exc:
            out.error = exc.to_dict()
            if not (opts.rollback_on_failure and plan.changes):
                raise
            await _rollback(op, plan, run, out, opts, on_event)
        if out.ok:
            out.checks = await verify_boot(op, plan, run, out)
    finally:
        out.budget = await _budget_step(op, run, plan)


async def _restart_and_wait(
    op: Operation,
    plan: Plan,
    run: StepRunner,
    out: Outcome,
    opts: ApplyOptions,
    on_event: EventReporter | None,
    *,
    suffix: str = "",
) -> None:
    """Drain, trigger, follow the boot, and prune this restart's stamp whatever the boot did."""
    from spark_ops.readiness import record as record_boot

    c = op.cluster
    steps = {s.name for s in plan.steps}
    paused = False
    if "drain" in steps and not suffix:
        run.start("drain")
        async with op.engine() as api:
            drained = await api.drain(opts.drain_timeout_s)
        paused = bool(drained["paused"])
        run.finish("drain", _drain_text(drained), "done" if drained["drained"] else "skipped")
    before = await op.watchdog.stamps()
    start_at = await _log_offset(op)
    if not suffix:
        plan.facts["kv_pool_before"] = await kv_pool(op)
    clock_before = await op.watchdog.clock()
    run.start("restart" + suffix)
    trigger: Trigger | None = None
    stamp: float | None = None
    stamp_error: SparkOpsError | None = None
    boot_error: BaseException | None = None
    try:
        try:
            trigger = await op.watchdog.trigger(opts.reason)
        except SparkOpsError:
            if paused:  # the engine keeps serving: let it take new work again
                async with op.engine() as api:
                    await api.resume()
            raise
        plan.facts["restart_at"] = trigger.before
        stamp, stamp_error = await _identify(op, trigger, before)
        note = f"stamp {stamp}" if stamp is not None else "no stamp identified"
        run.finish("restart" + suffix, note)
        out.stamp = stamp
        run.start("boot" + suffix)
        try:
            report = await _wait(op, opts, start_at, on_event)
            out.boot = report.to_dict()
            record_boot(c.name, report)
            run.finish("boot" + suffix, f"ready in {report.total_s:.1f} s")
        except BaseException as exc:
            boot_error = exc
            run.fail("boot" + suffix, getattr(exc, "message", str(exc)))
    finally:
        if trigger is None:  # interrupted or failed while triggering: a stamp may exist anyway
            after = await op.watchdog.clock()
            trigger = Trigger(clock_before, after, None, "")
        if stamp is None and stamp_error is None:
            stamp, stamp_error = await _identify(op, trigger, before)
            out.stamp = stamp
        await _prune_step(op, run, out, stamp, stamp_error, suffix)
    if boot_error is not None:
        raise boot_error


async def _identify(
    op: Operation, trigger: Trigger, before: list[float]
) -> tuple[float | None, SparkOpsError | None]:
    """Our stamp, or the ambiguity that keeps us from pruning any."""
    try:
        return await op.watchdog.identify(trigger, before), None
    except AmbiguousStamp as exc:
        return None, exc


async def _wait(
    op: Operation, opts: ApplyOptions, start_at: int | None, on_event: EventReporter | None
) -> Any:
    """Follow the boot from the log and probes until a real completion answers."""
    from spark_ops.readiness import wait_for_boot

    c = op.cluster
    async with op.engine(timeout=c.engine.probe_timeout_s) as api:
        return await wait_for_boot(
            _follow_log(op, start_at),
            probe=lambda: api.complete(c.engine.probe_timeout_s),
            health=api.health,
            deadline_s=opts.deadline_s or c.engine.boot_deadline_s,
            on_event=on_event,
            worker_stall_s=c.engine.worker_stall_s,
            probe_timeout_s=c.engine.probe_timeout_s,
            source_end_fatal=start_at is not None,
            missing_workers=lambda: missing_workers(op),
        )


async def missing_workers(op: Operation) -> list[str]:
    """Workers whose Ray worker cannot be up: no SSH answer, or the worker check says not running.

    The check (`engine.worker_check`, default `pgrep -x raylet`) counts only when it exits 1, its
    "no such process"; any other failure (not installed, no permission) leaves the node unknown,
    never wrongly named missing.
    """
    engine = op.cluster.engine
    names = [n.name for n in op.cluster.workers]
    check = engine.worker_check or "true"
    results = await op.session.run_all(check, names, check=False, timeout=5)
    missing = []
    for host, res in results.items():
        if isinstance(res, SparkOpsError):
            missing.append(f"{host} (no SSH answer)")
        elif engine.worker_check and engine.worker_down(res.exit_code):
            missing.append(f"{host} (`{check}` exited 1: its Ray worker is not running)")
    return missing


async def _prune_step(
    op: Operation,
    run: StepRunner,
    out: Outcome,
    stamp: float | None,
    stamp_error: SparkOpsError | None,
    suffix: str,
) -> None:
    """Remove exactly our stamp; say why when none can be removed."""
    name = "prune"
    if suffix and f"prune{suffix}" in {s.name for s in run.plan.steps}:
        name += suffix
    run.start(name)
    if stamp_error is not None:
        run.fail(name, stamp_error.message + (f" ({stamp_error.hint})" if stamp_error.hint else ""))
        raise stamp_error
    if stamp is None:
        run.skip(name, "the watchdog left no new stamp: nothing to prune")
        return
    result = await op.watchdog.prune(stamps=[stamp], reason=f"planned restart ({op.name})")
    removed = result["removed_stamps"]
    out.pruned.extend(removed)
    run.finish(name, f"removed {removed}; backup {result.get('backup')}")


async def _budget_step(op: Operation, run: StepRunner, plan: Plan) -> dict[str, Any] | None:
    """Report the budget as the head sees it now."""
    if "budget" not in {s.name for s in plan.steps}:
        return None
    run.start("budget")
    try:
        view = await op.watchdog.budget()
    except SparkOpsError as exc:
        run.fail("budget", exc.message)
        return None
    run.finish("budget", f"{view.used}/{view.allowed} used in the window")
    return view.to_dict()


async def _rollback(
    op: Operation,
    plan: Plan,
    run: StepRunner,
    out: Outcome,
    opts: ApplyOptions,
    on_event: EventReporter | None,
) -> None:
    """Restore the recipe as it was before, restart, wait, prune again."""
    for name, desc in (
        ("rollback", "restore the previous recipe on every node"),
        ("restart-rollback", "force a restart with the previous recipe"),
        ("boot-rollback", "follow the boot of the previous recipe"),
        ("prune-rollback", "remove the rollback restart's stamp"),
    ):
        plan.add(name, desc, [op.cluster.head.name])
    run.start("rollback")
    keep = op.cluster.recipe.keep_backups
    writes = [
        FileWrite(ch.host, ch.path, ch.old_text, sha256(ch.new_text), keep, label=ROLLED_BACK)
        for ch in plan.changes
    ]
    await op.session.write_atomic(writes)
    run.finish("rollback", "previous recipe restored")
    await _restart_and_wait(op, plan, run, out, opts, on_event, suffix="-rollback")
    out.rolled_back = True


def _drain_text(d: dict[str, Any]) -> str:
    """One line on what draining waited for (and whether new work was stopped)."""
    stopped = (
        "new work stopped (/pause)"
        if d.get("paused")
        else "the engine offers no /pause (VLLM_SERVER_DEV_MODE): new work still admitted"
    )
    if d.get("running_at_start") == 0:
        return f"no request in flight; {stopped}"
    state = "drained" if d.get("drained") else "not drained (timeout)"
    return (
        f"{d.get('running_at_start')} request(s) in flight; {state} after {d.get('seconds')} s; "
        f"{stopped}"
    )


async def _log_offset(op: Operation) -> int | None:
    """The engine log's current size, so that following starts exactly at the restart."""
    eng = op.cluster.engine
    if eng.log_kind != "file":
        return None
    res = await op.session.run(
        op.cluster.head.name,
        f"stat -c %s -- {quote_path(eng.log_target)} 2>/dev/null || echo 0",
        check=False,
    )
    try:
        return int(res.stdout.strip() or 0)
    except ValueError:
        return 0


async def _follow_log(op: Operation, offset: int | None) -> AsyncIterator[str]:
    """Follow the engine log from the restart on (from a byte offset for plain files)."""
    eng = op.cluster.engine
    if offset is None:
        cmd = eng.follow_command()
    elif eng.pid_file:  # tail ends when the engine process does: an exit is seen at once
        cmd = (
            f"pid=$(cat {quote_path(eng.pid_file)} 2>/dev/null | head -n 1); "
            f'exec tail -s 0.2 -c +{offset + 1} -F ${{pid:+--pid="$pid"}} '
            f"-- {quote_path(eng.log_target)} 2>/dev/null"
        )
    else:
        cmd = f"tail -c +{offset + 1} -F -- {quote_path(eng.log_target)} 2>/dev/null"
    async for line in op.session.stream_lines(op.cluster.head.name, cmd):
        yield line
