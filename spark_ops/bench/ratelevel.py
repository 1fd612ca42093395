"""One open-loop level's figures: rates, latency percentiles, and goodput under an SLO.

Goodput counts the requests that finished without an error and met every SLO given: a TTFT
(time to the first token) at most `ttft_ms`, and a TPOT (time per output token after the first,
(end - first token) / (tokens - 1)) at most `tpot_ms`. A request that streamed no token misses a
TTFT SLO; one of a single token has no TPOT and is not held to a TPOT SLO. An SLO of None is not
applied. request_goodput is those requests per second of the level's wall clock, output_goodput
their output tokens per second: never more than request_throughput and output_throughput.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

from spark_ops.bench.measures import percentile
from spark_ops.errors import BenchError

if TYPE_CHECKING:
    from spark_ops.bench.client import RequestRecord

DEFAULT_SLO_TTFT_MS = 2000.0
DEFAULT_SLO_TPOT_MS = 100.0  # 10 tok/s per user, about reading speed


@dataclass(frozen=True)
class Slo:
    """The latencies a request must keep to count towards goodput (None: not applied)."""

    ttft_ms: float | None = DEFAULT_SLO_TTFT_MS
    tpot_ms: float | None = DEFAULT_SLO_TPOT_MS

    def validate(self) -> None:
        """Raise BenchError when a limit is not a number > 0."""
        for name, value in (("ttft_ms", self.ttft_ms), ("tpot_ms", self.tpot_ms)):
            if value is not None and not (math.isfinite(value) and value > 0):
                raise BenchError(f"SLO {name} {value!r} must be a number > 0 (or not given)")

    def met(self, ok: bool, ttft_ms: float | None, tpot_ms: float | None) -> bool:
        """Whether one request met every SLO given (see the module docstring)."""
        if not ok:
            return False
        if self.ttft_ms is not None and (ttft_ms is None or ttft_ms > self.ttft_ms):
            return False
        return self.tpot_ms is None or tpot_ms is None or tpot_ms <= self.tpot_ms


def request_latencies(record: RequestRecord) -> tuple[float | None, float | None]:
    """(TTFT ms, TPOT ms) of one request; None where it has none."""
    first = record.first_token
    ttft = (first - record.start) * 1000.0 if first is not None else None
    tokens = record.output_tokens
    if first is None or tokens < 2:
        return ttft, None
    tpot = (record.end - first) * 1000.0 / (tokens - 1)
    return ttft, tpot


@dataclass
class RateLevel:
    """One open-loop level: what was offered, what came back, and what met the SLO."""

    request_rate: float  # offered, requests per second
    arrivals: str
    seed: int
    requests: int  # sent
    max_concurrency: int | None
    duration: float  # first send to last end, s
    completed: int
    failed: int
    total_input_tokens: int | None
    total_output_tokens: int
    request_throughput: float  # achieved: completed requests per second
    output_throughput: float  # output tok/s of the completed requests
    mean_ttft_ms: float | None
    median_ttft_ms: float | None
    p95_ttft_ms: float | None
    p99_ttft_ms: float | None
    mean_tpot_ms: float | None
    median_tpot_ms: float | None
    p95_tpot_ms: float | None
    p99_tpot_ms: float | None
    median_e2el_ms: float | None
    p95_e2el_ms: float | None
    slo_ttft_ms: float | None
    slo_tpot_ms: float | None
    good_requests: int
    request_goodput: float
    output_goodput: float
    max_send_lag_ms: float  # how late the latest send left after its scheduled time
    errors: dict[str, int] = field(default_factory=dict)

    def scalars(self) -> dict[str, Any]:
        """The flat scalar figures (for CSV)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "errors"}

    def to_dict(self) -> dict[str, Any]:
        """Serialize."""
        return {**self.scalars(), "errors": dict(self.errors)}

    @classmethod
    def from_dict(cls, data: Any) -> RateLevel:
        """Rebuild from to_dict() output; unknown keys are ignored, a missing one is a KeyError."""
        if not isinstance(data, dict):
            raise TypeError(f"a level must be a mapping, got {type(data).__name__}")
        names = {f.name for f in fields(cls)}
        kw = {k: v for k, v in data.items() if k in names}
        rate = kw.get("request_rate")
        if isinstance(rate, bool) or not isinstance(rate, int | float) or not rate > 0:
            raise ValueError(f"request_rate must be a number > 0, got {rate!r:.40}")
        errors = kw.get("errors", {})
        if not isinstance(errors, dict):
            raise TypeError("errors must be a mapping")
        return cls(**kw)


def _ms(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile of values already in ms (None when empty)."""
    return percentile(values, q)


def summarize_rate_level(
    records: Sequence[RequestRecord], *, t0: float, rate: float, arrivals: str, seed: int,
    max_concurrency: int | None, slo: Slo, send_lags: Sequence[float] = (),
) -> RateLevel:  # fmt: skip
    """The figures of one level from its request records (times in time.monotonic() s)."""
    ok = [r for r in records if r.ok]
    errors: dict[str, int] = {}
    for r in records:
        if r.error is not None:
            errors[r.error] = errors.get(r.error, 0) + 1
    end = max((r.end for r in records), default=t0)
    duration = max(end - t0, 0.0)
    ttfts: list[float] = []
    tpots: list[float] = []
    good = good_tokens = 0
    for r in records:
        ttft, tpot = request_latencies(r) if r.ok else (None, None)
        if ttft is not None:
            ttfts.append(ttft)
        if tpot is not None:
            tpots.append(tpot)
        if slo.met(r.ok, ttft, tpot):
            good += 1
            good_tokens += r.output_tokens
    out_tokens = sum(r.output_tokens for r in ok)
    prompt = [r.prompt_tokens for r in ok if r.prompt_tokens is not None]
    e2e = [(r.end - r.start) * 1000.0 for r in ok]

    def per_s(count: float) -> float:
        """count per second of the level's wall clock (0 for a level that took no time)."""
        return count / duration if duration > 0 else 0.0

    return RateLevel(
        request_rate=rate, arrivals=arrivals, seed=seed, requests=len(records),
        max_concurrency=max_concurrency, duration=duration, completed=len(ok),
        failed=len(records) - len(ok), total_input_tokens=sum(prompt) if prompt else None,
        total_output_tokens=out_tokens, request_throughput=per_s(len(ok)),
        output_throughput=per_s(out_tokens),
        mean_ttft_ms=statistics.fmean(ttfts) if ttfts else None,
        median_ttft_ms=_ms(ttfts, 50), p95_ttft_ms=_ms(ttfts, 95), p99_ttft_ms=_ms(ttfts, 99),
        mean_tpot_ms=statistics.fmean(tpots) if tpots else None,
        median_tpot_ms=_ms(tpots, 50), p95_tpot_ms=_ms(tpots, 95), p99_tpot_ms=_ms(tpots, 99),
        median_e2el_ms=_ms(e2e, 50), p95_e2el_ms=_ms(e2e, 95),
        slo_ttft_ms=slo.ttft_ms, slo_tpot_ms=slo.tpot_ms, good_requests=good,
        request_goodput=per_s(good), output_goodput=per_s(good_tokens),
        max_send_lag_ms=max(send_lags, default=0.0) * 1000.0, errors=errors,
    )  # fmt: skip
