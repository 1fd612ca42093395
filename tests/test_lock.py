"""The cluster lock on a real head (embedded SSH nodes): a second operator is refused while the
first holds it, told who; the lock is free again once the holder lets go or its connection drops.

These fail when locking is a no-op (cluster_lock yielding without taking, or the head's program
not calling flock): every assertion that someone is refused needs a lock that was really held.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from embedded import start_nodes

from spark_ops.errors import LockError
from spark_ops.inventory import Cluster
from spark_ops.lock import cluster_lock
from spark_ops.remote import ClusterSession
from spark_ops.sim.node import SimNode


@pytest.fixture
async def head(tmp_path: Path) -> AsyncIterator[tuple[SimNode, Cluster]]:
    """One embedded head whose state dir is the test's own."""
    nodes, cluster = await start_nodes(tmp_path, 1)
    state = tmp_path / "state"
    try:
        yield nodes[0], dataclasses.replace(cluster, state_dir=str(state))
    finally:
        for n in nodes:
            await n.stop()


async def test_second_operator_is_refused_and_told_who(head: tuple[SimNode, Cluster]) -> None:
    """While A holds the lock, B (its own connection) is refused naming A's operation; after A
    let go, B takes it."""
    _, cluster = head
    async with ClusterSession(cluster) as a, ClusterSession(cluster) as b:
        await a.connect()
        await b.connect()
        async with cluster_lock(a, "apply --max-num-seqs 64") as mine:
            with pytest.raises(LockError, match=r"locked by .*\(pid \d+, apply --max-num-seqs 64"):
                async with cluster_lock(b, "restart"):
                    pytest.fail("two operators held the cluster lock at once")
            assert mine["operation"] == "apply --max-num-seqs 64"
        async with cluster_lock(b, "restart"):
            pass


async def test_operators_at_once_run_one_after_another(head: tuple[SimNode, Cluster]) -> None:
    """Four operators, connected, try at the same moment, each retrying while refused: their
    critical sections on the head never overlap, and every one of them ran."""
    node, cluster = head
    trace = node.spec.home / "trace"
    connected, go = [0], asyncio.Event()

    async def operator(i: int) -> int:
        """Take the lock (retrying while refused), mark start and end on the head."""
        refusals = 0
        async with ClusterSession(cluster) as s:
            await s.connect()
            connected[0] += 1
            if connected[0] == 4:
                go.set()
            await go.wait()
            while True:
                try:
                    async with cluster_lock(s, f"op{i}"):
                        await s.run(cluster.head.name, f"echo start {i} >> ~/trace")
                        await asyncio.sleep(0.2)
                        await s.run(cluster.head.name, f"echo end {i} >> ~/trace")
                        return refusals
                except LockError:
                    refusals += 1
                    await asyncio.sleep(0.05)

    refused = await asyncio.gather(*(operator(i) for i in range(4)))
    lines = trace.read_text().split("\n")[:-1]
    assert len(lines) == 8
    for k in range(0, 8, 2):
        start, end = lines[k].split(), lines[k + 1].split()
        assert start[0] == "start" and end == ["end", start[1]], f"sections overlap: {lines}"
    assert sorted(int(x.split()[1]) for x in lines[::2]) == [0, 1, 2, 3]
    assert len(refused) == 4


HOLDER = """
import asyncio, json, sys
from spark_ops.inventory import parse_inventory
from spark_ops.lock import cluster_lock
from spark_ops.remote import ClusterSession

async def main():
    cluster = parse_inventory(sys.stdin.read(), "holder").cluster()
    async with ClusterSession(cluster) as s:
        await s.connect()
        async with cluster_lock(s, "holder"):
            print("HELD", flush=True)
            await asyncio.sleep(600)

asyncio.run(main())
"""


async def test_sigkilled_holder_is_refused_to_others_then_frees(
    head: tuple[SimNode, Cluster], tmp_path: Path
) -> None:
    """A process holds the lock: another operator is refused. SIGKILL it: its connection
    drops, the head releases the lock, and the next operator takes it (no stale lock)."""
    _, cluster = head
    inventory = inventory_text(cluster, tmp_path)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", HOLDER, stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        assert proc.stdin and proc.stdout
        proc.stdin.write(inventory.encode())
        proc.stdin.close()
        line = await asyncio.wait_for(proc.stdout.readline(), 60)
        assert line == b"HELD\n", (line, await proc.stderr.read() if proc.stderr else b"")
        async with ClusterSession(cluster) as s:
            await s.connect()
            with pytest.raises(LockError, match=r"pid \d+, holder"):
                async with cluster_lock(s, "restart"):
                    pytest.fail("the holder's lock was not held")
            proc.kill()
            await proc.wait()
            for _ in range(300):  # released when the head sees the connection gone
                try:
                    async with cluster_lock(s, "restart"):
                        break
                except LockError:
                    await asyncio.sleep(0.1)
            else:
                pytest.fail("the lock of a SIGKILLed holder was still held after 30 s")
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


def inventory_text(cluster: Cluster, root: Path) -> str:
    """An inventory file's text reaching the same head as `cluster` (as start_nodes writes it)."""
    head = cluster.head
    data = {
        "clusters": {
            cluster.name: {
                "ssh": {
                    "known_hosts": str(root / "known_hosts"),
                    "identity": str(root / "id"),
                    "agent": False,
                    "config": "/dev/null",
                },
                "nodes": {head.name: {"host": head.host, "port": head.port, "role": "head"}},
                "recipe": {"path": cluster.recipe.path},
                "watchdog": {"restart_command": "true", "history_file": "~/h"},
                "state_dir": cluster.state_dir,
            }
        }
    }
    return json.dumps(data)


def test_one_lock_probe_free_held_and_read_only(tmp_path: Path) -> None:
    """remote/programs/lock.py's LOCK_FREE_SH, the one sh probe of a flock (status' and doctor's
    cluster-lock state, doctor's history-lock check), on real sh and flock(1), and its Python twin
    headlib.flock.lock_free (the reference watchdog's "restart in progress"), agree: free, then
    held by another process, then free again; a read-only lock file is probed too. No other module
    writes `flock -n`, and none but headlib/flock.py calls fcntl.flock (one flock in Python)."""
    import subprocess

    from spark_ops.headlib.flock import lock_free
    from spark_ops.remote.programs.lock import LOCK_FREE_SH

    def free(path: Path) -> bool:
        """Whether the probe says path's lock is free (the sh and the Python probe alike)."""
        script = LOCK_FREE_SH + 'lock_free "$1"'
        sh = subprocess.run(["sh", "-c", script, "sh", str(path)], check=False).returncode == 0
        assert lock_free(str(path)) is sh, path
        return sh

    lock = tmp_path / "odd name $(touch PWNED).lock"
    lock.write_text("")
    lock.chmod(0o444)
    assert free(lock)
    holder = subprocess.Popen(  # one process holds it: once reaped, the lock is gone
        [
            sys.executable,
            "-c",
            "import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDONLY); "
            "fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); time.sleep(60)",
            str(lock),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        assert not free(lock)
    finally:
        holder.kill()
        holder.wait()
    assert free(lock)
    assert not (tmp_path / "PWNED").exists() and not Path("PWNED").exists()

    repo = Path(__file__).resolve().parents[1]  # the package and the reference watchdog beside it
    sources = [*(repo / "spark_ops").rglob("*.py"), *(repo / "refwatchdog").rglob("*.py")]
    writers = sorted(
        p.relative_to(repo).as_posix() for p in sources if "flock -n" in p.read_text("utf-8")
    )
    assert writers == ["spark_ops/remote/programs/lock.py"], "probe with LOCK_FREE_SH, not a copy"
    flockers = sorted(
        p.relative_to(repo).as_posix() for p in sources if "fcntl.flock(" in p.read_text("utf-8")
    )
    assert flockers == ["spark_ops/headlib/flock.py"], "lock with headlib.flock, not a copy of it"
