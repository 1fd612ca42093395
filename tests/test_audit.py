"""The audit log on the head, real SSH: flock append, head clock, concurrent operators, CLI."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from conftest import cluster_files

from spark_ops import audit
from spark_ops.inventory import Cluster, load_inventory
from spark_ops.remote import ClusterSession

FIXTURES = Path(__file__).parent / "fixtures" / "doctor"
sys.path.insert(0, str(FIXTURES))
from minicluster import MiniCluster  # noqa: E402


@pytest.fixture(scope="module")
def mini(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MiniCluster]:
    """A 2-node embedded cluster (no engine needed), for the whole module."""
    m = MiniCluster(tmp_path_factory.mktemp("audit") / "sim", nodes=2).start(engine=False)
    try:
        yield m
    finally:
        m.stop()


def cluster_in(mini: MiniCluster, state: str) -> Cluster:
    """The cluster with its own state_dir under the head's home (one audit file per test)."""
    base = load_inventory(mini.inventory).cluster()
    return dataclasses.replace(base, state_dir=f"~/.local/state/{state}")


def audit_file(mini: MiniCluster, cluster: Cluster) -> Path:
    """The head's audit file for the cluster (keyed by its watchdog history's real path)."""
    state = cluster.state_dir.replace("~", str(mini.head), 1)
    history = Path(cluster.watchdog.history_file.replace("~", str(mini.head), 1))
    return cluster_files(history, state)["audit"]


async def test_record_then_read(mini: MiniCluster) -> None:
    """An entry comes back whole, with the head's time, who, nodes, a multi-line diff, outcome."""
    cluster = cluster_in(mini, "one")
    diff = "--- a\n+++ b\n@@ -1 +1 @@\n-  max_num_seqs: 6\n+  max_num_seqs: 64\n"
    entry = audit.make_entry(
        "apply", args={"max_num_seqs": 64}, nodes=["node1"], diff=diff, outcome="ok"
    )
    before = time.time()
    async with ClusterSession(cluster) as session:
        await session.connect([cluster.head.name])
        await audit.record(session, entry)
        got = await audit.read(session, 10)
    after = time.time()
    assert len(got) == 1
    e = got[0]
    assert before - 1 <= e["when"] <= after + 1, "when comes from the head's clock"
    assert e["who"] == audit.who() and "@" in e["who"]
    assert e["what"] == {"operation": "apply", "args": {"max_num_seqs": 64}}
    assert e["nodes"] == ["node1"] and e["diff"] == diff and e["outcome"] == "ok"
    path = audit_file(mini, cluster)
    lines = path.read_text().splitlines()
    assert len(lines) == 1 and json.loads(lines[0]) == e, "one line per entry on the head"


async def test_concurrent_operators_never_interleave(mini: MiniCluster) -> None:
    """Four operators' sessions append 40 entries at once (large diffs): 40 whole JSON lines."""
    cluster = cluster_in(mini, "many")
    big = "+" + "x" * 20000 + "\n"  # larger than a pipe buffer: torn writes would show

    async def operator(k: int) -> None:
        """One operator's session recording ten entries concurrently."""
        async with ClusterSession(cluster) as session:
            await session.connect([cluster.head.name])
            await asyncio.gather(
                *(
                    audit.record(session, audit.make_entry(f"op{k}-{i}", diff=big, outcome="ok"))
                    for i in range(10)
                )
            )

    await asyncio.gather(*(operator(k) for k in range(4)))
    path = audit_file(mini, cluster)
    lines = path.read_text().splitlines()
    assert len(lines) == 40
    entries = [json.loads(line) for line in lines]
    assert sorted(e["what"]["operation"] for e in entries) == sorted(
        f"op{k}-{i}" for k in range(4) for i in range(10)
    )
    whens = [e["when"] for e in entries]
    assert whens == sorted(whens), (
        "the head's clock is read under the lock: file order = time order"
    )


async def test_limit_order_malformed_and_empty(mini: MiniCluster) -> None:
    """read() returns the last N oldest first; a hand-edited bad line is reported, not dropped."""
    cluster = cluster_in(mini, "limit")
    async with ClusterSession(cluster) as session:
        await session.connect([cluster.head.name])
        assert await audit.read(session, 5) == []
        for i in range(5):
            await audit.record(session, audit.make_entry(f"op{i}", outcome="ok"))
        path = audit_file(mini, cluster)
        with path.open("a") as f:
            f.write("not json {\n")
        await audit.record(session, {"what": {"operation": "last"}})
        got = await audit.read(session, 3)
        with pytest.raises(ValueError, match="limit"):
            await audit.read(session, 0)
    assert [e.get("what", {}).get("operation") for e in got] == ["op4", None, "last"]
    assert got[1] == {"malformed": "not json {"}
    assert got[2]["who"] == audit.who(), "who is filled in when the caller left it out"


def test_log_cli(mini: MiniCluster, tmp_path: Path) -> None:
    """`spark-ops log` shows the entries for a person and as JSON."""
    data = yaml.safe_load(mini.inventory.read_text())
    data["clusters"]["sim"]["state_dir"] = "~/.local/state/cli"
    inv = tmp_path / "inventory.yaml"
    inv.write_text(yaml.safe_dump(data))
    cluster = load_inventory(inv).cluster()

    async def fill() -> None:
        """Record two entries."""
        async with ClusterSession(cluster) as session:
            await session.connect([cluster.head.name])
            await audit.record(
                session,
                audit.make_entry(
                    "apply", args={"max_num_seqs": 64}, nodes=["node1"], diff="-a\n+b\n",
                    outcome="ok",
                ),
            )  # fmt: skip
            await audit.record(session, audit.make_entry("restart", outcome="boot failed"))

    env = {**os.environ, "SPARK_OPS_INVENTORY": str(inv)}
    cmd = [sys.executable, "-m", "spark_ops.cli.main", "log"]
    empty = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    assert empty.returncode == 0 and "audit log is empty" in empty.stdout
    asyncio.run(fill())
    res = subprocess.run([*cmd, "--json"], env=env, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    got = json.loads(res.stdout)
    assert [e["what"]["operation"] for e in got] == ["apply", "restart"]
    res = subprocess.run(
        [*cmd, "--limit", "1", "--diff"], env=env, capture_output=True, text=True, timeout=60
    )
    assert res.returncode == 0, res.stderr
    assert "restart" in res.stdout and "apply" not in res.stdout
    assert "outcome: boot failed" in res.stdout
    res = subprocess.run([*cmd, "--diff"], env=env, capture_output=True, text=True, timeout=60)
    assert "apply max_num_seqs=64" in res.stdout and "    +b" in res.stdout


async def test_audit_entry_of_an_executed_plan(mini: MiniCluster) -> None:
    """audit_entry: a plan, its options and outcome (or error) as one entry, recorded whole."""
    from spark_ops.errors import BootError
    from spark_ops.recipe import Change
    from spark_ops.verify import Check
    from spark_ops.workflows import ApplyOptions, Outcome, audit_entry
    from spark_ops.workflows.plan import FileChange, Plan

    plan = Plan("apply", "sim")
    plan.changes.append(FileChange("node1", "~/r.yaml", "0" * 64, "-a\n+b\n", "b\n", "a\n"))
    opts = ApplyOptions(changes=[Change.knob("max_num_seqs", 64)], reason="batch work")
    ok = audit_entry(plan, opts, Outcome(plan, ok=True, stamp=17.0, pruned=[17.0]))
    assert ok["what"] == {
        "operation": "apply", "args": {"max_num_seqs": 64, "reason": "batch work"},
    }  # fmt: skip
    assert ok["nodes"] == ["node1"] and ok["diff"] == "-a\n+b\n" and ok["outcome"] == "ok"
    assert ok["detail"] == {"stamp": 17.0, "pruned": [17.0]}
    checks = [Check("xid", "node2", "fail", "Xid 79"), Check("kv-pool", "node1", "ok", "")]
    warned = audit_entry(plan, opts, Outcome(plan, ok=True, checks=checks))
    assert warned["outcome"] == "ok, checks failed: xid@node2"
    failed = audit_entry(plan, opts, failure=BootError("engine log ended during WEIGHTS"))
    assert failed["outcome"] == "failed: engine log ended during WEIGHTS"
    cluster = cluster_in(mini, "entry")
    async with ClusterSession(cluster) as session:
        await session.connect([cluster.head.name])
        await audit.record(session, ok)
        await audit.record(session, failed)
        got = await audit.read(session, 5)
    assert [e["outcome"] for e in got] == ["ok", "failed: engine log ended during WEIGHTS"]


def test_who_is_the_account_not_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """The audit's `who`, the lock's holder and the planned `--by` name the real account:
    $LOGNAME and $USER (anyone's to set, even to bytes that are not UTF-8) are not asked."""
    import pwd
    import socket

    from spark_ops import lock
    from spark_ops.watchdog.contract import operator

    real = pwd.getpwuid(os.getuid()).pw_name
    for var in ("LOGNAME", "USER", "LNAME", "USERNAME"):
        monkeypatch.setenv(var, "mallory\udcff")
    assert audit.who() == f"{real}@{socket.gethostname()}"
    assert audit.make_entry("apply")["who"] == audit.who()
    assert operator().endswith(f":{real}")
    assert "mallory" not in json.dumps(lock.holder_info("apply"), ensure_ascii=False)


async def test_the_executed_plan_is_the_plan_shown(mini: MiniCluster) -> None:
    """execute writes nothing into the plan it is given: the steps' outcomes and what the run
    found (its id, what it wrote, the old KV pool, the restart's clock) stay beside it.

    The restart command fails here (exit 3): the write is undone and no engine boots, and every
    fact a run records has been recorded by then.
    """
    import copy

    from spark_ops.errors import SparkOpsError
    from spark_ops.recipe import Change
    from spark_ops.workflows import ApplyOptions, Operation, plan_apply
    from spark_ops.workflows.execute import execute

    base = cluster_in(mini, "shown")
    failing = dataclasses.replace(base.watchdog, restart_command="exit 3")
    cluster = dataclasses.replace(base, watchdog=failing)
    recipe = mini.recipe.read_text()
    opts = ApplyOptions(changes=[Change.knob("max_num_seqs", 64)], drain=False, preflight="off")
    async with Operation.open(cluster, "apply") as op:
        plan = await plan_apply(op, opts)
        shown, kept = plan.to_dict(), copy.deepcopy(plan)
        assert plan.changes and "restart" in [s["name"] for s in shown["steps"]], shown
        with pytest.raises(SparkOpsError) as failed:
            await execute(op, plan, opts)
    assert "no restart began: the recipe write was undone" in failed.value.message
    assert plan.to_dict() == shown
    assert plan == kept
    assert mini.recipe.read_text() == recipe, "the write was undone"
