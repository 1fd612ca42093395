"""The cluster lock and audit log are the cluster's own, shared by every operator's account.

On the OpenSSH ground the four sshd nodes run on one kernel, each letting in one Unix user: two
of them stand for two operators reaching the same head as different SSH users (issue 13 #8: keyed
by inventory name and the SSH user's $HOME, two applies ran at once). Both name the watchdog's
history by the same absolute path under two different cluster names (the lock's key, issue 20 #8);
the second is refused, told who holds it, and both append to one audit log.
"""

from __future__ import annotations

import dataclasses
import grp
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from ground.cluster import bare_cluster

from spark_ops import audit
from spark_ops.errors import LockError
from spark_ops.inventory import Cluster, RecipeSettings
from spark_ops.lock import cluster_lock
from spark_ops.remote import ClusterSession
from spark_ops.remote.programs.lock import OPERATORS_GROUP

pytestmark = pytest.mark.openssh


def operators_dir(path: str) -> None:
    """A state dir as the one-time set-up makes it: the operators' group's, 2770."""
    os.makedirs(path, exist_ok=True)
    os.chown(path, 0, grp.getgrnam(OPERATORS_GROUP).gr_gid)
    os.chmod(path, 0o2770)


def as_operator(
    ground: Any, node: str, name: str, recipe: str, state: str, history: str
) -> Cluster:
    """The cluster as an operator logging in as `node`'s user sees it (that node its head)."""
    base = bare_cluster(ground)
    nodes = tuple(
        dataclasses.replace(n, role="head" if n.name == node else "worker") for n in base.nodes
    )
    return dataclasses.replace(
        base, name=name, nodes=nodes, recipe=RecipeSettings(recipe, (node,)), state_dir=state,
        watchdog=dataclasses.replace(base.watchdog, history_file=history),
    )  # fmt: skip


async def test_two_ssh_users_one_cluster_one_lock(openssh_cluster: Any, tmp_path: Path) -> None:
    """Operator A (node1's user) holds the lock; operator B (node2's user, another inventory
    name) is refused with A named; both entries land in the one audit log."""
    state = f"/var/tmp/spark-ops-test-{tmp_path.name}"  # the operators' own, as set up once
    operators_dir(state)
    recipe = str(tmp_path / "recipes" / "active.yaml")
    history = str(tmp_path / "watchdog" / "restarts")  # one watchdog: the same name for both
    a = as_operator(openssh_cluster, "node1", "spark", recipe, state, history)
    b = as_operator(openssh_cluster, "node2", "prod-4x", recipe, state, history)
    try:
        async with ClusterSession(a) as sa, ClusterSession(b) as sb:
            await sa.connect([a.head.name])
            await sb.connect([b.head.name])
            async with cluster_lock(sa, "apply"):
                with pytest.raises(LockError, match=r"locked by .*\(pid \d+, apply"):
                    async with cluster_lock(sb, "restart"):
                        pass
                await audit.record(sa, audit.make_entry("apply", outcome="ok"))
            await audit.record(sb, audit.make_entry("restart", outcome="ok"))
            async with cluster_lock(sb, "restart"):  # free once A let go
                pass
            entries = await audit.read(sa, 10)
        assert [e["what"]["operation"] for e in entries] == ["apply", "restart"]
        assert oct(Path(state).stat().st_mode & 0o7777) == "0o2770"
        for f in Path(state).iterdir():  # no file any other account could write (issue 34)
            assert f.stat().st_mode & 0o002 == 0, f
    finally:
        shutil.rmtree(state, ignore_errors=True)
