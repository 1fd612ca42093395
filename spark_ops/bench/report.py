"""Renderings of a sweep: the note's table (rich), JSON, CSV, and before/after comparison."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from spark_ops.bench.openloop import SCHEMA as RATE_SCHEMA
from spark_ops.bench.openloop import RateResult
from spark_ops.bench.ratelevel import RateLevel
from spark_ops.bench.stats import LevelResult
from spark_ops.bench.sweep import SweepResult
from spark_ops.errors import BenchError
from spark_ops.files import NotRegularFile, read_regular, write_file
from spark_ops.sizes import human_value

if TYPE_CHECKING:
    from rich.table import Table

    from spark_ops.bench.whatif import WhatIf


def num_text(value: float | None, fmt: str = "{:.0f}") -> str:
    """Format a number or a dash for None (a table's cell)."""
    return "–" if value is None else fmt.format(value)


# the sweep table's columns left out first when a terminal is too narrow for all ten
MAX_RESULT_BYTES = 64 << 20  # a sweep's result is kilobytes; more is not one of ours
SWEEP_DROP = ["engine\ntok/s", "steady\ntok/s", "tail", "TTFT p99\nms", "wall\nclock"]
COMPARE_DROP = ["mean E2E ms", "steady tok/s", "TTFT p99 ms"]


def knobs_text(knobs: dict[str, Any] | None) -> str:
    """Knobs as a person reads them: 'max_num_seqs=64, kv_cache_memory_bytes=60 GiB' (a byte
    count in binary units; 'none' when there are none)."""
    return ", ".join(f"{k}={human_value(k, v)}" for k, v in (knobs or {}).items()) or "none"


def fit_table(table: Table, width: int, drop: list[str]) -> Table:
    """Leave out the columns named in `drop`, in order, until `table` fits `width` columns.

    Rich wraps what is left within its cells; the caption names the columns left out (the JSON
    and CSV files keep every figure). Headers are compared as written (with their newlines).
    """
    from rich.console import Console
    from rich.measure import Measurement

    console = Console(width=10_000, file=io.StringIO())
    left = []
    for header in drop:
        if Measurement.get(console, console.options, table).maximum <= width:
            break
        i = next((i for i, c in enumerate(table.columns) if str(c.header) == header), None)
        if i is not None:
            table.columns.pop(i)
            left.append(header.replace("\n", " "))
    if left:
        note = f"left out to fit {width} columns: {', '.join(left)} (-o FILE keeps them)"
        table.caption = f"{table.caption}; {note}" if table.caption else note
    return table


def levels_table(
    title: str, knobs: dict[str, Any] | None, caption: str, columns: Sequence[str],
    rows: Iterable[Sequence[str]],
) -> Table:  # fmt: skip
    """A result's table: its title (with the knobs it ran under), caption, right-aligned columns
    and one row per level (a sweep's, an open-loop sweep's)."""
    from rich.table import Table

    if knobs:
        title += f" ({knobs_text(knobs)})"
    table = Table(title=title, title_justify="left", caption=caption)
    for name in columns:
        table.add_column(name, justify="right", no_wrap=True)
    for row in rows:
        table.add_row(*row)
    return table


def plain_text(table: Table, width: int, drop: list[str], lines: list[str]) -> str:
    """A table (fitted to `width`, fit_table) and sentences as plain text: what the terminal
    shows, without colour; the sentences printed as written (no markup read in them)."""
    from rich.console import Console

    console = Console(width=width, record=True, file=io.StringIO(), color_system=None)
    console.print(fit_table(table, width, drop))
    for line in lines:
        console.print(line, highlight=False, markup=False)
    return console.export_text()


def write_levels_csv(
    path: Path, model: str, mode: str, levels: Sequence[LevelResult | RateLevel],
    first: str,
) -> None:  # fmt: skip
    """Write one CSV row per level with every scalar figure (`first`: the only column when there
    are no levels), atomically."""
    rows = [lv.scalars() for lv in levels]
    buf = io.StringIO()
    columns = list(rows[0]) if rows else [first]
    writer = csv.DictWriter(buf, fieldnames=["model", "mode", *columns, "errors"])
    writer.writeheader()
    for lv, row in zip(levels, rows, strict=True):
        writer.writerow(
            {
                "model": model,
                "mode": mode,
                **{k: "" if v is None else v for k, v in row.items()},
                "errors": "; ".join(f"{n}x {msg}" for msg, n in lv.errors.items()),
            }
        )
    write_file(path, buf.getvalue())


def _spread(lv: LevelResult) -> str:
    """Aggregate tok/s with its spread over repeats (± half the min–max range)."""
    base = num_text(lv.output_throughput)
    if lv.repeats > 1:
        half = (lv.output_throughput_max - lv.output_throughput_min) / 2
        return f"{base} ±{half:.0f}"
    return base


def reading_lines(result: SweepResult) -> list[str]:
    """The sweep's reading in plain sentences."""
    r = result.reading
    lines: list[str] = []
    gain_pct = r.knee_gain * 100
    if r.knee is not None:
        lines.append(
            f"Saturation knee: concurrency {r.knee} (gained under {gain_pct:.0f}% over the "
            "previous level)."
        )
    else:
        lines.append(f"No saturation knee within the levels (every step gained ≥{gain_pct:.0f}%).")
    if r.slo_tok_s is not None:
        if r.slo_max_concurrency is not None:
            lines.append(f"Per-user SLO {r.slo_tok_s:g} tok/s: concurrency {r.slo_text} keeps it.")
        else:
            lines.append(f"Per-user SLO {r.slo_tok_s:g} tok/s: no level keeps it.")
    cap = r.cap
    if not result.metrics_available:
        lines.append("Engine cap: unknown (no /metrics).")
    elif cap.detected:
        text = (
            f"Engine cap: running requests plateau at {cap.plateau} while requests wait "
            f"({cap.at_plateau}/{cap.waiting_samples} samples)"
        )
        if cap.matches_knob is True:
            text += f" — max_num_seqs={cap.knob} is the cap."
        elif cap.matches_knob is False:
            text += f" — not max_num_seqs={cap.knob}: another limit (KV cache?)."
        else:
            text += " — likely max-num-seqs."
        lines.append(text)
    else:
        peaks = [lv.max_running for lv in result.levels if lv.max_running is not None]
        peak = f"; up to {max(peaks):.0f} requests ran at once" if peaks else ""
        lines.append(f"Engine cap: not reached (no running plateau while requests waited{peak}).")
    lines.extend(f"Warning: {w}" for w in result.warnings)
    return lines


def _caption(result: SweepResult) -> str:
    """How the figures were taken: repeats, mode details, steady fraction."""
    lv = result.levels[0] if result.levels else None
    parts = [f"{lv.repeats} repeat(s), aggregate ± half range" if lv else "no levels"]
    cfg = result.config
    if result.mode == "sustained":
        parts.append(f"{cfg.get('duration_s', '?')} s per run")
    elif result.mode == "poisson":
        parts.append(f"{cfg.get('rate', '?')} req/s for {cfg.get('duration_s', '?')} s")
    parts.append(f"steady: ≥{cfg.get('steady_fraction', 0.9):.0%} of C in flight")
    return "; ".join(parts)


def sweep_table(result: SweepResult) -> Table:
    """The note's table, plus steady/engine tok/s, tail, TTFT p50/p99 and errors."""
    columns = ("concurrent\nrequests", "wall\nclock", "aggregate\ntok/s", "per user\ntok/s",
               "steady\ntok/s", "engine\ntok/s", "tail", "TTFT p50\nms", "TTFT p99\nms",
               "errors")  # fmt: skip
    rows = (
        (str(lv.max_concurrency), f"{lv.duration:.1f} s", _spread(lv),
         num_text(lv.per_user_tok_s, "{:.1f}"), num_text(lv.steady_output_throughput),
         num_text(lv.engine_output_throughput), num_text(lv.tail_pct, "{:.0f}%"),
         num_text(lv.median_ttft_ms), num_text(lv.p99_ttft_ms), str(lv.failed))
        for lv in result.levels
    )  # fmt: skip
    title = f"{result.model} — {result.mode}, {result.output_tokens} output tokens"
    return levels_table(title, result.knobs, _caption(result), columns, rows)


def render_text(result: SweepResult, *, width: int = 140) -> str:
    """The table and the reading as plain text (what the terminal shows, without colour)."""
    return plain_text(sweep_table(result), width, SWEEP_DROP, reading_lines(result))


def write_json(
    result: SweepResult | RateResult, path: Path, *, extra: dict[str, Any] | None = None
) -> None:
    """Write the result as JSON (to_dict, plus extra top-level keys such as what_if) to path
    (atomically; OutputError naming it on failure)."""
    data = {**result.to_dict(), **(extra or {})}
    write_file(path, json.dumps(data, indent=2, ensure_ascii=False) + "\n")


def write_csv(result: SweepResult, path: Path) -> None:
    """Write one CSV row per level with every scalar figure."""
    write_levels_csv(path, result.model, result.mode, result.levels, "max_concurrency")


def _read_json(path: Path) -> Any:
    """The JSON of a saved result (a regular file; a FIFO is refused, never waited on)."""
    try:
        raw = read_regular(path, limit=MAX_RESULT_BYTES)
        if len(raw) > MAX_RESULT_BYTES:
            raise BenchError(f"{path}: larger than {MAX_RESULT_BYTES} bytes, not a bench result")
        return json.loads(raw.decode("utf-8"))
    except NotRegularFile as exc:
        raise BenchError(f"{path}: not a regular file") from exc
    except OSError as exc:
        raise BenchError(f"{path}: cannot read: {exc.strerror}") from exc
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise BenchError(f"{path}: not JSON: {str(exc)[:200]}") from exc


def load_result(path: Path) -> SweepResult:
    """Read a concurrency sweep's result JSON written by write_json; an open-loop result is
    refused by name (its levels are rates, not concurrencies)."""
    data = _read_json(path)
    if isinstance(data, dict) and data.get("schema") == RATE_SCHEMA:
        raise BenchError(
            f"{path}: an open-loop result (bench --request-rate), not a concurrency sweep"
        )
    return SweepResult.from_dict(data, source=str(path))


def load_saved(path: Path) -> SweepResult | RateResult:
    """Read any result bench saves: a concurrency sweep or an open-loop sweep (by its schema)."""
    data = _read_json(path)
    if isinstance(data, dict) and data.get("schema") == RATE_SCHEMA:
        return RateResult.from_dict(data, source=str(path))
    return SweepResult.from_dict(data, source=str(path))


# (key, column label, whether a higher value is better); ratios of ±5% or more are marked.
COMPARED = (
    ("output_throughput", "aggregate tok/s", True),
    ("per_user_tok_s", "per user tok/s", True),
    ("steady_output_throughput", "steady tok/s", True),
    ("p99_ttft_ms", "TTFT p99 ms", False),
    ("mean_e2el_ms", "mean E2E ms", False),
)


@dataclass
class CompareRow:
    """One level present in both results: values before, after and after/before."""

    max_concurrency: int
    before: dict[str, float | None]
    after: dict[str, float | None]
    ratio: dict[str, float | None]


@dataclass
class Comparison:
    """Before/after comparison of two sweeps, level by level."""

    before: str
    after: str
    rows: list[CompareRow]
    only_before: list[int] = field(default_factory=list)
    only_after: list[int] = field(default_factory=list)
    knobs_before: dict[str, Any] | None = None
    knobs_after: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        """Serialize for --json."""
        return {
            "before": self.before,
            "after": self.after,
            "knobs_before": self.knobs_before,
            "knobs_after": self.knobs_after,
            "levels": [
                {
                    "max_concurrency": r.max_concurrency,
                    "before": r.before,
                    "after": r.after,
                    "ratio": r.ratio,
                }
                for r in self.rows
            ],
            "only_before": self.only_before,
            "only_after": self.only_after,
        }


def compare(
    before: SweepResult, after: SweepResult, *, names: tuple[str, str] = ("A", "B")
) -> Comparison:
    """Ratios after/before of the main figures at each concurrency level both results have."""
    a = {lv.max_concurrency: lv for lv in before.levels}
    b = {lv.max_concurrency: lv for lv in after.levels}
    rows: list[CompareRow] = []
    for c in sorted(set(a) & set(b)):
        va = {k: getattr(a[c], k) for k, _, _ in COMPARED}
        vb = {k: getattr(b[c], k) for k, _, _ in COMPARED}
        ratio = {
            k: (vb[k] / va[k]) if va[k] and vb[k] is not None else None for k, _, _ in COMPARED
        }
        rows.append(CompareRow(c, va, vb, ratio))
    return Comparison(
        before=names[0],
        after=names[1],
        rows=rows,
        only_before=sorted(set(a) - set(b)),
        only_after=sorted(set(b) - set(a)),
        knobs_before=before.knobs,
        knobs_after=after.knobs,
    )


def compare_table(cmp: Comparison) -> Table:
    """A table of before → after (×ratio) per level and figure."""
    from rich.table import Table

    table = Table(title=f"{cmp.before} → {cmp.after}", title_justify="left")
    table.add_column("concurrent requests", justify="right")
    for _, label, _ in COMPARED:
        table.add_column(label, justify="right", no_wrap=True)
    for row in cmp.rows:
        cells = [str(row.max_concurrency)]
        for key, _, higher_is_better in COMPARED:
            ratio = row.ratio[key]
            mark = ""
            if ratio is not None and abs(ratio - 1) >= 0.05:
                mark = " better" if (ratio > 1) == higher_is_better else " worse"
            cells.append(
                f"{num_text(row.before[key])} → {num_text(row.after[key])}"
                + (f"\n×{ratio:.2f}{mark}" if ratio is not None else "")
            )
        table.add_row(*cells)
    return table


def render_compare_text(cmp: Comparison, *, width: int = 160) -> str:
    """The comparison as plain text."""
    from rich.console import Console

    console = Console(width=width, record=True, file=io.StringIO(), color_system=None)
    console.print(fit_table(compare_table(cmp), width, COMPARE_DROP))
    if cmp.knobs_before != cmp.knobs_after:
        console.print(
            f"knobs: {knobs_text(cmp.knobs_before)} → {knobs_text(cmp.knobs_after)}",
            highlight=False,
        )
    if cmp.only_before:
        console.print(f"only in {cmp.before}: {cmp.only_before}", highlight=False)
    if cmp.only_after:
        console.print(f"only in {cmp.after}: {cmp.only_after}", highlight=False)
    return console.export_text()


# ---- the lower-cap what-if (spark_ops.bench.whatif) ----------------------------------------


def _wn(value: float | None, fmt: str) -> str:
    """A number, or a dash."""
    return "–" if value is None else fmt.format(value)


def whatif_table(result: WhatIf) -> Table:
    """Per offered concurrency: each cap's aggregate, per-user tok/s and TTFT (* = predicted)."""
    from rich.table import Table

    running = f" (running cap {result.running_cap})" if result.running_cap else ""
    title = f"What-if for lower caps, read from this sweep{running}"
    legend = "* predicted (requests beyond the cap wait); ! not to be trusted"
    table = Table(
        title=title, title_justify="left", caption=legend, caption_justify="left",
        min_width=max(len(title), len(legend)),
    )  # fmt: skip
    table.add_column("concurrent\nrequests", justify="right")
    for cap in result.caps:
        table.add_column(f"cap {cap.cap}\naggregate", justify="right")
        table.add_column(f"cap {cap.cap}\nper user", justify="right")
        table.add_column(f"cap {cap.cap}\nTTFT s", justify="right")
    levels = sorted({p.concurrency for cap in result.caps for p in cap.points})
    for c in levels:
        row = [str(c)]
        for cap in result.caps:
            p = cap.point(c)
            if p is None:
                row += ["–", "–", "–"]
                continue
            mark = ("*" if p.source == "predicted" else "") + ("" if p.trusted else "!")
            row += [
                _wn(p.aggregate_tok_s, "{:.0f}") + mark,
                _wn(p.per_user_tok_s, "{:.1f}") + mark,
                _wn(None if p.ttft_ms is None else p.ttft_ms / 1000, "{:.1f}") + mark,
            ]
        table.add_row(*row)
    return table


def whatif_lines(result: WhatIf) -> list[str]:
    """The reading, what the prediction assumes, and where it does not hold."""
    lines = list(result.lines)
    lines.append("The prediction assumes: " + "; ".join(result.assumptions) + ".")
    lines += [f"warning: {w}" for w in result.warnings]
    return lines
