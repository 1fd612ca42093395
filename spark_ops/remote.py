"""The remote layer: one SSH connection per node for a whole run, commands with timeouts, atomic
writes.

This is the only module that imports asyncssh. Everything is built from quoted arguments; results
and errors are kept per host.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
import shlex
import time
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass
from typing import Any, TypeVar

from spark_ops.errors import (
    AuthError,
    CommandError,
    CommandTimeout,
    ConnectError,
    HostKeyError,
    RemoteError,
    SparkOpsError,
)
from spark_ops.inventory import Cluster, Node, SSHSettings
from spark_ops.log import get_logger

T = TypeVar("T")
MISSING_EXIT = 44  # our own exit code for "file does not exist"
MISMATCH_EXIT = 45  # the file changed under us (compare-and-swap failed)
CONNECT_RETRIES = 2  # for connections dropped before login only
_TRANSIENT = ("Connection reset by peer", "Connection lost", "Connection closed by peer")


def transient(exc: SparkOpsError | None) -> bool:
    """True for a connection dropped before login (an sshd over MaxStartups): worth a retry."""
    if not isinstance(exc, ConnectError) or isinstance(exc, HostKeyError | AuthError):
        return False
    return any(marker in exc.message for marker in _TRANSIENT)


def quote_path(path: str) -> str:
    """Quote a remote path for the shell, expanding a leading ~ to $HOME and nothing else."""
    if path == "~":
        return '"$HOME"'
    if path.startswith("~/"):
        return '"$HOME"/' + shlex.quote(path[2:])
    return shlex.quote(path)


def quote_args(args: Iterable[str]) -> str:
    """Join arguments into one shell command line, each quoted."""
    return " ".join(shlex.quote(str(a)) for a in args)


def sha256(text: str) -> str:
    """Hex digest of UTF-8 text (what the remote side's sha256sum prints)."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


@dataclass
class Result:
    """What one remote command did."""

    host: str
    command: str
    exit_code: int | None
    stdout: str
    stderr: str
    seconds: float

    @property
    def ok(self) -> bool:
        """True when the command exited 0."""
        return self.exit_code == 0

    def check(self) -> Result:
        """Raise CommandError unless the command exited 0."""
        if not self.ok:
            raise CommandError(self.host, self.command, self.exit_code, self.stderr)
        return self


@dataclass(frozen=True)
class FileWrite:
    """One atomic write to do: content for a path on a node, guarded by the old content's digest."""

    host: str
    path: str
    content: str
    expected_sha: str | None = (
        None  # None: the file must not have changed from "absent or anything"
    )
    keep_backups: int = 5


@dataclass
class WriteOutcome:
    """Where a write landed and where the previous content was kept."""

    host: str
    path: str
    backup: str | None
    staged: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """Serialize for reports."""
        return {"host": self.host, "path": self.path, "backup": self.backup}


class Connector(ABC):
    """One connection to one node: the small base class every transport implements."""

    def __init__(self, node: Node) -> None:
        """Remember the node."""
        self.node = node

    @abstractmethod
    async def connect(self) -> None:
        """Open the connection (raises ConnectError and children)."""

    @abstractmethod
    async def run(self, command: str, *, input: str | None = None, timeout: float) -> Result:
        """Run a shell command to completion."""

    @abstractmethod
    def stream(self, command: str) -> AsyncIterator[str]:
        """Run a command and yield its stdout lines as they come; stops it when closed."""

    @abstractmethod
    async def forward(self, dest_host: str, dest_port: int) -> int:
        """Forward a local loopback port to dest_host:dest_port as seen from the node."""

    @abstractmethod
    async def close(self) -> None:
        """Close the connection."""


class SSHConnector(Connector):
    """A Connector over asyncssh: known_hosts, identity, agent, ssh config and jump host."""

    def __init__(self, node: Node, ssh: SSHSettings) -> None:
        """Keep the settings; connect later."""
        super().__init__(node)
        self.ssh = ssh
        self._conn: Any = None
        self._listeners: list[Any] = []
        self.log = get_logger(host=node.name)

    def _options(self) -> dict[str, Any]:
        """Build asyncssh connect options from the inventory."""
        import os

        opts: dict[str, Any] = {
            "port": self.node.port,
            "connect_timeout": self.ssh.connect_timeout,
            "keepalive_interval": 15,
            "keepalive_count_max": 4,
        }
        if self.node.user:
            opts["username"] = self.node.user
        if self.ssh.insecure_no_host_key_check:
            opts["known_hosts"] = None
        elif self.ssh.known_hosts:
            opts["known_hosts"] = os.path.expanduser(self.ssh.known_hosts)
        if self.ssh.identity:
            opts["client_keys"] = [os.path.expanduser(p) for p in self.ssh.identity]
        if not self.ssh.agent:
            opts["agent_path"] = None
        if self.ssh.config:
            opts["config"] = [os.path.expanduser(self.ssh.config)]
        if self.ssh.jump:
            opts["tunnel"] = self.ssh.jump
        return opts

    async def connect(self) -> None:
        """Open the SSH connection, mapping failures to our error tree."""
        import asyncssh

        name = self.node.name
        try:
            self._conn = await asyncssh.connect(self.node.host, **self._options())
        except asyncssh.HostKeyNotVerifiable as exc:
            raise HostKeyError(
                name,
                f"host key of {self.node.host}:{self.node.port} not verified ({exc.reason})",
                hint="check the node's key, then add it to the known_hosts file of the inventory",
            ) from exc
        except asyncssh.PermissionDenied as exc:
            raise AuthError(
                name,
                f"authentication refused for user {self.node.user or '(default)'} ({exc.reason})",
                hint="check ssh.identity / the agent and the node's authorized_keys",
            ) from exc
        except asyncssh.DisconnectError as exc:
            raise ConnectError(name, f"disconnected while connecting: {exc.reason}") from exc
        except (OSError, asyncio.TimeoutError, asyncssh.Error) as exc:
            detail = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
            raise ConnectError(
                name, f"cannot connect to {self.node.host}:{self.node.port}: {detail}"
            ) from exc
        self.log.debug("connected", port=self.node.port)

    def _require(self) -> Any:
        """Return the live connection or fail clearly."""
        if self._conn is None:
            raise ConnectError(self.node.name, "not connected")
        return self._conn

    async def run(self, command: str, *, input: str | None = None, timeout: float) -> Result:
        """Run one command with a deadline; the remote process is stopped when it passes."""
        import asyncssh

        conn = self._require()
        start = time.monotonic()
        try:
            stdin: dict[str, Any] = {"input": input} if input else {"stdin": asyncssh.DEVNULL}
            proc = await asyncio.wait_for(
                conn.run(command, check=False, timeout=timeout, **stdin), timeout + 5
            )
        except (asyncssh.TimeoutError, asyncio.TimeoutError) as exc:
            raise CommandTimeout(
                self.node.name, f"command timed out after {timeout:.0f}s: {command[:120]}"
            ) from exc
        except (asyncssh.Error, OSError) as exc:
            raise ConnectError(self.node.name, f"connection lost running a command: {exc}") from exc
        out = proc.stdout if isinstance(proc.stdout, str) else ""
        err = proc.stderr if isinstance(proc.stderr, str) else ""
        code = proc.exit_status if proc.exit_status is not None else proc.returncode
        return Result(self.node.name, command, code, out, err, time.monotonic() - start)

    async def stream(self, command: str) -> AsyncIterator[str]:
        """Yield stdout lines of a long-running command; closing the generator stops it."""
        import asyncssh

        conn = self._require()
        try:
            proc = await conn.create_process(command, stderr=asyncssh.DEVNULL)
        except (asyncssh.Error, OSError) as exc:
            raise ConnectError(self.node.name, f"cannot start {command[:80]}: {exc}") from exc
        try:
            async for line in proc.stdout:
                yield line.rstrip("\n")
        finally:
            proc.close()
            with suppress(Exception):
                await asyncio.wait_for(proc.wait_closed(), 2)

    async def process(self, command: str) -> Any:
        """Start a command with open stdin/stdout (asyncssh process) for interactive use."""
        import asyncssh

        try:
            return await self._require().create_process(command)
        except (asyncssh.Error, OSError) as exc:
            raise ConnectError(self.node.name, f"cannot start {command[:80]}: {exc}") from exc

    async def forward(self, dest_host: str, dest_port: int) -> int:
        """Open a local port forward and return the local port."""
        conn = self._require()
        try:
            listener = await conn.forward_local_port("127.0.0.1", 0, dest_host, dest_port)
        except Exception as exc:
            raise RemoteError(
                self.node.name, f"cannot open a tunnel to {dest_host}:{dest_port}: {exc}"
            ) from exc
        self._listeners.append(listener)
        return int(listener.get_port())

    async def close(self) -> None:
        """Close listeners and the connection."""
        for lst in self._listeners:
            lst.close()
        if self._conn is not None:
            self._conn.close()
            with suppress(Exception):
                await asyncio.wait_for(self._conn.wait_closed(), 2)
            self._conn = None


# Shell programs run on the nodes. Arguments are passed as positional parameters ($1, $2 …) of
# `sh -c`, never spliced into the program text.
_STAGE = r"""
set -eu
p=$1; expected=$2; want=$3
case $p in */*) d=${p%/*}; b=${p##*/} ;; *) d=.; b=$p ;; esac
[ -n "$d" ] || d=/
[ -d "$d" ] || { echo "directory $d does not exist" >&2; exit 66; }
if [ "$expected" = absent ]; then
  [ ! -e "$p" ] || exit 45
elif [ "$expected" != - ]; then
  [ -e "$p" ] || exit 45
  set -- $(sha256sum < "$p")
  [ "$1" = "$expected" ] || exit 45
fi
tmp=$(mktemp "$d/.$b.spark-ops.XXXXXX")
trap 'rm -f -- "$tmp"' EXIT
cat > "$tmp"
set -- $(sha256sum < "$tmp")
[ "$1" = "$want" ] || { echo "staged content does not match (got $1)" >&2; exit 65; }
if [ -e "$p" ]; then
  chmod --reference="$p" -- "$tmp"
  chown --reference="$p" -- "$tmp" 2>/dev/null || true
fi
sync -- "$tmp"
trap - EXIT
printf '%s\n' "$tmp"
"""

_COMMIT = r"""
set -eu
p=$1; tmp=$2; keep=$3
case $p in */*) d=${p%/*} ;; *) d=. ;; esac
[ -f "$tmp" ] || { echo "staged file $tmp vanished" >&2; exit 67; }
if [ -e "$p" ]; then
  bk="$p.bak.$(date -u +%Y%m%dT%H%M%S.%NZ)"
  ln -- "$p" "$bk" 2>/dev/null || { cp -p -- "$p" "$bk.part" && mv -f -- "$bk.part" "$bk"; }
  printf 'backup=%s\n' "$bk"
fi
mv -f -- "$tmp" "$p"
sync -- "${d:-/}" 2>/dev/null || sync
n=0
for f in "$p".bak.*; do [ -e "$f" ] && n=$((n + 1)); done
if [ "$n" -gt "$keep" ]; then
  ls -1 -- "$p".bak.* | grep -v '[.]part$' | sort | head -n "-$keep" |
    while IFS= read -r old; do rm -f -- "$old"; done
fi
"""

_READ = r"""
p=$1
if [ -e "$p" ]; then cat -- "$p"; else exit 44; fi
"""


def sh_program(program: str, *args: str) -> str:
    """Build `sh -c PROGRAM sh ARGS…` with every argument quoted; `~/` paths expand on the node."""
    quoted = [quote_path(a) if a.startswith("~") else shlex.quote(a) for a in args]
    return f"sh -c {shlex.quote(program)} sh " + " ".join(quoted)


class ClusterSession:
    """Connections to the nodes of one cluster, opened once and reused for the whole run."""

    def __init__(
        self,
        cluster: Cluster,
        *,
        connector_factory: Callable[[Node, SSHSettings], Connector] | None = None,
    ) -> None:
        """Prepare (not open) one connector per node."""
        self.cluster = cluster
        self._factory = connector_factory or SSHConnector
        self.connectors: dict[str, Connector] = {}
        self.errors: dict[str, SparkOpsError] = {}
        self.latency: dict[str, float] = {}
        self.log = get_logger(cluster=cluster.name)
        if cluster.ssh.insecure_no_host_key_check:
            self.log.warning(
                "HOST KEY CHECKING IS OFF for this cluster (ssh.insecure_no_host_key_check): "
                "a machine in the middle can impersonate any node"
            )

    async def __aenter__(self) -> ClusterSession:
        """Enter as an async context manager (connects lazily)."""
        return self

    async def __aexit__(self, *exc: object) -> None:
        """Close every connection on the way out."""
        await self.close()

    async def connect(self, names: Sequence[str] | None = None, *, required: bool = True) -> None:
        """Connect to the named nodes (all by default) concurrently under the connect cap."""
        nodes = [self.cluster.node(n) for n in names] if names else list(self.cluster.nodes)
        sem = asyncio.Semaphore(self.cluster.ssh.max_concurrent_connects)

        async def one(node: Node) -> None:
            """Connect one node (retrying drops before login), recording latency or the error."""
            for attempt in range(CONNECT_RETRIES + 1):
                if node.name in self.connectors:
                    return
                conn = self._factory(node, self.cluster.ssh)
                async with sem:
                    start = time.monotonic()
                    try:
                        await conn.connect()
                    except SparkOpsError as exc:
                        self.errors[node.name] = exc
                        if attempt == CONNECT_RETRIES or not transient(exc):
                            return
                        await asyncio.sleep(random.uniform(0.05, 0.25) * (attempt + 1))
                        continue
                self.latency[node.name] = time.monotonic() - start
                self.errors.pop(node.name, None)
                self.connectors[node.name] = conn

        await asyncio.gather(*(one(n) for n in nodes))
        failed = [self.errors[n.name] for n in nodes if n.name in self.errors]
        if failed and required:
            if len(failed) == 1:
                raise failed[0]
            raise ConnectError(
                ",".join(e.host for e in failed if isinstance(e, RemoteError)),
                "; ".join(e.message for e in failed),
                hint=failed[0].hint,
            )

    def connector(self, host: str) -> Connector:
        """The open connector of a node."""
        try:
            return self.connectors[host]
        except KeyError:
            err = self.errors.get(host)
            if err is not None:
                raise err from None
            raise ConnectError(host, "not connected") from None

    def _wrap(self, host: str, command: str, sudo: bool) -> str:
        """Prefix sudo where the inventory asks for it on this node."""
        if sudo and self.cluster.node(host).sudo:
            return f"sudo -n sh -c {shlex.quote(command)}"
        return command

    async def run(
        self,
        host: str,
        command: str,
        *,
        input: str | None = None,
        timeout: float | None = None,
        check: bool = True,
        sudo: bool = False,
    ) -> Result:
        """Run one command on one node with a timeout (the inventory's by default)."""
        limit = timeout if timeout is not None else self.cluster.ssh.command_timeout
        cmd = self._wrap(host, command, sudo)
        self.log.debug("run", host=host, command=cmd[:200])
        result = await self.connector(host).run(cmd, input=input, timeout=limit)
        return result.check() if check else result

    async def gather(
        self, hosts: Iterable[str], fn: Callable[[str], Awaitable[T]]
    ) -> dict[str, T | SparkOpsError]:
        """Run fn(host) on every host concurrently; keep each result or error per host."""
        hosts = list(hosts)

        async def one(h: str) -> T | SparkOpsError:
            """Call fn, capturing our errors."""
            try:
                return await fn(h)
            except SparkOpsError as exc:
                return exc

        values = await asyncio.gather(*(one(h) for h in hosts))
        return dict(zip(hosts, values, strict=True))

    async def run_all(
        self, command: str, hosts: Iterable[str] | None = None, **kw: Any
    ) -> dict[str, Result | SparkOpsError]:
        """Run the same command on many nodes concurrently."""
        names = list(hosts) if hosts is not None else list(self.connectors)
        return await self.gather(names, lambda h: self.run(h, command, **kw))

    async def read_file(self, host: str, path: str, *, sudo: bool = False) -> str | None:
        """Read a remote text file; None when it does not exist."""
        res = await self.run(host, sh_program(_READ, path), check=False, sudo=sudo)
        if res.exit_code == MISSING_EXIT:
            return None
        res.check()
        return res.stdout

    async def stage(self, w: FileWrite) -> WriteOutcome:
        """Write content to a synced temp file beside the target, if the target is unchanged."""
        expected = "-" if w.expected_sha is None else w.expected_sha
        cmd = sh_program(_STAGE, w.path, expected, sha256(w.content))
        res = await self.run(w.host, cmd, input=w.content, check=False, sudo=True)
        if res.exit_code == MISMATCH_EXIT:
            raise RemoteError(
                w.host,
                f"{w.path} changed since it was read; nothing written",
                hint="run the command again to plan against the current content",
            )
        res.check()
        return WriteOutcome(w.host, w.path, None, staged=res.stdout.strip())

    async def commit(self, w: FileWrite, staged: WriteOutcome) -> WriteOutcome:
        """Back up the target and rename the staged file over it, then sync the directory."""
        assert staged.staged
        cmd = sh_program(_COMMIT, w.path, staged.staged, str(max(w.keep_backups, 1)))
        res = await self.run(w.host, cmd, check=True, sudo=True)
        backup = None
        for line in res.stdout.splitlines():
            if line.startswith("backup="):
                backup = line[len("backup=") :]
        return WriteOutcome(w.host, w.path, backup)

    async def discard(self, host: str, staged_path: str) -> None:
        """Remove a staged temp file (best effort)."""
        with suppress(SparkOpsError):
            await self.run(host, f"rm -f -- {shlex.quote(staged_path)}", check=False, sudo=True)

    async def write_atomic(self, writes: Sequence[FileWrite]) -> list[WriteOutcome]:
        """Write files on several nodes all-or-nothing: stage everywhere, then rename everywhere."""
        staged = await self.gather(
            [str(i) for i in range(len(writes))], lambda i: self.stage(writes[int(i)])
        )
        failures = [v for v in staged.values() if isinstance(v, SparkOpsError)]
        if failures:
            for i, v in staged.items():
                if isinstance(v, WriteOutcome) and v.staged:
                    await self.discard(writes[int(i)].host, v.staged)
            raise failures[0]
        done: list[WriteOutcome] = []
        for n, w in enumerate(writes):
            out = staged[str(n)]
            assert isinstance(out, WriteOutcome)
            done.append(await self.commit(w, out))
        return done

    async def stream_lines(self, host: str, command: str) -> AsyncIterator[str]:
        """Follow a command's output lines on a node (e.g. the engine log)."""
        async for line in self.connector(host).stream(command):
            yield line

    async def tunnel(self, host: str, dest_host: str, dest_port: int) -> int:
        """Forward a local port through a node to dest_host:dest_port; returns the local port."""
        return await self.connector(host).forward(dest_host, dest_port)

    @asynccontextmanager
    async def held(self, host: str, command: str, *, ready: str) -> AsyncIterator[list[str]]:
        """Run a command that holds a lock while its stdin stays open; yield its first lines."""
        conn = self.connector(host)
        if not isinstance(conn, SSHConnector):
            raise RemoteError(host, "holding a remote lock needs an SSH connector")
        proc = await conn.process(command)
        lines: list[str] = []
        try:
            while True:
                line = await asyncio.wait_for(
                    proc.stdout.readline(), self.cluster.ssh.command_timeout
                )
                if not line:
                    break
                lines.append(line.rstrip("\n"))
                if line.startswith(ready) or line.startswith("BUSY"):
                    if line.startswith("BUSY"):
                        rest = await asyncio.wait_for(proc.stdout.read(), 5)
                        lines.extend(rest.splitlines())
                    break
            yield lines
        finally:
            with suppress(Exception):
                proc.stdin.write_eof()
                await asyncio.wait_for(proc.wait(), 5)
            proc.close()
            with suppress(Exception):
                await asyncio.wait_for(proc.wait_closed(), 3)

    async def close(self) -> None:
        """Close every connection."""
        conns = list(self.connectors.values())
        self.connectors.clear()
        await asyncio.gather(*(c.close() for c in conns), return_exceptions=True)
