"""The OpenSSH ground: real sshd nodes reached with asyncssh, the client key and known_hosts."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import asyncssh
import pytest
from ground import GroundUnavailable
from ground.sshd import (
    OWNER_FILE,
    SshdCluster,
    start_sshd_nodes,
    sweep_stale_users,
    unavailable_reason,
)

pytestmark = pytest.mark.openssh

CONNECT_TIMEOUT = 30


async def _run(cluster: SshdCluster, name: str, command: str, **overrides: object) -> str:
    """Connect to node name (kwargs overridable), run command, return its stdout."""
    kwargs = {**cluster.connect_kwargs(name), "connect_timeout": CONNECT_TIMEOUT, **overrides}
    async with asyncssh.connect(**kwargs) as conn:
        result = await conn.run(command, check=True, timeout=CONNECT_TIMEOUT)
    return str(result.stdout)


async def test_each_node_has_its_own_user_and_home(openssh_cluster: SshdCluster) -> None:
    """Every node logs its own user into its own HOME, which exists and belongs to that user."""
    cluster = openssh_cluster
    assert cluster.names == ["node1", "node2", "node3", "node4"]
    assert len({node.port for node in cluster}) == 4
    assert len({node.host_key_pub for node in cluster}) == 4
    for node in cluster:
        tool = node.home / "bin" / "which-node"  # a per-node program, found through PATH
        tool.write_text(f"#!/bin/sh\necho {node.name}\n")
        tool.chmod(0o755)
        out = await _run(
            cluster,
            node.name,
            'echo "$HOME"; id -un; cd && pwd; echo x > ~/mark; ls ~ | tr "\\n" " "; echo; '
            "which-node",
        )
        home, user, cwd, listing, which = out.splitlines()[:5]
        assert (home, user, cwd) == (str(node.home), node.user, str(node.home))
        assert "mark" in listing
        assert which == node.name
        assert (node.home / "mark").stat().st_uid == node.uid
    homes = {node.home for node in cluster}
    assert len(homes) == 4


def test_known_hosts_lists_every_node_by_port(openssh_cluster: SshdCluster) -> None:
    """known_hosts holds one `[127.0.0.1]:PORT ssh-ed25519 KEY` line per node."""
    lines = openssh_cluster.known_hosts.read_text().splitlines()
    expected = {
        f"[127.0.0.1]:{node.port} ssh-ed25519 {node.host_key_pub.split()[1]}"
        for node in openssh_cluster
    }
    assert set(lines) == expected


async def test_changed_host_key_is_refused(openssh_cluster: SshdCluster) -> None:
    """After rotate_host_key the old known_hosts refuses the node; trusting the new key works."""
    cluster = openssh_cluster
    old = cluster["node2"].host_key_pub
    new = cluster.rotate_host_key("node2")
    assert new != old
    with pytest.raises(asyncssh.HostKeyNotVerifiable):
        await _run(cluster, "node2", "true")
    assert (await _run(cluster, "node1", "echo ok")).strip() == "ok"  # the others are untouched
    cluster.write_known_hosts()
    assert (await _run(cluster, "node2", "echo ok")).strip() == "ok"


async def test_wrong_client_key_is_refused(openssh_cluster: SshdCluster) -> None:
    """A client key that is not in authorized_keys gets PermissionDenied; the right one gets in."""
    stranger = asyncssh.generate_private_key("ssh-ed25519")
    with pytest.raises(asyncssh.PermissionDenied):
        await _run(openssh_cluster, "node1", "true", client_keys=[stranger])
    node = openssh_cluster["node1"]
    with pytest.raises(asyncssh.PermissionDenied):  # right key, another node's user
        await _run(openssh_cluster, "node1", "true", username=openssh_cluster["node2"].user)
    assert (await _run(openssh_cluster, "node1", "id -un")).strip() == node.user


async def test_forty_concurrent_connections_to_one_node(openssh_cluster: SshdCluster) -> None:
    """40 simultaneous connections (past sshd's default MaxStartups of 10) all log in and run."""
    outs = await asyncio.gather(
        *(_run(openssh_cluster, "node3", f"echo {i}") for i in range(40)),
        return_exceptions=True,
    )
    failures = [out for out in outs if isinstance(out, BaseException)]
    assert not failures, failures[:3]
    assert sorted(int(str(out)) for out in outs) == list(range(40))


async def test_stopped_node_refuses_then_comes_back(openssh_cluster: SshdCluster) -> None:
    """stop() drops open sessions and refuses new connections; start() brings the same node back."""
    cluster = openssh_cluster
    kwargs = {**cluster.connect_kwargs("node4"), "connect_timeout": CONNECT_TIMEOUT}
    async with asyncssh.connect(**kwargs) as conn:
        process = await conn.create_process("echo started; sleep 60")
        assert (await process.stdout.readline()).strip() == "started"
        cluster.stop("node4")
        assert not cluster["node4"].running
        await asyncio.wait_for(conn.wait_closed(), timeout=10)
    with pytest.raises(OSError):  # ConnectionRefusedError: nothing listens on the port
        await _run(cluster, "node4", "true")
    assert (await _run(cluster, "node1", "echo up")).strip() == "up"
    cluster.start("node4")
    assert (await _run(cluster, "node4", "echo back")).strip() == "back"


def test_close_removes_users_and_homes(tmp_path: Path) -> None:
    """close() stops the sshd processes and deletes the node users and their homes."""
    reason = unavailable_reason()
    if reason:
        pytest.skip(reason)
    import pwd

    cluster = start_sshd_nodes(2, tmp_path / "ssh", names=["head", "worker"])
    try:
        nodes = list(cluster)
        assert [node.name for node in nodes] == ["head", "worker"]
        procs = [node.proc for node in nodes]
    finally:
        cluster.close()
    for node, proc in zip(nodes, procs, strict=True):
        assert proc is not None and proc.poll() is not None
        assert not node.home.exists()
        with pytest.raises(KeyError):
            pwd.getpwnam(node.user)
    cluster.close()  # idempotent


def test_unavailable_when_not_root_or_no_sshd(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without root or sshd the ground says why, so fixtures skip instead of failing."""
    import ground.sshd as sshd_module

    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    reason = unavailable_reason()
    assert reason is not None and "root" in reason
    with pytest.raises(GroundUnavailable, match="root"):
        start_sshd_nodes(1, tmp_path / "ssh")
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(sshd_module, "SSHD", tmp_path / "no-sshd")
    reason = unavailable_reason()
    assert reason is not None and "openssh-server" in reason


def test_sweep_removes_what_a_dead_run_left(tmp_path: Path) -> None:
    """Users, homes and sshd listeners of a cluster whose owner process died are swept away."""
    reason = unavailable_reason()
    if reason:
        pytest.skip(reason)
    import pwd
    import subprocess

    with start_sshd_nodes(1, tmp_path / "ssh", names=["lost"]) as cluster:
        node = cluster["lost"]
        listener = node.proc
        assert listener is not None
        dead = subprocess.Popen(["true"])
        dead.wait()
        (cluster.home_root / OWNER_FILE).write_text(f"{dead.pid}\n")  # as if the run was killed
        assert node.user in sweep_stale_users()
        assert listener.wait(timeout=10) != 0
        assert not cluster.home_root.exists()
        with pytest.raises(KeyError):
            pwd.getpwnam(node.user)
    # leaving the block closes the cluster: nothing left to close, still fine


async def test_new_node_moves_off_a_taken_port(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A port taken between picking and binding: the new node takes another; known_hosts follows."""
    reason = unavailable_reason()
    if reason:
        pytest.skip(reason)
    import socket

    import ground.sshd as sshd_module

    real_free_port = sshd_module.free_port
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        taken = squatter.getsockname()[1]
        ports = iter([taken])
        monkeypatch.setattr(sshd_module, "free_port", lambda: next(ports, None) or real_free_port())
        with start_sshd_nodes(1, tmp_path / "ssh") as cluster:
            node = cluster["node1"]
            assert node.port != taken
            assert f"Port {node.port}\n" in node.config_path.read_text()
            assert "Address already in use" in cluster.log_text("node1")
            assert cluster.known_hosts.read_text() == node.known_hosts_line() + "\n"
            assert (await _run(cluster, "node1", "echo moved")).strip() == "moved"
