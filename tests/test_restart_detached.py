"""A restart command outlives the connection that started it.

`watchdog/contract.py` runs the inventory's restart command through `DETACHED_RESTART`
(remote/programs/watchdog.py): its own session, its output in files. Lost mid-restart (the
operator's VPN, a killed spark-ops), the connection takes the plain command down with it: the
embedded node signals the command's process group when its channel closes, and under OpenSSH the
command's next write to the closed channel kills it (SIGPIPE). A watchdog's restart stopped there
has stopped the engine and never starts it. Each ground runs the same restart plainly (torn: the
test tells) and detached (it runs to its end, and what it printed is kept beside it).
"""

from __future__ import annotations

import asyncio
import time

import pytest
from ground.cluster import bare_cluster
from ground.sshd import SshdCluster

from spark_ops.errors import CommandTimeout
from spark_ops.inventory import Cluster
from spark_ops.remote import ClusterSession
from spark_ops.remote.programs.watchdog import DETACHED_RESTART

# stops, prints, starts: the write after the pause is where a lost connection stops it
RESTART = 'echo stopping; sleep 4; echo starting; echo started > "$HOME/restarted"'
KEPT = "$HOME/spark-ops-restart."  # the output files a lost connection leaves (TMPDIR=$HOME)


async def _lose_connection_mid_restart(c: Cluster, *, detached: bool, wait_s: float) -> str:
    """Start the restart, lose the connection 0.3 s in, then read what it left: the marker (the
    restart's end) and the output files kept, `marker|files`."""
    line = "TMPDIR=$HOME " + DETACHED_RESTART.line(RESTART) if detached else RESTART
    async with ClusterSession(c) as s:
        await s.connect([c.head.name])
        await s.run(c.head.name, f'rm -f ~/restarted "{KEPT}"*')
        with pytest.raises(CommandTimeout):
            await s.run(c.head.name, line, timeout=0.3)
    end = time.monotonic() + wait_s
    async with ClusterSession(c) as s:
        await s.connect([c.head.name])
        while True:
            res = await s.run(
                c.head.name, f'cat ~/restarted 2>/dev/null; echo "|"; cat "{KEPT}"* 2>/dev/null; :'
            )
            if res.stdout.startswith("started") or time.monotonic() > end:
                await s.run(c.head.name, f'rm -f ~/restarted "{KEPT}"*')
                return res.stdout
            await asyncio.sleep(0.3)


async def _check(c: Cluster) -> None:
    """Torn when run plainly; run to its end when detached, its output kept; a restart whose
    connection stays gives back its output and code and leaves no file."""
    async with ClusterSession(c) as s:
        await s.connect([c.head.name])
        line = DETACHED_RESTART.line("echo out; echo err >&2; exit 3")
        res = await s.run(c.head.name, "TMPDIR=$HOME " + line, check=False)
        assert (res.exit_code, res.stdout, res.stderr) == (3, "out\n", "err\n")
        left = await s.run(c.head.name, f'ls -d "{KEPT}"* 2>/dev/null; :')
        assert left.stdout == "", "no output file is left when the output was given back"
    plain = await _lose_connection_mid_restart(c, detached=False, wait_s=7)
    assert not plain.startswith("started"), f"the plain restart was not torn: {plain!r}"
    detached = await _lose_connection_mid_restart(c, detached=True, wait_s=60)
    assert detached.startswith("started\n"), f"the detached restart did not finish: {detached!r}"
    assert "stopping\nstarting\n" in detached, "what the restart printed is kept on the head"


async def test_a_restart_outlives_the_embedded_nodes_session(one_node: Cluster) -> None:
    """The embedded node: the session's process group is signalled; the detached restart is not
    in it."""
    await _check(one_node)


@pytest.mark.openssh
async def test_a_restart_outlives_its_openssh_connection(openssh_cluster: SshdCluster) -> None:
    """OpenSSH: the closed channel kills the plain restart at its next write; the detached one
    writes to its files."""
    await _check(bare_cluster(openssh_cluster))
