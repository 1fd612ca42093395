"""The measurement a gate needs: one load point measured, and before/after proved against limits.

`measure(endpoint, point)` sends a fixed, seeded load (a closed-loop concurrency or an open-loop
arrival rate, `requests` requests) and returns a `Measurement`: aggregate tok/s, TTFT p95, TPOT p95,
errors and goodput. `prove(before, after, thresholds)` compares two of them and returns a
`Verdict`, one check per metric (before, after, change, limit, ok):

- tok/s: change = (after - before) / before x 100 %; ok when change >= -max_tok_s_drop_pct;
- TTFT p95, TPOT p95: change likewise; ok when change <= max_*_rise_pct (0 before and after: 0 %);
- errors: change = after - before; ok when after <= max_errors.

A figure that could not be measured (missing, NaN, infinite, negative; tok/s of 0 before) fails
its check with the reason: a gate never passes on a metric it did not see. Nothing here knows the
CLI: `apply --prove` and `rollout` build on it.
"""

from __future__ import annotations

import io
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from spark_ops.bench.client import ensure_fd_limit
from spark_ops.bench.load import Bodies, open_client, send_at, send_closed
from spark_ops.bench.openloop import arrival_times
from spark_ops.bench.ratelevel import RateLevel, Slo, summarize_rate_level
from spark_ops.bench.workload import APIS, ENDPOINTS
from spark_ops.errors import BenchError

if TYPE_CHECKING:
    from rich.table import Table

DEFAULT_MAX_TOK_S_DROP_PCT = 5.0
DEFAULT_MAX_TTFT_P95_RISE_PCT = 20.0
DEFAULT_MAX_TPOT_P95_RISE_PCT = 10.0
DEFAULT_MAX_ERRORS = 0


@dataclass(frozen=True)
class LoadPoint:
    """A load to measure at: a concurrency (closed loop) or an arrival rate (open loop)."""

    concurrency: int | None = None
    request_rate: float | None = None
    requests: int = 64
    output_tokens: int = 300
    arrivals: str = "poisson"
    seed: int = 0
    max_concurrency: int | None = None  # open loop only: a cap on requests in flight
    prompts_path: str | None = None  # the prompt file (its prompts set the input size)

    def validate(self) -> None:
        """Raise BenchError unless exactly one of concurrency and request_rate is set, in range."""
        if (self.concurrency is None) == (self.request_rate is None):
            raise BenchError("a load point needs exactly one of concurrency and request_rate")
        if self.concurrency is not None and self.concurrency < 1:
            raise BenchError(f"concurrency {self.concurrency} must be >= 1")
        if self.request_rate is not None and not (
            math.isfinite(self.request_rate) and self.request_rate > 0
        ):
            raise BenchError(f"request_rate {self.request_rate!r} must be a number > 0")
        if self.requests < 1 or self.output_tokens < 1:
            raise BenchError("a load point needs requests >= 1 and output_tokens >= 1")

    def text(self) -> str:
        """The point in words: 'concurrency 64, 128 requests, 300 output tokens'."""
        load = (
            f"concurrency {self.concurrency}"
            if self.concurrency is not None
            else f"{self.arrivals} {self.request_rate:g} req/s (seed {self.seed})"
        )
        return f"{load}, {self.requests} requests, {self.output_tokens} output tokens"

    def to_dict(self) -> dict[str, Any]:
        """Serialize."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LoadPoint:
        """Rebuild from to_dict() output."""
        return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})


@dataclass(frozen=True)
class Measurement:
    """What a gate compares: one load point's figures (None: not measured)."""

    tok_s: float | None
    ttft_p95_ms: float | None
    tpot_p95_ms: float | None
    errors: int | None
    requests: int = 0
    goodput_req_s: float | None = None
    goodput_tok_s: float | None = None
    point: LoadPoint | None = None

    def to_dict(self) -> dict[str, Any]:
        """Serialize (NaN and infinities as null: JSON has none)."""
        data = {k: _json_number(v) for k, v in asdict(self).items() if k != "point"}
        data["point"] = self.point.to_dict() if self.point else None
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Measurement:
        """Rebuild from to_dict() output; a missing figure is None (not measured)."""
        point = data.get("point")
        return cls(
            tok_s=data.get("tok_s"), ttft_p95_ms=data.get("ttft_p95_ms"),
            tpot_p95_ms=data.get("tpot_p95_ms"), errors=data.get("errors"),
            requests=data.get("requests", 0), goodput_req_s=data.get("goodput_req_s"),
            goodput_tok_s=data.get("goodput_tok_s"),
            point=LoadPoint.from_dict(point) if isinstance(point, dict) else None,
        )  # fmt: skip


@dataclass(frozen=True)
class Thresholds:
    """How much worse `after` may be than `before` and still pass."""

    max_tok_s_drop_pct: float = DEFAULT_MAX_TOK_S_DROP_PCT
    max_ttft_p95_rise_pct: float = DEFAULT_MAX_TTFT_P95_RISE_PCT
    max_tpot_p95_rise_pct: float = DEFAULT_MAX_TPOT_P95_RISE_PCT
    max_errors: int = DEFAULT_MAX_ERRORS

    def validate(self) -> None:
        """Raise BenchError naming a limit that is not a number >= 0 (errors: an integer)."""
        for name, value in asdict(self).items():
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise BenchError(f"threshold {name} {value!r} must be a number >= 0")
            if not (math.isfinite(value) and value >= 0):
                raise BenchError(f"threshold {name} {value!r} must be a number >= 0")
        if not isinstance(self.max_errors, int):
            raise BenchError(f"threshold max_errors {self.max_errors!r} must be an integer >= 0")

    def to_dict(self) -> dict[str, Any]:
        """Serialize."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Thresholds:
        """Rebuild from to_dict() output (a key left out: its default), validated."""
        made = cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})
        made.validate()
        return made


@dataclass(frozen=True)
class Check:
    """One metric of a verdict: before, after, change, the limit, and whether it passed."""

    metric: str
    label: str
    before: float | None
    after: float | None
    change: float | None  # % for the rates and latencies, a count for errors
    unit: str  # "%" or "" (a count)
    limit: str  # the rule in words: '>= -5%', '<= +20%', '<= 0'
    ok: bool
    reason: str = ""

    def to_dict(self) -> dict[str, Any]:
        """Serialize (NaN and infinities as null)."""
        return {k: _json_number(v) for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Check:
        """Rebuild from to_dict() output."""
        return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})


@dataclass
class Verdict:
    """Every check of before against after; ok only when every check passed and nothing else
    (such as different load points) stands in the way."""

    checks: list[Check]
    problems: list[str] = field(default_factory=list)
    thresholds: Thresholds = field(default_factory=Thresholds)
    point: LoadPoint | None = None

    @property
    def ok(self) -> bool:
        """True when every check passed and there is no problem."""
        return not self.problems and all(c.ok for c in self.checks)

    @property
    def failed(self) -> list[Check]:
        """The checks that did not pass."""
        return [c for c in self.checks if not c.ok]

    def to_dict(self) -> dict[str, Any]:
        """Serialize for --json."""
        return {
            "ok": self.ok,
            "point": self.point.to_dict() if self.point else None,
            "thresholds": self.thresholds.to_dict(),
            "checks": [c.to_dict() for c in self.checks],
            "problems": list(self.problems),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Verdict:
        """Rebuild from to_dict() output (`ok` is worked out again, not read)."""
        point = data.get("point")
        return cls(
            checks=[Check.from_dict(c) for c in data.get("checks") or []],
            problems=[str(p) for p in data.get("problems") or []],
            thresholds=Thresholds.from_dict(data.get("thresholds") or {}),
            point=LoadPoint.from_dict(point) if isinstance(point, dict) else None,
        )

    def lines(self) -> list[str]:
        """The verdict in sentences: pass, or what failed and why."""
        if self.ok:
            return ["Gate: pass (every metric within its limit)."]
        out = ["Gate: FAIL."]
        out += [f"  {p}" for p in self.problems]
        for c in self.failed:
            why = c.reason or f"change {_change_text(c)} is outside {c.limit}"
            out.append(f"  {c.label}: {why}")
        return out


def _json_number(value: Any) -> Any:
    """A float that JSON can hold, else None; other values as they are."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _figure(value: Any) -> tuple[float | None, str]:
    """(the figure, '') when it is a measured number, else (None, why not)."""
    if value is None:
        return None, "not measured"
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None, f"not a number ({type(value).__name__})"
    if math.isnan(value):
        return None, "not measured (NaN)"
    if math.isinf(value) or value < 0:
        return None, f"not a measurement ({value})"
    return float(value), ""


def _relative(
    metric: str, label: str, before: Any, after: Any, limit_pct: float, *, higher_is_better: bool
) -> Check:
    """A check of a relative change (%) against a limit: a drop for a rate, a rise for latency."""
    rule = f">= -{limit_pct:g}%" if higher_is_better else f"<= +{limit_pct:g}%"
    b, why_b = _figure(before)
    a, why_a = _figure(after)
    shown_b = b if b is not None else before if isinstance(before, float) else None
    shown_a = a if a is not None else after if isinstance(after, float) else None
    if b is None or a is None:
        reason = "; ".join(
            f"{side} {why}" for side, why in (("before", why_b), ("after", why_a)) if why
        )
        return Check(metric, label, shown_b, shown_a, None, "%", rule, False, reason)
    if b == 0:
        if higher_is_better:
            return Check(metric, label, b, a, None, "%", rule, False,
                         "before is 0: no change can be worked out")  # fmt: skip
        if a > 0:
            return Check(metric, label, b, a, None, "%", rule, False,
                         "before is 0 and after is not: the rise has no bound")  # fmt: skip
        return Check(metric, label, b, a, 0.0, "%", rule, True)
    change = (a - b) / b * 100.0
    ok = change >= -limit_pct if higher_is_better else change <= limit_pct
    return Check(metric, label, b, a, change, "%", rule, ok)


def _errors(before: Any, after: Any, limit: int) -> Check:
    """The errors check: after at most `limit` (before shown for the change)."""
    rule = f"<= {limit}"
    a, why_a = _figure(after)
    b, _ = _figure(before)
    if a is None:
        return Check("errors", "errors", b, None, None, "", rule, False, f"after {why_a}")
    change = a - b if b is not None else None
    return Check("errors", "errors", b, a, change, "", rule, a <= limit)


def prove(before: Measurement, after: Measurement, thresholds: Thresholds | None = None) -> Verdict:
    """Compare after with before metric by metric (module docstring); pure."""
    t = thresholds or Thresholds()
    t.validate()
    checks = [
        _relative("tok_s", "aggregate tok/s", before.tok_s, after.tok_s,
                  t.max_tok_s_drop_pct, higher_is_better=True),
        _relative("ttft_p95_ms", "TTFT p95 ms", before.ttft_p95_ms, after.ttft_p95_ms,
                  t.max_ttft_p95_rise_pct, higher_is_better=False),
        _relative("tpot_p95_ms", "TPOT p95 ms", before.tpot_p95_ms, after.tpot_p95_ms,
                  t.max_tpot_p95_rise_pct, higher_is_better=False),
        _errors(before.errors, after.errors, t.max_errors),
    ]  # fmt: skip
    problems = []
    if before.point is not None and after.point is not None and before.point != after.point:
        problems.append(
            f"measured at different loads: before {before.point.text()}, after {after.point.text()}"
        )
    return Verdict(checks, problems, t, before.point or after.point)


def _change_text(c: Check) -> str:
    """A check's change as shown: '-3.2%', '+1', or a dash."""
    if c.change is None or not math.isfinite(c.change):
        return "–"
    return f"{c.change:+.1f}%" if c.unit == "%" else f"{c.change:+g}"


def _value_text(value: float | None) -> str:
    """A figure as shown: one decimal, or a dash when not measured."""
    if value is None or not math.isfinite(value):
        return "–"
    return f"{value:.1f}" if value != int(value) else f"{value:.0f}"


def verdict_table(verdict: Verdict) -> Table:
    """Before and after side by side: metric, before, after, change, limit, ok."""
    from rich.table import Table

    title = "Gate" + (f" at {verdict.point.text()}" if verdict.point else "")
    table = Table(title=title, title_justify="left", min_width=len(title))
    for name in ("metric", "before", "after", "change", "limit", "ok"):
        table.add_column(name, justify="left" if name == "metric" else "right", no_wrap=True)
    for c in verdict.checks:
        table.add_row(c.label, _value_text(c.before), _value_text(c.after), _change_text(c),
                      c.limit, "ok" if c.ok else "FAIL")  # fmt: skip
    return table


def render_verdict(verdict: Verdict, *, width: int = 100) -> str:
    """The verdict's table and sentences as plain text."""
    from rich.console import Console

    console = Console(width=width, record=True, file=io.StringIO(), color_system=None)
    console.print(verdict_table(verdict))
    for line in verdict.lines():
        console.print(line, highlight=False, markup=False)
    return console.export_text()


@dataclass(frozen=True)
class Endpoint:
    """Where to measure: an OpenAI-compatible server's base URL and how to ask it."""

    base_url: str
    model: str | None = None
    api: str = "chat"
    headers: dict[str, str] = field(default_factory=dict)
    timeout_s: float = 600.0


async def measure(
    endpoint: Endpoint | str, point: LoadPoint, *, slo: Slo | None = None
) -> Measurement:
    """Send the point's load to the endpoint and return its figures (BenchUnreachable when the
    server does not answer; failed requests are counted as errors, not raised)."""
    point.validate()
    ep = Endpoint(endpoint) if isinstance(endpoint, str) else endpoint
    if ep.api not in APIS:
        raise BenchError(f"api {ep.api!r} is not supported; allowed: {', '.join(APIS)}")
    goal = slo or Slo()
    goal.validate()
    ensure_fd_limit(point.concurrency or point.max_concurrency or point.requests)
    client, model = await open_client(
        ep.base_url, headers=ep.headers, timeout_s=ep.timeout_s, model=ep.model
    )
    try:
        bodies = Bodies.build(
            model, api=ep.api, output_tokens=point.output_tokens,
            prompts_path=Path(point.prompts_path) if point.prompts_path else None,
        )  # fmt: skip
        path = ENDPOINTS[ep.api]
        if point.concurrency is not None:
            records, t0 = await send_closed(client, path, bodies, point.requests, point.concurrency)
        else:
            assert point.request_rate is not None  # validate(): one of the two
            times = arrival_times(point.requests, point.request_rate, point.arrivals, point.seed)
            records, _, t0 = await send_at(client, path, bodies, times, point.max_concurrency)
    finally:
        await client.__aexit__()
    level = summarize_rate_level(
        records, t0=t0, rate=point.request_rate or 0.0, arrivals=point.arrivals, seed=point.seed,
        max_concurrency=point.concurrency or point.max_concurrency, slo=goal,
    )  # fmt: skip
    return measurement_of(level, point)


def measurement_of(level: RateLevel, point: LoadPoint | None = None) -> Measurement:
    """A level's figures as the gate compares them (no tok/s when no request finished)."""
    return Measurement(
        tok_s=level.output_throughput if level.completed else None,
        ttft_p95_ms=level.p95_ttft_ms, tpot_p95_ms=level.p95_tpot_ms, errors=level.failed,
        requests=level.requests, goodput_req_s=level.request_goodput,
        goodput_tok_s=level.output_goodput, point=point,
    )  # fmt: skip


def point_of(level: RateLevel, output_tokens: int) -> LoadPoint:
    """The load point an open-loop level was measured at."""
    return LoadPoint(
        request_rate=level.request_rate, requests=level.requests, output_tokens=output_tokens,
        arrivals=level.arrivals, seed=level.seed, max_concurrency=level.max_concurrency,
    )  # fmt: skip
