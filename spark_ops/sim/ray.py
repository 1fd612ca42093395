"""A simulated `ray` CLI for sparkrun's Ray containers, beside the simulated raylet of sim/node.py.

Only what sparkrun 0.4.2's `vllm` Ray runtime runs in its containers:

- `ray start --block --head --port P --node-ip-address IP [--include-dashboard=…]
  [--dashboard-host H] [--dashboard-port N] [--disable-usage-stats]`: the head listens on IP:P
  (sparkrun waits for that port), keeps the list of worker nodes that joined it in
  `$SPARK_SIM_RAY_DIR/nodes` (default `/tmp/ray`, private to the container) and writes
  `ray_current_cluster` there as Ray does; it runs until SIGTERM (it is the container's PID 1).
- `ray start --block --address=HEAD:P --node-ip-address IP`: a worker opens its raylet port (a
  TCP listener that answers the engine's liveness connection, as sim/node.py's does), joins the
  head and stays up while the head does (losing the head ends it, exit 1).
- `ray status`: the nodes of the local head, exit 1 when none runs here.

`vllm ARGS…` in a head container is `python -m spark_ops.sim.ray vllm ARGS…`: like vLLM's Ray
executor it joins the local cluster — waits (up to its deadline) until tensor-parallel-size − 1
workers have joined, puts them in `$SPARK_SIM_RAY_WORKERS` — and then runs the simulated engine.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from spark_ops.errors import InputError

JOIN_DEADLINE_S = 60.0
PLACEMENT_DEADLINE_S = 60.0
VALUE_FLAGS = ("--port", "--node-ip-address", "--address", "--dashboard-host", "--dashboard-port")
SWITCHES = ("--block", "--head", "--disable-usage-stats")


class RayUsageError(InputError):
    """A command line this simulated ray does not take (exit 2, as ray's own CLI)."""


def ray_dir() -> Path:
    """Where the head keeps its cluster files (private to the container)."""
    return Path(os.environ.get("SPARK_SIM_RAY_DIR", "/tmp/ray"))


@dataclass
class StartArgs:
    """`ray start` as sparkrun spells it."""

    head: bool
    port: int
    node_ip: str
    address: str | None


def parse_start(args: list[str]) -> StartArgs:
    """Parse `ray start …`; RayUsageError naming the option that is not taken."""
    values: dict[str, str] = {}
    switches: set[str] = set()
    i = 0
    while i < len(args):
        arg = args[i]
        key, eq, val = arg.partition("=")
        if key in VALUE_FLAGS:
            if not eq:
                if i + 1 >= len(args) or args[i + 1].startswith("--"):
                    got = f", got {args[i + 1]!r}" if i + 1 < len(args) else ""
                    raise RayUsageError(f"ray start: option {key} requires a value{got}")
                i += 1
                val = args[i]
            values[key] = val
        elif key == "--include-dashboard":
            pass
        elif arg in SWITCHES:
            switches.add(arg)
        else:
            raise RayUsageError(f"ray start: no such option: {arg}")
        i += 1
    if "--block" not in switches:
        raise RayUsageError("ray start: this simulated ray runs only with --block")
    head = "--head" in switches
    if head == ("--address" in values):
        raise RayUsageError("ray start: give either --head or --address=HEAD:PORT")
    port = values.get("--port", "6379" if head else "0")
    if not port.isdigit():
        raise RayUsageError(f"ray start: --port {port!r} is not a port number")
    return StartArgs(
        head, int(port), values.get("--node-ip-address", "127.0.0.1"), values.get("--address")
    )


def _write(path: Path, text: str) -> None:
    """Replace a small file atomically (temp file, rename)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


async def _until_stopped() -> None:
    """Wait for SIGTERM/SIGINT (PID 1 of a container has no default action for them)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()


async def run_head(a: StartArgs) -> int:
    """Listen for workers on IP:PORT, keep their list in the cluster dir, until stopped."""
    d = ray_dir()
    d.mkdir(parents=True, exist_ok=True)
    nodes: dict[str, str] = {}

    def publish() -> None:
        """Write the joined workers, one `name=host:port` a line."""
        _write(d / "nodes", "".join(f"{n}={addr}\n" for n, addr in sorted(nodes.items())))

    async def joined(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One worker: `node NAME HOST:PORT`, then held until either side closes."""
        words = (await reader.readline()).decode(errors="replace").split()
        if len(words) != 3 or words[0] != "node":
            writer.close()
            return
        nodes[words[1]] = words[2]
        publish()
        print(f"node {words[1]} at {words[2]} joined", flush=True)
        with contextlib.suppress(ConnectionError, OSError):
            await reader.read()
        nodes.pop(words[1], None)
        publish()
        print(f"node {words[1]} left", flush=True)
        writer.close()

    server = await asyncio.start_server(joined, a.node_ip, a.port)
    publish()
    _write(d / "ray_current_cluster", f"{a.node_ip}:{a.port}\n")
    print(f"Ray runtime started (simulated). GCS at {a.node_ip}:{a.port}", flush=True)
    await _until_stopped()
    server.close()
    return 0


async def run_worker(a: StartArgs) -> int:
    """Open the raylet port, join the head, stay up while the head does."""
    assert a.address is not None
    host, _, port = a.address.rpartition(":")
    if not port.isdigit():
        raise RayUsageError(f"ray start: --address {a.address!r} is not HEAD:PORT")
    peers: set[asyncio.StreamWriter] = set()

    async def raylet(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Answer the engine's liveness connection and hold it."""
        peers.add(writer)
        with contextlib.suppress(ConnectionError, OSError):
            writer.write(f"raylet {name}\n".encode())
            await writer.drain()
            await reader.read()
        peers.discard(writer)
        writer.close()

    server = await asyncio.start_server(raylet, a.node_ip, 0)
    own = server.sockets[0].getsockname()[1]
    name = f"worker-{a.node_ip}-{own}"
    end = time.monotonic() + JOIN_DEADLINE_S
    while True:
        try:
            reader, writer = await asyncio.open_connection(host, int(port))
            break
        except OSError as exc:
            if time.monotonic() > end:
                print(f"Unable to connect to GCS at {a.address}: {exc}", file=sys.stderr)
                return 1
            await asyncio.sleep(0.5)
    writer.write(f"node {name} {a.node_ip}:{own}\n".encode())
    await writer.drain()
    print(f"Ray runtime started (simulated). Joined {a.address} as {name}", flush=True)
    lost = asyncio.ensure_future(reader.read())
    stopped = asyncio.ensure_future(_until_stopped())
    await asyncio.wait({lost, stopped}, return_when=asyncio.FIRST_COMPLETED)
    server.close()
    for p in list(peers):
        p.close()
    if lost.done():
        print(f"lost the connection to GCS at {a.address}", file=sys.stderr)
        return 1
    writer.close()
    return 0


def read_nodes() -> dict[str, str] | None:
    """The local head's joined workers, or None when no head runs here."""
    try:
        text = (ray_dir() / "nodes").read_text()
    except OSError:
        return None
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def tensor_parallel(args: list[str]) -> int:
    """The `--tensor-parallel-size`/`-tp` of a serve command line (1 when absent)."""
    for i, arg in enumerate(args):
        key, eq, val = arg.partition("=")
        if key in ("--tensor-parallel-size", "-tp"):
            val = val if eq else (args[i + 1] if i + 1 < len(args) else "1")
            return int(val) if val.isdigit() else 1
    return 1


def run_vllm(args: list[str]) -> int:
    """Join the local Ray cluster (tp − 1 workers, within the deadline), then exec the engine."""
    want = tensor_parallel(args) - 1
    end = time.monotonic() + PLACEMENT_DEADLINE_S
    nodes = read_nodes()
    while nodes is not None and len(nodes) < want and time.monotonic() < end:
        time.sleep(0.5)
        nodes = read_nodes()
    if nodes:
        os.environ["SPARK_SIM_RAY_WORKERS"] = ",".join(f"{n}={a}" for n, a in nodes.items())
    sys.stdout.flush()
    os.execv(sys.executable, [sys.executable, "-m", "spark_ops.sim.engine", *args])


def install(bin_dir: Path, python: str = "/usr/bin/python3") -> list[Path]:
    """Write `ray` and `vllm` into bin_dir, run by `python` (the containers' interpreter)."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    made = []
    for tool, argv in (("ray", ""), ("vllm", " vllm")):
        path = bin_dir / tool
        path.write_text(f'#!/bin/sh\nexec {python} -m spark_ops.sim.ray{argv} "$@"\n')
        path.chmod(0o755)
        made.append(path)
    return made


def main(argv: list[str] | None = None) -> int:
    """`ray start …` / `ray status`; `vllm …` (the engine in a Ray head container)."""
    args = sys.argv[1:] if argv is None else argv
    try:
        if args[:1] == ["vllm"]:
            return run_vllm(args[1:])
        if args[:1] == ["status"]:
            nodes = read_nodes()
            if nodes is None:
                print("No cluster status. (no simulated Ray head runs here)", file=sys.stderr)
                return 1
            print(f"Active: 1 head, {len(nodes)} worker node(s)")
            for n, addr in nodes.items():
                print(f"  {n} {addr}")
            return 0
        if args[:1] != ["start"]:
            raise RayUsageError(f"ray: this simulated ray has no command {' '.join(args[:1])!r}")
        a = parse_start(args[1:])
        return asyncio.run(run_head(a) if a.head else run_worker(a))
    except RayUsageError as exc:
        print(exc, file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
