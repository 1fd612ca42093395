"""Engine ranks without Ray on the embedded cluster, as eugr/spark-vllm-docker launches them.

The launcher starts `vllm serve` on every node and supplies the multi-node flags itself: rank 0 on
the head (`--nnodes N --node-rank 0 --master-addr A --master-port P`) serves the API, every worker
runs rank i headless (`… --node-rank i --headless`), each logging on its own node. Here the head's
`vllm` is `python -m spark_ops.sim.ranks serve …`: a command line with
`--distributed-executor-backend mp`, a tensor-parallel size above 1 and no `--node-rank` is the
launcher's, so it stops the worker ranks its last launch left (each worker's pid file), starts the
new ones in the workers' trees (their network namespaces when given) and then runs rank 0 itself.
Any other command line runs the engine unchanged (the Ray shape).

The ranks meet over TCP at the master address: a worker rank says `rank I NODE`, rank 0 answers
`go` once all N−1 have joined (no rank loads weights before that), and each worker says `loaded`
after its weights; rank 0 waits for every `loaded` before profiling, with no deadline, so a worker
rank that dies leaves rank 0 hanging as a broken NCCL ring does. A worker rank ends when rank 0
goes. The `rank_lingers` fault keeps the one on its node (`faults.rank_lingers.node`) running,
holding its memory, and the launcher loses track of it (its pid moves to the node's
`rank.lingers` list, which only the embedded cluster's own shutdown reads): the next launch starts
a new rank beside it, as a launcher that only starts ranks does.
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
from pathlib import Path
from typing import Any

from spark_ops.sim.engine_config import SimConfigError, active_fault, cfg_get, load_config, scaled
from spark_ops.sim.engine_log import WORKER_FRAMES

RANKS_ENV = "SPARK_SIM_RANKS"  # the head's: path of ranks.json (worker homes, env, namespaces)
RANK_PID = ".local/state/spark-sim/rank.pid"  # a worker rank's pid, in the worker's tree
LINGERING = ".local/state/spark-sim/rank.lingers"  # ranks the launcher lost (rank_lingers fault)
RANK_LOG = "engine.log"  # a worker rank's log, in the worker's tree
JOIN_RETRY_S = 0.2
STOP_TIMEOUT_S = 10.0


def flag(args: list[str], *names: str) -> str | None:
    """The value of the first of names on a command line (`--f V` or `--f=V`), else None."""
    for i, arg in enumerate(args):
        key, eq, val = arg.partition("=")
        if key in names:
            return val if eq else (args[i + 1] if i + 1 < len(args) else "")
    return None


def is_launch(args: list[str]) -> bool:
    """True for a command line the launcher spreads over ranks (mp, TP > 1, no node rank)."""
    tp = flag(args, "--tensor-parallel-size", "-tp") or "1"
    return (
        flag(args, "--distributed-executor-backend") == "mp"
        and tp.isdigit()
        and int(tp) > 1
        and flag(args, "--node-rank") is None
        and "--headless" not in args
    )


def read_ranks() -> dict[str, Any]:
    """The worker ranks' layout written by the embedded cluster (`{}` without one)."""
    path = os.environ.get(RANKS_ENV)
    if not path:
        return {}
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    return dict(data)


def _is_rank(pid: int) -> bool:
    """True when pid is a live simulated engine rank (never a reused pid of something else)."""
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X") and b"spark_ops.sim.engine" in cmd and b"--headless" in cmd


def lingering_node(cfg: dict[str, Any]) -> str | None:
    """The node whose rank outlives rank 0 under the `rank_lingers` fault, as the config says
    now (a fault set after the rank started counts), else None."""
    with contextlib.suppress(SimConfigError):  # else the config as the process started with it
        cfg = load_config()
    if active_fault(cfg) != "rank_lingers":
        return None
    return str(cfg_get(cfg, "faults.rank_lingers.node"))


def _pids(path: Path) -> list[int]:
    """The pids a file lists, one a line (none when it is absent)."""
    try:
        words = path.read_text().split()
    except OSError:
        return []
    return [int(w) for w in words if w.isdigit()]


def stop_rank(home: Path, *, lingering: bool = False) -> None:
    """Stop the worker rank a launch left in home (its pid file): SIGTERM, then SIGKILL; with
    `lingering` also the ranks the launcher lost there (the embedded cluster's shutdown)."""
    pids = _pids(home / RANK_PID)[:1] + (_pids(home / LINGERING) if lingering else [])
    for pid in pids:
        _stop(pid)


def lose_rank(home: Path) -> None:
    """The `rank_lingers` fault: the launcher loses track of the rank it started in home (its pid
    moves to the node's list of lingering ranks), which then runs on beside the next."""
    pids = _pids(home / RANK_PID)[:1]
    if pids and _is_rank(pids[0]):
        with (home / LINGERING).open("a", encoding="utf-8") as f:
            f.write(f"{pids[0]}\n")


def _stop(pid: int) -> None:
    """SIGTERM a rank's process group, then SIGKILL, while it is a live rank."""
    for sig, wait in ((signal.SIGTERM, STOP_TIMEOUT_S), (signal.SIGKILL, 30.0)):
        if not _is_rank(pid):
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(os.getpgid(pid), sig)
        end = time.monotonic() + wait
        while _is_rank(pid) and time.monotonic() < end:
            time.sleep(0.05)


def launch(args: list[str], layout: dict[str, Any], lingers: str | None = None) -> list[str]:
    """Start the worker ranks (old ones stopped first, except on the node `lingers` names: that
    one is lost and runs on); return rank 0's command line."""
    workers = layout["workers"]
    nnodes = len(workers) + 1
    addr, port = str(layout["master_addr"]), int(layout["master_port"])
    common = ["--nnodes", str(nnodes), "--master-addr", addr, "--master-port", str(port)]
    for i, w in enumerate(workers, start=1):
        home = Path(w["home"])
        if lingers is not None and w.get("node") == lingers:
            lose_rank(home)
        else:
            stop_rank(home)
        netns = ["ip", "netns", "exec", w["netns"]] if w.get("netns") else []
        argv = [*netns, sys.executable, "-m", "spark_ops.sim.engine", *args, *common]
        argv += ["--node-rank", str(i), "--headless"]
        (home / RANK_PID).parent.mkdir(parents=True, exist_ok=True)
        # through a shell that backgrounds it and exits: the rank is no child of rank 0 (it runs
        # on another node), so no process tree search takes it for the head's engine
        started = subprocess.run(
            ["/bin/sh", "-c", '"$@" </dev/null >>"$0" 2>&1 & echo $!', str(home / RANK_LOG),
             *argv],
            cwd=home, env=w["env"], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            start_new_session=True, close_fds=True, check=True, timeout=30,
        )  # fmt: skip
        tmp = home / f"{RANK_PID}.tmp"
        tmp.write_text(f"{int(started.stdout.split()[0])}\n")
        os.replace(tmp, home / RANK_PID)
    return [*args, *common, "--node-rank", "0"]


class RankGroup:
    """Rank 0's side of the ranks' meeting: who joined, who loaded, who is still connected."""

    def __init__(self, cfg: dict[str, Any], nnodes: int, log: Any) -> None:
        """Expect nnodes − 1 worker ranks."""
        self.cfg, self.want, self.log = cfg, nnodes - 1, log
        self.joined: dict[int, tuple[str, asyncio.StreamReader, asyncio.StreamWriter]] = {}
        self.loaded: set[int] = set()
        self.changed = asyncio.Event()
        self.server: asyncio.AbstractServer | None = None

    async def _conn(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One worker rank: `rank I NODE`; then its `loaded` later on."""
        words = (await reader.readline()).decode(errors="replace").split()
        if len(words) != 3 or words[0] != "rank" or not words[1].isdigit():
            writer.close()
            return
        rank, node = int(words[1]), words[2]
        self.joined[rank] = (node, reader, writer)
        self.log.info(
            "EngineCore", "multiproc_executor.py:212",
            f"Rank {rank} ({node}) joined: {len(self.joined) + 1}/{self.want + 1} ranks joined",
        )  # fmt: skip
        self.changed.set()

    async def gather(self, host: str, port: int) -> None:
        """Listen at the master address until every worker rank joined (no deadline), then go."""
        self.server = await asyncio.start_server(self._conn, host, port, reuse_address=True)
        self.log.info(
            "EngineCore", "multiproc_executor.py:198",
            f"Waiting for {self.want} headless rank(s) at {host}:{port} "
            f"(1/{self.want + 1} ranks joined)",
        )  # fmt: skip
        while len(self.joined) < self.want:
            self.changed.clear()
            await self.changed.wait()
        self.log.info(
            "EngineCore", "multiproc_executor.py:231",
            f"All {self.want + 1}/{self.want + 1} ranks joined; loading weights on every rank",
        )  # fmt: skip
        for _, _, writer in self.joined.values():
            writer.write(b"go\n")
            with contextlib.suppress(OSError):
                await writer.drain()

    async def all_loaded(self) -> None:
        """Wait until every worker rank loaded its weights: forever when one died (a hang)."""
        for rank, (_, reader, _) in sorted(self.joined.items()):
            line = await reader.readline()
            if line.strip() == b"loaded":
                self.loaded.add(rank)
                continue
            await asyncio.Event().wait()  # its peer is gone: the collective never completes

    async def watch(self, wedge: Any) -> None:
        """While serving: a worker rank's connection lost wedges the engine (health stays 200)."""
        waits = {asyncio.ensure_future(r.read()): node for node, r, _ in self.joined.values()}
        done, _ = await asyncio.wait(set(waits), return_when=asyncio.FIRST_COMPLETED)
        node = waits[next(iter(done))]
        for line in cfg_get(self.cfg, "ranks.wedge_log_lines") or []:
            self.log.raw(str(line).format(node=node))
        wedge()

    def close(self) -> None:
        """Stop listening; drop the worker ranks' connections (they then end)."""
        if self.server is not None:
            self.server.close()
        for _, _, writer in self.joined.values():
            writer.close()


async def run_headless(cfg: dict[str, Any], args: Any, log: Any, stop: asyncio.Event) -> int:
    """A worker rank: join rank 0, load weights on `go`, stay until rank 0 goes or a signal."""
    rank, node = int(args.extras["node_rank"]), os.environ.get("SPARK_SIM_NODE", "?")
    addr = str(args.extras["master_addr"])
    port = int(args.extras["master_port"])
    w = "Worker"
    log.info(w, "multiproc_executor.py:640", f"Rank {rank} on {node}: joining {addr}:{port}")
    while True:
        try:
            reader, writer = await asyncio.open_connection(addr, port)
            break
        except OSError:
            if stop.is_set():
                return 0
            await asyncio.sleep(JOIN_RETRY_S)
    writer.write(f"rank {rank} {node}\n".encode())
    await writer.drain()
    go = asyncio.ensure_future(reader.readline())
    stopped = asyncio.ensure_future(stop.wait())
    await asyncio.wait({go, stopped}, return_when=asyncio.FIRST_COMPLETED)
    if not go.done():  # a signal while waiting for go (a rank started by hand, never let in)
        go.cancel()
        return 0
    stopped.cancel()
    if go.result() != b"go\n":
        log.error(w, "multiproc_executor.py:661", f"Rank {rank}: rank 0 went away before go")
        return 1
    log.info(w, "gpu_model_runner.py:3420", f"Starting to load model {args.model}...")
    start = time.monotonic()
    await asyncio.sleep(scaled(cfg, "boot.weights_s"))
    if active_fault(cfg) == "rank_fail" and str(cfg_get(cfg, "faults.rank_fail.node")) == node:
        where = "multiproc_executor.py:953"
        log.error(w, where, "WorkerProc failed to start.")
        log.traceback(w, where, WORKER_FRAMES, str(cfg_get(cfg, "faults.rank_fail.root_cause")))
        return 1
    took = time.monotonic() - start
    log.info(w, "default_loader.py:501", f"Loading weights took {took:.2f} seconds")
    gib = float(cfg_get(cfg, "model.weights_gib_per_gpu"))
    log.info(w, "gpu_model_runner.py:3512", f"Model loading took {gib:.4f} GiB memory")
    writer.write(b"loaded\n")
    await writer.drain()
    log.info(w, "multiproc_executor.py:702", f"Rank {rank} on {node} ready (headless)")
    lost = asyncio.ensure_future(reader.read())
    stopped = asyncio.ensure_future(stop.wait())
    await asyncio.wait({lost, stopped}, return_when=asyncio.FIRST_COMPLETED)
    if stopped.done():
        lost.cancel()
        log.info(w, "multiproc_executor.py:720", f"[shutdown] Rank {rank}: shutting down")
        return 0
    stopped.cancel()
    log.error(w, "multiproc_executor.py:733", f"Rank {rank}: lost rank 0 at {addr}:{port}")
    if lingering_node(cfg) == node:
        log.warning(w, "multiproc_executor.py:741", f"Rank {rank}: waiting for a new rank 0")
        await stop.wait()  # the old rank stays, holding its memory, until it is stopped
        return 0
    return 1


def launch_if_ranks(argv: list[str], cfg: dict[str, Any]) -> list[str]:
    """The engine's command line: a launcher's rank-less mp line starts the worker ranks first
    and becomes rank 0's; any other line (the Ray shape, a rank's own) is returned unchanged."""
    if argv[:1] != ["serve"] or not is_launch(argv):
        return argv
    layout = read_ranks()
    return launch(argv, layout, lingering_node(cfg)) if layout.get("workers") else argv
