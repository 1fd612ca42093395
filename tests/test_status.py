"""`status` tells a script or an alert how the cluster stands: a verdict, its reasons, an exit code.

The rules are data (tests/fixtures/status/verdict.yaml, one runner); the embedded cluster shows
the codes end to end: serving 0, the watchdog paused 13, a colleague's run under way 15, the
engine wedged (health answers, a completion never finishes) 14, the head down 14.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import Sim

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
