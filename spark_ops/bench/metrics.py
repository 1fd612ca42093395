"""Engine-side figures from vLLM's /metrics: counters before/after, gauges sampled during."""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from spark_ops.engine.metrics import kv_pool_tokens, metric_sums
from spark_ops.log import get_logger

if TYPE_CHECKING:
    from spark_ops.bench.client import StreamClient

GENERATION_TOKENS = "vllm:generation_tokens_total"
RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
PREEMPTIONS = "vllm:num_preemptions_total"
WANTED = (GENERATION_TOKENS, RUNNING, WAITING, PREEMPTIONS)


@dataclass
class Sample:
    """One scrape of the scheduler gauges, at a monotonic time."""

    t: float
    running: float
    waiting: float


@dataclass
class MetricsWatch:
    """Engine figures of one run: counter before and after, gauge samples during."""

    before: dict[str, float] = field(default_factory=dict)
    after: dict[str, float] = field(default_factory=dict)
    samples: list[Sample] = field(default_factory=list)

    def generated(self) -> float | None:
        """Generation tokens counted by the engine during the run, or None without the counter."""
        if GENERATION_TOKENS in self.before and GENERATION_TOKENS in self.after:
            return self.after[GENERATION_TOKENS] - self.before[GENERATION_TOKENS]
        return None

    def preempted(self) -> int | None:
        """Preemptions the engine counted during the run, or None without the counter."""
        if PREEMPTIONS in self.before and PREEMPTIONS in self.after:
            return round(self.after[PREEMPTIONS] - self.before[PREEMPTIONS])
        return None


class MetricsScraper:
    """Scrapes /metrics; turns itself off (with one log line) when the server has none."""

    def __init__(self, client: StreamClient, *, interval_s: float = 0.5) -> None:
        """Scrape through the given client every interval_s while sampling."""
        self.client = client
        self.interval_s = interval_s
        self.available = True
        self.kv_tokens: int | None = None  # the KV pool, from the first scrape that shows it
        self._log = get_logger(op="bench")

    async def scrape(self) -> dict[str, float]:
        """One scrape; {} (and scraping off) when /metrics is missing or has no vLLM metrics."""
        if not self.available:
            return {}
        try:
            status, text = await self.client.get_text("/metrics", timeout_s=5.0)
        except Exception as exc:  # any transport failure: the sweep goes on without engine figures
            self._disable(f"{type(exc).__name__}: {exc}")
            return {}
        if status != 200:
            self._disable(f"HTTP {status}")
            return {}
        values = metric_sums(text, WANTED)
        if self.kv_tokens is None:
            self.kv_tokens = kv_pool_tokens(text)
        if not values:
            self._disable("no vllm:* metrics in the response")
        return values

    def _disable(self, why: str) -> None:
        """Stop scraping and say why once."""
        if self.available:
            self.available = False
            self._log.warning("metrics_unavailable", url=self.client.base_url + "/metrics", why=why)

    async def sample_until(self, watch: MetricsWatch, stop: asyncio.Event) -> None:
        """Append running/waiting samples to watch every interval until stop is set."""
        while self.available and not stop.is_set():
            values = await self.scrape()
            if RUNNING in values:
                watch.samples.append(
                    Sample(time.monotonic(), values[RUNNING], values.get(WAITING, 0.0))
                )
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=self.interval_s)
