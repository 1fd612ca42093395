"""The cluster lock needs only the Connector base class: held over a second, real transport (this
machine's sh, tests/local_connector.py); a transport that cannot hold a command's stdin open says
so, naming itself, and no lock is taken."""

from __future__ import annotations

import asyncio
import functools
from pathlib import Path
from typing import Any

import pytest
from local_connector import LocalConnector

from spark_ops.errors import LockError, RemoteError
from spark_ops.inventory import Cluster, Node, SSHSettings, parse_inventory
from spark_ops.lock import cluster_lock
from spark_ops.remote import ClusterSession, Connector, Result


def _cluster(tmp_path: Path) -> Cluster:
    """A one-node cluster whose lock lives under tmp_path."""
    text = (
        "clusters:\n  t:\n    nodes:\n      node1: {host: 127.0.0.1, role: head}\n"
        f"    state_dir: {tmp_path / 'state'}\n"
        "    recipe: {path: ~/r.yaml}\n    watchdog: {restart_command: x, history_file: ~/h}\n"
    )
    return parse_inventory(text, "t.yaml").cluster()


def _local(home: Path) -> Any:
    """A connector factory for ClusterSession: LocalConnector in home."""
    return functools.partial(LocalConnector, home=home)


async def test_lock_held_over_a_local_connector(tmp_path: Path) -> None:
    """A holds the lock over LocalConnector; B is refused and told who; when A's holder dies
    (SIGKILL, its channel gone), the lock is free at once for B."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "r.yaml").write_text("x: 1\n")
    cluster = _cluster(tmp_path)
    async with (
        ClusterSession(cluster, connector_factory=_local(home)) as sa,
        ClusterSession(cluster, connector_factory=_local(home)) as sb,
    ):
        await sa.connect()
        await sb.connect()
        async with cluster_lock(sa, "apply"):
            with pytest.raises(LockError, match=r"locked by .*\(pid \d+, apply"):
                async with cluster_lock(sb, "restart"):
                    pass
            conn = sa.connector("node1")
            assert isinstance(conn, LocalConnector) and len(conn.held) == 1
            conn.held[0].kill()
            await asyncio.wait_for(conn.held[0].proc.wait(), 10)
            async with cluster_lock(sb, "restart"):  # free once the holder is gone
                pass


class _NoHold(Connector):
    """A transport that runs commands but implements nothing for the lock."""

    async def connect(self) -> None:
        """Nothing to open."""

    async def run(self, command: str, *, input: str | None = None, timeout: float) -> Result:
        """Never reached in this test."""
        raise AssertionError("the lock must not fall back to plain commands")

    async def stream(self, command: str) -> Any:
        """Never reached in this test."""
        raise AssertionError("not used")

    async def forward(self, dest_host: str, dest_port: int) -> int:
        """Never reached in this test."""
        raise AssertionError("not used")

    async def close(self) -> None:
        """Nothing to close."""


async def test_a_transport_without_held_processes_says_so(tmp_path: Path) -> None:
    """The base class's process() refuses, naming the transport and the lock; nothing runs."""

    def factory(node: Node, ssh: SSHSettings) -> Connector:
        """The transport under test."""
        return _NoHold(node)

    async with ClusterSession(_cluster(tmp_path), connector_factory=factory) as s:
        await s.connect()
        with pytest.raises(RemoteError, match=r"_NoHold transport cannot hold .* cluster lock"):
            async with cluster_lock(s, "apply"):
                pass
