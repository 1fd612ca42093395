"""The restart's steps: trigger it through the watchdog, follow the boot, and their helpers.

`prepare_restart` reads what the restart is judged against (the history, the watchdog's flags,
the log's size, the head's clock, the outgoing engine) before the step starts; `fire` is the
atomic unit (record the window, trigger, identify and note the stamp); `boot` follows the new
engine until a real completion answers. The prune of the stamp is workflows/steps.py's.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

from spark_ops.engine.instance import START_SLACK_S
from spark_ops.engine.watch import EngineWatch
from spark_ops.errors import AmbiguousStamp, BootError, SparkOpsError
from spark_ops.readiness import BootReport, BootTracker, history_key, record_failed, wait_for_boot
from spark_ops.readiness import record as record_boot
from spark_ops.remote import FileWrite, WriteOutcome, engine_log_follow, sha256
from spark_ops.remote.programs.engine import LOG_SIZE
from spark_ops.remote.shell import REMOVE
from spark_ops.watchdog.contract import Trigger
from spark_ops.watchdog.identify import HistEntry, Identification, new_entries
from spark_ops.workflows import interrupt
from spark_ops.workflows.execution import Attempt, Done, Execution
from spark_ops.workflows.gate import missing_workers
from spark_ops.workflows.operation import BootFollowed, Operation, Outcome
from spark_ops.workflows.plan import StepKind
from spark_ops.workflows.postboot import kv_cache


async def prepare_restart(ex: Execution, kind: StepKind) -> None:
    """Before the restart step starts: what the restart will be judged against (reads only)."""
    op = ex.op
    before = await op.watchdog.entries()
    flags_before = await flags(op)
    start_at = await log_offset(op)
    if kind is StepKind.RESTART:  # a rollback's restart does not read the pool again
        found = ex.out.found
        found.kv_pool_before, found.kv_memory_before = await kv_cache(op)
    clock_before = await op.watchdog.clock()
    async with op.engine(timeout=5) as api:
        watch = await EngineWatch.before_restart(op.session, op.cluster, api, clock_before)
    ex.attempt = Attempt(before, flags_before, start_at, clock_before, watch)


async def fire(ex: Execution, kind: StepKind) -> Done:
    """Record the window, trigger, identify and note the stamp (the loop runs it atomically)."""
    op, out, a = ex.op, ex.out, ex.attempt
    assert a is not None
    await ex.journal.steps(ex.run.steps)
    known = [e.raw for e in a.before if e.stamp >= a.clock_before - 5.0]
    await ex.journal.note(kind, "running", window_from=a.clock_before, known=known)
    a.trigger = trigger = await op.watchdog.trigger(ex.opts.reason)
    out.found.restart_at = trigger.before
    out.found.printed_stamp = trigger.printed
    if trigger.exit_code != 0:
        await trigger_failed(ex, kind, trigger)
    a.found, a.stamp_error = await identify(op, trigger, a.before, ex.opts.reason)
    out.stamp = a.found.stamp if a.found else None
    await ex.journal.note(kind, "triggered", window_to=trigger.after, stamp=out.stamp)
    return Done(stamp_note(a.found, a.stamp_error))


async def boot(ex: Execution, kind: StepKind) -> Done:
    """Follow the new engine's boot; then say whether the watchdog acted meanwhile."""
    op, out, a = ex.op, ex.out, ex.attempt
    assert a is not None
    began = time.time()
    try:
        report = await wait(ex, a.start_at, a.watch)
        await time_from_engine(op, report, a.watch, a.trigger)
        out.boot = report
        out.boots.append(BootFollowed(kind, report))
        record_boot(history_key(op.cluster), report)  # the ETA learns the engine's own boot time
        return Done(boot_text(report, a.watch))
    except BootError as exc:  # status says the last boot failed; the ETAs skip it
        record_failed(
            history_key(op.cluster), at=began, total_s=time.time() - began,
            phase=exc.phase, error=exc.message,
        )  # fmt: skip
        raise
    except (asyncio.CancelledError, KeyboardInterrupt):
        interrupt.absorb()  # what follows (flags, the prune) still runs, then the interruption
        raise
    finally:
        await report_flags(op, out, a.flags_before)


async def identify(
    op: Operation, trigger: Trigger, before: list[HistEntry], reason: str
) -> tuple[Identification | None, SparkOpsError | None]:
    """Our history entry (recorded on the head as planned), or the ambiguity that stops pruning."""
    try:
        found = await op.watchdog.identify(trigger, before)
    except AmbiguousStamp as exc:
        return None, exc
    for entry in found.entries:
        try:
            await op.watchdog.note_planned(entry, reason)
        except SparkOpsError as exc:
            op.log.warning("planned stamp not recorded on the head", error=exc.message)
    return found, None


async def time_from_engine(
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


def stamp_note(found: Identification | None, error: SparkOpsError | None) -> str:
    """The restart step's detail: the stamp identified and how, or why none is."""
    if error is not None:
        return error.message
    if found is None or found.entry is None:
        extra = f"; {'; '.join(found.notes)}" if found and found.notes else ""
        return "no stamp identified yet (looked again after the boot)" + extra
    how = {
        "reported": "printed by the watchdog and in the history",
        "window": "the one new entry in the head-clock window",
        "record": "the record marked forced / planned",
    }.get(found.how, found.how)
    notes = f"; {'; '.join(found.notes)}" if found.notes else ""
    which = ", ".join(e.raw.strip() for e in found.entries)
    return f"stamp{'s' if len(found.entries) > 1 else ''} {which} ({how}){notes}"


async def flags(op: Operation) -> dict[str, bool]:
    """Whether the watchdog's pause and gave-up files exist on the head."""
    wd = op.cluster.watchdog
    out = {}
    for key, path in (("pause", wd.pause_file), ("gave-up", wd.gave_up_file)):
        if path:
            out[key] = (await op.session.read_file(op.cluster.head.name, path)) is not None
    return out


async def report_flags(op: Operation, out: Outcome, before: dict[str, bool]) -> None:
    """Warn when `pause` or `gave-up` appeared during the apply (the watchdog acted meanwhile)."""
    try:
        now = await flags(op)
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


async def trigger_failed(ex: Execution, name: StepKind, trigger: Trigger) -> None:
    """The restart command exited non-zero: undo the recipe write if no restart began; raise."""
    op, plan, run, out, a = ex.op, ex.plan, ex.run, ex.out, ex.attempt
    assert a is not None
    before, watch = a.before, a.watch
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
    if ex.paused and not began:
        async with op.engine() as api:
            await api.resume()
    written = plan.has(StepKind.WRITE) and plan.changes and name == StepKind.RESTART
    if not began and written:
        keep = op.cluster.recipe.keep_backups
        writes = [
            FileWrite(ch.host, ch.path, ch.old_text, sha256(ch.new_text), keep, run=ex.journal.run)
            for ch in plan.changes
        ]
        undone = await op.session.write_atomic(writes)
        await drop_backups(op, [*(out.found.write_backups or []), *undone])
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
            if written
            else "the engine may be down: check `spark-ops status`; `spark-ops restart` boots "
            "the recipe as it is"
        )
    else:
        error.message += "; no restart began"
        run.fail(name, error.message)
    raise error


async def drop_backups(op: Operation, backups: list[WriteOutcome]) -> None:
    """Remove the backups an undone write made (spark-ops' own files, nothing else)."""
    for b in backups:
        if b.backup:
            await op.session.call(b.host, REMOVE, b.backup, sudo=True)


async def wait(ex: Execution, start_at: int | None, watch: EngineWatch) -> BootReport:
    """Follow the new engine's boot from the log, the head and probes until it answers."""
    op, opts, on_event = ex.op, ex.opts, ex.on_event
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
            follow_log(op, start_at, watch),
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


async def log_offset(op: Operation) -> int | None:
    """The engine log's current size, so that following starts exactly at the restart."""
    eng = op.cluster.engine
    if eng.log_kind != "file":
        return None
    res = await op.session.call(op.cluster.head.name, LOG_SIZE, eng.log_target)
    try:
        return int(res.stdout.strip() or 0)
    except ValueError:
        return 0


async def follow_log(op: Operation, offset: int | None, watch: EngineWatch) -> AsyncIterator[str]:
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
