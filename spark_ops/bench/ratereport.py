"""Renderings of an open-loop sweep: its table (rich), its sentences, JSON and CSV files."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from spark_ops.bench.gate import (
    Thresholds,
    Verdict,
    measurement_of,
    point_of,
    prove,
    verdict_table,
)
from spark_ops.bench.openloop import RateResult
from spark_ops.bench.ratelevel import RateLevel
from spark_ops.bench.report import fit_table, knobs_text
from spark_ops.files import write_file

if TYPE_CHECKING:
    from rich.table import Table

# the columns left out first when a terminal is too narrow for all of them
RATE_DROP = ["send lag\nms", "TPOT p50\nms", "TTFT p50\nms", "achieved\nreq/s"]


def _num(value: float | None, fmt: str = "{:.0f}") -> str:
    """Format a number, or a dash for None."""
    return "–" if value is None else fmt.format(value)


def slo_text(level: RateLevel | None) -> str:
    """The SLO goodput was counted under, in words."""
    if level is None:
        return "no levels"
    parts = []
    if level.slo_ttft_ms is not None:
        parts.append(f"TTFT ≤ {level.slo_ttft_ms:g} ms")
    if level.slo_tpot_ms is not None:
        parts.append(f"TPOT ≤ {level.slo_tpot_ms:g} ms")
    return " and ".join(parts) or "no SLO (every finished request counts)"


def _caption(result: RateResult) -> str:
    """How the load was offered and what goodput means here."""
    lv = result.levels[0] if result.levels else None
    if lv is None:
        return "no levels"
    cap = f", at most {lv.max_concurrency} in flight" if lv.max_concurrency else ""
    return (
        f"open loop: {lv.requests} {result.arrivals} arrivals per level (seed {lv.seed}){cap}; "
        f"goodput: requests meeting {slo_text(lv)}"
    )


def rate_table(result: RateResult) -> Table:
    """Per offered rate: achieved rate, tok/s, TTFT and TPOT p50/p95, goodput and errors."""
    from rich.table import Table

    title = f"{result.model} — open loop, {result.output_tokens} output tokens"
    if result.knobs:
        title += f" ({knobs_text(result.knobs)})"
    table = Table(title=title, title_justify="left", caption=_caption(result))
    for name in (
        "offered\nreq/s",
        "achieved\nreq/s",
        "aggregate\ntok/s",
        "TTFT p50\nms",
        "TTFT p95\nms",
        "TPOT p50\nms",
        "TPOT p95\nms",
        "goodput\nreq/s",
        "goodput\ntok/s",
        "send lag\nms",
        "errors",
    ):
        table.add_column(name, justify="right", no_wrap=True)
    for lv in result.levels:
        table.add_row(
            f"{lv.request_rate:g}",
            _num(lv.request_throughput, "{:.2f}"),
            _num(lv.output_throughput),
            _num(lv.median_ttft_ms),
            _num(lv.p95_ttft_ms),
            _num(lv.median_tpot_ms, "{:.1f}"),
            _num(lv.p95_tpot_ms, "{:.1f}"),
            _num(lv.request_goodput, "{:.2f}"),
            _num(lv.output_goodput),
            _num(lv.max_send_lag_ms),
            str(lv.failed),
        )
    return table


def rate_lines(result: RateResult) -> list[str]:
    """The sweep's reading: the highest rate whose goodput kept up, and the warnings."""
    lines: list[str] = []
    kept = [lv for lv in result.levels if lv.requests and lv.good_requests / lv.requests >= 0.9]
    if result.levels:
        if kept:
            best = max(kept, key=lambda lv: lv.request_rate)
            lines.append(
                f"Highest offered rate with ≥90% of requests meeting the SLO: "
                f"{best.request_rate:g} req/s ({best.output_goodput:.0f} goodput tok/s)."
            )
        else:
            lines.append("No offered rate had ≥90% of its requests meeting the SLO.")
    lines.extend(f"Warning: {w}" for w in result.warnings)
    return lines


def render_rate_text(result: RateResult, *, width: int = 140) -> str:
    """The table and the reading as plain text (what the terminal shows, without colour)."""
    from rich.console import Console

    console = Console(width=width, record=True, file=io.StringIO(), color_system=None)
    console.print(fit_table(rate_table(result), width, RATE_DROP))
    for line in rate_lines(result):
        console.print(line, highlight=False, markup=False)
    return console.export_text()


def write_rate_json(result: RateResult, path: Path) -> None:
    """Write the result as JSON to path (atomically; OutputError naming it on failure)."""
    write_file(path, json.dumps(result.to_dict(), indent=2, ensure_ascii=False) + "\n")


def write_rate_csv(result: RateResult, path: Path) -> None:
    """Write one CSV row per level with every scalar figure."""
    buf = io.StringIO()
    rows = [lv.scalars() for lv in result.levels]
    columns = list(rows[0]) if rows else ["request_rate"]
    writer = csv.DictWriter(buf, fieldnames=["model", "mode", *columns, "errors"])
    writer.writeheader()
    for lv, row in zip(result.levels, rows, strict=True):
        cells: dict[str, Any] = {k: "" if v is None else v for k, v in row.items()}
        errors = "; ".join(f"{n}x {msg}" for msg, n in lv.errors.items())
        writer.writerow({"model": result.model, "mode": "open-loop", **cells, "errors": errors})
    write_file(path, buf.getvalue())


def compare_rates(
    before: RateResult, after: RateResult, thresholds: Thresholds | None = None
) -> dict[str, Any]:
    """The gate's verdict at each offered rate both open-loop results have (bench.gate.prove),
    and the rates only one has; JSON-ready."""
    a = {lv.request_rate: lv for lv in before.levels}
    b = {lv.request_rate: lv for lv in after.levels}
    verdicts = [
        prove(measurement_of(a[r], point_of(a[r], before.output_tokens)),
              measurement_of(b[r], point_of(b[r], after.output_tokens)), thresholds).to_dict()
        for r in sorted(set(a) & set(b))
    ]  # fmt: skip
    return {
        "ok": bool(verdicts) and all(v["ok"] for v in verdicts),
        "knobs_before": before.knobs,
        "knobs_after": after.knobs,
        "rates": verdicts,
        "only_before": sorted(set(a) - set(b)),
        "only_after": sorted(set(b) - set(a)),
    }


def render_compare_rates(cmp: dict[str, Any], names: tuple[str, str], *, width: int = 120) -> str:
    """compare_rates' verdicts as plain text: a side-by-side table per rate, then the outcome."""
    from rich.console import Console

    console = Console(width=width, record=True, file=io.StringIO(), color_system=None)
    console.print(f"{names[0]} → {names[1]}", highlight=False, markup=False)
    for data in cmp["rates"]:
        verdict = Verdict.from_dict(data)
        console.print(verdict_table(verdict))
        for line in verdict.lines():
            console.print(line, highlight=False, markup=False)
    if cmp["knobs_before"] != cmp["knobs_after"]:
        console.print(
            f"knobs: {knobs_text(cmp['knobs_before'])} → {knobs_text(cmp['knobs_after'])}",
            highlight=False, markup=False,
        )  # fmt: skip
    for key, name in (("only_before", names[0]), ("only_after", names[1])):
        if cmp[key]:
            console.print(f"only in {name}: {cmp[key]} req/s", highlight=False, markup=False)
    if not cmp["rates"]:
        console.print("No offered rate in both results: nothing to compare.", highlight=False)
    return console.export_text()
