"""ClusterSession: the nodes of one cluster, connected once, with per-host results and errors."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from contextlib import asynccontextmanager, suppress
from typing import Any, TypeVar

from spark_ops.errors import (
    CommandTimeout,
    ConnectError,
    InventoryError,
    RemoteError,
    SparkOpsError,
    one_line,
)
from spark_ops.inventory import Cluster, Node, SSHSettings
from spark_ops.log import get_logger
from spark_ops.remote import writes as atomic
from spark_ops.remote.connector import (
    CONNECT_RETRIES,
    SSHConnector,
    open_jump,
    retrying,
    transient,
)
from spark_ops.remote.program import RemoteProgram, check_text
from spark_ops.remote.quoting import quote_word
from spark_ops.remote.shell import (
    LIST_BACKUPS,
    MAX_READ_BYTES,
    MISSING_EXIT,
    READ,
    TAIL,
    TOO_BIG_EXIT,
    replace_undecodable,
)
from spark_ops.remote.transport import Connector, Result
from spark_ops.remote.writes import FileWrite, WriteOutcome, run_or_error

T = TypeVar("T")


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
        self._jump: Any = None
        self._jump_lock = asyncio.Lock()
        self._jump_error: SparkOpsError | None = None
        self._distinct: set[tuple[str, str]] = set()  # node pairs sharing a key, two machines
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

        async def attempt(node: Node) -> None:
            """One connect under the cap, recording the error of a failed one."""
            async with sem:
                start = time.monotonic()
                try:
                    conn = await self._new_connector(node)
                    await conn.connect()
                except SparkOpsError as exc:
                    self.errors[node.name] = exc
                    raise
            self.latency[node.name] = time.monotonic() - start
            self.errors.pop(node.name, None)
            self.connectors[node.name] = conn

        async def one(node: Node) -> None:
            """Connect one node, retrying drops before login (the pause outside the cap)."""
            log = get_logger(host=node.name)
            with suppress(SparkOpsError):  # kept in self.errors
                async for tried in retrying(
                    CONNECT_RETRIES + 1, (0.05, 0.25), transient, log, "connection dropped"
                ):
                    with tried:
                        if node.name not in self.connectors:
                            await attempt(node)

        await asyncio.gather(*(one(n) for n in nodes))
        await self._refuse_one_machine_twice()
        failed = [self.errors[n.name] for n in nodes if n.name in self.errors]
        if failed and required:
            distinct = list({e.message: e for e in failed}.values())  # one jump host failing
            if len(distinct) == 1:
                raise distinct[0]
            raise ConnectError(
                ",".join(e.host for e in distinct if isinstance(e, RemoteError)),
                "; ".join(e.message for e in distinct),
                hint=distinct[0].hint,
            )

    async def _refuse_one_machine_twice(self) -> None:
        """Refuse two connected nodes that are one machine: the same host key and boot id.

        Such an inventory would write the recipe there twice (its newest backup then holds the
        new content) and count one machine as two. A shared key with different boot ids is a
        cloned image, two machines: warned about, not refused.
        """
        first: dict[str, str] = {}
        for node in self.cluster.nodes:  # inventory order: the earlier name is named first
            conn = self.connectors.get(node.name)
            key = conn.host_key() if conn is not None else None
            if key is None:
                continue
            other = first.setdefault(key, node.name)
            if other == node.name or (other, node.name) in self._distinct:
                continue
            boots = [await self._boot_id(n) for n in (other, node.name)]
            if boots[0] is not None and boots[1] is not None and boots[0] != boots[1]:
                self._distinct.add((other, node.name))
                self.log.warning(
                    "two nodes share one SSH host key (a cloned image?): regenerate one's keys",
                    nodes=[other, node.name], host_key=key,
                )  # fmt: skip
                continue
            a, b = self.cluster.node(other), node
            raise InventoryError(
                f"{self.cluster.source}: nodes {other} ({a.host}:{a.port}) and {node.name} "
                f"({b.host}:{b.port}) of cluster {self.cluster.name!r} are one machine: both "
                f"answer with SSH host key {key} and the same boot id; spark-ops would write its "
                "files there twice and count one machine as two; nothing was read or written",
                hint=f"remove one of them from the inventory, or correct {node.name}'s host/port",
            )

    async def _boot_id(self, host: str) -> str | None:
        """The node's kernel boot id (one per running machine), None when it cannot be read."""
        cmd = "cat /proc/sys/kernel/random/boot_id"
        res = await run_or_error(self, host, cmd, "read the boot id", sudo=False)
        return (res.stdout.strip() or None) if isinstance(res, Result) else None

    async def _new_connector(self, node: Node) -> Connector:
        """A connector for node; with ssh.jump, tunnelled through the one shared jump connection."""
        if not self.cluster.ssh.jump or self._factory is not SSHConnector:
            return self._factory(node, self.cluster.ssh)
        async with self._jump_lock:
            if self._jump_error is not None:
                raise self._jump_error
            if self._jump is None:
                try:
                    self._jump = await open_jump(self.cluster.ssh)
                except SparkOpsError as exc:
                    if not transient(exc):
                        self._jump_error = exc  # the same answer for every node, asked once
                    raise
        return SSHConnector(node, self.cluster.ssh, tunnel=self._jump)

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
            return f"sudo -n sh -c {quote_word(command)}"
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
        label: str | None = None,
        raw: bool = False,
    ) -> Result:
        """Run one command on one node with a timeout; `label` names it in errors.

        The command and its input must be text the node can receive (UTF-8, no NUL): a value that
        is not is refused here, before anything runs. Output that is not UTF-8 reaches the caller
        with U+FFFD in place of each bad byte, or (`raw`) as surrogate escapes.
        """
        limit = timeout if timeout is not None else self.cluster.ssh.command_timeout
        check_text(label or "remote command", command, max_bytes=None)
        if input is not None:
            check_text(f"{label or 'remote command'}: input", input, max_bytes=None)
        cmd = self._wrap(host, command, sudo)
        self.log.debug("run", host=host, command=label or cmd[:200])
        try:
            result = await self.connector(host).run(cmd, input=input, timeout=limit)
        except CommandTimeout as exc:
            if not label:
                raise
            # named as the caller names it (the restart command, not the program running it)
            raise CommandTimeout(
                host, f"command timed out after {limit:.0f}s: {one_line(label, 120)}"
            ) from exc
        if not raw:
            result.stdout = replace_undecodable(result.stdout)
            result.stderr = replace_undecodable(result.stderr)
        if label:
            result.command = label
        return result.check() if check else result

    async def call(
        self,
        host: str,
        program: RemoteProgram[T],
        *args: str | int,
        input: str | None = None,
        sudo: bool = False,
        label: str | None = None,
        check: bool = False,
        raw: bool = False,
    ) -> T:
        """Run a RemoteProgram with its arguments on one node, by its deadline; its parsed output.

        `check` raises CommandError on a non-zero exit before the parser sees the result.
        """
        res = await self.run(
            host,
            program.line(*args),
            input=input,
            timeout=program.deadline,
            check=check,
            sudo=sudo,
            label=label,
            raw=raw,
        )
        return program.parse(res)

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

    async def read_file(
        self, host: str, path: str, *, sudo: bool = False, max_bytes: int = MAX_READ_BYTES
    ) -> str | None:
        """Read a remote UTF-8 text file whole; None when it does not exist.

        A file over max_bytes is refused before it is sent, and one that is not UTF-8 is refused
        naming the first bad byte: nothing later sees a half-decoded text.
        """
        res = await self.run(
            host,
            READ.line(path, max_bytes),
            check=False,
            sudo=sudo,
            label=f"read {path}",
            raw=True,
        )
        if res.exit_code == MISSING_EXIT:
            return None
        if res.exit_code == TOO_BIG_EXIT:
            size = res.stdout.strip()
            raise RemoteError(
                host,
                f"{path}: {size} bytes, more than the {max_bytes:,} bytes spark-ops reads whole; "
                "nothing read",
                hint="a recipe is a few kilobytes: check that the path names the right file",
            )
        res.check()
        bad = next((i for i, ch in enumerate(res.stdout) if "\udc80" <= ch <= "\udcff"), None)
        if bad is not None:
            byte = ord(res.stdout[bad]) - 0xDC00
            offset = len(res.stdout[:bad].encode("utf-8", "surrogateescape"))
            raise RemoteError(
                host,
                f"{path}: not UTF-8 text (byte 0x{byte:02x} at offset {offset}); nothing read",
                hint="re-save the file as UTF-8",
            )
        return res.stdout

    async def read_tail(
        self, host: str, path: str, *, sudo: bool = False, max_bytes: int = MAX_READ_BYTES
    ) -> str | None:
        """The whole lines among the last max_bytes of a remote file that grows by lines (a
        journal); None when it does not exist. Bytes that are not UTF-8 are shown as U+FFFD: one
        odd line never hides the others."""
        res = await self.call(
            host, TAIL, path, max_bytes, sudo=sudo, label=f"read the end of {path}", raw=True
        )
        if res.exit_code == MISSING_EXIT:
            return None
        res.check()
        size, _, text = res.stdout.partition("\n")
        if size.strip().isdigit() and int(size) > max_bytes:
            # max_bytes + 1 bytes came: up to the first newline is a cut line (or, when that byte
            # is the newline before a line, nothing but it)
            text = text.partition("\n")[2]
        return replace_undecodable(text)

    async def backups(self, host: str, path: str, *, sudo: bool = False) -> list[str]:
        """The backups spark-ops made of path on host, oldest first (its naming rule only)."""
        res = await self.call(host, LIST_BACKUPS, path, sudo=sudo, label=f"list backups of {path}")
        return [name for name in res.stdout.split("\0") if name]

    async def stage(self, w: FileWrite) -> WriteOutcome:
        """Stage one write: a synced temp file beside its target (remote/writes.py)."""
        return await atomic.stage(self, w)

    async def commit(self, w: FileWrite, staged: WriteOutcome) -> WriteOutcome:
        """Rename one staged write over its target, compare-and-swap (remote/writes.py)."""
        return await atomic.commit(self, w, staged)

    async def discard(self, host: str, staged_path: str) -> str | None:
        """Remove a staged temp file; the reason it could not be, or None when it is gone."""
        return await atomic.discard(self, host, staged_path)

    async def discard_run(self, host: str, path: str, run: str) -> list[str]:
        """Remove the staged files a dead run left beside path's target (remote/writes.py)."""
        return await atomic.discard_run(self, host, path, run)

    async def write_atomic(self, writes: Sequence[FileWrite]) -> list[WriteOutcome]:
        """Write files on several nodes all-or-nothing (remote/writes.py): stage everywhere,
        then rename everywhere; undone on any failure, or WriteNotUndone names each copy."""
        return await atomic.write_atomic(self, writes)

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
        proc = await self.connector(host).process(command)
        lines: list[str] = []
        try:
            while True:
                line = await asyncio.wait_for(proc.readline(), self.cluster.ssh.command_timeout)
                if not line:
                    break
                lines.append(line.rstrip("\n"))
                if line.startswith(ready) or line.startswith("BUSY"):
                    if line.startswith("BUSY"):
                        rest = await asyncio.wait_for(proc.read(), 5)
                        lines.extend(rest.splitlines())
                    break
            yield lines
        finally:
            await proc.finish(5)

    async def close(self) -> None:
        """Close every connection."""
        conns = list(self.connectors.values())
        self.connectors.clear()
        await asyncio.gather(*(c.close() for c in conns), return_exceptions=True)
        jump, self._jump = self._jump, None
        if jump is not None:
            jump.close()
            with suppress(Exception):
                await asyncio.wait_for(jump.wait_closed(), 2)
