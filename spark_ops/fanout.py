"""Fan-out: run one command on all or some nodes of a cluster (lineedit.py: `exec --edit`).

Everything goes through `remote.ClusterSession` (one connection per node, opened concurrently
under the inventory's `ssh.max_concurrent_connects`). Results come back per host as data; nothing
is printed here.
A node that cannot be reached is a per-host failure, not an exception: the other nodes still run.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from spark_ops import audit
from spark_ops.errors import (
    CommandTimeout,
    ConnectError,
    ExitStatus,
    InventoryError,
    RemoteError,
    SparkOpsError,
)
from spark_ops.lock import cluster_lock
from spark_ops.remote import ClusterSession, quote_args

if TYPE_CHECKING:
    from spark_ops.inventory import Cluster
    from spark_ops.remote import ClusterSession, Result

# How a host's outcome is classified (HostResult.kind).
OK = "ok"
EXIT = "exit"  # the command ran and exited non-zero
TIMEOUT = "timeout"
UNREACHABLE = "unreachable"
ERROR = "error"  # anything else (edit refused, staging failed …)
UNCHANGED = "unchanged"  # edit mode: the line already reads as wanted

# A connection reset or lost before login is what an sshd past its MaxStartups does (also a jump
# host's); it is retried after a short random pause. Refused, timed out, host key, auth: never.

_KIND_STATUS = {
    UNREACHABLE: ExitStatus.UNREACHABLE,
    TIMEOUT: ExitStatus.TIMEOUT,
    EXIT: ExitStatus.REMOTE,
    ERROR: ExitStatus.REMOTE,
}


class FanoutError(RemoteError):
    """An edit was refused on a host (no or several matching lines, unreadable file)."""


@dataclass
class HostResult:
    """What happened on one host."""

    host: str
    kind: str
    exit_code: int | None = None
    stdout: str = ""
    stderr: str = ""
    seconds: float = 0.0
    error: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """True when the host did what was asked."""
        return self.kind in (OK, UNCHANGED)

    def to_dict(self) -> dict[str, Any]:
        """Serialize for --json output."""
        data: dict[str, Any] = {
            "host": self.host,
            "ok": self.ok,
            "kind": self.kind,
            "exit_code": self.exit_code,
            "stdout": self.stdout,
            "stderr": self.stderr,
            "seconds": round(self.seconds, 4),
        }
        if self.error is not None:
            data["error"] = self.error
        data.update(self.extra)
        return data


@dataclass
class FanoutReport:
    """The per-host outcomes of one fan-out, in inventory order."""

    cluster: str
    command: str
    hosts: list[HostResult]
    seconds: float
    mode: str = "exec"
    note: str = ""  # what the run did not do, and why (exec --edit: no restart, so no lease)

    @property
    def ok(self) -> bool:
        """True when every host succeeded."""
        return all(h.ok for h in self.hosts)

    @property
    def failed(self) -> list[HostResult]:
        """The hosts that did not succeed."""
        return [h for h in self.hosts if not h.ok]

    def result(self, host: str) -> HostResult:
        """The outcome of one host."""
        for h in self.hosts:
            if h.host == host:
                return h
        raise KeyError(host)

    def exit_status(self) -> ExitStatus:
        """The process exit code: 0, else unreachable (4) > timeout (8) > remote failure (12)."""
        kinds = {h.kind for h in self.failed}
        for kind in (UNREACHABLE, TIMEOUT, EXIT, ERROR):
            if kind in kinds:
                return _KIND_STATUS[kind]
        return ExitStatus.OK

    def to_dict(self) -> dict[str, Any]:
        """Serialize for --json output."""
        return {
            "cluster": self.cluster,
            "mode": self.mode,
            "command": self.command,
            "ok": self.ok,
            "seconds": round(self.seconds, 4),
            "failed": [h.host for h in self.failed],
            "hosts": [h.to_dict() for h in self.hosts],
            "note": self.note or None,
        }


def select_nodes(cluster: Cluster, names: Sequence[str] | None) -> list[str]:
    """The node names to act on: all (inventory order) or the named ones, each checked to exist."""
    if not names:
        return [n.name for n in cluster.nodes]
    known = [n.name for n in cluster.nodes]
    chosen: list[str] = []
    for name in names:
        if name not in known:
            raise InventoryError(
                f"{cluster.source}: cluster {cluster.name!r} has no node {name!r}; "
                f"nodes are {known}"
            )
        if name not in chosen:
            chosen.append(name)
    return chosen


def build_command(argv: Sequence[str], *, shell: bool = False) -> str:
    """The remote command line: each argument quoted, or one shell string as is (shell=True)."""
    if not argv:
        raise InventoryError("no command given: put it after --, e.g. spark-ops exec -- uptime")
    if shell:
        if len(argv) != 1:
            raise InventoryError(
                f"--shell takes the command as one string, got {len(argv)} arguments"
            )
        return argv[0]
    return quote_args(argv)


def from_error(host: str, exc: SparkOpsError, seconds: float = 0.0) -> HostResult:
    """Turn a per-host error into a HostResult."""
    if isinstance(exc, ConnectError):
        kind = UNREACHABLE
    elif isinstance(exc, CommandTimeout):
        kind = TIMEOUT
    else:
        kind = ERROR
    return HostResult(host, kind, seconds=seconds, error=exc.message)


def from_result(res: Result) -> HostResult:
    """Turn a remote Result into a HostResult."""
    kind = OK if res.exit_code == 0 else EXIT
    return HostResult(res.host, kind, res.exit_code, res.stdout, res.stderr, res.seconds)


async def connect_one(session: ClusterSession, host: str, sem: asyncio.Semaphore) -> bool:
    """Connect one host under the shared cap (the session retries drops); False if it failed."""
    if host not in session.connectors:
        async with sem:
            await session.connect([host], required=False)
    return host in session.connectors


def connect_cap(session: ClusterSession) -> asyncio.Semaphore:
    """The connect cap of the inventory (ssh.max_concurrent_connects) as a semaphore."""
    return asyncio.Semaphore(session.cluster.ssh.max_concurrent_connects)


async def exec_on(
    session: ClusterSession,
    command: str,
    hosts: Sequence[str],
    *,
    timeout: float | None = None,
    input: str | None = None,
) -> list[HostResult]:
    """Run command on hosts; each host runs as soon as it is connected (pipelined)."""
    hosts = list(hosts)
    sem = connect_cap(session)

    async def one(h: str) -> HostResult:
        """Connect (under the cap) then run on one host."""
        if not await connect_one(session, h, sem):
            return from_error(h, session.errors[h])
        try:
            res = await session.run(h, command, timeout=timeout, check=False, input=input)
        except SparkOpsError as exc:
            return from_error(h, exc)
        return from_result(res)

    return list(await asyncio.gather(*(one(h) for h in hosts)))


async def run_command(
    cluster: Cluster,
    argv: Sequence[str],
    *,
    nodes: Sequence[str] | None = None,
    timeout: float | None = None,
    shell: bool = False,
    input: str | None = None,
    changes_recipe: bool = False,
) -> FanoutReport:
    """Run one command (argv, each argument quoted) on the chosen nodes and report per host;
    `changes_recipe`: as an operation (the cluster lock held, an audit record written)."""
    hosts = select_nodes(cluster, nodes)
    command = build_command(argv, shell=shell)
    start = time.monotonic()
    async with ClusterSession(cluster) as session:
        if not changes_recipe:
            results = await exec_on(session, command, hosts, timeout=timeout, input=input)
        else:
            async with as_operation(session, "exec", {"command": command}, hosts) as done:
                results = await exec_on(session, command, hosts, timeout=timeout, input=input)
                done.extend(results)
    return FanoutReport(cluster.name, command, results, time.monotonic() - start)


@asynccontextmanager
async def as_operation(
    session: ClusterSession, operation: str, args: dict[str, Any], hosts: Sequence[str]
) -> AsyncIterator[list[HostResult]]:
    """A write to cluster files as an operation (issue 34): under the cluster lock, and recorded
    in the audit log with its outcome per host, whatever happens (the caller fills the list)."""
    results: list[HostResult] = []
    await session.connect([session.cluster.head.name])  # the lock and the audit live there
    async with cluster_lock(session, operation):
        outcome = "interrupted"
        try:
            yield results
            failed = [r.host for r in results if not r.ok]
            outcome = "ok" if results and not failed else f"failed on {', '.join(failed) or 'all'}"
        finally:
            detail = {r.host: r.kind for r in results}
            await audit.record(
                session,
                audit.make_entry(
                    operation, args=args, nodes=list(hosts), outcome=outcome, detail=detail
                ),
            )
