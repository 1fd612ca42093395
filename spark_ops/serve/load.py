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


class LoadWatch:
    """Scrape the engine's /metrics for as long as the server runs (one SSH session to the head
    when the engine is reached through it, kept open between scrapes)."""

    def __init__(self, cluster: Cluster, interval_s: float = SCRAPE_S) -> None:
        """Nothing runs until start()."""
        self.cluster = cluster
        self.ring = LoadRing(interval_s=interval_s)
        self.task: asyncio.Task[None] | None = None
        self.log = get_logger(cluster=cluster.name, op="serve-load")

    def start(self) -> None:
        """Begin scraping in the background."""
        self.task = asyncio.create_task(self._run(), name="serve-load-watch")

    async def stop(self) -> None:
        """Stop scraping."""
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task

    async def _run(self) -> None:
        """Scrape; after the head or the engine went away, a gap, then again."""
        while True:
            try:
                async with ClusterSession(self.cluster) as session:
                    await session.connect([self.cluster.head.name])
                    op = Operation(session, "serve")
                    await op.api_url()
                    async with op.engine(timeout=5) as api:
                        while True:
                            snap = await api.metrics(max_bytes=MAX_METRICS_BYTES)
                            if snap is None:
                                self.ring.add(time.time(), None, None, None)
                                self.ring.error = api.last_error or (
                                    "the engine's /metrics did not answer"
                                )
                            else:
                                self.ring.add(time.time(), snap.running, snap.waiting,
                                              snap.generation_tokens)  # fmt: skip
                            await asyncio.sleep(self.ring.interval_s)
            except SparkOpsError as exc:
                self.ring.error = exc.message
                self.log.warning("load scrape interrupted", error=exc.message)
            except Exception as exc:  # the page goes on without load figures; logged, retried
                self.ring.error = f"scrape failed ({type(exc).__name__})"
                self.log.error("load scrape failed", error=repr(exc)[:300])
            self.ring.add(time.time(), None, None, None)
            await asyncio.sleep(RETRY_S)
