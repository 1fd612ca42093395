"""SSH limits on real OpenSSH nodes: one shared jump connection, the per-connection channel cap."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from ground.cluster import bare_cluster
from ground.fixtures import sshd_nodes
from ground.sshd import SshdCluster

from spark_ops.errors import ConnectError, RemoteError
from spark_ops.inventory import Cluster
from spark_ops.remote import ClusterSession

pytestmark = pytest.mark.openssh


def inventory(ground: SshdCluster, *, jump: str | None = None, max_channels: int = 8) -> Cluster:
    """A cluster over the ground's nodes; known_hosts and key only in the inventory."""
    return bare_cluster(ground, max_channels=max_channels, **({"jump": jump} if jump else {}))


def accepted(ground: SshdCluster, name: str) -> int:
    """How many logins a node's sshd accepted so far."""
    return ground.log_text(name).count("Accepted publickey")


async def test_nodes_through_one_shared_jump_connection(openssh_cluster: SshdCluster) -> None:
    """ssh.jump: all nodes reached through ONE login on the jump host, with the inventory's keys."""
    ground = openssh_cluster
    bastion = ground["node1"]
    cluster = inventory(ground, jump=f"{bastion.user}@{bastion.host}:{bastion.port}")
    before = {n.name: accepted(ground, n.name) for n in ground}
    async with ClusterSession(cluster) as session:
        await session.connect()
        users = await asyncio.gather(*(session.run(n.name, "id -un") for n in ground))
        assert [r.stdout.strip() for r in users] == [n.user for n in ground]
    logins = {n.name: accepted(ground, n.name) - before[n.name] for n in ground}
    # node1 is the jump host (one login) and a node (one login through its own tunnel)
    assert logins == {"node1": 2, "node2": 1, "node3": 1, "node4": 1}, logins


async def test_unreachable_jump_is_one_clear_error(openssh_cluster: SshdCluster) -> None:
    """A jump host that refuses is named once, not four times, and no node is half-connected."""
    ground = openssh_cluster
    bastion = ground["node1"]
    ground.stop("node1")
    cluster = inventory(ground, jump=f"{bastion.user}@{bastion.host}:{bastion.port}")
    async with ClusterSession(cluster) as session:
        with pytest.raises(ConnectError) as info:
            await session.connect()
        assert session.connectors == {}
    err = info.value
    assert err.host == "jump host"
    assert err.message.startswith(f"jump host: cannot connect to {bastion.host}:{bastion.port}")
    assert err.message.count(f"{bastion.host}:{bastion.port}") == 1, err.message


@pytest.fixture
def default_limits_node(tmp_path: Path) -> Iterator[SshdCluster]:
    """One sshd with sshd's own MaxSessions default (10 channels per connection)."""
    with sshd_nodes(1, tmp_path / "limits", options={"MaxSessions": "10"}) as ground:
        yield ground


async def _many(cluster: Cluster, n: int, seconds: float) -> list[Any]:
    """n concurrent commands of `seconds` each on node1's one connection; results or errors."""
    async with ClusterSession(cluster) as session:
        await session.connect()
        return await asyncio.gather(
            *(session.run("node1", f"sleep {seconds}; echo {i}") for i in range(n)),
            return_exceptions=True,
        )


async def test_channel_cap_keeps_under_maxsessions(default_limits_node: SshdCluster) -> None:
    """30 commands at once on one connection: all pass with the default cap of 8 channels."""
    results = await _many(inventory(default_limits_node), 30, 0.3)
    failed = [r for r in results if isinstance(r, Exception)]
    assert not failed, failed[:3]
    assert [r.stdout.strip() for r in results] == [str(i) for i in range(30)]
    # without the cap sshd refuses the 11th session (for longer than the retries wait), and the
    # error says what to change
    uncapped = await _many(inventory(default_limits_node, max_channels=30), 30, 2)
    refused = [r for r in uncapped if isinstance(r, RemoteError)]
    assert refused, "sshd's MaxSessions 10 should refuse some of 30 concurrent sessions"
    assert "refused a new session" in refused[0].message
    assert refused[0].hint is not None and "max_channels" in refused[0].hint
