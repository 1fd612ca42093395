"""Each node's facts for its panel: GPU use, memory and power (nvidia-smi), MemAvailable, and the
engine rank it runs. One short program per node, read at most every FACTS_S seconds.

nvidia-smi on a DGX Spark (GB10) has no memory figure (`[N/A]`: the memory is unified with the
host's, /proc/meminfo's MemAvailable says what is free); the embedded cluster's nodes answer as
one does (spark_ops/sim/nvidia_smi.py) where a test installs it.
"""

from __future__ import annotations

import itertools
import re
import time
from typing import Any

from spark_ops.errors import SparkOpsError
from spark_ops.inventory import Cluster
from spark_ops.remote import ClusterSession
from spark_ops.remote.programs.node import FACTS
from spark_ops.workflows.gate import missing_workers
from spark_ops.workflows.operation import Operation

FACTS_S = 15.0  # node facts are read at most this often (one SSH command per node)

NODE_RANK = re.compile(r"--node-rank[= ](\d{1,6})(?!\d)")  # a rank, never a 5000-digit number
MAX_ERROR_CHARS = 200  # a node's error as the panel shows it: one short line


def parse_facts(text: str, *, head: bool) -> dict[str, Any]:
    """One node's answer as facts: mem_total / mem_available (bytes), gpu (or gpu_note), ranks."""
    out: dict[str, Any] = {"gpu": None, "gpu_note": "", "ranks": []}
    ranks: list[str] = []
    for line in text.splitlines():
        tag, _, rest = line.partition(" ")
        if tag == "MEM":
            words = rest.split()
            if len(words) == 2 and all(w.isdigit() for w in words):
                out["mem_total"], out["mem_available"] = int(words[0]) * 1024, int(words[1]) * 1024
        elif tag == "GPU" and out["gpu"] is None:
            out["gpu"] = parse_gpu(rest)
        elif tag == "NO_GPU_TOOL":
            out["gpu_note"] = "no nvidia-smi on this node"
        elif tag == "GPU_ERROR":
            out["gpu_note"] = "nvidia-smi answered nothing (within 3 s)"
        elif tag == "ENGINE":
            pid, _, args = rest.partition(" ")
            if _names_a_shell(args) or not _runs_engine(args):
                continue
            found = NODE_RANK.search(args)
            if found:
                rank = int(found.group(1))
                role = "serves the API" if rank == 0 else "headless"
                ranks.append(f"rank {rank} ({role}), pid {pid}")
            elif "--node-rank" in args:
                ranks.append(f"rank unreadable, pid {pid}")
            elif head:
                ranks.append(f"rank 0 (serves the API), pid {pid}")
    out["ranks"] = sorted(set(ranks))
    return out


def _names_a_shell(args: str) -> bool:
    """The command line holds a shell's `-c` (a wrapper naming the engine, not the engine)."""
    words = args.split()
    return any(
        w.rsplit("/", 1)[-1] in ("sh", "bash", "dash") and nxt == "-c"
        for w, nxt in itertools.pairwise(words)
    )


def _runs_engine(args: str) -> bool:
    """The process is the engine (vllm, or Python running it), not a shell naming it."""
    words = args.split()
    program = words[0].rsplit("/", 1)[-1] if words else ""
    return program == "vllm" or program.startswith("python")


def parse_gpu(line: str) -> dict[str, Any]:
    """`name, util, mem used, mem total, power, temperature` (nounits); `[N/A]` and
    `[Not Supported]` are None."""
    cells = [c.strip() for c in line.split(",")]
    cells += [""] * (6 - len(cells))

    def num(text: str) -> float | None:
        """A figure, or None where nvidia-smi has none."""
        try:
            return float(text)
        except ValueError:
            return None

    return {
        "name": cells[0] or None,
        "util_pct": num(cells[1]),
        "mem_used_mib": num(cells[2]),
        "mem_total_mib": num(cells[3]),
        "power_w": num(cells[4]),
        "temp_c": num(cells[5]),
    }


def short_error(text: str) -> str:
    """An error as a panel shows it: its first line, at most MAX_ERROR_CHARS (never the program's
    whole text)."""
    first = (str(text).strip().splitlines() or [""])[0]
    return first if len(first) <= MAX_ERROR_CHARS else first[: MAX_ERROR_CHARS - 1] + "…"


async def read_facts(cluster: Cluster) -> dict[str, Any]:
    """Every reachable node's facts; a node that did not answer says why. Workers' engine part
    (the Ray worker) is asked as the boot watch asks it (workflows.gate.missing_workers)."""
    nodes: dict[str, Any] = {}
    async with ClusterSession(cluster) as session:
        await session.connect(required=False)
        names = [n.name for n in cluster.nodes if n.name not in session.errors]
        answers = await session.gather(names, lambda h: session.call(h, FACTS))
        for node in cluster.nodes:
            if node.name in session.errors:
                nodes[node.name] = {"error": short_error(session.errors[node.name].message)}
                continue
            res = answers.get(node.name)
            if isinstance(res, SparkOpsError) or res is None:
                said = res.message if isinstance(res, SparkOpsError) else "no answer"
                nodes[node.name] = {"error": short_error(said)}
                continue
            try:
                nodes[node.name] = parse_facts(res.stdout, head=node.name == cluster.head.name)
            except Exception as exc:  # one odd answer is that node's error, never the page's
                nodes[node.name] = {"error": short_error(f"unreadable answer ({exc!r})")}
        missing: list[str] = []
        if cluster.workers and not session.errors:
            try:
                missing = await missing_workers(Operation(session, "serve"))
            except SparkOpsError:
                missing = []
        part = cluster.engine.worker_part
        for node in cluster.workers:
            found = nodes.get(node.name) or {}
            if "error" in found or found.get("ranks"):
                continue
            down = [m for m in missing if m.split(" ", 1)[0] == node.name]
            if down:
                found["ranks"] = [f"{part} not running"]
            elif cluster.engine.worker_check:
                found["ranks"] = [f"{part} running"]
    return {"time": time.time(), "nodes": nodes}
