"""The reference watchdog on the embedded cluster, and spark-ops reading and cleaning its budget."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import Sim, start_sim

pytestmark = pytest.mark.slow


def spark_ops(sim: Sim, *args: str) -> subprocess.CompletedProcess[str]:
    """Run the real CLI against the embedded cluster."""
    env = dict(os.environ, SPARK_OPS_INVENTORY=str(sim.inventory))
    return subprocess.run(
        [sys.executable, "-m", "spark_ops.cli.main", *args],
        env=env, capture_output=True, text=True, timeout=240,
    )  # fmt: skip


def wait_for(predicate: object, timeout: float, what: str) -> None:
    """Poll a callable until it is true, or fail naming what was awaited."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def engine_pid(sim: Sim) -> int:
    """The engine's pid from the watchdog's pid file."""
    pid_file = sim.head / ".local" / "state" / "spark-watchdog" / "engine.pid"
    return int(pid_file.read_text().split()[0])


def serving(sim: Sim) -> bool:
    """True when the engine answers a real completion."""
    import urllib.request

    url = f"http://127.0.0.1:{sim.state['engine_port']}/v1/completions"
    body = json.dumps({"model": "glm-5.3-flash", "prompt": "x", "max_tokens": 1}).encode()
    req = urllib.request.Request(url, body, {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


def history(sim: Sim) -> list[str]:
    """The stamps in the history file (none when it does not exist yet)."""
    return sim.history.read_text().split() if sim.history.exists() else []


@pytest.fixture
def quick_watchdog(tmp_path: Path) -> Iterator[Sim]:
    """An embedded cluster whose watchdog probes every 0.5 s, 3 s grace, no earlier stamp."""
    from spark_ops.sim.control import down

    s = start_sim(
        tmp_path / "sim", watchdog_interval_s=0.5, watchdog_grace_s=3.0, seed_history=False
    )
    try:
        wait_for(lambda: serving(s), 60, "the first boot")
        yield s
    finally:
        down(s.root)


def test_three_engine_deaths_two_restarts_then_gave_up(quick_watchdog: Sim) -> None:
    """Kill the engine three times: two restarts, then the watchdog stands down with gave-up."""
    sim = quick_watchdog
    gave_up = sim.head / ".local" / "state" / "spark-watchdog" / "gave-up"
    for expected in (1, 2):
        os.killpg(engine_pid(sim), signal.SIGKILL)
        wait_for(
            lambda n=expected: len(history(sim)) == n,
            60,
            f"automatic restart {expected}",
        )
        wait_for(lambda: serving(sim), 60, f"the engine back after restart {expected}")
    os.killpg(engine_pid(sim), signal.SIGKILL)
    wait_for(gave_up.exists, 60, "the gave-up file")
    assert len(history(sim)) == 2, "no third restart over the budget"
    res = spark_ops(sim, "budget", "--json")
    assert res.returncode == 0, res.stderr
    view = json.loads(res.stdout)
    assert view["used"] == 2 and view["allowed"] == 2 and view["gave_up"] is True
    assert all(s["by"] == "watchdog" for s in view["stamps"])
    res = spark_ops(sim, "budget", "prune", "--clear-gave-up", "--yes")
    assert res.returncode != 0 and "still full" in res.stderr, (
        "no clearing while the window is full"
    )
    assert gave_up.exists()


def test_budget_prune_planned_after_an_experiment(quick_watchdog: Sim) -> None:
    """Forced restarts made by hand for an experiment are planned: prune --planned undoes them."""
    sim = quick_watchdog
    cfg = str(sim.head / ".config" / "spark-watchdog.yaml")
    before = history(sim)
    for _ in range(2):  # what an operator types on the head during an experiment, through SSH
        res = spark_ops(
            sim, "exec", "--nodes", "node1", "--", "spark-watchdog", "--config", cfg,
            "--restart-now", "--force", "--reason", "experiment", "--by", "spark-ops:test",
        )  # fmt: skip
        assert res.returncode == 0, res.stderr
        assert '"stamp"' in res.stdout
        wait_for(lambda: serving(sim), 60, "the engine after a forced restart")
    assert len(history(sim)) == len(before) + 2
    res = spark_ops(sim, "budget", "prune", "--planned", "--yes", "--json")
    assert res.returncode == 0, res.stderr
    result = json.loads(res.stdout)
    assert len(result["removed_stamps"]) == 2
    assert history(sim) == before
    assert result["budget"]["used"] == len(before)


def test_history_file_typo_is_said_loudly(sim: Sim, tmp_path: Path) -> None:
    """watchdog.history_file names a file the watchdog never writes (a typo): the restart
    serves, but the run says the setting is wrong, naming the file and the stamp the watchdog
    printed, reports no budget, and exits 10; the real history keeps the stamp (issue 21 #6)."""
    import yaml

    from spark_ops.errors import ExitStatus

    data = yaml.safe_load(sim.inventory.read_text())
    data["clusters"]["sim"]["watchdog"]["history_file"] = "~/.local/state/spark-watchdog/restart"
    typo = tmp_path / "typo.yaml"
    typo.write_text(yaml.safe_dump(data))
    before = history(sim)
    # the gate reads the one budget reader, which refuses the wrong file before any restart
    res = spark_ops(sim, "-i", str(typo), "restart", "--yes", "--reason", "kernel update")
    assert res.returncode == ExitStatus.OVER_BUDGET and history(sim) == before, res.stderr
    assert "watchdog.history_file is wrong" in " ".join(res.stderr.split()), res.stderr
    res = spark_ops(
        sim, "-i", str(typo), "restart", "--yes", "--reason", "kernel update", "--over-budget"
    )
    new = history(sim)[len(before) :]
    assert len(new) == 1, (before, history(sim), res.stdout + res.stderr)
    out = res.stdout + res.stderr
    assert res.returncode == ExitStatus.BUDGET, out
    assert "Done: engine serving" in out, out
    said = (
        f"watchdog.history_file is wrong: the watchdog printed stamp {new[0]} for this restart, "
        "but ~/.local/state/spark-watchdog/restart on node1 did not change"
    )
    assert said in " ".join(out.split()), out
    report = out.split("Done: engine serving", 1)[1]  # the plan's budget line is the one read
    assert "Restart budget UNKNOWN" in report and "Restart budget: 0/2" not in report, out
    assert f"spark-ops budget prune --stamp {new[0]}" in " ".join(out.split()), out
    assert not (sim.head / ".local/state/spark-watchdog/restart").exists()

    # a restart command that prints nothing: the watchdog's journal still shows the restart
    # (read here through a name holding `{0}`, which once broke the message with a traceback)
    wd = data["clusters"]["sim"]["watchdog"]
    wd["restart_command"] += " >/dev/null"
    state = sim.head / ".local/state/spark-watchdog"
    (state / "jr{0}.jsonl").symlink_to(state / "restarts.journal.jsonl")
    wd["journal_file"] = "~/.local/state/spark-watchdog/jr{0}.jsonl"
    typo.write_text(yaml.safe_dump(data))
    before = history(sim)
    res = spark_ops(
        sim, "-i", str(typo), "restart", "--yes", "--reason", "kernel update", "--over-budget"
    )
    new = history(sim)[len(before) :]
    out = " ".join((res.stdout + res.stderr).split())
    assert res.returncode == ExitStatus.BUDGET and len(new) == 1, out
    assert (
        f"watchdog.history_file is wrong: the watchdog's journal "
        f"(~/.local/state/spark-watchdog/jr{{0}}.jsonl) recorded stamp {new[0]}, but "
        "~/.local/state/spark-watchdog/restart on node1 did not change"
    ) in out, out
