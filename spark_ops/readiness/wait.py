"""Wait for a vLLM boot: read live log lines, probe the API, fail fast, honour a deadline."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from spark_ops.errors import BootError, BootTimeout
from spark_ops.log import get_logger
from spark_ops.readiness.phases import (
    FATAL_HINTS,
    PHASE_ORDER,
    BootTracker,
    Fatal,
    FatalKind,
    Phase,
    split_prefix,
)
from spark_ops.readiness.ranks import (
    RankLog,
    not_started,
    rank_error,
    rank_summary,
    ranks_joined,
    read_rank,
)


def _log() -> Any:
    """The module logger (structlog is imported only when something is logged)."""
    return get_logger(op="readiness")


Probe = Callable[[], Awaitable[bool]]


@dataclass(frozen=True)
class InstanceView:
    """What the head says of the engine instance running now, next to the outgoing one.

    new: it is not the outgoing instance (None: cannot tell yet); alive: it runs; log_pid: the
    pid its log lines carry (`(APIServer pid=N)`), when the head's pid is that pid; survivors:
    processes of a dead instance still running (named to the operator).
    """

    new: bool | None
    alive: bool
    label: str = ""
    log_pid: int | None = None
    survivors: tuple[str, ...] = ()
    stop_hint: str = ""


InstanceWatch = Callable[[], Awaitable["InstanceView | None"]]


@dataclass(frozen=True)
class BootEvent:
    """One thing that happened during a boot, for progress display.

    kind: "start" (a boot begins: the rollback's too), "engine" (a new engine's first line after
    another engine's: its phases start over), "step" (a step of STARTING: api-config,
    engine-core, workers), "phase" (a phase was reached; READY too), "line"
    (every log line), "workers" (Ray workers joined or missing changed), "instance" (the new
    engine instance seen, or seen dead), "tick" (about once a second), "fatal" / "timeout" (just
    before raising).
    """

    kind: str
    phase: Phase
    elapsed_s: float
    line: str | None = None
    data: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """Serialize for JSON lines."""
        out: dict[str, Any] = {
            "kind": self.kind,
            "phase": self.phase.value,
            "elapsed_s": round(self.elapsed_s, 3),
        }
        if self.line is not None:
            out["line"] = self.line
        if self.data:
            out["data"] = self.data
        return out


@dataclass
class BootReport:
    """How a successful boot went: when each phase was reached and what the engine reported."""

    started_at: float  # Unix time when waiting began
    total_s: float
    phase_times: dict[str, float]  # phase -> seconds after start when reached
    durations: dict[str, float]  # phase -> seconds spent in it (until the next phase reached)
    last_phase: str
    lines_seen: int
    kv_cache_tokens: int | None = None
    kv_cache_blocks: int | None = None
    non_default_args: dict[str, Any] = field(default_factory=dict)
    vllm_version: str | None = None
    api_url: str | None = None
    metrics: dict[str, float] = field(default_factory=dict)  # weights_load_s, graph_capture_s, ...
    skipped: list[str] = field(default_factory=list)  # phases not expected (eager, no Ray)
    warnings: list[str] = field(default_factory=list)  # fatal-looking lines of a boot that served
    # Timed from the new engine's own start (see from_engine_start): total_s then runs from it,
    # wait_s is the wait alone, restart_command_s the watchdog's restart command.
    wait_s: float | None = None
    restart_command_s: float | None = None
    engine_started_at: float | None = None  # head clock
    engine_start_from: str | None = None  # what told the engine's start (its process, the API)
    ranks: dict[str, Any] = field(default_factory=dict)  # worker node -> its rank's boot (mp)

    def from_engine_start(self, engine_started_at: float, ready_at: float, source: str) -> None:
        """Time the boot from the engine's own start (both head clock): total_s runs from it,
        the first phase (starting) begins then, wait_s keeps the wait's own figure."""
        lead = (ready_at - self.total_s) - engine_started_at  # engine start -> wait began
        self.wait_s = self.total_s
        self.total_s = max(0.0, ready_at - engine_started_at)
        self.engine_started_at = engine_started_at
        self.engine_start_from = source
        times = {k: (0.0 if k == "starting" else max(0.0, v + lead))
                 for k, v in self.phase_times.items()}  # fmt: skip
        ordered = sorted(times.items(), key=lambda kv: kv[1])
        self.phase_times = dict(ordered)
        self.durations = {a: max(0.0, tb - ta) for (a, ta), (_, tb) in itertools.pairwise(ordered)}

    def to_dict(self) -> dict[str, Any]:
        """Serialize for --json and the ETA state file."""
        return {
            "started_at": self.started_at,
            "total_s": round(self.total_s, 3),
            "phase_times": {k: round(v, 3) for k, v in self.phase_times.items()},
            "durations": {k: round(v, 3) for k, v in self.durations.items()},
            "last_phase": self.last_phase,
            "lines_seen": self.lines_seen,
            "kv_cache_tokens": self.kv_cache_tokens,
            "kv_cache_blocks": self.kv_cache_blocks,
            "non_default_args": self.non_default_args,
            "vllm_version": self.vllm_version,
            "api_url": self.api_url,
            "metrics": self.metrics,
            "skipped": self.skipped,
            "warnings": self.warnings,
            "wait_s": None if self.wait_s is None else round(self.wait_s, 3),
            "restart_command_s": (
                None if self.restart_command_s is None else round(self.restart_command_s, 3)
            ),
            "engine_started_at": self.engine_started_at,
            "engine_start_from": self.engine_start_from,
            "ranks": self.ranks,
        }


def exit_line(status: int | None = None) -> str:
    """The line a log source appends when it knows the engine process exited."""
    if status is None:
        return "[spark-ops] engine exited"
    return f"[spark-ops] engine exited with status {status}"


def expected_phases(
    non_default_args: dict[str, Any],
    *,
    expect_graph_capture: bool | None = None,
    ray_seen: bool = False,
) -> list[Phase]:
    """The phases a boot with these effective args should pass through."""
    phases = list(PHASE_ORDER)
    uses_ray = ray_seen or non_default_args.get("distributed_executor_backend") == "ray"
    if not uses_ray:
        phases.remove(Phase.RAY_WORKERS)
    graphs = expect_graph_capture
    if graphs is None:
        graphs = not bool(non_default_args.get("enforce_eager", False))
    if not graphs:
        phases.remove(Phase.GRAPH_CAPTURE)
    return phases


def _short(message: str, limit: int = 300) -> str:
    """Cut a message to a readable length."""
    message = message.strip()
    return message if len(message) <= limit else message[: limit - 1] + "…"


class _Boot:
    """Shared state of one wait_for_boot call."""

    def __init__(
        self,
        on_event: Callable[[BootEvent], None] | None,
        expect_graph_capture: bool | None,
        clock: Callable[[], float],
        tracker: BootTracker | None = None,
    ) -> None:
        """Start the clock."""
        self.clock = clock
        self.start = clock()
        self.started_at = time.time()
        self.tracker = tracker or BootTracker()
        self.on_event = on_event
        self.expect_graph_capture = expect_graph_capture
        self.phase_times: dict[Phase, float] = {Phase.STARTING: 0.0}
        self.wake = asyncio.Event()
        self.fatal_at: float | None = None
        self.source_ended = False
        self.ready_at: float | None = None
        self.missing: list[str] = []
        self.missing_since: float | None = None
        self.pg_first_seen: float | None = None
        self.pg_first_reported = 0
        self.last_probe_error: str | None = None
        self.probes = 0
        self.workers_joined = 0
        self.instance: InstanceView | None = None
        self.new_seen_at: float | None = None  # when the new engine instance was first seen
        self.exited_at: float | None = None  # when the new instance was seen dead
        self.ranks: list[RankLog] = []  # the worker ranks' logs (an engine run as ranks)
        self.joined: tuple[int, int] | None = None  # rank 0's last `k/N ranks joined`

    def elapsed(self) -> float:
        """Seconds since waiting began."""
        return self.clock() - self.start

    def emit(self, kind: str, line: str | None = None, **data: Any) -> None:
        """Send an event to the caller's callback, if any."""
        if self.on_event is not None:
            phase = Phase.READY if self.ready_at is not None else self.tracker.phase
            self.on_event(BootEvent(kind, phase, self.elapsed(), line, data))

    def expected(self) -> list[Phase]:
        """Phases this boot should pass through, given what is known now."""
        return expected_phases(
            self.tracker.non_default_args,
            expect_graph_capture=self.expect_graph_capture,
            ray_seen=Phase.RAY_WORKERS in self.phase_times,
        )

    def feed(self, line: str) -> None:
        """Classify a line, update state and emit its events."""
        segments, step = self.tracker.segments, self.tracker.step
        info, new_phase, fatal = self.tracker.feed(line)
        line = line.rstrip("\r\n")
        now = self.clock()
        if self.tracker.segments != segments and (segments or self.tracker.outgoing_lines):
            # a new engine's first line after another engine's: its phases start here
            self.phase_times = {Phase.STARTING: now - self.start}
            self.emit("engine", line, outgoing_lines=self.tracker.outgoing_lines)
        if "placement_wait_s" in info.data and self.pg_first_seen is None:
            self.pg_first_seen = now
            self.pg_first_reported = int(info.data["placement_wait_s"])
        data = dict(info.data)
        if fatal is not None:
            data["fatal"] = fatal.kind.value
        self.emit("line", line, **data)
        if self.tracker.step != step and self.tracker.phase is Phase.STARTING:
            self.emit("step", line, step=self.tracker.step)
        if new_phase is not None:
            self.phase_times[new_phase] = now - self.start
            self.emit(
                "phase",
                line,
                expected=[p.value for p in self.expected()],
                **info.data,
            )
        ranks = ranks_joined(line) if self.ranks and not self.tracker.old_engine else None
        if ranks is not None and ranks != self.joined:
            self.joined = ranks
            self.emit("ranks", line, joined=ranks[0], total=ranks[1])
        joined = len(self.tracker.worker_ips)
        if joined != self.workers_joined:
            self.workers_joined = joined
            self.emit("workers", line, joined=joined, expected=self.tracker.workers_expected)
        if fatal is not None and self.fatal_at is None:
            self.fatal_at = now
            self.wake.set()

    def report(self) -> BootReport:
        """Build the report of a boot that answered its first completion."""
        assert self.ready_at is not None
        total = self.ready_at - self.start
        times = dict(self.phase_times)
        times[Phase.READY] = total
        ordered = sorted(times.items(), key=lambda kv: (kv[1], kv[0].rank))
        durations: dict[str, float] = {}
        for (phase, at), (_, nxt) in itertools.pairwise(ordered):
            durations[phase.value] = max(0.0, nxt - at)
        expected = self.expected()
        skipped = [p.value for p in PHASE_ORDER if p not in expected and p not in times]
        t = self.tracker
        return BootReport(
            started_at=self.started_at,
            total_s=total,
            phase_times={p.value: at for p, at in ordered},
            durations=durations,
            last_phase=Phase.READY.value,
            lines_seen=t.lines_seen,
            kv_cache_tokens=t.kv_cache_tokens,
            kv_cache_blocks=t.kv_cache_blocks,
            non_default_args=dict(t.non_default_args),
            vllm_version=t.vllm_version,
            api_url=t.api_url,
            metrics=dict(t.metrics),
            skipped=skipped,
            warnings=[f.line for f in t.fatals],
            ranks=rank_summary(self.ranks),
        )

    def fatal_error(self, fatal: Fatal) -> BootError:
        """A BootError carrying the fatal line and the lines before it."""
        message, _, _ = split_prefix(fatal.line)
        error = BootError(
            f"engine boot failed during {fatal.phase.value} ({fatal.kind.value}): "
            f"{_short(message)}",
            phase=fatal.phase.value,
            lines=fatal.context,
            hint=FATAL_HINTS[fatal.kind],
        )
        self.emit("fatal", fatal.line, reason=fatal.kind.value, message=error.message)
        return error


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


async def _call(fn: Probe, timeout: float, boot: _Boot, what: str) -> bool:
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


async def _read(lines: AsyncIterator[str], boot: _Boot) -> None:
    """Consume the log lines until the source ends."""
    async for line in lines:
        boot.feed(line)
    boot.source_ended = True
    boot.wake.set()


async def _probe_loop(
    boot: _Boot,
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
    boot: _Boot, missing_workers: Callable[[], Awaitable[list[str]]], interval: float
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


def _ready_without_workers(boot: _Boot, absent: list[str]) -> BootError:
    """A BootError for an engine that answered while a worker it needs (Ray's or a rank) is gone."""
    message = (
        f"the engine answered, but worker(s) it needs are missing: {', '.join(absent)}; "
        "a tensor-parallel group cannot keep serving without them"
    )
    lines = boot.tracker.last_lines(12)
    boot.emit("fatal", lines[-1] if lines else None, reason=FatalKind.PLACEMENT.value,
              message=message)  # fmt: skip
    return BootError(
        message, phase=boot.tracker.phase.value, lines=lines, hint=FATAL_HINTS[FatalKind.PLACEMENT]
    )


def _stall_error(boot: _Boot, worker_stall_s: float) -> BootError | None:
    """A BootError when a worker has been missing (or the placement group waiting) too long."""
    now = boot.clock()
    t = boot.tracker
    joined = (
        f"{len(t.worker_ips)} of {t.workers_expected} workers joined; "
        if (t.workers_expected)
        else ""
    )
    if (
        boot.missing_since is not None
        and boot.missing
        and now - boot.missing_since >= worker_stall_s
    ):
        names = ", ".join(boot.missing)
        message = (
            f"Ray worker(s) {names} missing for {now - boot.missing_since:.0f} s "
            f"(limit {worker_stall_s:.0f} s) during {t.phase.value}"
        )
    elif t.phase is Phase.RAY_WORKERS and boot.pg_first_seen is not None:
        waited = max(
            float(t.placement_wait_s or 0), boot.pg_first_reported + now - boot.pg_first_seen
        )
        if waited < worker_stall_s:
            return None
        who = f"missing: {', '.join(boot.missing)}" if boot.missing else "missing worker unknown"
        message = (
            f"placement group still waiting after {waited:.0f} s (limit {worker_stall_s:.0f} s); "
            f"{joined}{who}"
        )
    else:
        return None
    lines = t.last_lines(12)
    error = BootError(
        message,
        phase=Phase.RAY_WORKERS.value if boot.missing_since is None else t.phase.value,
        lines=lines,
        hint=FATAL_HINTS[FatalKind.PLACEMENT],
    )
    boot.emit(
        "fatal", lines[-1] if lines else None, reason=FatalKind.PLACEMENT.value, message=message
    )
    return error


def _survivors_text(view: InstanceView | None) -> str:
    """`; still running: 12 (VLLM::EngineCore), 13 (VLLM::Worker)` or nothing."""
    if view is None or not view.survivors:
        return ""
    return f"; still running: {', '.join(view.survivors)}"


def _exit_error(boot: _Boot) -> BootError:
    """The BootError for an engine that exited (or whose log ended) before it answered."""
    t = boot.tracker
    last = t.last_lines(12)
    view = boot.instance
    if boot.exited_at is not None and view is not None:
        message = (
            f"the new engine ({view.label}) exited during {t.phase.value} before it answered a "
            f"completion{_survivors_text(view)}"
        )
    else:
        message = (
            f"engine log ended during {t.phase.value} before the engine answered a completion "
            f"(the engine process exited?) after {t.lines_seen} lines"
        )
    hint = FATAL_HINTS[FatalKind.EXIT]
    if view is not None and view.survivors and view.stop_hint:
        hint = f"{view.stop_hint}; then {hint}"
    boot.emit("fatal", last[-1] if last else None, reason=FatalKind.EXIT.value, message=message)
    return BootError(message, phase=t.phase.value, lines=last, hint=hint)


async def _watch_instance(boot: _Boot, watch: InstanceWatch, interval: float) -> None:
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
    boot = _Boot(on_event, expect_graph_capture, clock, tracker)
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
                        raise _ready_without_workers(boot, absent)
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
                        error.message += _survivors_text(view)
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
                raise _exit_error(boot)
            if boot.source_ended and source_end_fatal:
                raise _exit_error(boot)
            stall = _stall_error(boot, worker_stall_s)
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
