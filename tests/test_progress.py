"""Tests of spark_ops.cli.progress: JSON lines off a TTY, a live rich view on one."""

from __future__ import annotations

import asyncio
import io
import json
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

from spark_ops.cli.progress import JsonLinesReporter, LiveReporter, make_reporter
from spark_ops.readiness import BootEvent, BootHistory, Phase

EXPECTED = ["STARTING", "WEIGHTS_LOADING", "WEIGHTS_DONE", "KV_CACHE", "API_UP", "READY"]
ESTIMATES = {"STARTING": 20.0, "WEIGHTS_LOADING": 540.0, "WEIGHTS_DONE": 10.0, "KV_CACHE": 30.0}


def _boot_events() -> list[BootEvent]:
    """A boot as wait_for_boot reports it: phases, lines and ticks over 100 s."""
    ev: list[BootEvent] = [BootEvent("phase", Phase.STARTING, 0.0, None, {"expected": EXPECTED})]
    ev.append(BootEvent("line", Phase.STARTING, 1.0, "INFO non-default args: {'x': 1}"))
    ev.append(BootEvent("phase", Phase.WEIGHTS_LOADING, 5.0, "Starting to load model m..."))
    ev += [BootEvent("tick", Phase.WEIGHTS_LOADING, float(t)) for t in range(6, 100)]
    ev.append(BootEvent("phase", Phase.WEIGHTS_DONE, 100.0, "Loading weights took 94.9 seconds"))
    ev.append(BootEvent("phase", Phase.READY, 101.0, None, {"total_s": 101.0}))
    return ev


def test_json_lines_phases_and_heartbeats() -> None:
    """One line per phase change, a heartbeat every 30 s, ETA from the estimates."""
    out = io.StringIO()
    reporter = make_reporter("spark4", json_lines=True, stream=out, estimates=ESTIMATES)
    assert isinstance(reporter, JsonLinesReporter)
    for event in _boot_events():
        reporter(event)
    reporter.close()
    rows = [json.loads(line) for line in out.getvalue().splitlines()]
    kinds = [r["event"] for r in rows]
    assert kinds == [
        "boot-phase",
        "boot-phase",
        "boot-heartbeat",
        "boot-heartbeat",
        "boot-heartbeat",
        "boot-phase",
        "boot-phase",
    ]
    assert [r["phase"] for r in rows if r["event"] == "boot-phase"] == [
        "STARTING",
        "WEIGHTS_LOADING",
        "WEIGHTS_DONE",
        "READY",
    ]
    beats = [r for r in rows if r["event"] == "boot-heartbeat"]
    assert [b["elapsed_s"] for b in beats] == [35.0, 65.0, 95.0]
    # at 35 s, 30 s into a 540 s weights phase: 510 + 10 + 30 left (API_UP unknown = 0)
    assert beats[0]["eta_s"] == 550.0
    assert rows[1]["line"] == "Starting to load model m..."
    assert rows[-1]["eta_s"] == 0.0 and rows[-1]["total_s"] == 101.0
    assert all(r["cluster"] == "spark4" for r in rows)


def test_json_lines_failure_line() -> None:
    """A fatal event is written at once with its message."""
    out = io.StringIO()
    reporter = JsonLinesReporter("c", stream=out)
    reporter(BootEvent("phase", Phase.STARTING, 0.0))
    reporter(BootEvent("fatal", Phase.KV_CACHE, 3.0, "x", {"message": "engine boot failed: OOM"}))
    last = json.loads(out.getvalue().splitlines()[-1])
    assert last["event"] == "boot-fatal" and last["message"] == "engine boot failed: OOM"
    assert last["eta_s"] is None  # no earlier boots


def test_non_tty_defaults_to_plain_lines(tmp_path: Path) -> None:
    """Off a TTY (no --json) the lines are plain text; estimates come from the history file."""
    path = tmp_path / "boots.json"
    BootHistory(path).record("c", {"durations": {"STARTING": 12.0}, "total_s": 12.0})
    out = io.StringIO()
    reporter = make_reporter("c", stream=out, history_path=path)
    assert isinstance(reporter, JsonLinesReporter)  # the same events, as plain lines
    reporter(BootEvent("phase", Phase.STARTING, 2.0))
    assert out.getvalue() == "  boot: STARTING at 2.0 s, about 12 s left\n"


def test_live_view_renders_phases_and_eta() -> None:
    """On a terminal the live view shows each phase, the usual times and the ETA."""
    out = io.StringIO()
    reporter = make_reporter("spark4", stream=out, estimates=ESTIMATES, tty=True)
    assert isinstance(reporter, LiveReporter)
    reporter.width = 100
    with reporter:
        for event in _boot_events()[:50]:
            reporter(event)
        view = out.getvalue()
    text = out.getvalue()
    assert "boot of spark4" in text
    assert "WEIGHTS_LOADING" in text and "KV_CACHE" in text
    assert "ETA" in text and "9m00s" in text  # the usual weights time
    assert view  # something was drawn before close


def test_importing_progress_does_not_import_rich_live() -> None:
    """rich's live display is imported only when a live view is shown."""
    code = (
        "import sys, spark_ops.cli.progress; "
        "print(any(m.startswith('rich.live') for m in sys.modules))"
    )
    res = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert res.stdout.strip() == "False"


async def test_reporter_follows_a_real_wait() -> None:
    """Plugged into wait_for_boot on a real log, the JSON lines list the phases in order."""
    from spark_ops.readiness import wait_for_boot

    log = Path(__file__).parent / "fixtures" / "readiness" / "serve-startup.log"
    lines = log.read_text().splitlines()[:70]

    async def source() -> AsyncIterator[str]:
        """The boot log, then silence."""
        for line in lines:
            yield line
        await asyncio.sleep(3600)

    seen = 0

    async def probe() -> bool:
        """Ready on the third probe."""
        nonlocal seen
        seen += 1
        return seen >= 3

    out = io.StringIO()
    reporter = make_reporter("c", json_lines=True, stream=out, estimates={})
    await wait_for_boot(
        source(), probe=probe, deadline_s=10, on_event=reporter, probe_interval_s=0.05
    )
    reporter.close()
    phases = [json.loads(r)["phase"] for r in out.getvalue().splitlines()]
    assert phases == ["STARTING", "WEIGHTS_LOADING", "WEIGHTS_DONE", "KV_CACHE", "API_UP", "READY"]


ON_A_TERMINAL = """
import sys
from types import SimpleNamespace
from spark_ops.cli.common import step_reporter
from spark_ops.cli.progress import make_reporter
from spark_ops.readiness import BootEvent, Phase

reporter = make_reporter("spark4", estimates={}, tty=True, workers_expected=3)
steps = step_reporter(False)
reporter(BootEvent("phase", Phase.STARTING, 0.0, None, {"expected": ["STARTING", "READY"]}))
reporter(BootEvent("workers", Phase.STARTING, 1.0, "joined", {"joined": 3, "expected": None}))
reporter(BootEvent("phase", Phase.READY, 2.0, None, {"total_s": 2.0}))
# as apply does: the step is reported before the reporter is closed
steps(SimpleNamespace(status="done", name="boot", seconds=2.0, detail="ready in 2 s"))
reporter.close()
print("END", file=sys.stderr)
"""


def _on_a_terminal(code: str) -> str:
    """Run code with stderr on a real pseudo-terminal; what the terminal received, no escapes."""
    import os
    import pty
    import re

    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        stderr=follower, env={**os.environ, "COLUMNS": "100", "TERM": "xterm"},
    )  # fmt: skip
    os.close(follower)
    chunks = []
    while True:
        try:
            data = os.read(leader, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    proc.wait(timeout=60)
    os.close(leader)
    raw = b"".join(chunks).decode("utf-8", "replace")
    assert proc.returncode == 0, raw[-2000:]
    return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07|\r", "", raw)


def test_live_view_ends_its_line_and_counts_the_inventory_workers() -> None:
    """On a real terminal: `ready` and the boot step's `✓ boot` are on lines of their own, and
    the workers line shows the inventory's count, not `3/?`."""
    text = _on_a_terminal(ON_A_TERMINAL)
    assert "3/3 workers joined" in text and "/?" not in text, text
    lines = [line.strip() for line in text.split("\n")]
    assert "ready" in lines, text
    assert any(line.startswith("✓ boot") for line in lines), text
    assert "ready✓" not in text.replace(" ", ""), text
    assert lines.index("ready") < next(i for i, x in enumerate(lines) if x.startswith("✓ boot"))
