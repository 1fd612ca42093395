"""What `init` is given and reports: options, host lists, a launch `.env`, where to look."""

from __future__ import annotations

import ipaddress
import re
import shlex
from dataclasses import dataclass, field
from typing import Any

from spark_ops.errors import InventoryError
from spark_ops.inventory import host_problem
from spark_ops.watchdog.config import USER_CONFIG

TODO = "# TODO(spark-ops init):"
RECIPE_DIRS = ("~/spark-vllm-docker/recipes", "~/recipes", "/opt/spark-vllm-docker/recipes")
WATCHDOG_CONFIG = USER_CONFIG
WATCHDOG_STATE = "~/.local/state/spark-watchdog"
BASH_WATCHDOGS = (
    "~/spark-vllm-docker/watchdog.sh",
    "~/watchdog.sh",
    "~/bin/watchdog.sh",
    "~/bin/vllm-watchdog",
    "/usr/local/bin/vllm-watchdog",
    "/usr/local/bin/watchdog.sh",
)
HISTORY_GLOBS = (
    "~/.local/state/*/restarts",
    "~/.local/state/*/restart_history",
    "~/.watchdog/restart_history",
    "~/.cache/vllm-watchdog/restarts",
    "~/spark-vllm-docker/.restart_history",
    "/var/lib/vllm-watchdog/restarts",
)
LOG_FILES = ("~/engine.log", "~/vllm.log", "~/spark-vllm-docker/vllm.log", "/var/log/vllm.log")
DOCKER_CONTAINER = "vllm_node"
NAME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,62}$")


@dataclass
class InitOptions:
    """What the operator gave `spark-ops init`."""

    hosts: str | None = None
    from_env: str | None = None
    user: str | None = None
    identity: tuple[str, ...] = ()
    known_hosts: str | None = None
    port: int | None = None
    recipe: str | None = None
    name: str = "spark"
    connect_timeout: float = 10.0
    from_sparkrun: str | None = None  # a sparkrun cluster name; "" for sparkrun's default
    sparkrun_home: str | None = None  # whose ~/.config/sparkrun to read (default: ~)


@dataclass
class Finding:
    """One thing init looked for: found (with where from), missing (a TODO line), or a warning."""

    key: str
    status: str  # found | missing | warn
    value: Any = None
    detail: str = ""

    def to_dict(self) -> dict[str, Any]:
        """Serialize for --json."""
        return {"key": self.key, "status": self.status, "value": self.value, "detail": self.detail}


@dataclass
class NodeSpec:
    """A node to write: name, host, port."""

    name: str
    host: str
    port: int | None = None


@dataclass
class InitResult:
    """The inventory text and what was found or not."""

    text: str
    findings: list[Finding] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        """True when nothing was left as a TODO."""
        return not any(f.status == "missing" for f in self.findings)

    def missing(self) -> list[Finding]:
        """The findings left as TODO lines."""
        return [f for f in self.findings if f.status == "missing"]

    def to_dict(self) -> dict[str, Any]:
        """Serialize for --json."""
        return {
            "complete": self.complete,
            "findings": [f.to_dict() for f in self.findings],
            "inventory": self.text,
        }


def parse_hosts(spec: str, *, source: str = "--hosts") -> list[NodeSpec]:
    """Parse `a,b,c`, each item HOST, HOST:PORT or NAME=HOST[:PORT]; the first is the head."""
    items = [s.strip() for s in re.split(r"[,\s]+", spec) if s.strip()]
    if not items:
        raise InventoryError(f"{source}: no host given; expected e.g. node1,node2 (first = head)")
    out: list[NodeSpec] = []
    for item in items:
        name = None
        if "=" in item:
            name, item = item.split("=", 1)
            if not NAME_RE.match(name):
                raise InventoryError(
                    f"{source}: node name {name!r} is not allowed; use letters, digits, - and _"
                )
        host, port = item, None
        m = re.match(r"^\[(.+)\]:(\d+)$", item) or re.match(r"^([^:\[\]]+):(\d+)$", item)
        if m:
            host, port = m.group(1), int(m.group(2))
            if not 0 < port < 65536:
                raise InventoryError(f"{source}: port {port} of {item!r} must be 1-65535")
        if not host:
            raise InventoryError(f"{source}: empty host in {spec!r}")
        if why := host_problem(host):
            raise InventoryError(f"{source}: host {why}")
        out.append(NodeSpec(name or "", host, port))
    name_nodes(out)
    return out


def _is_ip(host: str) -> bool:
    """True for an IPv4/IPv6 literal."""
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def name_nodes(nodes: list[NodeSpec]) -> None:
    """Name unnamed nodes by their short host name, or node1..N when that is not unique or an IP."""
    shorts = [n.host.split(".")[0] for n in nodes]
    usable = all(
        n.name or (not _is_ip(n.host) and NAME_RE.match(s))
        for n, s in zip(nodes, shorts, strict=True)
    )
    names = [n.name or s for n, s in zip(nodes, shorts, strict=True)]
    if not usable or len(set(names)) != len(names):
        names = [n.name or f"node{i}" for i, n in enumerate(nodes, 1)]
    if len(set(names)) != len(names):
        raise InventoryError(f"--hosts: node names are not unique: {names}")
    for n, name in zip(nodes, names, strict=True):
        n.name = name


def parse_env_file(text: str) -> dict[str, str]:
    """Parse a shell-style .env: KEY=VALUE lines, optional `export`, quotes, comments."""
    out: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("export "):
            line = line[7:].strip()
        key, sep, value = line.partition("=")
        if not sep or not key.strip().isidentifier():
            continue
        value = value.strip()
        if value[:1] in ("'", '"'):
            try:
                words = shlex.split(value, comments=True)
                value = words[0] if words else ""
            except ValueError:
                value = value.strip("'\"")
        else:
            value = value.split(" #", 1)[0].strip()
        out[key.strip()] = value
    return out
