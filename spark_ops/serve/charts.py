"""Inline SVG pictures: the budget gauge, the window's stamps on a time line, and a chart of
values over time (the engine's load). No script, no external URL; every text through `esc`."""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Sequence
from typing import Any

from spark_ops.serve.html import esc, when

SVG = 'xmlns="http://www.w3.org/2000/svg" font-size="11"'
LINE_W, LINE_H, PAD = 640, 70, 30
SERIES_W, SERIES_H = 640, 180
SERIES_COLORS = ("#0969da", "#9a6700", "#1a7f37")
MAX_TOP = 1e15  # no axis goes beyond: a larger value is drawn at the top
MAX_STAMPS = 500  # stamps drawn on the window's line (the newest; the rest counted in words)


def nice_ticks(top: float, count: int = 4) -> list[float]:
    """Round tick values from 0 to at least `top` (1, 2 or 5 times a power of ten apart); a top
    beyond MAX_TOP is drawn to MAX_TOP (the chart is clamped, its values shown as text)."""
    if not math.isfinite(top) or top <= 0:
        return [0.0, 1.0]
    top = min(top, MAX_TOP)
    raw = top / count
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)
    n = math.ceil(top / step - 1e-9)
    return [round(i * step, 10) for i in range(n + 1)]


def clamp(value: float, top: float) -> float:
    """A value drawn on a chart whose axis ends at `top`: from 0 to top (never off the chart)."""
    return min(max(value, 0.0), top) if math.isfinite(value) else top


def tick_text(value: float) -> str:
    """A tick's label: an int when it is one, else one or two decimals (a value that is not
    finite is `?`, a huge one in exponent form)."""
    if not math.isfinite(value):
        return "?"
    if abs(value) >= 1e12:
        return f"{value:.3g}"
    if value == int(value):
        return str(int(value))
    return f"{value:.2f}".rstrip("0")


def budget_gauge(used: int, allowed: int) -> str:
    """One box per restart the window allows, the used ones filled (red when all are)."""
    slots = max(allowed, used, 1)
    if slots > 50:  # a window this wide is a number, not boxes
        return ""
    size, gap = 22, 4
    fill = "#cf222e" if used >= allowed else "#9a6700"
    boxes = "".join(
        f'<rect x="{i * (size + gap)}" y="0" width="{size}" height="{size}" rx="3" '
        f'fill="{fill if i < used else "#eef0f3"}" stroke="#999"><title>slot {i + 1}: '
        f"{'used' if i < used else 'free'}</title></rect>"
        for i in range(slots)
    )
    width = slots * (size + gap)
    return (
        f'<svg id=gauge role="img" aria-label="{used} of {allowed} restarts used" '
        f'viewBox="0 0 {width} {size}" width="{width}" height="{size}" {SVG}>{boxes}</svg>'
    )


def stamp_timeline(
    stamps: Sequence[dict[str, Any]], *, now: float, window_s: float, next_free: float | None
) -> str:
    """The window (now - window_s .. now) as a line, each stamp a mark with when, who and why on
    hover, and the next free slot marked when it is later than now."""
    if not (math.isfinite(now) and math.isfinite(window_s) and window_s > 0):
        return ""
    start = now - window_s

    def sx(t: float) -> float:
        """A time to pixels."""
        return PAD + (LINE_W - 2 * PAD) * min(1.0, max(0.0, (t - start) / window_s))

    y = LINE_H - 30
    out = [
        f'<svg id=timeline role="img" viewBox="0 0 {LINE_W} {LINE_H}" width="{LINE_W}" '
        f'height="{LINE_H}" {SVG}>',
        f'<line x1="{PAD}" y1="{y}" x2="{LINE_W - PAD}" y2="{y}" stroke="#999"/>',
    ]
    hours = window_s / 3600
    step = 3600 * max(1, math.ceil(hours / 8))
    t = math.ceil(start / step) * step
    while t <= now:
        label = dt.datetime.fromtimestamp(t, dt.UTC).strftime("%H:%M")
        out.append(
            f'<line x1="{sx(t):.1f}" y1="{y - 3}" x2="{sx(t):.1f}" y2="{y + 3}" stroke="#999"/>'
            f'<text x="{sx(t):.1f}" y="{y + 16}" text-anchor="middle" fill="#555">{label}</text>'
        )
        t += step
    out.append(f'<text x="{LINE_W - PAD}" y="{y + 28}" text-anchor="end" fill="#555">now</text>')
    shown = [s for s in stamps if isinstance(s.get("stamp"), int | float)
             and math.isfinite(s["stamp"])]  # fmt: skip
    more = max(0, len(shown) - MAX_STAMPS)
    if more:
        out.append(
            f'<text class=more x="{PAD}" y="12" fill="#555">the newest {MAX_STAMPS} stamps drawn, '
            f"{more} more not drawn</text>"
        )
    for s in sorted(shown, key=lambda s: float(s["stamp"]))[-MAX_STAMPS:]:
        at = s["stamp"]
        why = s.get("reason") or "(no journal entry)"
        out.append(
            f'<circle class=stamp cx="{sx(float(at)):.1f}" cy="{y}" r="6" fill="#9a6700">'
            f"<title>{when(at)} · {esc(s.get('by'))} · {esc(why)}</title></circle>"
        )
    if next_free is not None and math.isfinite(next_free) and next_free > now:
        out.append(
            f'<text x="{LINE_W - PAD}" y="12" text-anchor="end" fill="#cf222e">next free slot '
            f"{when(next_free)}</text>"
        )
    out.append("</svg>")
    return "".join(out)


def time_series(
    series: Sequence[tuple[str, Sequence[tuple[float, float | None]]]],
    *,
    now: float,
    span_s: float,
    ident: str,
) -> str:
    """Lines of (time, value) over the last `span_s` seconds, a gap where a value is None, with
    y-axis ticks and one label per series; nothing to draw is said so."""
    values = [v for _, pts in series for _, v in pts if v is not None and math.isfinite(v)]
    if not values:
        return "<p class=muted>no sample yet</p>"
    ticks = nice_ticks(max(values) or 1.0)
    top = ticks[-1] or 1.0
    start = now - span_s

    def sx(t: float) -> float:
        """A time to pixels."""
        return PAD + 10 + (SERIES_W - 2 * PAD - 10) * min(1.0, max(0.0, (t - start) / span_s))

    def sy(v: float) -> float:
        """A value to pixels."""
        return SERIES_H - PAD - (SERIES_H - 2 * PAD) * clamp(v, top) / top

    out = [
        f'<svg id="{esc(ident)}" role="img" viewBox="0 0 {SERIES_W} {SERIES_H}" '
        f'width="{SERIES_W}" height="{SERIES_H}" {SVG}>',
        f'<line x1="{PAD + 10}" y1="{SERIES_H - PAD}" x2="{SERIES_W - PAD}" '
        f'y2="{SERIES_H - PAD}" stroke="#999"/>',
    ]
    for v in ticks:
        out.append(
            f'<line x1="{PAD + 10}" y1="{sy(v):.1f}" x2="{SERIES_W - PAD}" y2="{sy(v):.1f}" '
            f'stroke="#eef0f3"/><text class=ytick x="{PAD + 6}" y="{sy(v) + 4:.1f}" '
            f'text-anchor="end" fill="#555">{tick_text(v)}</text>'
        )
    minutes = span_s / 60
    for m in (minutes, minutes * 2 / 3, minutes / 3, 0.0):
        out.append(
            f'<text x="{sx(now - m * 60):.1f}" y="{SERIES_H - PAD + 14}" text-anchor="middle" '
            f'fill="#555">{"now" if m == 0 else f"-{m:.0f} min"}</text>'
        )
    for i, (label, pts) in enumerate(series):
        color = SERIES_COLORS[i % len(SERIES_COLORS)]
        runs: list[list[str]] = [[]]
        for t, value in pts:
            if value is None or not math.isfinite(value) or t < start:
                runs.append([])
                continue
            runs[-1].append(f"{sx(t):.1f},{sy(value):.1f}")
        for run in runs:
            if len(run) == 1:
                x, yy = run[0].split(",")
                out.append(f'<circle cx="{x}" cy="{yy}" r="2" fill="{color}"/>')
            elif run:
                out.append(
                    f'<polyline fill="none" stroke="{color}" points="{" ".join(run)}">'
                    f"<title>{esc(label)}</title></polyline>"
                )
        out.append(
            f'<text x="{PAD + 16 + 150 * i}" y="{PAD - 12}" fill="{color}">{esc(label)}</text>'
        )
    out.append("</svg>")
    return "".join(out)
