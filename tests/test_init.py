"""`spark-ops init` as a new user runs it: against running nodes, then doctor, then apply."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from spark_ops.discover import parse_env_file, parse_hosts
from spark_ops.errors import ExitStatus, InventoryError
from spark_ops.inventory import load_inventory
from spark_ops.sim import RANK_CHECK

FIXTURES = Path(__file__).parent / "fixtures"
sys.path.insert(0, str(FIXTURES / "doctor"))
from minicluster import MiniCluster  # noqa: E402

HOST_CASES = yaml.safe_load((FIXTURES / "init" / "hosts_cases.yaml").read_text())


@pytest.fixture(scope="module")
def mini(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MiniCluster]:
    """A 4-node embedded cluster with the engine serving, for the whole module."""
    m = MiniCluster(tmp_path_factory.mktemp("init") / "sim", nodes=4).start()
    try:
        yield m
    finally:
        m.stop()


def spark_ops(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run the real CLI in a subprocess (no inventory from the environment unless given)."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("SPARK_OPS_")}
    return subprocess.run(
        [sys.executable, "-m", "spark_ops.cli.main", *args],
        env={**base, **(env or {})}, capture_output=True, text=True, timeout=240,
    )  # fmt: skip


def key_args(root: Path) -> list[str]:
    """The SSH options a new user passes: their key and known_hosts file."""
    keys = root / "keys"
    return ["--identity", str(keys / "client_ed25519"), "--known-hosts", str(keys / "known_hosts")]


def hosts_of(ports: dict[str, int]) -> str:
    """--hosts for loopback nodes, head first."""
    return ",".join(f"127.0.0.1:{p}" for p in ports.values())


@pytest.mark.parametrize("case", HOST_CASES, ids=[c["spec"] for c in HOST_CASES])
def test_parse_hosts(case: dict[str, Any]) -> None:
    """Host lists give named nodes (first = head) or an error naming what is wrong."""
    if "error" in case:
        with pytest.raises(InventoryError, match=case["error"].replace("(", r"\(")):
            parse_hosts(case["spec"])
        return
    got = [[n.name, n.host, n.port] for n in parse_hosts(case["spec"])]
    assert got == case["nodes"]


def test_parse_env_file() -> None:
    """The launch .env: export, quotes, comments."""
    env = parse_env_file((FIXTURES / "init" / "launch.env").read_text())
    assert env == {
        "CLUSTER_NODES": "@NODES@",
        "ETH_IF": "enp1s0f0np0",
        "IB_IF": "rocep1s0f0,roceP2p1s0f0",
        "MODEL_DIR": "/models",
    }


def test_init_then_doctor_green(mini: MiniCluster, tmp_path: Path) -> None:
    """init --hosts writes a complete inventory that loads; doctor is all green on it."""
    out = tmp_path / "inventory" / "cluster.yaml"
    res = spark_ops("init", "--hosts", hosts_of(mini.ports), *key_args(mini.root), "-o", str(out))
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"Wrote {out}" in res.stdout and "Everything was found" in res.stdout
    text = out.read_text()
    assert text in res.stdout, "the written file is shown"
    assert "TODO" not in text
    cluster = load_inventory(out).cluster()
    assert [n.name for n in cluster.nodes] == ["node1", "node2", "node3", "node4"]
    assert [n.port for n in cluster.nodes] == list(mini.ports.values())
    assert cluster.head.name == "node1" and cluster.tensor_parallel == 4
    assert cluster.recipe.path == "~/recipes/glm-5.3-flash-sim.yaml"
    assert cluster.recipe.nodes == ("node1",)
    wd = cluster.watchdog
    assert wd.restart_command.startswith("spark-watchdog --config ~/.config/spark-watchdog.yaml")
    assert "--restart-now --force" in wd.restart_command and wd.reports_stamp
    assert wd.history_file == "~/.local/state/spark-watchdog/restarts"
    assert wd.pause_file == "~/.local/state/spark-watchdog/pause"
    assert wd.gave_up_file == "~/.local/state/spark-watchdog/gave-up"
    assert (wd.max_restarts, wd.window_s) == (2, 21600)
    assert (cluster.engine.log_kind, cluster.engine.log_target) == ("file", "~/engine.log")
    assert cluster.engine.api_url == f"http://127.0.0.1:{mini.engine_port}"
    assert cluster.engine.model == "glm-5.3-flash", "the name the engine serves, not a model id"

    res = spark_ops("-i", str(out), "doctor")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "Ready for apply" in res.stdout and "✗" not in res.stdout

    again = spark_ops("init", "--hosts", hosts_of(mini.ports), *key_args(mini.root), "-o", str(out))
    assert again.returncode == ExitStatus.INVENTORY
    assert "already exists" in again.stderr and "--force" in again.stderr
    assert out.read_text() == text
    forced = spark_ops(
        "init", "--hosts", hosts_of(mini.ports), *key_args(mini.root), "-o", str(out), "--force"
    )
    assert forced.returncode == 0, forced.stderr


def test_init_leaves_todo_lines_for_what_it_cannot_find(mini: MiniCluster, tmp_path: Path) -> None:
    """No watchdog config and no recipe in the usual places: TODO lines, reported, never guessed."""
    config = mini.head / ".config" / "spark-watchdog.yaml"
    moved = [
        (config, config.with_name("elsewhere.yaml")),
        (mini.recipe, mini.head / "glm-moved.yaml.txt"),
    ]
    for a, b in moved:
        a.rename(b)
    try:
        out = tmp_path / "partial.yaml"
        res = spark_ops(
            "init", "--hosts", hosts_of(mini.ports), *key_args(mini.root), "-o", str(out), "--json"
        )
    finally:
        for a, b in moved:
            b.rename(a)
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    assert data["complete"] is False
    missing = {f["key"] for f in data["findings"] if f["status"] == "missing"}
    assert missing == {"recipe.path", "watchdog.restart_command"}
    text = out.read_text()
    assert "# TODO(spark-ops init): recipe.path — no `vllm serve` recipe under" in text
    assert "# TODO(spark-ops init): watchdog.restart_command — no ~/.config/spark-watchdog" in text
    found = {f["key"]: f for f in data["findings"] if f["status"] == "found"}
    assert found["watchdog.history_file"]["value"] == "~/.local/state/spark-watchdog/restarts"
    with pytest.raises(InventoryError, match=r"recipe\.path: is required"):
        load_inventory(out)


def test_init_from_launch_env(mini: MiniCluster, tmp_path: Path) -> None:
    """--from-env reads CLUSTER_NODES (head first), keeps ETH_IF / IB_IF as a comment."""
    ports = list(mini.ports.values())
    listed = ",".join(f"127.0.0.1:{p}" for p in reversed(ports))  # head not first in the file
    env_file = mini.head / "spark-vllm-docker" / ".env"
    env_file.parent.mkdir(exist_ok=True)
    env_file.write_text((FIXTURES / "init" / "launch.env").read_text().replace("@NODES@", listed))
    out = tmp_path / "from-env.yaml"
    res = spark_ops(
        "init", "--from-env", f"127.0.0.1:{ports[0]}:~/spark-vllm-docker/.env",
        *key_args(mini.root), "-o", str(out), "--name", "lab",
    )  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr
    cluster = load_inventory(out).cluster("lab")
    assert cluster.head.port == ports[0], "the host given to --from-env is the head"
    assert sorted(n.port for n in cluster.nodes) == sorted(ports)
    text = out.read_text()
    assert (
        "# network (from the launch .env): ETH_IF=enp1s0f0np0 IB_IF=rocep1s0f0,roceP2p1s0f0" in text
    )
    bad = spark_ops("init", "--from-env", "127.0.0.1", "-o", str(tmp_path / "other.yaml"))
    assert bad.returncode == ExitStatus.INVENTORY and "HOST[:PORT]:PATH" in bad.stderr


def test_init_reports_unknown_host_key(mini: MiniCluster, tmp_path: Path) -> None:
    """A node whose key is not in known_hosts is written but reported, with how to add the key."""
    known = (mini.root / "keys" / "known_hosts").read_text().splitlines()
    port3 = mini.ports["node3"]
    partial = tmp_path / "known_hosts"
    partial.write_text("\n".join(ln for ln in known if f"]:{port3} " not in ln) + "\n")
    out = tmp_path / "inv.yaml"
    res = spark_ops(
        "init", "--hosts", hosts_of(mini.ports), "--identity",
        str(mini.root / "keys" / "client_ed25519"), "--known-hosts", str(partial),
        "-o", str(out), "--json",
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    warn = [f for f in data["findings"] if f["key"] == "nodes.node3"]
    assert warn and warn[0]["status"] == "warn" and "host key" in warn[0]["detail"]
    assert data["complete"] is True, "the head answered: everything else was found"
    assert load_inventory(out).cluster().node("node3").port == port3


@pytest.mark.slow
def test_init_doctor_apply_on_the_embedded_cluster(tmp_path: Path) -> None:
    """First contact on `spark-ops sim up`: init, doctor green, apply 64 with it unchanged."""
    pytest.importorskip("refwatchdog.daemon", reason="the reference watchdog is needed")
    from conftest import start_sim

    from spark_ops.sim.control import down

    sim = start_sim(tmp_path / "sim", executor="mp")  # the launch as it is today
    try:
        out = tmp_path / "cluster.yaml"
        res = spark_ops("init", "--hosts", hosts_of(sim.state["ports"]), *key_args(sim.root),
                        "-o", str(out))  # fmt: skip
        assert res.returncode == 0, res.stdout + res.stderr
        assert "Everything was found" in res.stdout
        written = out.read_text()
        # the launch as it is today: ranks without Ray, read from the recipe's backend; the
        # watchdog's probe and engine pid file from its config (no leftover warning for the engine)
        engine = load_inventory(out).cluster().engine
        assert engine.executor == "mp" and engine.worker_check == RANK_CHECK, written
        assert engine.pid_file == "~/.local/state/spark-watchdog/engine.pid", written
        probe = load_inventory(out).cluster().watchdog.probe
        assert probe is not None and (probe.interval_s, probe.failures) == (5, 3), written
        doc = spark_ops("-i", str(out), "doctor")
        assert doc.returncode == 0, doc.stdout + doc.stderr
        assert "ray-worker" not in doc.stdout and "worker-rank" in doc.stdout, doc.stdout
        assert "0 warning(s)" in doc.stdout, doc.stdout
        res = spark_ops("-i", str(out), "apply", "--max-num-seqs", "64", "--yes", "--json")
        assert res.returncode == 0, res.stderr[-3000:]
        outcome = json.loads(res.stdout)
        assert outcome["ok"] is True and outcome["pruned"] == [outcome["stamp"]]
        assert "max_num_seqs: 64 " in sim.recipe.read_text()
        assert out.read_text() == written
    finally:
        down(sim.root)


def test_adopting_a_watchdog_examples_are_valid_inventories() -> None:
    """Every YAML inventory section in docs/adopting-a-watchdog.md loads as documented."""
    import re

    from spark_ops.inventory import parse_inventory

    doc = Path(__file__).parents[1] / "docs" / "adopting-a-watchdog.md"
    blocks = re.findall(r"```yaml\n(.*?)```", doc.read_text(), re.S)
    assert len(blocks) == 3
    clusters = [parse_inventory(b, f"{doc.name} block {i}").cluster() for i, b in enumerate(blocks)]
    assert clusters[0].watchdog.reports_stamp is True
    bash = clusters[1]
    assert bash.watchdog.lock_path == "~/.watchdog/restart_history.lock"
    assert (bash.engine.log_kind, bash.engine.log_target) == ("docker", "vllm_node")
    loop = clusters[2].watchdog
    assert loop.loops_only and not loop.history_locked and not loop.restarts_missing_engine
    assert (loop.max_restarts, loop.window_s, loop.grace_s) == (3, 21600, 1800)


FAKE_DOCKER = """#!/bin/sh
# stand-in for docker on the head (tests): one running container, vllm_node
case "$1" in
  ps) echo vllm_node;;
  inspect) echo running;;
  logs) tail -n 0 -F "$HOME/engine.log";;
  *) echo "docker stand-in: $*" >&2; exit 1;;
esac
"""

BASH_WATCHDOG = """#!/bin/bash
# a community-style watchdog (tests): --restart-now --force appends a stamp under the lock
HISTORY="$HOME/.watchdog/restart_history"
if [ "$1" = "--restart-now" ]; then
  ( flock -w 10 9 || exit 1; date +%s >> "$HISTORY" ) 9>>"$HISTORY.lock"
  exit 0
fi
echo "probe loop not started in tests" >&2
"""


async def test_init_adopts_a_bash_watchdog(mini: MiniCluster, tmp_path: Path) -> None:
    """No spark-watchdog config: init finds the bash watchdog, its history, flags, docker's log."""
    from spark_ops.discover import InitOptions, discover
    from spark_ops.doctor import run_doctor
    from spark_ops.inventory import parse_inventory

    head = mini.head
    config = head / ".config" / "spark-watchdog.yaml"
    state = head / ".local" / "state" / "spark-watchdog"
    wd_dir = head / ".watchdog"
    renames = [(config, config.with_name("off.yaml")), (state, head / "spark-watchdog-state-off")]
    created = [head / "spark-vllm-docker" / "watchdog.sh", head / "bin" / "docker"]
    for a, b in renames:
        a.rename(b)
    try:
        wd_dir.mkdir()
        (wd_dir / "restart_history").write_text("1795990000\n")
        (wd_dir / "pause").write_text("")
        created[0].parent.mkdir(exist_ok=True)
        created[0].write_text(BASH_WATCHDOG)
        created[1].write_text(FAKE_DOCKER)
        for p in created:
            p.chmod(0o755)
        keys = mini.root / "keys"
        opts = InitOptions(
            hosts=hosts_of(mini.ports),
            identity=(str(keys / "client_ed25519"),),
            known_hosts=str(keys / "known_hosts"),
        )
        result = await discover(opts)
        cluster = parse_inventory(result.text, "written").cluster()
        report = await run_doctor(cluster)
    finally:
        for p in created:
            p.unlink(missing_ok=True)
        for f in wd_dir.iterdir():
            f.unlink()
        wd_dir.rmdir()
        for a, b in renames:
            b.rename(a)
    assert result.complete, result.missing()
    wd = cluster.watchdog
    assert wd.restart_command == "~/spark-vllm-docker/watchdog.sh --restart-now --force"
    assert wd.history_file == "~/.watchdog/restart_history" and wd.reports_stamp is False
    assert wd.pause_file == "~/.watchdog/pause"
    assert (cluster.engine.log_kind, cluster.engine.log_target) == ("docker", "vllm_node")
    warned = {f.key for f in result.findings if f.status == "warn"}
    assert warned == set(), result.findings
    statuses = {(c.name, c.status) for c in report.checks}
    assert ("watchdog-command", "ok") in statuses and ("engine-log", "ok") in statuses
    assert ("watchdog-pause", "warn") in statuses, "the pause file exists: doctor warns"
    assert report.ok, report.failed()


def test_init_with_the_head_down_writes_todo_lines(mini: MiniCluster, tmp_path: Path) -> None:
    """The head does not answer: the nodes are written, everything else is a TODO, and said so."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    workers = list(mini.ports.values())[1:]
    hosts = ",".join(f"127.0.0.1:{p}" for p in [dead, *workers])
    out = tmp_path / "down.yaml"
    res = spark_ops("init", "--hosts", hosts, *key_args(mini.root), "-o", str(out))
    assert res.returncode == 0, res.stderr
    assert (
        f"! nodes.node1 = 127.0.0.1: not reachable: node1: cannot connect to 127.0.0.1:{dead}"
        in res.stdout
    )
    assert "4 item(s) left as TODO lines" in res.stdout
    text = out.read_text()
    for key in ("recipe.path", "watchdog.restart_command", "watchdog.history_file", "engine.log"):
        assert f"# TODO(spark-ops init): {key} — the head node1 was not reachable" in text
    assert "tensor_parallel: 4" in text and f'node1: {{host: "127.0.0.1", port: {dead}' in text


FAKE_SYSTEMCTL = """#!/bin/sh
# stand-in for systemctl on the head (tests): one vLLM unit
case "$1" in
  list-units) echo "vllm-glm.service loaded active running vLLM GLM 5.3 Flash";;
  cat) [ "$2" = vllm-glm.service ] && echo "[Service]" || exit 1;;
  *) exit 1;;
esac
"""


async def test_init_finds_a_systemd_unit_before_a_log_file(mini: MiniCluster) -> None:
    """With no watchdog config naming the log, a vllm* systemd unit wins over ~/engine.log."""
    from spark_ops.discover import InitOptions, discover

    config = mini.head / ".config" / "spark-watchdog.yaml"
    systemctl = mini.head / "bin" / "systemctl"
    config.rename(config.with_name("off.yaml"))
    try:
        systemctl.write_text(FAKE_SYSTEMCTL)
        systemctl.chmod(0o755)
        keys = mini.root / "keys"
        result = await discover(
            InitOptions(
                hosts=hosts_of(mini.ports),
                identity=(str(keys / "client_ed25519"),),
                known_hosts=str(keys / "known_hosts"),
            )
        )
    finally:
        systemctl.unlink()
        config.with_name("off.yaml").rename(config)
    log = next(f for f in result.findings if f.key == "engine.log")
    assert log.status == "found" and log.value == {"kind": "journalctl", "unit": "vllm-glm.service"}
    assert 'log: {kind: journalctl, unit: "vllm-glm.service"}' in result.text
