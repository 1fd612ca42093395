"""ClusterSession: the nodes of one cluster, connected once, with per-host results and errors."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass
from typing import Any, TypeVar

from spark_ops.errors import (
    ConnectError,
    FileChanged,
    InventoryError,
    RemoteError,
    SparkOpsError,
    WriteError,
    WriteNotUndone,
)
from spark_ops.inventory import Cluster, Node, SSHSettings
from spark_ops.log import get_logger
from spark_ops.remote.connector import (
    CONNECT_RETRIES,
    Connector,
    Result,
    SSHConnector,
    open_jump,
    retrying,
    transient,
)
from spark_ops.remote.program import RemoteProgram, check_text
from spark_ops.remote.quoting import quote_word
from spark_ops.remote.shell import (
    COMMIT,
    DIGEST,
    LIST_BACKUPS,
    MAX_READ_BYTES,
    MISMATCH_EXIT,
    MISSING_EXIT,
    NO_ROOM_EXIT,
    READ,
    REMOVE,
    STAGE,
    TAIL,
    TOO_BIG_EXIT,
    UNDO,
    UNREPLACEABLE_EXIT,
    replace_undecodable,
    sha256,
)

T = TypeVar("T")
OLD_STATE = "its old content"  # a copy's state after a failed undo: as before the write


def _staged(out: WriteOutcome | SparkOpsError) -> WriteOutcome:
    """A staging outcome known to have succeeded."""
    assert isinstance(out, WriteOutcome)
    return out


async def _run_or_error(
    session: ClusterSession, host: str, command: str, label: str, *, sudo: bool = True
) -> Result | SparkOpsError:
    """Run a command (as root where the inventory says); its error returned, not raised."""
    try:
        return await session.run(host, command, sudo=sudo, label=label)
    except SparkOpsError as exc:
        return exc


def _with_leftovers(exc: SparkOpsError, left: Sequence[str]) -> SparkOpsError:
    """Add to an error the staged files that could not be removed (the next write removes them
    after 10 minutes)."""
    if left:
        exc.message += (
            f"; staged file(s) left: {', '.join(left)} (the next write removes them after 10 "
            "minutes, or remove them by hand)"
        )
    return exc


@dataclass(frozen=True)
class FileWrite:
    """One atomic write to do: content for a path on a node, guarded by the old content's digest."""

    host: str
    path: str
    content: str
    expected_sha: str | None = None  # None: any current content (or none) is accepted
    keep_backups: int = 5
    label: str = ""  # appended to the backup's name: ROLLED_BACK for a rollback's write


@dataclass
class WriteOutcome:
    """Where a write landed and where the previous content was kept."""

    host: str
    path: str
    backup: str | None
    staged: str | None = None
    target: str | None = None  # the file renamed over: path, or its symlink's target
    old_sha: str | None = None  # the digest staging found there ("absent": no file)

    def to_dict(self) -> dict[str, Any]:
        """Serialize for reports."""
        return {"host": self.host, "path": self.path, "backup": self.backup}


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
        res = await _run_or_error(self, host, cmd, "read the boot id", sudo=False)
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
        result = await self.connector(host).run(cmd, input=input, timeout=limit)
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
        """Write content to a synced temp file beside the target, if the target is unchanged.

        Also rules out, before any node renames, what would make this node's rename or its undo
        fail: an immutable or append-only file or directory, no room to copy the old content back.
        """
        check_text(f"{w.host}:{w.path}: new content", w.content, max_bytes=MAX_READ_BYTES)
        expected = "-" if w.expected_sha is None else w.expected_sha
        cmd = STAGE.line(w.path, expected, sha256(w.content))
        res = await self.run(
            w.host, cmd, input=w.content, check=False, sudo=True, label=f"stage {w.path}"
        )
        if res.exit_code == MISMATCH_EXIT:
            raise FileChanged(
                w.host, w.path, expected, res.stdout.strip(), when="since it was read", undone=""
            )
        if res.exit_code in (UNREPLACEABLE_EXIT, NO_ROOM_EXIT) or "No space left" in res.stderr:
            why = (res.stderr.strip().splitlines() or [f"exit {res.exit_code}"])[-1]
            fix = (
                "make room on that filesystem"
                if res.exit_code != UNREPLACEABLE_EXIT
                else "if the file is meant to change, `chattr -i` it (and its directory)"
            )
            raise WriteError(
                w.host,
                f"{w.path}: cannot be written: {why}; nothing written on any node",
                hint=f"on {w.host}, {fix}; then run the command again",
            )
        res.check()
        staged, target, seen = [*res.stdout.split("\0"), "", ""][:3]
        return WriteOutcome(
            w.host, w.path, None, staged=staged, target=target or w.path, old_sha=seen or None
        )

    async def commit(self, w: FileWrite, staged: WriteOutcome) -> WriteOutcome:
        """Back up the target, check it is still what staging saw, rename the staged file over it.

        The digest is checked on the node just before the rename (compare-and-swap); what stays
        open is the time from that check to the rename itself (docs/reliability.md).
        """
        assert staged.staged and staged.target
        keep = max(w.keep_backups, 1)
        old = staged.old_sha or w.expected_sha or "-"
        cmd = COMMIT.line(w.path, staged.staged, staged.target, keep, w.label, old)
        res = await self.run(w.host, cmd, check=False, sudo=True, label=f"rename over {w.path}")
        fields = dict(f.partition("=")[::2] for f in res.stdout.split("\0") if "=" in f)
        if res.exit_code == MISMATCH_EXIT and "found" in fields:
            raise FileChanged(
                w.host, w.path, old, fields["found"], when="while spark-ops was writing it",
                undone=" on any node",
            )  # fmt: skip
        if res.exit_code == MISMATCH_EXIT:
            raise RemoteError(w.host, f"{res.stderr.strip()}; nothing written")
        res.check()
        return WriteOutcome(w.host, w.path, fields.get("backup"), target=staged.target, old_sha=old)

    async def discard(self, host: str, staged_path: str) -> str | None:
        """Remove a staged temp file; the reason it could not be, or None when it is gone."""
        try:
            await self.call(host, REMOVE, staged_path, sudo=True, check=True)
        except SparkOpsError as exc:
            return exc.message
        return None

    async def write_atomic(self, writes: Sequence[FileWrite]) -> list[WriteOutcome]:
        """Write files on several nodes all-or-nothing: stage everywhere, then rename everywhere.

        On any failure every staged file is removed and the renamed copies are put back; when
        that cannot be done the error is a WriteNotUndone naming every copy's state, and its
        `written` lists the copies left changed.
        """
        staged = await self.gather(
            [str(i) for i in range(len(writes))], lambda i: self.stage(writes[int(i)])
        )
        failures = [v for v in staged.values() if isinstance(v, SparkOpsError)]
        if failures:
            left = await self._discard(writes, staged, range(len(writes)))
            raise _with_leftovers(failures[0], left)
        # every node staged: the renames run concurrently (each is checked and undone alone)
        committed = await self.gather(
            [str(i) for i in range(len(writes))],
            lambda i: self.commit(writes[int(i)], _staged(staged[i])),
        )
        done = {int(i): v for i, v in committed.items() if isinstance(v, WriteOutcome)}
        failed = [int(i) for i, v in committed.items() if isinstance(v, SparkOpsError)]
        if failed:
            cause = committed[str(failed[0])]
            assert isinstance(cause, SparkOpsError)
            await self._undo(writes, staged, done, failed, cause)
            raise cause
        return [done[n] for n in range(len(writes))]

    async def _discard(
        self,
        writes: Sequence[FileWrite],
        staged: dict[str, WriteOutcome | SparkOpsError],
        which: Iterable[int],
    ) -> list[str]:
        """Remove the staged files of the given writes; "host: path (why)" for each one left."""
        left: list[str] = []
        for n in which:
            out = staged[str(n)]
            if isinstance(out, WriteOutcome) and out.staged:
                why = await self.discard(writes[n].host, out.staged)
                if why is not None:
                    left.append(f"{writes[n].host}: {out.staged} ({why})")
        return left

    async def _undo(
        self,
        writes: Sequence[FileWrite],
        staged: dict[str, WriteOutcome | SparkOpsError],
        done: dict[int, WriteOutcome],
        failed_at: Sequence[int],
        cause: SparkOpsError,
    ) -> None:
        """Renames failed (failed_at): drop the staged files not renamed, put the renamed copies
        (done, by write index) back.

        Returns when every copy holds its old content again (the caller re-raises `cause`);
        raises WriteNotUndone, naming each copy's state, when one could not be put back.
        """
        left = await self._discard(writes, staged, [n for n in range(len(writes)) if n not in done])
        failed: dict[str, str] = {}
        for n, out in sorted(done.items()):
            new = sha256(writes[n].content)
            cmd = UNDO.line(
                out.path, out.target or out.path, out.backup or "", new, out.old_sha or "-"
            )
            res = await _run_or_error(self, out.host, cmd, f"restore {out.path}")
            if isinstance(res, SparkOpsError):
                failed[f"{out.host}:{out.path}"] = res.message.removeprefix(f"{out.host}: ")
        _with_leftovers(cause, left)
        if not failed:
            return
        states = await self._states(writes, staged, done)
        lines, written = [], []
        for n, w in enumerate(writes):
            key = f"{w.host}:{w.path}"
            state = states[key]
            line = f"{key} holds {state}"
            if key in failed:
                line += f" (putting it back failed: {failed[key]})"
            renamed = n in done or (n in failed_at and not state.startswith("content"))
            if renamed and state != OLD_STATE:  # renamed by this run and not put back
                written.append(key)
            if n in done and done[n].backup:
                line += f"; its old content is in {done[n].backup}"
            lines.append(line)
        first = next(iter(failed)).split(":", 1)[0]
        reason = cause.message.split("; nothing written")[0]
        raise WriteNotUndone(
            first,
            f"the write failed ({reason}) and could not be undone on every node; the copies "
            f"may disagree: {'; '.join(lines)}",
            states=states,
            written=written,
            hint="make the copies agree by hand (move the named backup back over the file, or "
            "copy one node's file to the others), then run `spark-ops status`",
        ) from cause

    async def _states(
        self,
        writes: Sequence[FileWrite],
        staged: dict[str, WriteOutcome | SparkOpsError],
        done: dict[int, WriteOutcome],
    ) -> dict[str, str]:
        """What each copy holds now: its new content, its old, someone else's, or unknown."""

        async def one(n: int) -> str:
            """Read one copy's digest and name it."""
            w = writes[n]
            out = staged[str(n)]
            old = out.old_sha if isinstance(out, WriteOutcome) else w.expected_sha
            cmd = DIGEST.line(w.path)
            res = await _run_or_error(self, w.host, cmd, f"digest of {w.path}")
            if isinstance(res, SparkOpsError):
                return f"unknown content ({res.message})"
            found = res.stdout.strip()
            if found == sha256(w.content):
                return "the NEW content"
            if found == old:
                return OLD_STATE
            return f"content someone else wrote (sha256 {found[:12]})"

        values = await asyncio.gather(*(one(n) for n in range(len(writes))))
        return {f"{w.host}:{w.path}": v for w, v in zip(writes, values, strict=True)}

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
