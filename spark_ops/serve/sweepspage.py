"""The sweeps page: saved sweeps (`bench -o`), their tables and charts, bench's what-if."""

from __future__ import annotations

import math
from typing import Any

from spark_ops.serve.charts import clamp, nice_ticks, tick_text
from spark_ops.serve.html import esc, page, section, table

CHART_W, CHART_H, PAD = 640, 260, 40
COLORS = ("#0969da", "#bf3989", "#1a7f37", "#9a6700", "#8250df")


def svg_chart(series: list[dict[str, Any]], *, y_label: str) -> str:
    """An inline SVG line chart of (concurrency, value) series; dashed series are predictions,
    their untrusted points hollow and marked "?"."""
    points = [p for s in series for p in s["points"] if p[1] is not None]
    if not points:
        return "<p class=muted>nothing to draw</p>"
    xs = sorted({p[0] for p in points})
    ticks = nice_ticks(max(p[1] for p in points))
    y_max = ticks[-1] or 1.0
    x_max = max(xs) or 1

    def sx(x: float) -> float:
        """x (concurrency, log2 scale) to pixels."""
        return PAD + (CHART_W - 2 * PAD) * (math.log2(x) / math.log2(x_max) if x_max > 1 else 0)

    def sy(y: float) -> float:
        """y to pixels."""
        return CHART_H - PAD - (CHART_H - 2 * PAD) * clamp(y, y_max) / y_max

    out = [
        f'<svg role="img" viewBox="0 0 {CHART_W} {CHART_H}" width="{CHART_W}" height="{CHART_H}"'
        ' xmlns="http://www.w3.org/2000/svg" font-size="11">',
        f'<line x1="{PAD}" y1="{CHART_H - PAD}" x2="{CHART_W - PAD}" y2="{CHART_H - PAD}" '
        'stroke="#999"/>',
        f'<line x1="{PAD}" y1="{PAD}" x2="{PAD}" y2="{CHART_H - PAD}" stroke="#999"/>',
        f'<text x="{CHART_W / 2}" y="{CHART_H - 8}" text-anchor="middle">concurrency</text>',
        f'<text x="4" y="{PAD - 12}">{esc(y_label)} (max '
        f"{esc(round(max(p[1] for p in points), 1))})</text>",
    ]
    out += [
        f'<line x1="{PAD}" y1="{sy(v):.1f}" x2="{CHART_W - PAD}" y2="{sy(v):.1f}" '
        f'stroke="#eef0f3"/><text class=ytick x="{PAD - 4}" y="{sy(v) + 4:.1f}" '
        f'text-anchor="end">{tick_text(v)}</text>'
        for v in ticks
    ]
    out += [
        f'<text x="{sx(x):.1f}" y="{CHART_H - PAD + 14}" text-anchor="middle">{esc(x)}</text>'
        for x in xs
        if x > 0
    ]
    for i, s in enumerate(series):
        color = COLORS[i % len(COLORS)]
        pts = [(x, y, trusted) for x, y, trusted in s["points"] if y is not None and x > 0]
        dash = ' stroke-dasharray="5 4"' if s["predicted"] else ""
        path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y, _ in pts)
        out.append(f'<polyline fill="none" stroke="{color}" points="{path}"{dash}>'
                   f"<title>{esc(s['label'])}</title></polyline>")  # fmt: skip
        for x, y, trusted in pts:
            fill = color if trusted else "#fff"
            out.append(
                f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="3.5" fill="{fill}" '
                f'stroke="{color}"><title>{esc(s["label"])}: {esc(x)} → {esc(round(y, 1))}'
                f"{'' if trusted else ' (not to be trusted)'}</title></circle>"
            )
            if not trusted:
                out.append(f'<text x="{sx(x) + 5:.1f}" y="{sy(y) - 5:.1f}" fill="#cf222e">?</text>')
        ly = PAD + 14 * i
        out.append(f'<text x="{CHART_W - PAD - 200}" y="{ly}" fill="{color}">{esc(s["label"])}'
                   "</text>")  # fmt: skip
    out.append("</svg>")
    return "".join(out)


def _series(runs: list[dict[str, Any]], key: str, whatif_key: str) -> list[dict[str, Any]]:
    """Measured series of each run and the predicted series of its what-if caps."""
    series = []
    for run in runs:
        result = run.get("result")
        if not result:
            continue
        levels = result.get("levels") or []
        pts = [
            (c, _num(lv.get(key)), True)
            for lv in levels
            if isinstance(lv, dict) and (c := _count(lv.get("max_concurrency"))) is not None
        ]
        series.append({"label": f"{run['file']} (measured)", "points": pts, "predicted": False})
        for cap in (run.get("whatif") or {}).get("caps") or []:
            pred = [
                (c, _num(p.get(whatif_key)), bool(p.get("trusted", True)))
                for p in cap["points"]
                if p.get("source") == "predicted"
                and (c := _count(p.get("concurrency"))) is not None
            ]
            if pred:
                label = f"{run['file']} what-if cap {cap['cap']} (predicted)"
                series.append({"label": label, "points": pred, "predicted": True})
    return series


def _count(value: object) -> int | None:
    """A concurrency level (a positive int) or None."""
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    return None


def _num(value: object) -> float | None:
    """A finite number or None."""
    if isinstance(value, int | float) and math.isfinite(value):
        return float(value)
    return None


def sweeps_page(sweeps: dict[str, Any], base: str = "") -> str:
    """Saved sweeps: a table per run and charts of tok/s and per-user tok/s vs concurrency."""
    if sweeps.get("dir") is None:
        body = section(
            "Sweeps",
            "<p>no results directory: start the server with <code>--results DIR</code> "
            "(the JSON files <code>spark-ops bench -o DIR/NAME.json</code> writes)</p>",
        )
        return page("Sweeps", "/sweeps", body, base=base)
    runs = sweeps.get("runs") or []
    parts = []
    if sweeps.get("error"):
        parts.append(f'<p class="bad">{esc(sweeps["error"])}</p>')
    if runs:
        parts.append(
            section(
                "Aggregate tok/s",
                svg_chart(_series(runs, "output_throughput", "aggregate_tok_s"), y_label="tok/s"),
                ident="chart-aggregate",
            )
        )
        parts.append(
            section(
                "Per-user tok/s",
                svg_chart(
                    _series(runs, "per_user_tok_s", "per_user_tok_s"), y_label="tok/s per user"
                ),
                ident="chart-per-user",
            )
        )
        parts.append(
            "<p class=muted>solid: measured; dashed: what-if predictions (bench's own model), "
            "hollow points marked ? are the ones it says not to trust</p>"
        )
    if len([r for r in runs if "result" in r]) > 1:
        parts.append(section("Compared", compare(runs), ident="compare"))
    for run in runs:
        if "error" in run:
            parts.append(section(run["file"], f'<p class="bad">{esc(run["error"])}</p>'))
            continue
        if "openloop" in run:
            parts.append(section(run["file"], open_loop(run["openloop"])))
            continue
        r = run["result"]
        rows = [
            [esc(lv.get("max_concurrency")), esc(_round(lv.get("output_throughput"))),
             esc(_round(lv.get("per_user_tok_s"))), esc(_round(lv.get("p99_ttft_ms"))),
             esc(lv.get("completed")), esc(lv.get("failed"))]
            for lv in r.get("levels") or []
        ]  # fmt: skip
        knobs = ", ".join(f"{k}={v}" for k, v in (r.get("knobs") or {}).items())
        info = f"<p>{esc(r.get('model'))} · {esc(r.get('started_at'))} · knobs {esc(knobs)}</p>"
        table_html = table(
            ["concurrency", "tok/s", "per user tok/s", "TTFT p99 ms", "done", "failed"], rows
        )
        warn = "".join(
            f'<p class="warn">{esc(w)}</p>' for w in (run.get("whatif") or {}).get("warnings") or []
        )
        caps = [c.get("cap") for c in (run.get("whatif") or {}).get("caps") or []]
        if caps:
            warn += (
                f"<p class=muted>what-if asked: max_num_seqs "
                f"{esc(', '.join(str(c) for c in caps))} (half the cap swept), predicted by "
                "bench's own model (<code>spark-ops bench --what-if</code>)</p>"
            )
        if run.get("whatif_error"):
            warn += f'<p class="muted">what-if: {esc(run["whatif_error"])}</p>'
        parts.append(section(run["file"], info + table_html + warn))
    if not runs:
        parts.append(section("Sweeps", f"<p>no result in {esc(sweeps['dir'])}</p>"))
    return page("Sweeps", "/sweeps", "".join(parts), base=base)


def open_loop(r: dict[str, Any]) -> str:
    """An open-loop sweep (`bench --request-rate`): per offered rate, what came back and goodput."""
    knobs = r.get("knobs")
    said = ", ".join(f"{k}={v}" for k, v in knobs.items()) if isinstance(knobs, dict) else ""
    info = (
        f"<p>{esc(r.get('model'))} · {esc(r.get('started_at'))} · knobs {esc(said)} · open loop, "
        f"{esc(r.get('arrivals'))} arrivals</p>"
    )
    rows = [
        [esc(_round(lv.get("request_rate"))), esc(_round(lv.get("request_throughput"))),
         esc(_round(lv.get("output_throughput"))), esc(_round(lv.get("p95_ttft_ms"))),
         esc(_round(lv.get("p95_tpot_ms"))), esc(_round(lv.get("request_goodput"))),
         esc(lv.get("completed")), esc(lv.get("failed"))]
        for lv in r.get("levels") or [] if isinstance(lv, dict)
    ]  # fmt: skip
    head = ["offered req/s", "achieved req/s", "tok/s", "TTFT p95 ms", "TPOT p95 ms",
            "goodput req/s", "done", "failed"]  # fmt: skip
    return info + table(head, rows)


def _round(value: object) -> object:
    """A number rounded to one decimal for a table."""
    return round(value, 1) if isinstance(value, float) else value


def compare(runs: list[dict[str, Any]]) -> str:
    """The saved sweeps side by side: the best aggregate tok/s and where, single-user tok/s, and
    the knobs in which each differs from the newest."""
    good = [r for r in runs if isinstance(r.get("result"), dict)]
    first = good[0]["result"].get("knobs")
    base: dict[str, Any] = first if isinstance(first, dict) else {}
    rows = []
    for run in good:
        r = run["result"]
        levels = [lv for lv in r.get("levels") or [] if isinstance(lv, dict)]
        rated = [(lv, _num(lv.get("output_throughput"))) for lv in levels]
        best = max((x for x in rated if x[1] is not None), key=lambda x: x[1] or 0.0, default=None)
        one = next((lv for lv in levels if lv.get("max_concurrency") == 1), None)
        knobs = r.get("knobs") if isinstance(r.get("knobs"), dict) else {}
        differ = ", ".join(f"{k}={v}" for k, v in knobs.items() if base.get(k) != v)
        rows.append([
            esc(run["file"]),
            esc(_round(best[1])) if best else "—",
            esc(best[0].get("max_concurrency")) if best else "—",
            esc(_round((one or {}).get("per_user_tok_s"))),
            esc(differ or ("(the newest)" if run is good[0] else "same knobs")),
        ])  # fmt: skip
    return table(["sweep", "best tok/s", "at concurrency", "tok/s at 1 user",
                  "knobs unlike the newest"], rows)  # fmt: skip
