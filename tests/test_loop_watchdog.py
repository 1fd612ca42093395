"""A watchdog that only loops (tests/fixtures/loopdog/loop-watchdog.sh, written from the community
kind's behaviour) on the embedded cluster, in place of the reference watchdog: apply and restart
leave its history exact (the launcher's restart writes no stamp, the loop is paused meanwhile), a
wedged engine is restarted by the loop itself (its stamp kept), a crash is left alone (status says
so, and names the command that brings the engine back), a stamp the loop writes because of a
planned restart is pruned exactly; pause, gave-up and grace as the script has them. With the
engine run as ranks without Ray, apply under the loop leaves its history exact too."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from conftest import Sim, start_sim
from crash.harness import pids_running
from test_e2e_watchdog import engine_pid, serving, spark_ops, wait_for

from spark_ops.errors import ExitStatus

pytestmark = pytest.mark.slow

FIXTURES = Path(__file__).parent / "fixtures" / "loopdog"
SCRIPT = FIXTURES / "loop-watchdog.sh"
LAUNCHER = FIXTURES / "launcher.py"
RECIPE = "~/recipes/glm-5.3-flash-sim.yaml"


@dataclass
class Loop:
    """The loop watchdog running on the embedded cluster's head, and its files."""

    sim: Sim
    proc: subprocess.Popen[bytes]
    dir: Path
    inventory: Path

    @property
    def stamps(self) -> Path:
        """Its restart history (appended without a lock)."""
        return self.dir / "restarts"

    @property
    def pause(self) -> Path:
        """Its pause file."""
        return self.dir / "pause"

    @property
    def gave_up(self) -> Path:
        """Its gave-up file."""
        return self.dir / "gave-up"

    @property
    def log(self) -> Path:
        """What it says, a line per decision."""
        return self.dir / "loop.log"

    def said(self, words: str) -> int:
        """How many lines of its log hold these words."""
        text = self.log.read_text() if self.log.exists() else ""
        return sum(words in line for line in text.splitlines())

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        """spark-ops against the embedded cluster with the loop's inventory."""
        return spark_ops(self.sim, "-i", str(self.inventory), *args)


def _daemon(sim: Sim) -> int:
    """The pid of the reference watchdog the embedded cluster started."""
    pids = pids_running("refwatchdog.daemon", sim.root)
    assert pids, "the embedded cluster's reference watchdog is not running"
    return pids[0]


def _environ(pid: int) -> dict[str, str]:
    """A process's environment."""
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(e.decode().split("=", 1) for e in raw if b"=" in e)


def _gone(pid: int) -> bool:
    """True once a process has exited (a zombie counts as gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in "ZX"
    except OSError:
        return True


def start_loop(
    sim: Sim, where: Path, *, grace: float = 8.0, pause: bool = True, **env: str
) -> Loop:
    """Replace the reference watchdog with the loop, and write the inventory that describes it."""
    daemon = _daemon(sim)
    head_env = _environ(daemon)  # the head's environment, as the embedded cluster gives it
    os.kill(daemon, signal.SIGTERM)
    wait_for(lambda: _gone(daemon), 30, "the reference watchdog to stop")
    where.mkdir(parents=True)
    restart = f"{sys.executable} {LAUNCHER} stop && {sys.executable} {LAUNCHER} start {RECIPE}"
    loop_env = {
        **head_env,
        "LOOPDOG_URL": f"http://127.0.0.1:{sim.state['engine_port']}",
        "LOOPDOG_STAMPS": str(where / "restarts"),
        "LOOPDOG_PAUSE": str(where / "pause"),
        "LOOPDOG_GAVEUP": str(where / "gave-up"),
        "LOOPDOG_PIDFILE": str(sim.head / ".local/state/spark-watchdog/engine.pid"),
        "LOOPDOG_LOG": str(where / "loop.log"),
        "LOOPDOG_INTERVAL": "0.5",
        "LOOPDOG_TIMEOUT": "2",
        "LOOPDOG_FAILURES": "3",
        "LOOPDOG_MAX": "3",
        "LOOPDOG_GRACE": f"{grace:g}",
        "LOOPDOG_SETTLE": "2",
        "LOOPDOG_STOP": f"{sys.executable} {LAUNCHER} stop",
        "LOOPDOG_START": f"{sys.executable} {LAUNCHER} start {RECIPE}",
        **env,
    }
    data = yaml.safe_load(sim.inventory.read_text())
    data["clusters"]["sim"]["watchdog"] = {
        "kind": "loop",
        "restart_command": restart,
        "history_file": str(where / "restarts"),
        "history_format": "stamps",
        "history_locked": False,
        **({"pause_file": str(where / "pause")} if pause else {}),
        "gave_up_file": str(where / "gave-up"),
        "grace_s": grace,
        "restarts_missing_engine": False,
        "budget": {"max_restarts": 3, "window_s": 21600},
    }
    inventory = where / "inventory.yaml"
    inventory.write_text(yaml.safe_dump(data))
    out = open(where / "loop.out", "ab")  # noqa: SIM115
    proc = subprocess.Popen(
        ["sh", str(SCRIPT)], env=loop_env, cwd=sim.head, stdin=subprocess.DEVNULL,
        stdout=out, stderr=out, start_new_session=True,
    )  # fmt: skip
    loop = Loop(sim, proc, where, inventory)
    wait_for(lambda: loop.said("probe ok") + loop.said("grace") > 0, 60, "the loop's first probe")
    return loop


def stop_loop(loop: Loop) -> None:
    """End the loop (its process group: the shell and a sleep or curl it waits on); what it said
    is printed (pytest shows it when the test failed)."""
    print(loop.log.read_text()[-4000:] if loop.log.exists() else "(no loop log)")
    try:
        os.killpg(loop.proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        loop.proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        os.killpg(loop.proc.pid, signal.SIGKILL)
        loop.proc.wait(timeout=10)


@pytest.fixture
def loop(tmp_path: Path) -> Iterator[Loop]:
    """The embedded cluster serving, its watchdog the loop, one automatic restart 2 h ago."""
    from spark_ops.sim.control import down, wait_serving

    sim = start_sim(tmp_path / "sim", seed_history=False)
    running: Loop | None = None
    try:
        wait_serving(sim.state)
        running = start_loop(sim, tmp_path / "loopdog")
        running.stamps.write_text(f"{int(time.time()) - 7200}\n")  # as its own `date +%s` line
        yield running
    finally:
        if running is not None:
            stop_loop(running)
        down(sim.root)


def history_bytes(loop: Loop) -> bytes:
    """The loop's history, byte for byte."""
    return loop.stamps.read_bytes()


def test_apply_and_restart_leave_the_loop_history_exact(loop: Loop) -> None:
    """apply and restart through the launcher: no stamp written, none pruned, the loop paused
    meanwhile (its pause file taken and given back), then its grace, then its probes."""
    before = history_bytes(loop)
    res = loop.cli("apply", "--max-num-seqs", "64", "--yes", "--json")
    assert res.returncode == 0, res.stdout + res.stderr
    out = " ".join((res.stdout + res.stderr).split())
    assert "restart with the launcher (the watchdog only loops" in out, out
    assert "left no new stamp" in out, out
    assert history_bytes(loop) == before
    assert not loop.pause.exists(), "the pause spark-ops took is given back"
    assert loop.said("paused") > 0, "the loop was paused during the restart"
    n = loop.said("probe ok")
    wait_for(lambda: loop.said("probe ok") > n, 60, "the loop probing the new engine")

    res = loop.cli("restart", "--yes", "--reason", "kernel update")
    assert res.returncode == 0, res.stdout + res.stderr
    assert history_bytes(loop) == before
    assert loop.said("restarting") == 0, "the loop never restarted on its own"
    assert loop.proc.poll() is None, "the loop still runs"

    # an operator's pause is never written over nor removed
    loop.pause.write_text("maintenance by alice\n")
    res = loop.cli("restart", "--yes")
    assert res.returncode == 0, res.stdout + res.stderr
    assert loop.pause.read_text() == "maintenance by alice\n"
    assert history_bytes(loop) == before


def _rank_pids(sim: Sim) -> dict[str, int]:
    """The worker ranks' pids, from each worker's own pid file (an engine run as ranks)."""
    return {
        n: int((sim.root / "nodes" / n / ".local/state/spark-sim/rank.pid").read_text())
        for n in ("node2", "node3", "node4")
    }


def test_apply_in_rank_mode_leaves_the_loop_history_exact(tmp_path: Path) -> None:
    """Ranks without Ray (the launcher's shape): apply under the loop stops and starts the engine
    through the launcher, every worker's rank new and carrying the new value, no stamp written,
    none pruned, the loop paused meanwhile and its pause given back."""
    from spark_ops.sim.control import down, wait_serving

    sim = start_sim(tmp_path / "sim", seed_history=False, executor="mp")
    running: Loop | None = None
    try:
        wait_serving(sim.state)
        running = start_loop(sim, tmp_path / "loopdog")
        running.stamps.write_text(f"{int(time.time()) - 7200}\n")  # an automatic restart 2 h ago
        before, ranks = history_bytes(running), _rank_pids(sim)
        res = running.cli("apply", "--max-num-seqs", "64", "--yes", "--json")
        assert res.returncode == 0, res.stdout + res.stderr
        out = json.loads(res.stdout)
        assert all(c["ok"] for c in out["checks"]), out["checks"]
        boot = out["boot"]
        assert sorted(boot["ranks"]) == ["node2", "node3", "node4"], boot
        for node, rank in boot["ranks"].items():
            assert rank["started"] and rank["non_default_args"]["max_num_seqs"] == 64, node
        assert not set(_rank_pids(sim).values()) & set(ranks.values()), "every rank is new"
        said = " ".join((res.stdout + res.stderr).split())
        assert "restart with the launcher (the watchdog only loops" in said, said
        assert history_bytes(running) == before, "no stamp written, none pruned"
        assert not running.pause.exists(), "the pause spark-ops took is given back"
        assert running.said("paused") > 0 and running.said("restarting") == 0
    finally:
        if running is not None:
            stop_loop(running)
        down(sim.root)


def test_wedge_restarted_by_the_loop_crash_left_down(loop: Loop) -> None:
    """A wedged engine: the loop restarts it (its stamp, before the restart, kept by spark-ops).
    A crash: the loop reads the missing engine as stopped on purpose; status says no watchdog
    brings it back and names `spark-ops restart`, which does, leaving the history exact."""
    before = loop.stamps.read_text().split()
    wait_for(lambda: loop.said("probe ok") > 0, 60, "the loop's grace to end")
    wedged = engine_pid(loop.sim)
    graced = loop.said("grace")
    os.kill(wedged, signal.SIGSTOP)  # alive, answering nothing: wedged
    try:
        wait_for(lambda: loop.said("settling") == 1, 120, "the loop's own restart")
        assert _gone(wedged), "the launcher's stop ended the wedged engine"
    finally:
        if not _gone(wedged):
            os.kill(wedged, signal.SIGCONT)
    assert len(loop.stamps.read_text().split()) == len(before) + 1
    wait_for(lambda: serving(loop.sim), 60, "the engine the loop started")
    started = (loop.sim.head / ".local/state/spark-watchdog/engine.pid").stat().st_mtime
    assert int(loop.stamps.read_text().split()[-1]) <= started, "stamped before the restart"
    wait_for(lambda: loop.said("grace") > graced, 60, "the loop's grace after its own restart")
    after_wedge = loop.stamps.read_text().split()
    assert after_wedge[: len(before)] == before
    res = loop.cli("budget", "--json")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["used"] == len(after_wedge)

    wait_for(lambda: loop.said("probe ok") > 1, 60, "the loop probing again")
    os.killpg(engine_pid(loop.sim), signal.SIGKILL)  # a crash: no engine left
    n = loop.said("no engine")
    wait_for(lambda: loop.said("no engine") > n + 2, 60, "the loop standing down")
    assert loop.stamps.read_text().split() == after_wedge, "a crash is not restarted"
    res = loop.cli("status", "--json")
    status = json.loads(res.stdout)
    assert status["verdict"]["state"] == "not-serving", status["verdict"]
    said = " ".join(status["verdict"]["reasons"])
    assert "no watchdog will bring the engine back" in said, said
    assert "spark-ops restart" in said and str(LAUNCHER) in said, said
    res = loop.cli("doctor", "--json")
    checks = {c["name"]: c for c in json.loads(res.stdout)["checks"]}
    assert "stopped on purpose" in checks["watchdog-recovery"]["detail"]
    assert checks["watchdog-reboot"]["status"] == "warn"  # its stamps are under /tmp
    assert checks["watchdog-lock"]["status"] == "warn"
    assert checks["watchdog-loop"]["status"] == "ok", checks["watchdog-loop"]

    res = loop.cli("restart", "--yes")
    assert res.returncode == 0, res.stdout + res.stderr
    assert serving(loop.sim)
    assert loop.stamps.read_text().split() == after_wedge, "the history exact afterwards"


def test_gave_up_and_pause(loop: Loop) -> None:
    """At its budget the loop touches gave-up instead of restarting; its pause suspends it."""
    wait_for(lambda: loop.said("probe ok") > 0, 60, "the loop's grace to end")
    loop.pause.write_text("")
    wedged = engine_pid(loop.sim)
    os.kill(wedged, signal.SIGSTOP)
    try:
        n = loop.said("paused")
        wait_for(lambda: loop.said("paused") > n + 6, 60, "the loop paused, probing nothing")
        assert loop.said("probe failed") == 0
        now = int(time.time())
        loop.stamps.write_text(f"{now - 60}\n{now - 50}\n{now - 40}\n")  # 3 in 6 h: full
        full = loop.stamps.read_bytes()
        loop.pause.unlink()
        wait_for(loop.gave_up.exists, 60, "the gave-up file")
        assert loop.stamps.read_bytes() == full, "no restart over the budget"
        assert loop.said("restarting") == 0
    finally:
        os.kill(wedged, signal.SIGCONT)
    res = loop.cli("doctor", "--json")
    checks = {c["name"]: c for c in json.loads(res.stdout)["checks"]}
    assert checks["watchdog-gave-up"]["status"] == "warn"
    assert checks["budget"]["status"] == "fail"


def test_a_stamp_the_planned_restart_caused_is_pruned_exactly(tmp_path: Path) -> None:
    """No pause file to hold and no grace: during a slow planned boot the loop counts its failed
    probes and restarts on its own, stamping first. That stamp was caused by the planned restart:
    spark-ops prunes exactly it, and the history is as before."""
    from spark_ops.sim.control import down, wait_serving

    sim = start_sim(tmp_path / "sim", seed_history=False)
    running: Loop | None = None
    try:
        wait_serving(sim.state)
        # it settles 60 s after its own restart: one restart, not a loop of them
        running = start_loop(sim, tmp_path / "loopdog", grace=0, pause=False, LOOPDOG_SETTLE="60")
        before = running.stamps.read_bytes() if running.stamps.exists() else b""
        config = sim.root / "engine.yaml"  # the next boot is slow: weights take 8 emulated s x4
        config.write_text(config.read_text() + "boot:\n  weights_s: 32\n")
        res = running.cli("restart", "--yes", "--json")
        out = " ".join((res.stdout + res.stderr).split())
        assert running.said("restarting") == 1, out
        pruned = [
            json.loads(line)["step"]
            for line in res.stderr.splitlines()
            if line.startswith('{"step": {"name": "prune"')
        ][-1]
        assert pruned["status"] == "done" and pruned["detail"].startswith("removed "), out
        after = running.stamps.read_bytes() if running.stamps.exists() else b""
        assert after == before, (before, after)
        # the loop killed the engine spark-ops started: its boot is reported failed (exit 7), or
        # served when the loop's engine answered first; either way the loop's engine serves
        assert res.returncode in (0, ExitStatus.BOOT_FAILED), out
        wait_for(lambda: serving(sim), 120, "the engine the loop started")
    finally:
        if running is not None:
            stop_loop(running)
        down(sim.root)


def _stranger_loop(loop: Loop, where: Path) -> subprocess.Popen[bytes]:
    """A second loop on the head, another cluster's: its own port, stamps and pid file (no engine
    there, so it only says "no engine" and never restarts anything)."""
    where.mkdir()
    env = {
        "PATH": os.environ["PATH"],
        "LOOPDOG_URL": "http://127.0.0.1:9",
        "LOOPDOG_STAMPS": str(where / "restarts"),
        "LOOPDOG_PAUSE": str(where / "pause"),
        "LOOPDOG_PIDFILE": str(where / "engine.pid"),
        "LOOPDOG_LOG": str(where / "loop.log"),
        "LOOPDOG_INTERVAL": "0.5",
    }
    proc = subprocess.Popen(
        ["sh", str(SCRIPT)], env=env, cwd=where, stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    wait_for(lambda: "no engine" in _text(where / "loop.log"), 30, "the stranger loop")
    return proc


def _text(path: Path) -> str:
    """A file's text, or '' while it does not exist."""
    return path.read_text() if path.exists() else ""


def test_pick_loop_takes_this_clusters_loop() -> None:
    """Among several loops on one head: the one whose stamps are the inventory's, else the one
    whose probe names the engine's port, whatever order the process list gives; a loop whose
    probe names another port is another engine's, never this cluster's (it was taken when it
    was the only loop, or when none matched: a colleague's, or another test's, loop adopted)."""
    from spark_ops.watchdog.loop import LoopFacts, pick_loop, split_loops

    other = LoopFacts("/o/w.sh", pid=10, history_file="/o/stamps", probe_url="http://h:9/v1")
    ours = LoopFacts("/x/w.sh", pid=20, history_file="/x/stamps", probe_url="http://h:8000")
    unsaid = LoopFacts("/u/w.sh", pid=30, history_file="/u/stamps", probe_url="http://h/v1")
    assert pick_loop([other, ours], port="8000") is ours
    assert pick_loop([other, ours], port="80") is None  # each probes another engine
    assert pick_loop([other], port="8000") is None
    assert pick_loop([other, unsaid], port="8000") is unsaid  # no port written: may be ours
    assert pick_loop([other, ours], history="/x/stamps", port="9") is ours  # the inventory's
    assert pick_loop([], port="8000") is None and pick_loop([other]) is other
    assert split_loops([other, ours, unsaid], "8000") == ([ours, unsaid], [other])


def test_init_recognises_the_loop_from_what_runs(loop: Loop, tmp_path: Path) -> None:
    """init finds the running loop (its process, script and environment) and writes every value
    it names, warning that its budget does not survive a reboot and that it restarts nothing
    after a crash; doctor agrees; apply with that inventory leaves the history exact."""
    from test_init import hosts_of, key_args

    out = tmp_path / "cluster.yaml"
    stranger = _stranger_loop(loop, tmp_path / "stranger")
    try:
        res = spark_ops(loop.sim, "init", "--hosts", hosts_of(loop.sim.state["ports"]),
                        *key_args(loop.sim.root), "-o", str(out), "--json")  # fmt: skip
    finally:
        os.killpg(stranger.pid, signal.SIGKILL)
        stranger.wait(timeout=10)
    assert res.returncode == 0, res.stdout + res.stderr
    findings = json.loads(res.stdout)["findings"]
    # the stranger probes another port: named as another engine's, not as a second loop of ours
    assert not [f for f in findings if "loop watchdogs run on the head" in f["detail"]], findings
    other = [f for f in findings if "another engine's watchdog" in f["detail"]]
    assert other and f"(pid {stranger.pid}) probes port 9" in other[0]["detail"], findings
    found = {f["key"]: f for f in findings}
    wd = yaml.safe_load(out.read_text())["clusters"]["spark"]["watchdog"]
    assert wd["kind"] == "loop" and wd["reports_stamp"] is False
    assert wd["history_file"] == str(loop.stamps) and wd["history_locked"] is False
    assert wd["pause_file"] == str(loop.pause) and wd["gave_up_file"] == str(loop.gave_up)
    assert wd["budget"] == {"max_restarts": 3, "window_s": 21600}
    assert wd["grace_s"] == 8 and wd["restarts_missing_engine"] is False
    assert wd["restart_command"] == (
        f"sh -c '{sys.executable} {LAUNCHER} stop' && sh -c '{sys.executable} {LAUNCHER} start "
        f"{RECIPE}'"
    )
    assert "a reboot empties" in found["watchdog.history_file"]["detail"], found
    assert "stopped on purpose" in found["watchdog.restarts_missing_engine"]["detail"]
    doc = spark_ops(loop.sim, "-i", str(out), "doctor", "--json")
    checks = {c["name"]: c for c in json.loads(doc.stdout)["checks"]}
    assert checks["watchdog-loop"]["status"] == "ok", checks["watchdog-loop"]
    before = history_bytes(loop)
    res = spark_ops(loop.sim, "-i", str(out), "apply", "--max-num-seqs", "32", "--yes")
    assert res.returncode == 0, res.stdout + res.stderr
    assert history_bytes(loop) == before and not loop.pause.exists()
