"""Boot progress for the CLI: a live rich view on a TTY, JSON lines on stderr otherwise.

A reporter is the `on_event` callback of `spark_ops.readiness.wait_for_boot`. rich is imported
only when a live view is actually shown.
"""

from __future__ import annotations

import itertools
import json
import os
import sys
import time
from typing import IO, Any

from spark_ops.readiness.eta import BootHistory, eta_seconds
from spark_ops.readiness.phases import PHASE_ORDER, Phase
from spark_ops.readiness.report import BootEvent

HEARTBEAT_S = 30.0


def fmt_s(seconds: float | None) -> str:
    """Seconds as '9m05s' / '42s' / '-'."""
    if seconds is None:
        return "-"
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.0f}s"
    minutes, secs = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


class BootProgress:
    """State shared by both renderings: phases reached, timings, ETA, last line."""

    def __init__(
        self,
        cluster: str,
        estimates: dict[str, float] | None = None,
        workers_expected: int | None = None,
    ) -> None:
        """Start with no phase reached; `estimates` are expected seconds per phase;
        `workers_expected` is how many workers the inventory lists (when the log has not said)."""
        self.cluster = cluster
        self.workers_expected = workers_expected
        self.estimates = dict(estimates or {})
        self.phase: Phase = Phase.STARTING
        self.reached: dict[Phase, float] = {}
        self.expected: list[Phase] = [p for p in PHASE_ORDER]
        self.elapsed_s = 0.0
        self.last_line: str | None = None
        self.lines = 0
        self.workers: str | None = None
        self.outcome: str | None = None  # "ready", "fatal: ...", "timeout: ..."
        self.boots = 0  # boots followed so far (a rollback's boot is the second)
        self.step = "imports"  # the step of STARTING (api-config, engine-core, workers)

    def reset(self) -> None:
        """A new boot (or a new engine's first line): phases and times start over."""
        self.phase = Phase.STARTING
        self.reached = {Phase.STARTING: 0.0}
        self.elapsed_s = 0.0
        self.outcome = None
        self.workers = None
        self.boots += 1

    def update(self, event: BootEvent) -> bool:
        """Take an event; return True when it reached a new phase."""
        if event.kind == "start":
            self.reset()
            return False
        if event.kind == "engine":
            self.phase = Phase.STARTING
            self.reached = {Phase.STARTING: event.elapsed_s}
            self.step = "imports"
            return False
        if event.kind == "step":
            self.step = str(event.data.get("step", self.step))
            return False
        self.elapsed_s = max(self.elapsed_s, event.elapsed_s)
        if event.kind == "line":
            self.lines += 1
            if event.line and event.line.strip():
                self.last_line = event.line
            return False
        if event.kind == "workers":
            joined, total = event.data.get("joined"), event.data.get("expected")
            missing = event.data.get("missing")
            if missing:
                self.workers = f"missing: {', '.join(missing)}"
            elif joined is not None:
                total = total or self.workers_expected
                self.workers = f"{joined}/{total or '?'} workers joined"
            return False
        if event.kind == "ranks":  # an engine run as ranks: rank 0's `k/N ranks joined`
            self.workers = f"{event.data.get('joined')}/{event.data.get('total')} ranks joined"
            return False
        if event.kind == "fatal":
            self.outcome = f"failed: {event.data.get('message', '')}"
            return False
        if event.kind == "timeout":
            self.outcome = f"timeout: {event.data.get('message', '')}"
            return False
        if event.kind != "phase":
            return False
        if "expected" in event.data:
            self.expected = [Phase(p) for p in event.data["expected"]]
        new = event.phase not in self.reached
        self.reached.setdefault(event.phase, event.elapsed_s)
        self.phase = event.phase
        if event.phase is Phase.READY:
            self.outcome = "ready"
        return new

    def in_phase_s(self) -> float:
        """Seconds spent in the current phase so far."""
        return self.elapsed_s - self.reached.get(self.phase, 0.0)

    def eta_s(self) -> float | None:
        """Expected seconds left, from earlier boots of this cluster; None if unknown."""
        return eta_seconds(self.estimates, self.phase, self.in_phase_s(), self.expected)

    def snapshot(self, kind: str) -> dict[str, Any]:
        """A JSON-able summary for one output line."""
        eta = self.eta_s()
        out: dict[str, Any] = {
            "event": kind,
            "cluster": self.cluster,
            "phase": self.phase.value,
            "elapsed_s": round(self.elapsed_s, 1),
            "in_phase_s": round(self.in_phase_s(), 1),
            **({"starting_step": self.step} if self.phase is Phase.STARTING else {}),
            "eta_s": round(eta, 1) if eta is not None else None,
            "lines": self.lines,
        }
        if self.workers:
            out["workers"] = self.workers
        return out


class JsonLinesReporter:
    """One JSON line per phase change (and per failure) on a stream; a heartbeat every 30 s."""

    def __init__(
        self,
        cluster: str,
        *,
        estimates: dict[str, float] | None = None,
        stream: IO[str] | None = None,
        heartbeat_s: float = HEARTBEAT_S,
        workers_expected: int | None = None,
    ) -> None:
        """Write to `stream` (default stderr)."""
        self.state = BootProgress(cluster, estimates, workers_expected)
        self.stream = stream if stream is not None else sys.stderr
        self.heartbeat_s = heartbeat_s
        self._last_out = 0.0

    def _write(self, data: dict[str, Any]) -> None:
        """Write one JSON object as a line."""
        self.stream.write(json.dumps(data, sort_keys=False) + "\n")
        self.stream.flush()
        self._last_out = self.state.elapsed_s

    def __call__(self, event: BootEvent) -> None:
        """Handle one boot event."""
        new_phase = self.state.update(event)
        if event.kind in ("start", "engine"):
            data = self.state.snapshot("boot-start" if event.kind == "start" else "boot-engine")
            data["boot"] = self.state.boots
            if event.line:
                data["line"] = event.line[:300]
            self._write(data)
        elif new_phase:
            data = self.state.snapshot("boot-phase")
            if event.line:
                data["line"] = event.line[:500]
            if event.phase is Phase.READY and "total_s" in event.data:
                data["total_s"] = round(float(event.data["total_s"]), 1)
            self._write(data)
        elif event.kind in ("fatal", "timeout"):
            data = self.state.snapshot(f"boot-{event.kind}")
            data["message"] = event.data.get("message")
            self._write(data)
        elif self.state.elapsed_s - self._last_out >= self.heartbeat_s:
            data = self.state.snapshot("boot-heartbeat")
            if self.state.last_line:
                data["last_line"] = self.state.last_line[:300]
            self._write(data)

    def close(self) -> None:
        """Nothing to tear down."""

    def __enter__(self) -> JsonLinesReporter:
        """Use as a context manager."""
        return self

    def __exit__(self, *exc: object) -> None:
        """Close on exit."""
        self.close()


def _ends_boot(event: BootEvent) -> bool:
    """True for the last event wait_for_boot sends: READY with its total, a failure, a timeout."""
    if event.kind in ("fatal", "timeout"):
        return True
    return event.kind == "phase" and event.phase is Phase.READY and "total_s" in event.data


class LiveReporter:
    """A live rich view: every expected phase with its time, the ETA and the last log line."""

    def __init__(
        self,
        cluster: str,
        *,
        estimates: dict[str, float] | None = None,
        stream: IO[str] | None = None,
        force_terminal: bool | None = None,
        width: int | None = None,
        workers_expected: int | None = None,
    ) -> None:
        """Prepare the view; the live display starts with the first event."""
        self.state = BootProgress(cluster, estimates, workers_expected)
        self.stream = stream if stream is not None else sys.stderr
        self.force_terminal = force_terminal
        self.width = width
        self._live: Any = None

    def _start(self) -> None:
        """Create the rich Live display (imports rich)."""
        from rich.console import Console
        from rich.live import Live

        console = Console(
            file=self.stream, force_terminal=self.force_terminal, width=self.width, stderr=True
        )
        # refreshed from the caller's thread only (at most 4 times a second, and on every phase):
        # a refresh thread beside the writers of step lines and logs misplaces the cursor and
        # leaves half-erased frames on screen
        self._live = Live(
            get_renderable=self.render, console=console, auto_refresh=False, transient=False
        )
        self._live.start()
        self._refreshed = 0.0

    def render(self) -> Any:
        """The current view as a rich renderable."""
        from rich.console import Group
        from rich.table import Table
        from rich.text import Text

        st = self.state
        table = Table(title=f"boot of {st.cluster}", title_justify="left", box=None, pad_edge=False)
        table.add_column("", width=1)
        table.add_column("phase")
        table.add_column("took", justify="right")
        table.add_column("usual", justify="right")
        order = sorted(st.reached.items(), key=lambda kv: kv[1])
        took: dict[Phase, float] = {}
        for (phase, at), (_, nxt) in itertools.pairwise(order):
            took[phase] = nxt - at
        for phase in st.expected:
            usual = st.estimates.get(phase.value)
            if phase in took or (phase in st.reached and phase is Phase.READY):
                mark, style, spent = "✓", "green", took.get(phase)
            elif phase is st.phase:
                mark, style, spent = "▶", "bold yellow", st.in_phase_s()
            elif phase not in st.reached and phase.rank < st.phase.rank:
                mark, style, spent = "-", "dim strike", None  # passed without a log line
            else:
                mark, style, spent = "·", "dim", None
            table.add_row(
                mark,
                Text(phase.value, style=style),
                fmt_s(spent) if spent is not None else "",
                fmt_s(usual) if usual is not None else "",
            )
        eta = st.eta_s()
        summary = f"elapsed {fmt_s(st.elapsed_s)}"
        summary += f"   ETA {fmt_s(eta)}" if eta is not None else "   ETA unknown (first boot)"
        if st.workers:
            summary += f"   {st.workers}"
        parts: list[Any] = [table, Text(summary)]
        if st.outcome:
            style = "green" if st.outcome == "ready" else "bold red"
            parts.append(Text(st.outcome, style=style))
        elif st.last_line:
            parts.append(Text(st.last_line[: (self.width or 120) - 2], style="dim"))
        return Group(*parts)

    def __call__(self, event: BootEvent) -> None:
        """Handle one boot event (the view refreshes itself 4 times a second)."""
        if self._live is None:
            self._start()
        self.state.update(event)
        if _ends_boot(event):
            # stopped now, so that the line after the view (the boot step's `✓ boot`, printed
            # before the caller closes us) starts on a line of its own; the next boot (a
            # rollback's) opens a new view
            self.close()
        elif event.kind != "line" or time.monotonic() - self._refreshed >= 0.25:
            self._live.refresh()
            self._refreshed = time.monotonic()

    def close(self) -> None:
        """Stop the live display, leaving the final view on screen."""
        if self._live is not None:
            self._live.refresh()
            self._live.stop()
            self._live = None

    def __enter__(self) -> LiveReporter:
        """Use as a context manager."""
        return self

    def __exit__(self, *exc: object) -> None:
        """Close on exit."""
        self.close()


class TextLinesReporter(JsonLinesReporter):
    """The JSON lines' events as one plain line each, for a person reading a log or a pipe.

    Without --json nothing on stderr is JSON: the step lines and these read as one report. A
    failure's message is not repeated here: the boot step and the error name it.
    """

    def _write(self, data: dict[str, Any]) -> None:
        """Write one event as a plain line."""
        kind = str(data["event"]).removeprefix("boot-")
        if kind in ("fatal", "timeout"):
            text = f"  boot {kind} in {data['phase']} after {data['elapsed_s']} s"
        elif kind == "start":
            text = f"  boot {data.get('boot', 1)}: waiting for the new engine"
        elif kind == "engine":
            text = "  boot: the new engine writes its log"
        else:
            text = f"  boot: {data['phase']} at {data['elapsed_s']} s"
            if data.get("workers"):
                text += f", {data['workers']}"
            if data.get("eta_s") is not None and data["phase"] != "READY":
                text += f", about {data['eta_s']:.0f} s left"
        self.stream.write(text + "\n")
        self.stream.flush()
        self._last_out = self.state.elapsed_s


class NullReporter:
    """A boot reporter that shows nothing (-q)."""

    def __call__(self, event: BootEvent) -> None:
        """Ignore the event."""

    def close(self) -> None:
        """Nothing to tear down."""


def make_reporter(
    cluster: str,
    json_lines: bool = False,
    *,
    stream: IO[str] | None = None,
    estimates: dict[str, float] | None = None,
    history_path: str | os.PathLike[str] | None = None,
    tty: bool | None = None,
    history: str | None = None,
    workers_expected: int | None = None,
    quiet: bool = False,
) -> JsonLinesReporter | LiveReporter | NullReporter:
    """A reporter for a boot of `cluster`: live view on a TTY, JSON lines under --json, plain
    lines otherwise, on stderr; nothing under -q.

    ETAs come from `estimates` or, when not given, from the boot history file under the key
    `history` (the cluster's identity, readiness.history_key; default its name).
    `workers_expected` (the inventory's worker count) completes "N/M workers joined".
    """
    out = stream if stream is not None else sys.stderr
    if estimates is None:
        estimates = BootHistory(history_path).estimate(history or cluster)
    if tty is None:
        isatty = getattr(out, "isatty", None)
        tty = bool(isatty and isatty())
    if quiet:
        return NullReporter()
    if json_lines or not tty:
        kind = JsonLinesReporter if json_lines else TextLinesReporter
        return kind(cluster, estimates=estimates, stream=out, workers_expected=workers_expected)
    return LiveReporter(
        cluster,
        estimates=estimates,
        stream=out,
        force_terminal=True,
        workers_expected=workers_expected,
    )
