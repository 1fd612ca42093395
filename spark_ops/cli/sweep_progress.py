"""Sweep progress for `bench`: a live line with level, repeat and ETA on a TTY, level lines always.

The display hears run_sweep's RunEvents (a run starting or finished) and its finished levels. On a
terminal (not TERM=dumb) a rich live view on stderr shows where the sweep is and how long it has
left; every finished level is printed above it, so what stays on screen is one line per level.
Elsewhere (a pipe, a log file) only the level lines are written. rich is imported only for a TTY.
"""

from __future__ import annotations

import os
import sys
import time
from typing import IO, Any

from spark_ops.bench.stats import LevelResult
from spark_ops.bench.sweep import RunEvent
from spark_ops.cli.progress import fmt_s


def level_line(level: LevelResult) -> str:
    """One finished level in words."""
    return (
        f"C={level.max_concurrency}: {level.output_throughput:.0f} tok/s aggregate, "
        f"{(level.per_user_tok_s or 0):.1f} tok/s per user, {level.failed} errors"
    )


class SweepState:
    """Where the sweep is, and the ETA from the runs finished so far."""

    def __init__(self, levels: list[int], repeats: int, recheck: int | None) -> None:
        """Nothing run yet; `levels` in sweep order, `recheck` the speed-check level or None."""
        self.levels = levels
        self.repeats = repeats
        self.recheck = recheck
        self.event: RunEvent | None = None
        self.walls: dict[int, list[float]] = {}
        self.run_started = time.monotonic()
        self.started = time.monotonic()
        self.kept: set[int] = set()

    def update(self, event: RunEvent) -> None:
        """A run started or finished."""
        self.event = event
        if event.run is None:
            self.run_started = time.monotonic()
        elif event.repeat:
            self.walls.setdefault(event.concurrency, []).append(event.run.wall_s)

    def remaining_runs(self) -> list[int]:
        """The concurrency of every run not finished yet (the one under way included)."""
        ev = self.event
        if ev is None:
            return []
        out: list[int] = []
        if ev.repeat:  # a level's run: the rest of this level, the later levels, the speed check
            left_here = self.repeats - ev.repeat + (ev.run is None)
            out += [ev.concurrency] * left_here
            later = self.levels[ev.level_index :]
            out += [c for c in later if c not in self.kept for _ in range(self.repeats)]
            out += [self.recheck] if self.recheck is not None else []
        elif ev.run is None:
            out.append(ev.concurrency)
        return out

    def eta(self) -> tuple[float | None, bool]:
        """Seconds left and whether that is a lower bound (levels not measured yet), or None."""
        if not self.walls:
            return None, False
        last = next(c for c in reversed(self.levels) if c in self.walls) if self.walls else None
        lower_bound = False
        total = 0.0
        for c in self.remaining_runs():
            walls = self.walls.get(c)
            if walls:
                total += sum(walls) / len(walls)
            else:  # a higher level not run yet: it takes at least as long as the last one
                lower_bound = True
                total += sum(self.walls[last]) / len(self.walls[last]) if last is not None else 0
        if self.event is not None and self.event.run is None:
            total -= time.monotonic() - self.run_started
        return max(0.0, total), lower_bound

    def where(self) -> str:
        """'level C=16 (3/5) · repeat 2/3', or the speed check."""
        ev = self.event
        if ev is None:
            return "starting…"
        if not ev.repeat:
            return f"speed check at C={ev.concurrency}"
        return (
            f"level C={ev.concurrency} ({ev.level_index}/{ev.levels}) · "
            f"repeat {ev.repeat}/{ev.repeats}"
        )

    def counts(self) -> str:
        """'run 8/16 · elapsed 1m02s · ETA 2m10s' (the ETA a lower bound: 'at least')."""
        ev = self.event
        if ev is None:
            return ""
        eta, bound = self.eta()
        left = "ETA unknown (no run finished yet)" if eta is None else (
            f"ETA {'at least ' if bound else ''}{fmt_s(eta)}")  # fmt: skip
        return (
            f"run {min(ev.done_runs + 1, ev.total_runs)}/{ev.total_runs} · "
            f"elapsed {fmt_s(time.monotonic() - self.started)} · {left}"
        )


class SweepDisplay:
    """Level lines on stderr, and on a TTY a live progress line under them."""

    def __init__(
        self, levels: list[int], repeats: int, recheck: int | None, *,
        stream: IO[str] | None = None, tty: bool | None = None, quiet: bool = False,
    ) -> None:  # fmt: skip
        """Nothing shown until the first event; `tty` None: stream is a terminal, not dumb.

        `quiet` (-q): nothing at all, neither level lines nor the live view.
        """
        self.stream = stream if stream is not None else sys.stderr
        if tty is None:
            isatty = getattr(self.stream, "isatty", None)
            tty = bool(isatty and isatty()) and os.environ.get("TERM") != "dumb"
        self.tty = tty and not quiet
        self.quiet = quiet
        self.state = SweepState(levels, repeats, recheck)
        self._live: Any = None
        self._console: Any = None

    def keep(self, levels: list[LevelResult]) -> None:
        """Levels a resumed sweep keeps: printed once, and left out of the ETA."""
        for lv in levels:
            self.state.kept.add(lv.max_concurrency)
            self._print(level_line(lv) + " (kept, not run again)")

    def _start(self) -> None:
        """Create the rich live view (imports rich)."""
        from rich.console import Console
        from rich.live import Live

        self._console = Console(file=self.stream, force_terminal=True, stderr=True)
        self._live = Live(
            get_renderable=self.render, console=self._console, refresh_per_second=4,
            transient=True, redirect_stdout=False, redirect_stderr=False,
        )  # fmt: skip
        self._live.start()

    def render(self) -> Any:
        """The live view: where the sweep is, then a bar of the runs done, the counts and ETA."""
        from rich.console import Group
        from rich.progress_bar import ProgressBar
        from rich.table import Table
        from rich.text import Text

        ev = self.state.event
        done, total = (ev.done_runs, ev.total_runs) if ev else (0, 1)
        bar = Table.grid(padding=(0, 1))
        bar.add_row(ProgressBar(total=total, completed=done, width=20), self.state.counts())
        return Group(Text("bench: " + self.state.where()), bar)

    def _print(self, text: str) -> None:
        """A line above the live view (or plain, off a TTY); nothing under -q."""
        if self.quiet:
            return
        if self._console is not None:
            self._console.print(text, highlight=False, markup=False)
        else:
            print(text, file=self.stream, flush=True)

    def on_run(self, event: RunEvent) -> None:
        """A run started or finished."""
        self.state.update(event)
        if not self.tty:
            return
        if self._live is None:
            self._start()
        self._live.refresh()

    def on_level(self, level: LevelResult) -> None:
        """A finished level: its line."""
        self._print(level_line(level))

    def close(self) -> None:
        """Stop the live view (it leaves no trace: the level lines stay)."""
        if self._live is not None:
            self._live.stop()
            self._live = None
