"""Rendering of the lower-cap what-if: one table (cap x offered concurrency) and its reading."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.table import Table

    from spark_ops.bench.whatif import WhatIf


def _n(value: float | None, fmt: str) -> str:
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
                _n(p.aggregate_tok_s, "{:.0f}") + mark,
                _n(p.per_user_tok_s, "{:.1f}") + mark,
                _n(None if p.ttft_ms is None else p.ttft_ms / 1000, "{:.1f}") + mark,
            ]
        table.add_row(*row)
    return table


def whatif_lines(result: WhatIf) -> list[str]:
    """The reading, what the prediction assumes, and where it does not hold."""
    lines = list(result.lines)
    lines.append("The prediction assumes: " + "; ".join(result.assumptions) + ".")
    lines += [f"warning: {w}" for w in result.warnings]
    return lines
