"""`status` tells a script or an alert how the cluster stands: a verdict, its reasons, an exit code.

The rules are data (tests/fixtures/status/verdict.yaml, one runner); the embedded cluster shows
the codes end to end: serving 0, the watchdog paused 13, a colleague's run under way 15, the
engine wedged (health answers, a completion never finishes) 14, the head down 14.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import Sim
from embedded import start_nodes

from spark_ops.cli.status import echo_status
from spark_ops.errors import ExitStatus
from spark_ops.inventory import parse_inventory
from spark_ops.readiness import BootHistory, history_key
from spark_ops.status import last_boot, verdict

CASES = yaml.safe_load((Path(__file__).parent / "fixtures" / "status" / "verdict.yaml").read_text())
RENDER = yaml.safe_load((Path(__file__).parent / "fixtures" / "status" / "render.yaml").read_text())


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_verdict(case: dict[str, Any]) -> None:
    """Each case's state, and each expected reason's words among the reasons, in order."""
    got = verdict(case["data"])
    assert got["state"] == case["state"], got
    assert len(got["reasons"]) == len(case["reasons"]), got
    for words, reason in zip(case["reasons"], got["reasons"], strict=True):
        assert words in reason, got
    if "next" in case:  # the one command the verdict says to run next
        assert got.get("next") == case["next"], got


@pytest.mark.parametrize("case", RENDER, ids=[c["name"] for c in RENDER])
def test_status_text(case: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    """What a person reads: each case's words present, the wrong ones absent."""
    data = {"cluster": "c", "nodes": [], **case["data"]}
    echo_status(data)
    out = capsys.readouterr().out
    for words in case["says"]:
        assert words in out, (case["why"], out)
    for words in case.get("not_says", []):
        assert words not in out, (case["why"], out)


def test_last_boot_from_a_boot_history(tmp_path: Path) -> None:
    """status' last boot is the history's newest record: its time (the record's `at`), how long
    it took; a failed boot is recorded and shown as failed, with its phase, and the ETA (the
    estimate, a boot under way's previous) skips it."""
    cluster = parse_inventory(
        "clusters:\n  t:\n    nodes:\n      node1: {host: 127.0.0.1, role: head}\n"
        "    recipe: {path: ~/r.yaml}\n    watchdog: {restart_command: x, history_file: ~/h}\n",
        "t.yaml",
    ).cluster()
    history = BootHistory(tmp_path / "boots.json")
    assert last_boot(cluster, history) is None
    key = history_key(cluster)
    history.record(
        key, {"started_at": 1_796_000_000.0, "total_s": 13.0, "durations": {"STARTING": 13.0}}
    )
    assert last_boot(cluster, history) == {
        "outcome": "ok", "started_at": 1_796_000_000.0, "total_s": 13.0,
    }  # fmt: skip
    history.record_failed(
        key, at=1_796_000_600.0, total_s=41.7, phase="KV_CACHE",
        error="the engine failed to boot: CUDA out of memory\n(log lines follow)",
    )  # fmt: skip
    failed = last_boot(cluster, history)
    assert failed == {
        "outcome": "failed", "started_at": 1_796_000_600.0, "total_s": None,
        "failed_after_s": 41.7, "phase": "KV_CACHE",
        "error": "the engine failed to boot: CUDA out of memory",
    }  # fmt: skip
    assert history.estimate(key) == {"STARTING": 13.0}  # the failed boot is no ETA
    served = history.previous(key, served=True)
    assert served is not None and served["total_s"] == 13.0


def _status(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """The real CLI's status."""
    return subprocess.run(
        [sys.executable, "-m", "spark_ops.cli.main", "status", *args],
        env=env, capture_output=True, text=True, timeout=180,
    )  # fmt: skip


@pytest.mark.slow
def test_status_exit_codes_on_the_embedded_cluster(sim: Sim, cli_env: dict[str, str]) -> None:
    """Serving 0; the watchdog paused 13; the lock held 15 naming its holder; the engine wedged
    22 (a worker's Ray worker lost); the head down 14 — in the text and in --json alike."""
    from spark_ops.lock import holder_info

    res = _status(cli_env)
    assert res.returncode == ExitStatus.OK, res.stdout + res.stderr
    assert "Verdict: serving" in res.stdout

    pause = sim.history.parent / "pause"  # the watchdog paused: serving, but look
    pause.write_text("maintenance\n")
    try:
        res = _status(cli_env)
        assert res.returncode == ExitStatus.DEGRADED, res.stdout + res.stderr
        assert "Verdict: degraded: watchdog paused" in res.stdout, res.stdout
        doc = _status(cli_env, "--json")
        assert doc.returncode == ExitStatus.DEGRADED
        assert json.loads(doc.stdout)["verdict"] == {
            "state": "degraded",
            "reasons": ["watchdog paused"],
        }
    finally:
        pause.unlink()

    # a colleague's run: the lock held by a live process, as `apply` holds it
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLD, str(sim.inventory)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        res = _status(cli_env)
        assert res.returncode == ExitStatus.RESTARTING, res.stdout + res.stderr
        assert "Verdict: restarting: a run is under way" in res.stdout, res.stdout
        assert holder_info("apply")["user"] in res.stdout
    finally:
        holder.terminate()
        holder.wait(timeout=60)

    # wedged: node3's Ray worker lost while serving (its SSH up); /health still answers, a
    # completion never finishes (a whole worker down wedges a TP engine the same way)
    # (issue 30 #7: wedged is its own state, exit 22: the counters stayed frozen with the
    # probe's request in the engine)
    sim.stop_raylet("node3")
    res = _status(cli_env, "--json")
    assert res.returncode == ExitStatus.WEDGED, res.stdout + res.stderr
    doc = json.loads(res.stdout)
    assert doc["engine"]["up"] is True and doc["engine"]["completion"]["error"] == "timeout"
    assert doc["verdict"]["state"] == "wedged"
    assert doc["verdict"]["reasons"][0].startswith(
        "wedged: /health answers, a 1-token completion did not finish in 10 s and the token "
        "counters stayed frozen with"
    ), doc["verdict"]

    sim.stop_node("node1")
    try:
        res = _status(cli_env)
        assert res.returncode == ExitStatus.NOT_SERVING, res.stdout + res.stderr
        assert "Verdict: not-serving: the head node1 is unreachable" in res.stdout, res.stdout
    finally:
        sim.start_node("node1")


_HOLD = """
import asyncio, sys
from spark_ops.inventory import load_inventory
from spark_ops.lock import cluster_lock
from spark_ops.remote import ClusterSession

async def main():
    cluster = load_inventory(sys.argv[1]).cluster()
    async with ClusterSession(cluster) as s:
        await s.connect()
        async with cluster_lock(s, "apply"):
            print("held", flush=True)
            await asyncio.sleep(600)

asyncio.run(main())
"""


async def _status_async(inventory: Path, *args: str) -> tuple[int, str, str]:
    """The real CLI's status, run without blocking the loop the embedded nodes serve on."""
    env = dict(os.environ, SPARK_OPS_INVENTORY=str(inventory))
    env.pop("SPARK_OPS_CLUSTER", None)
    env.pop("SPARK_OPS_FLEET", None)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "spark_ops.cli.main", "status", *args,
        env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 180)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_unknown_host_keys_are_exit_4(tmp_path: Path) -> None:
    """Host keys unknown: status still prints what it saw, and exits 4 (a set-up problem) with
    `error:`/`hint:` lines; under --json one JSON error object, no plain `hint:` line."""
    nodes, _ = await start_nodes(tmp_path, 2)
    try:
        (tmp_path / "known_hosts").write_text("")
        inventory = tmp_path / "inventory.yaml"
        code, out, err = await _status_async(inventory)
        assert code == ExitStatus.UNREACHABLE, out + err
        assert "Verdict: not-serving" in out, out
        assert "error: SSH refused (host key or credentials): node1:" in err, err
        assert "hint: fix SSH to node1, node2 first" in err, err
        code, out, err = await _status_async(inventory, "--json")
        assert code == ExitStatus.UNREACHABLE, out + err
        assert json.loads(out)["nodes"][0]["refused_by"] == "HostKeyError"
        lines = err.strip().splitlines()
        assert len(lines) == 1 and not any(x.startswith("hint:") for x in lines), err
        error = json.loads(lines[0])
        assert error["error"] == "HostKeyError" and "node1" in error["message"], error
        assert "spark-ops doctor" in error["hint"], error
    finally:
        for n in nodes:
            await n.stop()


@pytest.mark.parametrize("as_json", [False, True])
def test_watch_rounds_are_stamped_and_ctrl_c_ends_it(tmp_path: Path, as_json: bool) -> None:
    """`status --watch`: every round carries its time (a line above the text, `time` in each
    JSON document), and Ctrl-C is how a watch ends: exit 0, no error, no traceback."""
    free = socket.socket()
    free.bind(("127.0.0.1", 0))
    port = free.getsockname()[1]
    free.close()  # nothing listens there: every round finds the head unreachable, at once
    inventory = tmp_path / "inv.yaml"
    inventory.write_text(
        "clusters:\n  t:\n    ssh: {agent: false, config: /dev/null, connect_timeout: 3}\n"
        f"    nodes:\n      node1: {{host: 127.0.0.1, port: {port}, role: head}}\n"
        "    recipe: {path: ~/r.yaml}\n    watchdog: {restart_command: x, history_file: ~/h}\n"
    )
    env = dict(os.environ, SPARK_OPS_INVENTORY=str(inventory))
    env.pop("SPARK_OPS_CLUSTER", None)
    env.pop("SPARK_OPS_FLEET", None)
    args = ["status", "--watch", "0.2", *(["--json"] if as_json else [])]
    proc = subprocess.Popen(
        [sys.executable, "-m", "spark_ops.cli.main", *args],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    rounds: list[str] = []
    for line in proc.stdout:
        stamped = re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d .* every 0.2 s", line)
        if line.startswith("{") if as_json else stamped:
            rounds.append(line)
        if len(rounds) == 2:
            break
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert len(rounds) == 2, out + err
    assert proc.returncode == 0, err
    assert "Traceback" not in err and "error" not in err and "interrupted" not in err, err
    if as_json:
        assert all(isinstance(json.loads(r)["time"], float) for r in rounds)
