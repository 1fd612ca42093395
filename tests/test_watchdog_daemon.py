"""The reference watchdog against a real HTTP engine process, restarted by the `command` action."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from refwatchdog.actions import pid_alive, read_pid, start_detached
from refwatchdog.daemon import Watchdog
from spark_ops.headlib.flock import locked
from spark_ops.watchdog import history
from spark_ops.watchdog.config import load_config
from spark_ops.watchdog.contract import history_source

FAKE_ENGINE = Path(__file__).parent / "fixtures" / "watchdog" / "fake_engine.py"


def free_port() -> int:
    """Pick a free loopback port."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(pred: Callable[[], Any], timeout: float, what: str) -> Any:
    """Poll pred until it returns something truthy, or fail naming what was awaited."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


class Env:
    """A watchdog directory: config, fake engine command, helpers to run spark-watchdog."""

    def __init__(self, root: Path, **probe: Any) -> None:
        """Write a config with small intervals and the command action."""
        self.root = root
        self.port = free_port()
        self.wedge = root / "wedge"
        self.start_argv = [
            sys.executable,
            str(FAKE_ENGINE),
            "--port",
            str(self.port),
            "--wedge-file",
            str(self.wedge),
        ]
        cfg = {
            "engine": {"base_url": f"http://127.0.0.1:{self.port}"},
            "probe": {"interval": 0.3, "timeout": 2, "failures": 3, "grace": 0, **probe},
            "budget": {"max": 2, "window": 3600},
            "paths": {"dir": str(root), "lock_timeout": 10},
            "action": {
                "kind": "command",
                "start": self.start_argv,
                "detach": True,
                "stop_timeout": 5,
                "timeout": 30,
            },
        }
        self.config = root / "watchdog.yaml"
        self.config.write_text(yaml.safe_dump(cfg))
        self.cfg = load_config(self.config)
        self.paths = self.cfg.paths

    def start_engine(self) -> int:
        """Start the engine the way the action does and wait until it serves."""
        pid = start_detached(
            self.start_argv, env=None, log_file=self.paths.engine_log, pid_file=self.paths.pid
        )
        self.wait_serving()
        return pid

    def serving(self) -> bool:
        """Tell whether the engine answers /v1/models."""
        try:
            with urllib.request.urlopen(
                f"http://127.0.0.1:{self.port}/v1/models", timeout=1
            ) as resp:
                return bool(resp.status == 200)
        except OSError:
            return False

    def wait_serving(self) -> None:
        """Wait until the engine serves."""
        wait_for(self.serving, 60, f"the engine on port {self.port}")

    def kill_engine(self) -> int:
        """SIGKILL the engine named by the pid file."""
        pid = read_pid(self.paths.pid)
        assert pid and pid_alive(pid), "engine should be running before the kill"
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: not pid_alive(pid), 10, f"engine {pid} to die")
        return pid

    def stamps(self) -> list[Any]:
        """Stamps in the history."""
        return history.read_history(self.paths.history).stamps()

    def run(self, *args: str, check_rc: int | None = 0) -> tuple[int, dict[str, Any], str]:
        """Run spark-watchdog with this config; return (rc, JSON stdout, stderr)."""
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "refwatchdog.daemon",
                "--config",
                str(self.config),
                *args,
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        if check_rc is not None:
            assert proc.returncode == check_rc, proc.stderr
        out = json.loads(proc.stdout) if proc.stdout.strip().startswith("{") else {}
        return proc.returncode, out, proc.stderr

    def cleanup(self) -> None:
        """Kill whatever engine the pid file names."""
        pid = read_pid(self.paths.pid)
        if pid and pid_alive(pid):
            os.killpg(pid, signal.SIGKILL)


@pytest.fixture
def make_env(tmp_path: Path) -> Iterator[Callable[..., Env]]:
    """Build Env objects and kill their engines afterwards."""
    made: list[Env] = []

    def make(**probe: Any) -> Env:
        """Create one Env."""
        env = Env(tmp_path, **probe)
        made.append(env)
        return env

    yield make
    for env in made:
        env.cleanup()


@pytest.mark.slow
def test_three_kills_two_restarts_then_gave_up(make_env: Callable[..., Env]) -> None:
    """Kill the engine three times: the loop restarts it twice, then stands down with gave-up."""
    env = make_env(grace=6)
    env.start_engine()
    log = open(env.root / "daemon.log", "w")  # noqa: SIM115
    daemon = subprocess.Popen(
        [sys.executable, "-m", "refwatchdog.daemon", "--config", str(env.config)],
        stderr=log,
    )
    try:
        for n in (1, 2):
            old = env.kill_engine()
            wait_for(lambda n=n: len(env.stamps()) == n, 60, f"restart {n}")  # type: ignore[misc]
            wait_for(lambda old=old: read_pid(env.paths.pid) not in (None, old), 30, "new pid")  # type: ignore[misc]
            env.wait_serving()
        env.kill_engine()
        wait_for(lambda: Path(env.paths.gave_up).exists(), 60, "the gave-up file")
        time.sleep(1.5)  # several more cycles: it must stay down
        assert len(env.stamps()) == 2
        assert not env.serving()
        gave_up = json.loads(Path(env.paths.gave_up).read_text())
        assert "budget" in gave_up["reason"] and gave_up["used"] == 2
    finally:
        daemon.send_signal(signal.SIGTERM)
        rc = daemon.wait(30)
        log.close()
    assert rc == 0, (env.root / "daemon.log").read_text()
    records, malformed = history.read_journal(env.paths.journal)
    assert not malformed
    restarts = [r for r in records if r["action"] == "restart"]
    assert [(r["by"], r["forced"]) for r in restarts] == [("watchdog", False)] * 2
    assert all("consecutive probe failures" in r["reason"] for r in restarts)
    logs = [json.loads(line) for line in (env.root / "daemon.log").read_text().splitlines()]
    assert {"restarting", "gave_up", "standing_down"} <= {rec["event"] for rec in logs}
    _, st, _ = env.run("--status", "--json")
    assert st["state"] == "gave-up" and st["used"] == 2 and st["engine"]["alive"] is False


@pytest.mark.slow
def test_pause_suspends_then_resume_restarts(make_env: Callable[..., Env]) -> None:
    """With the pause file, failed probes count nothing (a lease that ends or lapses does not
    leave a restart due at once); once it is gone, the full run of failures restarts."""
    env = make_env()
    Path(env.paths.pause).touch()
    decisions = [env.run("--once")[1]["decision"] for _ in range(3)]
    assert decisions == ["paused"] * 3
    assert env.stamps() == []
    _, st, _ = env.run("--status", "--json")
    assert st["state"] == "paused" and st["consecutive_failures"] == 0
    Path(env.paths.pause).unlink()
    decisions = [env.run("--once")[1]["decision"] for _ in range(2)]
    assert decisions == ["failing", "failing"] and env.stamps() == []
    _, out, _ = env.run("--once")
    assert out["decision"] == "restarted" and len(env.stamps()) == 1
    env.wait_serving()
    assert out["consecutive_failures"] == 0


@pytest.mark.slow
def test_restart_now_force_over_budget(make_env: Callable[..., Env]) -> None:
    """Over budget and gave-up: --restart-now refuses; with --force it restarts and records."""
    env = make_env()
    now = int(time.time())
    Path(env.paths.history).write_text(f"{now - 200}\n{now - 100}\n")
    Path(env.paths.gave_up).write_text('{"reason": "test"}\n')
    first = env.start_engine()
    _, out, _ = env.run("--restart-now", "--reason", "try", check_rc=5)
    assert out["error"] == "refused" and "gave-up" in out["message"]
    Path(env.paths.gave_up).unlink()
    _, out, _ = env.run("--restart-now", check_rc=5)
    assert "budget" in out["message"] and "--force" in out["message"]
    assert len(env.stamps()) == 2 and read_pid(env.paths.pid) == first
    Path(env.paths.gave_up).write_text('{"reason": "test"}\n')
    Path(env.paths.pause).touch()
    _, out, _ = env.run(
        "--restart-now", "--force", "--reason", "max-num-seqs 64", "--by", "spark-ops"
    )
    assert {k: out[k] for k in ("forced", "reason", "by")} == {
        "forced": True,
        "reason": "max-num-seqs 64",
        "by": "spark-ops",
    }
    assert isinstance(out["stamp"], int) and env.stamps()[-1] == out["stamp"]
    assert len(env.stamps()) == 3
    assert out["engine_pid"] == read_pid(env.paths.pid) != first
    assert not pid_alive(first)
    env.wait_serving()
    _, st, _ = env.run("--status", "--json")
    assert st["state"] == "gave-up" and st["used"] == 3 and st["allowed"] == 2
    assert st["stamps"][-1] == {
        "stamp": out["stamp"],
        "reason": "max-num-seqs 64",
        "by": "spark-ops",
        "forced": True,
    }
    assert st["engine"] == {"pid": out["engine_pid"], "alive": True, "pid_file": env.paths.pid}
    assert st["last_restart"]["by"] == "spark-ops"
    # spark-ops' clean-up: prune the planned stamp with history.py over stdin
    proc = subprocess.run(
        [sys.executable, "-", "prune", "--history", env.paths.history, "--planned"],
        input=history_source().encode(),
        capture_output=True,
        timeout=60,
    )
    pruned = json.loads(proc.stdout)
    assert proc.returncode == 0 and [r["stamp"] for r in pruned["removed"]] == [out["stamp"]]
    _, st, _ = env.run("--status", "--json")
    assert st["used"] == 2 and st["state"] == "gave-up"


def test_status_json_shape(make_env: Callable[..., Env]) -> None:
    """--status --json reports every documented key, with an empty history."""
    env = make_env()
    _, st, _ = env.run("--status", "--json")
    assert set(st) >= {
        "state",
        "used",
        "allowed",
        "window",
        "now",
        "stamps",
        "next_free_at",
        "paused",
        "gave_up",
        "engine",
        "last_restart",
        "last_probe",
        "consecutive_failures",
        "history",
    }
    assert st["state"] == "ok" and st["used"] == 0 and st["allowed"] == 2
    assert st["stamps"] == [] and st["last_restart"] is None and st["gave_up"] is None
    assert st["engine"]["alive"] is False and st["next_free_at"] == pytest.approx(st["now"])
    text = subprocess.run(
        [sys.executable, "-m", "refwatchdog.daemon", "--config", str(env.config),
         "--status"],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout  # fmt: skip
    assert text.startswith("state: ok   restarts used: 0/2 in 3600 s") and "(now)" in text


async def test_wedged_engine_fails_probe_though_health_is_200(
    make_env: Callable[..., Env],
) -> None:
    """A wedged engine answers /health but not a completion: the probe fails on its timeout."""
    env = make_env(timeout=0.5)
    env.start_engine()
    dog = Watchdog(env.cfg)
    state = await dog.cycle({})
    assert state["decision"] == "ok" and state["last_probe"]["model"] == "tiny-test-model"
    env.wedge.touch()
    with urllib.request.urlopen(f"http://127.0.0.1:{env.port}/health", timeout=2) as resp:
        assert resp.status == 200
    state = await dog.cycle(state)
    assert state["decision"] == "failing" and "timed out" in state["last_probe"]["error"]
    assert state["consecutive_failures"] == 1
    env.wedge.unlink()
    state = await dog.cycle(state)
    assert state["decision"] == "ok" and state["consecutive_failures"] == 0


async def test_grace_window_ignores_failures(make_env: Callable[..., Env]) -> None:
    """Within the start-up grace after a restart stamp, failures are not counted."""
    env = make_env(grace=3600, failures=1)
    Path(env.paths.history).write_text(f"{int(time.time()) - 10}\n")
    dog = Watchdog(env.cfg)
    state = await dog.cycle({})
    assert state["decision"] == "grace" and state["consecutive_failures"] == 0
    assert len(env.stamps()) == 1


def test_usage_errors(make_env: Callable[..., Env], tmp_path: Path) -> None:
    """Bad combinations and a bad config exit 2 with a message naming the problem."""
    env = make_env()
    _, _, err = env.run("--force", check_rc=2)
    assert "--force only goes with --restart-now" in err
    bad = tmp_path / "bad.yaml"
    bad.write_text("probe: {failures: 0}\naction: {kind: command, start: 'true'}\n")
    proc = subprocess.run(
        [sys.executable, "-m", "refwatchdog.daemon", "--config", str(bad), "--status"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and "probe.failures" in proc.stderr and str(bad) in proc.stderr


def test_second_instance_refused(make_env: Callable[..., Env]) -> None:
    """Only one run loop per state file: a second one exits 3 naming the lock."""
    env = make_env()
    lock = env.paths.state + ".lock"
    with locked(lock):
        _, out, err = env.run(check_rc=3)
    assert out["error"] == "lock_timeout" and lock in out["message"] and lock in err


@pytest.mark.slow
def test_recipe_action_with_sim_engine(tmp_path: Path) -> None:
    """spark-watchdog with the recipe action runs the simulated vLLM engine and restarts it."""
    port = free_port()
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        "name: sim\nmodel: tiny-model\nenv:\n  SPARK_TEST_MARK: '1'\n"
        f"defaults:\n  port: {port}\n  host: 127.0.0.1\n"
        f"command: |\n  {sys.executable} -m spark_ops.sim.engine serve tiny-model \\\n"
        "      --host {host} --port {port} --max-num-seqs 8\n"
    )
    config = tmp_path / "watchdog.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "engine": {"base_url": f"http://127.0.0.1:{port}"},
                "probe": {"interval": 0.3, "timeout": 5, "failures": 2, "grace": 0},
                "paths": {"dir": str(tmp_path / "state")},
                "action": {"kind": "recipe", "recipe": str(recipe), "stop_timeout": 10},
            }
        )
    )
    cfg = load_config(config)

    def run(*args: str) -> dict[str, Any]:
        """Run spark-watchdog and parse its JSON."""
        proc = subprocess.run(
            [sys.executable, "-m", "refwatchdog.daemon", "--config", str(config), *args],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        return dict(json.loads(proc.stdout))

    def completes() -> bool:
        """Tell whether the engine serves a completion."""
        req = urllib.request.Request(
            f"http://127.0.0.1:{port}/v1/completions",
            data=json.dumps({"model": "tiny-model", "prompt": "hi", "max_tokens": 5}).encode(),
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(req, timeout=5) as resp:
                return bool(resp.status == 200)
        except OSError:
            return False

    try:
        out = run("--restart-now", "--force", "--reason", "first start", "--by", "spark-ops:test")
        assert out["ok"] and out["engine_pid"] == read_pid(cfg.paths.pid)
        wait_for(completes, 90, "the sim engine to serve")
        first = out["engine_pid"]
        os.kill(first, signal.SIGKILL)
        decisions = [run("--once")["decision"] for _ in range(2)]
        assert decisions == ["failing", "restarted"]
        wait_for(completes, 90, "the restarted sim engine to serve")
        st = run("--status", "--json")
        assert st["used"] == 2 and st["engine"]["alive"] and st["engine"]["pid"] != first
        assert [s["by"] for s in st["stamps"]] == ["spark-ops:test", "watchdog"]
        assert "Application startup complete" in Path(cfg.paths.engine_log).read_text()
    finally:
        pid = read_pid(cfg.paths.pid)
        if pid and pid_alive(pid):
            os.killpg(pid, signal.SIGKILL)


async def test_failures_during_another_process_restart_are_not_counted(
    make_env: Callable[..., Env],
) -> None:
    """While a `--restart-now` of another process holds the action lock (a sparkrun relaunch
    takes longer than the grace), a failing probe is "restarting", never a step to giving up;
    the grace then runs from the end of that action."""
    env = make_env(grace=60, failures=2)
    Path(env.paths.history).write_text(f"{int(time.time()) - 3600}\n")  # grace long over
    dog = Watchdog(env.cfg)
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT); "
         "fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); time.sleep(60)",
         dog.action_lock],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        os.utime(dog.action_lock, (0, 0))  # an old lock file: no grace from it
        state = await dog.cycle({})
        assert state["decision"] == "restarting" and state["consecutive_failures"] == 0
    finally:
        holder.kill()
        holder.wait()
    assert not os.path.exists(env.paths.gave_up) and len(env.stamps()) == 1
    state = await dog.cycle(state)
    assert state["decision"] == "failing", "the lock released, an old action: no grace"
    os.utime(dog.action_lock)  # what restart() does when its action ends
    state = await dog.cycle({})
    assert state["decision"] == "grace"


def test_the_loop_follows_an_edit_of_its_budget(tmp_path: Path) -> None:
    """A running watchdog counts against its config file's budget as it is now (what --status,
    --restart-now and spark-ops' gate read), by content (an edit that keeps the mtime, as `cp -p`
    does, counts too); an edit that is invalid, or has no `budget:` (caught mid-write), keeps the
    budget in force."""
    env = Env(tmp_path)
    dog = Watchdog(env.cfg, loop_started=time.time())
    assert dog.budget()["allowed"] == 2
    text = env.config.read_text()
    mtime = env.config.stat().st_mtime_ns
    for written, allowed in (
        (text.replace("max: 2", "max: 3"), 3),
        (text.replace("max: 2", "max: zero"), 3),
        (text.split("budget:")[0], 3),  # the file caught while rewritten, before its budget
        (text.replace("max: 2", "").replace("window: 3600", ""), 3),  # `budget: {}` or null
        (text.replace("window: 3600", ""), 3),  # cut after max: no window of its own
        ("", 3),
        (text.replace("max: 2", "max: 1"), 1),
    ):
        env.config.write_text(written)
        os.utime(env.config, ns=(mtime, mtime))  # the same mtime every time
        assert dog.budget()["allowed"] == allowed, written


def test_a_config_turned_directory_keeps_the_budget_and_leaks_nothing(tmp_path: Path) -> None:
    """The config replaced by a directory (or a FIFO): the loop keeps the budget in force, opens
    nothing it does not close, and never waits."""
    env = Env(tmp_path)
    dog = Watchdog(env.cfg, loop_started=time.time())
    env.config.unlink()
    env.config.mkdir()
    fds = len(os.listdir("/proc/self/fd"))
    for _ in range(20):
        assert dog.budget()["allowed"] == 2
    env.config.rmdir()
    os.mkfifo(env.config)
    assert dog.budget()["allowed"] == 2
    assert len(os.listdir("/proc/self/fd")) == fds
