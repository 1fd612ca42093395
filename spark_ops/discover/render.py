"""The inventory text `init` writes (found values with their origin, TODO lines) and writing it."""

from __future__ import annotations

import datetime as dt
import json
import os
from pathlib import Path
from typing import Any

from spark_ops.discover.options import (
    TODO,
    Finding,
)
from spark_ops.errors import InventoryError
from spark_ops.files import sha256_of, write_file
from spark_ops.inventory import (
    Cluster,
)
from spark_ops.remote.connector import DEFAULT_KNOWN_HOSTS


def _q(value: Any) -> str:
    """A YAML scalar: JSON-quoted strings (valid YAML), plain numbers and booleans."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    return json.dumps(str(value))


def render_inventory(
    cluster: Cluster,
    values: dict[str, Any],
    findings: list[Finding],
    *,
    origin: str,
    notes: list[str] = (),  # type: ignore[assignment]
) -> str:
    """The inventory YAML text, with a TODO line for every missing item."""
    todo = {f.key: f.detail for f in findings if f.status == "missing"}
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    ssh = cluster.ssh
    out = [
        f"# Written by `spark-ops init` ({origin}) on {stamp}.",
        "# Check it before the first apply: spark-ops -i THIS_FILE doctor",
    ]
    if todo:
        out.append(f"# {len(todo)} item(s) could not be found: see the TODO(spark-ops init) lines.")
    out += ["clusters:", f"  {cluster.name}:"]
    out.append(f"    tensor_parallel: {values.get('tensor_parallel', len(cluster.nodes))}")
    if notes:
        out.append(f"    # network (from the launch .env): {' '.join(notes)}")
    out.append("    ssh:")
    if ssh.user:
        out.append(f"      user: {_q(ssh.user)}")
    if ssh.port != 22:
        out.append(f"      port: {ssh.port}")
    # always named: the file init checked the keys against (an ssh config cannot switch it off)
    known = ssh.known_hosts or os.path.expanduser(DEFAULT_KNOWN_HOSTS)
    out.append(f"      known_hosts: {_q(known)}")
    if ssh.identity:
        out.append(f"      identity: [{', '.join(_q(i) for i in ssh.identity)}]")
    out.append(f"      connect_timeout: {_q(ssh.connect_timeout)}")
    out.append("    nodes:")
    for n in cluster.nodes:
        port = f", port: {n.port}" if n.port != ssh.port else ""
        out.append(f"      {n.name}: {{host: {_q(n.host)}{port}, role: {n.role}}}")
    out.append("    recipe:")
    if "recipe.path" in values:
        out.append(f"      path: {_q(values['recipe.path'])}")
        holders = values.get("recipe.nodes") or [cluster.head.name]
        out.append(f"      nodes: [{', '.join(holders)}]")
    else:
        out.append(f"      {TODO} recipe.path — {todo.get('recipe.path', 'not found')}")
        out.append("      # path: ~/spark-vllm-docker/recipes/4x-spark-cluster/MODEL.yaml")
    out.append("    watchdog:")
    for key in (
        "kind",
        "restart_command",
        "status_command",
        "reports_stamp",
        "history_file",
        "history_format",
        "lock_file",
        "journal_file",
        "pause_file",
        "gave_up_file",
        "history_locked",
        "grace_s",
        "restarts_missing_engine",
    ):
        full = f"watchdog.{key}"
        if full in values:
            out.append(f"      {key}: {_q(values[full])}")
        elif full in todo:
            out.append(f"      {TODO} {full} — {todo[full]}")
            out.append(f"      # {key}: …")
    mx = values.get("watchdog.budget.max_restarts", 2)
    win = values.get("watchdog.budget.window_s", 21600)
    if "watchdog.budget.max_restarts" not in values:
        out.append("      # budget: spark-ops' default (2 per 6 h); set it to your watchdog's")
    out.append(f"      budget: {{max_restarts: {mx}, window_s: {win}}}")
    if "watchdog.probe.interval_s" in values:  # the reference watchdog's probe (its config)
        interval, timeout = values["watchdog.probe.interval_s"], values["watchdog.probe.timeout_s"]
        out.append(
            f"      probe: {{interval_s: {interval:g}, timeout_s: {timeout:g}, "
            f"failures: {values['watchdog.probe.failures']}}}"
        )
    out.append("    engine:")
    log = values.get("engine.log")
    if isinstance(log, dict):
        items = ", ".join(f"{k}: {_q(v) if k != 'kind' else v}" for k, v in log.items())
        out.append(f"      log: {{{items}}}")
    else:
        out.append(f"      {TODO} engine.log — {todo.get('engine.log', 'not found')}")
        out.append("      # log: {kind: docker, container: vllm_node}")
    url = values.get("engine.api.url", "http://127.0.0.1:8000")
    out.append(f"      api: {{url: {_q(url)}, tunnel: true}}")
    if values.get("engine.model"):
        out.append(f"      model: {_q(values['engine.model'])}")
    if values.get("engine.pid_file"):
        out.append(f"      pid_file: {_q(values['engine.pid_file'])}")
    if values.get("engine.executor"):
        out.append(f"      executor: {values['engine.executor']}")
    if values.get("engine.worker_check"):
        out.append(f"      worker_check: {_q(values['engine.worker_check'])}")
    return "\n".join(out) + "\n"


def check_output(path: str | Path, *, force: bool = False) -> Path:
    """The inventory file to write; InventoryError if it exists and force is not given.

    `init` asks this before connecting to any node, and write_inventory again before writing.
    """
    p = Path(path).expanduser()
    if p.exists() and not force:
        raise InventoryError(
            f"{p} already exists; not overwritten",
            hint="pass --force to replace it, or -o OTHER_FILE",
        )
    return p


def write_inventory(path: str | Path, text: str, *, force: bool = False) -> Path:
    """Write the inventory file; refuse to replace an existing one unless force."""
    p = check_output(path, force=force)
    expect = None if force else sha256_of(None)  # one that appears meanwhile is not replaced
    write_file(p, text, error=InventoryError, make_parents=True, expect_sha256=expect)
    return p
