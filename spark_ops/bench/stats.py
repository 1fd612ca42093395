"""Statistics of a sweep: per-run figures from request timelines, per-level summaries, the reading.

Everything here is pure (no I/O, no clock) so it can be checked on synthetic timelines.
"""

from __future__ import annotations

import itertools
import math
import statistics
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from spark_ops.bench.client import RequestRecord

DEFAULT_STEADY_FRACTION = 0.9
DEFAULT_KNEE_GAIN = 0.15
DEFAULT_GAP_TOLERANCE_S = 0.05


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0..100) with linear interpolation between ranks; None when empty."""
    if not values:
        return None
    if not 0 <= q <= 100:
        raise ValueError(f"percentile q={q} is outside 0..100")
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def distribution(values: Sequence[float], scale: float = 1.0) -> dict[str, float | None]:
    """mean, median, p90, p99 and std of values times scale (None entries when empty)."""
    if not values:
        return {"mean": None, "median": None, "p90": None, "p99": None, "std": None}
    xs = [v * scale for v in values]
    return {
        "mean": statistics.fmean(xs),
        "median": percentile(xs, 50),
        "p90": percentile(xs, 90),
        "p99": percentile(xs, 99),
        "std": statistics.pstdev(xs) if len(xs) > 1 else 0.0,
    }


def steady_threshold(concurrency: int, fraction: float) -> int:
    """In-flight requests needed to count as steady: ceil(fraction x C), at least 1."""
    if not 0 < fraction <= 1:
        raise ValueError(f"steady fraction {fraction} is outside (0, 1]")
    return max(1, math.ceil(fraction * concurrency - 1e-9))


def steady_window(
    intervals: Iterable[tuple[float, float]],
    threshold: int,
    *,
    gap_tolerance_s: float = DEFAULT_GAP_TOLERANCE_S,
) -> tuple[float, float] | None:
    """Longest interval in which at least threshold of the (start, end) intervals are in flight.

    Dips below the threshold shorter than gap_tolerance_s (a finished request replaced by the next
    one) do not split the window. Returns None when the threshold is never reached.
    """
    events: list[tuple[float, int]] = []
    for start, end in intervals:
        if end > start:
            events.append((start, 1))
            events.append((end, -1))
    events.sort()
    segments: list[tuple[float, float]] = []
    level = 0
    seg_start: float | None = None
    i = 0
    while i < len(events):
        t = events[i][0]
        while i < len(events) and events[i][0] == t:
            level += events[i][1]
            i += 1
        if level >= threshold and seg_start is None:
            seg_start = t
        elif level < threshold and seg_start is not None:
            segments.append((seg_start, t))
            seg_start = None
    if not segments:
        return None
    merged = [segments[0]]
    for a, b in segments[1:]:
        if a - merged[-1][1] < gap_tolerance_s:
            merged[-1] = (merged[-1][0], b)
        else:
            merged.append((a, b))
    return max(merged, key=lambda s: (s[1] - s[0], -s[0]))


def tokens_in_window(
    streams: Iterable[tuple[Sequence[float], int]], window: tuple[float, float]
) -> float:
    """Tokens that arrived in [a, b]; each stream is (sorted chunk times, tokens it carried)."""
    a, b = window
    total = 0.0
    for times, tokens in streams:
        if not times:
            continue
        inside = bisect_right(times, b) - bisect_left(times, a)
        total += inside * (tokens / len(times))
    return total


def tail_fraction(per_user_tok_s: float, concurrency: int, aggregate_tok_s: float) -> float | None:
    """How far per-user rate x C overstates the wall-clock aggregate: (u x C - agg) / agg."""
    if aggregate_tok_s <= 0:
        return None
    return (per_user_tok_s * concurrency - aggregate_tok_s) / aggregate_tok_s


def knee(points: Sequence[tuple[int, float]], min_gain: float = DEFAULT_KNEE_GAIN) -> int | None:
    """First level whose aggregate gains under min_gain over the previous level; else None."""
    ordered = sorted(points)
    for (_, prev), (level, agg) in itertools.pairwise(ordered):
        if prev > 0 and agg / prev - 1 < min_gain:
            return level
    return None


def gains(points: Sequence[tuple[int, float]]) -> list[float | None]:
    """Relative aggregate gain of each level over the previous one (None for the first)."""
    ordered = sorted(points)
    out: list[float | None] = [None]
    for (_, prev), (_, agg) in itertools.pairwise(ordered):
        out.append(agg / prev - 1 if prev > 0 else None)
    return out


def slo_max_concurrency(points: Sequence[tuple[int, float]], slo_tok_s: float) -> int | None:
    """Highest level such that it and every lower level keep per-user tok/s >= slo; None if none."""
    best: int | None = None
    for level, per_user in sorted(points):
        if per_user < slo_tok_s:
            break
        best = level
    return best


@dataclass
class CapReading:
    """Whether the engine's running count plateaued while requests waited (a max-num-seqs cap)."""

    detected: bool
    plateau: int | None = None
    waiting_samples: int = 0
    at_plateau: int = 0
    knob: int | None = None

    @property
    def matches_knob(self) -> bool | None:
        """True when the plateau equals the max_num_seqs knob (None when either is unknown)."""
        if self.knob is None or self.plateau is None:
            return None
        return self.plateau == self.knob

    def to_dict(self) -> dict[str, Any]:
        """Serialize, with matches_knob."""
        return {**asdict(self), "matches_knob": self.matches_knob}


def detect_cap(
    samples: Iterable[tuple[float, float]],
    *,
    min_samples: int = 3,
    min_share: float = 0.6,
    knob: int | None = None,
) -> CapReading:
    """Look at (running, waiting) samples: a cap when running sits at its maximum while waiting > 0.

    Detected when at least min_samples samples have waiting > 0 and at least min_share of them show
    running within 5% (at least 1) of the highest running value seen while requests waited.
    """
    waiting = [(r, w) for r, w in samples if w > 0]
    if len(waiting) < min_samples:
        return CapReading(False, None, len(waiting), 0, knob)
    plateau = max(r for r, _ in waiting)
    tol = max(1.0, 0.05 * plateau)
    at = sum(1 for r, _ in waiting if r >= plateau - tol)
    detected = plateau > 0 and at / len(waiting) >= min_share
    return CapReading(detected, round(plateau) if detected else None, len(waiting), at, knob)


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
        kw["runs"] = [RunStats.from_dict(r) for r in data.get("runs", [])]
        return cls(**kw)


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
