"""End to end on the embedded cluster: apply, dry run, bad input, lock, deadline (real SSH)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import Sim, cluster_files, start_sim

from spark_ops.errors import ExitStatus

pytestmark = pytest.mark.slow


def spark_ops(env: dict[str, str], *args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    """Run the real CLI in a subprocess."""
    return subprocess.run(
        [sys.executable, "-m", "spark_ops.cli.main", *args],
        env=env, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


def tree_digest(root: Path) -> dict[str, str]:
    """Digest of the node files spark-ops may change (not logs, pids, the daemon's state).

    The watchdog daemon rewrites its state.json atomically at any time, so its temp file
    (`.state.json.tmp.*`, renamed away within milliseconds) is skipped like the file itself.
    """
    skip = (".log", ".pid", ".owner", ".lock", "state.json")
    out = {}
    for p in sorted((root / "nodes").rglob("*")):
        daemon_tmp = p.name.startswith(".state.json.tmp.")
        if p.is_file() and not p.name.endswith(skip) and not daemon_tmp:
            out[str(p.relative_to(root))] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def stamps(sim: Sim) -> list[str]:
    """The history's lines."""
    return sim.history.read_text().split()


def test_apply_max_num_seqs_64_end_to_end(sim: Sim, cli_env: dict[str, str]) -> None:
    """The README's story: recipe changed, engine restarted with 64, >6 running, no stamp left.

    On the way (issue 21): the engine runs under a wrapper shell (the pid file names the shell,
    the engine is its child) and the watchdog's restart command returns 3 s after it started the
    engine: verify still reads the engine's own args, and the boot is timed from its start.
    """
    from spark_ops.readiness import BootHistory
    from spark_ops.sim.cluster import write_vllm_shim

    before_recipe = sim.recipe.read_text()
    before_stamps = stamps(sim)
    assert len(before_stamps) == 1, "the embedded cluster starts with one earlier automatic restart"
    # a typo in --set is refused before anything is written (vLLM's argparse would take the
    # abbreviation, restart, and verify fail: a wasted restart)
    tree = tree_digest(sim.root)
    res = spark_ops(cli_env, "apply", "--set", "max_num_seq=48", "--yes")
    assert res.returncode == ExitStatus.RECIPE, res.stderr[-2000:]
    assert "did you mean --max-num-seqs?" in res.stderr and "nothing was written" in res.stderr
    assert tree_digest(sim.root) == tree and stamps(sim) == before_stamps
    # red team: a key sparkrun maps to a flag, a dotted field of an option that takes no JSON, and
    # an -O that is no level are resolved against the head's parser too
    for args, words in (
        (["--set", "prefill_policy=fifo"], "--prefill-policy is not an option"),
        (["--flag", "--max-num-seqs.foo=3"], "--max-num-seqs takes no dotted field"),
        (["--flag", "-Ofoo"], "-O takes an optimization level"),
    ):
        res = spark_ops(cli_env, "apply", *args, "--yes")
        assert res.returncode == ExitStatus.RECIPE and words in res.stderr, res.stderr[-2000:]
        assert tree_digest(sim.root) == tree and stamps(sim) == before_stamps

    write_vllm_shim(sim.head, wrapper=True)
    inventory = sim.inventory.read_text()
    sim.inventory.write_text(inventory.replace("--by {by}", "--by {by} && sleep 3", 1))
    assert sim.inventory.read_text() != inventory

    res = spark_ops(cli_env, "apply", "--max-num-seqs", "64", "--yes", "--json")
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout)
    assert out["ok"] is True

    pid = int((sim.head / ".local/state/spark-watchdog/engine.pid").read_text())
    boot = out["boot"]
    named = re.fullmatch(r"pid (\d+), engine pid (\d+) under it", boot["engine_start_from"])
    assert named is not None, boot
    assert int(named[1]) == pid and int(named[2]) != pid, "the wrapper shell is not the engine"
    assert boot["restart_command_s"] is not None and boot["restart_command_s"] > 0, boot
    # an order of events, not a duration: the engine started (head clock, this machine) before
    # the command's sleep, the wait only after the command returned; the boot runs from the first
    assert boot["engine_started_at"] < boot["started_at"], boot
    assert boot["total_s"] > boot["wait_s"], boot
    recorded = [
        r for recs in BootHistory().load().values() for r in recs if r["at"] == boot["started_at"]
    ]
    assert [r["total_s"] for r in recorded] == [pytest.approx(boot["total_s"], abs=0.01)]

    after_recipe = sim.recipe.read_text()
    changed = [
        (a, b)
        for a, b in zip(before_recipe.splitlines(), after_recipe.splitlines(), strict=True)
        if a != b
    ]
    assert changed == [
        (
            "  max_num_seqs: 6          # interactive default; raise for batch work",
            "  max_num_seqs: 64          # interactive default; raise for batch work",
        )
    ]
    backups = list(sim.recipe.parent.glob(sim.recipe.name + ".bak.*"))
    assert len(backups) == 1 and backups[0].read_text() == before_recipe

    assert out["stamp"] is not None and out["pruned"] == [out["stamp"]]
    assert stamps(sim) == before_stamps, "the planned stamp is gone and the earlier one remains"
    assert out["boot"]["non_default_args"]["max_num_seqs"] == 64
    log = (sim.head / "engine.log").read_text()
    assert "'max_num_seqs': 64" in log
    assert all(c["ok"] for c in out["checks"]), out["checks"]

    running = asyncio.run(_peak_running(sim, concurrency=16))
    assert running > 6, (
        f"more than 6 requests should run at once with the cap at 64 (saw {running})"
    )


async def _peak_running(sim: Sim, concurrency: int) -> float:
    """Send a burst and sample vllm:num_requests_running from /metrics."""
    import aiohttp

    from spark_ops.engine import EngineSnapshot

    base = f"http://127.0.0.1:{sim.state['engine_port']}"
    peak = 0.0
    async with aiohttp.ClientSession() as http:
        body = {"model": "glm-5.3-flash", "prompt": "hello", "max_tokens": 60, "ignore_eos": True}
        tasks = [
            asyncio.ensure_future(http.post(base + "/v1/completions", json=body))
            for _ in range(concurrency)
        ]
        for _ in range(20):
            await asyncio.sleep(0.1)
            async with http.get(base + "/metrics") as r:
                snap = EngineSnapshot.from_metrics(await r.text())
            peak = max(peak, snap.running or 0)
        for t in tasks:
            (await t).release()
    return peak


def test_dry_run_changes_nothing(sim: Sim, cli_env: dict[str, str]) -> None:
    """--dry-run prints the diff and the steps and touches no node."""
    before = tree_digest(sim.root)
    res = spark_ops(cli_env, "apply", "--max-num-seqs", "64", "--dry-run")
    assert res.returncode == 0, res.stderr
    assert "+  max_num_seqs: 64" in res.stdout
    assert "Dry run: nothing was changed." in res.stdout
    assert tree_digest(sim.root) == before


@pytest.mark.parametrize(
    ("args", "status", "message"),
    [
        (["--max-num-seqs", "0"], ExitStatus.RECIPE, "--max-num-seqs"),
        (["--kv-cache-memory", "60GB"], ExitStatus.RECIPE, "60GB"),
        (["--moe-backend", "warp_drive"], ExitStatus.RECIPE, "warp_drive"),
        # not checked by spark-ops itself: the head's own vLLM (preflight) refuses it
        (["--flag", "--distributed-executor-backend=torus"], ExitStatus.RECIPE, "'torus'"),
    ],
)
def test_bad_input_changes_nothing(
    sim: Sim, cli_env: dict[str, str], args: list[str], status: int, message: str
) -> None:
    """A value vLLM would reject is refused before anything changes."""
    before = tree_digest(sim.root)
    res = spark_ops(cli_env, "apply", *args, "--yes")
    assert res.returncode == status, res.stderr
    assert message in res.stderr
    assert tree_digest(sim.root) == before


def test_unreachable_node_changes_nothing(sim: Sim, cli_env: dict[str, str]) -> None:
    """A node that does not answer stops apply before any write, naming the node."""
    before = tree_digest(sim.root)
    sim.stop_node("node3")
    res = spark_ops(cli_env, "apply", "--max-num-seqs", "64", "--yes")
    assert res.returncode == ExitStatus.UNREACHABLE, res.stderr
    assert "node3" in res.stderr
    assert tree_digest(sim.root) == before


def test_second_operator_is_told_who_holds_the_lock(sim: Sim, cli_env: dict[str, str]) -> None:
    """While one apply runs, a second is refused with the holder named; the lock frees after."""
    first = subprocess.Popen(
        [sys.executable, "-m", "spark_ops.cli.main", "restart", "--yes", "--no-drain"],
        env=cli_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        owner = cluster_files(sim.history)["owner"]
        deadline = time.monotonic() + 30
        while not (owner.exists() and owner.read_text()) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert owner.read_text()
        res = spark_ops(cli_env, "apply", "--max-num-seqs", "64", "--yes")
        assert res.returncode == ExitStatus.LOCKED
        assert "locked by" in res.stderr and "restart" in res.stderr
    finally:
        _, err = first.communicate(timeout=240)
    assert first.returncode == 0, err[-2000:]
    assert owner.read_text() == "", "the owner record is cleared with the lock"


def test_same_cluster_under_another_name_shares_the_lock(
    sim: Sim, cli_env: dict[str, str], tmp_path: Path
) -> None:
    """A colleague's inventory names the cluster differently and reaches the recipe through a
    symlink: it is the same cluster, so the same lock (and audit log) on the head."""
    import yaml

    data = yaml.safe_load(sim.inventory.read_text())
    (name, cluster), *_ = data["clusters"].items()
    link = sim.head / "active-recipe.yaml"
    link.symlink_to(sim.recipe)
    cluster["recipe"]["path"] = str(link)  # absolute, through the link
    other = tmp_path / "colleague.yaml"
    other.write_text(yaml.safe_dump({"clusters": {f"{name}-prod": cluster}}))
    env2 = dict(cli_env, SPARK_OPS_INVENTORY=str(other))
    first = subprocess.Popen(
        [sys.executable, "-m", "spark_ops.cli.main", "restart", "--yes", "--no-drain"],
        env=cli_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        owner = cluster_files(sim.history)["owner"]
        deadline = time.monotonic() + 30
        while not (owner.exists() and owner.read_text()) and time.monotonic() < deadline:
            time.sleep(0.05)
        res = spark_ops(env2, "apply", "--max-num-seqs", "64", "--yes")
        assert res.returncode == ExitStatus.LOCKED, res.stderr[-2000:]
        assert "locked by" in res.stderr and "restart" in res.stderr
    finally:
        _, err = first.communicate(timeout=240)
        link.unlink()
    assert first.returncode == 0, err[-2000:]
    audit_lines = cluster_files(sim.history)["audit"].read_text().splitlines()
    assert any('"restart"' in line for line in audit_lines), "one audit log for the cluster"


def test_one_watchdog_one_lock_whatever_the_inventory_says(
    sim: Sim, cli_env: dict[str, str], tmp_path: Path
) -> None:
    """Issue 20 #8: a second inventory with another cluster name, its own copy of the recipe and
    its own state_dir, on the same head and driving the same watchdog, is refused while the first
    restarts (it would restart through that watchdog at the same moment), the holder named."""
    import yaml

    data = yaml.safe_load(sim.inventory.read_text())
    (name, cluster), *_ = data["clusters"].items()
    copy = sim.head / "recipes" / "copy-of-the-recipe.yaml"
    copy.write_text(sim.recipe.read_text())
    cluster["recipe"]["path"] = str(copy)
    cluster["state_dir"] = str(tmp_path / "colleague-state")
    other = tmp_path / "colleague.yaml"
    other.write_text(yaml.safe_dump({"clusters": {f"{name}-staging": cluster}}))
    env2 = dict(cli_env, SPARK_OPS_INVENTORY=str(other))
    first = subprocess.Popen(
        [sys.executable, "-m", "spark_ops.cli.main", "restart", "--yes", "--no-drain"],
        env=cli_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        owner = cluster_files(sim.history)["owner"]
        deadline = time.monotonic() + 30
        while not (owner.exists() and owner.read_text()) and time.monotonic() < deadline:
            time.sleep(0.05)
        res = spark_ops(env2, "apply", "--max-num-seqs", "64", "--yes")
        assert res.returncode == ExitStatus.LOCKED, res.stderr[-2000:]
        assert "locked by" in res.stderr and "restart" in res.stderr and "pid" in res.stderr
        assert str(cluster_files(sim.history)["lock"]) in res.stderr
    finally:
        _, err = first.communicate(timeout=240)
    assert first.returncode == 0, err[-2000:]
    assert copy.read_text() == sim.recipe.read_text(), "the refused apply wrote nothing"


# Another process on the head holding the history's lock, as a watchdog that keeps it for long
# does: it waits for the planned restart's stamp to land, then takes the lock and keeps it.
LOCK_HOLDER = """
import fcntl, sys, time
history, lock = sys.argv[1], sys.argv[2]
first = open(history).read()
while open(history).read() == first:
    time.sleep(0.01)
f = open(lock, "a")
fcntl.flock(f, fcntl.LOCK_EX)
print("HELD", flush=True)
sys.stdin.read()
"""


def test_history_lock_held_longer_than_spark_ops_waits(
    sim: Sim, cli_env: dict[str, str], tmp_path: Path
) -> None:
    """Issue 20 #9: the history lock stays held past watchdog.lock_timeout_s: the restart says
    which lock, who holds it, that its stamp was NOT pruned and the command that removes it; the
    stamp is recorded as planned, so `budget prune --planned` removes it once the lock is free."""
    import yaml

    data = yaml.safe_load(sim.inventory.read_text())
    (_, cluster), *_ = data["clusters"].items()
    cluster["watchdog"]["lock_timeout_s"] = 1
    cluster["watchdog"]["journal_file"] = "~/spark-ops-journal.jsonl"  # the watchdog's has none
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(yaml.safe_dump(data))
    env = dict(cli_env, SPARK_OPS_INVENTORY=str(inventory))
    before = stamps(sim)
    holder = subprocess.Popen(
        [sys.executable, "-c", LOCK_HOLDER, str(sim.history), f"{sim.history}.lock"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        res = spark_ops(env, "restart", "--yes", "--no-drain")
        assert holder.stdout is not None and holder.stdout.readline() == "HELD\n"
        (stamp,) = [s for s in stamps(sim) if s not in before]
        assert res.returncode == ExitStatus.BUDGET, res.stderr[-3000:]
        said = " ".join(res.stderr.split())
        assert f"history lock {sim.history}.lock" in said, said[-3000:]
        assert f"pid {holder.pid}" in said, "the process holding the lock is named"
        assert f"stamp {stamp} was NOT pruned" in said and "recorded as planned" in said
        assert f"spark-ops budget prune --stamp {stamp}" in said
    finally:
        holder.communicate("", timeout=30)
    journal = [
        json.loads(x) for x in (sim.head / "spark-ops-journal.jsonl").read_text().split("\n") if x
    ]
    assert [r["stamp"] for r in journal if r.get("action") == "restart"] == [int(stamp)]
    res = spark_ops(env, "budget", "prune", "--planned", "--yes", "--json")
    assert res.returncode == 0, res.stderr[-2000:]
    assert stamps(sim) == before, "the planned stamp is gone, nothing else"


def test_sigkilled_holder_leaves_no_stale_lock(sim: Sim, cli_env: dict[str, str]) -> None:
    """SIGKILL the tool while it holds the lock (a second operator is refused meanwhile): the
    lock frees itself when the head sees the connection gone, and the next run takes it."""
    victim = subprocess.Popen(
        [sys.executable, "-m", "spark_ops.cli.main", "restart", "--yes", "--no-drain"],
        env=cli_env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        owner = cluster_files(sim.history)["owner"]
        deadline = time.monotonic() + 30
        while not (owner.exists() and owner.read_text()) and time.monotonic() < deadline:
            time.sleep(0.05)
        held = spark_ops(cli_env, "budget", "prune", "--planned", "--yes")
        assert held.returncode == ExitStatus.LOCKED, "the victim really held the lock"
        assert "restart" in held.stderr
    finally:
        victim.kill()
        victim.wait()
    deadline = time.monotonic() + 60  # a deadline, not a speed: a stale lock never frees
    while True:
        res = spark_ops(cli_env, "budget", "prune", "--planned", "--yes", "--json")
        if res.returncode != ExitStatus.LOCKED or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert res.returncode == 0, res.stderr


def test_boot_that_never_serves_ends_at_the_deadline(tmp_path: Path) -> None:
    """An engine that never answers ends in a clear timeout; the planned stamp is pruned anyway."""
    from spark_ops.sim.control import down

    s = start_sim(tmp_path / "sim", fault="never_ready")
    try:
        env = dict(os.environ, SPARK_OPS_INVENTORY=str(s.inventory))
        # the first engine never answers either: older than the boot deadline it is a hang, not a
        # boot under way, and the restart goes ahead (issue 30 #4)
        s.inventory.write_text(
            s.inventory.read_text().replace("boot_deadline_s: 300", "boot_deadline_s: 10")
        )
        time.sleep(10)
        before = stamps(s)
        res = spark_ops(env, "restart", "--yes", "--no-drain", "--deadline", "6")
        assert res.returncode == ExitStatus.TIMEOUT, res.stderr
        assert "deadline" in res.stderr.lower()
        assert stamps(s) == before
    finally:
        down(s.root)


def test_refused_backend_rolls_back_and_serves_again(sim: Sim, cli_env: dict[str, str]) -> None:
    """--moe-backend triton fails the boot; --rollback-on-failure brings the old recipe back."""
    before_recipe = sim.recipe.read_bytes()
    before_stamps = stamps(sim)
    res = spark_ops(
        cli_env, "apply", "--moe-backend", "triton", "--rollback-on-failure", "--yes", "--json"
    )
    assert res.returncode == ExitStatus.BOOT_FAILED, res.stderr[-2000:]
    out = json.loads(res.stdout)
    assert out["rolled_back"] is True
    assert "TRITON" in out["error"]["message"].upper()
    assert sim.recipe.read_bytes() == before_recipe
    assert stamps(sim) == before_stamps, "both planned restarts were pruned"
    assert len(out["pruned"]) == 2
    steps = {s["name"]: s["status"] for s in out["plan"]["steps"]}
    assert steps["boot"] == "failed" and steps["boot-rollback"] == "done"
    res = spark_ops(cli_env, "status", "--json")
    status = json.loads(res.stdout)
    assert status["engine"]["up"] is True
    assert status["recipe"]["knobs"]["moe_backend"] == "marlin"


def test_rollback_restores_the_latest_backup(sim: Sim, cli_env: dict[str, str]) -> None:
    """After an apply, `rollback` brings the previous recipe back byte for byte and serving."""
    original = sim.recipe.read_bytes()
    assert spark_ops(cli_env, "apply", "--max-num-seqs", "48", "--yes").returncode == 0
    res = spark_ops(cli_env, "rollback", "--yes", "--json")
    assert res.returncode == 0, res.stderr[-2000:]
    assert sim.recipe.read_bytes() == original
    assert json.loads(res.stdout)["checks"][0]["ok"] is True
    # its re-run converges: the backup it made is marked .rolled-back, never the default source
    backups = sorted(p.name for p in sim.recipe.parent.glob(sim.recipe.name + ".bak.*"))
    assert backups[-1].endswith(".rolled-back"), backups
    again = spark_ops(cli_env, "rollback", "--yes", "--json")
    assert again.returncode == 0, again.stderr[-2000:]
    assert sim.recipe.read_bytes() == original, "a re-run does not flip back to 48"
    assert json.loads(again.stdout)["plan"]["changes"] == []
    # --list says when each backup was made, before what, which a rollback restores, how to undo
    listed = spark_ops(cli_env, "rollback", "--list")
    assert listed.returncode == 0, listed.stderr[-2000:]
    assert "before an apply  <- `spark-ops rollback` restores this" in listed.stdout, listed.stdout
    assert "before a rollback" in listed.stdout and "undoes the rollback" in listed.stdout
    doc = json.loads(spark_ops(cli_env, "rollback", "--list", "--json").stdout)
    kinds = [(b["before"], b["default"]) for b in doc["node1"]]
    assert kinds == [("apply", True), ("rollback", False)], kinds


@pytest.mark.parametrize("step", ["restart", "boot"])
def test_ctrl_c_during_the_restart_still_prunes_our_stamp(
    sim: Sim, cli_env: dict[str, str], step: str
) -> None:
    """Ctrl-C while the restart runs or the boot is followed: our stamp is removed all the same."""
    import signal

    before = stamps(sim)
    proc = subprocess.Popen(
        [sys.executable, "-m", "spark_ops.cli.main", "restart", "--yes", "--no-drain", "--json"],
        env=cli_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stderr is not None
    marker = f'"name": "{step}", "description"'
    for line in proc.stderr:
        if marker in line and '"status": "running"' in line:
            break
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == ExitStatus.ABORTED, err[-2000:]
    assert stamps(sim) == before, "the planned stamp was pruned although the run was interrupted"
