"""One real Docker daemon per simulated node: its own socket, data root, exec root and pidfile.

sparkrun names every Ray worker container `sparkrun_<intent>_<token>_worker`, the same name on each
worker host; the embedded nodes share this machine, so on one daemon the three worker launches
would collide on that name. Each simulated node therefore gets a dockerd of its own (with its own
managed containerd under its exec root), started as `.ci/install-docker.sh` starts the machine's:
`--bridge=none --iptables=false --ip6tables=false --ip-masq=false` (no bridge, no NAT, no
172.17.0.0/16; containers use `--network host`). A node's commands reach its daemon through
`DOCKER_HOST` (`NodeDaemons.environment(name)`).

Ownership: every daemon lives under one directory `/tmp/so-dk-<owner pid>-<n>/` holding an `owner`
file; `stop()` stops only the daemons it started (by their pid file, SIGTERM then SIGKILL) and
removes that directory; `sweep_stale()` does the same for directories whose owner process died.
No other daemon, container or image of the machine is touched.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path

from . import GroundError
from .docker import IMAGE, docker, docker_bin, ensure_image
from .sshd import pid_alive

PREFIX = "so-dk-"
START_DEADLINE_S = 60.0
STOP_DEADLINE_S = 20.0


def _pid(pidfile: Path) -> int | None:
    """The pid in a daemon's pid file, or None."""
    try:
        return int(pidfile.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _serves(pid: int, socket: Path) -> bool:
    """Tell whether `pid` is a dockerd listening on `socket` (a pid file may name a reused pid)."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return (
        bool(argv)
        and Path(os.fsdecode(argv[0])).name == "dockerd"
        and (f"unix://{socket}".encode() in argv)
    )


def _stop_pid(pid: int | None, socket: Path, deadline_s: float = STOP_DEADLINE_S) -> None:
    """SIGTERM a daemon we started (it must still serve our socket), SIGKILL it past the deadline.

    A pid file of a run that died names a pid the machine may have given to another process
    since: the machine's own dockerd got SIGTERM that way in CI. Only a dockerd whose command
    line holds this tree's socket is signalled.
    """
    if pid is None or not pid_alive(pid) or not _serves(pid, socket):
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    end = time.monotonic() + deadline_s
    while time.monotonic() < end and pid_alive(pid):
        time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError):
        if pid_alive(pid) and _serves(pid, socket):
            os.kill(pid, signal.SIGKILL)


def _remove_tree(base: Path) -> None:
    """Remove a daemon tree (after its daemons stopped: nothing of it is mounted any more)."""
    for mnt in reversed(Path("/proc/self/mounts").read_text().splitlines()):
        point = mnt.split()[1] if len(mnt.split()) > 1 else ""
        if point.startswith(str(base) + "/"):
            subprocess.run(["umount", "-l", point], check=False, capture_output=True)
    shutil.rmtree(base, ignore_errors=True)


def sweep_stale(tmp: Path | None = None) -> list[Path]:
    """Stop the daemons of ground trees whose owner process died; remove those trees."""
    swept = []
    for base in (tmp or Path(tempfile.gettempdir())).glob(f"{PREFIX}*"):
        try:
            owner = int((base / "owner").read_text())
        except (OSError, ValueError):
            continue
        if pid_alive(owner):
            continue
        for pidfile in base.glob("*/docker.pid"):
            _stop_pid(_pid(pidfile), pidfile.parent / "docker.sock")
        _remove_tree(base)
        swept.append(base)
    return swept


class NodeDaemons:
    """Real dockerds, one per node name, each with the ground image loaded."""

    def __init__(self, names: Iterable[str], image: str = IMAGE) -> None:
        """Choose the tree; start() runs the daemons."""
        self.names = list(names)
        self.image = image
        self.base = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-"))
        (self.base / "owner").write_text(str(os.getpid()))
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def socket(self, name: str) -> Path:
        """The daemon socket of one node."""
        return self.base / name / "docker.sock"

    def environment(self, name: str) -> dict[str, str]:
        """What a node's commands need to reach its own daemon."""
        return {"DOCKER_HOST": f"unix://{self.socket(name)}"}

    def docker(self, name: str, *args: str, timeout: float = 120.0, check: bool = True) -> str:
        """`docker ARGS…` against one node's daemon; GroundError naming it when it fails."""
        return docker(*args, timeout=timeout, check=check, env=self.environment(name), who=name)

    def _start_one(self, name: str) -> None:
        """Start one node's dockerd in the background."""
        d = self.base / name
        (d / "data").mkdir(parents=True)
        (d / "exec").mkdir()
        log = open(d / "dockerd.log", "ab")  # noqa: SIM115
        self.procs[name] = subprocess.Popen(
            [
                "dockerd", "--host", f"unix://{self.socket(name)}",
                "--data-root", str(d / "data"), "--exec-root", str(d / "exec"),
                "--pidfile", str(d / "docker.pid"),
                "--bridge=none", "--iptables=false", "--ip6tables=false", "--ip-masq=false",
            ],  # its storage driver: dockerd's choice (overlay2, vfs where overlay cannot run)
            stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip

    def _wait_one(self, name: str, end: float) -> None:
        """Wait until one daemon answers, or raise with the end of its log."""
        while time.monotonic() < end:
            proc = self.procs[name]
            if proc.poll() is not None:
                break
            with contextlib.suppress(GroundError):
                if self.docker(name, "info", "--format", "{{.ServerVersion}}", timeout=10).strip():
                    return
            time.sleep(0.3)
        tail = (self.base / name / "dockerd.log").read_text(errors="replace")[-2000:]
        raise GroundError(f"{name}: dockerd did not answer on {self.socket(name)}:\n{tail}")

    def start(self) -> NodeDaemons:
        """Start every daemon, wait for each, and load the ground image into each."""
        if shutil.which("dockerd") is None or docker_bin() is None:
            raise GroundError("no dockerd/docker on PATH (.ci/install-docker.sh installs them)")
        sweep_stale()
        ensure_image(self.image)
        try:
            for name in self.names:
                self._start_one(name)
            end = time.monotonic() + START_DEADLINE_S
            for name in self.names:
                self._wait_one(name, end)
            archive = self.base / "image.tar"
            exe = docker_bin()
            assert exe is not None
            subprocess.run([exe, "save", "-o", str(archive), self.image], check=True, timeout=120)
            for name in self.names:
                self.docker(name, "load", "-i", str(archive))
            archive.unlink()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Remove every container of our daemons, stop the daemons, remove their tree."""
        for name, proc in self.procs.items():
            if proc.poll() is None:
                ids = self.docker(name, "ps", "-aq", timeout=20, check=False).split()
                if ids:
                    self.docker(name, "rm", "-f", *ids, timeout=60, check=False)
            _stop_pid(proc.pid, self.socket(name))
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
        self.procs.clear()
        _remove_tree(self.base)
