"""`spark-ops sim up` returns once the engine serves: the next command is answered; a plain `sim up`
runs the engine as ranks without Ray (executor mp), as the launcher does."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

from spark_ops.sim.control import down


def test_sim_up_waits_for_the_engine(tmp_path: Path) -> None:
    """Right after `sim up` returns, the engine lists its model; --no-wait says it is booting.
    Without --executor the engine runs as ranks (mp): the inventory says so, every worker runs
    its headless rank."""
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
        assert "      executor: mp\n" in Path(state["inventory"]).read_text()
        assert json.loads((root / "layout.json").read_text())["executor"] == "mp"
        for node in ("node2", "node3", "node4"):
            pid = int((root / "nodes" / node / ".local/state/spark-sim/rank.pid").read_text())
            assert b"--headless" in Path(f"/proc/{pid}/cmdline").read_bytes(), node
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
        assert "(engine ranks without Ray)" in res.stdout
    finally:
        down(root)
