"""doctor on a real embedded cluster (SSH nodes, simulated engine): all green, then one damage per
case.

Each tests/fixtures/doctor/<case>.yaml names the damage done to the running cluster (and inventory
overrides), and the one check expected to fail (or warn) with words of its detail and its fix. The
damage is undone after each case, so one cluster serves the whole module.
"""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from spark_ops.doctor import Check, DoctorReport, command_program, run_doctor
from spark_ops.errors import ExitStatus
from spark_ops.inventory import Cluster, load_inventory

FIXTURES = Path(__file__).parent / "fixtures" / "doctor"
sys.path.insert(0, str(FIXTURES))
from minicluster import MiniCluster  # noqa: E402

CASES = sorted(p.stem for p in FIXTURES.glob("*.yaml"))


@pytest.fixture(scope="module")
def mini(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MiniCluster]:
    """A 4-node embedded cluster with the engine serving, for the whole module."""
    m = MiniCluster(tmp_path_factory.mktemp("doctor") / "sim", nodes=4).start()
    try:
        yield m
    finally:
        m.stop()


def inventory_with(mini: MiniCluster, tmp: Path, overrides: dict[str, Any]) -> Path:
    """A copy of the cluster's inventory with dotted keys (under the cluster) replaced."""
    data = yaml.safe_load(mini.inventory.read_text())
    cluster = data["clusters"]["sim"]
    for dotted, value in overrides.items():
        *parents, last = dotted.split(".")
        node = cluster
        for p in parents:
            node = node.setdefault(p, {})
        node[last] = value
    path = tmp / "inventory.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def is_root() -> bool:
    """True when the tests run as root (mode bits do not stop root's writes)."""
    return os.geteuid() == 0


def apply_damage(
    mini: MiniCluster, tmp: Path, damage: dict[str, Any], inv: dict[str, Any]
) -> Callable[[], None]:
    """Do one damage to the running cluster; returns the function that undoes it."""
    kind = damage["kind"]
    node = damage.get("node", "node1")
    path = mini.home(node) / damage.get("path", "")
    if kind == "remove":
        moved = path.with_name(path.name + ".moved")
        path.rename(moved)
        return lambda: moved.rename(path)
    if kind == "copy":
        text = (mini.home(damage["from_node"]) / damage["path"]).read_text()
        old, new = damage["replace"]
        assert old in text, f"fixture: {old!r} not in the recipe"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text.replace(old, new))
        return lambda: path.unlink()
    if kind in ("write", "append"):
        before = path.read_text() if path.exists() else None
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(
            (before or "") + damage["content"] if kind == "append" else damage["content"]
        )
        if "mode" in damage:
            path.chmod(int(str(damage["mode"]), 0))

        def restore() -> None:
            """Put the file back as it was (or remove it)."""
            if before is None:
                path.unlink(missing_ok=True)  # a fix that ran removed it already
            else:
                path.write_text(before)

        return restore
    if kind in ("dir", "dir_absent"):  # a state dir on the head: made as said, or none yet
        assert not path.exists(), f"fixture: {path} exists"
        if kind == "dir":
            path.mkdir()
            path.chmod(int(str(damage["mode"]), 0))  # the mode exactly (mkdir's is umasked)
            if "group" in damage:
                try:
                    shutil.chown(path, group=damage["group"])
                except (LookupError, PermissionError) as exc:
                    shutil.rmtree(path)
                    pytest.skip(f"cannot give {path} to group {damage['group']}: {exc}")
        return lambda: shutil.rmtree(path, ignore_errors=True)
    if kind == "forced_stamp":  # someone's `spark-watchdog --restart-now --force --by WHO`
        journal = path / ".local/state/spark-watchdog/restarts.journal.jsonl"
        history = mini.home(node) / ".local/state/spark-watchdog/restarts"
        saved = {p: p.read_text() if p.exists() else None for p in (history, journal)}
        stamp = int(time.time()) - int(damage["age_s"])
        record = {"stamp": stamp, "action": "restart", "forced": True, "by": damage["by"]}
        history.write_text((saved[history] or "") + f"{stamp}\n")
        journal.parent.mkdir(parents=True, exist_ok=True)
        line = json.dumps({**record, "reason": damage["reason"]})
        journal.write_text((saved[journal] or "") + line + "\n")

        def put_back() -> None:
            """The history and the journal as they were."""
            for p, text in saved.items():
                if text is None:
                    p.unlink(missing_ok=True)
                else:
                    p.write_text(text)

        return put_back
    if kind == "append_stamp":
        before = path.read_text()
        path.write_text(before + f"{int(time.time()) - int(damage['age_s'])}\n")
        return lambda: path.write_text(before)
    if kind == "forget_host_key":
        port = mini.ports[node]
        known = (mini.root / "keys" / "known_hosts").read_text().splitlines()
        kept = [ln for ln in known if not ln.startswith(f"[127.0.0.1]:{port} ")]
        assert len(kept) == len(known) - 1
        other = tmp / "known_hosts"
        other.write_text("\n".join(kept) + "\n")
        inv["ssh.known_hosts"] = str(other)
        return lambda: None
    if kind == "readonly":
        if is_root():
            if subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode != 0:
                pytest.skip("running as root and chattr +i is not supported here")

            def unfreeze() -> None:
                """Make the file mutable again."""
                subprocess.run(["chattr", "-i", str(path)], check=True)

            return unfreeze
        mode_f, mode_d = path.stat().st_mode, path.parent.stat().st_mode
        path.chmod(0o444)
        path.parent.chmod(0o555)

        def undo() -> None:
            """Restore both modes."""
            path.parent.chmod(mode_d)
            path.chmod(mode_f)

        return undo
    if kind == "hold_lock":
        path.touch()
        holder = subprocess.Popen(
            ["flock", str(path), "sh", "-c", "echo locked; exec sleep 60"],
            stdout=subprocess.PIPE, text=True, start_new_session=True,
        )  # fmt: skip
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"

        def release() -> None:
            """Stop the holder (the kernel frees the lock)."""
            os.killpg(holder.pid, signal.SIGKILL)
            holder.wait(5)

        return release
    if kind == "engine_stop":
        assert mini.engine is not None
        pid = mini.engine.pid
        os.killpg(pid, signal.SIGSTOP)
        return lambda: os.killpg(pid, signal.SIGCONT)
    raise AssertionError(f"fixture: unknown damage kind {kind!r}")


def failing(report: DoctorReport) -> list[tuple[str, str]]:
    """(check, host) of every failed check."""
    return [(c.name, c.host) for c in report.failed()]


async def test_healthy_cluster_is_all_green(mini: MiniCluster) -> None:
    """Every check passes on a healthy cluster, and each precondition of apply is covered."""
    report = await run_doctor(load_inventory(mini.inventory).cluster())
    assert report.ok, [c for c in report.checks if c.status != "ok"]
    assert all(c.status == "ok" for c in report.checks)
    names = {c.name for c in report.checks}
    assert {
        "ssh",
        "tools",
        "state-dir",
        "recipe",
        "watchdog-command",
        "history",
        "history-writable",
        "budget",
        "engine-log",
        "engine-api",
        "engine-completion",
        "ray-worker",
        "watchdog-status",
    } <= names
    assert [c.host for c in report.checks if c.name == "ssh"] == [
        "node1",
        "node2",
        "node3",
        "node4",
    ]
    api = next(c for c in report.checks if c.name == "engine-api")
    assert "vLLM 0.32.0" in api.detail and "glm-5.3-flash" in api.detail


@pytest.mark.parametrize("case", CASES)
async def test_doctor_case(mini: MiniCluster, tmp_path: Path, case: str) -> None:
    """The damage of the case makes exactly its check fail (or warn), with the fix shown."""
    spec = yaml.safe_load((FIXTURES / f"{case}.yaml").read_text())
    inv = dict(spec.get("inventory") or {})
    undo = [apply_damage(mini, tmp_path, d, inv) for d in spec.get("damage") or []]
    try:
        path = inventory_with(mini, tmp_path, inv)
        cluster: Cluster = load_inventory(path).cluster()
        report = await run_doctor(cluster)
        if spec.get("fix_runs"):  # a fix must fix: run its command, then its check passes
            fix = next(c.fix for c in report.checks if c.name == spec["expect"]["check"])
            command = shlex.split(fix[fix.rindex("spark-ops ") :])[1:]
            ran = await asyncio.to_thread(spark_ops, path, *command, "-y")
            assert ran.returncode == 0, (command, ran.stdout, ran.stderr)
            again = await run_doctor(cluster)
            after = [c for c in again.checks if c.name == spec["expect"]["check"]]
            assert after and all(c.status == "ok" for c in after), (command, after)
    finally:
        for u in reversed(undo):
            u()
    exp = spec["expect"]
    hits = [c for c in report.checks if c.name == exp["check"] and c.host == exp["host"]]
    assert hits, f"no {exp['check']} check on {exp['host']}: {report.checks}"
    check = hits[0]
    assert check.status == exp["status"], check
    assert exp["detail"] in check.detail, check
    assert exp["fix"] in check.fix, check
    for words in exp.get("fix_not", []):  # e.g. a `--planned` that would remove nothing
        assert words not in check.fix, check
    if exp["status"] == "fail":
        assert failing(report) == [(exp["check"], exp["host"])], report.failed()
        assert not report.ok
    else:
        assert report.ok, report.failed()


def spark_ops(inventory: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Run the real CLI in a subprocess."""
    env = {**os.environ, "SPARK_OPS_INVENTORY": str(inventory)}
    return subprocess.run(
        [sys.executable, "-m", "spark_ops.cli.main", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_cli_exit_codes_and_json(mini: MiniCluster, tmp_path: Path) -> None:
    """`doctor` exits 0 when green and 11 with the failing check's fix on screen; --json parses."""
    res = spark_ops(mini.inventory, "doctor", "--json")
    assert res.returncode == 0, res.stdout + res.stderr
    data = json.loads(res.stdout)
    assert data["ok"] is True and data["counts"]["fail"] == 0
    assert all(set(c) == {"name", "host", "status", "ok", "detail", "fix"} for c in data["checks"])

    bad = inventory_with(mini, tmp_path, {"recipe.path": "~/recipes/absent.yaml"})
    res = spark_ops(bad, "doctor")
    assert res.returncode == ExitStatus.CHECK_FAILED, res.stdout + res.stderr
    assert "✗ recipe" in res.stdout and "~/recipes/absent.yaml not found" in res.stdout
    assert "fix: copy the recipe to node1:~/recipes/absent.yaml" in res.stdout
    assert "Not ready for apply" in res.stdout


def test_unreachable_node_fails_ssh_only_for_it(mini: MiniCluster, tmp_path: Path) -> None:
    """A node that does not answer fails its ssh check with the address; the rest still runs."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    bad = inventory_with(mini, tmp_path, {"nodes.node4.port": dead})
    res = spark_ops(bad, "doctor", "--json")
    assert res.returncode == ExitStatus.CHECK_FAILED
    data = json.loads(res.stdout)
    fails = [c for c in data["checks"] if c["status"] == "fail"]
    assert [(c["name"], c["host"]) for c in fails] == [("ssh", "node4")]
    assert f"127.0.0.1:{dead}" in fails[0]["detail"]
    assert "sshd listens" in fails[0]["fix"]


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        ("spark-watchdog --config x --restart-now --force", (None, "spark-watchdog")),
        ("sudo -n /opt/wd/watchdog.sh --restart-now", (None, "/opt/wd/watchdog.sh")),
        ("WD_FORCE=1 env LANG=C ~/bin/wd --now", (None, "~/bin/wd")),
        (
            "cd ~/spark-vllm-docker && ./launch-cluster.sh stop && x",
            ("~/spark-vllm-docker", "./launch-cluster.sh"),
        ),
        ("", (None, None)),
    ],
)
def test_program(command: str, expected: tuple[str | None, str | None]) -> None:
    """The program checked with command -v skips cd DIR &&, sudo, env and VAR=value words."""
    assert command_program(command) == expected


def test_check_status_is_validated() -> None:
    """A check's status must be ok, warn or fail."""
    with pytest.raises(ValueError, match="ok"):
        Check("x", "node1", "bad", "detail")


async def test_cluster_lock_held_by_another_operator(mini: MiniCluster) -> None:
    """While another operator's apply holds the cluster lock, doctor fails and names them."""
    from spark_ops.lock import cluster_lock
    from spark_ops.remote import ClusterSession

    cluster = load_inventory(mini.inventory).cluster()
    async with ClusterSession(cluster) as other:
        await other.connect([cluster.head.name])
        async with cluster_lock(other, "apply --max-num-seqs 64"):
            report = await run_doctor(cluster)
    assert failing(report) == [("cluster-lock", "node1")]
    check = next(c for c in report.checks if c.name == "cluster-lock")
    assert "apply --max-num-seqs 64" in check.detail and "pid" in check.detail
    assert "wait for that operation to end" in check.fix
    after = await run_doctor(cluster)
    assert any(c.name == "cluster-lock" and c.status == "ok" for c in after.checks)


def test_dead_ray_worker_fails_doctor(tmp_path: Path) -> None:
    """A worker whose Ray worker died (SSH up) fails `ray-worker` naming it, with the fix shown;
    apply and plan refuse the restart it predicts would fail, before anything is written.

    Its own cluster: the engine loses the worker too (its completions stop), which would leave the
    shared one wedged for the cases after it.
    """
    from conftest import start_sim

    from spark_ops.sim.control import down

    s = start_sim(tmp_path / "sim")
    try:
        stop = spark_ops(s.inventory, "sim", "stop-raylet", "--dir", str(s.root), "node3")
        assert stop.returncode == 0 and stop.stdout == "node3: Ray worker stopped\n", stop
        res = spark_ops(s.inventory, "doctor", "--json")
        data = json.loads(res.stdout)
        recipe = s.recipe.read_text()
        history = (s.root / "nodes/node1/.local/state/spark-watchdog/restarts").read_text()
        # the same check is part of the plan: refused before anything is written
        applied = spark_ops(s.inventory, "apply", "--max-num-seqs", "8", "--yes", "--json")
        planned = spark_ops(s.inventory, "plan", "--max-num-seqs", "8")
        assert s.recipe.read_text() == recipe
        assert (s.root / "nodes/node1/.local/state/spark-watchdog/restarts").read_text() == history
    finally:
        down(s.root)
    for run in (applied, planned):
        assert run.returncode == ExitStatus.CHECK_FAILED, run.stdout + run.stderr
    error = json.loads(applied.stderr.strip().splitlines()[-1])
    assert error["error"] == "BootWouldFail", error
    assert "node3 (`" in error["message"] and "node2" not in error["message"], error
    assert "nothing was written" in error["message"]
    assert "start the Ray worker on node3" in error["hint"], error
    assert res.returncode == ExitStatus.CHECK_FAILED, res.stdout + res.stderr
    rays = {c["host"]: c for c in data["checks"] if c["name"] == "ray-worker"}
    assert sorted(rays) == ["node2", "node3", "node4"]
    assert [h for h, c in rays.items() if c["status"] != "ok"] == ["node3"]
    assert "exited 1: no Ray worker running" in rays["node3"]["detail"]
    assert "start Ray on node3" in rays["node3"]["fix"]


def test_status_shows_the_watchdogs_own_status(mini: MiniCluster, tmp_path: Path) -> None:
    """`status` runs watchdog.status_command: the watchdog's own state shown; one that prints
    nothing is named as not answering, and the rest of status is still there."""
    res = spark_ops(mini.inventory, "status", "--json")
    assert res.returncode == 0, res.stderr
    own = json.loads(res.stdout)["watchdog_status"]
    assert own["answered"] is True and own["exit_code"] == 0, own
    res = spark_ops(mini.inventory, "status")
    assert "Watchdog says: " in res.stdout, res.stdout
    silent = inventory_with(mini, tmp_path, {"watchdog.status_command": "true"})
    res = spark_ops(silent, "status")
    assert res.returncode == 0, res.stderr
    assert "Watchdog status command did not answer: printed nothing" in res.stdout
    assert "Watchdog budget:" in res.stdout
