"""The inventory's model: clusters, nodes, SSH settings, the recipe's place, the watchdog
contract and how the engine runs (inventory.load builds it from YAML, validated)."""

from __future__ import annotations

import difflib
from dataclasses import asdict, dataclass, field
from typing import Any

from spark_ops.errors import InventoryError
from spark_ops.watchdog.history import default_journal, default_lock

ROLES = ("head", "worker")
LOG_KINDS = ("file", "journalctl", "docker", "command")
HISTORY_FORMATS = ("stamps", "jsonl", "auto")
# forced: restart_command forces a restart through the watchdog (its --restart-now); loop: the
# watchdog only loops (probe, stamp, restart), so restart_command is the launcher's own stop and
# start, which the watchdog never sees (docs/adopting-a-watchdog.md)
WATCHDOG_KINDS = ("forced", "loop")
# Run on each worker when the placement group waits: exit 1 means its Ray worker is not running
# (the raylet's process name; a container's processes show in the host's process table).
DEFAULT_WORKER_CHECK = "pgrep -x raylet >/dev/null"
# On the head: the cluster lock and the audit log, shared by every operator's account (sticky,
# world-writable like /tmp; kept across reboots, unlike /tmp).
SHARED_STATE_DIR = "/var/tmp/spark-ops"


@dataclass(frozen=True)
class SSHSettings:
    """How to reach the nodes: user, keys, known_hosts, jump host, timeouts, concurrency caps."""

    user: str | None = None
    port: int = 22
    known_hosts: str | None = None
    identity: tuple[str, ...] = ()
    agent: bool = True
    config: str | None = None
    jump: str | None = None
    connect_timeout: float = 10.0
    command_timeout: float = 60.0
    max_concurrent_connects: int = 16
    max_channels: int = 8
    insecure_no_host_key_check: bool = False

    def jump_target(self) -> tuple[str | None, str, int] | None:
        """The jump host as (user, host, port), or None when there is none."""
        return parse_jump(self.jump) if self.jump else None


@dataclass(frozen=True)
class Node:
    """One machine of the cluster."""

    name: str
    host: str
    port: int
    user: str | None
    role: str
    sudo: bool = False

    @property
    def is_head(self) -> bool:
        """True for the Ray head node."""
        return self.role == "head"


@dataclass(frozen=True)
class RecipeSettings:
    """Where the recipe lives, on which nodes, and how many backups to keep."""

    path: str
    nodes: tuple[str, ...]
    keep_backups: int = 5


@dataclass(frozen=True)
class WatchdogProbe:
    """How the watchdog probes the engine: every interval_s, a probe waits timeout_s at most, and
    `failures` failed probes in a row make it restart the engine (watchdog.probe)."""

    interval_s: float
    timeout_s: float
    failures: int

    def trip_s(self) -> float:
        """How long failing probes take to make the watchdog act (the first one's timeout, then
        `failures - 1` intervals)."""
        return self.timeout_s + (self.failures - 1) * self.interval_s


@dataclass(frozen=True)
class WatchdogSettings:
    """The watchdog contract: how to force a restart and where its history and flags live."""

    restart_command: str
    history_file: str
    history_format: str = "auto"
    lock_file: str | None = None
    journal_file: str | None = None
    pause_file: str | None = None
    gave_up_file: str | None = None
    status_command: str | None = None
    max_restarts: int = 2
    window_s: int = 21600
    reports_stamp: bool = False
    python: str = "python3"
    lock_timeout_s: float = 10.0  # how long a change waits for the history's lock (history.py)
    kind: str = "forced"  # WATCHDOG_KINDS
    history_locked: bool = True  # the watchdog takes lock_file around its own appends
    grace_s: float | None = None  # it leaves an engine younger than this alone (None: unknown)
    restarts_missing_engine: bool = True  # False: no engine running reads as stopped on purpose
    probe: WatchdogProbe | None = None  # its probe, when the inventory describes it

    @property
    def loops_only(self) -> bool:
        """True for a watchdog with no forced restart: restart_command is the launcher's."""
        return self.kind == "loop"

    @property
    def lock_path(self) -> str:
        """The history lock, by default beside the history file (history.py's one rule)."""
        return self.lock_file or default_lock(self.history_file)

    @property
    def journal_path(self) -> str:
        """The journal: the watchdog's, else spark-ops' own beside the history (one rule)."""
        return self.journal_file or default_journal(self.history_file)


@dataclass(frozen=True)
class EngineSettings:
    """How to read the engine's log, reach its API, and how long a boot may take."""

    log_kind: str = "file"
    log_target: str = "~/engine.log"
    api_url: str = "http://127.0.0.1:8000"
    tunnel: bool = True
    boot_deadline_s: float = 1800.0
    probe_timeout_s: float = 30.0
    worker_stall_s: float = 300.0
    min_mem_available_gb: float = 8.0
    model: str | None = None
    pid_file: str | None = None
    worker_check: str | None = DEFAULT_WORKER_CHECK
    # how the engine spans the nodes: ray (the head's engine joins the workers' Ray workers) or
    # mp (one rank per node without Ray: rank 0 on the head serves the API, the workers' ranks
    # run headless and log on their own nodes, at the same log target)
    executor: str = "ray"

    @property
    def worker_part(self) -> str:
        """What runs on a worker for this engine: its Ray worker, or its engine rank."""
        return "Ray worker" if self.executor == "ray" else "engine rank"

    def worker_down(self, exit_code: int | None) -> bool | None:
        """What worker_check's exit says: True (no Ray worker: exit 1), False (exit 0), None.

        Any other exit (the command missing, no permission) is unknown: a node is never named
        missing on a check that could not answer.
        """
        return {0: False, 1: True}.get(exit_code) if exit_code is not None else None


@dataclass(frozen=True)
class Cluster:
    """A named cluster: its nodes and the settings spark-ops needs to operate it."""

    name: str
    tensor_parallel: int
    nodes: tuple[Node, ...]
    ssh: SSHSettings
    recipe: RecipeSettings
    watchdog: WatchdogSettings
    engine: EngineSettings
    source: str = ""
    state_dir: str = SHARED_STATE_DIR

    @property
    def head(self) -> Node:
        """The one head node."""
        return next(n for n in self.nodes if n.is_head)

    @property
    def workers(self) -> tuple[Node, ...]:
        """Every node but the head."""
        return tuple(n for n in self.nodes if not n.is_head)

    def node(self, name: str) -> Node:
        """Look a node up by name."""
        for n in self.nodes:
            if n.name == name:
                return n
        raise InventoryError(f"{self.source}: cluster {self.name!r} has no node {name!r}")

    def to_dict(self) -> dict[str, Any]:
        """Serialize for --json output."""
        return asdict(self)


@dataclass(frozen=True)
class Inventory:
    """All clusters of one inventory file."""

    path: str
    clusters: dict[str, Cluster] = field(default_factory=dict)
    default: str | None = None

    def cluster(self, name: str | None = None) -> Cluster:
        """Pick a cluster by name, or the only / default one."""
        if name is None:
            name = self.default
        if name is None:
            if len(self.clusters) == 1:
                return next(iter(self.clusters.values()))
            raise InventoryError(
                f"{self.path}: holds clusters {sorted(self.clusters)}; choose one with --cluster"
            )
        if name not in self.clusters:
            near = difflib.get_close_matches(name, list(self.clusters), n=1, cutoff=0.6)
            raise InventoryError(
                f"{self.path}: no cluster {name!r}; clusters are {sorted(self.clusters)}",
                hint=f"did you mean -c {near[0]}?" if near else "pass -c with one of them",
            )
        return self.clusters[name]


def parse_jump(value: str) -> tuple[str | None, str, int]:
    """Split a jump host `[user@]host[:port]` (IPv6 as `[addr]:port`); ValueError when malformed."""
    user, _, rest = value.rpartition("@")
    port = "22"
    if rest.startswith("["):
        host, sep, tail = rest[1:].partition("]")
        if not sep or (tail and not tail.startswith(":")):
            raise ValueError("an IPv6 jump host is written [addr] or [addr]:port")
        port = tail[1:] or port
    elif rest.count(":") == 1:
        host, _, port = rest.partition(":")
    else:
        host = rest
    bare_v6 = ":" in host and not rest.startswith("[")
    if not host or bare_v6 or any(c.isspace() for c in value):
        raise ValueError("expected [user@]host[:port]")
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"port {port!r} is not a number from 1 to 65535")
    if "@" in value and not user:
        raise ValueError("the user before @ is empty")
    if ":" in user:
        raise ValueError("user:password@ is not accepted (no passwords); give [user@]host[:port]")
    return user or None, host, int(port)
