"""`init` as a whole: the nodes (from --hosts or a launch `.env`), connect, look, render."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path
from typing import Any

from spark_ops.discover.options import (
    Finding,
    InitOptions,
    InitResult,
    NodeSpec,
    name_nodes,
    parse_env_file,
    parse_hosts,
)
from spark_ops.discover.probe import Discovery, bare_cluster
from spark_ops.discover.render import render_inventory
from spark_ops.discover.sparkrun import SparkrunSetup, adopt_sparkrun, read_sparkrun
from spark_ops.errors import InventoryError
from spark_ops.remote import ClusterSession


async def _nodes_from_env(opts: InitOptions) -> tuple[list[NodeSpec], list[Finding], list[str]]:
    """Read the launch setup's .env on the head: nodes from CLUSTER_NODES, interfaces noted."""
    assert opts.from_env
    m = re.match(r"^(\[[^\]]+\]|[^:\[\]]+)(?::(\d+))?:(.+)$", opts.from_env)
    if not m:
        raise InventoryError(
            f"--from-env {opts.from_env!r}: expected HOST[:PORT]:PATH, "
            "e.g. node1:~/spark-vllm-docker/.env"
        )
    host = m.group(1).strip("[]")
    path = m.group(3)
    spec = host if not m.group(2) else (f"[{host}]" if ":" in host else host) + f":{m.group(2)}"
    head = parse_hosts(spec, source="--from-env")[0]
    cluster = bare_cluster([head], opts)
    async with ClusterSession(cluster) as session:
        await session.connect()
        text = await session.read_file(cluster.head.name, path)
    if text is None:
        raise InventoryError(f"--from-env: {host}:{path} does not exist")
    env = parse_env_file(text)
    listed = env.get("CLUSTER_NODES", "")
    if not listed.strip():
        raise InventoryError(
            f"{host}:{path}: CLUSTER_NODES is missing or empty; it must list the nodes' addresses"
        )
    nodes = parse_hosts(listed, source=f"{host}:{path}: CLUSTER_NODES")
    findings = [
        Finding("nodes", "found", [n.host for n in nodes], f"CLUSTER_NODES in {host}:{path}")
    ]
    same = [
        n for n in nodes if n.host == head.host and (n.port or head.port) == (head.port or n.port)
    ]
    if same:
        nodes.remove(same[0])
        nodes.insert(0, same[0])
    else:
        findings.append(
            Finding(
                "nodes",
                "warn",
                nodes[0].host,
                f"{host} is not in CLUSTER_NODES; its first entry is taken as the head",
            )
        )
    for n in nodes:
        n.name = ""
    name_nodes(nodes)
    notes = [f"{k}={env[k]}" for k in ("ETH_IF", "IB_IF") if k in env]
    if notes:
        findings.append(
            Finding("network", "found", notes, f"from {host}:{path} (kept as a comment)")
        )
    return nodes, findings, notes


async def discover(opts: InitOptions) -> InitResult:
    """Connect to the cluster described by the options, look around, return the inventory text."""
    findings: list[Finding] = []
    notes: list[str] = []
    setup: SparkrunSetup | None = None
    if opts.from_env:
        nodes, findings, notes = await _nodes_from_env(opts)
        origin = f"--from-env {opts.from_env}"
    elif opts.from_sparkrun is not None:
        home = Path(opts.sparkrun_home or "~").expanduser()
        setup = read_sparkrun(opts.from_sparkrun or None, home)
        nodes, findings = setup.nodes, list(setup.findings)
        opts = replace(
            opts,
            user=opts.user or setup.user,
            identity=opts.identity or setup.identity,
            port=opts.port or setup.port,
            known_hosts=opts.known_hosts or setup.known_hosts,
            recipe=opts.recipe or setup.recipe,
            name=setup.name if opts.name == "spark" else opts.name,
        )
        origin = f"--from-sparkrun {setup.name}"
    elif opts.hosts:
        nodes = parse_hosts(opts.hosts)
        origin = f"--hosts {opts.hosts}"
    else:
        raise InventoryError(
            "spark-ops init needs --hosts H1,H2,… (first = head) or --from-env HOST:PATH"
        )
    cluster = bare_cluster(nodes, opts)
    values: dict[str, Any] = {}
    async with ClusterSession(cluster) as session:
        await session.connect(required=False)
        for node in cluster.nodes:
            err = session.errors.get(node.name)
            if err is not None:
                findings.append(
                    Finding(
                        f"nodes.{node.name}",
                        "warn",
                        node.host,
                        f"not reachable: {err.message}" + (f" ({err.hint})" if err.hint else ""),
                    )
                )
        if cluster.head.name in session.errors:
            why = f"the head {cluster.head.name} was not reachable"
            for key in (
                "recipe.path",
                "watchdog.restart_command",
                "watchdog.history_file",
                "engine.log",
            ):
                findings.append(Finding(key, "missing", None, why))
        else:
            d = Discovery(session, opts)
            await d.run()
            findings.extend(d.findings)
            values = d.values
    if setup is not None:
        findings = adopt_sparkrun(setup, opts, values, findings)
    text = render_inventory(cluster, values, findings, origin=origin, notes=notes)
    return InitResult(text, findings)
