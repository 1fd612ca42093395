"""Never race the watchdog (issue 30 #4–#7) on the embedded cluster: a restart command that
restarts twice, a boot already under way, the budget every view shows, a wedged engine."""

from __future__ import annotations

import contextlib
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
    env.pop("SPARK_OPS_FLEET", None)
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


def test_status_during_a_colleagues_restart_says_booting(slow_boot: Sim) -> None:
    """status during a boot it did not start (issue 35 #3): "booting, phase X, N s, ETA …",
    verdict restarting (exit 15) and to watch it, never not-serving with `spark-ops doctor`."""
    sim = slow_boot
    colleague_restart(sim)
    res = spark_ops(sim, "status")
    out = res.stdout
    assert res.returncode == ExitStatus.RESTARTING, out + res.stderr[-2000:]
    assert "Engine: booting, phase " in out and "ETA" in out, out
    assert "Verdict: restarting: booting, phase " in out, out
    assert "next: spark-ops status --watch 5" in out and "spark-ops doctor" not in out, out


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


# ------------------------------------------------------------------ #7 wedged is a state


def send_stuck_requests(sim: Sim, n: int = 3) -> None:
    """Long completions in background threads: running when the engine wedges, never answered."""
    import threading
    import urllib.request

    url = f"http://127.0.0.1:{sim.state['engine_port']}/v1/completions"
    body = json.dumps({"model": "glm-5.3-flash", "prompt": "x", "max_tokens": 4000}).encode()

    def one() -> None:
        """One request (its failure when the engine goes is expected)."""
        req = urllib.request.Request(url, body, {"Content-Type": "application/json"})
        with contextlib.suppress(OSError):
            urllib.request.urlopen(req, timeout=300).read()

    for _ in range(n):
        threading.Thread(target=one, daemon=True).start()


@pytest.fixture
def wedging(tmp_path: Path) -> Iterator[Sim]:
    """An embedded cluster whose engine wedges once requests run (fault wedged_while_serving);
    the watchdog probes every 20 s, so status and doctor read the wedge before it acts."""
    from conftest import start_sim

    from spark_ops.sim.control import down, wait_serving

    s = start_sim(
        tmp_path / "sim", fault="wedged_while_serving", watchdog_interval_s=20.0,
        watchdog_grace_s=3.0, seed_history=False,
    )  # fmt: skip
    try:
        wait_serving(s.state)
        yield s
    finally:
        down(s.root)


def test_wedged_engine_in_status_doctor_metrics_and_the_watchdog(wedging: Sim) -> None:
    """/health 200, counters frozen, requests running: status says "wedged" (exit 22), doctor's
    completion check fails naming it, /metrics has the wedged verdict, and the reference
    watchdog's probe counts it as a failure and restarts the engine."""
    import asyncio

    from spark_ops.inventory import load_inventory
    from spark_ops.serve.metrics import render_metrics
    from spark_ops.status import collect_status

    sim = wedging
    send_stuck_requests(sim)
    time.sleep(2.0)
    res = spark_ops(sim, "status", "--json")
    assert res.returncode == ExitStatus.WEDGED, res.stdout[-2000:] + res.stderr[-2000:]
    data = json.loads(res.stdout)
    assert data["verdict"]["state"] == "wedged"
    assert "token counters stayed frozen" in data["verdict"]["reasons"][0]
    assert data["engine"]["completion"]["wedged"] is True
    res = spark_ops(sim, "doctor", "--json")
    checks = {c["name"]: c for c in json.loads(res.stdout)["checks"]}
    assert checks["engine-completion"]["status"] == "fail"
    assert "token counters stayed frozen" in checks["engine-completion"]["detail"]
    cluster = load_inventory(sim.inventory).cluster(None)
    page = render_metrics(asyncio.run(collect_status(cluster)), {"active": False}, None).decode()
    assert 'spark_ops_verdict{cluster="default",state="wedged"} 1.0' in page, page[:3000]
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not history(sim):
        time.sleep(1.0)
    assert len(history(sim)) == 1, "the watchdog's probe failed on the wedge and restarted it"
    journal = (sim.head / STATE / "restarts.journal.jsonl").read_text()
    assert '"by": "watchdog"' in journal


# ------------------------------------------------------------------ #6 one budget, every view


def test_mistyped_history_file_is_an_error_in_every_view(sim: Sim, tmp_path: Path) -> None:
    """watchdog.history_file names a file the watchdog does not count: budget, status, doctor,
    the gate (plan), serve's status and /metrics all say so, naming the key; none shows 0/2."""
    import asyncio

    from spark_ops.inventory import load_inventory
    from spark_ops.serve.metrics import render_metrics
    from spark_ops.status import collect_status

    typo = inventory_with(
        sim, tmp_path, "typo", history_file="~/.local/state/spark-watchdog/restart"
    )
    said = "watchdog.history_file is wrong"
    res = spark_ops(sim, "budget", "--json", inventory=typo)
    assert res.returncode == ExitStatus.BUDGET and said in flat(res), flat(res)[-2000:]
    assert "~/.local/state/spark-watchdog/restarts" in flat(res), "the config's file named"
    res = spark_ops(sim, "status", "--json", inventory=typo)
    data = json.loads(res.stdout)
    assert "used" not in data["budget"] and said in data["budget"]["error"]
    assert any(said in r for r in data["verdict"]["reasons"])
    res = spark_ops(sim, "doctor", "--json", inventory=typo)
    checks = {c["name"]: c for c in json.loads(res.stdout)["checks"]}
    assert checks["budget"]["status"] == "fail" and said in checks["budget"]["detail"]
    res = spark_ops(sim, "plan", "--max-num-seqs", "32", inventory=typo)
    assert res.returncode == ExitStatus.OVER_BUDGET and said in flat(res), flat(res)[-2000:]
    cluster = load_inventory(typo).cluster(None)
    status = asyncio.run(collect_status(cluster))  # what serve's pages and /metrics read
    assert said in status["budget"]["error"]
    page = render_metrics(status, {"active": False}, None).decode()
    assert (
        'spark_ops_budget_readable{cluster="default"} 0.0' in page
        and "spark_ops_budget_used{" not in page
    )
    # the right file, absent before any restart but named by the watchdog's config: no error
    res = spark_ops(sim, "budget", "--json")
    assert res.returncode == 0, res.stderr


def test_missing_history_of_an_unknown_watchdog_is_an_error(sim: Sim, tmp_path: Path) -> None:
    """A watchdog whose config spark-ops cannot read (not the reference one) and a history file
    that does not exist: the budget is unknown, an error naming the key, never 0 used."""
    wd = yaml.safe_load(sim.inventory.read_text())["clusters"]["sim"]["watchdog"]
    other = inventory_with(
        sim, tmp_path, "other", history_file="~/nowhere/restarts",
        restart_command=wd["restart_command"].replace("spark-watchdog --config", "my-wd --conf"),
        status_command=None,
    )  # fmt: skip
    said = "watchdog.history_file: ~/nowhere/restarts does not exist"
    res = spark_ops(sim, "budget", "--json", inventory=other)
    out = flat(res)
    assert res.returncode == ExitStatus.BUDGET, out[-2000:]
    assert said in out, out[-2000:]
    # every view says the same, naming the key; none shows "0 used"
    res = spark_ops(sim, "status", "--json", inventory=other)
    data = json.loads(res.stdout)
    assert "used" not in data["budget"] and said in data["budget"]["error"], data["budget"]
    assert any(said in r for r in data["verdict"]["reasons"]), data["verdict"]
    res = spark_ops(sim, "doctor", "--json", inventory=other)
    checks = {c["name"]: c for c in json.loads(res.stdout)["checks"]}
    assert checks["budget"]["status"] == "fail" and said in checks["budget"]["detail"], checks
    assert "watchdog.history_file" in checks["history"]["fix"], checks["history"]
    import asyncio

    from spark_ops.inventory import load_inventory
    from spark_ops.serve.metrics import render_metrics
    from spark_ops.status import collect_status

    status = asyncio.run(collect_status(load_inventory(other).cluster(None)))  # serve reads this
    assert said in status["budget"]["error"]
    page = render_metrics(status, {"active": False}, None).decode()
    assert (
        'spark_ops_budget_readable{cluster="default"} 0.0' in page
        and "spark_ops_budget_used{" not in page
    )


def test_a_history_that_did_not_move_names_the_key(sim: Sim, tmp_path: Path) -> None:
    """Issue 30 #6: watchdog.history_file names a file that exists but is not the one the
    watchdog writes, behind a site's wrapper spark-ops cannot read the config of. The restart
    goes through, the watchdog prints the stamp it wrote elsewhere, and the prune step says the
    history did not move, naming watchdog.history_file (exit 10, never "Done"); its hint's prune
    removes the planned stamp from the real history."""
    wrapper = sim.head / "bin" / "site-wd"
    wrapper.write_text(  # a site's own wrapper: its config is not named on the command line
        '#!/bin/sh\nexec spark-watchdog --config "$HOME/.config/spark-watchdog.yaml" "$@"\n'
    )
    wrapper.chmod(0o755)
    old = sim.head / "old-watchdog"
    old.mkdir()
    (old / "restarts").write_text(f"{int(time.time()) - 9000}\n")  # exists, never written again
    before, old_before = history(sim), (old / "restarts").read_bytes()
    inv = inventory_with(
        sim, tmp_path, "unmoved", history_file="~/old-watchdog/restarts", journal_file=None,
        restart_command="site-wd --restart-now --force --reason {reason} --by {by}",
        status_command=None,
    )  # fmt: skip
    res = spark_ops(sim, "restart", "--yes", "--no-drain", "--json", inventory=inv)
    assert res.returncode == ExitStatus.BUDGET, flat(res)[-3000:]
    steps = {s["name"]: s for s in json.loads(res.stdout)["plan"]["steps"]}
    prune = steps["prune"]
    assert prune["status"] == "failed", prune
    assert prune["detail"].startswith("watchdog.history_file is wrong: the watchdog printed stamp ")
    assert "but ~/old-watchdog/restarts on node1 did not change" in prune["detail"], prune
    assert "watchdog.history_file" in steps["budget"]["detail"], steps["budget"]
    assert (old / "restarts").read_bytes() == old_before, "the named file was not touched"
    new = [line for line in history(sim) if line not in before]
    assert len(new) == 1, "the planned stamp landed in the history the watchdog writes"
    problem = json.loads(res.stdout)["history_problem"]
    assert problem["history_file"] == "~/old-watchdog/restarts"
    assert f"spark-ops budget prune --stamp {new[0]}" in problem["hint"], problem
    # following the hint with the right inventory: the budget is back as it was
    res = spark_ops(sim, "budget", "prune", "--stamp", new[0], "--yes")
    assert res.returncode == 0, flat(res)[-2000:]
    assert history(sim) == before
