"""A boot, live: the engine log followed on the head and read by readiness' own wait.

The watcher follows the log from now on. Lines before a new engine's first start-up line are
the running engine's; from that line on, `readiness.wait_for_boot` reads them with a fresh
BootTracker, exactly as the terminal's boot table does during `apply`, and every BootEvent it
emits goes to the page's subscribers (server-sent events) and to /metrics.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from spark_ops.errors import BootError, SparkOpsError
from spark_ops.inventory import Cluster
from spark_ops.readiness import (
    PHASE_ORDER,
    BootEvent,
    BootHistory,
    BootTracker,
    Phase,
    eta_seconds,
    history_key,
    wait_for_boot,
)
from spark_ops.readiness.phases import telling
from spark_ops.remote.shell import engine_log_follow, engine_log_recent
from spark_ops.serve.load import HeadWatch
from spark_ops.workflows.gate import missing_workers
from spark_ops.workflows.operation import Operation

RETRY_S = 5.0  # after the head or its log went away
# the access lines of pollers (this server's scrape, status, Prometheus): not kept in the tail
POLLS = re.compile(r'"(GET|HEAD) /(metrics|health|version|v1/models)[ ?]')
KEEP_LINES = 40  # log lines the page shows of a boot
MAX_LINE = 4096  # characters of a log line kept; a longer one is cut and says so
QUEUE_BYTES = 4 * 1024 * 1024  # what one page may have waiting; beyond, it is dropped (reconnects)
KEEP_BOOTS = 5  # finished boots kept for the page (this server's own; the CLI records its own)


@dataclass
class BootState:
    """Where the boot being watched stands (or the last one ended)."""

    active: bool = False
    phase: str = ""
    phase_since: float = 0.0  # monotonic
    started: float = 0.0  # monotonic
    started_at: float = 0.0  # Unix time
    expected: list[str] = field(default_factory=list)
    lines: deque[str] = field(default_factory=lambda: deque(maxlen=KEEP_LINES))
    estimates: dict[str, float] = field(default_factory=dict)
    error: str = ""
    missing: list[str] = field(default_factory=list)  # workers the boot waits for in vain

    def snapshot(self) -> dict[str, Any]:
        """The state as JSON for the page, /api/boot and /metrics."""
        now = time.monotonic()
        in_phase = now - self.phase_since if self.active else 0.0
        eta = None
        if self.active and self.phase:
            eta = eta_seconds(self.estimates, self.phase, in_phase, self.expected or None)
        return {
            "active": self.active,
            "phase": self.phase or None,
            "seconds_in_phase": round(in_phase, 1),
            "elapsed_s": round(now - self.started, 1) if self.active else None,
            "started_at": self.started_at or None,
            "expected": list(self.expected) or [p.value for p in PHASE_ORDER],
            "usual_s": dict(self.estimates),
            "eta_s": None if eta is None else round(eta, 1),
            "lines": list(self.lines),
            "error": self.error or None,
            "missing_workers": list(self.missing),
        }


class BootWatch(HeadWatch):
    """Follow the head's engine log for as long as the server runs; publish boot events."""

    name, what, retry_s = "serve-boot", "boot watch", RETRY_S

    def __init__(self, cluster: Cluster) -> None:
        """Nothing runs until start()."""
        super().__init__(cluster)
        self.state = BootState()
        self.past: deque[dict[str, Any]] = deque(maxlen=KEEP_BOOTS)
        self.tail: deque[str] = deque(maxlen=KEEP_LINES)  # the log's last lines, boot or not
        self.subscribers: dict[asyncio.Queue[tuple[int, dict[str, Any] | None]], int] = {}
        self.dropped = 0  # pages dropped for falling behind

    def subscribe(self) -> asyncio.Queue[tuple[int, dict[str, Any] | None]]:
        """A queue of events (size in bytes, dict) for one page; None ends it (dropped)."""
        queue: asyncio.Queue[tuple[int, dict[str, Any] | None]] = asyncio.Queue()
        self.subscribers[queue] = 0
        return queue

    def unsubscribe(self, queue: asyncio.Queue[tuple[int, dict[str, Any] | None]]) -> None:
        """The page went away."""
        self.subscribers.pop(queue, None)

    async def take(
        self, queue: asyncio.Queue[tuple[int, dict[str, Any] | None]]
    ) -> dict[str, Any] | None:
        """The page's next event (None: it fell behind and was dropped)."""
        size, item = await queue.get()
        if queue in self.subscribers:
            self.subscribers[queue] -= size
        return item

    def publish(self, event: dict[str, Any]) -> None:
        """Send an event to every page; a page with more than QUEUE_BYTES waiting is dropped (its
        queue ends; the browser reconnects), never kept growing."""
        if not self.subscribers:
            return
        size = len(json.dumps(event, default=str))
        for queue, waiting in list(self.subscribers.items()):
            if waiting + size > QUEUE_BYTES:
                self.subscribers.pop(queue, None)
                self.dropped += 1
                while not queue.empty():
                    queue.get_nowait()
                queue.put_nowait((0, None))
                continue
            self.subscribers[queue] = waiting + size
            queue.put_nowait((size, event))

    def on_event(self, event: BootEvent) -> None:
        """A BootEvent from wait_for_boot: update the state and tell the pages."""
        st = self.state
        now = time.monotonic()
        if event.kind == "engine":  # another engine's start: its phases begin again
            st.phase, st.phase_since = Phase.STARTING.value, now
        if event.kind == "phase" and event.phase.value != st.phase:
            st.phase, st.phase_since = event.phase.value, now
        if event.kind == "phase" and isinstance(event.data.get("expected"), list):
            st.expected = [str(p) for p in event.data["expected"]]
        if event.kind == "line" and event.line is not None and telling([event.line]):
            st.lines.append(event.line)  # the lines that tell something: no banner art
        if event.kind == "workers" and isinstance(event.data.get("missing"), list):
            st.missing = [str(m) for m in event.data["missing"]]
        if event.kind == "tick" and isinstance(event.data.get("missing_workers"), list):
            st.missing = [str(m) for m in event.data["missing_workers"]]
        if event.kind == "line" and event.line is not None and not POLLS.search(event.line):
            self.tail.append(event.line)
        if event.kind in ("phase", "engine", "line", "fatal", "timeout", "workers", "tick"):
            self.publish({"event": event.to_dict(), "state": st.snapshot()})

    def ended(self, error: Exception | None) -> None:
        """The log went away: a boot that failed unexpectedly is no longer shown live."""
        if error is not None and not isinstance(error, SparkOpsError):
            self.state.active = False

    async def watch(self, op: Operation) -> None:
        """Boots one after another, for as long as the log is followed."""
        head = self.cluster.head.name
        await op.api_url()
        res = await op.session.run(head, engine_log_recent(self.cluster.engine, KEEP_LINES),
                                   check=False, timeout=15, label="engine log tail")  # fmt: skip
        self.tail.clear()
        kept = [cap_line(line) for line in res.stdout.splitlines() if not POLLS.search(line)]
        self.tail.extend(kept[-KEEP_LINES:])
        while True:  # a stream per boot: wait_for_boot's reader closes the one it read
            raw = op.session.stream_lines(head, engine_log_follow(self.cluster.engine))
            lines = _capped(raw)
            try:
                first = await _next_start(lines, self._tail_line)
                if first is None:
                    return
                await self._boot(op, first, lines)
            finally:
                with contextlib.suppress(Exception):
                    await lines.aclose()
                with contextlib.suppress(Exception):
                    await raw.aclose()  # type: ignore[attr-defined]

    @staticmethod
    def workers_query(op: Operation) -> Callable[[], Awaitable[list[str]]]:
        """The missing-workers query the CLI's boot wait asks (workflows.gate): a worker with no
        SSH answer, or whose worker check says its part is not running, is named. The watch's
        session holds the head only: the workers are connected when first asked (and again when
        they did not answer)."""

        async def ask() -> list[str]:
            """Connect the workers not connected yet, then ask as the CLI does."""
            absent = [n.name for n in op.cluster.workers if n.name not in op.session.connectors]
            if absent:
                await op.session.connect(absent, required=False)
            return await missing_workers(op)

        return ask

    def _tail_line(self, line: str) -> None:
        """A line of the running engine (no boot under way): kept and sent to the pages (a
        poller's access line is not)."""
        if POLLS.search(line):
            return
        self.tail.append(line)
        self.publish({"event": {"kind": "tail", "line": line}, "state": self.state.snapshot()})

    async def _boot(self, op: Operation, first: str, lines: AsyncIterator[str]) -> None:
        """One boot, from its first line to READY or its failure."""
        c = self.cluster
        st = self.state
        st.active, st.error, st.missing = True, "", []
        st.started = st.phase_since = time.monotonic()
        st.started_at = time.time()
        st.phase = Phase.STARTING.value
        st.lines.clear()
        st.estimates = BootHistory().estimate(history_key(c))
        tracker = BootTracker()
        self.publish({"event": {"kind": "start", "phase": st.phase, "elapsed_s": 0.0},
                      "state": st.snapshot()})  # fmt: skip
        async with op.engine(timeout=c.engine.probe_timeout_s) as api:

            async def probe() -> bool:
                """Ready: the new engine's API is up (its own log says so) and completes."""
                if tracker.phase.rank < Phase.API_UP.rank:
                    return False
                return bool(await api.complete(c.engine.probe_timeout_s))

            outcome = "ready"
            try:
                report = await wait_for_boot(
                    _prepend(first, lines),
                    probe=probe,
                    deadline_s=c.engine.boot_deadline_s,
                    on_event=self.on_event,
                    worker_stall_s=c.engine.worker_stall_s,
                    probe_timeout_s=c.engine.probe_timeout_s,
                    source_end_fatal=False,
                    missing_workers=self.workers_query(op),
                    tracker=tracker,
                )
                total: float | None = report.total_s
            except BootError as exc:
                outcome, total, st.error = "failed", None, exc.message
        st.active = False
        st.phase = Phase.READY.value if outcome == "ready" else st.phase
        past = {"started_at": st.started_at, "outcome": outcome, "total_s": total,
                "error": st.error or None, "lines": list(st.lines)}  # fmt: skip
        self.past.appendleft(past)
        self.publish({"event": {"kind": "end", "phase": st.phase, "outcome": outcome,
                                "total_s": total}, "state": st.snapshot()})  # fmt: skip


async def _next_start(
    lines: AsyncIterator[str], on_line: Callable[[str], None] | None = None
) -> str | None:
    """Skip the running engine's lines; the first line of a new engine's start, or None at the
    end of the log (BootTracker's own rule: lines after a restart are the outgoing engine's until
    an engine's first start-up line)."""
    watcher = BootTracker(after_restart=True)
    async for line in lines:
        watcher.feed(line)
        if watcher.segments:
            return line
        if on_line is not None:
            on_line(line)
    return None


def cap_line(line: str) -> str:
    """A log line as kept and sent: at most MAX_LINE characters, a longer one cut and marked."""
    if len(line) <= MAX_LINE:
        return line
    return f"{line[:MAX_LINE]} …[truncated: {len(line) - MAX_LINE} more characters]"


async def _capped(lines: AsyncIterator[str]) -> AsyncGenerator[str]:
    """The log's lines, each capped (cap_line)."""
    async for line in lines:
        yield cap_line(line)


async def _prepend(first: str, rest: AsyncIterator[str]) -> AsyncIterator[str]:
    """The line already read, then the rest."""
    yield first
    async for line in rest:
        yield line
