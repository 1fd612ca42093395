"""The simulated `ray` of sparkrun's containers: its command lines (fixtures/sim/ray_start.yaml)
and a head with three workers joining it, listed by `ray status`, lost with the head."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from spark_ops.sim.ray import RayUsageError, parse_start, tensor_parallel

CASES = yaml.safe_load((Path(__file__).parent / "fixtures" / "sim" / "ray_start.yaml").read_text())


@pytest.mark.parametrize("case", CASES, ids=[" ".join(c["argv"])[:60] for c in CASES])
def test_ray_start_command_lines(case: dict[str, Any]) -> None:
    """sparkrun's `ray start` lines parse; others are refused naming what is wrong."""
    if "error" in case:
        with pytest.raises(RayUsageError, match=case["error"]):
            parse_start(case["argv"])
        return
    a = parse_start(case["argv"])
    assert a.head is case["head"]
    for key in ("port", "node_ip", "address"):
        if key in case:
            assert getattr(a, key) == case[key]


def test_tensor_parallel_of_a_serve_line() -> None:
    """The engine entry waits for tensor-parallel-size − 1 workers."""
    assert tensor_parallel(["serve", "m", "--tensor-parallel-size", "4"]) == 4
    assert tensor_parallel(["serve", "m", "-tp=2"]) == 2
    assert tensor_parallel(["serve", "m"]) == 1


def _ray(env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    """Start the simulated ray with args."""
    return subprocess.Popen(
        [sys.executable, "-m", "spark_ops.sim.ray", *args],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def _port() -> int:
    """A free loopback port."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_head_and_three_workers(tmp_path: Path) -> None:
    """Workers join the head (ray status lists them), answer on their raylet port, and end with
    exit 1 when the head goes away; SIGTERM ends the head (it is a container's PID 1)."""
    env = {**os.environ, "SPARK_SIM_RAY_DIR": str(tmp_path / "ray")}
    port = _port()
    head = _ray(env, "start", "--block", "--head", "--port", str(port),
                "--node-ip-address", "127.0.0.1", "--disable-usage-stats")  # fmt: skip
    workers = []
    try:
        assert head.stdout is not None and "Ray runtime started" in head.stdout.readline()
        workers = [
            _ray(
                env,
                "start",
                "--block",
                f"--address=127.0.0.1:{port}",
                "--node-ip-address",
                "127.0.0.1",
            )
            for _ in range(3)
        ]
        end = time.monotonic() + 30
        status = ""
        while time.monotonic() < end:
            status = subprocess.run(
                [sys.executable, "-m", "spark_ops.sim.ray", "status"],
                env=env, capture_output=True, text=True, timeout=30,
            ).stdout  # fmt: skip
            if "3 worker node(s)" in status:
                break
            time.sleep(0.2)
        assert "Active: 1 head, 3 worker node(s)" in status, status
        addr = status.splitlines()[1].split()[1]
        import socket

        with socket.create_connection(tuple(addr.rsplit(":", 1)), timeout=5) as s:  # type: ignore[arg-type]
            assert s.recv(64).startswith(b"raylet worker-127.0.0.1-")
        head.terminate()
        assert head.wait(timeout=20) == 0
        for w in workers:
            assert w.wait(timeout=20) == 1
            assert w.stderr is not None and "lost the connection" in w.stderr.read()
    finally:
        for p in (head, *workers):
            if p.poll() is None:
                p.kill()
                p.wait()


def test_status_without_a_head(tmp_path: Path) -> None:
    """No head here: exit 1 with a message, as `ray status` without a cluster."""
    env = {**os.environ, "SPARK_SIM_RAY_DIR": str(tmp_path / "none")}
    res = subprocess.run([sys.executable, "-m", "spark_ops.sim.ray", "status"], env=env,
                         capture_output=True, text=True, timeout=30)  # fmt: skip
    assert res.returncode == 1 and "No cluster status" in res.stderr
