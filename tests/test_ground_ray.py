"""The real-Ray ground itself: two raylets in two namespaces, read by spark-ops' Ray parsers.

`ray status` and `ray list nodes --format json` come from the real head (198.18.0.1, inside its
namespace); spark_ops.verify's parsers were written on recordings, here they read the live output.
Then the worker's raylet is killed by pid and the head is read until it says so.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from ground.ray import HEAD_IP, WORKER_IP, RayCluster, netns_pids, ray_unavailable_reason
from ground.sshd import pid_alive

from spark_ops.verify import check_ray_nodes, missing_nodes, parse_ray_nodes, parse_ray_status

pytestmark = [pytest.mark.realray, pytest.mark.slow]


@pytest.mark.timeout(300)
def test_two_nodes_read_by_the_parsers_then_worker_lost(real_ray: RayCluster) -> None:
    """2 active nodes and 2 ALIVE; raylet SIGKILLed: the head reports 1 and the worker DEAD."""
    ray = real_ray
    status = parse_ray_status(ray.status_text())
    assert status.reachable and status.ready and len(status.active) == 2, status
    assert status.resources["vcpu"][1] == 2.0, status.resources
    assert check_ray_nodes(status, expected=2).ok
    nodes = parse_ray_nodes(ray.list_nodes_json())
    assert {(n.ip, n.is_head, n.alive) for n in nodes} == {
        (HEAD_IP, True, True),
        (WORKER_IP, False, True),
    }
    expected = {"node1": HEAD_IP, "node2": WORKER_IP}
    assert missing_nodes(expected, nodes) == []

    # the ground's own rules: fixed ports in our namespaces, the veth named the same on both ends
    assert ray.raylet_pid(ray.head_ns) != ray.raylet_pid(ray.worker_ns)
    for ns in (ray.head_ns, ray.worker_ns):
        out = ray.ray("--version", ns=ns).stdout
        assert "2.60.0" in out
        links = Path(f"/run/netns/{ns}").exists()
        assert links, ns

    killed_at = time.monotonic()
    ray.kill_worker_raylet()
    dead_after = None
    while time.monotonic() - killed_at < 120:
        nodes = parse_ray_nodes(ray.list_nodes_json())
        if missing_nodes(expected, nodes) == ["node2"]:
            dead_after = time.monotonic() - killed_at
            break
        time.sleep(1.0)
    assert dead_after is not None, [n.to_dict() for n in nodes]
    worker = next(n for n in nodes if n.ip == WORKER_IP)
    assert worker.state == "DEAD" and worker.state_message, worker
    ray.wait_active(1, timeout=60)
    one = parse_ray_status(ray.status_text())
    assert not check_ray_nodes(one, expected=2).ok
    print(f"\nworker DEAD in `ray list nodes` {dead_after:.1f} s after the raylet's SIGKILL")

    # the worker comes back (a new raylet): both active again
    ray.start_worker()
    assert len(parse_ray_status(ray.status_text()).active) == 2


@pytest.mark.timeout(300)
def test_close_leaves_nothing(tmp_path: Path) -> None:
    """close(): no process in the namespaces, the namespaces and temp dirs gone; idempotent."""
    from ground import GroundUnavailable

    reason = ray_unavailable_reason()
    if reason:
        pytest.skip(reason)
    try:
        cluster = RayCluster(tmp_path / "ray")
    except GroundUnavailable as exc:  # pragma: no cover - covered by the reason above
        pytest.skip(str(exc))
    try:
        cluster.start_head()
        pids = netns_pids(cluster.head_ns)
        assert pids and cluster.raylet_pid(cluster.head_ns) in pids
        assert cluster.temp_root.is_dir()
    finally:
        cluster.close()
    for ns in (cluster.head_ns, cluster.worker_ns):
        assert not Path(f"/run/netns/{ns}").exists(), ns
    assert not cluster.temp_root.exists()
    assert not [p for p in pids if pid_alive(p)], pids
    cluster.close()


def test_sweep_removes_a_dead_runs_namespaces() -> None:
    """A namespace whose owner pid is gone is deleted (with its processes); a live owner's stays."""
    import subprocess

    from ground.ray import sweep_stale_namespaces

    reason = ray_unavailable_reason()
    if reason:
        pytest.skip(reason)
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale, live = f"sray-{dead.pid}-0ddba11-h", f"sray-{os.getpid()}-0ddba11-w"
    for ns in (stale, live):
        subprocess.run(["ip", "netns", "add", ns], check=True)
    sleeper = subprocess.Popen(["ip", "netns", "exec", stale, "sleep", "600"])
    try:
        _wait_for(lambda: sleeper.pid in netns_pids(stale))
        assert stale in sweep_stale_namespaces()
        assert not Path(f"/run/netns/{stale}").exists()
        assert sleeper.wait(timeout=10) != 0, "its process was killed"
        assert Path(f"/run/netns/{live}").exists(), "a live owner's namespace stays"
    finally:
        sleeper.kill()
        for ns in (stale, live):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False)


def _wait_for(cond: Callable[[], bool], timeout: float = 10.0) -> None:
    """Wait until cond() holds (AssertionError at the deadline)."""
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)
