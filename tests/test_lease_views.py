"""The pause file as the views read it, through the real contract code over a local transport
(tests/local_connector.py): a lapsed lease is no pause (and named), content the head cannot hand
back as text (not UTF-8, a directory) is a pause as the watchdog reads it, and an inventory
pause_file that is not the watchdog's own is said (red team F4)."""

from __future__ import annotations

import functools
import json
import time
from pathlib import Path

import pytest
from local_connector import LocalConnector

from spark_ops.inventory import Cluster, parse_inventory
from spark_ops.remote import ClusterSession
from spark_ops.watchdog.contract import WatchdogContract
from spark_ops.watchdog.lease import pause_shown


def _cluster(tmp_path: Path, pause_file: str) -> Cluster:
    """A one-node cluster whose head is this machine, its reference watchdog's config in home."""
    home = tmp_path / "home"
    (home / "wd").mkdir(parents=True, exist_ok=True)
    (home / "wd" / "restart-history").write_text("")
    (home / "wd.yaml").write_text(
        json.dumps(
            {"paths": {"dir": str(home / "wd")}, "action": {"kind": "command", "start": ["true"]}}
        )
    )
    text = (
        "clusters:\n  t:\n    nodes:\n      node1: {host: 127.0.0.1, role: head}\n"
        f"    state_dir: {tmp_path / 'state'}\n    recipe: {{path: ~/r.yaml}}\n"
        "    watchdog:\n      restart_command: spark-watchdog --config ~/wd.yaml --restart-now\n"
        f"      history_file: ~/wd/restart-history\n      pause_file: {pause_file}\n"
    )
    return parse_inventory(text, "t.yaml").cluster()


async def _read(tmp_path: Path, pause_file: str) -> tuple[dict, str]:
    """The budget's dict and the pause-file comparison, read through the contract."""
    cluster = _cluster(tmp_path, pause_file)
    factory = functools.partial(LocalConnector, home=tmp_path / "home")
    async with ClusterSession(cluster, connector_factory=factory) as session:
        await session.connect()
        contract = WatchdogContract(session)
        return (await contract.budget()).to_dict(), await contract.pause_file_disagrees()


LAPSED = {"spark-ops-lease": 1, "holder": "spark-ops:eve", "run": "zzz", "expires": 1000}
LIVE = "live"  # built when the case runs: an expiry taken at collection lapses in a long suite


@pytest.mark.parametrize(
    ("content", "paused", "shown"),
    [
        (None, False, None),
        (json.dumps(LAPSED).encode(), False, "lapsed"),
        (LIVE, True, "paused"),
        (b"bob: disk swap\n", True, "paused"),
        (b"", True, "paused"),
        (b"caf\xe9 maintenance\n", True, "paused"),  # not UTF-8: a pause, never a failed budget
        ("dir", True, "paused"),
    ],
    # named, not by their values, so every xdist worker collects the same ids
    ids=["none", "lapsed-lease", "live-lease", "note", "empty", "not-utf8", "directory"],
)
async def test_the_budget_reads_the_pause_as_the_watchdog_does(
    tmp_path: Path, content: bytes | str | None, paused: bool, shown: str | None
) -> None:
    """paused only while a pause is in force; a lapsed lease is named, not a pause."""
    pause = tmp_path / "home" / "wd" / "pause"
    pause.parent.mkdir(parents=True, exist_ok=True)
    if content == "dir":
        pause.mkdir()
    elif content == LIVE:
        pause.write_text(json.dumps(dict(LAPSED, expires=time.time() + 600, run="live")))
    elif isinstance(content, bytes):
        pause.write_bytes(content)
    budget, wrong = await _read(tmp_path, "~/wd/pause")
    assert budget["paused"] is paused and wrong == ""
    got = pause_shown(budget)
    assert (got[0] if got else None) == shown == (budget["pause"] or {}).get("state")


async def test_a_pause_file_the_watchdog_does_not_read_is_said(tmp_path: Path) -> None:
    """Red team F4: `pauses` for `pause`: named, with the one the watchdog's config says."""
    _, wrong = await _read(tmp_path, "~/wd/pauses")
    assert "~/wd/pauses" in wrong and "says ~/wd/pause:" in wrong and "pauses nothing" in wrong
