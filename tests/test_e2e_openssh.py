"""End to end over real OpenSSH: apply --max-num-seqs 64 against four sshd nodes (own users).

The head runs a bash watchdog of the community kind (`~/bin/spark-wd`, stamps by `date +%s` under
flock, no stamp printed) and the simulated vLLM from a copy of the package; see
tests/ground/cluster.py for why node users run `/usr/bin/python3` with a private `~/lib`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from ground.cluster import SparkGround, make_spark_ground, run_cli
from ground.sshd import SshdCluster

pytestmark = [pytest.mark.openssh, pytest.mark.slow]


@pytest.fixture
def earlier() -> list[int]:
    """Two earlier automatic restarts: one outside the 6 h window, one inside."""
    now = int(time.time())
    return [now - 30_000, now - 7_200]


@pytest.fixture
def ground_factory(
    openssh_cluster: SshdCluster, tmp_path: Path, earlier: list[int]
) -> Iterator[Callable[[tuple[str, ...]], SparkGround]]:
    """Build the spark-ops ground on the OpenSSH nodes with the recipe on the given nodes."""

    def make(recipe_nodes: tuple[str, ...]) -> SparkGround:
        """Install and start everything; the engine serves with cap 6."""
        return make_spark_ground(
            openssh_cluster, tmp_path / "spark", recipe_nodes=recipe_nodes, earlier_stamps=earlier
        )

    yield make


@pytest.mark.parametrize(
    "recipe_nodes", [("node1",), ("node1", "node2", "node3", "node4")], ids=["head", "all4"]
)
def test_apply_over_openssh(
    ground_factory: Callable[[tuple[str, ...]], SparkGround],
    earlier: list[int],
    recipe_nodes: tuple[str, ...],
) -> None:
    """Recipe changed on every holder, engine restarted with 64, planned stamp pruned, rest kept."""
    g = ground_factory(recipe_nodes)
    before = {n: g.recipe_on(n).read_text() for n in recipe_nodes}
    old_pid = (g.head.home / ".watchdog" / "engine.pid").read_text().strip()
    log_offset = g.engine_log.stat().st_size
    assert g.stamps() == [str(s) for s in earlier]

    started = time.monotonic()
    res = run_cli(g.env(), "apply", "--max-num-seqs", "64", "--yes", "--json")
    took = time.monotonic() - started
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout)

    for name in recipe_nodes:
        new = g.recipe_on(name).read_text()
        changed = [
            (a, b)
            for a, b in zip(before[name].splitlines(), new.splitlines(), strict=True)
            if a != b
        ]
        assert changed == [
            (
                "  max_num_seqs: 6          # interactive default; raise for batch work",
                "  max_num_seqs: 64          # interactive default; raise for batch work",
            )
        ], name
        backups = list(g.recipe_on(name).parent.glob(g.recipe_on(name).name + ".bak.*"))
        assert [b.read_text() for b in backups] == [before[name]], name

    new_pid = (g.head.home / ".watchdog" / "engine.pid").read_text().strip()
    assert new_pid != old_pid, "the bash watchdog started a new engine"
    new_log = g.engine_log.read_text()[log_offset:]
    assert "'max_num_seqs': 64" in new_log
    assert out["boot"]["non_default_args"]["max_num_seqs"] == 64

    stamp = out["stamp"]
    assert stamp is not None and out["pruned"] == [stamp], "found by the head's clock, pruned"
    assert g.stamps() == [str(s) for s in earlier], "earlier stamps kept verbatim"
    backups = sorted(g.history.parent.glob("restart_history.bak.*"))
    assert backups and str(int(stamp)) in backups[-1].read_text().split()
    assert all(c["ok"] for c in out["checks"]), out["checks"]
    assert out["budget"]["used"] == 1, "only the in-window earlier restart counts"

    for node in g.cluster:
        assert f"Accepted publickey for {node.user}" in g.cluster.log_text(node.name)
    print(f"\napply over OpenSSH ({len(recipe_nodes)} recipe copies): {took:.1f} s")
