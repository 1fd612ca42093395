"""One connection to one node over SSH: the asyncssh implementation of remote/transport.py's
Connector, its client options (known_hosts always checked) and the shared jump connection.

This is the only module of spark-ops that imports asyncssh (inside functions, so that the CLI
starts fast).
"""

from __future__ import annotations

import asyncio
import functools
import os
import random
import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import suppress
from typing import Any

from spark_ops.account import local_account
from spark_ops.errors import (
    AuthError,
    CommandTimeout,
    ConnectError,
    HostKeyError,
    RemoteError,
    excerpt,
    one_line,
)
from spark_ops.inventory import Node, SSHSettings
from spark_ops.log import get_logger
from spark_ops.remote.transport import Connector, HeldProcess, Result

JUMP = "jump host"  # the host name errors of the shared jump connection carry
CONNECT_RETRIES = 2  # for connections dropped before login only
_PROBED_AT_IMPORT = frozenset({"oqs", "liboqs", "nettle", "libnettle", "libnettle-6"})
CHANNEL_RETRIES = 2  # for a session refused by sshd (its slots free a little after a close)
_TRANSIENT = ("Connection reset by peer", "Connection lost", "Connection closed by peer")


def retrying(
    attempts: int,
    spacing: tuple[float, float],
    retry_on: Callable[[BaseException], bool],
    log: Any,
    what: str,
) -> Any:
    """The one retry policy of the remote layer (tenacity): `attempts` tries in all, the n-th
    pause a random `spacing` span times n (jitter: N clients do not come back in step), only for
    errors `retry_on` accepts, the last error re-raised as it was; each pause logged on `log`.

    Every try has its own deadline (the connect timeout, the command's timeout), so the whole is
    bounded too: attempts x deadline + the pauses. tenacity is imported here, on first use, to
    keep it off the CLI's start-up path (like asyncssh).
    """
    import tenacity

    low, high = spacing

    def pause(state: tenacity.RetryCallState) -> float:
        """Seconds before the next try."""
        return random.uniform(low, high) * state.attempt_number

    def before_sleep(state: tenacity.RetryCallState) -> None:
        """Log the retry with its cause."""
        exc = state.outcome.exception() if state.outcome else None
        message = getattr(exc, "message", None) or str(exc)
        log.info(f"{what}: retrying", attempt=state.attempt_number, error=excerpt(message, 300))

    return tenacity.AsyncRetrying(
        stop=tenacity.stop_after_attempt(attempts),
        wait=pause,
        retry=tenacity.retry_if_exception(retry_on),
        before_sleep=before_sleep,
        reraise=True,
    )


def transient(exc: BaseException | None) -> bool:
    """True for a connection dropped before login (an sshd over MaxStartups): worth a retry."""
    if not isinstance(exc, ConnectError) or isinstance(exc, HostKeyError | AuthError):
        return False
    return any(marker in exc.message for marker in _TRANSIENT)


class SSHConnector(Connector):
    """A Connector over asyncssh: known_hosts, identity, agent, ssh config and jump host."""

    def __init__(self, node: Node, ssh: SSHSettings, *, tunnel: Any = None) -> None:
        """Keep the settings; connect later (through `tunnel`, an open jump connection, if any)."""
        super().__init__(node)
        self.ssh = ssh
        self.tunnel = tunnel
        self._conn: Any = None
        self._listeners: list[Any] = []
        self._channels: asyncio.Semaphore | None = None
        self.log = get_logger(host=node.name)

    def _options(self) -> dict[str, Any]:
        """Build asyncssh connect options from the inventory."""
        opts = client_options(self.ssh, self.node.port, self.node.user, name=self.node.name)
        if self.tunnel is not None:
            opts["tunnel"] = self.tunnel
        return opts

    async def connect(self) -> None:
        """Open the SSH connection, mapping failures to our error tree."""
        self._conn = await _connect(
            self.node.name, self.node.host, self.node.port, self.node.user, self._options()
        )
        self.log.debug("connected", port=self.node.port)

    def host_key(self) -> str | None:
        """The SHA256 fingerprint of the host key the node showed in the key exchange."""
        key = self._conn.get_server_host_key() if self._conn is not None else None
        return str(key.get_fingerprint("sha256")) if key is not None else None

    def _channel_cap(self) -> asyncio.Semaphore:
        """The per-connection cap on concurrent command channels (ssh.max_channels)."""
        if self._channels is None:
            self._channels = asyncio.Semaphore(self.ssh.max_channels)
        return self._channels

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
        stdin: dict[str, Any] = {"input": input} if input else {"stdin": asyncssh.DEVNULL}
        try:
            async with self._channel_cap():
                # sshd frees a session slot a little after the client saw it close: a refused
                # channel is tried again while the connection itself is alive
                async for attempt in retrying(
                    CHANNEL_RETRIES + 1,
                    (0.05, 0.2),
                    lambda e: (
                        isinstance(e, asyncssh.ChannelOpenError) and not _connection_gone(conn, e)
                    ),
                    self.log,
                    "session refused by sshd",
                ):
                    with attempt:
                        proc = await asyncio.wait_for(
                            conn.run(
                                command,
                                check=False,
                                timeout=timeout,
                                errors="surrogateescape",  # a bad byte never ends the read
                                **stdin,
                            ),
                            timeout + 5,
                        )
        except (asyncssh.TimeoutError, asyncio.TimeoutError) as exc:
            raise CommandTimeout(
                self.node.name, f"command timed out after {timeout:.0f}s: {one_line(command, 120)}"
            ) from exc
        except asyncssh.ChannelOpenError as exc:
            if _connection_gone(conn, exc):
                raise ConnectError(
                    self.node.name, f"connection lost running a command: {exc.reason}"
                ) from exc
            raise RemoteError(
                self.node.name,
                f"the node's sshd refused a new session ({exc.reason})",
                hint=f"ssh.max_channels ({self.ssh.max_channels}) must stay below the node's "
                "sshd MaxSessions (default 10), counting the lock and log channels",
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
            proc = await conn.create_process(command, stderr=asyncssh.DEVNULL, errors="replace")
        except (asyncssh.Error, OSError) as exc:
            raise ConnectError(self.node.name, f"cannot start {command[:80]}: {exc}") from exc
        try:
            async for line in proc.stdout:
                yield line.rstrip("\n")
        finally:
            proc.close()
            with suppress(Exception):
                await asyncio.wait_for(proc.wait_closed(), 2)

    async def process(self, command: str) -> HeldProcess:
        """Start a command with open stdin/stdout over one SSH channel."""
        import asyncssh

        try:
            proc = await self._require().create_process(command, errors="replace")
        except (asyncssh.Error, OSError) as exc:
            raise ConnectError(self.node.name, f"cannot start {command[:80]}: {exc}") from exc
        return _SSHHeld(proc)

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


class _SSHHeld(HeldProcess):
    """An asyncssh process as a HeldProcess."""

    def __init__(self, proc: Any) -> None:
        """Wrap a started asyncssh SSHClientProcess."""
        self.proc = proc

    async def readline(self) -> str:
        """The next stdout line."""
        return str(await self.proc.stdout.readline())

    async def read(self) -> str:
        """The rest of stdout."""
        return str(await self.proc.stdout.read())

    async def finish(self, timeout: float) -> None:
        """End of input, wait, close the channel (each step bounded, none raising)."""
        with suppress(Exception):
            self.proc.stdin.write_eof()
            await asyncio.wait_for(self.proc.wait(), timeout)
        self.proc.close()
        with suppress(Exception):
            await asyncio.wait_for(self.proc.wait_closed(), 3)


def _connection_gone(conn: Any, exc: Exception) -> bool:
    """True when a channel could not open because the connection itself is closed.

    sshd refuses a session past MaxSessions with the same code (connect failed, "open failed")
    as asyncssh uses for a lost connection; the connection's own state tells them apart.
    """
    closed = getattr(conn, "is_closed", None)
    return bool(closed()) if callable(closed) else getattr(exc, "reason", "").endswith("closed")


DEFAULT_KNOWN_HOSTS = "~/.ssh/known_hosts"


def known_hosts_file(ssh: SSHSettings) -> str:
    """The known_hosts file host keys are checked against: the inventory's, else ~/.ssh's."""
    return os.path.expanduser(ssh.known_hosts or DEFAULT_KNOWN_HOSTS)


def client_options(
    ssh: SSHSettings, port: int, user: str | None, *, name: str = JUMP
) -> dict[str, Any]:
    """asyncssh connect options from the inventory's ssh settings, for a node or the jump host.

    Host keys are always checked against one named file (the inventory's `ssh.known_hosts`, else
    ~/.ssh/known_hosts): an ssh config's `UserKnownHostsFile none` or `StrictHostKeyChecking no`
    cannot turn checking off. Only `ssh.insecure_no_host_key_check` does, loudly warned.
    """
    opts: dict[str, Any] = {
        "port": port,
        "connect_timeout": ssh.connect_timeout,
        "keepalive_interval": 15,
        "keepalive_count_max": 4,
    }
    # As OpenSSH does, the default login is the account's name from the password database, not
    # $LOGNAME (which anyone can set to anything); asyncssh's own default reads $LOGNAME.
    account = local_account()
    opts["username"] = user or account
    opts["client_username"] = account
    if ssh.insecure_no_host_key_check:
        opts["known_hosts"] = None
    else:
        path = known_hosts_file(ssh)
        if not os.path.isfile(path):
            raise HostKeyError(
                name,
                f"known_hosts file {path} does not exist: host keys cannot be checked",
                hint=f"check each node's key fingerprint, then add it: ssh-keyscan -p {port} "
                f"HOST >> {path}; or name another file in ssh.known_hosts",
            )
        if not os.access(path, os.R_OK):
            raise HostKeyError(
                name,
                f"known_hosts file {path} cannot be read: host keys cannot be checked",
                hint="check its permissions, or name another file in ssh.known_hosts",
            )
        opts["known_hosts"] = known_hosts_arg(path)
    if ssh.identity:
        opts["client_keys"] = [os.path.expanduser(p) for p in ssh.identity]
    if not ssh.agent:
        opts["agent_path"] = None
    if ssh.config:
        config = os.path.expanduser(ssh.config)
        if os.path.isdir(config) or not os.access(config, os.R_OK):
            raise ConnectError(
                name,
                f"the SSH config file {config} (ssh.config) cannot be read: "
                + ("it does not exist" if not os.path.exists(config) else "not a readable file"),
                hint="fix its permissions, or name another file in ssh.config (or remove the key)",
            )
        opts["config"] = [config]
    return opts


@functools.lru_cache(maxsize=2)
def _parse_known_hosts(text: str) -> Any:
    """asyncssh's SSHKnownHosts for a known_hosts content, parsed once per content."""
    return load_asyncssh().import_known_hosts(text)


def known_hosts_arg(path: str) -> Any:
    """The known_hosts file parsed once per content, for every connection of this process.

    Given a path, asyncssh reads and parses the whole file on each connect, so N nodes listed in
    one file cost N x N key parses (1,056 at 32 nodes). The file is still read on every call, so
    an edit is seen at once; only its parse is shared. A file that cannot be read or parsed here
    is passed on as the path, and the connection reports it as before.
    """
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError:
        return path
    try:
        return _parse_known_hosts(text)
    except ValueError:
        return path


def load_asyncssh() -> Any:
    """Import asyncssh, its probes for liboqs and nettle asking the linker cache only.

    At import asyncssh looks for liboqs and libnettle with `ctypes.util.find_library`, which on
    Linux runs `ldconfig -p` and then, for a name the cache lacks, `gcc` and `ld`: ~35 ms of a
    0.35 s `spark-ops exec` without liboqs (docs/performance.md). A library installed where the
    dynamic linker finds it is in ldconfig's cache, so the cache alone gives the same answer.
    With LD_LIBRARY_PATH or LIBRARY_PATH set (a library outside the cache), the stock search runs.
    """
    if "asyncssh" in sys.modules:
        return sys.modules["asyncssh"]
    import ctypes.util

    original = ctypes.util.find_library
    from_cache = getattr(ctypes.util, "_findSoname_ldconfig", None)
    custom_paths = os.environ.get("LD_LIBRARY_PATH") or os.environ.get("LIBRARY_PATH")
    if from_cache is None or custom_paths or not sys.platform.startswith("linux"):
        import asyncssh

        return asyncssh

    def find_library(name: str) -> str | None:
        """The linker cache's answer for asyncssh's probes; the stock search for the rest."""
        return from_cache(name) if name in _PROBED_AT_IMPORT else original(name)

    ctypes.util.find_library = find_library
    try:
        import asyncssh
    finally:
        ctypes.util.find_library = original
    return asyncssh


async def _connect(name: str, host: str, port: int, user: str | None, opts: dict[str, Any]) -> Any:
    """asyncssh.connect with its failures mapped to our error tree, naming `name`."""
    asyncssh = load_asyncssh()

    try:
        return await asyncssh.connect(host, **opts)
    except asyncssh.HostKeyNotVerifiable as exc:
        raise HostKeyError(
            name,
            f"host key of {host}:{port} not verified ({exc.reason})",
            hint="check the node's key, then add it to the known_hosts file of the inventory",
        ) from exc
    except asyncssh.PermissionDenied as exc:
        raise AuthError(
            name,
            f"authentication refused for user {user or '(default)'} ({exc.reason})",
            hint="check ssh.identity / the agent and the node's authorized_keys",
        ) from exc
    except asyncssh.DisconnectError as exc:
        raise ConnectError(name, f"disconnected while connecting: {exc.reason}") from exc
    except (OSError, asyncio.TimeoutError, asyncssh.Error) as exc:
        detail = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
        raise ConnectError(name, f"cannot connect to {host}:{port}: {detail}") from exc
    except ValueError as exc:  # a login name SSH cannot carry (asyncssh's SASLprep refuses it)
        login = user if user is not None else local_account()
        source = "" if user is not None else " (no ssh.user set: this account's name)"
        raise AuthError(
            name,
            f"user name {excerpt(login)}{source} cannot be sent over SSH: {exc}",
            hint="set ssh.user (or the node's user) in the inventory",
        ) from None


async def open_jump(ssh: SSHSettings) -> Any:
    """One connection to the inventory's jump host (same keys and known_hosts as the nodes).

    Every node's connection is then tunnelled through it: one key exchange and one sshd session
    on the jump host for the whole cluster, instead of one per node (its MaxStartups stays far).
    """
    target = ssh.jump_target()
    if target is None:
        raise ConnectError(JUMP, "no ssh.jump in the inventory")
    user, host, port = target
    login = user or ssh.user
    conn = await _connect(JUMP, host, port, login, client_options(ssh, port, login))
    get_logger(host=JUMP).debug("connected", jump=ssh.jump)
    return conn
