"""Never race the watchdog (issue 30 #4–#7) on the embedded cluster: a restart command that
restarts twice, a boot already under way, the budget every view shows, a wedged engine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import Sim

from spark_ops.errors import ExitStatus

pytestmark = pytest.mark.slow

STATE = ".local/state/spark-watchdog"


def spark_ops(
    sim: Sim, *args: str, inventory: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """Run the real CLI against the embedded cluster (or another inventory of it)."""
    env = dict(os.environ, SPARK_OPS_INVENTORY=str(inventory or sim.inventory))
    env.pop("SPARK_OPS_CLUSTER", None)
    return subprocess.run(
        [sys.executable, "-m", "spark_ops.cli.main", *args],
        env=env, capture_output=True, text=True, timeout=400,
    )  # fmt: skip


def history(sim: Sim) -> list[str]:
    """The lines of the watchdog's history (none when it does not exist yet)."""
    return sim.history.read_text().split() if sim.history.exists() else []


def inventory_with(sim: Sim, tmp_path: Path, name: str, **watchdog: Any) -> Path:
    """A copy of the sim's inventory with watchdog settings replaced."""
    data = yaml.safe_load(sim.inventory.read_text())
    data["clusters"]["sim"]["watchdog"].update(watchdog)
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def flat(res: subprocess.CompletedProcess[str]) -> str:
    """stdout and stderr as one line of words."""
    return " ".join((res.stdout + res.stderr).split())


# ------------------------------------------------------------------ #5 count before you trust


@pytest.mark.parametrize("reports_stamp", [True, False])
def test_restart_command_that_restarts_twice(sim: Sim, tmp_path: Path, reports_stamp: bool) -> None:
    """A restart command whose script calls the watchdog twice leaves two planned stamps: both
    are identified and pruned (the last printed one alone once left the other behind)."""
    wd = yaml.safe_load(sim.inventory.read_text())["clusters"]["sim"]["watchdog"]
    once = wd["restart_command"]
    inv = inventory_with(
        sim, tmp_path, "twice", restart_command=f"{once} && sleep 1 && {once}",
        reports_stamp=reports_stamp,
    )  # fmt: skip
    before = history(sim)
    res = spark_ops(sim, "restart", "--yes", "--no-drain", "--reason", "twice", inventory=inv)
    out = flat(res)
    assert res.returncode == 0, out[-3000:]
    assert history(sim) == before, "both planned stamps pruned, every earlier one kept"
    assert "restarted more than once" in out, out[-3000:]
    journal = (sim.head / STATE / "restarts.journal.jsonl").read_text().splitlines()
    pruned = [json.loads(x) for x in journal if '"action": "prune"' in x]
    assert len(pruned) >= 2


def test_two_restarts_one_unknown_is_exit_10(sim: Sim, tmp_path: Path) -> None:
    """The command restarts twice, the second time behind the watchdog's back (a stamp with no
    journal record, printed by nothing): both are named, none pruned, exit 10."""
    wd = yaml.safe_load(sim.inventory.read_text())["clusters"]["sim"]["watchdog"]
    hist = wd["history_file"]
    twice = f"{wd['restart_command']} && sleep 1 && date +%s >> {hist}"
    inv = inventory_with(sim, tmp_path, "stray", restart_command=twice)
    before = history(sim)
    res = spark_ops(sim, "restart", "--yes", "--no-drain", "--reason", "stray", inventory=inv)
    out = flat(res)
    assert res.returncode == ExitStatus.BUDGET, out[-3000:]
    new = history(sim)[len(before) :]
    assert len(new) == 2 and history(sim)[: len(before)] == before
    for stamp in new:
        assert f"spark-ops budget prune --stamp {stamp}" in out, out[-3000:]
    assert "none pruned" in out


# ------------------------------------------------------------------ #4 a boot is not quiet


@pytest.fixture
def slow_boot(tmp_path: Path) -> Iterator[Sim]:
    """An embedded cluster whose boots take ~15 s: long enough to start a run during one."""
    from conftest import start_sim

    from spark_ops.sim.control import down, wait_serving

    s = start_sim(tmp_path / "sim", boot_scale=15.0, seed_history=False)
    try:
        wait_serving(s.state)
        yield s
    finally:
        down(s.root)


def colleague_restart(sim: Sim) -> int:
    """A colleague's restart by hand on the head, through the watchdog; its engine's pid."""
    cfg = str(sim.head / ".config" / "spark-watchdog.yaml")
    res = spark_ops(
        sim, "exec", "--nodes", "node1", "--", "spark-watchdog", "--config", cfg,
        "--restart-now", "--force", "--reason", "by hand", "--by", "colleague",
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    line = next(x for x in res.stdout.splitlines() if '"stamp"' in x)
    return int(json.loads(line[line.index("{") :])["engine_pid"])


def test_restart_waits_for_a_boot_under_way(slow_boot: Sim) -> None:
    """A restart started while a colleague's boot runs waits for that boot to serve first (its
    engine logs its server's start), then restarts: the boot is never killed."""
    sim = slow_boot
    before = history(sim)
    pid = colleague_restart(sim)
    res = spark_ops(sim, "restart", "--yes", "--no-drain", "--reason", "mine")
    out = flat(res)
    assert res.returncode == 0, out[-3000:]
    assert "boot under way" in out and "is booting" in out, out[-3000:]
    log = (sim.head / "engine.log").read_text(errors="replace")
    assert f"Started server process [{pid}]" in log, "the colleague's boot served before ours"
    assert len(history(sim)) == len(before) + 1, "the colleague's stamp kept, ours pruned"


def test_boot_wait_zero_refuses_with_the_reason(slow_boot: Sim) -> None:
    """`--boot-wait 0` refuses at once (exit 15), naming the boot; nothing written or restarted,
    and the booting engine goes on to serve."""
    sim = slow_boot
    recipe = sim.recipe.read_text()
    pid = colleague_restart(sim)
    res = spark_ops(sim, "apply", "--max-num-seqs", "32", "--yes", "--boot-wait", "0")
    out = flat(res)
    assert res.returncode == ExitStatus.RESTARTING, out[-3000:]
    assert "is booting" in out and "no recipe written, no restart made" in out, out[-3000:]
    assert sim.recipe.read_text() == recipe
    deadline = time.monotonic() + 120
    log = ""
    while time.monotonic() < deadline and f"Started server process [{pid}]" not in log:
        time.sleep(0.5)
        log = (sim.head / "engine.log").read_text(errors="replace")
    assert f"Started server process [{pid}]" in log, "the booting engine was left to serve"
