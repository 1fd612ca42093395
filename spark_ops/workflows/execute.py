"""Executing a plan step by step: write, drain, restart, boot, prune, verify, budget, audit."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from spark_ops import audit
from spark_ops.engine.identity import START_SLACK_S
from spark_ops.engine.watch import EngineWatch
from spark_ops.errors import (
    AmbiguousStamp,
    BootError,
    Interrupted,
    SparkOpsError,
    WriteError,
)
from spark_ops.headlib.backup import ROLLED_BACK
from spark_ops.readiness import BootEvent, BootReport, BootTracker, history_key, wait_for_boot
from spark_ops.readiness import record as record_boot
from spark_ops.remote import FileWrite, engine_log_follow, sha256
from spark_ops.remote.programs.engine import LOG_SIZE
from spark_ops.remote.shell import REMOVE
from spark_ops.watchdog.contract import BudgetView, Trigger
from spark_ops.watchdog.identify import (
    SLACK_S,
    HistEntry,
    Identification,
    fmt_stamp,
    new_entries,
    prune_command,
    stamp_json,
    stamps_json,
    stamps_text,
)
from spark_ops.workflows import interrupt
from spark_ops.workflows.gate import budget_refusal
from spark_ops.workflows.journal import RunJournal, write_facts
from spark_ops.workflows.operation import ApplyOptions, Operation, Outcome
from spark_ops.workflows.plan import Plan, Step, StepKind, StepRun, StepRunner
from spark_ops.workflows.postboot import kv_pool, verify_boot
from spark_ops.workflows.standing import standing

StepReporter = Callable[[StepRun], None]
EventReporter = Callable[[BootEvent], None]


async def execute(
    op: Operation,
    plan: Plan,
    opts: ApplyOptions,
    *,
    on_step: StepReporter | None = None,
    on_event: EventReporter | None = None,
) -> Outcome:
    """Run an apply or restart plan step by step: its intent first, then steps, then its end.

    The intent record is written on the head before anything changes (a failure to write it
    stops the run there); SIGINT / SIGTERM end the run after the atomic unit in progress and
    raise Interrupted, which says where the cluster stands and what converges it.
    """
    refused = budget_refusal(plan)  # the CLI refuses before its prompt; any other caller here
    if refused is not None:
        raise refused
    out = Outcome(plan, ok=False)
    journal = RunJournal(op, plan.operation, opts.command)
    await journal.intent(**intent_of(plan, opts))
    out.found.run = journal.run
    run = StepRunner(out.steps, on_step)
    failure: BaseException | None = None
    try:
        with interrupt.listening(lambda sig: _note_where(out, sig)):
            await _execute(op, plan, opts, out, run, on_event, journal)
    except (asyncio.CancelledError, KeyboardInterrupt):
        interrupt.absorb()
        failure = interrupted(plan, out, opts, run)
        raise failure from None
    except BaseException as exc:
        failure = exc
        raise
    finally:
        await journal.steps(out.steps)
        try:
            entry = audit_entry(plan, opts, out, failure)
        except Exception as exc:  # an entry is written whatever went wrong: a minimal one
            entry = audit_minimal(plan, out, failure, exc)
        await journal.end(entry)
    return out


def intent_of(plan: Plan, opts: ApplyOptions) -> dict[str, Any]:
    """The intent record's fields: what will be written where, whether a restart is triggered."""
    steps = [s.name for s in plan.steps]
    return {
        "args": _args(opts),
        "nodes": [c.host for c in plan.changes],
        "diff": "".join(c.diff for c in plan.changes),
        "detail": {
            "writes": write_facts(plan),
            "restart": StepKind.RESTART in steps,
            "steps": [str(s) for s in steps],
            "left_stamps": plan.facts.left_stamps or [],
            "budget": plan.facts.budget,
        },
        "settles": plan.facts.settles or [],
    }


def interrupted(plan: Plan, out: Outcome, opts: ApplyOptions, run: StepRunner) -> Interrupted:
    """The Interrupted error of a run stopped by a signal: the step, and where things stand."""
    why = f"interrupted ({interrupt.received() or 'KeyboardInterrupt'})"
    for s in out.steps:
        if s.status == "running":
            run.fail(s.name, why)
    where = out.found.interrupted_at or _where(out)
    return Interrupted(
        f"{why} {where}",
        standing=standing(plan, out, opts.command or f"spark-ops {plan.operation}"),
        hint="run the same command again: it compares the engine with the recipe and finishes",
    )


def _where(out: Outcome) -> str:
    """Where the run stands now: at the step running, or after the last one that ran."""
    running = [s.name for s in out.steps if s.status == "running"]
    if running:
        return f"at the {running[0]} step"
    began = [s.name for s in out.steps if s.status != "pending"]
    return f"after the {began[-1]} step" if began else "before the first step"


def _note_where(out: Outcome, signame: str) -> None:
    """Remember where the first signal found the run (later steps are its clean-up)."""
    if out.found.interrupted_at is None:
        out.found.interrupted_at = _where(out)


def _args(opts: ApplyOptions | None) -> dict[str, Any]:
    """The operator's arguments as the audit records them."""
    args: dict[str, Any] = {}
    for ch in opts.changes if opts is not None else ():
        args[ch.name.lstrip("-").replace("-", "_")] = "(removed)" if ch.remove else ch.value
    if opts is not None and opts.reason:
        args["reason"] = opts.reason
    if opts is not None and opts.force:
        args["force"] = True
    if opts is not None and opts.over_budget:
        args["over_budget"] = True
    return args


def audit_minimal(
    plan: Plan, out: Outcome, failure: BaseException | None, exc: Exception
) -> dict[str, Any]:
    """The audit entry when building the full one failed: operation, what was written, why."""
    return audit.make_entry(
        plan.operation,
        nodes=[c.host for c in plan.changes],
        outcome=f"failed: {type(failure).__name__ if failure else 'unknown'}",
        detail={"written": out.found.written or [], "entry_error": repr(exc)[:300]},
    )


def audit_entry(
    plan: Plan,
    opts: ApplyOptions | None = None,
    out: Outcome | None = None,
    failure: BaseException | None = None,
) -> dict[str, Any]:
    """The entry of an executed plan: operation, changes asked, nodes written, diffs, outcome."""
    args = _args(opts)
    if isinstance(failure, Interrupted):
        result = f"{failure.message}; " + "; ".join(failure.standing)
    elif failure is not None:
        result = f"failed: {getattr(failure, 'message', None) or failure or type(failure).__name__}"
    elif out is None:
        result = "not run"
    else:
        result = "rolled back" if out.rolled_back else "ok" if out.ok else "failed"
        bad = [c for c in out.checks if not c.ok]
        if result == "ok" and bad:
            names = ", ".join(sorted({f"{c.name}@{c.host}" for c in bad}))
            result = f"ok, checks failed: {names}"
        if out.history_problem is not None:
            result += f"; budget unknown: {out.history_problem['message']}"
    detail: dict[str, Any] = {}
    if out is not None:
        detail = {"stamp": stamp_json(out.stamp), "pruned": stamps_json(out.pruned)}
    written = out.found.written if out is not None else None
    if written is not None:
        detail["written"] = list(written)  # what changed, even when a later step failed
    return audit.make_entry(
        plan.operation,
        args=args,
        nodes=[c.host for c in plan.changes],
        diff="".join(c.diff for c in plan.changes),
        outcome=result,
        detail=detail,
    )


async def _execute(
    op: Operation,
    plan: Plan,
    opts: ApplyOptions,
    out: Outcome,
    run: StepRunner,
    on_event: EventReporter | None,
    journal: RunJournal,
) -> None:
    """The steps of apply / restart; our stamp is pruned even if the boot fails."""
    if plan.has(StepKind.SETTLE):
        await _settle(op, plan, run, out, journal)
    if not plan.has(StepKind.RESTART):
        out.ok = True
        return
    await op.api_url()
    if plan.has(StepKind.WRITE):
        await interrupt.atomic(_write(op, plan, run, out, journal))
    try:
        try:
            await _restart_and_wait(op, plan, run, out, opts, on_event, journal)
            out.ok = True
        except BootError as exc:
            out.error = exc.to_dict()
            if not (opts.rollback_on_failure and plan.changes):
                raise
            await _rollback(op, plan, run, out, opts, on_event, journal)
        if out.ok:
            out.checks = await verify_boot(op, plan, run, out)
    finally:
        out.budget = await _budget_step(op, run, plan, out)


async def _write(
    op: Operation, plan: Plan, run: StepRunner, out: Outcome, journal: RunJournal
) -> None:
    """The all-or-nothing recipe write, its step and its journal record: one atomic unit."""
    run.start(StepKind.WRITE)
    label = ROLLED_BACK if plan.operation == "rollback" else ""  # the version rolled away
    writes = [
        FileWrite(ch.host, ch.path, ch.new_text, ch.old_sha, op.cluster.recipe.keep_backups,
                  label=label)
        for ch in plan.changes
    ]  # fmt: skip
    try:
        done = await op.session.write_atomic(writes)
    except WriteError as exc:  # an undo that could not finish: what it left written
        out.found.written = list(exc.written)
        await journal.note("write", "failed", written=list(exc.written), detail=exc.message[:1000])
        raise
    out.found.written = [f"{d.host}:{d.path}" for d in done]  # named by the audit entry
    out.found.write_backups = [d.to_dict() for d in done]
    run.finish(StepKind.WRITE, "; ".join(f"{d.host}: backup {d.backup}" for d in done))
    await journal.steps(run.steps, {StepKind.WRITE: {"written": out.found.written}})


async def _settle(
    op: Operation, plan: Plan, run: StepRunner, out: Outcome, journal: RunJournal
) -> None:
    """Finish the dead runs the plan names: remove the planned stamps they left, by exact line."""
    run.start(StepKind.SETTLE)
    raws = [str(r) for r in plan.facts.left_stamps or []]
    if not raws:
        run.finish(StepKind.SETTLE, f"nothing was left by {', '.join(plan.facts.settles or [])}")
        await journal.steps(run.steps)
        return

    async def unit() -> None:
        """Prune the left stamps and record it."""
        result = await op.watchdog.prune(raws=raws, reason=f"planned restart ({op.name}, left)")
        removed = result["removed_stamps"]
        out.pruned.extend(removed)
        run.finish(StepKind.SETTLE, f"removed the stamp(s) left by a dead run: {removed}")
        await journal.steps(run.steps)

    await interrupt.atomic(unit())


async def _restart_and_wait(
    op: Operation,
    plan: Plan,
    run: StepRunner,
    out: Outcome,
    opts: ApplyOptions,
    on_event: EventReporter | None,
    journal: RunJournal,
    *,
    rollback: bool = False,
) -> None:
    """Drain, trigger, follow the new engine's boot, prune this restart's stamp in any case.

    `rollback`: the restart of a rollback (its own steps, no drain; the pool is not read again).
    """
    c = op.cluster
    paused = False
    if plan.has(StepKind.DRAIN) and not rollback:
        run.start(StepKind.DRAIN)
        async with op.engine() as api:
            drained = await api.drain(opts.drain_timeout_s)
        paused = bool(drained["paused"])
        run.finish(
            StepKind.DRAIN, _drain_text(drained), "done" if drained["drained"] else "skipped"
        )
    before = await op.watchdog.entries()
    flags_before = await _flags(op)
    start_at = await _log_offset(op)
    if not rollback:
        out.found.kv_pool_before = await kv_pool(op)
    clock_before = await op.watchdog.clock()
    async with op.engine(timeout=5) as api:
        watch = await EngineWatch.before_restart(op.session, c, api, clock_before)
    name = _of(StepKind.RESTART, rollback)
    boot = _of(StepKind.BOOT, rollback)
    trigger: Trigger | None = None
    found: Identification | None = None
    stamp_error: SparkOpsError | None = None
    boot_error: BaseException | None = None

    async def fire() -> None:
        """Record the window, trigger, identify and note the stamp: one atomic unit."""
        nonlocal trigger, found, stamp_error
        await journal.steps(run.steps)
        known = [e.raw for e in before if e.stamp >= clock_before - 5.0]
        await journal.note(name, "running", window_from=clock_before, known=known)
        trigger = await op.watchdog.trigger(opts.reason)
        out.found.restart_at = trigger.before
        out.found.printed_stamp = trigger.printed
        if trigger.exit_code != 0:
            await _trigger_failed(op, plan, run, out, name, trigger, before, watch, paused)
        found, stamp_error = await _identify(op, trigger, before, opts.reason)
        out.stamp = found.stamp if found else None
        await journal.note(name, "triggered", window_to=trigger.after, stamp=out.stamp)
        run.finish(name, _stamp_note(found, stamp_error))

    run.start(name)
    try:
        await interrupt.atomic(fire())
        run.start(boot)
        try:
            report = await _wait(op, opts, start_at, on_event, watch)
            await _time_from_engine(op, report, watch, trigger)
            out.boot = report
            out.boots.append({"step": boot.value, **report.to_dict()})
            record_boot(history_key(c), report)  # the ETA learns the engine's own boot time
            run.finish(boot, boot_text(report, watch))
        except BaseException as exc:
            boot_error = exc
            if isinstance(exc, asyncio.CancelledError | KeyboardInterrupt):
                interrupt.absorb()  # the prune below still runs, then the interruption
                run.fail(boot, f"interrupted ({interrupt.received() or 'Ctrl-C'})")
            else:
                run.fail(boot, getattr(exc, "message", None) or repr(exc))
        await journal.steps(run.steps)
        await _report_flags(op, out, flags_before)
    except BaseException as exc:
        if isinstance(exc, asyncio.CancelledError | KeyboardInterrupt):
            interrupt.absorb()  # the prune below still runs, then the interruption
        if run.step(name).status == "running":  # the restart step is always closed
            why = getattr(exc, "message", None) or f"interrupted ({type(exc).__name__})"
            run.fail(name, why)
        raise
    finally:
        if trigger is None:  # interrupted while triggering: a stamp may exist anyway
            after = await op.watchdog.clock()
            trigger = Trigger(clock_before, after, None, "")
        if (found is None or found.entry is None) and stamp_error is None:
            found, stamp_error = await _identify(op, trigger, before, opts.reason)
            out.stamp = found.stamp if found else None
        await interrupt.atomic(_prune_step(op, run, out, found, stamp_error, rollback, journal))
    if boot_error is not None:
        raise boot_error


async def _time_from_engine(
    op: Operation, report: BootReport, watch: EngineWatch, trigger: Trigger | None
) -> None:
    """Time the boot from the new engine's own start, and keep the restart command's time apart.

    The wait begins when the restart command returns, which may be long after the engine began
    (a watchdog that stops, starts and then waits): the head's clock, read now, places the
    moment the engine answered on the same clock as the engine's start.
    """
    if trigger is not None:
        report.restart_command_s = max(0.0, trigger.after - trigger.before)
    ready_local = report.started_at + report.total_s
    try:
        head_now = await op.watchdog.clock()
        ready_head = head_now - max(0.0, time.time() - ready_local)
        async with op.engine(timeout=5) as api:
            started, source = await watch.engine_start(api)
    except SparkOpsError as exc:
        op.log.warning("boot not timed from the engine's start", error=exc.message)
        return
    if started is None or (trigger is not None and started < trigger.before - START_SLACK_S):
        op.log.warning("boot not timed from the engine's start", why=source, started=started)
        return
    report.from_engine_start(started, ready_head, source)


def boot_text(report: BootReport, watch: EngineWatch) -> str:
    """The boot step's detail: the engine's own boot time, the restart command's time apart."""
    if report.engine_started_at is None or report.wait_s is None:
        return f"ready in {report.total_s:.1f} s of waiting ({watch_label(watch)})"
    command = (
        f"restart command {report.restart_command_s:.1f} s, "
        if report.restart_command_s is not None
        else ""
    )
    return (
        f"ready {report.total_s:.1f} s after the new engine started ({report.engine_start_from}); "
        f"{command}then {report.wait_s:.1f} s of waiting"
    )


def watch_label(watch: EngineWatch) -> str:
    """How the boot step names the engine instance it followed."""
    view = watch.latest
    return f"new engine: {view.label}" if view and view.new else "new engine: by its API start"


def _stamp_note(found: Identification | None, error: SparkOpsError | None) -> str:
    """The restart step's detail: the stamp identified and how, or why none is."""
    if error is not None:
        return error.message
    if found is None or found.entry is None:
        extra = f"; {'; '.join(found.notes)}" if found and found.notes else ""
        return "no stamp identified yet (looked again after the boot)" + extra
    how = {
        "reported": "printed by the watchdog and in the history",
        "window": "the one new entry in the head-clock window",
        "identical": "identical entries: one removed",
        "record": "the record marked forced / planned",
    }.get(found.how, found.how)
    notes = f"; {'; '.join(found.notes)}" if found.notes else ""
    return f"stamp {found.entry.raw.strip()} ({how}){notes}"


async def _flags(op: Operation) -> dict[str, bool]:
    """Whether the watchdog's pause and gave-up files exist on the head."""
    wd = op.cluster.watchdog
    out = {}
    for key, path in (("pause", wd.pause_file), ("gave-up", wd.gave_up_file)):
        if path:
            out[key] = (await op.session.read_file(op.cluster.head.name, path)) is not None
    return out


async def _report_flags(op: Operation, out: Outcome, before: dict[str, bool]) -> None:
    """Warn when `pause` or `gave-up` appeared during the apply (the watchdog acted meanwhile)."""
    try:
        now = await _flags(op)
    except SparkOpsError:
        return
    for key, present in now.items():
        if present and not before.get(key):
            wd = op.cluster.watchdog
            path = wd.pause_file if key == "pause" else wd.gave_up_file
            message = f"the watchdog's {key} file ({path}) appeared during this apply: " + (
                "it stood down (a watchdog without start-up grace counts a planned boot as "
                "a failure); read it, then `spark-ops budget prune --clear-gave-up`"
                if key == "gave-up"
                else "someone paused the watchdog meanwhile"
            )
            out.warnings.append(message)
            op.log.warning("watchdog flag appeared", flag=key, path=path)


async def _trigger_failed(
    op: Operation,
    plan: Plan,
    run: StepRunner,
    out: Outcome,
    name: StepKind,
    trigger: Trigger,
    before: list[HistEntry],
    watch: EngineWatch,
    paused: bool,
) -> None:
    """The restart command exited non-zero: undo the recipe write if no restart began; raise."""
    error = op.watchdog.failure(trigger)
    began: list[str] = []
    new = new_entries(before, await op.watchdog.entries())
    if new:
        began.append(f"new history entries {[e.raw for e in new]}")
    try:
        now = await watch.current()
    except SparkOpsError:
        now = None
    if watch.old is not None and (now is None or now.key != watch.old.key or not now.alive):
        if now is not None and now.pid == watch.old.pid and not now.alive:
            began.append(f"the engine ({watch.old.label()}) stopped")
        else:
            state = now.label() if now else "none"
            state += "" if now and now.alive else ", not running"
            began.append(f"the engine instance changed ({watch.old.label()} -> {state})")
    if paused and not began:
        async with op.engine() as api:
            await api.resume()
    written = plan.has(StepKind.WRITE) and plan.changes and name == StepKind.RESTART
    if not began and written:
        keep = op.cluster.recipe.keep_backups
        writes = [
            FileWrite(ch.host, ch.path, ch.old_text, sha256(ch.new_text), keep)
            for ch in plan.changes
        ]
        undone = await op.session.write_atomic(writes)
        await _drop_backups(op, [*(out.found.write_backups or []), *(u.to_dict() for u in undone)])
        error.message += "; no restart began: the recipe write was undone"
        run.fail(name, error.message)
        error.hint = "nothing changed on the cluster; fix the watchdog command, then run again"
    elif began:
        error.message += f"; a restart may have begun: {'; '.join(began)}"
        run.fail(name, error.message)
        error.hint = (
            "the recipe now holds the new values and the engine may not: check `spark-ops "
            "status`; `spark-ops restart` boots the recipe as it is, `spark-ops rollback` puts "
            "the old one back"
        )
    else:
        error.message += "; no restart began"
        run.fail(name, error.message)
    raise error


async def _drop_backups(op: Operation, backups: list[dict[str, Any]]) -> None:
    """Remove the backups an undone write made (spark-ops' own files, nothing else)."""
    for b in backups:
        if b.get("backup"):
            await op.session.call(b["host"], REMOVE, b["backup"], sudo=True)


async def _identify(
    op: Operation, trigger: Trigger, before: list[HistEntry], reason: str
) -> tuple[Identification | None, SparkOpsError | None]:
    """Our history entry (recorded on the head as planned), or the ambiguity that stops pruning."""
    try:
        found = await op.watchdog.identify(trigger, before)
    except AmbiguousStamp as exc:
        return None, exc
    if found.entry is not None:
        try:
            await op.watchdog.note_planned(found.entry, reason)
        except SparkOpsError as exc:
            op.log.warning("planned stamp not recorded on the head", error=exc.message)
    return found, None


async def _wait(
    op: Operation,
    opts: ApplyOptions,
    start_at: int | None,
    on_event: EventReporter | None,
    watch: EngineWatch,
) -> BootReport:
    """Follow the new engine's boot from the log, the head and probes until it answers."""
    c = op.cluster
    old_pids = {p.pid for p in watch.old.members} if watch.old else set()
    if watch.old is not None and watch.old.pid and watch.source == "pid_file":
        old_pids.add(watch.old.pid)
    tracker = BootTracker(after_restart=start_at is not None, old_pids=old_pids)
    async with op.engine(timeout=c.engine.probe_timeout_s) as api:

        async def probe() -> bool:
            """A real completion, from the new engine only."""
            await watch.check_answer(api)
            return bool(await api.complete(c.engine.probe_timeout_s))

        return await wait_for_boot(
            _follow_log(op, start_at, watch),
            probe=probe,
            health=api.health,
            deadline_s=opts.deadline_s or c.engine.boot_deadline_s,
            on_event=on_event,
            worker_stall_s=c.engine.worker_stall_s,
            probe_timeout_s=c.engine.probe_timeout_s,
            source_end_fatal=c.engine.log_kind == "docker",
            missing_workers=lambda: missing_workers(op),
            instance=watch.poll if watch.source else None,
            tracker=tracker,
            args_grace_s=30.0 if c.engine.log_kind in ("file", "docker", "command") else 0.0,
            rank_logs=watch.rank_logs(),
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
    found: Identification | None,
    stamp_error: SparkOpsError | None,
    rollback: bool,
    journal: RunJournal,
) -> None:
    """Remove exactly our entry; say why (and what to run) when none can be removed."""
    try:
        await _prune(op, run, out, found, stamp_error, rollback)
    finally:
        await journal.steps(run.steps)


async def _prune(
    op: Operation,
    run: StepRunner,
    out: Outcome,
    found: Identification | None,
    stamp_error: SparkOpsError | None,
    rollback: bool,
) -> None:
    """The prune step itself."""
    name = _of(StepKind.PRUNE, rollback)
    run.start(name)
    if stamp_error is not None:
        run.fail(name, stamp_error.message + (f" ({stamp_error.hint})" if stamp_error.hint else ""))
        raise stamp_error
    if found is None or found.entry is None:
        if found is not None and found.outside:
            error = AmbiguousStamp(
                "the planned restart's stamp cannot be identified: " + "; ".join(found.notes),
                hint="if one of them is the planned restart's, run the command shown for it",
            )
            run.fail(name, error.message)
            raise error
        evidence = await _restart_recorded(op, out)
        if evidence is not None:  # the watchdog recorded a restart, but not in this file
            out.history_problem = history_unmoved(op, *evidence)
            run.fail(name, out.history_problem["message"])
            return
        run.skip(
            name,
            f"the watchdog left no new stamp in {op.cluster.watchdog.history_file}: nothing to "
            "prune (right when the restart command bypasses the watchdog; if it goes through "
            "it, that file is not the watchdog's history: `spark-ops doctor` names the one its "
            "config does)",
        )
        return
    entry = found.entry
    try:
        result = await op.watchdog.prune_planned(entry, reason=f"planned restart ({op.name})")
    except SparkOpsError as exc:  # the history lock held too long: recorded, and said (#9)
        run.fail(name, exc.message + (f" ({exc.hint})" if exc.hint else ""))
        raise
    removed = result["removed_stamps"]
    out.pruned.extend(removed)
    if not removed:
        error = AmbiguousStamp(
            f"the planned stamp {entry.raw.strip()!r} was not found when pruning "
            "(the history changed meanwhile)",
            hint=f"see `spark-ops budget`; remove it with: {prune_command(entry)}",
        )
        run.fail(name, error.message)
        raise error
    run.finish(name, f"removed {stamps_text(removed)}; backup {result.get('backup')}")


async def _restart_recorded(op: Operation, out: Outcome) -> tuple[float, str] | None:
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


def history_unmoved(op: Operation, recorded: float, how: str) -> dict[str, Any]:
    """The report of a restart the watchdog recorded elsewhere: watchdog.history_file is wrong."""
    wd = op.cluster.watchdog
    stamp = fmt_stamp(recorded)
    return {
        "history_file": wd.history_file,
        "recorded_stamp": recorded,
        "message": (
            f"watchdog.history_file is wrong: {how}, "
            f"but {wd.history_file} on {op.cluster.head.name} did not change; the "
            f"watchdog keeps its history elsewhere, where stamp {stamp} now counts against the "
            "budget and was not pruned"
        ),
        "hint": (
            "set watchdog.history_file (and lock_file / journal_file) in the inventory to the "
            "files the watchdog's own config names (`spark-ops doctor` shows them), then remove "
            f"the planned stamp: spark-ops budget prune --stamp {stamp}"
        ),
    }


async def _budget_step(
    op: Operation, run: StepRunner, plan: Plan, out: Outcome
) -> BudgetView | None:
    """Report the budget as the head sees it now (none left is a warning, never a green ✓)."""
    if not plan.has(StepKind.BUDGET):
        return None
    run.start(StepKind.BUDGET)
    if out.history_problem is not None:
        run.fail(
            StepKind.BUDGET,
            f"unknown: {op.cluster.watchdog.history_file} is not the history the watchdog "
            "writes (see the prune step), so what it counts is not the watchdog's budget",
        )
        return None
    try:
        view = await op.watchdog.budget()
    except SparkOpsError as exc:
        run.fail(StepKind.BUDGET, exc.message)
        return None
    text = f"{view.used}/{view.allowed} used in the window"
    if view.used < view.allowed:
        run.finish(StepKind.BUDGET, text)
        return view
    spent = (
        f"restart budget {text}: no slot left, the watchdog cannot restart the engine if it "
        "fails now"
    )
    out.warnings.append(spent)
    run.skip(StepKind.BUDGET, spent)
    return view


async def _rollback(
    op: Operation,
    plan: Plan,
    run: StepRunner,
    out: Outcome,
    opts: ApplyOptions,
    on_event: EventReporter | None,
    journal: RunJournal,
) -> None:
    """Restore the recipe as it was before, restart, wait, prune again."""
    for kind, desc in (
        (StepKind.ROLLBACK, "restore the previous recipe on every node"),
        (StepKind.RESTART_ROLLBACK, "force a restart with the previous recipe"),
        (StepKind.BOOT_ROLLBACK, "follow the boot of the previous recipe"),
        (StepKind.PRUNE_ROLLBACK, "remove the rollback restart's stamp"),
    ):
        run.add(Step(kind, desc, (op.cluster.head.name,)))  # the run's, not the plan shown

    async def restore() -> None:
        """Write the old text back everywhere and record it: one atomic unit."""
        run.start(StepKind.ROLLBACK)
        keep = op.cluster.recipe.keep_backups
        writes = [
            FileWrite(ch.host, ch.path, ch.old_text, sha256(ch.new_text), keep, label=ROLLED_BACK)
            for ch in plan.changes
        ]
        done = await op.session.write_atomic(writes)
        run.finish(StepKind.ROLLBACK, "previous recipe restored")
        written = [f"{d.host}:{d.path}" for d in done]
        await journal.steps(run.steps, {StepKind.ROLLBACK: {"written": written}})

    await interrupt.atomic(restore())
    await _restart_and_wait(op, plan, run, out, opts, on_event, journal, rollback=True)
    out.rolled_back = True


def _of(kind: StepKind, rollback: bool) -> StepKind:
    """The step of this kind in apply's restart, or in the rollback's."""
    return kind.of_rollback() if rollback else kind


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
    res = await op.session.call(op.cluster.head.name, LOG_SIZE, eng.log_target)
    try:
        return int(res.stdout.strip() or 0)
    except ValueError:
        return 0


async def _follow_log(op: Operation, offset: int | None, watch: EngineWatch) -> AsyncIterator[str]:
    """Follow the engine log from the restart on.

    A plain file is read from the byte offset taken before the restart (the outgoing engine's
    last lines included: readiness tells them apart); the engine's exit is seen by the watch,
    never by the end of a `tail --pid` of a pid the outgoing engine may still hold. A container
    log is followed once the new container runs, from its start time.
    """
    eng = op.cluster.engine
    if eng.log_kind == "docker":
        inst = None
        while inst is None or not inst.alive or inst.key == (watch.old.key if watch.old else None):
            await asyncio.sleep(0.5)
            with contextlib.suppress(SparkOpsError):
                inst = await watch.current()
        cmd = engine_log_follow(eng, from_time=inst.key.split("@", 1)[1])
    elif eng.log_kind == "journalctl":  # from the restart on: the new unit's first lines too
        cmd = engine_log_follow(eng, from_time=f"@{int(watch.restart_at) - 1}")
    else:
        cmd = engine_log_follow(eng, from_offset=offset)
    async for line in op.session.stream_lines(op.cluster.head.name, cmd):
        yield line
