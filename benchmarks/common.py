"""Shared helpers of the benchmark scripts: OpenSSH nodes, inventories, peers, timing and tables.

The nodes come from tests/ground/sshd.py (real sshd processes on 127.0.0.1, one Unix user
each). Peers are found on PATH or in $SPARK_OPS_PEERS_VENV (a separate virtualenv, so they never
become project dependencies); a peer that is not there is skipped and the table says so.
"""

from __future__ import annotations

import hashlib
import os
import random
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from ground.sshd import SshdCluster, start_sshd_nodes  # noqa: E402

PEERS_VENV = Path(os.environ.get("SPARK_OPS_PEERS_VENV", "/tmp/sparkops-peers"))
RECIPE_NAME = "bench-recipe.yaml"
NO_CAP = "spark-ops, connect cap = nodes"  # a variant row, not a peer
RECIPE_TEXT = "model: glm-5.3-flash\nmax_num_seqs: 6\nkv_cache_memory: 40G\n"


BENCH_VENV = Path(os.environ.get("SPARK_OPS_BENCH_VENV", "/tmp/sparkops-bench"))


def _source_digest() -> str:
    """A digest of what `pip install .` installs: pyproject.toml, spark_ops and refwatchdog."""
    h = hashlib.sha256()
    files = [REPO / "pyproject.toml", *(REPO / "spark_ops").rglob("*")]
    files += [*(REPO / "refwatchdog").rglob("*")]
    for p in sorted(f for f in files if f.is_file() and "__pycache__" not in f.parts):
        h.update(str(p.relative_to(REPO)).encode() + b"\0" + p.read_bytes())
    return h.hexdigest()


def bench_venv() -> Path:
    """A venv holding spark-ops installed as operators install it (`pip install .`, not editable).

    Built on first use and rebuilt when the source changed. An editable install pays an import
    hook on every start (~10 ms) that a real install does not; the peers live in a venv of their
    own too. SPARK_OPS_BENCH_EDITABLE=1 times the current environment instead.
    """
    if os.environ.get("SPARK_OPS_BENCH_EDITABLE"):
        return Path(sys.executable).parent.parent
    marker = BENCH_VENV / "spark-ops.digest"
    digest = _source_digest()
    script = BENCH_VENV / "bin" / "spark-ops"
    if script.exists() and marker.exists() and marker.read_text() == digest:
        return BENCH_VENV
    if not (BENCH_VENV / "bin" / "python").exists():
        subprocess.run([sys.executable, "-m", "venv", str(BENCH_VENV)], check=True)
    print(f"# installing spark-ops in {BENCH_VENV} (pip install ., not editable)", file=sys.stderr)
    pip = [str(BENCH_VENV / "bin" / "python"), "-m", "pip", "install", "-q"]
    subprocess.run([*pip, "--disable-pip-version-check", str(REPO)], check=True)
    marker.write_text(digest)
    return BENCH_VENV


def bench_python() -> str:
    """The interpreter of bench_venv() (spark-ops' own, and the minimal asyncssh script's)."""
    return str(bench_venv() / "bin" / "python")


def spark_ops_argv() -> list[str]:
    """The spark-ops console script of bench_venv() (not a pyenv shim in front of it)."""
    script = bench_venv() / "bin" / "spark-ops"
    return [str(script)] if script.exists() else [shutil.which("spark-ops") or "spark-ops"]


BASELINE = "spark-ops (baseline)"  # a variant row: $SPARK_OPS_BASELINE_VENV's spark-ops


def baseline_argv() -> list[str] | None:
    """$SPARK_OPS_BASELINE_VENV/bin/spark-ops (another build to compare with), or None."""
    venv = os.environ.get("SPARK_OPS_BASELINE_VENV")
    script = Path(venv) / "bin" / "spark-ops" if venv else None
    return [str(script)] if script is not None and script.exists() else None


def peer_tool(name: str) -> str | None:
    """Path of a peer's executable: the peers venv first, then PATH; None when not installed."""
    venv = PEERS_VENV / "bin" / name
    if venv.exists():
        return str(venv)
    return shutil.which(name)


def peer_python() -> str | None:
    """The peers venv's python (for parallel-ssh), or None."""
    py = PEERS_VENV / "bin" / "python"
    return str(py) if py.exists() else None


def start_nodes(n: int, workdir: Path) -> SshdCluster:
    """Start n sshd nodes (one sshd process per node) and put a small recipe in every HOME."""
    cluster = start_sshd_nodes(n, workdir)
    for node in cluster:
        path = node.home / RECIPE_NAME
        path.write_text(RECIPE_TEXT)
        os.chown(path, node.uid, node.gid)
    return cluster


@dataclass
class Endpoint:
    """One SSH endpoint as the benchmarks see it."""

    name: str
    host: str
    port: int
    user: str


@dataclass
class Target:
    """What every tool is pointed at: endpoints, the client key and known_hosts, and a workdir."""

    endpoints: list[Endpoint]
    key: Path
    known_hosts: Path
    workdir: Path
    files: dict[str, Path] = field(default_factory=dict)

    @classmethod
    def from_cluster(cls, cluster: SshdCluster, workdir: Path) -> Target:
        """Endpoints of an sshd cluster."""
        eps = [Endpoint(n.name, n.host, n.port, n.user) for n in cluster]
        return cls(eps, cluster.client_key, cluster.known_hosts, workdir)

    def write_all(self, max_connects: int = 16) -> None:
        """Write the inventory of every tool into the workdir."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.files["spark-ops"] = self.write_inventory(max_connects)
        if len(self.endpoints) > max_connects:  # the same run without the default cap
            self.files[NO_CAP] = self.write_inventory(len(self.endpoints), "inventory-nocap.yaml")
        hosts = self.workdir / "pssh-hosts"
        hosts.write_text("".join(f"{e.user}@{e.host}:{e.port}\n" for e in self.endpoints))
        self.files["pssh"] = hosts
        ini = self.workdir / "ansible.ini"
        rows = [
            f"{e.name} ansible_host={e.host} ansible_port={e.port} ansible_user={e.user}"
            for e in self.endpoints
        ]
        ini.write_text("[all]\n" + "\n".join(rows) + "\n")
        self.files["ansible"] = ini
        inv = self.workdir / "pyinfra_inventory.py"
        data = {
            "ssh_key": str(self.key),
            "ssh_known_hosts_file": str(self.known_hosts),
            "ssh_strict_host_key_checking": "yes",
            "ssh_allow_agent": False,
            "ssh_look_for_keys": False,
        }
        lines = [  # unique names: pyinfra merges hosts that share a name
            f"({e.name!r}, {{**DATA, 'ssh_hostname': {e.host!r}, 'ssh_port': {e.port}, "
            f"'ssh_user': {e.user!r}}})"
            for e in self.endpoints
        ]
        inv.write_text(f"DATA = {data!r}\nhosts = [\n    " + ",\n    ".join(lines) + ",\n]\n")
        self.files["pyinfra"] = inv

    def write_inventory(self, max_connects: int, name: str = "inventory.yaml") -> Path:
        """A spark-ops inventory for the endpoints (node1 head), with a connect cap."""
        nodes = "".join(
            f"      {e.name}: {{host: {e.host}, port: {e.port}, user: {e.user}"
            + (", role: head" if i == 0 else "")
            + "}\n"
            for i, e in enumerate(self.endpoints)
        )
        text = (
            "clusters:\n"
            "  bench:\n"
            "    ssh:\n"
            f"      known_hosts: {self.known_hosts}\n"
            f"      identity: {self.key}\n"
            "      agent: false\n"
            "      config: /dev/null\n"
            "      connect_timeout: 20\n"
            f"      max_concurrent_connects: {max_connects}\n"
            "    nodes:\n" + nodes + "    recipe: {path: ~/" + RECIPE_NAME + "}\n"
            "    watchdog: {restart_command: 'true', history_file: ~/restarts}\n"
        )
        path = self.workdir / name
        path.write_text(text)
        return path


def ssh_opts(t: Target) -> list[str]:
    """OpenSSH client options for ssh-spawning peers (fresh connections, no agent, no config)."""
    return [
        "-F", "/dev/null", "-i", str(t.key), "-o", f"UserKnownHostsFile={t.known_hosts}",
        "-o", "StrictHostKeyChecking=yes", "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes",
        "-o", "ControlMaster=no", "-o", "ControlPath=none",
    ]  # fmt: skip


# A minimal asyncssh fan-out, what one would write in ten lines (no cap, no error mapping).
MINIMAL_ASYNCSSH = r"""
import asyncio, sys, asyncssh
key, kh, cmd, *eps = sys.argv[1:]
async def one(ep):
    user, host, port = ep.split(",")
    async with asyncssh.connect(host, port=int(port), username=user, client_keys=[key],
                                known_hosts=kh, agent_path=None, config=None) as c:
        return (await c.run(cmd, check=False)).exit_status
async def main():
    codes = await asyncio.gather(*(one(e) for e in eps), return_exceptions=True)
    sys.exit(0 if all(c == 0 for c in codes) else 1)
asyncio.run(main())
"""

# parallel-ssh (ssh2-python / libssh2 + gevent), its documented ParallelSSHClient usage.
PARALLEL_SSH = r"""
import sys
from pssh.clients import ParallelSSHClient
from pssh.config import HostConfig
key, cmd, *eps = sys.argv[1:]
hosts, cfg = [], []
for ep in eps:
    user, host, port = ep.split(",")
    hosts.append(host)
    cfg.append(HostConfig(port=int(port), user=user, private_key=key))
client = ParallelSSHClient(hosts, host_config=cfg, pool_size=len(hosts), allow_agent=False,
                           identity_auth=False)
out = client.run_command(cmd, stop_on_errors=False)
client.join(out)
sys.exit(0 if all(o.exception is None and o.exit_code == 0 for o in out) else 1)
"""


def _eps(t: Target) -> list[str]:
    """Endpoints as user,host,port strings."""
    return [f"{e.user},{e.host},{e.port}" for e in t.endpoints]


Builder = Callable[[Target, list[str]], list[str] | None]


def build_spark_ops(t: Target, argv: list[str]) -> list[str] | None:
    """spark-ops exec -- ARGV."""
    return [*spark_ops_argv(), "-q", "-i", str(t.files["spark-ops"]), "exec", "--", *argv]


def build_minimal(t: Target, argv: list[str]) -> list[str] | None:
    """The minimal asyncssh script (same interpreter as spark-ops)."""
    return [bench_python(), "-c", MINIMAL_ASYNCSSH, str(t.key), str(t.known_hosts),
            " ".join(argv), *_eps(t)]  # fmt: skip


def build_parallel_ssh(t: Target, argv: list[str]) -> list[str] | None:
    """parallel-ssh's ParallelSSHClient in the peers venv."""
    py = peer_python()
    try:
        ok = (
            py is not None
            and subprocess.run(
                [py, "-c", "import pssh.clients"], capture_output=True, check=False
            ).returncode
            == 0
        )
    except OSError:
        ok = False
    if not ok or py is None:
        return None
    return [py, "-c", PARALLEL_SSH, str(t.key), " ".join(argv), *_eps(t)]


def build_pssh(t: Target, argv: list[str]) -> list[str] | None:
    """pssh (Debian's parallel-ssh 2.3.4, ssh processes), parallelism = node count."""
    tool = shutil.which("parallel-ssh")
    if tool is None:
        return None
    opts = ssh_opts(t)
    xs = [a for o in opts for a in ("-x", o)]
    n = str(len(t.endpoints))
    return [tool, "-h", str(t.files["pssh"]), "-p", n, "-t", "60", *xs, " ".join(argv)]


def build_pyinfra(t: Target, argv: list[str]) -> list[str] | None:
    """pyinfra INVENTORY exec -- ARGV, parallel = node count."""
    tool = peer_tool("pyinfra")
    if tool is None:
        return None
    n = str(len(t.endpoints))
    return [tool, "-y", "--parallel", n, str(t.files["pyinfra"]), "exec", "--", *argv]


def build_ansible(t: Target, argv: list[str]) -> list[str] | None:
    """ansible all -m raw, forks = node count, no ControlPersist (cold connections like others)."""
    tool = peer_tool("ansible")
    if tool is None:
        return None
    n = str(len(t.endpoints))
    return [tool, "all", "-i", str(t.files["ansible"]), "-f", n, "-m", "raw", "-a",
            " ".join(argv), "--private-key", str(t.key)]  # fmt: skip


def ansible_env(t: Target) -> dict[str, str]:
    """Environment for Ansible: our known_hosts, no ControlPersist, no retry files, no cowsay."""
    env = dict(os.environ)
    env.update(
        ANSIBLE_SSH_ARGS=f"-o ControlMaster=no -o UserKnownHostsFile={t.known_hosts} "
        "-o IdentitiesOnly=yes",
        ANSIBLE_HOST_KEY_CHECKING="True",
        ANSIBLE_NOCOWS="1",
        ANSIBLE_LOCAL_TEMP=str(t.workdir / "ansible-tmp"),
        ANSIBLE_PYTHON_INTERPRETER="/usr/bin/python3",
        ANSIBLE_DEPRECATION_WARNINGS="False",
    )
    return env


PEERS: dict[str, Builder] = {
    "spark-ops": build_spark_ops,
    "asyncssh (minimal script)": build_minimal,
    "parallel-ssh": build_parallel_ssh,
    "pssh": build_pssh,
    "pyinfra": build_pyinfra,
    "ansible (raw)": build_ansible,
}


@dataclass
class Samples:
    """Wall-clock seconds of the runs of one tool on one case, and how many failed."""

    times: list[float] = field(default_factory=list)
    failures: int = 0
    last_error: str = ""
    skipped: str | None = None

    @property
    def median(self) -> float | None:
        """The median run time (None when skipped or empty)."""
        return statistics.median(self.times) if self.times else None


def time_process(
    argv: list[str], env: dict[str, str] | None = None, timeout: float = 300
) -> tuple[float, int, str]:
    """Run one process to completion; return (wall seconds, exit code, tail of its output)."""
    start = time.perf_counter()
    proc = subprocess.run(
        argv, capture_output=True, text=True, env=env, timeout=timeout, check=False
    )
    took = time.perf_counter() - start
    tail = (proc.stderr.strip() or proc.stdout.strip())[-300:]
    return took, proc.returncode, tail


def interleaved(
    cases: dict[str, Callable[[int], tuple[list[str], dict[str, str] | None] | None]],
    repeats: int,
    *,
    warmup: int = 1,
    seed: int = 1,
    verify: Callable[[str, int], str | None] | None = None,
) -> dict[str, Samples]:
    """Run every case `repeats` times, interleaved in a shuffled order each round.

    `verify(name, round)`, when given, checks a run's effect; a message back counts as a failure.
    """
    samples = {name: Samples() for name in cases}
    order = list(cases)
    rng = random.Random(seed)
    for rnd in range(warmup + repeats):
        rng.shuffle(order)
        for name in order:
            built = cases[name](rnd)
            if built is None:
                samples[name].skipped = "not installed"
                continue
            argv, env = built
            took, rc, tail = time_process(argv, env)
            problem = verify(name, rnd) if verify is not None and rc == 0 else None
            if rnd < warmup:
                continue
            if rc != 0 or problem:
                samples[name].failures += 1
                samples[name].last_error = problem or tail
            samples[name].times.append(took)
    return samples


def table(title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A Markdown table."""
    out = [f"### {title}", "", "| " + " | ".join(columns) + " |"]
    out.append("|" + "|".join("---" for _ in columns) + "|")
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(out) + "\n"


def fmt_s(x: float | None) -> str:
    """Seconds with two decimals, or a dash."""
    return "–" if x is None else f"{x:.2f} s"
