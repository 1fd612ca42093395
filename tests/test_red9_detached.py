"""The red team of 2026-12-06, round 9: the detached restart (remote/programs/watchdog.py).

`DETACHED_RESTART` runs the inventory's restart command in a session of its own, its output in two
files of $TMPDIR, and gives back that output and its exit code. Run here on a real bash as the
head's login shell runs it (no SSH), and once on an embedded node for the deadline's message:
- a command that leaves a process writing to its output (an engine started in the background
  without redirecting it) must not have its output written into a removed file for ever;
- a $TMPDIR where no file can be made or grow (missing, a file, full) must not stop or tear the
  restart: it runs as a plain command did before the change;
- the restart command's deadline names the restart command, not the program around it;
- hostile command text runs exactly as the plain command did (quotes, `$()`, `;`, `&`, newlines).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from spark_ops.errors import CommandTimeout
from spark_ops.inventory import Cluster
from spark_ops.remote import ClusterSession
from spark_ops.remote.programs.watchdog import DETACHED_RESTART

BASH = shutil.which("bash") or "/bin/bash"


def _shell(
    line: str, home: Path, tmpdir: str, prefix: str = ""
) -> subprocess.CompletedProcess[str]:
    """Run one command line as the head's login shell does (`bash -c LINE`, SHELL set)."""
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(home), "LC_ALL": "C.UTF-8",
        "SHELL": BASH, "TMPDIR": tmpdir,
    }  # fmt: skip
    return subprocess.run(
        [BASH, "-c", prefix + line], cwd=home, env=env, capture_output=True, text=True,
        timeout=60, check=False,
    )  # fmt: skip


def _kept(tmp: Path) -> list[str]:
    """The restart output files left in a directory."""
    return sorted(p.name for p in tmp.glob("spark-ops-restart.*"))


HELD = [
    "echo \"it's\" '$(touch PWNED)' $(echo sub) `echo tick` {a,b}",
    "echo one\necho two",
    "echo a; false",
    "echo a & wait; echo b >&2; exit 66",
    "set -e; echo out; echo err >&2; exit 3",
    "cat; echo read-nothing",  # stdin: /dev/null both ways
]


@pytest.mark.parametrize("command", HELD)
def test_a_command_runs_detached_as_it_ran_plainly(tmp_path: Path, command: str) -> None:
    """The command's output, error output and exit code are those of the plain command."""
    plain = subprocess.run(
        [BASH, "-c", command], cwd=tmp_path, capture_output=True, text=True, check=False,
        stdin=subprocess.DEVNULL, env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
    )  # fmt: skip
    res = _shell(DETACHED_RESTART.line(command), tmp_path, str(tmp_path))
    assert (res.returncode, res.stdout, res.stderr) == (
        plain.returncode, plain.stdout, plain.stderr,
    )  # fmt: skip
    assert _kept(tmp_path) == [], "no output file is left"
    assert not (tmp_path / "PWNED").exists()


def test_a_process_left_writing_keeps_its_output_files(tmp_path: Path) -> None:
    """An engine the command starts in the background without redirecting it still writes to the
    restart's output: the files stay (the operator can read and remove them), never removed
    while written, where they would grow out of sight until the engine stops."""
    command = 'sleep 30 & echo $! > "$HOME/pid"; echo started'
    res = _shell(DETACHED_RESTART.line(command), tmp_path, str(tmp_path))
    try:
        assert (res.returncode, res.stdout) == (0, "started\n")
        kept = _kept(tmp_path)
        assert len(kept) == 2, f"the files written by the engine were removed: {kept}"
        assert all(name in res.stderr for name in kept), res.stderr
    finally:
        os.kill(int((tmp_path / "pid").read_text()), signal.SIGTERM)


@pytest.mark.parametrize(
    ("where", "prefix"),
    [("missing", ""), ("a-file", ""), ("full", "ulimit -f 0; ")],  # full: no file can grow
)
def test_no_room_for_the_output_runs_the_restart_plainly(
    tmp_path: Path, where: str, prefix: str
) -> None:
    """A $TMPDIR that is missing, a file or full neither refuses the restart (exit 66, the
    restart never run) nor tears it (a `set -e` restart whose echo fails after the stop)."""
    tmpdir = tmp_path / "tmp"
    if where == "a-file":
        tmpdir.write_text("")
    elif where == "full":
        tmpdir.mkdir()
    command = 'set -e; echo stopping; touch "$HOME/started"; echo started'
    res = _shell(DETACHED_RESTART.line(command), tmp_path, str(tmpdir), prefix)
    assert (res.returncode, res.stdout) == (0, "stopping\nstarted\n"), res.stderr
    assert (tmp_path / "started").exists(), "the restart ran to its end"


async def test_the_deadline_names_the_restart_command(one_node: Cluster) -> None:
    """A restart command past its deadline is named as the operator wrote it (the label), not
    as the program that runs it detached."""
    command = "sleep 1; /opt/restart-vllm --reason 'x'"
    line = "TMPDIR=$HOME " + DETACHED_RESTART.line(command)  # it runs on: its files in the test's
    async with ClusterSession(one_node) as s:
        await s.connect([one_node.head.name])
        with pytest.raises(CommandTimeout) as err:
            await s.run(one_node.head.name, line, timeout=0.5, label=command)
    assert command in err.value.message
    assert "mktemp" not in err.value.message
