"""Issue 30 on the embedded cluster: the README's experiment at cap 6 with level 64, the reference
watchdog probing every 2 s with a 3 s timeout (a probe queued behind 58 requests times out), ends
with the budget exactly as before, the recipe restored and the engine on it: the levels that
starve the probe ran under a lease the watchdog honoured, and the lease was ended. Without a pause
file the level is refused with the arithmetic, the start restored, nothing recommended."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import start_sim

TIME_SCALE = 10.0
ARGS = [
    "experiment", "--max-num-seqs", "6,64", "--concurrency", "1,6,16,64", "--output-tokens", "300",
    "--measure-all", "--yes",
]  # fmt: skip


def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """Run the real CLI in a subprocess."""
    return subprocess.run(
        [sys.executable, "-m", "spark_ops.cli.main", *args],
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_readme_experiment_keeps_the_budget_under_a_probing_watchdog(tmp_path: Path) -> None:
    """cap 6, level 64, watchdog every 2 s: the lease pauses it, budget and recipe as before."""
    from spark_ops.sim.control import down, wait_serving

    s = start_sim(
        tmp_path / "sim", time_scale=TIME_SCALE, watchdog_interval_s=2.0,
        watchdog_probe_timeout_s=3.0,
    )  # fmt: skip
    try:
        wait_serving(s.state)
        env = dict(os.environ, SPARK_OPS_INVENTORY=str(s.inventory))
        history, recipe = s.history.read_bytes(), s.recipe.read_bytes()
        pause = s.head / ".local" / "state" / "spark-watchdog" / "pause"
        report = tmp_path / "report.json"
        res = cli(env, *ARGS, "--state", str(tmp_path / "exp.json"), "-o", str(report))
        assert res.returncode == 0, res.stderr[-4000:]
        data = json.loads(report.read_text())
        assert data["state"]["restore"]["ok"] is True, data["state"]["restore"]
        assert all(r["budget_as_before"] for r in data["state"]["results"].values())
        assert s.history.read_bytes() == history, "the budget is exactly as before"
        assert s.recipe.read_bytes() == recipe, "the recipe is back as it was"
        assert not pause.exists(), "the lease was ended"
        assert "Recommendation: " in res.stdout
        # the level that starves the probe was leased, with the arithmetic, and said once
        said = [
            line for line in res.stderr.splitlines() if "concurrency 64: watchdog paused" in line
        ]
        assert len(said) >= 1 and len(set(said)) == len(said), res.stderr[-4000:]
        log = (s.head / "watchdog.log").read_text("utf-8", "replace")
        assert "timed out after 3 s" in log, f"the load starved the probe: {log[-3000:]}"
        assert '"event": "restarting"' not in log, "the watchdog never restarted the engine"
        status = subprocess.run(
            [str(s.head / "bin" / "spark-watchdog"), "--config",
             str(s.head / ".config" / "spark-watchdog.yaml"), "--status", "--json"],
            capture_output=True, text=True, timeout=60, env=dict(os.environ, HOME=str(s.head)),
        )  # fmt: skip
        st = json.loads(status.stdout)
        assert st["paused"] is False and st["lease"] is None, st
        engine = cli(env, "status", "--json")
        verdict = json.loads(engine.stdout)
        assert verdict["verdict"]["state"] == "serving", verdict["verdict"]
    finally:
        down(s.root)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_without_a_pause_file_the_starving_level_is_refused_and_the_start_restored(
    tmp_path: Path,
) -> None:
    """No watchdog.pause_file: level 64 at cap 6 is refused with the arithmetic before a request
    is sent; the experiment restores the start, recommends nothing, says each sentence once."""
    from spark_ops.sim.control import down, wait_serving

    s = start_sim(tmp_path / "sim", time_scale=TIME_SCALE, watchdog_interval_s=2.0)
    try:
        wait_serving(s.state)
        inv = yaml.safe_load(s.inventory.read_text())
        (cluster,) = inv["clusters"].values()
        del cluster["watchdog"]["pause_file"]
        inventory = tmp_path / "inventory.yaml"
        inventory.write_text(yaml.safe_dump(inv))
        env = dict(os.environ, SPARK_OPS_INVENTORY=str(inventory))
        history, recipe = s.history.read_bytes(), s.recipe.read_bytes()
        report = tmp_path / "report.json"
        res = cli(env, *ARGS, "--state", str(tmp_path / "exp.json"), "-o", str(report))
        assert res.returncode == 9, res.stderr[-4000:]
        assert "concurrency 64 would starve the watchdog's probe" in res.stderr
        assert ">= the watchdog's probe timeout 10 s" in res.stderr
        assert "Recommendation:" not in res.stdout
        assert "No configuration was measured." in res.stdout  # cap 6 was refused midway
        data = json.loads(report.read_text())
        assert data["state"]["restore"]["ok"] is True, data["state"]["restore"]
        assert s.history.read_bytes() == history, "the budget is exactly as before"
        assert s.recipe.read_bytes() == recipe, "the recipe is back as it was"
        said = (res.stdout + res.stderr).splitlines()
        lines = [ln for ln in said if "concurrency 64 would starve" in ln]
        assert len(lines) == 1, lines  # the refusal, once
        # the plan said it up front: level 64 refused if a request measures 1 s or more (10 rounds
        # against the 10 s timeout), and the missing pause file once
        assert sum("C=64: refused if the sweep measures a request at 1 s or more" in ln
                   for ln in said) == 1, said  # fmt: skip
        assert (
            sum("no watchdog.pause_file: the watchdog cannot be paused" in ln for ln in said) == 1
        )
    finally:
        down(s.root)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_lapsed_lease_found_is_no_pause_and_the_lease_follows_the_deadline(
    tmp_path: Path,
) -> None:
    """Red team 2026-12-03 F3: a lease found past its expiry (a dead run's) pauses nothing; the
    restart says the watchdog is NOT paused and keeps the file as it is. F1: the lease and the
    boot step follow `--deadline`, not the inventory's boot deadline. `budget` and `status` show
    that lease lapsed, not paused."""
    from spark_ops.sim.control import down, wait_serving

    s = start_sim(tmp_path / "sim", time_scale=TIME_SCALE)
    try:
        wait_serving(s.state)
        env = dict(os.environ, SPARK_OPS_INVENTORY=str(s.inventory))
        pause = s.head / ".local" / "state" / "spark-watchdog" / "pause"
        old = {
            "expires": 1000, "taken": 900, "spark-ops-lease": 1, "holder": "spark-ops:eve",
            "run": "zzz-old", "why": "planned restart (a run long dead)",
        }  # fmt: skip
        pause.write_text(json.dumps(old))
        before = pause.read_bytes()
        plan = cli(env, "restart", "--dry-run", "--json", "--deadline", "900")
        assert plan.returncode == 0, plan.stderr[-3000:]
        steps = {s["name"]: s["description"] for s in json.loads(plan.stdout)["plan"]["steps"]}
        assert "deadline 900 s" in steps["boot"], steps
        at_most = int(steps["lease"].split("for at most ", 1)[1].split(" s", 1)[0])
        assert at_most >= 900 + 300, steps["lease"]  # the boot's --deadline and the margin
        res = cli(env, "restart", "--yes", "--json", "--no-drain")
        assert res.returncode == 0, res.stderr[-3000:]
        out = json.loads(res.stdout)
        lease = next(st for st in out["plan"]["steps"] if st["name"] == "lease")
        assert "NOT paused" in lease["detail"] and "zzz-old" in lease["detail"], lease
        assert pause.read_bytes() == before, "a pause file not ours is kept as it is"
        # the views: a lapsed lease is shown lapsed, never "paused"
        budget = cli(env, "budget")
        assert "LAPSED" in budget.stdout and "PAUSED" not in budget.stdout, budget.stdout
        view = json.loads(cli(env, "budget", "--json").stdout)
        assert view["paused"] is False and view["lease"]["run"] == "zzz-old", view
        status = cli(env, "status")
        assert "LEASE-LAPSED" in status.stdout and "PAUSED" not in status.stdout, status.stdout
        # F4: an inventory whose pause_file is not the one the watchdog's config names
        pause.unlink()
        inv = yaml.safe_load(s.inventory.read_text())
        typo = "~/.local/state/spark-watchdog/pauses"
        inv["clusters"][next(iter(inv["clusters"]))]["watchdog"]["pause_file"] = typo
        (tmp_path / "typo.yaml").write_text(yaml.safe_dump(inv))
        env2 = dict(env, SPARK_OPS_INVENTORY=str(tmp_path / "typo.yaml"))
        said = "is not the pause file the watchdog reads"
        doctor = cli(env2, "doctor")
        assert said in doctor.stdout and "~/.local/state/spark-watchdog/pause" in doctor.stdout
        res = cli(env2, "restart", "--yes", "--json", "--no-drain")
        assert res.returncode == 0, res.stderr[-3000:]
        lease = next(st for st in json.loads(res.stdout)["plan"]["steps"] if st["name"] == "lease")
        assert said in lease["detail"] and "pauses nothing" in lease["detail"], lease
        assert not (s.head / ".local" / "state" / "spark-watchdog" / "pauses").exists()
    finally:
        down(s.root)
