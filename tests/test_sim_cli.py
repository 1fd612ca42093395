"""`spark-ops sim up` returns once the engine serves: the next command is answered."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

from spark_ops.sim.control import down


def test_sim_up_waits_for_the_engine(tmp_path: Path) -> None:
    """Right after `sim up` returns, the engine lists its model; --no-wait says it is booting."""
    root = tmp_path / "sim"
    env = dict(os.environ)
    argv = [sys.executable, "-m", "spark_ops.cli.main", "sim", "up", "--dir", str(root)]
    try:
        res = subprocess.run(
            [*argv, "--json"], env=env, capture_output=True, text=True, timeout=240, check=False
        )
        assert res.returncode == 0, res.stderr[-2000:]
        state = json.loads(res.stdout)
        assert "engine_ready_after_s" in state, "sim up said when the engine served"
        url = f"http://127.0.0.1:{state['engine_port']}/v1/models"
        with urllib.request.urlopen(url, timeout=5) as r:
            assert r.status == 200 and json.loads(r.read())["data"]
        # README's `spark-ops exec -- nvidia-smi -L`: every node has the sim's GB10 tool
        smi = subprocess.run(
            [sys.executable, "-m", "spark_ops.cli.main", "-i", state["inventory"], "exec",
             "--json", "--", "nvidia-smi", "-L"],
            env=env, capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert smi.returncode == 0, smi.stdout + smi.stderr[-2000:]
        hosts = json.loads(smi.stdout)["hosts"]
        assert [h["host"] for h in hosts] == ["node1", "node2", "node3", "node4"], hosts
        for h in hosts:
            assert h["ok"] and h["stdout"].startswith("GPU 0: NVIDIA GB10 (UUID: GPU-"), h
    finally:
        down(root)
    try:
        res = subprocess.run(
            [*argv, "--no-wait"], env=env, capture_output=True, text=True, timeout=240, check=False
        )
        assert res.returncode == 0, res.stderr[-2000:]
        assert "Engine still booting" in res.stdout
    finally:
        down(root)
