"""Wait for a vLLM boot: read live log lines, probe the API, fail fast, honour a deadline.

The watchers (log lines, probes, Ray workers, the engine instance, worker ranks) run side by
side and feed one BootState (readiness.boot); the loop here judges it until the engine answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from spark_ops.errors import BootTimeout
from spark_ops.log import get_logger
from spark_ops.readiness.boot import (
    BootState,
    exit_error,
    ready_without_workers,
    stall_error,
    survivors_text,
)
from spark_ops.readiness.ranks import RankLog, not_started, rank_error, read_rank
from spark_ops.readiness.report import BootEvent, BootReport, InstanceWatch
from spark_ops.readiness.tracker import BootTracker


def _log() -> Any:
    """The module logger (structlog is imported only when something is logged)."""
    return get_logger(op="readiness")


Probe = Callable[[], Awaitable[bool]]


class _NoAnswer(Exception):
    """An awaited call did not finish within its timeout."""


async def _bounded(aw: Awaitable[Any], timeout: float) -> Any:
    """Await with a timeout without asyncio.wait_for (which can swallow a cancellation on 3.11)."""
    inner = asyncio.ensure_future(aw)
    try:
        done, _ = await asyncio.wait({inner}, timeout=timeout)
    except asyncio.CancelledError:
        inner.cancel()
        raise
    if not done:
        inner.cancel()
        raise _NoAnswer(f"no answer within {timeout:.1f} s")
    return inner.result()


async def _call(fn: Probe, timeout: float, boot: BootState, what: str) -> bool:
    """Await a probe with a timeout; any exception or timeout counts as not ready."""
    try:
        if await _bounded(fn(), max(0.05, timeout)):
            return True
        boot.last_probe_error = f"{what}: answered, not ready"
    except _NoAnswer as exc:
        boot.last_probe_error = f"{what}: {exc}"
    except Exception as exc:  # a probe is a network call: any failure means "not yet"
        boot.last_probe_error = f"{what}: {type(exc).__name__}: {exc}"
    return False


async def _read(lines: AsyncIterator[str], boot: BootState) -> None:
    """Consume the log lines until the source ends."""
    async for line in lines:
        boot.feed(line)
    boot.source_ended = True
    boot.wake.set()


async def _probe_loop(
    boot: BootState,
    probe: Probe,
    health: Probe | None,
    interval: float,
    probe_timeout: float,
    deadline: float,
) -> None:
    """Probe health then a real completion until one answers."""
    while True:
        remaining = deadline - boot.clock()
        timeout = min(probe_timeout, max(0.05, remaining))
        boot.probes += 1
        ok = True
        if health is not None:
            ok = await _call(health, timeout, boot, "health")
        if ok and await _call(probe, timeout, boot, "completion"):
            boot.ready_at = boot.clock()
            boot.wake.set()
            return
        await asyncio.sleep(interval)


async def _watch_workers(
    boot: BootState, missing_workers: Callable[[], Awaitable[list[str]]], interval: float
) -> None:
    """Poll which Ray workers are missing; remember since when the set has been non-empty."""
    while True:
        names = await _ask_missing(missing_workers, interval)
        if names is not None:
            if names:
                if boot.missing_since is None:
                    boot.missing_since = boot.clock()
                if names != boot.missing:
                    boot.emit("workers", None, missing=names)
            else:
                boot.missing_since = None
            boot.missing = names
            boot.wake.set()
        await asyncio.sleep(interval)


async def _ask_missing(
    missing_workers: Callable[[], Awaitable[list[str]]], interval: float
) -> list[str] | None:
    """Which workers are missing, asked once within a bound; None when the query failed."""
    try:
        return list(await _bounded(missing_workers(), max(interval, 10.0)))
    except Exception as exc:  # the caller's query failed: unknown, not "missing"
        _log().debug("missing_workers_failed", error=f"{type(exc).__name__}: {exc}")
        return None


async def _watch_instance(boot: BootState, watch: InstanceWatch, interval: float) -> None:
    """Poll which engine instance runs: the new one seen (its pid claimed), then its death."""
    while True:
        try:
            view = await _bounded(watch(), max(interval * 4, 10.0))
        except Exception as exc:  # the head did not answer: unknown this round
            view = None
            _log().debug("instance_watch_failed", error=f"{type(exc).__name__}: {exc}")
        if view is not None:
            boot.instance = view
            if view.new and boot.new_seen_at is None and (view.alive or view.survivors):
                boot.new_seen_at = boot.clock()
                if view.log_pid is not None:
                    boot.tracker.claim(view.log_pid)
                boot.emit("instance", None, instance=view.label, new=True)
            if view.new and not view.alive and boot.exited_at is None:
                if boot.new_seen_at is None:
                    boot.new_seen_at = boot.clock()
                boot.exited_at = boot.clock()
                boot.emit("instance", None, instance=view.label, exited=True,
                          survivors=list(view.survivors))  # fmt: skip
            boot.wake.set()
        await asyncio.sleep(interval)


async def wait_for_boot(
    lines: AsyncIterator[str],
    *,
    probe: Callable[[], Awaitable[bool]],
    deadline_s: float,
    on_event: Callable[[BootEvent], None] | None = None,
    health: Callable[[], Awaitable[bool]] | None = None,
    missing_workers: Callable[[], Awaitable[list[str]]] | None = None,
    worker_stall_s: float = 300,
    probe_interval_s: float = 0.5,
    expect_graph_capture: bool | None = None,
    fatal_grace_s: float = 0.5,
    source_end_fatal: bool = True,
    probe_timeout_s: float = 30.0,
    worker_poll_s: float = 5.0,
    tick_s: float = 1.0,
    clock: Callable[[], float] = time.monotonic,
    instance: InstanceWatch | None = None,
    instance_poll_s: float = 0.5,
    tracker: BootTracker | None = None,
    args_grace_s: float = 0.0,
    rank_logs: dict[str, AsyncIterator[str]] | None = None,
) -> BootReport:
    """Follow a boot until the engine answers a completion; raise BootError / BootTimeout early.

    Lines are read concurrently with probing. A fatal line waits `fatal_grace_s` (or the end of
    the source) for the root cause to be printed, then raises BootError with the evidence. The
    source ending before READY means the engine exited (unless `source_end_fatal` is False).

    `instance` (polled every `instance_poll_s`) says which engine instance runs: once the new one
    is seen, its pid's log lines are its own (`tracker.claim`), and its death ends the wait
    with the processes it left named. A fatal line waits for the instance to be known (up to
    10 s), so that the outgoing engine's last words are never taken for the new boot's.
    An answer before the new engine's `non-default args:` line was read waits up to
    `args_grace_s` for it (the log may lag the API), so READY carries the new engine's args.

    `rank_logs` (an engine run as ranks: worker node -> its rank's log from the restart on) are
    followed too (readiness/ranks.py): a worker rank's fatal line fails the boot naming its node,
    and READY waits until every worker rank started anew.
    """
    if deadline_s <= 0:
        raise ValueError(f"deadline_s must be > 0, got {deadline_s}")
    boot = BootState(on_event, expect_graph_capture, clock, tracker)
    deadline = boot.start + deadline_s
    boot.emit("start", None)
    boot.emit("phase", None, expected=[p.value for p in boot.expected()])
    tasks = [
        asyncio.create_task(_read(lines, boot), name="boot-lines"),
        asyncio.create_task(
            _probe_loop(boot, probe, health, probe_interval_s, probe_timeout_s, deadline),
            name="boot-probe",
        ),
    ]
    if missing_workers is not None:
        tasks.append(
            asyncio.create_task(
                _watch_workers(boot, missing_workers, worker_poll_s), name="boot-workers"
            )
        )
    if instance is not None:
        tasks.append(
            asyncio.create_task(
                _watch_instance(boot, instance, instance_poll_s), name="boot-instance"
            )
        )
    for node, source in (rank_logs or {}).items():
        rank = RankLog(node)
        boot.ranks.append(rank)
        tasks.append(
            asyncio.create_task(
                read_rank(rank, source, boot.emit, boot.clock, boot.wake.set), name=f"rank-{node}"
            )
        )
    last_tick = boot.clock()
    try:
        while True:
            boot.wake.clear()
            for task in tasks:
                if task.done() and not task.cancelled() and task.exception() is not None:
                    raise task.exception()  # type: ignore[misc]
            now = boot.clock()
            t = boot.tracker
            waiting_args = (
                boot.ready_at is not None
                and not t.non_default_args
                and not boot.source_ended
                and now - boot.ready_at < args_grace_s
            ) or (boot.ready_at is not None and bool(not_started(boot.ranks)))
            if boot.ready_at is not None and not waiting_args:
                if missing_workers is not None:  # the last poll may predate a worker's loss
                    absent = await _ask_missing(missing_workers, worker_poll_s)
                    if absent:
                        raise ready_without_workers(boot, absent)
                report = boot.report()
                boot.emit("phase", None, total_s=report.total_s)
                return report
            pending_identity = (
                instance is not None
                and boot.new_seen_at is None
                and boot.fatal_at is not None
                and now - boot.fatal_at < 10.0
            )
            if (
                boot.fatal_at is not None
                and not pending_identity
                and (boot.source_ended or now - boot.fatal_at >= fatal_grace_s)
            ):
                best = t.best_fatal()
                if best is None:  # its segment turned out to be the outgoing engine's
                    boot.fatal_at = None
                else:
                    error = boot.fatal_error(best)
                    view = boot.instance
                    if boot.exited_at is not None and view is not None:
                        error.message += survivors_text(view)
                        if view.survivors and view.stop_hint:
                            error.hint = f"{view.stop_hint}; then {error.hint}"
                    raise error
            for rank in boot.ranks:
                if rank.fatal_at is not None and (
                    rank.ended or now - rank.fatal_at >= max(fatal_grace_s, 1.0)
                ):
                    rank_failed = rank_error(rank)
                    if rank_failed is not None:
                        boot.emit("fatal", rank_failed.lines[-1] if rank_failed.lines else None,
                                  reason="rank", message=rank_failed.message)  # fmt: skip
                        raise rank_failed
            exited_for = now - boot.exited_at if boot.exited_at is not None else -1.0
            if exited_for >= max(fatal_grace_s, 1.0) and t.best_fatal() is None:
                raise exit_error(boot)
            if boot.source_ended and source_end_fatal:
                raise exit_error(boot)
            stall = stall_error(boot, worker_stall_s)
            if stall is not None:
                raise stall
            if now >= deadline:
                lines_tail = t.last_lines(20)
                reached = boot.phase_times.get(t.phase, 0.0)
                probe_note = (
                    f"; last probe: {boot.last_probe_error}" if boot.last_probe_error else ""
                )
                message = (
                    f"engine not ready after {deadline_s:g} s: last phase {t.phase.value} "
                    f"(reached at +{reached:.0f} s), {t.lines_seen} lines seen{probe_note}"
                )
                if not_started(boot.ranks):
                    message += "; worker rank(s) not started anew: " + ", ".join(
                        not_started(boot.ranks)
                    )
                boot.emit("timeout", None, message=message)
                raise BootTimeout(
                    message,
                    phase=t.phase.value,
                    lines=lines_tail,
                    hint="raise the deadline if the phases still move (weights and compile take "
                    "minutes on 4 nodes), otherwise read the last lines",
                )
            if now - last_tick >= tick_s:
                last_tick = now
                boot.emit("tick", None, missing_workers=boot.missing, probes=boot.probes,
                          ranks_not_started=not_started(boot.ranks))  # fmt: skip
            wait = min(tick_s, 0.25, max(0.0, deadline - now))
            if boot.fatal_at is not None:
                wait = min(wait, max(0.0, boot.fatal_at + fatal_grace_s - now))
            with contextlib.suppress(_NoAnswer):
                await _bounded(boot.wake.wait(), max(0.01, wait))
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
