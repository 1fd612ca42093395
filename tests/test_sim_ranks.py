"""Ranks without Ray (issue 33): the embedded cluster launches one engine rank per node as
eugr/spark-vllm-docker's launcher does, and spark-ops follows, fails and verifies the boot on
every rank.

Fast cases: the readiness of an engine run as ranks read from given lines (a worker rank's fatal
line names its node; READY waits until every worker rank started anew), rank 0's meeting (no rank
told to go before every rank joined), the per-rank args check, the inventory's engine.executor,
the two recipe shapes. Slow cases (the embedded cluster in rank mode, real SSH): apply
--max-num-seqs 64, restart, rollback and experiment; a worker rank that fails at start named
before the deadline while rank 0 hangs; a rank of the old engine that lingers, failed by verify
and then refused by the next plan, doctor naming the same.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import Sim, start_sim

from spark_ops.errors import BootError, ExitStatus, InventoryError
from spark_ops.inventory import load_inventory
from spark_ops.readiness import BootEvent, wait_for_boot

HEAD = [
    "(APIServer pid=100) INFO 12-03 10:00:00 [api_utils.py:286] non-default args: "
    "{'model_tag': 'm', 'max_num_seqs': 64, 'nnodes': 3, 'node_rank': 0}",
    "(EngineCore pid=101) INFO 12-03 10:00:00 [core.py:133] Initializing a V1 LLM engine "
    "(v0.32.0) with config: model='m', tensor_parallel_size=3",
    "(EngineCore pid=101) INFO 12-03 10:00:01 [multiproc_executor.py:212] Rank 1 (node2) "
    "joined: 2/3 ranks joined",
    "(EngineCore pid=101) INFO 12-03 10:00:01 [multiproc_executor.py:212] Rank 2 (node3) "
    "joined: 3/3 ranks joined",
]


def rank_lines(node: str, rank: int, *, fail: bool = False) -> list[str]:
    """A worker rank's log from the restart on: the old rank's last line, then the new one's."""
    w = "(Worker pid=%d) %s 12-03 10:00:0%d [%s] %s"
    lines = [
        w % (7, "ERROR", 0, "multiproc_executor.py:733", f"Rank {rank}: lost rank 0"),
        w % (200 + rank, "INFO", 0, "api_utils.py:286",
             f"non-default args: {{'model_tag': 'm', 'node_rank': {rank}, 'headless': True}}"),
        w % (200 + rank, "INFO", 1, "gpu_model_runner.py:3420", "Starting to load model m..."),
    ]  # fmt: skip
    if fail:
        where = "multiproc_executor.py:953"
        lines += [
            w % (200 + rank, "ERROR", 2, where, "WorkerProc failed to start."),
            w % (200 + rank, "ERROR", 2, where, "Traceback (most recent call last):"),
            w % (200 + rank, "ERROR", 2, where, "torch.OutOfMemoryError: CUDA out of memory."),
        ]
    else:
        lines.append(w % (200 + rank, "INFO", 2, "default_loader.py:501", "Loading weights took 1"))
    return lines


async def feed(lines: list[str], *, hold: asyncio.Event | None = None) -> AsyncIterator[str]:
    """Yield lines, then stay open (a followed log) until hold is set."""
    for line in lines:
        yield line
        await asyncio.sleep(0)
    await (hold or asyncio.Event()).wait()


def test_worker_rank_fatal_line_names_its_node_at_once() -> None:
    """node3's rank dies loading weights: the boot fails naming node3 and its lines, while rank
    0 (which only hangs) never answers, long before the deadline."""

    async def never() -> bool:
        """Rank 0 hangs: no completion ever answers."""
        return False

    async def run() -> BootError:
        with pytest.raises(BootError) as info:
            await wait_for_boot(
                feed(HEAD), probe=never, deadline_s=600, probe_interval_s=0.05,
                rank_logs={"node2": feed(rank_lines("node2", 1)),
                           "node3": feed(rank_lines("node3", 2, fail=True))},
            )  # fmt: skip
        return info.value

    err = asyncio.run(asyncio.wait_for(run(), 120))
    assert "worker rank on node3 failed" in err.message and "OutOfMemoryError" in err.message
    assert err.lines and all(line.startswith("node3: ") for line in err.lines)
    assert "lost rank 0" not in "\n".join(err.lines), "the outgoing rank's line is not evidence"


def test_ready_waits_for_every_worker_rank_to_start_anew() -> None:
    """A completion answers, but node3's new rank has not logged yet: not READY until it has;
    then READY carries the per-rank summary and rank 0's joined count is reported."""
    events: list[tuple[str, dict]] = []
    gate = asyncio.Event()
    ready_with_gate: list[bool] = []

    def on_event(e: BootEvent) -> None:
        """Record events; note whether node3's new rank had logged when READY came."""
        events.append((e.kind, dict(e.data)))
        if e.kind == "phase" and "total_s" in e.data:
            ready_with_gate.append(gate.is_set())

    async def run() -> dict:
        late: list[str] = rank_lines("node3", 2)

        async def node3() -> AsyncIterator[str]:
            """The old rank's line at once, the new rank's only after the gate."""
            yield late[0]
            await gate.wait()
            for line in late[1:]:
                yield line
            await asyncio.Event().wait()

        async def answer() -> bool:
            """Rank 0 answers at once; node3's new rank logs a second later."""
            asyncio.get_running_loop().call_later(1.0, gate.set)
            return True

        report = await wait_for_boot(
            feed(HEAD), probe=answer, deadline_s=600, probe_interval_s=0.05,
            on_event=on_event,
            rank_logs={"node2": feed(rank_lines("node2", 1)), "node3": node3()},
        )  # fmt: skip
        return report.to_dict()

    report = asyncio.run(asyncio.wait_for(run(), 120))
    assert ready_with_gate == [True], "READY only once every worker rank started anew"
    assert set(report["ranks"]) == {"node2", "node3"}
    assert all(r["started"] for r in report["ranks"].values())
    assert report["ranks"]["node3"]["non_default_args"]["node_rank"] == 2
    assert ("ranks", {"joined": 3, "total": 3}) in events


# vLLM 0.32's CPU build, rank 1 of `vllm serve … --nnodes 2 --node-rank 1 --headless` (measured on
# the test ground, docs/test-ground.md): no banner, no `non-default args:` line
REAL_HEADLESS = [
    "Triton is installed, but doesn't include CPU backend. Disabling Triton.",
    "(MainProcess pid=2849) INFO 12-05 12:39:18 [arg_utils.py:2472] Inferred data_parallel_rank 0 "
    "from node_rank 1",
    "(MainProcess pid=2849) INFO 12-05 12:39:18 [serve.py:224] Launching vLLM (v0.32.0) headless "
    "multiproc executor, with head node address 198.18.0.1:29555 for torch.distributed process "
    "group.",
    "(Worker_TP1 pid=19985) INFO 12-05 12:40:30 [default_loader.py:501] Loading weights took 0.03 "
    "seconds",
]


def test_a_real_headless_rank_starts_anew_on_its_launch_line() -> None:
    """vLLM's headless rank logs neither the banner nor its args: its `Launching vLLM (v…)
    headless` line is its start; its args are then not visible (a warning, not a failure)."""
    from spark_ops.readiness.ranks import RankLog, rank_summary
    from spark_ops.verify.checks import check_rank_args

    rank = RankLog("node2")
    for line in REAL_HEADLESS:
        rank.tracker.feed(line)
    assert rank.started and rank.tracker.vllm_version == "0.32.0"
    summary = rank_summary([rank])
    (check,) = check_rank_args(summary, {"max_num_seqs": 6})
    assert (check.host, check.status) == ("node2", "warn") and "not visible" in check.detail
    (check,) = check_rank_args({"node2": {"started": False}}, {"max_num_seqs": 6})
    assert check.status == "fail"


def test_inventory_executor(tmp_path: Path) -> None:
    """engine.executor is ray (default) or mp; anything else names the key and what is allowed."""
    base = (
        "clusters:\n  c:\n    nodes:\n      n1: {host: 127.0.0.1, role: head}\n"
        "      n2: {host: 127.0.0.2, role: worker}\n"
        "    recipe: {path: ~/r.yaml, nodes: [n1]}\n"
        "    watchdog: {restart_command: 'x --restart-now', history_file: /tmp/h}\n"
    )
    for text, want in (("", "ray"), ("    engine: {executor: mp}\n", "mp")):
        path = tmp_path / f"inv-{want}.yaml"
        path.write_text(base + text)
        assert load_inventory(path).cluster("c").engine.executor == want
    bad = tmp_path / "bad.yaml"
    bad.write_text(base + "    engine: {executor: 'ray; rm -rf /'}\n")
    with pytest.raises(InventoryError, match=r"engine\.executor: must be one of ray, mp"):
        load_inventory(bad).cluster("c")


def test_stray_ranks_are_the_ones_older_than_the_running_engine() -> None:
    """A worker's rank started well before the head's engine is an earlier engine's (it holds
    the node's memory); with no engine running every rank is; children never count twice. A
    node running two ranks around the engine's start holds one of the engine's, but time alone
    cannot tell which (an earlier engine's restarted close before, or one started by hand close
    after): neither is named stray, both are ambiguous (rank_verdict; more cases in
    tests/fixtures/ranks/verdict.yaml); a rank started by hand long after is stray."""
    from spark_ops.engine.instance import Proc
    from spark_ops.engine.ranks import RANK_SLACK_S, rank_verdict, stray_ranks

    engine_start = 10_000.0
    old = Proc(11, 1, 11, "S", engine_start - RANK_SLACK_S - 60, "python")
    old_child = Proc(12, 11, 11, "S", engine_start - RANK_SLACK_S - 59, "VLLM::Worker")
    new = Proc(21, 1, 21, "S", engine_start - 2, "python")
    procs = [old, old_child, new]
    assert stray_ranks(procs, engine_start) == [old]
    assert stray_ranks([new], engine_start) == []
    assert stray_ranks(procs, None) == [old, new]
    recent = Proc(31, 1, 31, "S", engine_start - 30, "python")  # the engine before, 30 s ago
    assert stray_ranks([recent, new], engine_start) == []
    assert rank_verdict([recent, new], engine_start).ambiguous == [recent, new]
    by_hand = Proc(41, 1, 41, "S", engine_start + 600, "python")  # started later, by hand
    assert stray_ranks([new, by_hand], engine_start) == [by_hand]
    # the CI case: a restart 40 s after the last one, the new rank reached 70 s late
    prior = Proc(51, 1, 51, "S", engine_start - 40, "python")
    late = Proc(52, 1, 52, "S", engine_start + 70, "python")
    assert stray_ranks([prior, late], engine_start) == []
    assert rank_verdict([prior, late], engine_start).ambiguous == [prior, late]
    lone = Proc(61, 1, 61, "S", engine_start + 900, "python")  # a lone rank, however late, is its
    assert stray_ranks([lone], engine_start) == []


def test_rank_leftover_check_names_the_process_and_the_stop() -> None:
    """verify's rank-leftovers check fails naming the old rank and the command that stops it."""
    from spark_ops.engine.instance import Proc
    from spark_ops.verify import check_rank_leftovers

    ok = check_rank_leftovers([], 1_000.0, host="node3")
    assert ok.ok
    bad = check_rank_leftovers([Proc(77, 1, 76, "S", 900.0, "python")], 1_000.0, host="node3")
    assert not bad.ok and bad.host == "node3"
    assert "77 (python)" in bad.detail and "kill -TERM -- -76" in (bad.fix or "")


def test_no_rank_is_told_to_go_before_every_rank_joined() -> None:
    """Rank 0's meeting (RankGroup): a worker rank that joined waits, a hello that is not a
    rank's is closed and not counted, `go` reaches every rank only once the last one joined (no
    rank loads weights before), and all_loaded returns once each said `loaded`."""
    from spark_ops.sim.engine_log import VllmLog
    from spark_ops.sim.ranks import RankGroup

    out = io.StringIO()  # rank 0's log and this test's own marks, in the order they happened

    def mark(text: str) -> None:
        """Note what the test saw, between rank 0's log lines."""
        out.write(f"test: {text}\n")

    async def join(port: int, rank: int, node: str) -> tuple[asyncio.StreamReader, Any]:
        """A worker rank's hello."""
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(f"rank {rank} {node}\n".encode())
        await writer.drain()
        return reader, writer

    async def run() -> set[int]:
        group = RankGroup({}, 3, VllmLog(out, out))
        gather = asyncio.ensure_future(group.gather("127.0.0.1", 0))
        while group.server is None:
            await asyncio.sleep(0)
        port = int(group.server.sockets[0].getsockname()[1])
        r1, w1 = await join(port, 1, "node2")
        first = asyncio.ensure_future(r1.readline())
        first.add_done_callback(lambda f: mark(f"rank 1 read {f.result()!r}"))
        while 1 not in group.joined:
            await asyncio.sleep(0)
        rb, wb = await asyncio.open_connection("127.0.0.1", port)
        wb.write(b"hello rank 0\n")
        await wb.drain()
        assert await rb.read() == b"", "a hello that is not a rank's is closed"
        wb.close()
        assert not gather.done() and not first.done(), "one of two ranks joined: no go yet"
        mark("rank 2 joins")
        r2, w2 = await join(port, 2, "node3")
        await gather
        assert await first == b"go\n" and await r2.readline() == b"go\n"
        for writer in (w1, w2):
            writer.write(b"loaded\n")
            await writer.drain()
        await group.all_loaded()
        group.close()
        return set(group.loaded)

    assert asyncio.run(asyncio.wait_for(run(), 60)) == {1, 2}
    lines = out.getvalue().splitlines()

    def at(words: str) -> int:
        """The index of the first line holding words."""
        return next(i for i, line in enumerate(lines) if words in line)

    assert at("Rank 1 (node2) joined: 2/3") < at("test: rank 2 joins")
    assert at("test: rank 2 joins") < at("Rank 2 (node3) joined: 3/3") < at("All 3/3 ranks joined")
    assert at("All 3/3 ranks joined") < at("test: rank 1 read b'go\\n'"), lines
    assert sum("joined:" in line for line in lines) == 2, "the stray hello was not counted"


def test_rank_args_name_the_rank_running_other_args() -> None:
    """verify per rank: a rank running other args than the recipe's is named with the value it
    has, a rank that did not start anew is named, the others pass."""
    from spark_ops.verify import check_rank_args

    ranks = {
        "node2": {"started": True, "non_default_args": {"max_num_seqs": 64, "node_rank": 1}},
        "node3": {"started": True, "non_default_args": {"max_num_seqs": 6, "node_rank": 2}},
        "node4": {"started": False, "non_default_args": {}},
    }
    checks = {c.host: c for c in check_rank_args(ranks, {"max_num_seqs": 64})}
    assert sorted(checks) == ["node2", "node3", "node4"]
    assert checks["node2"].ok and checks["node2"].name == "effective-args"
    assert not checks["node3"].ok
    assert "max_num_seqs: expected 64, engine has 6" in checks["node3"].detail
    assert not checks["node4"].ok and "did not start anew" in checks["node4"].detail


@pytest.mark.parametrize("executor", ["mp", "ray"])
def test_the_two_launch_shapes(tmp_path: Path, executor: str) -> None:
    """`sim up` writes the recipe and inventory of the shape asked for: ranks without Ray
    (`--executor mp`) or the Ray launch."""
    from spark_ops.sim.cluster import SimOptions, inventory_text, prepare

    prepare(tmp_path, SimOptions(executor=executor))
    recipe = (tmp_path / "nodes" / "node1" / "recipes" / "glm-5.3-flash-sim.yaml").read_text()
    assert f"      --distributed-executor-backend {executor} \\" in recipe
    inv = inventory_text(tmp_path, {"node1": 1, "node2": 2}, 3, executor)
    assert f"executor: {executor}" in inv
    assert ("rank.pid" in inv) == (executor == "mp")


def cli(env: dict[str, str], *args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    """Run the real CLI in a subprocess."""
    return subprocess.run(
        [sys.executable, "-m", "spark_ops.cli.main", *args],
        env=env, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


def rank_pids(sim: Sim) -> dict[str, int]:
    """The worker ranks' pids, from each worker's own pid file."""
    return {
        n: int((sim.root / "nodes" / n / ".local/state/spark-sim/rank.pid").read_text())
        for n in ("node2", "node3", "node4")
    }


def alive(pid: int) -> bool:
    """True while pid runs (zombies excluded)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def ranks_of(out: dict) -> dict:
    """The per-rank boot summary of an apply/restart/rollback --json."""
    return dict(out["boot"]["ranks"])


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_apply_restart_rollback_in_rank_mode(tmp_path: Path) -> None:
    """apply --max-num-seqs 64, restart and rollback on the embedded cluster in rank mode: every
    boot is followed on every rank and done with every rank new, the args checked per rank."""
    from spark_ops.sim.control import down, wait_serving

    s = start_sim(tmp_path / "sim", executor="mp")
    try:
        wait_serving(s.state)
        env = dict(os.environ, SPARK_OPS_INVENTORY=str(s.inventory))
        env.pop("SPARK_OPS_CLUSTER", None)
        env.pop("SPARK_OPS_FLEET", None)
        first = rank_pids(s)
        history = s.history.read_bytes()

        res = cli(env, "apply", "--max-num-seqs", "64", "--yes", "--json")
        assert res.returncode == 0, res.stderr[-3000:]
        out = json.loads(res.stdout)
        assert out["boot"]["non_default_args"]["max_num_seqs"] == 64
        ranks = ranks_of(out)
        assert sorted(ranks) == ["node2", "node3", "node4"]
        for i, node in enumerate(("node2", "node3", "node4"), start=1):
            args = ranks[node]["non_default_args"]
            assert ranks[node]["started"] and args["max_num_seqs"] == 64, ranks[node]
            assert args["node_rank"] == i and args["headless"] is True
        applied = rank_pids(s)
        assert not set(applied.values()) & set(first.values()), "every rank is new"
        assert not any(alive(p) for p in first.values()), "no rank of the old engine is left"
        assert all(c["ok"] for c in out["checks"]), out["checks"]
        assert "ranks joined" in res.stderr  # the progress says how many joined

        res = cli(env, "restart", "--yes", "--json")
        assert res.returncode == 0, res.stderr[-3000:]
        restarted = rank_pids(s)
        assert not set(restarted.values()) & set(applied.values())
        assert all(r["started"] for r in ranks_of(json.loads(res.stdout)).values())

        res = cli(env, "rollback", "--yes", "--json")
        assert res.returncode == 0, res.stderr[-3000:]
        out = json.loads(res.stdout)
        assert out["boot"]["non_default_args"]["max_num_seqs"] == 6
        assert {r["non_default_args"]["max_num_seqs"] for r in ranks_of(out).values()} == {6}
        assert s.history.read_bytes() == history, "every planned stamp was pruned"
        for node in ("node2", "node3", "node4"):  # each rank logs on its own node
            log = (s.root / "nodes" / node / "engine.log").read_text()
            assert "'headless': True" in log and "'max_num_seqs': 64" in log
    finally:
        down(s.root)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_worker_rank_failing_at_start_is_named_before_the_deadline(tmp_path: Path) -> None:
    """node3's rank dies at start-up: restart fails naming node3 and its lines, not at the
    deadline (a 240 s one), while rank 0 stays up, hanging, as on a broken NCCL ring."""
    from spark_ops.sim.control import down, wait_serving

    s = start_sim(tmp_path / "sim", executor="mp")
    try:
        wait_serving(s.state)
        env = dict(os.environ, SPARK_OPS_INVENTORY=str(s.inventory))
        env.pop("SPARK_OPS_CLUSTER", None)
        env.pop("SPARK_OPS_FLEET", None)
        cfg = s.root / "engine.yaml"
        cfg.write_text(cfg.read_text().replace("fault: null", "fault: rank_fail"))
        res = cli(env, "restart", "--yes", "--deadline", "240", "--json")
        assert res.returncode == ExitStatus.BOOT_FAILED, res.stderr[-3000:]
        err = next(json.loads(line) for line in res.stderr.splitlines()
                   if line.startswith('{"error"'))  # fmt: skip
        assert "worker rank on node3 failed" in err["message"], err
        assert "not ready after" not in err["message"], "named before the deadline"
        assert err["lines"] and all(line.startswith("node3: ") for line in err["lines"]), err
        assert "OutOfMemoryError" in err["lines"][-1], err
        head_pid = int((s.head / ".local/state/spark-watchdog/engine.pid").read_text())
        assert alive(head_pid), "rank 0 hangs rather than exiting"
    finally:
        down(s.root)


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_experiment_in_rank_mode(tmp_path: Path) -> None:
    """experiment 6 vs 64 on the ranks: both configurations measured, the start restored."""
    from spark_ops.sim.control import down

    scale = 10.0
    s = start_sim(tmp_path / "sim", time_scale=scale, watchdog_interval_s=30.0, executor="mp")
    try:
        env = dict(os.environ, SPARK_OPS_INVENTORY=str(s.inventory))
        env.pop("SPARK_OPS_CLUSTER", None)
        env.pop("SPARK_OPS_FLEET", None)
        history, recipe = s.history.read_bytes(), s.recipe.read_bytes()
        report = tmp_path / "report.json"
        res = cli(
            env, "experiment", "--max-num-seqs", "6,64", "--concurrency", "1,16",
            "--output-tokens", "100", "--slo-tok-s", str(9 * scale), "--measure-all", "--yes",
            "--state", str(tmp_path / "exp.json"), "-o", str(report), timeout=400,
        )  # fmt: skip
        assert res.returncode == 0, res.stderr[-3000:]
        assert "restarts: 2 planned" in res.stdout
        assert "Starting configuration restored: max_num_seqs=6" in res.stdout
        data = json.loads(report.read_text())
        assert data["state"]["finished"] is True and data["state"]["restore"]["ok"] is True
        assert s.history.read_bytes() == history and s.recipe.read_bytes() == recipe
    finally:
        down(s.root)


@pytest.fixture(scope="module")
def rank_sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sim]:
    """One embedded cluster in rank mode, serving, shared by the module's lingering-rank cases."""
    from spark_ops.sim.control import down, wait_serving

    s = start_sim(tmp_path_factory.mktemp("ranks") / "sim", executor="mp")
    try:
        wait_serving(s.state)
        yield s
    finally:
        down(s.root)


def _error(stderr: str) -> dict:
    """The one error object a --json command leaves on stderr."""
    return next(json.loads(line) for line in stderr.splitlines() if line.startswith('{"error"'))


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_lingering_rank_fails_verify_and_refuses_the_next_plan(rank_sim: Sim) -> None:
    """node3's rank of the old engine outlives rank 0 (the rank_lingers fault: the launcher starts
    the new rank beside it). The apply that left it serves but fails verify's rank-leftovers
    naming node3 and the old rank's pid. The next plan refuses the restart before anything is
    written (BootWouldFail, exit 11: that rank holds the node's memory, the new one would not
    start), naming node3, the pid and the command that frees it; `apply --dry-run` refuses alike
    and doctor's engine-leftovers fails node3 with the same command. Once stopped, the plan
    goes through."""
    s = rank_sim
    env = dict(os.environ, SPARK_OPS_INVENTORY=str(s.inventory))
    env.pop("SPARK_OPS_CLUSTER", None)
    env.pop("SPARK_OPS_FLEET", None)
    old = rank_pids(s)
    cfg = s.root / "engine.yaml"
    clean = cfg.read_text()
    cfg.write_text(clean.replace("fault: null", "fault: rank_lingers"))
    try:
        res = cli(env, "apply", "--max-num-seqs", "64", "--yes", "--json")
    finally:
        cfg.write_text(clean)
    assert res.returncode == ExitStatus.CHECK_FAILED and res.stdout, res.stderr[-3000:]
    out = json.loads(res.stdout)
    assert out["boot"]["non_default_args"]["max_num_seqs"] == 64, "the new engine serves"
    left = {c["host"]: c for c in out["checks"] if c["name"] == "rank-leftovers"}
    assert sorted(left) == ["node2", "node3", "node4"], out["checks"]
    assert [h for h, c in left.items() if not c["ok"]] == ["node3"], left
    assert f"{old['node3']} (python" in left["node3"]["detail"], left["node3"]
    assert alive(old["node3"]) and not alive(old["node2"]) and not alive(old["node4"])
    lingering = old["node3"]
    pgid = os.getpgid(lingering)

    recipe, history = s.recipe.read_bytes(), s.history.read_bytes()
    for argv in (("plan", "--max-num-seqs", "32", "--json"),
                 ("apply", "--max-num-seqs", "32", "--dry-run", "--json")):  # fmt: skip
        res = cli(env, *argv)
        assert res.returncode == ExitStatus.CHECK_FAILED, (argv, res.stdout, res.stderr[-3000:])
        err = _error(res.stderr)
        assert err["error"] == "BootWouldFail", err
        assert f"node3 runs a rank of an earlier engine: {lingering} (python" in err["message"]
        assert "node2" not in err["message"] and "nothing was written" in err["message"], err
        assert f"on node3: kill -TERM -- -{pgid}" in err["hint"], err
    assert s.recipe.read_bytes() == recipe and s.history.read_bytes() == history

    res = cli(env, "doctor", "--json")
    checks = [c for c in json.loads(res.stdout)["checks"] if c["name"] == "engine-leftovers"]
    by_host = {c["host"]: c for c in checks}
    failed = {h: c["detail"] for h, c in by_host.items() if c["status"] == "fail"}
    assert sorted(failed) == ["node3"], failed
    assert f"{lingering} (python" in by_host["node3"]["detail"]
    assert by_host["node3"]["fix"] == f"stop it on node3: kill -TERM -- -{pgid}"
    assert by_host["node2"]["status"] == by_host["node4"]["status"] == "ok", checks

    # the hint as an operator runs it (bash; dash's kill builtin takes no `--`)
    stop = subprocess.run(["bash", "-c", f"kill -TERM -- -{pgid}"], check=False)
    assert stop.returncode == 0
    deadline = time.monotonic() + 30
    while alive(lingering) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(lingering), "the command the plan named frees the node"
    res = cli(env, "plan", "--max-num-seqs", "32", "--json")
    assert res.returncode == 0, res.stderr[-3000:]
    assert not any("earlier engine" in w for w in json.loads(res.stdout)["plan"]["warnings"])


def _start_like(pid: int, change: dict[str, str]) -> subprocess.Popen[bytes]:
    """Start by hand, on the same node, a copy of the rank `pid` runs (its command line, with the
    flags in `change` given other values; its environment and directory)."""
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")[:-1]
    for flag, value in change.items():
        argv[argv.index(flag) + 1] = value
    env = dict(
        line.split("=", 1)
        for line in Path(f"/proc/{pid}/environ").read_bytes().decode().split("\0")
        if "=" in line
    )
    return subprocess.Popen(
        argv, env=env, cwd=os.readlink(f"/proc/{pid}/cwd"), stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip


def _started(pid: int) -> float:
    """A process's start time (Unix s), from /proc."""
    ticks = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    btime = next(
        int(line.split()[1])
        for line in Path("/proc/stat").read_text().splitlines()
        if line.startswith("btime ")
    )
    return btime + ticks / os.sysconf("SC_CLK_TCK")


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_rank_started_by_hand_beside_the_engines_is_never_guessed(rank_sim: Sim) -> None:
    """A copy of node3's rank started by hand beside it: with the same command line, time alone
    cannot tell which is the engine's (both within the window), so the plan refuses naming both
    pids and the stop of each, and doctor fails node3 alike (the rule before named the real rank
    stray, with a hint that would stop the engine's own); past the window, or with another
    `--max-num-seqs` (its command line contradicts the engine's), only the copy is named. The
    real rank is never named alone; once the copy is stopped the plan goes through."""
    from spark_ops.engine.ranks import RANK_LAG_S

    s = rank_sim
    env = dict(os.environ, SPARK_OPS_INVENTORY=str(s.inventory))
    env.pop("SPARK_OPS_CLUSTER", None)
    real = rank_pids(s)["node3"]
    seqs = Path(f"/proc/{real}/cmdline").read_bytes().decode().split("\0")
    other = str(int(seqs[seqs.index("--max-num-seqs") + 1]) + 1)
    recipe, history = s.recipe.read_bytes(), s.history.read_bytes()
    for change in ({}, {"--max-num-seqs": other}):
        copy = _start_like(real, change)
        try:
            res = cli(env, "plan", "--max-num-seqs", "32", "--json")
            assert res.returncode == ExitStatus.CHECK_FAILED, (change, res.stderr[-3000:])
            err = _error(res.stderr)
            assert err["error"] == "BootWouldFail" and "nothing was written" in err["message"]
            assert f"{copy.pid} (python" in err["message"], err
            assert f"kill -TERM -- -{copy.pid}" in err["hint"], err
            engine = int((s.head / ".local/state/spark-watchdog/engine.pid").read_text())
            late = _started(copy.pid) - _started(engine) > RANK_LAG_S
            if change or late:  # the copy alone, as a rank not the engine's
                assert f"{real} (python" not in err["message"], err
                assert (
                    f"node3 runs a rank of an earlier engine: {copy.pid} (python" in err["message"]
                )
            else:  # both, ambiguous: never the real one alone
                assert (
                    "node3 runs 2 ranks that could each be the running engine's" in err["message"]
                )
                assert f"{real} (python" in err["message"], err
                assert f"-p {real},{copy.pid}" in err["hint"], err  # by their start
                res = cli(env, "doctor", "--json")
                checks = json.loads(res.stdout)["checks"]
                node3 = [
                    c for c in checks if c["name"] == "engine-leftovers" and c["host"] == "node3"
                ]
                assert [c["status"] for c in node3] == ["fail"], node3
                assert f"{real} (python" in node3[0]["detail"] and str(copy.pid) in node3[0]["fix"]
        finally:
            os.killpg(copy.pid, signal.SIGTERM)
            copy.wait(timeout=60)
    assert s.recipe.read_bytes() == recipe and s.history.read_bytes() == history
    assert alive(real), "the engine's own rank was never stopped"
    res = cli(env, "plan", "--max-num-seqs", "32", "--json")
    assert res.returncode == 0, res.stderr[-3000:]
