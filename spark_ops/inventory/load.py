"""The inventory loaded from YAML and validated into its model (inventory.model): every error
names the file, the key (dotted path) and what is allowed. Nothing here connects anywhere."""

from __future__ import annotations

import difflib
import ipaddress
import math
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from spark_ops.errors import InventoryError, excerpt
from spark_ops.inventory.model import (
    DEFAULT_WORKER_CHECK,
    HISTORY_FORMATS,
    LOG_KINDS,
    ROLES,
    SHARED_STATE_DIR,
    WATCHDOG_KINDS,
    Cluster,
    EngineSettings,
    Inventory,
    Node,
    RecipeSettings,
    SSHSettings,
    WatchdogProbe,
    WatchdogSettings,
    parse_jump,
)
from spark_ops.watchdog.history import MAX_RESTARTS, MAX_WINDOW_S
from spark_ops.yamlsafe import load_yaml, read_text_capped

ENV_VAR = "SPARK_OPS_INVENTORY"


class _Section:
    """A mapping being validated, which knows its file and dotted key path for errors."""

    def __init__(self, source: str, key: str, data: Any, allowed: tuple[str, ...]) -> None:
        """Check the value is a mapping with only allowed keys."""
        self.source, self.key = source, key
        if data is None:
            data = {}
        if not isinstance(data, Mapping):
            raise self.error(key, f"must be a mapping, got {type(data).__name__}")
        unknown = sorted(str(k)[:60] for k in data if k not in allowed)
        if unknown:
            near = difflib.get_close_matches(unknown[0], allowed, n=1, cutoff=0.6)
            error = self.error(
                f"{key}.{unknown[0]}" if key else unknown[0],
                f"unknown key; allowed keys: {', '.join(allowed)}",
            )
            error.hint = (
                f"did you mean {self.path(near[0])}? rename the key in {source}"
                if near
                else f"remove the key from {source}, or use one of the allowed keys"
            )
            raise error
        self.data: Mapping[str, Any] = data

    def error(self, key: str, message: str) -> InventoryError:
        """Build an error naming the file and key."""
        return InventoryError(f"{self.source}: {key}: {message}")

    def path(self, name: str) -> str:
        """The dotted path of a key in this section."""
        return f"{self.key}.{name}" if self.key else name

    def get(self, name: str, kind: type | tuple[type, ...], default: Any = None, *, required=False):
        """Read a key, checking its type."""
        if name not in self.data or self.data[name] is None:
            if required:
                raise self.error(self.path(name), "is required")
            return default
        value = self.data[name]
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if isinstance(value, bool) and kind in (int, float):
            raise self.error(self.path(name), f"must be a number, got {excerpt(value)}")
        if not isinstance(value, kind):
            names = (
                kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
            )
            raise self.error(self.path(name), f"must be {names}, got {excerpt(value)}")
        if isinstance(value, float) and not math.isfinite(value):
            # YAML's .nan and .inf are floats: a deadline of nan never passes, inf never ends
            raise self.error(self.path(name), f"must be a finite number, got {value}")
        return value

    def port(self, name: str, default: int) -> int:
        """Read a TCP port: a whole number from 1 to 65535."""
        value = self.get(name, int, default)
        if not 0 < value < 65536:
            raise self.error(
                self.path(name), f"must be a whole number from 1 to 65535, got {excerpt(value)}"
            )
        return int(value)

    def positive(self, name: str, kind: type, default: Any) -> Any:
        """Read a number that must be > 0."""
        value = self.get(name, kind, default)
        if value is not None and value <= 0:
            raise self.error(self.path(name), f"must be > 0, got {excerpt(value)}")
        return value

    def bounded(self, name: str, default: int, maximum: int) -> int:
        """Read an integer in 1..maximum."""
        value = self.positive(name, int, default)
        if value > maximum:
            raise self.error(self.path(name), f"must be at most {maximum}, got {excerpt(value)}")
        return int(value)

    def choice(self, name: str, choices: tuple[str, ...], default: str) -> str:
        """Read a string among fixed choices."""
        value = self.get(name, str, default)
        if value not in choices:
            raise self.error(
                self.path(name), f"must be one of {', '.join(choices)}, got {excerpt(value)}"
            )
        return str(value)

    def sub(self, name: str, allowed: tuple[str, ...], *, required: bool = False) -> _Section:
        """Descend into a nested mapping."""
        if required and name not in self.data:
            raise self.error(self.path(name), "is required")
        return _Section(self.source, self.path(name), self.data.get(name), allowed)


def _load_ssh(sec: _Section) -> SSHSettings:
    """Validate the ssh: section."""
    identity = sec.get("identity", (str, list), ())
    if isinstance(identity, str):
        identity = [identity]
    if "password" in sec.data:
        raise sec.error(sec.path("password"), "passwords are not accepted; use identity or agent")
    for i, path in enumerate(identity):
        if isinstance(path, str):
            home_path(sec, "identity" if len(identity) == 1 else f"identity[{i}]", path)
    for key in ("known_hosts", "config"):
        if isinstance(sec.data.get(key), str):
            home_path(sec, key, sec.data[key])
    jump = sec.get("jump", str)
    if jump is not None:
        try:
            parse_jump(jump)
        except ValueError as exc:
            shown = "(not shown: it holds a password)" if "password" in str(exc) else excerpt(jump)
            raise sec.error(sec.path("jump"), f"{exc}, got {shown}") from None
    return SSHSettings(
        user=sec.get("user", str),
        port=sec.port("port", 22),
        known_hosts=sec.get("known_hosts", str),
        identity=tuple(str(i) for i in identity),
        agent=sec.get("agent", bool, True),
        config=sec.get("config", str),
        jump=jump,
        connect_timeout=sec.positive("connect_timeout", float, 10.0),
        command_timeout=sec.positive("command_timeout", float, 60.0),
        max_concurrent_connects=sec.positive("max_concurrent_connects", int, 16),
        max_channels=sec.positive("max_channels", int, 8),
        insecure_no_host_key_check=sec.get("insecure_no_host_key_check", bool, False),
    )


_SSH_KEYS = (
    "user", "port", "known_hosts", "identity", "agent", "config", "jump", "connect_timeout",
    "command_timeout", "max_concurrent_connects", "max_channels", "insecure_no_host_key_check",
    "password",
)  # fmt: skip
_NODE_KEYS = ("host", "port", "user", "role", "sudo")
_RECIPE_KEYS = ("path", "nodes", "keep_backups")
_WATCHDOG_KEYS = (
    "restart_command", "status_command", "history_file", "history_format", "lock_file",
    "journal_file", "pause_file", "gave_up_file", "budget", "reports_stamp", "python",
    "lock_timeout_s", "kind", "history_locked", "grace_s", "restarts_missing_engine", "probe",
)  # fmt: skip
_ENGINE_KEYS = (
    "log", "api", "boot_deadline_s", "probe_timeout_s", "worker_stall_s", "min_mem_available_gb",
    "model", "pid_file", "worker_check", "executor",
)  # fmt: skip
_CLUSTER_KEYS = ("tensor_parallel", "ssh", "nodes", "recipe", "watchdog", "engine", "state_dir")


EXECUTORS = ("ray", "mp")


def _executor(esec: _Section) -> str:
    """engine.executor: ray or mp (ranks without Ray); anything else names what is allowed."""
    value = esec.get("executor", str, "ray")
    if value not in EXECUTORS:
        raise esec.error(
            esec.path("executor"), f"must be one of {', '.join(EXECUTORS)}, got {excerpt(value)}"
        )
    return str(value)


_HOST_RE = re.compile(r"[A-Za-z0-9_.:%-]{1,253}")
_IPV4_RE = re.compile(r"[0-9.]+")


def host_problem(host: str) -> str | None:
    """Why a node's host is not allowed (empty, an option or shell text), or None when it is.

    One rule for the inventory and for `init --hosts`: a host name or an IP address.
    """
    if not _HOST_RE.fullmatch(host) or host.startswith("-"):
        return (
            "must be a host name or an IP address (letters, digits and . - _ : %, not starting "
            f"with -), got {excerpt(host)}"
        )
    if ":" in host or _IPV4_RE.fullmatch(host):
        try:
            ipaddress.ip_address(host.partition("%")[0])
        except ValueError:
            return f"is neither an IPv4 nor an IPv6 address, got {excerpt(host)}"
        return None
    labels = host.rstrip(".").split(".")
    if "%" in host or any(not 1 <= len(label) <= 63 for label in labels):
        return (
            "must be a DNS name (dot-separated labels of 1 to 63 characters, 253 in all) or an IP "
            f"address, got {excerpt(host)}"
        )
    return None


def home_path(sec: _Section, key: str, value: str) -> str:
    """A path with `~` or `~user` expanded on this machine; an unknown user names the key."""
    if value.startswith("~"):
        expanded = os.path.expanduser(value)
        if expanded.startswith("~"):
            user = value[1:].partition("/")[0]
            raise sec.error(
                sec.path(key), f"{excerpt(value)} names the home of {excerpt(user)}, an account "
                "this machine does not know (write the path in full, or ~/ for your own home)",
            )  # fmt: skip
    return value


def _host(n: _Section) -> str:
    """A node's host: a name or an address, never empty, an option or shell text."""
    host: str = n.get("host", str, required=True)
    if why := host_problem(host):
        raise n.error(n.path("host"), why)
    return host


def _named(sec: _Section, where: str, name: object, what: str) -> None:
    """A node's or cluster's name is a string as written: YAML reads `1:` as a number and `"1":` as
    text, two keys the loader keeps apart that would then be one name."""
    if not isinstance(name, str) or not name:
        raise sec.error(
            f"{where}.{name}" if where else str(name),
            f"{what}'s name must be text (YAML read {name!r} as {type(name).__name__}); "
            f'quote it: "{name}":',
        )


def _load_nodes(sec: _Section, ssh: SSHSettings) -> tuple[Node, ...]:
    """Validate the nodes: mapping (exactly one head)."""
    if not sec.data:
        raise sec.error(sec.key, "must list at least one node")
    nodes = []
    for name in sec.data:
        _named(sec, sec.key, name, "a node")
        n = _Section(sec.source, sec.path(str(name)), sec.data[name], _NODE_KEYS)
        nodes.append(
            Node(
                name=str(name),
                host=_host(n),
                port=n.port("port", ssh.port),
                user=n.get("user", str, ssh.user),
                role=n.choice("role", ROLES, "worker"),
                sudo=n.get("sudo", bool, False),
            )
        )
    seen: dict[tuple[str, int], str] = {}
    for node in nodes:
        first = seen.setdefault((node.host.lower(), node.port), node.name)
        if first != node.name:
            raise sec.error(
                sec.path(node.name),
                f"the same SSH endpoint as node {first} ({node.host}:{node.port}); each node once",
            )
    heads = [n.name for n in nodes if n.is_head]
    if len(heads) != 1:
        raise sec.error(sec.key, f"exactly one node must have role: head, found {heads or 'none'}")
    return tuple(nodes)


def _lock_timeout(wsec: _Section, ssh: SSHSettings) -> float:
    """watchdog.lock_timeout_s: > 0 and shorter than ssh.command_timeout (which would cut the
    wait short with a timeout instead of the lock's own answer)."""
    value = float(wsec.positive("lock_timeout_s", float, WatchdogSettings.lock_timeout_s))
    if value >= ssh.command_timeout:
        raise wsec.error(
            wsec.path("lock_timeout_s"),
            f"must be shorter than ssh.command_timeout ({ssh.command_timeout:g} s), got {value:g}",
        )
    return value


def _loop_keys(wsec: _Section) -> dict[str, Any]:
    """watchdog.kind and what a loop-only watchdog does on its own: whether it locks its history,
    its start-up grace, whether it restarts an engine that is not running at all."""
    kind = wsec.choice("kind", WATCHDOG_KINDS, "forced")
    if kind == "loop" and wsec.get("reports_stamp", bool, False):
        raise wsec.error(
            wsec.path("reports_stamp"),
            "must be false with kind: loop (restart_command is the launcher's stop and start, "
            "which writes no stamp and prints none)",
        )
    grace = wsec.get("grace_s", float)
    if grace is not None and grace < 0:
        raise wsec.error(wsec.path("grace_s"), f"must be >= 0, got {excerpt(grace)}")
    return {
        "kind": kind,
        "history_locked": wsec.get("history_locked", bool, True),
        "grace_s": grace,
        "restarts_missing_engine": wsec.get("restarts_missing_engine", bool, True),
    }


def _probe(wsec: _Section) -> WatchdogProbe | None:
    """watchdog.probe: {interval_s, timeout_s, failures}, all three, or none."""
    if wsec.data.get("probe") is None:
        return None
    psec = wsec.sub("probe", ("interval_s", "timeout_s", "failures"))
    for key in ("interval_s", "timeout_s", "failures"):
        if psec.data.get(key) is None:
            raise psec.error(psec.path(key), "is required (interval_s, timeout_s, failures)")
    return WatchdogProbe(
        interval_s=float(psec.positive("interval_s", float, None)),
        timeout_s=float(psec.positive("timeout_s", float, None)),
        failures=psec.bounded("failures", 3, 1000),
    )


def _load_cluster(source: str, name: str, data: Any) -> Cluster:
    """Validate one cluster mapping."""
    sec = _Section(source, f"clusters.{name}", data, _CLUSTER_KEYS)
    ssh = _load_ssh(sec.sub("ssh", _SSH_KEYS))
    nodes = _load_nodes(sec.sub("nodes", tuple(sec.data.get("nodes") or ()), required=True), ssh)
    names = [n.name for n in nodes]
    head = next(n.name for n in nodes if n.is_head)

    rsec = sec.sub("recipe", _RECIPE_KEYS, required=True)
    rnodes = rsec.get("nodes", list, [head])
    for r in rnodes:
        if r not in names:
            raise rsec.error(
                rsec.path("nodes"), f"names unknown node {excerpt(r)}; nodes are {names}"
            )
    recipe = RecipeSettings(
        path=rsec.get("path", str, required=True),
        nodes=tuple(rnodes),
        keep_backups=rsec.positive("keep_backups", int, 5),
    )

    wsec = sec.sub("watchdog", _WATCHDOG_KEYS, required=True)
    bsec = wsec.sub("budget", ("max_restarts", "window_s"))
    watchdog = WatchdogSettings(
        restart_command=wsec.get("restart_command", str, required=True),
        status_command=wsec.get("status_command", str),
        history_file=wsec.get("history_file", str, required=True),
        history_format=wsec.choice("history_format", HISTORY_FORMATS, "auto"),
        lock_file=wsec.get("lock_file", str),
        journal_file=wsec.get("journal_file", str),
        pause_file=wsec.get("pause_file", str),
        gave_up_file=wsec.get("gave_up_file", str),
        max_restarts=bsec.bounded("max_restarts", 2, MAX_RESTARTS),
        window_s=bsec.bounded("window_s", 21600, MAX_WINDOW_S),
        reports_stamp=wsec.get("reports_stamp", bool, False),
        python=wsec.get("python", str, "python3"),
        lock_timeout_s=_lock_timeout(wsec, ssh),
        **_loop_keys(wsec),
        probe=_probe(wsec),
    )

    esec = sec.sub("engine", _ENGINE_KEYS)
    lsec = esec.sub("log", ("kind", "path", "unit", "container", "command"))
    kind = lsec.choice("kind", LOG_KINDS, "file")
    target_key = {"file": "path", "journalctl": "unit", "docker": "container", "command": "command"}
    target = lsec.get(target_key[kind], str, "~/engine.log" if kind == "file" else None)
    if target is None:
        raise lsec.error(lsec.path(target_key[kind]), f"is required when kind is {kind}")
    asec = esec.sub("api", ("url", "tunnel"))
    url = asec.get("url", str, "http://127.0.0.1:8000")
    if not url.startswith(("http://", "https://")):
        raise asec.error(
            asec.path("url"), f"must start with http:// or https://, got {excerpt(url)}"
        )
    executor = _executor(esec)
    # ranks without Ray have no raylet to look for: a worker's rank is started by the restart
    # itself and followed on its own log, so there is no default check for that shape
    default_check = DEFAULT_WORKER_CHECK if executor == "ray" else None
    engine = EngineSettings(
        log_kind=kind,
        log_target=target,
        api_url=url.rstrip("/"),
        tunnel=asec.get("tunnel", bool, True),
        boot_deadline_s=esec.positive("boot_deadline_s", float, 1800.0),
        probe_timeout_s=esec.positive("probe_timeout_s", float, 30.0),
        worker_stall_s=esec.positive("worker_stall_s", float, 300.0),
        min_mem_available_gb=esec.positive("min_mem_available_gb", float, 8.0),
        model=esec.get("model", str),
        pid_file=esec.get("pid_file", str),
        worker_check=esec.get("worker_check", str, default_check) or None,
        executor=executor,
    )
    tp = sec.positive("tensor_parallel", int, len(nodes))
    return Cluster(
        name=name,
        tensor_parallel=tp,
        nodes=nodes,
        ssh=ssh,
        recipe=recipe,
        watchdog=watchdog,
        engine=engine,
        source=source,
        state_dir=sec.get("state_dir", str, SHARED_STATE_DIR),
    )


def parse_inventory(text: str, source: str) -> Inventory:
    """Parse and validate inventory YAML text; `source` names it in errors."""
    data = load_yaml(text, source=source, error=InventoryError)
    top = _Section(source, "", data, ("clusters", "default_cluster"))
    given = top.data.get("clusters")
    for name in given if isinstance(given, dict) else ():
        _named(top, "clusters", name, "a cluster")
    csec = top.sub("clusters", tuple(str(k) for k in (given or {})))
    if not csec.data:
        raise InventoryError(f"{source}: clusters: must define at least one cluster")
    clusters = {str(name): _load_cluster(source, str(name), csec.data[name]) for name in csec.data}
    default = top.get("default_cluster", str)
    if default is not None and default not in clusters:
        raise InventoryError(
            f"{source}: default_cluster: {excerpt(default)} is not one of {sorted(clusters)}"
        )
    return Inventory(path=source, clusters=clusters, default=default)


def load_inventory(path: str | os.PathLike[str] | None = None) -> Inventory:
    """Load the inventory from a path, else $SPARK_OPS_INVENTORY, else ./inventory/cluster.yaml."""
    chosen = path or os.environ.get(ENV_VAR)
    if not chosen:
        default = Path("inventory/cluster.yaml")
        if not default.exists():
            raise InventoryError(
                f"no inventory given: pass --inventory FILE or set {ENV_VAR} "
                f"(looked for {default})",
                hint="write one from your nodes: spark-ops init --hosts HEAD,WORKER,... -o "
                f"{default}; or try the embedded cluster: spark-ops sim up (it prints the "
                f"{ENV_VAR} to export)",
            )
        chosen = default
    p = Path(chosen).expanduser()
    text = read_text_capped(p, error=InventoryError, what="inventory")
    return parse_inventory(text, str(p))
