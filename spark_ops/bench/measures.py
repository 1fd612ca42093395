"""Pure measures of a sweep: percentiles, the steady window, the knee, the SLO level, a cap.

Everything here is pure (no I/O, no clock) so it can be checked on synthetic timelines.
"""

from __future__ import annotations

import itertools
import math
import statistics
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

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
