"""What a person sees in a terminal: `apply` asked, followed and interrupted during the boot.

The CLI runs in a real pseudo-terminal (pexpect); its bytes are rendered by a terminal emulator
(pyte) into the screen a person would read, and the assertions are about that screen: the
question, the live boot table, the interruption's report, and no half-erased frames left behind.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pexpect
import pyte
import pytest
from conftest import Sim, start_sim

from spark_ops.errors import ExitStatus

pytestmark = pytest.mark.slow

ROWS, COLS = 200, 120  # tall enough that nothing this run prints scrolls away


class Terminal:
    """A CLI in a pseudo-terminal, rendered as the screen a person reads."""

    def __init__(self, env: dict[str, str], *args: str) -> None:
        """Start `spark-ops ARGS` in a pty of ROWS x COLS."""
        self.screen = pyte.Screen(COLS, ROWS)
        self.stream = pyte.ByteStream(self.screen)
        env = {**env, "TERM": "xterm-256color", "COLUMNS": str(COLS), "LINES": str(ROWS)}
        self.child = pexpect.spawn(
            sys.executable, ["-m", "spark_ops.cli.main", *args], env=env, dimensions=(ROWS, COLS)
        )

    def pump(self, seconds: float = 0.2) -> None:
        """Feed what the program wrote within `seconds` to the emulator."""
        try:
            data = self.child.read_nonblocking(65536, timeout=seconds)
        except (pexpect.TIMEOUT, pexpect.EOF):
            return
        self.stream.feed(data)

    def text(self) -> str:
        """The screen as text, trailing blanks and empty lines dropped."""
        return "\n".join(line.rstrip() for line in self.screen.display).rstrip()

    def wait_for(self, seen: Callable[[str], bool], what: str, deadline_s: float = 180) -> str:
        """Pump until `seen(screen)` holds; fail with the screen if the deadline passes first."""
        end = time.monotonic() + deadline_s
        while time.monotonic() < end:
            self.pump()
            if seen(self.text()):
                return self.text()
            if not self.child.isalive():
                self.pump()
                if seen(self.text()):
                    return self.text()
                break
        raise AssertionError(f"never saw {what}; the screen:\n{self.text()}")

    def finish(self, deadline_s: float = 180) -> int:
        """Read until the program exits; its exit status."""
        end = time.monotonic() + deadline_s
        while self.child.isalive() and time.monotonic() < end:
            self.pump()
        self.pump()
        self.child.close()
        assert self.child.exitstatus is not None, f"still running or killed:\n{self.text()}"
        return int(self.child.exitstatus)


@pytest.fixture
def slow_sim(tmp_path: Path) -> Iterator[Sim]:
    """An embedded cluster whose boot lasts seconds, as the README's demo does (time scale 1)."""
    from spark_ops.sim.control import down

    s = start_sim(tmp_path / "sim", time_scale=1.0)
    try:
        yield s
    finally:
        down(s.root)


def test_apply_interrupted_during_the_boot_as_a_person_sees_it(slow_sim: Sim) -> None:
    """Asked, answered, followed live, Ctrl-C: one clean table, then where the cluster stands."""
    env = {**os.environ, "SPARK_OPS_INVENTORY": str(slow_sim.inventory)}
    env.pop("SPARK_OPS_CLUSTER", None)
    env.pop("SPARK_OPS_FLEET", None)
    term = Terminal(env, "apply", "--max-num-seqs", "64")
    screen = term.wait_for(lambda s: "Proceed? [y/N]" in s, "the question")
    assert "max_num_seqs: 6 -> 64" in screen and "+  max_num_seqs: 64" in screen, screen
    assert "Steps:" in screen and "remove exactly the stamp" in screen, screen
    term.child.send(b"y\r")
    term.wait_for(lambda s: "▶  WEIGHTS_LOADING" in s, "the boot table at WEIGHTS_LOADING")
    term.child.sendintr()
    status = term.finish()
    screen = term.text()
    assert status == ExitStatus.ABORTED, screen
    after = screen.split("Proceed? [y/N]", 1)[1]
    assert after.count("boot of ") == 1, f"a half-erased frame of the live table is left:\n{after}"
    assert after.count("phase") == 1, after
    assert "error: interrupted (SIGINT) at the boot step" in after, after
    for line in ("recipe:", "engine:", "planned stamp:", "checks:", "next:"):
        assert f"    {line}" in after, f"{line!r} missing from the report:\n{after}"
    # the stamp its restart wrote was still removed, and the screen says so where it happened
    assert "✓ prune" in after and "removed" in after, after
    assert "Traceback" not in screen, screen
    # each report line starts a line of its own, not glued to the boot's last log line
    starts = [line.split(" ", 1)[0] for line in after.splitlines()]
    assert "error:" in starts and "✓" in starts, after
