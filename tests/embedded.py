"""Embedded SSH nodes for tests: started in-process on port 0, keys generated at run time."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import asyncssh
import yaml

from spark_ops.inventory import Cluster, parse_inventory
from spark_ops.sim.node import NodeSpec, SimNode


async def start_nodes(
    root: Path,
    n: int = 3,
    *,
    env: dict[str, str] | None = None,
    engine: dict[str, Any] | None = None,
    command_timeout: float = 20,
) -> tuple[list[SimNode], Cluster]:
    """Start n embedded nodes (node1 the head) and an inventory that reaches them."""
    client = asyncssh.generate_private_key("ssh-ed25519")
    client.write_private_key(str(root / "id"))
    client.write_public_key(str(root / "id.pub"))
    nodes, known = [], ""
    for i in range(1, n + 1):
        key = asyncssh.generate_private_key("ssh-ed25519")
        key.write_private_key(str(root / f"host{i}"))
        home = root / f"node{i}"
        (home / "bin").mkdir(parents=True)
        role = "head" if i == 1 else "worker"
        spec = NodeSpec(f"node{i}", role, home, root / f"host{i}", root / "id.pub", env=env or {})
        node = SimNode(spec)
        await node.start()
        nodes.append(node)
        known += f"[127.0.0.1]:{node.spec.port} {key.export_public_key().decode().strip()}\n"
    (root / "known_hosts").write_text(known)
    cluster: dict[str, Any] = {
        "ssh": {
            "known_hosts": str(root / "known_hosts"),
            "identity": str(root / "id"),
            "agent": False,
            "config": "/dev/null",
            "command_timeout": command_timeout,
        },
        "nodes": {
            node.spec.name: {"host": "127.0.0.1", "port": node.spec.port, "role": node.spec.role}
            for node in nodes
        },
        "recipe": {"path": "~/r.yaml"},
        "watchdog": {"restart_command": "true", "history_file": "~/h"},
    }
    if engine:
        cluster["engine"] = engine
    text = yaml.safe_dump({"clusters": {"t": cluster}})
    (root / "inventory.yaml").write_text(text)  # for a CLI run in a subprocess
    return nodes, parse_inventory(text, "test").cluster()
