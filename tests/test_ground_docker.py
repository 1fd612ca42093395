"""The Docker ground: a locally made image, containers on the host network, real vLLM inside one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from ground import GroundError
from ground.docker import IMAGE, REPO, DockerGround, docker, docker_unavailable_reason, wait_for
from ground.sshd import free_port
from ground.vllm import VENV, model_path, vllm_unavailable_reason

pytestmark = pytest.mark.docker


@pytest.fixture
def ground() -> Iterator[DockerGround]:
    """A DockerGround whose containers are removed after the test."""
    reason = docker_unavailable_reason()
    if reason:
        pytest.skip(reason)
    g = DockerGround()
    try:
        yield g
    finally:
        g.close()


def _name(what: str) -> str:
    """A container name unique to this test process."""
    return f"spark-ops-test-{what}-{os.getpid()}-{time.monotonic_ns() % 10**6}"


SERVER = (
    "import http.server, os, signal, sys\n"
    "signal.signal(signal.SIGTERM, lambda *a: None)  # a slow stop: SIGTERM is ignored\n"
    "class H(http.server.BaseHTTPRequestHandler):\n"
    "    def do_GET(self):\n"
    "        body = str(os.getpid()).encode()\n"
    "        self.send_response(200); self.end_headers(); self.wfile.write(body)\n"
    "    def log_message(self, *a): pass\n"
    "print('serving', flush=True)\n"
    "http.server.HTTPServer(('127.0.0.1', int(sys.argv[1])), H).serve_forever()\n"
)


def _get(port: int) -> str:
    """GET / on 127.0.0.1:port."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5) as r:
        return str(r.read().decode())


def _answers(port: int) -> bool:
    """Whether 127.0.0.1:port answers a GET."""
    try:
        _get(port)
    except OSError:
        return False
    return True


def test_container_on_host_network_new_id_and_sigkill_after_stop_timeout(
    ground: DockerGround,
) -> None:
    """The host's Python serves from a container on loopback; stop escalates; a rerun is new."""
    port = free_port()
    py = os.path.realpath(sys.executable)
    first = ground.run(_name("srv"), [py, "-c", SERVER, str(port)], stop_timeout=1)
    wait_for(lambda: _answers(port), 60, "the containerised server answers")
    info = first.inspect()
    assert info["HostConfig"]["NetworkMode"] == "host"
    assert info["Config"]["Labels"]["spark-ops-ground"] == str(os.getpid())
    assert "serving" in first.logs()
    docker("stop", first.id, timeout=60)  # SIGTERM ignored: SIGKILL after --stop-timeout
    state = first.inspect()["State"]
    assert state["Running"] is False and state["ExitCode"] == 137, state
    assert not _answers(port)
    second = ground.run(_name("srv"), [py, "-c", SERVER, str(port)], stop_timeout=1)
    wait_for(lambda: _answers(port), 60, "the second container answers")
    assert second.id != first.id
    assert second.inspect()["State"]["StartedAt"] > state["StartedAt"]


def test_nothing_pulled_and_only_own_containers_removed(ground: DockerGround) -> None:
    """The image is local (made by import); close() removes this test's containers only."""
    image = json.loads(docker("image", "inspect", ground.image))[0]
    assert image["RepoDigests"] == [], "made here, never pulled"
    c = ground.run(_name("sleep"), ["/bin/sleep", "60"])
    ground.close()
    with pytest.raises(GroundError):
        docker("inspect", c.id)


@pytest.mark.realvllm
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_real_vllm_serves_from_a_container(ground: DockerGround) -> None:
    """vLLM's CPU build runs in a container (venv mounted read-only) and answers a completion."""
    reason = vllm_unavailable_reason()
    if reason:
        pytest.skip(reason)
    port = free_port()
    argv = [str(VENV / "bin" / "python"), "-m", "vllm.entrypoints.openai.api_server"]
    argv += ["--model", str(model_path("tiny-llama")), "--host", "127.0.0.1", "--port", str(port)]
    argv += ["--served-model-name", "tiny", "--max-num-seqs", "6"]
    argv += ["--kv-cache-memory-bytes", "1G", "--enforce-eager"]
    env = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HOME": "/tmp"}
    c = ground.run(_name("vllm"), argv, env=env, mounts=[VENV, REPO], stop_timeout=30)

    def completes() -> bool:
        """Whether a tiny completion answers."""
        body = json.dumps({"model": "tiny", "prompt": "Hi", "max_tokens": 2}).encode()
        req = urllib.request.Request(
            f"http://127.0.0.1:{port}/v1/completions",
            data=body,
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return bool(json.loads(r.read())["choices"])
        except (OSError, ValueError):
            if not c.running():
                raise GroundError(f"vLLM's container exited:\n{c.logs()[-3000:]}") from None
            return False

    wait_for(completes, 400, "vLLM in a container answers a completion", step=1.0)
    logs = c.logs()
    assert "non-default args:" in logs and "'max_num_seqs': 6" in logs
    docker("stop", c.id, timeout=90)
    state = c.inspect()["State"]
    assert state["Running"] is False and state["ExitCode"] in (0, 143), state


def test_node_daemons_own_and_stop_only_theirs(ground: DockerGround, tmp_path: Path) -> None:
    """One dockerd per node: same container name on two nodes (as sparkrun's workers), each on its
    own daemon; stop() removes those daemons, their containers and tree, and nothing else (a
    container of the machine's daemon stays); sweep_stale() takes only trees whose owner died,
    and signals only their own dockerds."""
    from ground.dockerd import PREFIX, NodeDaemons, sweep_stale

    outside = ground.run(_name("outside"), ["sleep", "600"])
    daemons = NodeDaemons(["node2", "node3"]).start()
    try:
        for node in daemons.names:
            daemons.docker(node, "run", "-d", "--network", "host", "-v", "/usr:/usr:ro",
                           "--name", "sparkrun_x_worker", IMAGE, "sleep", "600")  # fmt: skip
        for node in daemons.names:
            names = daemons.docker(node, "ps", "--format", "{{.Names}}").split()
            assert names == ["sparkrun_x_worker"]
        assert "sparkrun_x_worker" not in docker("ps", "--format", "{{.Names}}")
        socks = [daemons.socket(n) for n in daemons.names]
    finally:
        daemons.stop()
    assert not daemons.base.exists() and not any(s.exists() for s in socks)
    assert outside.running(), "the machine's daemon and its containers are not touched"
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = tmp_path / f"{PREFIX}{dead.pid}-x"
    (stale / "node1").mkdir(parents=True)
    (stale / "owner").write_text(str(dead.pid))
    bystander = subprocess.Popen(["sleep", "600"])  # the pid file names a pid reused since
    (stale / "node1" / "docker.pid").write_text(str(bystander.pid))
    live = tmp_path / f"{PREFIX}{os.getpid()}-y"
    live.mkdir()
    (live / "owner").write_text(str(os.getpid()))
    try:
        assert sweep_stale(tmp_path) == [stale]
        assert not stale.exists() and live.exists()
        assert bystander.poll() is None, "no dockerd of that tree: not signalled"
    finally:
        bystander.kill()
        bystander.wait()
