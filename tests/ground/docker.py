"""Real Docker containers on the test ground: a local image, engines in containers on the host net.

No registry is reachable, so nothing is pulled: the image is a skeleton root made locally with
`docker import` (bin, lib, lib64 and sbin as links into /usr, a passwd and group file), and every
container mounts read-only what it runs: the host's /usr, the host's Python installation that the
vLLM venv was made from, the vLLM venv and, for the simulated engine, this checkout. Containers use
`--network host` only: the default bridge would put them on 172.17.0.0/16, an address range the
tests must not touch (dockerd itself runs with `--bridge=none`, see `.ci/install-docker.sh`).

Every container started here carries the label `spark-ops-ground=<owner pid>`; `sweep_stale()`
removes those whose owner process died, and `DockerGround.close()` removes its own. Nothing else
on the daemon is touched.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from . import GroundError
from .sshd import pid_alive

IMAGE = "spark-ops-ground:local"
LABEL = "spark-ops-ground"
REPO = Path(__file__).resolve().parents[2]
DOCKER_TIMEOUT = 120.0


def docker_bin() -> str | None:
    """The docker client on PATH, or None."""
    return shutil.which("docker")


def docker(
    *args: str,
    timeout: float = DOCKER_TIMEOUT,
    check: bool = True,
    env: dict[str, str] | None = None,
    who: str = "",
) -> str:
    """Run `docker ARGS…` and return its stdout; GroundError naming the command when it fails.

    env is added to this process's environment (e.g. DOCKER_HOST for one node's own daemon); who
    names that daemon in errors.
    """
    exe = docker_bin()
    if exe is None:
        raise GroundError("docker: no docker client on PATH")
    what = f"{who + ': ' if who else ''}docker {' '.join(args[:3])}"
    try:
        proc = subprocess.run(
            [exe, *args], capture_output=True, text=True, timeout=timeout, check=False,
            env={**os.environ, **env} if env else None,
        )  # fmt: skip
    except subprocess.TimeoutExpired as exc:
        raise GroundError(f"{what}: no answer within {timeout:.0f} s") from exc
    if check and proc.returncode != 0:
        raise GroundError(f"{what} failed ({proc.returncode}): {proc.stderr}")
    return proc.stdout


def docker_unavailable_reason() -> str | None:
    """Why real containers cannot run here (no client, no daemon), or None when they can."""
    if docker_bin() is None:
        return "no docker client on PATH (.ci/install-docker.sh installs docker.io)"
    try:
        docker("info", "--format", "{{.ServerVersion}}", timeout=20)
    except GroundError as exc:
        return f"the Docker daemon does not answer (.ci/install-docker.sh starts it): {exc}"
    return None


def python_home() -> Path:
    """The Python installation the running interpreter (and the ground's vLLM venv) comes from."""
    return Path(sys.base_prefix).resolve()


def ensure_image(tag: str = IMAGE) -> str:
    """Make the skeleton image with `docker import` unless it exists; return its tag."""
    with contextlib.suppress(ValueError):
        if json.loads(docker("image", "inspect", tag, check=False, timeout=30) or "[]"):
            return tag
    with tempfile.TemporaryDirectory(prefix="spark-ops-image-") as tmp:
        root = Path(tmp) / "root"
        for d in ("etc", "tmp", "var/tmp", "root", "proc", "sys", "dev", "run", "home", "opt"):
            (root / d).mkdir(parents=True, exist_ok=True)
        for link in ("bin", "lib", "lib64", "sbin"):
            (root / link).symlink_to(f"usr/{link}")
        (root / "etc" / "passwd").write_text(
            "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n"
        )
        (root / "etc" / "group").write_text("root:x:0:\nnogroup:x:65534:\n")
        (root / "tmp").chmod(0o1777)
        (root / "var" / "tmp").chmod(0o1777)
        archive = Path(tmp) / "root.tar"
        with tarfile.open(archive, "w") as tar:
            for entry in sorted(root.iterdir()):
                tar.add(entry, arcname=entry.name)
        docker("import", "-c", f"LABEL {LABEL}=image", str(archive), tag, timeout=120)
    return tag


def host_mounts(*extra: Path) -> list[str]:
    """`-v` arguments: /usr, the Python installation, the running venv and extra paths, read-only.

    The venv matters: a script the tests write names `sys.executable` (CI's venv lives in /tmp).
    """
    paths = [Path("/usr"), python_home(), Path(sys.prefix), *extra]
    seen: list[str] = []
    for p in paths:
        real = str(p.resolve())
        if real not in seen and not any(real.startswith(s + "/") for s in seen):
            seen.append(real)
    return [arg for real in seen for arg in ("-v", f"{real}:{real}:ro")]


@dataclass
class Container:
    """One container started on the ground: its name and id."""

    name: str
    id: str

    def inspect(self) -> dict:
        """`docker inspect` of the container (its State, Config, …)."""
        return dict(json.loads(docker("inspect", self.id, timeout=30))[0])

    def running(self) -> bool:
        """Whether the container runs now."""
        with contextlib.suppress(GroundError):
            return bool(self.inspect()["State"]["Running"])
        return False

    def logs(self) -> str:
        """Everything the container printed (stdout and stderr)."""
        exe = docker_bin() or "docker"
        proc = subprocess.run(
            [exe, "logs", self.id], capture_output=True, text=True, timeout=60, check=False
        )
        return proc.stdout + proc.stderr


class DockerGround:
    """Starts labelled containers on the host network and removes them on close()."""

    def __init__(self, owner: int | None = None) -> None:
        """Check the daemon, sweep containers of dead owners, make the image."""
        reason = docker_unavailable_reason()
        if reason:
            raise GroundError(reason)
        self.owner = owner or os.getpid()
        self.containers: list[Container] = []
        sweep_stale()
        self.image = ensure_image()

    def run(
        self,
        name: str,
        argv: Sequence[str],
        *,
        env: dict[str, str] | None = None,
        mounts: Sequence[Path] = (),
        writable: Sequence[Path] = (),
        stop_timeout: int | None = None,
        shm_size: str = "1g",
        extra: Sequence[str] = (),
    ) -> Container:
        """`docker run -d --network host` a labelled container running argv; return it.

        /dev/shm is 64 MiB in a container by default; vLLM's engine core needs more (as on a real
        cluster's `--shm-size` / `--ipc=host`).
        """
        args = ["run", "-d", "--network", "host", "--name", name, "--shm-size", shm_size]
        args += ["--label", f"{LABEL}={self.owner}"]
        if stop_timeout is not None:
            args += ["--stop-timeout", str(stop_timeout)]
        args += host_mounts(*mounts)
        for path in writable:
            real = str(Path(path).resolve())
            args += ["-v", f"{real}:{real}"]
        for key, value in (env or {}).items():
            args += ["-e", f"{key}={value}"]
        args += [*extra, self.image, *argv]
        cid = docker(*args, timeout=120).strip()
        container = Container(name=name, id=cid)
        self.containers.append(container)
        return container

    def close(self) -> None:
        """Remove (force) every container started here."""
        for c in self.containers:
            docker("rm", "-f", c.id, check=False, timeout=60)
        self.containers.clear()


def sweep_stale() -> list[str]:
    """Remove ground containers whose owner process is gone; return their names."""
    out = docker(
        "ps", "-a", "--filter", f"label={LABEL}", "--format",
        '{{.ID}} {{.Names}} {{.Label "' + LABEL + '"}}', check=False, timeout=30,
    )  # fmt: skip
    removed: list[str] = []
    for line in out.splitlines():
        parts = line.split()
        if len(parts) != 3 or not parts[2].isdigit():
            continue
        cid, name, owner = parts
        if not pid_alive(int(owner)):
            docker("rm", "-f", cid, check=False, timeout=60)
            removed.append(name)
    return removed


def wait_for(predicate: object, timeout: float, what: str, step: float = 0.2) -> None:
    """Poll a zero-argument callable until it is true; GroundError naming `what` after timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if callable(predicate) and predicate():
            return
        time.sleep(step)
    raise GroundError(f"{what}: not within {timeout:.0f} s")
