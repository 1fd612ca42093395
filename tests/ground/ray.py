"""A real two-node Ray cluster (Ray 2.60 from the vLLM ground venv) in two network namespaces.

The head and the worker each get a network namespace made here (`sray-<owner pid>-<tag>-h` / `-w`),
joined by one veth pair whose two ends are both named `sray0`: head 198.18.0.1/30, worker
198.18.0.2/30 (the benchmarking range; neither namespace has any other route, so Ray's guess of its
address by a UDP connect to a public resolver fails without sending anything). Inside each:

    ray start --head --node-ip-address 198.18.0.1 --port 6379 --num-cpus 1 --temp-dir <own dir>
        --disable-usage-stats --object-store-memory 500000000 --resources '{"vcpu": 1}'
        --include-dashboard=true --dashboard-host 127.0.0.1 --dashboard-port 8265
    ray start --address 198.18.0.1:6379 --node-ip-address 198.18.0.2 … (the same resources)

Ports are fixed: each namespace has its own port space. The dashboard's HTTP server is on (bound
to 127.0.0.1 of the head namespace only) because `ray list nodes` asks it; with
`--include-dashboard=false` Ray 2.60 answers "Failed to connect to API server".

Every command runs with PYTHONPATH=tests/ground/ray_shim (the sitecustomize that lets vLLM's CPU
build use Ray), GLOO_SOCKET_IFNAME=sray0 and RAY_ADDRESS=198.18.0.1:6379. Nodes are stopped by pid,
never with `ray stop` (which stops every Ray process of the machine): `ip netns pids` lists exactly
the processes of a namespace. `close()` kills them, deletes the namespaces (the veth goes with
them), removes the `/dev/shm/psm_*` segments that processes of these namespaces mapped (vLLM's
shared-memory queues, ~260 MB each boot killed), and the temp dirs. `sweep_stale_namespaces()`
removes what a killed test run left.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from . import GroundError, GroundUnavailable
from .sshd import pid_alive
from .vllm import VENV, remove_orphan_cpushm, shm_in_use

SHIM_DIR = Path(__file__).resolve().parent / "ray_shim"
IFNAME = "sray0"
HEAD_IP = "198.18.0.1"
WORKER_IP = "198.18.0.2"
PREFIX_LEN = 30
GCS_PORT = 6379
DASHBOARD_PORT = 8265
RAY_VERSION = "2.60.0"
NS_PREFIX = "sray"
_NS_RE = re.compile(rf"^{NS_PREFIX}-(?P<owner>\d+)-(?P<tag>[0-9a-f]+)-(?P<role>[hw])$")
START_TIMEOUT = 120.0


def ray_bin() -> Path:
    """The `ray` CLI of the ground venv (.ci/install-ray.sh)."""
    return VENV / "bin" / "ray"


def _run(argv: Sequence[str], *, timeout: float = 30.0, check: bool = True) -> str:
    """Run a command as root; return stdout (GroundError naming the command on failure)."""
    try:
        res = subprocess.run(
            list(argv), capture_output=True, text=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired as exc:
        raise GroundError(f"`{' '.join(argv)}` did not finish within {timeout:.0f} s") from exc
    if check and res.returncode != 0:
        raise GroundError(f"`{' '.join(argv)}` exited {res.returncode}: {res.stderr.strip()}")
    return res.stdout


def ray_unavailable_reason() -> str | None:
    """Why the real-Ray tier cannot run here (not root, no `ip netns`, Ray missing), or None."""
    fix = "run: bash .ci/install-ground.sh (it calls .ci/install-ray.sh)"
    if os.geteuid() != 0:
        return "the real-Ray ground needs root (network namespaces)"
    if shutil.which("ip") is None:
        return f"no `ip` command (iproute2) for network namespaces ({fix})"
    if not os.access(ray_bin(), os.X_OK):
        return f"no Ray in the vLLM ground venv: {ray_bin()} missing ({fix})"
    return netns_unavailable_reason()


def netns_unavailable_reason() -> str | None:
    """Why this ground's two namespaces cannot be made here (not root, no `ip netns`), or None
    (the real-ranks tier needs them, not Ray)."""
    if os.geteuid() != 0:
        return "the ground's network namespaces need root"
    if shutil.which("ip") is None:
        return "no `ip` command (iproute2) for network namespaces (apt-get install iproute2)"
    probe = f"{NS_PREFIX}-{os.getpid()}-probe-h"
    try:
        _run(["ip", "netns", "add", probe], timeout=10)
    except GroundError as exc:
        return f"cannot create a network namespace here: {exc}"
    finally:
        subprocess.run(["ip", "netns", "del", probe], capture_output=True, check=False)
    return None


def netns_pids(ns: str) -> list[int]:
    """The pids of every process in a network namespace (empty when it is gone)."""
    out = _run(["ip", "netns", "pids", ns], check=False, timeout=10)
    return [int(p) for p in out.split() if p.isdigit()]


def _comm(pid: int) -> str:
    """A process's command name, "" when it is gone."""
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _kill_all(ns: str, *, grace: float = 2.0) -> None:
    """SIGTERM every process of the namespace, SIGKILL what is left after `grace` seconds."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        pids = netns_pids(ns)
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and any(pid_alive(p) for p in pids):
            time.sleep(0.1)


def _delete_ns(ns: str) -> None:
    """Kill a namespace's processes and delete it (its veth end goes with it)."""
    _kill_all(ns, grace=0.5)
    subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False)


def sweep_stale_namespaces() -> list[str]:
    """Delete the ground's namespaces whose owner test process is gone; return their names."""
    gone = []
    for path in (
        sorted(Path("/run/netns").glob(f"{NS_PREFIX}-*")) if Path("/run/netns").is_dir() else []
    ):
        m = _NS_RE.match(path.name)
        if m and not pid_alive(int(m.group("owner"))):
            _delete_ns(path.name)
            shutil.rmtree(Path("/tmp") / path.name[:-2], ignore_errors=True)
            gone.append(path.name)
    return gone


def _mapped_psm(pids: Sequence[int]) -> set[str]:
    """The /dev/shm/psm_* segments the given processes map or hold open."""
    return {name for name in shm_in_use(pids) if name.startswith("psm_")}


class RayCluster:
    """Two Ray nodes (head, worker) in two namespaces; see the module docstring."""

    def __init__(self, workdir: Path, *, owner_env: dict[str, str] | None = None) -> None:
        """Create the namespaces and the veth; no Ray yet (start())."""
        sweep_stale_namespaces()
        remove_orphan_cpushm()
        self.tag = secrets.token_hex(3)
        base = f"{NS_PREFIX}-{os.getpid()}-{self.tag}"
        self.head_ns, self.worker_ns = f"{base}-h", f"{base}-w"
        self.workdir = workdir
        self.workdir.mkdir(parents=True, exist_ok=True)
        # Ray's socket paths must stay under 107 bytes: its temp dirs get a short root of their own
        self.temp_root = Path("/tmp") / base
        self.extra_env = dict(owner_env or {})
        self.psm: set[str] = set()
        self._sampling = threading.Event()
        self._sampler: threading.Thread | None = None
        self.closed = False
        self.start_seconds: dict[str, float] = {}
        try:
            self._make_network()
        except BaseException:
            self.close()
            raise

    # ---- network -------------------------------------------------------------------------------

    def _make_network(self) -> None:
        """Two namespaces, one veth pair named sray0 on both sides, loopback up."""
        a, b = f"sr{self.tag}a", f"sr{self.tag}b"
        for ns in (self.head_ns, self.worker_ns):
            _run(["ip", "netns", "add", ns])
        _run(["ip", "link", "add", a, "type", "veth", "peer", "name", b])
        _run(["ip", "link", "set", a, "netns", self.head_ns])
        _run(["ip", "link", "set", b, "netns", self.worker_ns])
        for ns, end, ip in ((self.head_ns, a, HEAD_IP), (self.worker_ns, b, WORKER_IP)):
            _run(["ip", "-n", ns, "link", "set", end, "name", IFNAME])
            _run(["ip", "-n", ns, "addr", "add", f"{ip}/{PREFIX_LEN}", "dev", IFNAME])
            _run(["ip", "-n", ns, "link", "set", "lo", "up"])
            _run(["ip", "-n", ns, "link", "set", IFNAME, "up"])

    @property
    def address(self) -> str:
        """The GCS address, 198.18.0.1:6379."""
        return f"{HEAD_IP}:{GCS_PORT}"

    def env(self) -> dict[str, str]:
        """The environment of `ray start`, `ray status` and `vllm serve` on this ground."""
        env = {k: v for k, v in os.environ.items() if k != "VLLM_CPU_KVCACHE_SPACE"}
        env.update(self.extra_env)
        env.update(self.ray_env())
        return env

    def ray_env(self) -> dict[str, str]:
        """Only the variables this ground adds (also written into recipes)."""
        return {
            "PYTHONPATH": str(SHIM_DIR),
            "GLOO_SOCKET_IFNAME": IFNAME,
            "RAY_ADDRESS": self.address,
            "RAY_USAGE_STATS_ENABLED": "0",
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
        }

    def in_ns(self, ns: str, argv: Sequence[str]) -> list[str]:
        """argv run inside a namespace (`ip netns exec NS …`)."""
        return ["ip", "netns", "exec", ns, *argv]

    # ---- nodes ---------------------------------------------------------------------------------

    def _ray_start(self, ns: str, args: Sequence[str], temp: Path) -> None:
        """`ray start …` inside ns (it daemonizes: the nodes outlive the command)."""
        temp.mkdir(parents=True, exist_ok=True)
        common = [
            "--num-cpus", "1", "--temp-dir", str(temp), "--disable-usage-stats",
            "--object-store-memory", "500000000", "--resources", '{"vcpu": 1}',
        ]  # fmt: skip
        argv = self.in_ns(ns, [str(ray_bin()), "start", *args, *common])
        log = self.workdir / f"ray-start-{ns[-1]}-{int(time.time() * 1000)}.log"
        with log.open("wb") as out:
            res = subprocess.run(
                argv, stdout=out, stderr=subprocess.STDOUT, env=self.env(),
                stdin=subprocess.DEVNULL, timeout=START_TIMEOUT, check=False,
            )  # fmt: skip
        if res.returncode != 0:
            tail = log.read_text(errors="replace")[-2000:]
            raise GroundError(f"ray start in {ns} exited {res.returncode}; {log}:\n{tail}")

    def start_head(self) -> float:
        """Start the head node; return the seconds it took."""
        t0 = time.monotonic()
        self._ray_start(
            self.head_ns,
            ["--head", "--node-ip-address", HEAD_IP, "--port", str(GCS_PORT),
             "--include-dashboard=true", "--dashboard-host", "127.0.0.1",
             "--dashboard-port", str(DASHBOARD_PORT)],
            self.temp_root / "h",
        )  # fmt: skip
        self._start_sampler()
        self.start_seconds["head"] = time.monotonic() - t0
        return self.start_seconds["head"]

    def start_worker(self, *, wait: bool = True) -> float:
        """Start (or restart) the worker node; with wait, until `ray status` shows 2 nodes."""
        t0 = time.monotonic()
        _kill_all(self.worker_ns, grace=0.5)  # what a killed raylet left (log monitor, agents)
        temp = self.temp_root / f"w{int(time.time() * 1000) % 10**6}"
        self._ray_start(
            self.worker_ns, ["--address", self.address, "--node-ip-address", WORKER_IP], temp
        )
        if wait:
            self.wait_active(2)
        self.start_seconds["worker"] = time.monotonic() - t0
        return self.start_seconds["worker"]

    def start(self) -> RayCluster:
        """Head, then worker; returns self once `ray status` lists both."""
        self.start_head()
        self.start_worker()
        return self

    def raylet_pid(self, ns: str) -> int | None:
        """The pid of the raylet process of a namespace, or None."""
        return next((p for p in netns_pids(ns) if _comm(p) == "raylet"), None)

    def actors(self, ns: str) -> list[int]:
        """The pids of vLLM's Ray worker actors (`ray::RayWorkerProc`) in a namespace."""
        return [p for p in netns_pids(ns) if _comm(p).startswith("ray::RayWorker")]

    def kill_worker_raylet(self) -> int:
        """SIGKILL the worker node's raylet only (a node lost, as `kill -9`); return its pid."""
        pid = self.raylet_pid(self.worker_ns)
        if pid is None:
            raise GroundError(f"no raylet runs in {self.worker_ns}")
        os.kill(pid, signal.SIGKILL)
        return pid

    def stop_worker(self) -> None:
        """Take the whole worker node down: every process of its namespace."""
        self._record_psm()
        _kill_all(self.worker_ns, grace=1.0)

    # ---- reading the real head -----------------------------------------------------------------

    def ray(
        self, *args: str, ns: str | None = None, timeout: float = 60.0
    ) -> subprocess.CompletedProcess[str]:
        """Run `ray ARGS` inside a namespace (the head's by default); stdout+stderr merged."""
        argv = self.in_ns(ns or self.head_ns, [str(ray_bin()), *args])
        return subprocess.run(
            argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env=self.env(), timeout=timeout, check=False,
        )  # fmt: skip

    def status_text(self) -> str:
        """`ray status --address 198.18.0.1:6379` as the head prints it."""
        return self.ray("status", "--address", self.address).stdout

    def list_nodes_json(self) -> str:
        """`ray list nodes --format json` from the head (asks its dashboard on 127.0.0.1:8265)."""
        return self.ray("list", "nodes", "--format", "json").stdout

    def active_nodes(self) -> int:
        """How many nodes `ray status` lists as Active now (0 when it cannot tell)."""
        from spark_ops.verify import ParseError, parse_ray_status

        try:
            return len(parse_ray_status(self.status_text()).active)
        except ParseError:
            return 0

    def wait_active(self, n: int, timeout: float = START_TIMEOUT) -> None:
        """Wait until `ray status` lists exactly n Active nodes (GroundError at the deadline)."""
        deadline = time.monotonic() + timeout
        seen = -1
        while time.monotonic() < deadline:
            seen = self.active_nodes()
            if seen == n:
                return
            time.sleep(1.0)
        raise GroundError(f"ray status lists {seen} active node(s), not {n}, after {timeout:.0f} s")

    # ---- shm bookkeeping and teardown ----------------------------------------------------------

    def _record_psm(self) -> None:
        """Remember the psm_* segments mapped by processes of our namespaces now."""
        pids = netns_pids(self.head_ns) + netns_pids(self.worker_ns)
        self.psm |= _mapped_psm(pids)

    def track_shm(self) -> None:
        """Record our namespaces' psm_* segments from now on (a ground that runs no Ray head)."""
        self._start_sampler()

    def _start_sampler(self) -> None:
        """Sample our namespaces' psm_* segments once a second (an engine may die by itself)."""
        if self._sampler is not None:
            return

        def loop() -> None:
            """Record until close()."""
            while not self._sampling.wait(1.0):
                with contextlib.suppress(GroundError, OSError):
                    self._record_psm()

        self._sampler = threading.Thread(target=loop, name=f"psm-{self.tag}", daemon=True)
        self._sampler.start()

    def remove_leaked_psm(self) -> list[str]:
        """Delete the recorded psm_* segments no live process maps any more; return their names."""
        self._record_psm()
        still = _mapped_psm([int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()])
        removed = []
        for name in sorted(self.psm - still):
            with contextlib.suppress(FileNotFoundError):
                (Path("/dev/shm") / name).unlink()
                removed.append(name)
            self.psm.discard(name)
        return removed

    def close(self) -> None:
        """Kill every process of both namespaces, delete them, remove our psm_* files and dirs."""
        if self.closed:
            return
        self.closed = True
        with contextlib.suppress(GroundError):
            self._record_psm()
        self._sampling.set()
        for ns in (self.worker_ns, self.head_ns):
            _delete_ns(ns)
        self.remove_leaked_psm()
        remove_orphan_cpushm()
        shutil.rmtree(self.temp_root, ignore_errors=True)

    def __enter__(self) -> RayCluster:
        """Context manager: close() on exit."""
        return self

    def __exit__(self, *exc: object) -> None:
        """Close."""
        self.close()


@contextlib.contextmanager
def ray_cluster(workdir: Path, **kw: object) -> Iterator[RayCluster]:
    """A started two-node cluster, closed afterwards (GroundUnavailable where it cannot run)."""
    reason = ray_unavailable_reason()
    if reason:
        raise GroundUnavailable(reason)
    cluster = RayCluster(workdir, **kw)  # type: ignore[arg-type]
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.close()
