"""Open-loop load: requests sent at seeded arrival times whatever the earlier ones are doing.

A closed-loop sweep (sweep.py) keeps C requests in flight, so a slower server is offered less
work and hides it. Here the schedule is fixed up front from a rate and a seed (as `vllm bench
serve --request-rate` and GuideLLM's constant/poisson profiles do): request i is sent at
`times[i]` seconds after the level starts, finished or not the ones before it, unless an optional
max_concurrency cap holds it back. Each level reports the offered and achieved rates, tok/s,
TTFT/TPOT percentiles, errors and goodput: the requests (and their tokens) per second that met
every SLO given.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import random
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from spark_ops.bench.client import ensure_fd_limit
from spark_ops.bench.load import (
    Bodies,
    ServerSettings,
    open_client,
    send_at,
    send_closed,
)
from spark_ops.bench.ratelevel import RateLevel, Slo, summarize_rate_level
from spark_ops.bench.workload import ENDPOINTS
from spark_ops.errors import BenchError
from spark_ops.log import get_logger

ARRIVALS = ("poisson", "constant")
SCHEMA = "spark-ops.bench-rate/1"
MODE = "open-loop"
DEFAULT_REQUESTS = 100
MAX_REQUESTS = 100_000  # requests one level may send
MAX_RATE = 10_000.0  # requests per second one level may offer

RateCallback = Callable[[RateLevel], Awaitable[None] | None]
# Held around each rate's level (a lease on the watchdog), or raises to refuse it: loadguard.py
RateGuard = Callable[[float], AbstractAsyncContextManager[None]]


def arrival_times(requests: int, rate: float, arrivals: str, seed: int) -> list[float]:
    """Seconds after the level's start at which each request is sent: the first at 0, then gaps
    of 1/rate (constant) or exponential gaps of mean 1/rate drawn from Random(seed) (poisson)."""
    if arrivals not in ARRIVALS:
        raise BenchError(f"arrivals {arrivals!r} is not supported; allowed: {', '.join(ARRIVALS)}")
    if not (math.isfinite(rate) and rate > 0):
        raise BenchError(f"request rate {rate!r} must be a number > 0 (requests per second)")
    if requests < 1:
        raise BenchError(f"requests {requests} must be >= 1")
    if arrivals == "constant":
        return [i / rate for i in range(requests)]
    rng = random.Random(seed)
    times = [0.0]
    for _ in range(requests - 1):
        times.append(times[-1] + rng.expovariate(rate))
    return times


@dataclass
class RateConfig(ServerSettings):
    """An open-loop sweep: one level per rate, each `requests` arrivals from the same seed."""

    base_url: str
    rates: Sequence[float]
    model: str | None = None
    api: str = "chat"
    arrivals: str = "poisson"
    requests: int = DEFAULT_REQUESTS
    max_concurrency: int | None = None
    output_tokens: int = 300
    seed: int = 0
    slo: Slo = field(default_factory=Slo)
    warmup: int = 0
    timeout_s: float = 600.0
    api_key: str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    prompts_path: Path | None = None
    knobs: dict[str, Any] | None = None

    def validate(self) -> None:
        """Raise BenchError naming the first setting out of range."""
        self.validate_server()
        if self.arrivals not in ARRIVALS:
            raise BenchError(
                f"arrivals {self.arrivals!r} is not supported; allowed: {', '.join(ARRIVALS)}"
            )
        rates = list(self.rates)
        if not rates or any(not (math.isfinite(r) and 0 < r <= MAX_RATE) for r in rates):
            raise BenchError(
                f"rates {rates} must be a non-empty list of numbers in (0, {MAX_RATE:g}]"
            )
        if len(set(rates)) != len(rates):
            raise BenchError(f"rates {rates} contain a duplicate")
        if not 1 <= self.requests <= MAX_REQUESTS:
            raise BenchError(f"requests {self.requests} must be 1..{MAX_REQUESTS}")
        if self.max_concurrency is not None and self.max_concurrency < 1:
            raise BenchError(f"max_concurrency {self.max_concurrency} must be >= 1")
        if self.output_tokens < 1:
            raise BenchError(f"output_tokens {self.output_tokens} must be >= 1")
        if self.warmup < 0:
            raise BenchError(f"warmup {self.warmup} must be >= 0")
        if self.timeout_s <= 0:
            raise BenchError(f"timeout_s {self.timeout_s} must be > 0")
        self.slo.validate()


@dataclass
class RateResult:
    """An open-loop sweep's levels; its own schema, so a reader of concurrency sweeps refuses it
    by name instead of reading rates as concurrencies."""

    base_url: str
    model: str
    api: str
    arrivals: str
    output_tokens: int
    levels: list[RateLevel]
    config: dict[str, Any] = field(default_factory=dict)
    knobs: dict[str, Any] | None = None
    started_at: str = ""
    finished_at: str = ""
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """Serialize as a JSON-ready dict (key names as in `vllm bench serve` where they agree)."""
        return {
            "schema": SCHEMA,
            "mode": MODE,
            "base_url": self.base_url,
            "model": self.model,
            "model_id": self.model,
            "endpoint_type": self.api,
            "arrivals": self.arrivals,
            "output_tokens": self.output_tokens,
            "knobs": self.knobs,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "warnings": list(self.warnings),
            "config": self.config,
            "levels": [lv.to_dict() for lv in self.levels],
        }

    @classmethod
    def from_dict(cls, data: Any, *, source: str = "<dict>") -> RateResult:
        """Rebuild from to_dict() output; BenchError naming source when it is not one."""
        if not isinstance(data, dict) or data.get("schema") != SCHEMA:
            raise BenchError(
                f"{source}: not an open-loop bench result (expected schema {SCHEMA!r})"
            )
        levels = data.get("levels")
        if not isinstance(levels, list) or len(levels) > MAX_REQUESTS:
            raise BenchError(f"{source}: open-loop result key 'levels' must be a list")
        knobs = data.get("knobs")
        if knobs is not None and not isinstance(knobs, dict):
            raise BenchError(f"{source}: open-loop result key 'knobs' must be a mapping")
        try:
            return cls(
                base_url=str(data["base_url"]),
                model=str(data["model"]),
                api=str(data["endpoint_type"]),
                arrivals=str(data["arrivals"]),
                output_tokens=int(data["output_tokens"]),
                levels=[RateLevel.from_dict(lv) for lv in levels],
                config=dict(data.get("config") or {}),
                knobs=knobs,
                started_at=str(data.get("started_at", "")),
                finished_at=str(data.get("finished_at", "")),
                warnings=[str(w) for w in data.get("warnings") or []],
            )
        except (KeyError, TypeError, AttributeError, ValueError) as exc:
            raise BenchError(
                f"{source}: open-loop result is missing or has a bad key: {exc}"
            ) from exc


def _now() -> str:
    """UTC time as ISO 8601."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


async def run_rates(
    config: RateConfig, *, on_level: RateCallback | None = None, guard: RateGuard | None = None
) -> RateResult:
    """Run one open-loop level per rate (in the order given) and return the figures; `guard` is
    held around each level (a lease on the watchdog), or refuses it."""
    config.validate()
    log = get_logger(op="bench")
    started = _now()
    ensure_fd_limit(config.max_concurrency or config.requests)
    path = ENDPOINTS[config.api]
    client, model = await open_client(
        config.base_url, headers=config.all_headers(), timeout_s=config.timeout_s,
        model=config.model,
    )  # fmt: skip
    levels: list[RateLevel] = []
    warnings: list[str] = []
    try:
        bodies = Bodies.build(
            model, api=config.api, output_tokens=config.output_tokens,
            prompts_path=config.prompts_path,
        )  # fmt: skip
        if config.warmup:
            log.info("bench_warmup", requests=config.warmup)
            await send_closed(client, path, bodies, config.warmup, config.warmup)
        for rate in config.rates:
            times = arrival_times(config.requests, rate, config.arrivals, config.seed)
            async with guard(rate) if guard is not None else contextlib.nullcontext():
                records, lags, t0 = await send_at(
                    client, path, bodies, times, config.max_concurrency
                )
            level = summarize_rate_level(
                records, t0=t0, rate=rate, arrivals=config.arrivals, seed=config.seed,
                max_concurrency=config.max_concurrency, slo=config.slo, send_lags=lags,
            )  # fmt: skip
            log.debug("bench_rate_level", rate=rate, tok_s=round(level.output_throughput, 1),
                      failed=level.failed)  # fmt: skip
            if level.completed == 0:
                first = next(iter(level.errors), "no request was sent")
                warnings.append(f"rate {rate:g}/s: every request failed ({first})")
            levels.append(level)
            if on_level is not None:
                maybe = on_level(level)
                if asyncio.iscoroutine(maybe):
                    await maybe
    finally:
        await client.__aexit__()
    return RateResult(
        base_url=config.base_url, model=model, api=config.api, arrivals=config.arrivals,
        output_tokens=config.output_tokens, levels=levels, config=config.to_dict(),
        knobs=dict(config.knobs) if config.knobs else None, started_at=started,
        finished_at=_now(), warnings=warnings,
    )  # fmt: skip
