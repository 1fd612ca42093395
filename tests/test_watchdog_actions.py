"""Restart actions with real processes: recipe, launcher, systemd, docker, command, stop."""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

from refwatchdog.actions import (
    ActionError,
    group_members,
    pid_alive,
    read_pid,
    restart_engine,
    start_detached,
    stop_engine,
)
from spark_ops.watchdog.config import WatchdogConfig, parse_config

FAKE_ENGINE = Path(__file__).parent / "fixtures" / "watchdog" / "fake_engine.py"


def make_cfg(tmp_path: Path, action: dict) -> WatchdogConfig:
    """Parse a config with the given action and paths under tmp_path."""
    return parse_config(
        {"paths": {"dir": str(tmp_path)}, "action": action}, source=str(tmp_path / "w.yaml")
    )


def script(path: Path, body: str) -> Path:
    """Write an executable shell script."""
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def wait_until(pred: Callable[[], object], timeout: float = 30) -> bool:
    """Poll pred until true or timeout."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.05)
    return False


def test_recipe_action_starts_detached_engine(tmp_path: Path) -> None:
    """The recipe action starts argv+env in a new session; a second run replaces the engine."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        "name: test\nenv:\n  SPARK_TEST_MARK: from-recipe\ndefaults:\n"
        f"  port: {port}\ncommand: |\n  {sys.executable} {FAKE_ENGINE} \\\n    --port {{port}}\n"
    )
    cfg = make_cfg(tmp_path, {"kind": "recipe", "recipe": str(recipe), "stop_timeout": 5})
    first = restart_engine(cfg.action, cfg.paths)
    try:
        assert first.ok, first.error
        pid = first.engine_pid
        assert pid is not None
        assert pid == read_pid(cfg.paths.pid) and pid_alive(pid)
        assert os.getsid(pid) == pid, "the engine leads its own session (survives SSH hang-up)"
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        assert b"SPARK_TEST_MARK=from-recipe" in environ
        assert os.readlink(f"/proc/{pid}/fd/0") == os.devnull
        assert wait_until(lambda: b"fake engine pid" in Path(cfg.paths.engine_log).read_bytes())
        url = f"http://127.0.0.1:{port}/v1/models"

        def serving() -> bool:
            """Tell whether the engine answers."""
            try:
                with urllib.request.urlopen(url, timeout=1):
                    return True
            except OSError:
                return False

        assert wait_until(serving)
        second = restart_engine(cfg.action, cfg.paths)
        assert second.ok and second.steps[0]["result"] == "terminated"
        assert not pid_alive(pid) and second.engine_pid != pid
    finally:
        for result in (first, locals().get("second")):
            if result is not None and result.engine_pid and pid_alive(result.engine_pid):
                os.killpg(result.engine_pid, 9)


def test_recipe_action_reports_render_error(tmp_path: Path) -> None:
    """A recipe that cannot render is a failed result naming the recipe, not an exception."""
    recipe = tmp_path / "bad.yaml"
    recipe.write_text("name: x\n")
    cfg = make_cfg(tmp_path, {"kind": "recipe", "recipe": str(recipe)})
    result = restart_engine(cfg.action, cfg.paths)
    assert (
        not result.ok and "bad.yaml" in (result.error or "") and "command" in (result.error or "")
    )


def test_stop_kills_group_and_ignores_term(tmp_path: Path) -> None:
    """Stop SIGTERMs the whole group; a group ignoring SIGTERM is SIGKILLed after the timeout."""
    pid_file, log = str(tmp_path / "pid"), str(tmp_path / "log")
    pid = start_detached(
        ["/bin/sh", "-c", "sleep 60 & sleep 60 & wait"], env=None, log_file=log, pid_file=pid_file
    )
    assert wait_until(
        lambda: len([p for p in os.listdir("/proc") if p.isdigit() and _pgid(p) == pid]) >= 3
    )
    step = stop_engine(pid_file, 5)
    assert step["result"] == "terminated" and not pid_alive(pid)
    assert not [
        p for p in os.listdir("/proc") if p.isdigit() and _pgid(p) == pid and pid_alive(int(p))
    ]
    stubborn = start_detached(
        [
            sys.executable,
            "-c",
            "import signal,time; signal.signal(signal.SIGTERM, lambda *a: print('term',"
            " flush=True)); print('up', flush=True); time.sleep(60)",
        ],
        env=None,
        log_file=log,
        pid_file=pid_file,
    )
    assert wait_until(lambda: b"up" in Path(log).read_bytes())
    step = stop_engine(pid_file, 0.5)
    assert step["result"] == "killed" and not pid_alive(stubborn)
    # the order of events, not a duration: SIGTERM came first, was survived, then SIGKILL
    assert Path(log).read_bytes().endswith(b"up\nterm\n"), Path(log).read_bytes()[-200:]
    assert stop_engine(pid_file, 1)["result"] == "not running"
    # the leader dies, its workers live on: the next stop still ends them
    leader = start_detached(
        ["/bin/sh", "-c", "sleep 60 & sleep 60 & echo started; wait"],
        env=None,
        log_file=log,
        pid_file=pid_file,
    )
    assert wait_until(lambda: b"started" in Path(log).read_bytes())
    assert wait_until(lambda: len(group_members(leader)) >= 3)
    os.kill(leader, 9)
    assert wait_until(lambda: not pid_alive(leader)) and group_members(leader)
    step = stop_engine(pid_file, 5)
    assert step["result"] == "orphans terminated" and group_members(leader) == []


def _pgid(pid: str) -> int | None:
    """Process group of a pid, or None."""
    try:
        return os.getpgid(int(pid))
    except OSError:
        return None


def test_launcher_action(tmp_path: Path) -> None:
    """launcher: ./launch-cluster.sh stop, then ./run-recipe.py RECIPE -d, in the configured dir."""
    calls = tmp_path / "calls"
    script(tmp_path / "launch-cluster.sh", f'echo "launch $*" >> {calls}\n')
    script(tmp_path / "run-recipe.py", f'echo "run $*" >> {calls}\n')
    cfg = make_cfg(tmp_path, {"kind": "launcher", "workdir": str(tmp_path), "recipe": "glm-5.3"})
    result = restart_engine(cfg.action, cfg.paths)
    assert result.ok, result.error
    assert calls.read_text() == "launch stop\nrun glm-5.3 -d\n"
    assert [s["rc"] for s in result.steps] == [0, 0]


def test_launcher_failure_stops_sequence(tmp_path: Path) -> None:
    """A failing stop step ends the restart with an error naming the command and exit code."""
    script(tmp_path / "launch-cluster.sh", "echo nope; exit 7\n")
    script(tmp_path / "run-recipe.py", f"touch {tmp_path}/ran\n")
    cfg = make_cfg(tmp_path, {"kind": "launcher", "workdir": str(tmp_path), "recipe": "r"})
    result = restart_engine(cfg.action, cfg.paths)
    assert not result.ok and "./launch-cluster.sh stop exited 7" in (result.error or "")
    assert not (tmp_path / "ran").exists()
    assert "nope" in Path(cfg.paths.engine_log).read_text()


@pytest.mark.parametrize(
    ("action", "tool", "expected"),
    [
        ({"kind": "systemd", "unit": "vllm.service"}, "systemctl", "restart vllm.service"),
        (
            {"kind": "docker", "container": "vllm-head", "stop_timeout": 42},
            "docker",
            "restart -t 42 vllm-head",
        ),
    ],
)
def test_systemd_and_docker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, action: dict, tool: str, expected: str
) -> None:
    """systemd and docker actions call their tool, then ask it for the engine pid."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    calls = tmp_path / "calls"
    script(bindir / tool, f'echo "$*" >> {calls}\ncase "$1" in show|inspect) echo 4242;; esac\n')
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")
    cfg = make_cfg(tmp_path, action)
    result = restart_engine(cfg.action, cfg.paths)
    assert result.ok, result.error
    assert calls.read_text().splitlines()[0] == expected
    assert result.engine_pid == 4242


def test_command_timeout(tmp_path: Path) -> None:
    """A command that outlives action.timeout is killed with its group and reported: both of
    its sleeps (each writes its pid; they would run for 10 minutes) are killed. Both pids written
    before the timeout is a count, not a speed: on a loaded machine the timeout doubles until
    they are."""
    pids, timeout = tmp_path / "pids", 0.5
    one = f"sh -c 'echo $$ >> {pids}; exec sleep 600'"
    while True:
        pids.write_text("")
        cfg = make_cfg(
            tmp_path,
            {"kind": "command", "stop": "true", "start": f"{one} & {one}", "timeout": timeout},
        )
        result = restart_engine(cfg.action, cfg.paths)
        assert not result.ok and f"timed out after {timeout:g} s" in (result.error or "")
        started = [int(x) for x in pids.read_text().split()]
        gone = lambda these=tuple(started): not any(pid_alive(p) for p in these)  # noqa: E731
        assert wait_until(gone), "the group was killed"
        if len(started) == 2 or timeout > 60:
            break
        timeout *= 2
    assert len(started) == 2, started
    print(f"reached: both sleeps started within a {timeout:g} s timeout")


def test_command_missing_program(tmp_path: Path) -> None:
    """A start program that does not exist is a failed result naming it."""
    cfg = make_cfg(tmp_path, {"kind": "command", "start": ["/nonexistent/engine"]})
    result = restart_engine(cfg.action, cfg.paths)
    assert not result.ok and "/nonexistent/engine" in (result.error or "")


def test_detached_survives_parent(tmp_path: Path) -> None:
    """An engine started by a short-lived process (like an SSH session) outlives it."""
    pid_file = tmp_path / "pid"
    code = (
        "from refwatchdog.actions import start_detached;"
        f"start_detached(['sleep', '30'], env=None, log_file={str(tmp_path / 'log')!r},"
        f" pid_file={str(pid_file)!r})"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
    pid = read_pid(str(pid_file))
    try:
        assert pid and pid_alive(pid) and os.getsid(pid) == pid
    finally:
        if pid:
            os.kill(pid, 9)


def _bystander() -> subprocess.Popen[bytes]:
    """An operator's process in its own session (what a stale pid file may name)."""
    return subprocess.Popen(["sleep", "300"], start_new_session=True)


def test_a_pid_file_naming_another_process_is_never_signalled(tmp_path: Path) -> None:
    """Red team R3: the pid file names a live process the watchdog did not start (written by
    hand, or a number reused after the engine died): never signalled, its group alive."""
    pid_file = tmp_path / "engine.pid"
    other = _bystander()
    try:
        pid_file.write_text(f"{other.pid}\n")  # written after it started: someone's claim
        with pytest.raises(ActionError, match="is not the engine"):
            stop_engine(str(pid_file), 1)
        cfg = make_cfg(tmp_path, {"kind": "command", "start": ["sleep", "301"], "detach": True})
        result = restart_engine(cfg.action, cfg.paths)
        assert not result.ok and "sleep 300" in (result.error or "")
        assert read_pid(cfg.paths.pid) == other.pid  # no engine started over it
        # the engine died and its number was taken later: the engine is gone, nothing signalled
        old = time.time() - 3600
        os.utime(pid_file, (old, old))
        step = stop_engine(str(pid_file), 1)
        assert step["result"].startswith("not running (reused: pid")
        assert other.poll() is None and pid_alive(other.pid)
    finally:
        other.kill()
        other.wait()


def test_the_engine_is_known_by_its_mark_or_its_command_line(tmp_path: Path) -> None:
    """An engine this watchdog started carries its mark; one started otherwise, the command
    line its action starts: each is stopped; the same program with other arguments is not."""
    pid_file = str(tmp_path / "engine.pid")
    marked = start_detached(
        ["sleep", "302"], env=None, log_file=str(tmp_path / "l"), pid_file=pid_file
    )
    old = time.time() - 3600  # a clock stepped forward since: its mark still tells
    os.utime(pid_file, (old, old))
    assert stop_engine(pid_file, 5, ["sleep", "999"])["result"] == "terminated"
    assert not pid_alive(marked)
    same = subprocess.Popen(["sleep", "303"], start_new_session=True)
    try:
        Path(pid_file).write_text(f"{same.pid}\n")
        with pytest.raises(ActionError, match="does not run the command its action starts"):
            stop_engine(pid_file, 5, ["sleep", "304"])
        assert stop_engine(pid_file, 5, ["sleep", "303"])["result"] == "terminated"
        assert same.wait(timeout=10) is not None
    finally:
        same.kill()
        same.wait()
