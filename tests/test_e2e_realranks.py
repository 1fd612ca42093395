"""End to end over real ranks without Ray: vLLM's CPU build at TP=2 across two namespaces.

The shape eugr/spark-vllm-docker launches today (issue 33): `vllm serve … --distributed-executor-
backend mp --nnodes 2 --node-rank 0 --master-addr A --master-port P` on the head serving the API,
the same with `--node-rank 1 --headless` on the worker. The wiring (docs/test-ground.md, "Ranks
without Ray"):

- `tests/ground/ray.py`'s two network namespaces and veth (head 198.18.0.1, worker 198.18.0.2);
  no Ray runs in them.
- A 2-node embedded cluster runs in the head's namespace (node2's commands in the worker's), as in
  tests/test_e2e_realray.py; its inventory says `engine.executor: mp`.
- The head's `vllm` is the ranks launcher of `tests/ground/ranks.py`: the watchdog's restart action
  runs the recipe's `vllm serve … --tensor-parallel-size 2 --distributed-executor-backend mp`, the
  launcher stops the last launch's rank 1, starts the new one in the worker's namespace (logging to
  node2's `~/engine.log`) and becomes rank 0.

One ground serves the three cells in order: apply (both ranks new, each rank's args), rollback
(both ranks new again, the old values back), then a rank 1 that fails at start (the boot fails
naming node2 and its lines). The watchdog is paused (forced restarts still run); `apply` runs with
`--preflight off` (it imports vLLM once more on the head; tests/test_preflight.py covers it).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import Sim, start_sim
from ground.ranks import FAULT_FILE, RANK_PID, flag_value, launcher_text, rank_argv
from ground.ray import RayCluster, netns_pids, netns_unavailable_reason
from ground.sshd import pid_alive
from ground.vllm import OWNER_ENV, VENV, tiny_llama_recipe, vllm_unavailable_reason

from spark_ops.errors import ExitStatus

pytestmark = [pytest.mark.realray, pytest.mark.realvllm, pytest.mark.slow]

MODELS = VENV / "models"
FIRST_SEQS = 4  # the recipe's max_num_seqs before the apply


@dataclass
class RanksGround:
    """The two namespaces and the embedded cluster whose head launches the real ranks."""

    net: RayCluster
    sim: Sim

    @property
    def worker_home(self) -> Path:
        """node2's tree (its HOME)."""
        return self.sim.root / "nodes" / "node2"

    @property
    def rank0_log(self) -> Path:
        """Rank 0's log on the head."""
        return self.sim.head / "engine.log"

    @property
    def rank1_log(self) -> Path:
        """Rank 1's log on the worker."""
        return self.worker_home / "engine.log"

    def cli(self, *args: str, timeout: float = 1200) -> subprocess.CompletedProcess[str]:
        """Run the spark-ops CLI inside the head's namespace."""
        env = dict(os.environ, SPARK_OPS_INVENTORY=str(self.sim.inventory))
        env.pop("SPARK_OPS_CLUSTER", None)
        env.pop("SPARK_OPS_FLEET", None)
        argv = self.net.in_ns(self.net.head_ns, [sys.executable, "-m", "spark_ops.cli.main", *args])
        return subprocess.run(
            argv, env=env, capture_output=True, text=True, timeout=timeout, check=False
        )

    def run_json(self, *args: str) -> tuple[int, dict[str, Any], str]:
        """`spark-ops CMD --json ARGS… --yes --no-drain`: exit code, JSON outcome or {}, stderr."""
        res = self.cli(args[0], "--json", *args[1:], "--yes", "--no-drain")
        out = json.loads(res.stdout) if res.stdout.strip().startswith("{") else {}
        return res.returncode, out, res.stderr

    def set_engine(self, **values: Any) -> None:
        """Rewrite keys of the inventory's engine section (the test owns this inventory)."""
        data = yaml.safe_load(self.sim.inventory.read_text())
        (cluster,) = data["clusters"].values()
        cluster["engine"].update(values)
        self.sim.inventory.write_text(yaml.safe_dump(data, sort_keys=False))

    def rank0_pid(self) -> int | None:
        """The pid in the watchdog's engine pid file (rank 0), if any."""
        path = self.sim.head / ".local" / "state" / "spark-watchdog" / "engine.pid"
        text = path.read_text().strip() if path.exists() else ""
        return int(text.split()[0]) if text[:1].isdigit() else None

    def rank1_pid(self) -> int | None:
        """The pid the launcher wrote for rank 1, if any."""
        path = self.worker_home / RANK_PID
        text = path.read_text().strip() if path.exists() else ""
        return int(text) if text.isdigit() else None

    def offsets(self) -> tuple[int, int]:
        """Both ranks' log sizes now."""
        return (
            self.rank0_log.stat().st_size if self.rank0_log.exists() else 0,
            self.rank1_log.stat().st_size if self.rank1_log.exists() else 0,
        )


def _health(g: RanksGround) -> int | None:
    """HTTP status of the engine's /health in the head namespace (None: refused)."""
    url = f"http://127.0.0.1:{g.sim.state['engine_port']}/health"
    code = (
        "import urllib.request\n"
        "try:\n"
        f"    print(urllib.request.urlopen({url!r}, timeout=3).status)\n"
        "except OSError:\n    print('refused')\n"
    )
    argv = g.net.in_ns(g.net.head_ns, [sys.executable, "-c", code])
    out = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    word = out.stdout.strip()
    return int(word) if word.isdigit() else None


@pytest.fixture(scope="module")
def ground(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RanksGround]:
    """The namespaces and a 2-node embedded cluster whose head launches ranks; cleaned after."""
    reason = vllm_unavailable_reason() or netns_unavailable_reason()  # Ray is not needed
    if reason:
        pytest.skip(reason)
    from spark_ops.sim.control import down

    tier_started = time.monotonic()
    tmp = tmp_path_factory.mktemp("realranks")
    net = RayCluster(tmp / "net", owner_env={OWNER_ENV: str(os.getpid())})
    net.track_shm()
    sim: Sim | None = None
    try:
        sim = start_sim(tmp / "sim", nodes=2, netns={"node1": net.head_ns, "node2": net.worker_ns})
        g = RanksGround(net, sim)
        deadline = time.monotonic() + 90
        while _health(g) != 200:  # the simulated engine's first boot (replaced by the apply)
            assert time.monotonic() < deadline, "the simulated engine's first boot: not in 90 s"
            time.sleep(1.0)
        state = sim.head / ".local" / "state" / "spark-watchdog"
        (state / "pause").write_text("paused by the real-ranks test: forced restarts only\n")
        shim = sim.head / "bin" / "vllm"
        shim.write_text(
            launcher_text(worker_ns=net.worker_ns, worker_home=g.worker_home, owner_pid=os.getpid())
        )
        shim.chmod(0o755)
        g.rank1_log.touch()
        env = {**net.ray_env(), OWNER_ENV: str(os.getpid())}
        for key in ("RAY_ADDRESS", "PYTHONPATH", "RAY_USAGE_STATS_ENABLED"):
            env.pop(key)  # no Ray here: only the network and offline switches
        sim.recipe.write_text(
            tiny_llama_recipe(
                writer="tests/test_e2e_realranks.py",
                models=MODELS,
                port=sim.state["engine_port"],
                env=env,
                max_num_seqs=FIRST_SEQS,
                kv_cache="1G",
                name="tiny-llama-ranks-tp2",
                description="a tiny local Llama on vLLM's CPU build, TP=2 as two ranks without Ray",
                tensor_parallel=2,
                executor="mp",
            )
        )
        # no worker check: the launcher starts the worker's rank with the restart itself
        g.set_engine(executor="mp", worker_check="", boot_deadline_s=1200, probe_timeout_s=60)
        yield g
    finally:
        if sim is not None:
            down(sim.root)
        net.close()
        print(f"\nreal-ranks module: {time.monotonic() - tier_started:.0f} s in all")


def _failed(out: dict[str, Any]) -> list[dict[str, Any]]:
    """The checks of an outcome that failed."""
    return [c for c in out.get("checks", []) if not c.get("ok")]


def _rank_args(pid: int | None) -> list[str]:
    """A rank's command line, asserting it runs."""
    assert pid is not None and pid_alive(pid), f"rank process {pid} is not running"
    return rank_argv(pid)


def _assert_ranks(
    g: RanksGround, out: dict[str, Any], seqs: int, old: tuple[int | None, ...]
) -> None:
    """Both ranks are new processes running the recipe's value, rank 1 headless on node2."""
    boot = out["boot"]
    nda = boot["non_default_args"]
    assert nda["max_num_seqs"] == seqs and nda["distributed_executor_backend"] == "mp", nda
    assert nda["nnodes"] == 2 and nda["tensor_parallel_size"] == 2, nda
    assert boot["ranks"]["node2"]["started"] is True, boot["ranks"]
    r0, r1 = g.rank0_pid(), g.rank1_pid()
    assert r0 not in old and r1 not in old, (old, r0, r1)
    a0, a1 = _rank_args(r0), _rank_args(r1)
    assert flag_value(a0, "--node-rank") == "0" and "--headless" not in a0, a0
    assert flag_value(a1, "--node-rank") == "1" and "--headless" in a1, a1
    for argv in (a0, a1):
        assert flag_value(argv, "--max-num-seqs") == str(seqs), argv
        assert flag_value(argv, "--distributed-executor-backend") == "mp", argv
    # rank 1 runs in the worker's network namespace, with node2's HOME
    assert r1 in netns_pids(g.net.worker_ns), "rank 1 is not in the worker's namespace"
    environ = Path(f"/proc/{r1}/environ").read_bytes().split(b"\0")
    assert f"HOME={g.worker_home}".encode() in environ
    by_host = {(c["name"], c["host"]): c for c in out.get("checks", [])}
    assert by_host[("effective-args", "node2")]["status"] in ("ok", "warn"), by_host


@pytest.mark.timeout(1500)
def test_apply_restarts_every_rank_with_the_new_args(ground: RanksGround) -> None:
    """apply --max-num-seqs 6: rank 0 and rank 1 both new, each running the new value."""
    g = ground
    _, off1 = g.offsets()
    old = (g.rank0_pid(), g.rank1_pid())
    started = time.monotonic()
    code, out, err = g.run_json("apply", "--max-num-seqs", "6", "--preflight", "off")
    took = time.monotonic() - started
    assert code == 0, f"failed checks {_failed(out)}; {err[-3000:]}"
    _assert_ranks(g, out, 6, old)
    rank1 = g.rank1_log.read_text(errors="replace")[off1:]
    assert "headless multiproc executor, with head node address 198.18.0.1" in rank1, rank1[-2000:]
    print(f"\napply over two real ranks (TP=2): {took:.0f} s; boot {out['boot']['total_s']:.0f} s")


@pytest.mark.timeout(1500)
def test_rollback_restarts_every_rank_with_the_old_args(ground: RanksGround) -> None:
    """rollback: the recipe before the apply is back, both ranks new again running its value."""
    g = ground
    old = (g.rank0_pid(), g.rank1_pid())
    started = time.monotonic()
    code, out, err = g.run_json("rollback")
    took = time.monotonic() - started
    assert code == 0, f"failed checks {_failed(out)}; {err[-3000:]}"
    _assert_ranks(g, out, FIRST_SEQS, old)
    assert old[1] is not None and not pid_alive(old[1]), "the last launch's rank 1 still runs"
    print(f"\nrollback over two real ranks: {took:.0f} s")


def _error(stderr: str) -> dict[str, Any]:
    """The JSON error of a failed --json run (its last JSON line on stderr with an error)."""
    for line in reversed(stderr.splitlines()):
        if line.startswith("{"):
            try:
                data = json.loads(line)
            except ValueError:
                continue
            if data.get("error") and data.get("message"):
                return dict(data)
    raise AssertionError(f"no JSON error line on stderr: {stderr[-2000:]}")


@pytest.mark.timeout(1500)
def test_rank_failing_at_start_fails_the_boot_naming_its_node(ground: RanksGround) -> None:
    """Rank 1 fails at start (an interface its node lacks): the boot fails naming node2 and its
    lines, while rank 0 waits for it (it never exits by itself)."""
    g = ground
    (g.worker_home / FAULT_FILE).write_text("GLOO_SOCKET_IFNAME=nosuch0\n")
    started = time.monotonic()
    code, _out, err = g.run_json("apply", "--max-num-seqs", "5", "--preflight", "off")
    took = time.monotonic() - started
    assert code == ExitStatus.BOOT_FAILED, (code, err[-3000:])
    error = _error(err)
    assert "worker rank on node2" in error["message"], error
    lines = error.get("lines") or []
    assert lines and all(line.startswith("node2: ") for line in lines), lines
    assert any("nosuch0" in line for line in lines), lines
    print(f"\nrank 1 failing at start: apply failed after {took:.0f} s: {error['message'][:300]}")
