"""Renderings of an open-loop sweep: its table (rich), its sentences, JSON and CSV files."""

from __future__ import annotations

import io
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
from spark_ops.bench.report import (
    knobs_text,
    levels_table,
    num_text,
    plain_text,
    write_json,
    write_levels_csv,
)

if TYPE_CHECKING:
    from rich.table import Table

# the columns left out first when a terminal is too narrow for all of them
RATE_DROP = ["send lag\nms", "TPOT p50\nms", "TTFT p50\nms", "achieved\nreq/s"]


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
    columns = ("offered\nreq/s", "achieved\nreq/s", "aggregate\ntok/s", "TTFT p50\nms",
               "TTFT p95\nms", "TPOT p50\nms", "TPOT p95\nms", "goodput\nreq/s",
               "goodput\ntok/s", "send lag\nms", "errors")  # fmt: skip
    rows = (
        (f"{lv.request_rate:g}", num_text(lv.request_throughput, "{:.2f}"),
         num_text(lv.output_throughput), num_text(lv.median_ttft_ms), num_text(lv.p95_ttft_ms),
         num_text(lv.median_tpot_ms, "{:.1f}"), num_text(lv.p95_tpot_ms, "{:.1f}"),
         num_text(lv.request_goodput, "{:.2f}"), num_text(lv.output_goodput),
         num_text(lv.max_send_lag_ms), str(lv.failed))
        for lv in result.levels
    )  # fmt: skip
    title = f"{result.model} — open loop, {result.output_tokens} output tokens"
    return levels_table(title, result.knobs, _caption(result), columns, rows)


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
    return plain_text(rate_table(result), width, RATE_DROP, rate_lines(result))


def write_rate_json(result: RateResult, path: Path) -> None:
    """Write the result as JSON to path (atomically; OutputError naming it on failure)."""
    write_json(result, path)


def write_rate_csv(result: RateResult, path: Path) -> None:
    """Write one CSV row per level with every scalar figure."""
    write_levels_csv(path, result.model, "open-loop", result.levels, "request_rate")


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
