"""The embedded cluster: N simulated SSH nodes on loopback, the reference watchdog and a simulated
engine.

`prepare()` lays out a directory (keys, one file tree per node, the recipe, the watchdog's config
and a history with one earlier automatic restart); `serve()` runs the nodes until SIGTERM and writes
the inventory that spark-ops uses to reach them; `up()` / `down()` run serve() as a background
process.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from spark_ops.errors import ExitStatus, SparkOpsError
from spark_ops.log import configure
from spark_ops.sim import RANK_CHECK, RAYLET_CHECK, nvidia_smi
from spark_ops.sim.node import NodeSpec, SimNode
from spark_ops.sim.ranks import RANKS_ENV, stop_rank
from spark_ops.watchdog import history
from spark_ops.yamlsafe import load_yaml

STATE = "state.json"
EXECUTORS = ("mp", "ray")
CONTROL = "control.sock"
# The reference watchdog (refwatchdog/, a program of its own): the head runs it as a process, by
# module name; nothing of spark_ops imports it (tests/fixtures/house/rules.yaml)
WATCHDOG_MODULE = "refwatchdog.daemon"
ACTIONS_MODULE = "refwatchdog.actions"


# control requests on one node; each names a SimNode method (dashes as underscores)
RESTART_WATCHDOG_S = 300.0  # the configured action's start (a sparkrun launch) within this
_NODE_ACTIONS = ("stop", "start", "stop-raylet", "start-raylet")


class SimError(SparkOpsError):
    """The embedded cluster could not be started, reached or stopped (its exit status given)."""

    def __init__(
        self, message: str, *, hint: str | None = None, status: ExitStatus = ExitStatus.REMOTE
    ) -> None:
        """Keep the message, the hint and the exit status this case maps to."""
        super().__init__(message, hint=hint)
        self.exit_status = status


SIM_PROBE_TIMEOUT_S = 10  # the embedded watchdog's probe (its config and the inventory alike)
SIM_PROBE_FAILURES = 3


@dataclass
class SimOptions:
    """How to lay out the embedded cluster."""

    nodes: int = 4
    time_scale: float = 1.0
    boot_scale: float = 1.0
    fault: str | None = None
    max_num_seqs: int = 6
    watchdog_interval_s: float = 5.0
    watchdog_grace_s: float = 20.0
    watchdog_probe_timeout_s: float = SIM_PROBE_TIMEOUT_S
    seed_history: bool = True  # one automatic restart two hours ago, as a real cluster would have
    # node name -> network namespace (made by the caller, e.g. tests/ground/ray.py): the head's is
    # the one the whole cluster process runs in (SSH ports, tunnels, watchdog, engine), a worker's
    # is where that node's commands run (`ip netns exec NS bash -c …`). Empty: no namespaces.
    netns: dict[str, str] = field(default_factory=dict)
    # the head's `vllm` runs the engine as its child instead of exec'ing it: the pid file then
    # names a wrapper shell, as a site's `sh -c 'vllm serve …'` start script does
    engine_wrapper: bool = False
    # mp: one engine rank per node without Ray, as eugr/spark-vllm-docker launches it (rank 0 on
    # the head serves the API, the workers' ranks run headless, each logs on its node:
    # sim/ranks.py), the default as it is the launcher's; ray: the engine on the head joins the
    # workers' Ray workers (the test ground's fixtures ask for it by name)
    executor: str = "mp"


def asset(name: str) -> str:
    """Text of a file shipped in spark_ops/data/sim/."""
    return resources.files("spark_ops.data").joinpath("sim", name).read_text(encoding="utf-8")


def asset_path(name: str) -> Path:
    """Path of a file shipped in spark_ops/data/sim/ (the package is installed unzipped)."""
    return Path(str(resources.files("spark_ops.data").joinpath("sim", name)))


def _free_port() -> int:
    """A currently free loopback TCP port for a server started later, picked below the kernel's
    ephemeral range: a port 0 bind (every other listener, a client's socket) never takes it
    meanwhile, as it could take a free ephemeral port picked now and bound later."""
    import random
    import socket

    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 0
    for _ in range(64 if low > 12000 else 0):
        port = random.randrange(10000, low)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def node_names(n: int) -> list[str]:
    """node1 … nodeN; node1 is the head."""
    return [f"node{i}" for i in range(1, n + 1)]


def prepare(root: Path, opts: SimOptions) -> dict[str, Any]:
    """Lay out keys, node trees, recipe, watchdog config and history; returns the layout facts."""
    import asyncssh

    root = root.resolve()
    keys = root / "keys"
    keys.mkdir(parents=True, exist_ok=True)
    client = asyncssh.generate_private_key("ssh-ed25519", comment="spark-ops-sim")
    client.write_private_key(str(keys / "client_ed25519"))
    client.write_public_key(str(keys / "client_ed25519.pub"))
    os.chmod(keys / "client_ed25519", 0o600)
    if opts.executor not in EXECUTORS:
        raise SimError(
            f"executor {opts.executor!r} unknown; allowed: {', '.join(EXECUTORS)}",
            status=ExitStatus.USAGE,
        )
    names = node_names(opts.nodes)
    engine_port = _free_port()
    head = root / "nodes" / names[0]
    for name in names:
        home = root / "nodes" / name
        (home / "bin").mkdir(parents=True, exist_ok=True)
        key = asyncssh.generate_private_key("ssh-ed25519", comment=f"sim-{name}")
        key.write_private_key(str(keys / f"host_{name}"))
        key.write_public_key(str(keys / f"host_{name}.pub"))
        nvidia_smi.install(home / "bin")  # a GB10's tool: `spark-ops exec -- nvidia-smi -L`
    write_vllm_shim(head, wrapper=opts.engine_wrapper)
    wd = head / "bin" / "spark-watchdog"
    # PYTHONSAFEPATH: `-m` puts the working directory (the node's home) first on the import path
    wd.write_text(f'#!/bin/sh\nPYTHONSAFEPATH=1 exec {sys.executable} -m {WATCHDOG_MODULE} "$@"\n')
    wd.chmod(0o755)
    engine_cfg = root / "engine.yaml"
    engine_cfg.write_text(_engine_overlay(opts))
    recipe = head / "recipes" / "glm-5.3-flash-sim.yaml"
    recipe.parent.mkdir(parents=True, exist_ok=True)
    recipe.write_text(
        asset("glm-5.3-flash-sim.yaml")
        .replace("port: 8000", f"port: {engine_port}")
        .replace("max_num_seqs: 6 ", f"max_num_seqs: {opts.max_num_seqs} ")
        .replace("-executor-backend mp", f"-executor-backend {opts.executor}")
    )
    state = head / ".local" / "state" / "spark-watchdog"
    state.mkdir(parents=True, exist_ok=True)
    cfg = head / ".config" / "spark-watchdog.yaml"
    cfg.parent.mkdir(parents=True, exist_ok=True)
    cfg.write_text(
        asset("watchdog.yaml")
        .replace("@HOME@", str(head))
        .replace("@PORT@", str(engine_port))
        .replace("@INTERVAL@", str(opts.watchdog_interval_s))
        .replace("@TIMEOUT@", f"{opts.watchdog_probe_timeout_s:g}")
        .replace("@FAILURES@", str(SIM_PROBE_FAILURES))
        .replace("@GRACE@", str(opts.watchdog_grace_s))
    )
    hist = str(state / "restarts")
    if opts.seed_history and not Path(hist).exists():
        history.append(
            hist, stamp=int(time.time()) - 7200, reason="probe failed 3 times", by="watchdog"
        )
    layout = {
        "root": str(root), "names": names, "engine_port": engine_port, "netns": opts.netns,
        "probe_interval_s": opts.watchdog_interval_s,
        "probe_timeout_s": opts.watchdog_probe_timeout_s,
        "executor": opts.executor, "master_port": _free_port(),
    }  # fmt: skip
    (root / "layout.json").write_text(json.dumps(layout, indent=2))
    return layout


def write_vllm_shim(head: Path, *, wrapper: bool = False) -> Path:
    """The head's `vllm` (read at every engine start): execs the sim engine, or with wrapper
    runs it as a child of the shell, which stays the process the pid file names."""
    shim = head / "bin" / "vllm"
    run = "" if wrapper else "exec "
    shim.write_text(  # PYTHONSAFEPATH: nothing imported from the node's home (`-m` would)
        f'#!/bin/sh\nPYTHONSAFEPATH=1 {run}{sys.executable} -m spark_ops.sim.engine "$@"\n'
    )
    shim.chmod(0o755)
    return shim


def _engine_overlay(opts: SimOptions) -> str:
    """The sim engine config: the shipped parameters with this cluster's speed and fault."""
    lines = [
        f"base: {asset_path('engine.yaml')}",
        f"time_scale: {opts.time_scale}",
        f"fault: {opts.fault or 'null'}",
        "# a backend the simulated hardware refuses at boot (as vLLM's CPU build refuses triton)",
        "refused_moe_backends: [triton]",
    ]
    if opts.boot_scale != 1.0:
        lines.append("boot:")
        base = _shipped_boot()
        for k, v in base.items():
            lines.append(f"  {k}: {float(v) * opts.boot_scale}")
    return "\n".join(lines) + "\n"


def _shipped_boot() -> dict[str, Any]:
    """The boot phase durations of the shipped engine config."""
    data = load_yaml(
        asset("engine.yaml"), source="spark_ops/data/sim/engine.yaml", error=SparkOpsError
    )
    return dict(data.get("boot", {}))


def inventory_text(
    root: Path, ports: dict[str, int], engine_port: int, executor: str = "mp"
) -> str:
    """The inventory spark-ops uses to reach this embedded cluster."""
    names = list(ports)
    try:
        layout = json.loads((root / "layout.json").read_text())
        interval, timeout = float(layout["probe_interval_s"]), float(layout["probe_timeout_s"])
    except (OSError, ValueError, KeyError, TypeError):
        interval, timeout = SimOptions.watchdog_interval_s, float(SIM_PROBE_TIMEOUT_S)
    nodes = "\n".join(
        f"      {n}: {{host: 127.0.0.1, port: {p}, role: {'head' if i == 0 else 'worker'}}}"
        for i, (n, p) in enumerate(ports.items())
    )
    return asset("inventory.yaml").format(
        root=root,
        nodes=nodes,
        tp=len(names),
        engine_port=engine_port,
        worker_check=json.dumps(RAYLET_CHECK if executor == "ray" else RANK_CHECK),
        executor=executor,
        probe_interval_s=f"{interval:g}",
        probe_timeout_s=f"{timeout:g}",
        probe_failures=SIM_PROBE_FAILURES,
    )


class SimCluster:
    """The running nodes of one embedded cluster (inside serve())."""

    def __init__(self, root: Path) -> None:
        """Read the layout written by prepare()."""
        self.root = root.resolve()
        layout = json.loads((self.root / "layout.json").read_text())
        self.engine_port = int(layout["engine_port"])
        self.names: list[str] = layout["names"]
        self.executor = str(layout.get("executor", "mp"))
        self.master = (
            str(layout.get("master_addr", "127.0.0.1")),
            int(layout.get("master_port", 0)),
        )
        self.nodes: dict[str, SimNode] = {}
        for i, name in enumerate(self.names):
            spec = NodeSpec(
                name=name,
                role="head" if i == 0 else "worker",
                home=self.root / "nodes" / name,
                host_key=self.root / "keys" / f"host_{name}",
                authorized_keys=self.root / "keys" / "client_ed25519.pub",
                env={"SPARK_SIM_CONFIG": str(self.root / "engine.yaml")},
                netns=layout.get("netns", {}).get(name) if i > 0 else None,
            )
            self.nodes[name] = SimNode(spec)
        self.watchdog: subprocess.Popen[bytes] | None = None

    async def start(self) -> None:
        """Start workers, then the head (which learns the workers' raylet addresses)."""
        for name in self.names[1:]:
            await self.nodes[name].start()
        head = self.nodes[self.names[0]]
        head.spec.env["SPARK_SIM_RAY_WORKERS"] = ",".join(
            f"{n}=127.0.0.1:{self.nodes[n].spec.raylet_port}" for n in self.names[1:]
        )
        if self.executor == "mp":
            self._write_ranks(head)
        await head.start()
        ports = {n: self.nodes[n].spec.port for n in self.names}
        (self.root / "inventory.yaml").write_text(
            inventory_text(self.root, ports, self.engine_port, self.executor)
        )
        known = ""
        for n in self.names:
            pub = (self.root / "keys" / f"host_{n}.pub").read_text().strip()
            known += f"[127.0.0.1]:{ports[n]} {pub}\n"
        (self.root / "keys" / "known_hosts").write_text(known)

    def _write_ranks(self, head: SimNode) -> None:
        """Where the head's launcher starts the worker ranks (sim/ranks.py): each worker's tree,
        environment and network namespace, and the master address."""
        workers = [
            {"node": n, "home": str(self.nodes[n].spec.home), "env": self.nodes[n].env(),
             "netns": self.nodes[n].spec.netns}
            for n in self.names[1:]
        ]  # fmt: skip
        doc = {"master_addr": self.master[0], "master_port": self.master[1], "workers": workers}
        path = self.root / "ranks.json"
        path.write_text(json.dumps(doc, indent=2))
        head.spec.env[RANKS_ENV] = str(path)

    def head_env(self) -> dict[str, str]:
        """The environment of commands on the head."""
        return self.nodes[self.names[0]].env()

    def start_watchdog(self, start_timeout: float = 60.0) -> None:
        """Start the engine with the watchdog's configured action, then the watchdog (head)."""
        head = self.root / "nodes" / self.names[0]
        cfg = str(head / ".config" / "spark-watchdog.yaml")
        env = self.head_env()
        start = (
            "import sys; from spark_ops.watchdog.config import load_config; "
            f"from {ACTIONS_MODULE} import restart_engine; "
            "c = load_config(sys.argv[1]); restart_engine(c.action, c.paths)"
        )
        subprocess.run(
            [sys.executable, "-c", start, cfg],
            cwd=head, env=env, check=True, stdout=subprocess.DEVNULL, timeout=start_timeout,
        )  # fmt: skip
        log = open(head / "watchdog.log", "ab")  # noqa: SIM115
        self.watchdog = subprocess.Popen(
            [sys.executable, "-m", WATCHDOG_MODULE, "--config", cfg],
            cwd=head, env=env, stdout=log, stderr=log, stdin=subprocess.DEVNULL,
            start_new_session=True,
        )  # fmt: skip

    async def control(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Answer one control request: `stop|start|stop-raylet|start-raylet NODE`, `ports` or
        `restart-watchdog`."""
        try:
            words = (await reader.readline()).decode().split()
            answer: dict[str, Any] = {"ok": True}
            if len(words) == 2 and words[0] in _NODE_ACTIONS and words[1] in self.nodes:
                node = self.nodes[words[1]]
                await getattr(node, words[0].replace("-", "_"))()
            elif words == ["restart-watchdog"]:  # its config changed: action, paths …
                try:
                    await asyncio.get_running_loop().run_in_executor(None, self.restart_watchdog)
                except (subprocess.SubprocessError, OSError) as exc:
                    answer = {"ok": False, "error": f"the watchdog's action did not start: {exc}"}
            elif words == ["ports"]:
                answer["ports"] = {n: s.spec.port for n, s in self.nodes.items()}
            else:
                answer = {"ok": False, "error": f"unknown request {' '.join(words)!r}"}
            writer.write((json.dumps(answer) + "\n").encode())
            await writer.drain()
        finally:
            writer.close()

    def restart_watchdog(self) -> None:
        """Stop the watchdog and its engine, then start both again from the config as it is now
        (in a thread: the action may reach the nodes over SSH, served by this event loop)."""
        self.stop_processes()
        self.start_watchdog(start_timeout=RESTART_WATCHDOG_S)

    def stop_processes(self) -> None:
        """Stop the watchdog and the engine it started (whole process groups)."""
        head = self.root / "nodes" / self.names[0]
        if self.watchdog is not None:
            _killpg(self.watchdog.pid)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.watchdog.wait(timeout=5)  # reap our child
        for pidfile in head.glob(".local/state/spark-watchdog/engine.pid"):
            with contextlib.suppress(ValueError, OSError):
                _killpg(int(pidfile.read_text().split()[0]))
        for name in self.names[1:]:  # the worker ranks of an engine run as ranks
            stop_rank(self.root / "nodes" / name, lingering=True)

    async def stop(self) -> None:
        """Stop processes, then nodes."""
        self.stop_processes()
        for node in self.nodes.values():
            await node.stop()


def _killpg(pid: int) -> None:
    """SIGTERM a process group, then SIGKILL it if it lingers (zombies count as gone)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pid, sig)
        except (ProcessLookupError, PermissionError):
            return
        for _ in range(30):
            time.sleep(0.1)
            if not _group_alive(pid):
                return


def _group_alive(pgid: int) -> bool:
    """True while a process of the group runs (not yet exited, zombies excluded)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 3 and fields[0] != "Z" and int(fields[2]) == pgid:
            return True
    return False


async def serve(root: Path) -> None:
    """Run the embedded cluster until SIGTERM/SIGINT; state.json tells others it is up."""
    sim = SimCluster(root)
    await sim.start()
    sim.start_watchdog()
    sock = str(sim.root / CONTROL)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(sock)
    server = await asyncio.start_unix_server(sim.control, path=sock)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    state = {
        "pid": os.getpid(),
        "ports": {n: s.spec.port for n, s in sim.nodes.items()},
        "engine_port": sim.engine_port,
        "inventory": str(sim.root / "inventory.yaml"),
        "started": time.time(),
    }
    (sim.root / STATE).write_text(json.dumps(state, indent=2))
    try:
        await stop.wait()
    finally:
        server.close()
        await sim.stop()
        with contextlib.suppress(FileNotFoundError):
            (sim.root / STATE).unlink()


def main(argv: list[str] | None = None) -> int:
    """`python -m spark_ops.sim.cluster serve ROOT`."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or args[0] != "serve":
        sys.stderr.write("usage: python -m spark_ops.sim.cluster serve ROOT\n")
        return 2
    configure(-1, json=True)
    asyncio.run(serve(Path(args[1])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
