"""`bench` in a pseudo-terminal on the embedded cluster: what a person sees (issue 21).

The command runs under pexpect in an 80x24 terminal; its output is fed to pyte (a VT100
emulator), and the assertions read the emulated screen: the live line (level, repeat, run, ETA)
while the sweep runs, the level lines it leaves, Ctrl-C keeping the finished levels with the
command that continues them, and `--resume` running only what was missing.
"""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path

import pytest
from conftest import Sim

pexpect = pytest.importorskip("pexpect")
pyte = pytest.importorskip("pyte")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]
SWEEP = ["--concurrency", "1,2,4", "--repeats", "2", "--output-tokens", "300"]


class Terminal:
    """A command in an 80x24 pseudo-terminal, its output rendered by a terminal emulator."""

    def __init__(self, args: list[str], env: dict[str, str]) -> None:
        """Spawn `python -m spark_ops.cli.main ARGS` in the terminal."""
        self.screen = pyte.Screen(80, 24)
        self.stream = pyte.ByteStream(self.screen)
        self.seen: list[str] = []  # every screen shown, for the failure message
        self.child = pexpect.spawn(
            sys.executable, ["-m", "spark_ops.cli.main", *args], env=env, dimensions=(24, 80)
        )

    def text(self) -> str:
        """What the screen shows now, one line per row, right spaces stripped."""
        return "\n".join(line.rstrip() for line in self.screen.display)

    def pump(self) -> bool:
        """Feed what the command wrote since; False once it has ended."""
        try:
            data = self.child.read_nonblocking(65536, timeout=0.2)
        except pexpect.TIMEOUT:
            return True
        except pexpect.EOF:
            return False
        self.stream.feed(data)
        self.seen.append(self.text())
        return True

    def wait_for(self, pattern: str, timeout: float = 90.0) -> re.Match[str]:
        """Pump until the screen matches `pattern` (a regex); its match."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            alive = self.pump()
            found = re.search(pattern, self.text())
            if found:
                return found
            if not alive:
                break
        raise AssertionError(f"{pattern!r} never on screen; last screen:\n{self.text()}")

    def finish(self) -> int:
        """Pump until the command ends; its exit status."""
        while self.pump():
            pass
        self.child.close()
        return int(self.child.exitstatus if self.child.exitstatus is not None else -1)


def test_progress_then_ctrl_c_keeps_levels_and_resume_continues(
    sim: Sim, cli_env: dict[str, str], tmp_path: Path
) -> None:
    """The live line names level, repeat, run and ETA; Ctrl-C keeps levels; --resume ends it."""
    env = {**cli_env, "HOME": str(tmp_path), "TERM": "xterm-256color"}
    env.pop("COLUMNS", None)
    term = Terminal(["bench", *SWEEP], env)
    # the first run: where the sweep is, and no ETA yet (nothing finished to time it by)
    term.wait_for(r"bench: level C=1 \(1/3\) · repeat 1/2\n.* run 1/6 · elapsed \d+s · ETA unknown")
    # a run later: an ETA from the runs timed so far (a lower bound while higher levels remain)
    term.wait_for(r"level C=1 \(1/3\) · repeat 2/2\n.* run 2/6 · elapsed \d+s · ETA at least \d+s")
    term.wait_for(r"C=1: \d+ tok/s aggregate, [\d.]+ tok/s per user, 0 errors")
    term.child.sendintr()  # Ctrl-C as a person types it
    status = term.finish()
    screen = term.text()
    assert status == 9, screen  # ExitStatus.ABORTED
    assert "bench: level" not in screen, "the live line is gone once the sweep stops"
    found = re.search(r"interrupted: (\d) of 3 level\(s\) finished \(([\d,]+)\), kept in", screen)
    assert found, screen
    kept = int(found.group(1))
    assert found.group(2) == ",".join(["1", "2", "4"][:kept])
    assert "Traceback" not in screen
    partial = next((tmp_path / ".local" / "state" / "spark-ops").glob("bench-*.partial.json"))
    data = json.loads(partial.read_text())
    assert [lv["max_concurrency"] for lv in data["levels"]] == [1, 2, 4][:kept]
    assert "continue with:" in screen and "--resume" in screen

    again = Terminal(["bench", *SWEEP, "--resume", str(partial)], env)
    again.wait_for(r"C=1: \d+ tok/s aggregate.*\(kept, not run again\)")
    if kept < 3:  # the run picks up at the first missing level
        again.wait_for(rf"bench: level C={[1, 2, 4][kept]} \({kept + 1}/3\) · repeat 1/2")
    assert again.finish() == 0, again.text()
    final = again.text()
    assert re.search(r"│\s+4 │", final), final  # the table has every level
    assert not partial.exists(), "a finished sweep removes its partial file"


def test_piped_bench_writes_no_live_view(sim: Sim, cli_env: dict[str, str], tmp_path: Path) -> None:
    """Off a terminal: one line per level on stderr, no escape codes, JSON on stdout (--json)."""
    import subprocess

    env = {**cli_env, "HOME": str(tmp_path)}
    res = subprocess.run(
        [sys.executable, "-m", "spark_ops.cli.main", "bench", *SWEEP[:2], "--repeats", "1",
         "--output-tokens", "20", "--json"],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert "\x1b[" not in res.stderr and "bench: level" not in res.stderr
    assert [line.split(":")[0] for line in res.stderr.splitlines() if line.startswith("C=")] == [
        "C=1",
        "C=2",
        "C=4",
    ]
    data = json.loads(res.stdout)  # stdout is the JSON document alone
    assert [lv["max_concurrency"] for lv in data["levels"]] == [1, 2, 4]
