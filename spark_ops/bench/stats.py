"""Statistics of a sweep: per-run figures from request timelines, per-level summaries, the reading.

Everything here is pure (no I/O, no clock) so it can be checked on synthetic timelines.
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import TYPE_CHECKING, Any

from spark_ops.bench.measures import (
    DEFAULT_GAP_TOLERANCE_S,
    DEFAULT_KNEE_GAIN,
    DEFAULT_STEADY_FRACTION,
    CapReading,
    detect_cap,
    distribution,
    gains,
    knee,
    percentile,
    slo_max_concurrency,
    steady_threshold,
    steady_window,
    tail_fraction,
    tokens_in_window,
)

if TYPE_CHECKING:
    from spark_ops.bench.client import RequestRecord

__all__ = [
    "DEFAULT_GAP_TOLERANCE_S",
    "DEFAULT_KNEE_GAIN",
    "DEFAULT_STEADY_FRACTION",
    "CapReading",
    "LevelResult",
    "Reading",
    "RunStats",
    "detect_cap",
    "distribution",
    "gains",
    "knee",
    "percentile",
    "read_levels",
    "slo_max_concurrency",
    "steady_threshold",
    "steady_window",
    "summarize_level",
    "summarize_run",
    "tail_fraction",
    "tokens_in_window",
]

MAX_LEVEL = 100_000  # the highest concurrency a sweep level or a cap may name (a saved file too)
MAX_LEVELS = 1_000  # the most levels one sweep may hold


@dataclass
class RunStats:
    """Figures of one run at one level; the lists are kept in memory only (not serialized)."""

    concurrency: int
    wall_s: float
    completed: int
    failed: int
    output_tokens: int
    input_tokens: int | None
    aggregate_tok_s: float
    per_user_tok_s: float | None
    steady_window_s: float | None
    steady_tok_s: float | None
    engine_tok_s: float | None
    usage_reported: bool
    errors: dict[str, int] = field(default_factory=dict)
    client_cpu_s: float = 0.0
    preemptions: int | None = None
    samples: list[tuple[float, float, float]] = field(default_factory=list)
    ttft_s: list[float] = field(default_factory=list, repr=False)
    itl_s: list[float] = field(default_factory=list, repr=False)
    tpot_s: list[float] = field(default_factory=list, repr=False)
    e2e_s: list[float] = field(default_factory=list, repr=False)

    def to_dict(self) -> dict[str, Any]:
        """Serialize the scalar figures (not the per-request lists)."""
        skip = {"ttft_s", "itl_s", "tpot_s", "e2e_s", "samples"}
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name not in skip}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunStats:
        """Rebuild from to_dict() output (lists empty)."""
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


def summarize_run(
    records: Sequence[RequestRecord],
    *,
    concurrency: int,
    wall_s: float,
    steady_fraction: float = DEFAULT_STEADY_FRACTION,
    engine_generated: float | None = None,
    client_cpu_s: float = 0.0,
    samples: Sequence[tuple[float, float, float]] = (),
    preemptions: int | None = None,
) -> RunStats:
    """Figures of one run from its request records and the run's wall clock."""
    ok = [r for r in records if r.ok]
    errors: dict[str, int] = {}
    for r in records:
        if r.error is not None:
            errors[r.error] = errors.get(r.error, 0) + 1
    out_tokens = sum(r.output_tokens for r in ok)
    prompt = [r.prompt_tokens for r in ok if r.prompt_tokens is not None]
    per_user = [r.output_tokens / (r.end - r.start) for r in ok if r.end > r.start]
    ttft = [r.chunk_times[0] - r.start for r in ok if r.chunk_times]
    itl: list[float] = []
    tpot: list[float] = []
    for r in ok:
        ts = r.chunk_times
        itl.extend(b - a for a, b in itertools.pairwise(ts))
        if ts and r.output_tokens > 1:
            tpot.append((r.end - ts[0]) / (r.output_tokens - 1))
    # Only requests that streamed count as in flight: one refused at once never generated.
    window = steady_window(
        ((r.start, r.end) for r in ok), steady_threshold(concurrency, steady_fraction)
    )
    steady_s = steady_tok = None
    if window is not None and window[1] > window[0]:
        steady_s = window[1] - window[0]
        steady_tok = tokens_in_window(((r.chunk_times, r.output_tokens) for r in ok), window) / (
            steady_s
        )
    return RunStats(
        concurrency=concurrency,
        wall_s=wall_s,
        completed=len(ok),
        failed=len(records) - len(ok),
        output_tokens=out_tokens,
        input_tokens=sum(prompt) if prompt else None,
        aggregate_tok_s=out_tokens / wall_s if wall_s > 0 else 0.0,
        per_user_tok_s=statistics.fmean(per_user) if per_user else None,
        steady_window_s=steady_s,
        steady_tok_s=steady_tok,
        engine_tok_s=engine_generated / wall_s
        if engine_generated is not None and wall_s > 0
        else None,
        usage_reported=all(r.usage_reported for r in ok),  # vacuously true if none completed
        errors=errors,
        client_cpu_s=client_cpu_s,
        preemptions=preemptions,
        samples=list(samples),
        ttft_s=ttft,
        itl_s=itl,
        tpot_s=tpot,
        e2e_s=[r.end - r.start for r in ok],
    )


def _mean(values: Iterable[float | None]) -> float | None:
    """Mean of the non-None values, or None."""
    xs = [v for v in values if v is not None]
    return statistics.fmean(xs) if xs else None


@dataclass
class LevelResult:
    """One concurrency level over its repeats; names follow `vllm bench serve` where they agree.

    Counts (completed, failed, total_*_tokens, errors) are summed over the repeats; duration and the
    throughputs are means over the repeats (with min/max/stdev); latency percentiles pool every
    request of every repeat. per_user_tok_s is output tokens / end-to-end latency, averaged.
    samples holds [seconds since its run started, running, waiting] from every repeat.
    """

    max_concurrency: int
    repeats: int
    duration: float
    completed: int
    failed: int
    total_input_tokens: int | None
    total_output_tokens: int
    output_throughput: float
    output_throughput_min: float
    output_throughput_max: float
    output_throughput_stdev: float
    request_throughput: float
    per_user_tok_s: float | None
    per_user_tok_s_min: float | None
    per_user_tok_s_max: float | None
    steady_output_throughput: float | None
    steady_window_s: float | None
    engine_output_throughput: float | None
    tail_pct: float | None
    mean_ttft_ms: float | None
    median_ttft_ms: float | None
    p90_ttft_ms: float | None
    p99_ttft_ms: float | None
    std_ttft_ms: float | None
    mean_tpot_ms: float | None
    median_tpot_ms: float | None
    p90_tpot_ms: float | None
    p99_tpot_ms: float | None
    mean_itl_ms: float | None
    median_itl_ms: float | None
    p90_itl_ms: float | None
    p99_itl_ms: float | None
    mean_e2el_ms: float | None
    median_e2el_ms: float | None
    p90_e2el_ms: float | None
    p99_e2el_ms: float | None
    usage_reported: bool
    client_cpu_s: float
    max_running: float | None
    max_waiting: float | None
    preemptions: int | None = None
    errors: dict[str, int] = field(default_factory=dict)
    samples: list[list[float]] = field(default_factory=list)
    runs: list[RunStats] = field(default_factory=list)

    def scalars(self) -> dict[str, Any]:
        """The flat scalar figures (for CSV and comparisons)."""
        skip = {"errors", "samples", "runs"}
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name not in skip}

    def to_dict(self) -> dict[str, Any]:
        """Serialize, runs included."""
        data = self.scalars()
        data["errors"] = dict(self.errors)
        data["samples"] = [list(s) for s in self.samples]
        data["runs"] = [r.to_dict() for r in self.runs]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LevelResult:
        """Rebuild from to_dict() output; unknown keys are ignored."""
        names = {f.name for f in fields(cls)}
        kw = {k: v for k, v in data.items() if k in names}
        c = kw.get("max_concurrency")
        if isinstance(c, bool) or not isinstance(c, int) or not 1 <= c <= MAX_LEVEL:
            raise ValueError(f"max_concurrency must be an integer 1..{MAX_LEVEL}, got {c!r:.40}")
        kw["runs"] = [RunStats.from_dict(r) for r in data.get("runs", [])]
        return cls(**kw)


@dataclass(frozen=True)
class SpeedCheck:
    """One level run once more at the end of a sweep: whether the engine's speed held meanwhile.

    A prediction from a sweep holds for another engine only as far as the machine runs the same
    thing at the same speed twice; a speed that changed within the sweep says it does not.
    """

    concurrency: int
    swept_tok_s: float  # the level's aggregate in the sweep
    again_tok_s: float  # the same level, run again after the last one

    @property
    def drift(self) -> float:
        """again / swept - 1 (0.0 when the sweep measured nothing there)."""
        return self.again_tok_s / self.swept_tok_s - 1 if self.swept_tok_s > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        """Serialize, with the drift."""
        return {**asdict(self), "drift": self.drift}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SpeedCheck:
        """Rebuild from to_dict() output."""
        return cls(int(data["concurrency"]), float(data["swept_tok_s"]), float(data["again_tok_s"]))


def summarize_level(runs: Sequence[RunStats]) -> LevelResult:
    """Combine the repeats of one level: means with min/max/stdev, latency percentiles pooled."""
    if not runs:
        raise ValueError("summarize_level needs at least one run")
    c = runs[0].concurrency
    aggs = [r.aggregate_tok_s for r in runs]
    users = [r.per_user_tok_s for r in runs if r.per_user_tok_s is not None]
    ttft = distribution([x for r in runs for x in r.ttft_s], 1000.0)
    tpot = distribution([x for r in runs for x in r.tpot_s], 1000.0)
    itl = distribution([x for r in runs for x in r.itl_s], 1000.0)
    e2e = distribution([x for r in runs for x in r.e2e_s], 1000.0)
    errors: dict[str, int] = {}
    for r in runs:
        for msg, n in r.errors.items():
            errors[msg] = errors.get(msg, 0) + n
    output = statistics.fmean(aggs)
    per_user = statistics.fmean(users) if users else None
    duration = statistics.fmean(r.wall_s for r in runs)
    inputs = [r.input_tokens for r in runs if r.input_tokens is not None]
    preempted = [r.preemptions for r in runs if r.preemptions is not None]
    running = [s[1] for r in runs for s in r.samples]
    waiting = [s[2] for r in runs for s in r.samples]
    return LevelResult(
        max_concurrency=c,
        repeats=len(runs),
        duration=duration,
        completed=sum(r.completed for r in runs),
        failed=sum(r.failed for r in runs),
        total_input_tokens=sum(inputs) if inputs else None,
        total_output_tokens=sum(r.output_tokens for r in runs),
        output_throughput=output,
        output_throughput_min=min(aggs),
        output_throughput_max=max(aggs),
        output_throughput_stdev=statistics.stdev(aggs) if len(aggs) > 1 else 0.0,
        request_throughput=statistics.fmean(
            r.completed / r.wall_s if r.wall_s > 0 else 0.0 for r in runs
        ),
        per_user_tok_s=per_user,
        per_user_tok_s_min=min(users) if users else None,
        per_user_tok_s_max=max(users) if users else None,
        steady_output_throughput=_mean(r.steady_tok_s for r in runs),
        steady_window_s=_mean(r.steady_window_s for r in runs),
        engine_output_throughput=_mean(r.engine_tok_s for r in runs),
        tail_pct=None
        if per_user is None or (t := tail_fraction(per_user, c, output)) is None
        else 100.0 * t,
        mean_ttft_ms=ttft["mean"],
        median_ttft_ms=ttft["median"],
        p90_ttft_ms=ttft["p90"],
        p99_ttft_ms=ttft["p99"],
        std_ttft_ms=ttft["std"],
        mean_tpot_ms=tpot["mean"],
        median_tpot_ms=tpot["median"],
        p90_tpot_ms=tpot["p90"],
        p99_tpot_ms=tpot["p99"],
        mean_itl_ms=itl["mean"],
        median_itl_ms=itl["median"],
        p90_itl_ms=itl["p90"],
        p99_itl_ms=itl["p99"],
        mean_e2el_ms=e2e["mean"],
        median_e2el_ms=e2e["median"],
        p90_e2el_ms=e2e["p90"],
        p99_e2el_ms=e2e["p99"],
        usage_reported=all(r.usage_reported for r in runs),
        client_cpu_s=sum(r.client_cpu_s for r in runs),
        max_running=max(running) if running else None,
        max_waiting=max(waiting) if waiting else None,
        preemptions=sum(preempted) if preempted else None,
        errors=errors,
        samples=[[round(s[0], 3), s[1], s[2]] for r in runs for s in r.samples],
        runs=list(runs),
    )


@dataclass
class Reading:
    """What the sweep says: the knee, the SLO concurrency, whether a cap bound the engine."""

    knee: int | None
    knee_gain: float
    gains_pct: list[float | None]
    slo_tok_s: float | None
    slo_max_concurrency: int | None
    cap: CapReading

    @property
    def slo_text(self) -> str | None:
        """The SLO answer as the note words it: '≤16', or 'none' when no level keeps it."""
        if self.slo_tok_s is None:
            return None
        return f"≤{self.slo_max_concurrency}" if self.slo_max_concurrency is not None else "none"

    def to_dict(self) -> dict[str, Any]:
        """Serialize, with the SLO text."""
        return {
            "knee": self.knee,
            "knee_gain": self.knee_gain,
            "gains_pct": self.gains_pct,
            "slo_tok_s": self.slo_tok_s,
            "slo_max_concurrency": self.slo_max_concurrency,
            "slo_text": self.slo_text,
            "cap": self.cap.to_dict(),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Reading:
        """Rebuild from to_dict() output."""
        cap = dict(data.get("cap") or {"detected": False})
        cap.pop("matches_knob", None)
        return cls(
            knee=data.get("knee"),
            knee_gain=data.get("knee_gain", DEFAULT_KNEE_GAIN),
            gains_pct=list(data.get("gains_pct", [])),
            slo_tok_s=data.get("slo_tok_s"),
            slo_max_concurrency=data.get("slo_max_concurrency"),
            cap=CapReading(**cap),
        )


def read_levels(
    levels: Sequence[LevelResult],
    *,
    slo_tok_s: float | None = None,
    knee_gain: float = DEFAULT_KNEE_GAIN,
    max_num_seqs: int | None = None,
) -> Reading:
    """The reading of a sweep from its level summaries (and the knob in effect, when known)."""
    agg = [(lv.max_concurrency, lv.output_throughput) for lv in levels]
    users = [(lv.max_concurrency, lv.per_user_tok_s or 0.0) for lv in levels]
    samples = [(s[1], s[2]) for lv in levels for s in lv.samples]
    return Reading(
        knee=knee(agg, knee_gain),
        knee_gain=knee_gain,
        gains_pct=[None if g is None else 100.0 * g for g in gains(agg)],
        slo_tok_s=slo_tok_s,
        slo_max_concurrency=slo_max_concurrency(users, slo_tok_s) if slo_tok_s else None,
        cap=detect_cap(samples, knob=max_num_seqs),
    )
