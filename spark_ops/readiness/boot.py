"""The state of one boot being waited for (BootState: lines fed, phases reached, what the
watchers found) and the errors it ends in: a fatal line, an exit, a stalled worker, an answer
without the workers the engine needs. readiness.wait drives it."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable
from typing import Any

from spark_ops.errors import BootError
from spark_ops.readiness.phases import FATAL_HINTS, PHASE_ORDER, FatalKind, Phase, split_prefix
from spark_ops.readiness.ranks import RankLog, rank_summary, ranks_joined
from spark_ops.readiness.report import BootEvent, BootReport, InstanceView, expected_phases
from spark_ops.readiness.tracker import BootTracker, Fatal


def _short(message: str, limit: int = 300) -> str:
    """Cut a message to a readable length."""
    message = message.strip()
    return message if len(message) <= limit else message[: limit - 1] + "…"


class BootState:
    """Shared state of one wait_for_boot call: the phases reached, the watchers' findings, and
    the events it emits."""

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


def ready_without_workers(boot: BootState, absent: list[str]) -> BootError:
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


def stall_error(boot: BootState, worker_stall_s: float) -> BootError | None:
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


def survivors_text(view: InstanceView | None) -> str:
    """`; still running: 12 (VLLM::EngineCore), 13 (VLLM::Worker)` or nothing."""
    if view is None or not view.survivors:
        return ""
    return f"; still running: {', '.join(view.survivors)}"


def exit_error(boot: BootState) -> BootError:
    """The BootError for an engine that exited (or whose log ended) before it answered."""
    t = boot.tracker
    last = t.last_lines(12)
    view = boot.instance
    if boot.exited_at is not None and view is not None:
        message = (
            f"the new engine ({view.label}) exited during {t.phase.value} before it answered a "
            f"completion{survivors_text(view)}"
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
