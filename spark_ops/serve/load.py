"""The engine's load over the last hour: its /metrics scraped by this server every SCRAPE_S
seconds, kept in a ring buffer (at most KEEP samples: memory bounded however long it runs).

Each sample holds running and waiting requests and the generated tokens per second since the
previous sample (from vllm:generation_tokens_total; a counter that went down is a new engine,
whose first sample has no rate). A scrape that got no answer is a gap, not a zero.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections import deque
from typing import Any

from spark_ops.errors import SparkOpsError
from spark_ops.inventory import Cluster
from spark_ops.log import get_logger
from spark_ops.remote import ClusterSession
from spark_ops.workflows.operation import Operation

SCRAPE_S = 10.0
SPAN_S = 3600.0
KEEP = int(SPAN_S / SCRAPE_S) + 1
RETRY_S = 10.0
MAX_REQUESTS = 1e7  # running or waiting requests beyond this are no reading (dropped, marked)
MAX_TOKENS = 1e18  # a generation-token counter beyond this is no reading
MAX_METRICS_BYTES = 8 * 1024 * 1024  # the engine's /metrics answer read at most; larger refused


def sane(value: float | None, top: float) -> float | None:
    """A reading kept: a finite number from 0 to `top`; anything else None."""
    if value is None or isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) and 0 <= number <= top else None


class LoadRing:
    """The samples of the last hour, oldest first, at most `keep` of them."""

    def __init__(self, keep: int = KEEP, interval_s: float = SCRAPE_S) -> None:
        """Empty."""
        self.samples: deque[dict[str, Any]] = deque(maxlen=keep)
        self.interval_s = interval_s
        self.last_tokens: tuple[float, float] | None = None  # (at, generation_tokens_total)
        self.last_ok: float | None = None
        self.error = ""

    def add(
        self, at: float, running: float | None, waiting: float | None, tokens: float | None
    ) -> None:
        """One scrape (all None: no answer, a gap). A value that is not a finite number from 0 to
        its bound (NaN, inf, negative, 1.7e308) is dropped and the sample says which."""
        given = {"running": running, "waiting": waiting, "tokens": tokens}
        running, waiting = sane(running, MAX_REQUESTS), sane(waiting, MAX_REQUESTS)
        tokens = sane(tokens, MAX_TOKENS)
        kept = {"running": running, "waiting": waiting, "tokens": tokens}
        dropped = [k for k, v in given.items() if v is not None and kept[k] is None]
        rate = None
        if tokens is not None:
            prev = self.last_tokens
            if prev is not None and at > prev[0] and tokens >= prev[1]:
                rate = sane(round((tokens - prev[1]) / (at - prev[0]), 2), MAX_TOKENS)
            self.last_tokens = (at, tokens)
            self.last_ok, self.error = at, ""
        else:
            self.last_tokens = None
        sample: dict[str, Any] = {"at": at, "running": running, "waiting": waiting, "tok_s": rate}
        if dropped:
            sample["dropped"] = dropped
        self.samples.append(sample)

    def view(self) -> dict[str, Any]:
        """The ring as JSON for the page, /api/load and /metrics."""
        return {
            "span_s": SPAN_S,
            "interval_s": self.interval_s,
            "samples": list(self.samples),
            "last_ok": self.last_ok,
            "error": self.error or None,
        }


class HeadWatch:
    """A watch over one session to the head, kept for as long as the server runs: after the head
    (or what is watched there) went away, a gap (`retry_s`), then again. The boot watch and the
    load scrape are such watches; each says what it watches (`watch`) and what an end means to
    what it shows (`ended`)."""

    name = "serve-watch"  # its log's op; its task is named NAME-watch
    what = "watch"  # its log's words: "WHAT interrupted", "WHAT failed"
    retry_s = RETRY_S

    def __init__(self, cluster: Cluster) -> None:
        """Nothing runs until start()."""
        self.cluster = cluster
        self.task: asyncio.Task[None] | None = None
        self.log = get_logger(cluster=cluster.name, op=self.name)

    def start(self) -> None:
        """Begin watching in the background."""
        self.task = asyncio.create_task(self._run(), name=f"{self.name}-watch")

    async def stop(self) -> None:
        """Stop watching."""
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task

    async def watch(self, op: Operation) -> None:
        """Watch over the head's session (connected) until it ends."""
        raise NotImplementedError

    def ended(self, error: Exception | None) -> None:
        """The watch ended (with the error that ended it): what that means to what it shows."""

    async def _run(self) -> None:
        """Watch; after the head or what is watched went away, a gap, then again."""
        while True:
            error: Exception | None = None
            try:
                async with ClusterSession(self.cluster) as session:
                    await session.connect([self.cluster.head.name])
                    await self.watch(Operation(session, "serve"))
            except SparkOpsError as exc:
                error = exc
                self.log.warning(f"{self.what} interrupted", error=exc.message)
            except Exception as exc:  # the page goes on without it; logged, retried
                error = exc
                self.log.error(f"{self.what} failed", error=repr(exc)[:300])
            self.ended(error)
            await asyncio.sleep(self.retry_s)


class LoadWatch(HeadWatch):
    """Scrape the engine's /metrics for as long as the server runs (one SSH session to the head
    when the engine is reached through it, kept open between scrapes)."""

    name, what = "serve-load", "load scrape"

    def __init__(self, cluster: Cluster, interval_s: float = SCRAPE_S) -> None:
        """Nothing runs until start()."""
        super().__init__(cluster)
        self.ring = LoadRing(interval_s=interval_s)

    async def watch(self, op: Operation) -> None:
        """Scrape every interval, a gap when /metrics did not answer."""
        await op.api_url()
        async with op.engine(timeout=5) as api:
            while True:
                snap = await api.metrics(max_bytes=MAX_METRICS_BYTES)
                if snap is None:
                    self.ring.add(time.time(), None, None, None)
                    self.ring.error = api.last_error or "the engine's /metrics did not answer"
                else:
                    self.ring.add(time.time(), snap.running, snap.waiting,
                                  snap.generation_tokens)  # fmt: skip
                await asyncio.sleep(self.ring.interval_s)

    def ended(self, error: Exception | None) -> None:
        """The scrape stopped: its error shown, a gap in the ring."""
        if isinstance(error, SparkOpsError):
            self.ring.error = error.message
        elif error is not None:
            self.ring.error = f"scrape failed ({type(error).__name__})"
        self.ring.add(time.time(), None, None, None)
