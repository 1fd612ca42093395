"""The throughput sweep: drive each concurrency level (with repeats), return the figures."""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from spark_ops.bench import stats
from spark_ops.bench.client import RequestRecord, StreamClient, ensure_fd_limit
from spark_ops.bench.load import (
    Bodies,
    ServerSettings,
    open_client,
    send_at,
    send_closed,
)
from spark_ops.bench.metrics import MetricsScraper, MetricsWatch
from spark_ops.bench.workload import ENDPOINTS, build_payload, load_prompts
from spark_ops.errors import BenchError, BenchUnreachable
from spark_ops.log import get_logger

MODES = ("burst", "sustained", "poisson")
DEFAULT_LEVELS = (1, 6, 16, 32, 64)
SCHEMA = "spark-ops.bench/1"

LevelCallback = Callable[[stats.LevelResult], Awaitable[None] | None]
# Held around each level (a lease on the watchdog), or raises to refuse it: workflows/loadguard.py
LevelGuard = Callable[[int, Sequence[stats.LevelResult]], AbstractAsyncContextManager[None]]


@dataclass(frozen=True)
class RunEvent:
    """One run of a sweep starting (`run` None) or finished: where the sweep is, for a display."""

    concurrency: int
    repeat: int  # 1-based; 0 for the speed check run after the last level
    repeats: int
    level_index: int  # 1-based among the sweep's levels (len(levels) + 1: the speed check)
    levels: int
    done_runs: int  # runs finished before this event (of this invocation and the resumed one)
    total_runs: int  # every run of the sweep, the speed check's included
    run: stats.RunStats | None = None


RunCallback = Callable[[RunEvent], None]


@dataclass
class SweepConfig(ServerSettings):
    """What to sweep and how; `knobs` (e.g. {"max_num_seqs": 64}) is only reported back."""

    base_url: str
    model: str | None = None
    api: str = "chat"
    levels: Sequence[int] = DEFAULT_LEVELS
    output_tokens: int = 300
    mode: str = "burst"
    duration_s: float = 60.0
    rate: float | None = None
    repeats: int = 3
    warmup: int = 0
    steady_fraction: float = stats.DEFAULT_STEADY_FRACTION
    slo_tok_s: float | None = None
    knee_gain: float = stats.DEFAULT_KNEE_GAIN
    timeout_s: float = 600.0
    api_key: str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    seed: int = 0
    prompts_path: Path | None = None
    knobs: dict[str, Any] | None = None
    metrics: bool = True
    sample_interval_s: float = 0.5
    cpu_warn_fraction: float = 0.8
    # a level run once more after the sweep, to see whether the engine's speed held (SpeedCheck)
    recheck: int | None = None

    def validate(self) -> None:
        """Raise BenchError naming the first setting out of range."""
        self.validate_server()
        if self.mode not in MODES:
            raise BenchError(f"mode {self.mode!r} is not supported; allowed: {', '.join(MODES)}")
        if not self.levels or any(int(c) < 1 for c in self.levels):
            raise BenchError(
                f"levels {list(self.levels)} must be a non-empty list of integers >= 1"
            )
        if len(set(self.levels)) != len(self.levels):
            raise BenchError(f"levels {list(self.levels)} contain a duplicate")
        if self.output_tokens < 1:
            raise BenchError(f"output_tokens {self.output_tokens} must be >= 1")
        if self.repeats < 1:
            raise BenchError(f"repeats {self.repeats} must be >= 1")
        if self.warmup < 0:
            raise BenchError(f"warmup {self.warmup} must be >= 0")
        if not 0 < self.steady_fraction <= 1:
            raise BenchError(f"steady_fraction {self.steady_fraction} must be in (0, 1]")
        if self.mode in ("sustained", "poisson") and self.duration_s <= 0:
            raise BenchError(f"duration_s {self.duration_s} must be > 0 in {self.mode} mode")
        if self.mode == "poisson" and (self.rate is None or self.rate <= 0):
            raise BenchError("mode 'poisson' needs a rate > 0 (requests per second)")
        if self.timeout_s <= 0:
            raise BenchError(f"timeout_s {self.timeout_s} must be > 0")
        if self.recheck is not None and self.recheck not in self.levels:
            raise BenchError(f"recheck {self.recheck} is not one of the levels {list(self.levels)}")


@dataclass
class SweepResult:
    """Everything a sweep measured, plus its reading; round-trips through to_dict/from_dict."""

    base_url: str
    model: str
    api: str
    mode: str
    output_tokens: int
    levels: list[stats.LevelResult]
    reading: stats.Reading
    config: dict[str, Any] = field(default_factory=dict)
    knobs: dict[str, Any] | None = None
    started_at: str = ""
    finished_at: str = ""
    metrics_available: bool = False
    client_cpu_s: float = 0.0
    client_max_cpu_fraction: float = 0.0
    warnings: list[str] = field(default_factory=list)
    kv_pool_tokens: int | None = None
    speed_check: stats.SpeedCheck | None = None

    def to_dict(self) -> dict[str, Any]:
        """Serialize as a JSON-ready dict."""
        return {
            "schema": SCHEMA,
            "base_url": self.base_url,
            "model": self.model,
            "model_id": self.model,
            "endpoint_type": self.api,
            "mode": self.mode,
            "output_tokens": self.output_tokens,
            "knobs": self.knobs,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "metrics_available": self.metrics_available,
            "client_cpu_s": self.client_cpu_s,
            "client_max_cpu_fraction": self.client_max_cpu_fraction,
            "warnings": list(self.warnings),
            "kv_pool_tokens": self.kv_pool_tokens,
            "speed_check": self.speed_check.to_dict() if self.speed_check else None,
            "config": self.config,
            "reading": self.reading.to_dict(),
            "levels": [lv.to_dict() for lv in self.levels],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, source: str = "<dict>") -> SweepResult:
        """Rebuild from to_dict() output; BenchError naming source when it is not a sweep result."""
        if not isinstance(data, dict) or data.get("schema") != SCHEMA:
            raise BenchError(f"{source}: not a spark-ops bench result (expected schema {SCHEMA!r})")
        for key, kinds, said in (("levels", list, "a list"), ("knobs", dict | None, "a mapping"),
                                 ("config", dict | None, "a mapping")):  # fmt: skip
            if not isinstance(data.get(key), kinds):
                raise BenchError(f"{source}: bench result key {key!r} must be {said}")
        if len(data["levels"]) > stats.MAX_LEVELS:
            raise BenchError(
                f"{source}: more than {stats.MAX_LEVELS} levels: not a sweep bench wrote"
            )
        try:
            return cls(
                base_url=data["base_url"],
                model=data["model"],
                api=data["endpoint_type"],
                mode=data["mode"],
                output_tokens=data["output_tokens"],
                levels=[stats.LevelResult.from_dict(lv) for lv in data["levels"]],
                reading=stats.Reading.from_dict(data["reading"]),
                config=data.get("config") or {},
                knobs=data.get("knobs"),
                started_at=data.get("started_at", ""),
                finished_at=data.get("finished_at", ""),
                metrics_available=data.get("metrics_available", False),
                client_cpu_s=data.get("client_cpu_s", 0.0),
                client_max_cpu_fraction=data.get("client_max_cpu_fraction", 0.0),
                warnings=list(data.get("warnings", [])),
                kv_pool_tokens=data.get("kv_pool_tokens"),
                speed_check=(
                    stats.SpeedCheck.from_dict(data["speed_check"])
                    if data.get("speed_check")
                    else None
                ),
            )
        except (KeyError, TypeError, AttributeError, ValueError) as exc:
            raise BenchError(f"{source}: bench result is missing or has a bad key: {exc}") from exc


def _poisson_times(rate: float, duration_s: float, seed: int) -> list[float]:
    """Seconds after the run's start of its arrivals: exponential gaps of mean 1/rate drawn from
    Random(seed), up to duration_s (the first arrival always)."""
    rng = random.Random(seed)
    times: list[float] = []
    at = 0.0
    while True:
        at += rng.expovariate(rate)
        if at >= duration_s and times:
            return times
        times.append(at)


async def _drive(
    client: StreamClient, cfg: SweepConfig, c: int, bodies: Bodies, t0: float, seed: int
) -> list[RequestRecord]:
    """Send one run's requests at concurrency c in the configured mode: c at once (burst), c in
    flight until the duration is over (sustained), or Poisson arrivals at most c in flight."""
    path = ENDPOINTS[cfg.api]
    if cfg.mode == "burst":
        return (await send_closed(client, path, bodies, c, c))[0]
    if cfg.mode == "sustained":
        return (await send_closed(client, path, bodies, 1 << 62, c, t0 + cfg.duration_s))[0]
    assert cfg.rate is not None
    return (await send_at(client, path, bodies, _poisson_times(cfg.rate, cfg.duration_s, seed), c))[
        0
    ]


async def _run_once(
    client: StreamClient,
    scraper: MetricsScraper | None,
    cfg: SweepConfig,
    c: int,
    prompts: Bodies,
    seed: int,
) -> stats.RunStats:
    """One run at concurrency c: scrape, drive, sample, scrape, summarize."""
    watch = MetricsWatch()
    sampler: asyncio.Task[None] | None = None
    stop = asyncio.Event()
    if scraper is not None and scraper.available:
        watch.before = await scraper.scrape()
        sampler = asyncio.create_task(scraper.sample_until(watch, stop))
    cpu0 = time.process_time()
    t0 = time.monotonic()
    try:
        records = await _drive(client, cfg, c, prompts, t0, seed)
    finally:
        stop.set()
        if sampler is not None:
            await sampler
    t_end = max((r.end for r in records), default=t0)
    cpu = time.process_time() - cpu0
    if scraper is not None and scraper.available:
        watch.after = await scraper.scrape()
    return stats.summarize_run(
        records,
        concurrency=c,
        wall_s=t_end - t0,
        steady_fraction=cfg.steady_fraction,
        engine_generated=watch.generated(),
        client_cpu_s=cpu,
        preemptions=watch.preempted(),
        samples=[(s.t - t0, s.running, s.waiting) for s in watch.samples],
    )


async def _recheck(
    client: StreamClient, scraper: MetricsScraper | None, config: SweepConfig,
    rotation: Bodies, levels: list[stats.LevelResult],
) -> stats.SpeedCheck | None:  # fmt: skip
    """Run config.recheck's level once more, after the last: the engine's speed then and now."""
    if config.recheck is None:
        return None
    swept = next(lv for lv in levels if lv.max_concurrency == config.recheck)
    seed = config.seed + 1000 * config.repeats + config.recheck
    run = await _run_once(client, scraper, config, config.recheck, rotation, seed)
    check = stats.SpeedCheck(config.recheck, swept.output_throughput, run.aggregate_tok_s)
    get_logger(op="bench").info(
        "bench_speed_check", concurrency=config.recheck, drift=round(check.drift, 3),
        swept_tok_s=round(check.swept_tok_s, 1), again_tok_s=round(check.again_tok_s, 1),
    )  # fmt: skip
    return check


def held_nothing() -> AbstractAsyncContextManager[None]:
    """No guard (no speed check to run)."""
    return contextlib.nullcontext()


def _now() -> str:
    """UTC time as ISO 8601."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _resumed(
    config: SweepConfig, done: Sequence[stats.LevelResult]
) -> dict[int, stats.LevelResult]:
    """The finished levels a resumed sweep keeps, by concurrency; BenchError for a foreign one."""
    kept: dict[int, stats.LevelResult] = {}
    for lv in done:
        if lv.max_concurrency not in config.levels:
            raise BenchError(
                f"the result to resume has level {lv.max_concurrency}, not one of the levels "
                f"{list(config.levels)}: give the same --concurrency"
            )
        if lv.repeats != config.repeats:
            raise BenchError(
                f"the result to resume ran {lv.repeats} repeat(s) at C={lv.max_concurrency}, "
                f"this sweep {config.repeats}: give the same --repeats"
            )
        kept[lv.max_concurrency] = lv
    return kept


async def run_sweep(
    config: SweepConfig, *, on_level: LevelCallback | None = None,
    on_run: RunCallback | None = None, done: Sequence[stats.LevelResult] = (),
    guard: LevelGuard | None = None,
) -> SweepResult:  # fmt: skip
    """Run every level `repeats` times and return the figures and their reading (no printing).

    `done`: levels an interrupted sweep finished (kept, not run again); `on_run` hears every run
    start and end; `guard` is held around each level (and the speed check), or refuses it.
    """

    def held(c: int) -> AbstractAsyncContextManager[None]:
        """What the guard holds while level c runs (nothing without a guard)."""
        return guard(c, levels) if guard is not None else contextlib.nullcontext()

    config.validate()
    kept = _resumed(config, done)
    total_runs = len(config.levels) * config.repeats + (config.recheck is not None)
    finished = len(kept) * config.repeats

    def tell(c: int, rep: int, run: stats.RunStats | None = None) -> None:
        """Tell on_run where the sweep is."""
        if on_run is not None:
            index = config.levels.index(c) + 1 if rep else len(config.levels) + 1
            on_run(RunEvent(c, rep, config.repeats, index, len(config.levels), finished,
                            total_runs, run))  # fmt: skip

    log = get_logger(op="bench")
    started = _now()
    prompts = load_prompts(config.prompts_path)
    ensure_fd_limit(max(max(config.levels), config.warmup))
    warnings: list[str] = []
    levels: list[stats.LevelResult] = []
    max_cpu_fraction = 0.0
    total_cpu = 0.0
    client, model = await open_client(
        config.base_url, headers=config.all_headers(), timeout_s=config.timeout_s,
        model=config.model,
    )  # fmt: skip
    try:
        rotation = Bodies(
            [build_payload(p, model=model, api=config.api, output_tokens=config.output_tokens)
             for p in prompts]
        )  # fmt: skip
        scraper = (
            MetricsScraper(client, interval_s=config.sample_interval_s) if config.metrics else None
        )
        if config.warmup:
            log.info("bench_warmup", requests=config.warmup)
            path = ENDPOINTS[config.api]
            warm, _ = await send_closed(client, path, rotation, config.warmup, config.warmup)
            failed = [r for r in warm if not r.ok]
            if len(failed) == len(warm):
                raise BenchUnreachable(
                    f"every warm-up request to {config.base_url}{path} failed: {failed[0].error}",
                    hint="check --model, --url and the server log",
                )
        for c in config.levels:
            if c in kept:
                levels.append(kept[c])
                continue
            runs: list[stats.RunStats] = []
            async with held(c):
                for rep in range(config.repeats):
                    tell(c, rep + 1)
                    run = await _run_once(
                        client, scraper, config, c, rotation, config.seed + 1000 * rep + c
                    )
                    finished += 1
                    tell(c, rep + 1, run)
                    runs.append(run)
                    total_cpu += run.client_cpu_s
                    frac = run.client_cpu_s / run.wall_s if run.wall_s > 0 else 0.0
                    max_cpu_fraction = max(max_cpu_fraction, frac)
                    if frac >= config.cpu_warn_fraction:
                        msg = (
                            f"client used {frac:.0%} of a core at concurrency {c}: "
                            "the client may be what is measured"
                        )
                        warnings.append(msg)
                        log.warning("bench_client_cpu", concurrency=c, cpu_fraction=round(frac, 3))
                    log.debug(
                        "bench_run",
                        concurrency=c,
                        repeat=rep + 1,
                        wall_s=round(run.wall_s, 3),
                        tok_s=round(run.aggregate_tok_s, 1),
                        failed=run.failed,
                    )
            level = stats.summarize_level(runs)
            if level.completed == 0:
                first = next(iter(level.errors), "no request was sent")
                warnings.append(f"concurrency {c}: every request failed ({first})")
            if not level.usage_reported and level.completed:
                warnings.append(
                    f"concurrency {c}: the server sent no usage chunk; tokens were counted from "
                    "content chunks"
                )
            levels.append(level)
            if on_level is not None:
                maybe = on_level(level)
                if asyncio.iscoroutine(maybe):
                    await maybe
        if config.recheck is not None:
            tell(config.recheck, 0)
        async with held(config.recheck) if config.recheck is not None else held_nothing():
            speed_check = await _recheck(client, scraper, config, rotation, levels)
        metrics_available = scraper is not None and scraper.available
    finally:
        await client.__aexit__()
    knob = (config.knobs or {}).get("max_num_seqs")
    reading = stats.read_levels(
        levels,
        slo_tok_s=config.slo_tok_s,
        knee_gain=config.knee_gain,
        max_num_seqs=int(knob) if isinstance(knob, (int, str)) and str(knob).isdigit() else None,
    )
    return SweepResult(
        base_url=config.base_url,
        model=model,
        api=config.api,
        mode=config.mode,
        output_tokens=config.output_tokens,
        levels=levels,
        reading=reading,
        config=config.to_dict(),
        knobs=dict(config.knobs) if config.knobs else None,
        started_at=started,
        finished_at=_now(),
        metrics_available=metrics_available,
        client_cpu_s=total_cpu,
        client_max_cpu_fraction=max_cpu_fraction,
        warnings=warnings,
        kv_pool_tokens=scraper.kv_tokens if scraper is not None else None,
        speed_check=speed_check,
    )
