"""PNG plot of a sweep: aggregate and per-user tok/s against concurrency (matplotlib, lazily)."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

from spark_ops.bench.sweep import SweepResult
from spark_ops.errors import BenchError, MissingModule, OutputError

TITLE_MAX_LINES = 3


def load_pyplot() -> Any:
    """matplotlib's pyplot on the Agg backend; MissingModule naming the `plot` extra when absent.

    `bench --plot` calls it before the first request, so that a missing extra is said at once,
    not after the whole sweep.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise MissingModule(
            "--plot needs matplotlib, which is not installed",
            hint="pip install 'spark-ops[plot]' (or run without --plot)",
        ) from exc
    return plt


def fit_title(fig: Any, ax: Any, text: str) -> Any:
    """Set the axes' title wrapped (then, if need be, shrunk) so that it lies inside the figure."""
    renderer = fig.canvas.get_renderer()
    fig_width = fig.bbox.width
    size = float(ax.title.get_fontsize())
    width = max(len(text), 1)
    title = ax.set_title(text)
    for _ in range(40):
        box = title.get_window_extent(renderer)
        if box.x0 >= 0 and box.x1 <= fig_width:
            break
        lines = textwrap.wrap(text, max(width, 8), break_long_words=True)
        if len(lines) < TITLE_MAX_LINES and width > 8:
            width = int(width * 0.85)
        else:
            size *= 0.9
        title = ax.set_title(
            "\n".join(textwrap.wrap(text, max(width, 8), break_long_words=True)), fontsize=size
        )
    return title


def plot_sweep(result: SweepResult, path: Path, *, title: str | None = None) -> None:
    """Write a PNG with aggregate tok/s (left axis, with spread) and per-user tok/s (right axis)."""
    plt = load_pyplot()
    if not result.levels:
        raise BenchError(f"{path}: nothing to plot: the result has no levels")
    fig = sweep_figure(result, title=title)
    try:
        fig.savefig(path, format="png")
    except OSError as exc:
        raise OutputError(f"{path}: cannot write the plot: {exc.strerror}") from exc
    finally:
        plt.close(fig)


def sweep_figure(result: SweepResult, *, title: str | None = None) -> Any:
    """The sweep's figure (the caller saves and closes it); its title fits inside it."""
    plt = load_pyplot()
    levels = sorted(result.levels, key=lambda lv: lv.max_concurrency)
    xs = [lv.max_concurrency for lv in levels]
    agg = [lv.output_throughput for lv in levels]
    lo = [lv.output_throughput - lv.output_throughput_min for lv in levels]
    hi = [lv.output_throughput_max - lv.output_throughput for lv in levels]
    user = [lv.per_user_tok_s or 0.0 for lv in levels]
    fig, ax = plt.subplots(figsize=(8, 5), dpi=110)
    try:
        ax.errorbar(xs, agg, yerr=[lo, hi], marker="o", capsize=3, label="aggregate (wall clock)")
        steady = [(x, lv.steady_output_throughput) for x, lv in zip(xs, levels, strict=False)]
        if any(v is not None for _, v in steady):
            ax.plot(
                [x for x, v in steady if v is not None],
                [v for _, v in steady if v is not None],
                marker="s",
                linestyle="--",
                label="steady decode",
            )
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs, [str(x) for x in xs])
        ax.set_xlabel("concurrent requests")
        ax.set_ylabel("aggregate tok/s")
        ax.grid(True, alpha=0.3)
        ax2 = ax.twinx()
        ax2.plot(xs, user, marker="^", color="tab:red", label="average per user")
        ax2.set_ylabel("per-user tok/s")
        if result.reading.slo_tok_s:
            ax2.axhline(
                result.reading.slo_tok_s,
                color="tab:red",
                alpha=0.4,
                linestyle=":",
                label=f"per-user SLO {result.reading.slo_tok_s:g} tok/s",
            )
        if result.reading.knee is not None:
            ax.axvline(
                result.reading.knee,
                color="grey",
                alpha=0.6,
                linestyle=":",
                label=f"knee (C={result.reading.knee})",
            )
        ax.set_ylim(bottom=0)
        ax2.set_ylim(bottom=0)
        handles = ax.get_legend_handles_labels()
        handles2 = ax2.get_legend_handles_labels()
        ax.legend(
            handles[0] + handles2[0],
            handles[1] + handles2[1],
            loc="upper center",
            bbox_to_anchor=(0.5, -0.14),
            ncol=3,
            fontsize="small",
            frameon=False,
        )
        knobs = ", ".join(f"{k}={v}" for k, v in (result.knobs or {}).items())
        heading = title or f"{result.model} ({result.mode}{', ' + knobs if knobs else ''})"
        for _ in range(2):  # tight_layout makes room for the lines, and may move the axes
            fit_title(fig, ax, heading)
            fig.tight_layout()
    except BaseException:
        plt.close(fig)
        raise
    return fig
