"""Control of the embedded cluster from outside: up (background process), down, status, node
stop/start.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from spark_ops.errors import ExitStatus
from spark_ops.files import write_file
from spark_ops.sim.cluster import (
    CONTROL,
    RESTART_WATCHDOG_S,
    STATE,
    SimError,
    SimOptions,
    node_names,
    prepare,
)

# where `sim up` records each cluster it started (one file per directory), so `sim status` and
# `sim down` run from another directory can say where one runs
REGISTRY = Path("~/.local/state/spark-ops/sims")


def _registry_entry(root: Path) -> Path:
    """The registry file naming one cluster directory."""
    import hashlib

    digest = hashlib.sha256(str(root.resolve()).encode("utf-8", "surrogateescape")).hexdigest()
    return REGISTRY.expanduser() / f"{digest[:16]}.json"


def record_running(root: Path, state: dict[str, Any]) -> None:
    """Record that a cluster runs in root (what `running_elsewhere` reads)."""
    entry = {"root": str(root.resolve()), "pid": state.get("pid")}
    write_file(_registry_entry(root), json.dumps(entry) + "\n", make_parents=True)


def forget(root: Path) -> None:
    """Remove the record `record_running` wrote for root (the cluster there was stopped)."""
    _registry_entry(root).unlink(missing_ok=True)


def running_elsewhere(root: Path) -> list[dict[str, Any]]:
    """The clusters `sim up` recorded that still run, in another directory than root."""
    found: list[dict[str, Any]] = []
    here = root.resolve()
    for path in sorted(REGISTRY.expanduser().glob("*.json")):
        try:
            other = Path(json.loads(path.read_text())["root"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if other != here:
            state = read_state(other)
            if state is not None:
                found.append({"root": str(other), "pid": state.get("pid")})
    return found


def read_state(root: Path) -> dict[str, Any] | None:
    """The running cluster's state.json, or None when it is not running."""
    try:
        state: dict[str, Any] = json.loads((root / STATE).read_text())
    except (OSError, ValueError):
        return None
    try:
        os.kill(int(state["pid"]), 0)
    except (ProcessLookupError, PermissionError, KeyError, ValueError):
        return None
    return state


def up(
    root: Path, opts: SimOptions, *, fresh: bool = True, timeout: float = 60.0
) -> dict[str, Any]:
    """Lay out (fresh by default) and start the embedded cluster in the background."""
    root = root.resolve()
    if read_state(root) is not None:
        raise SimError(
            f"an embedded cluster is already running in {root}",
            hint=f"spark-ops sim down --dir {root} first",
            status=ExitStatus.CONFLICT,
        )
    if fresh and root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True, exist_ok=True)
    prepare(root, opts)
    log = open(root / "cluster.log", "ab")  # noqa: SIM115
    head_ns = opts.netns.get(node_names(opts.nodes)[0])
    netns = ["ip", "netns", "exec", head_ns] if head_ns else []
    proc = subprocess.Popen(
        [*netns, sys.executable, "-m", "spark_ops.sim.cluster", "serve", str(root)],
        stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = read_state(root)
        if state is not None:
            return state
        if proc.poll() is not None:
            tail = (root / "cluster.log").read_text(errors="replace")[-2000:]
            raise SimError(
                f"the embedded cluster exited at start (code {proc.returncode}):\n{tail}",
                status=ExitStatus.BOOT_FAILED,
            )
        time.sleep(0.1)
    raise SimError(
        f"the embedded cluster did not come up within {timeout:.0f} s; see {root}/cluster.log",
        status=ExitStatus.TIMEOUT,
    )


def wait_serving(state: dict[str, Any], timeout: float = 120.0) -> float:
    """Wait until the cluster's engine answers GET /v1/models; return the seconds waited.

    `up()` returns once the nodes listen; the engine's first boot goes on behind them, and a
    request sent before it serves is refused. SimError when it does not serve by the deadline.
    """
    import urllib.error
    import urllib.request

    url = f"http://127.0.0.1:{int(state['engine_port'])}/v1/models"
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                if resp.status == 200:
                    return time.monotonic() - started
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.2)
    raise SimError(
        f"the embedded cluster's engine did not serve within {timeout:.0f} s",
        hint=f"see {state.get('root', '.sim')}/nodes/node1/engine.log",
        status=ExitStatus.TIMEOUT,
    )


def down(root: Path, timeout: float = 20.0) -> bool:
    """Stop the embedded cluster; True when one was running."""
    state = read_state(root.resolve())
    if state is None:
        return False
    pid = int(state["pid"])
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _running(pid):
            return True
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)
    return True


POINT_HINT = "point at another with --dir DIR or SPARK_OPS_SIM_DIR=DIR"


def not_running(root: Path) -> str:
    """Nothing runs in root: the directory looked in, and the clusters running elsewhere."""
    text = f"no embedded cluster is running in {root.resolve()}"
    others = running_elsewhere(root)
    if others:
        text += "; running elsewhere: " + ", ".join(f"{o['root']} (pid {o['pid']})" for o in others)
    return text


def _running(pid: int) -> bool:
    """True while the process runs; a zombie (our own child, when up() ran here) is reaped."""
    with contextlib.suppress(ChildProcessError, OSError):
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return False
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def node(root: Path, action: str, name: str) -> dict[str, Any]:
    """Stop or start one simulated node (its SSH server and raylet)."""
    return _request(root, f"{action} {name}", 10.0)


def restart_watchdog(root: Path) -> dict[str, Any]:
    """Restart the head's watchdog and its engine from the watchdog config as it is now."""
    return _request(root, "restart-watchdog", RESTART_WATCHDOG_S + 30)


def _request(root: Path, request: str, timeout: float) -> dict[str, Any]:
    """Send one control request to the running cluster; SimError when it is refused."""
    if read_state(root.resolve()) is None:
        raise SimError(not_running(root), hint=POINT_HINT, status=ExitStatus.CONFLICT)
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(timeout)
        s.connect(str(root.resolve() / CONTROL))
        s.sendall(f"{request}\n".encode())
        data = b""
        while not data.endswith(b"\n"):
            chunk = s.recv(4096)
            if not chunk:
                break
            data += chunk
    answer: dict[str, Any] = json.loads(data or b"{}")
    if not answer.get("ok"):
        raise SimError(f"sim {request}: {answer.get('error', 'no answer')}")
    return answer
