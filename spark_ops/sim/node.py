"""A simulated cluster node: an asyncssh server that runs commands in a real bash with its own file
tree.

Each node has a home directory (its file tree), its own host key, key-only authentication and, for
worker nodes, a "raylet" TCP listener that the simulated engine on the head must reach for the boot
to proceed.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncssh

from spark_ops.log import get_logger
from spark_ops.sim import RAYLET_PORT_ENV


@dataclass
class NodeSpec:
    """What a simulated node needs: name, role, home, keys and environment."""

    name: str
    role: str
    home: Path
    host_key: Path
    authorized_keys: Path
    env: dict[str, str] = field(default_factory=dict)
    port: int = 0
    raylet_port: int = 0
    netns: str | None = None  # a worker's commands run in this network namespace (test ground)


class _NodeServer(asyncssh.SSHServer):
    """Key-only auth; port forwarding allowed to loopback only; connections known to the node."""

    def __init__(self, node: SimNode) -> None:
        """Remember the node, which closes our connection when it is taken down."""
        self.node = node
        self.conn: Any = None

    def connection_made(self, conn: Any) -> None:
        """Track the connection."""
        self.conn = conn
        self.node._conns.add(conn)

    def connection_lost(self, exc: Exception | None) -> None:
        """Forget the connection."""
        self.node._conns.discard(self.conn)

    def connection_requested(
        self, dest_host: str, dest_port: int, orig_host: str, orig_port: int
    ) -> bool:
        """Allow tunnels to the node's own loopback services (the engine API)."""
        return dest_host in ("127.0.0.1", "localhost", "::1")

    def password_auth_supported(self) -> bool:
        """Passwords are never accepted."""
        return False


class SimNode:
    """One running simulated node: its SSH server and (for workers) its raylet listener."""

    def __init__(self, spec: NodeSpec) -> None:
        """Prepare the node; start() opens its ports."""
        self.spec = spec
        self._server: Any = None
        self._raylet: asyncio.AbstractServer | None = None
        self._procs: set[asyncio.subprocess.Process] = set()
        self._peers: set[asyncio.StreamWriter] = set()
        self._conns: set[Any] = set()
        self.log = get_logger(host=spec.name)

    @property
    def running(self) -> bool:
        """True while the SSH server is up."""
        return self._server is not None

    def env(self) -> dict[str, str]:
        """The environment commands on this node see."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("SSH_")}
        home = str(self.spec.home)
        env.update(self.spec.env)
        env.update(self.user_environment())
        env.update(
            HOME=home,
            USER=os.environ.get("USER", "ops"),
            SHELL=shutil.which("bash") or "/bin/bash",  # the shell it runs commands in (sshd's)
            SPARK_SIM_NODE=self.spec.name,
            **{RAYLET_PORT_ENV: str(self.spec.raylet_port)},
            PATH=f"{home}/bin:{env.get('PATH', '/usr/bin:/bin')}",
        )
        return env

    def user_environment(self) -> dict[str, str]:
        """`~/.ssh/environment` (`NAME=value` lines), read as OpenSSH's PermitUserEnvironment."""
        try:
            text = (self.spec.home / ".ssh" / "environment").read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            return {}
        pairs = (line.split("=", 1) for line in text.splitlines() if "=" in line)
        return {k: v for k, v in pairs if k and not k.startswith("#")}

    async def _handle(self, process: asyncssh.SSHServerProcess) -> None:
        """Run the requested command in bash inside the node's home, piping the channel to it."""
        command = process.command
        if not command:
            process.stderr.write(b"this node accepts commands only, no interactive shell\n")
            process.exit(1)
            return
        netns = ["ip", "netns", "exec", self.spec.netns] if self.spec.netns else []
        proc = await asyncio.create_subprocess_exec(
            *netns,
            "bash",
            "-c",
            command,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            cwd=self.spec.home,
            env=self.env(),
            start_new_session=True,
        )
        self._procs.add(proc)

        async def pump_out(reader: asyncio.StreamReader | None, writer: Any) -> None:
            """Copy a pipe of the command to the channel."""
            assert reader is not None
            while chunk := await reader.read(65536):
                writer.write(chunk)
                with suppress(Exception):
                    await writer.drain()

        async def pump_in() -> None:
            """Copy the channel's stdin to the command, closing it on EOF."""
            assert proc.stdin is not None
            try:
                while data := await process.stdin.read(65536):
                    proc.stdin.write(data)
                    await proc.stdin.drain()
            except (asyncssh.Error, OSError, BrokenPipeError, ConnectionError):
                pass
            finally:
                with suppress(Exception):
                    proc.stdin.close()

        outs = [
            asyncio.ensure_future(pump_out(proc.stdout, process.stdout)),
            asyncio.ensure_future(pump_out(proc.stderr, process.stderr)),
        ]
        feeder = asyncio.ensure_future(pump_in())
        waiter = asyncio.ensure_future(proc.wait())
        closed = asyncio.ensure_future(process.wait_closed())
        try:
            await asyncio.wait({waiter, closed}, return_when=asyncio.FIRST_COMPLETED)
            if not waiter.done():
                self._kill(proc)
                await waiter
            with suppress(Exception):
                await asyncio.wait_for(asyncio.gather(*outs), 5)
            rc = waiter.result()
            if not closed.done():
                process.exit(rc if rc >= 0 else 128 - rc)
        finally:
            for t in (*outs, feeder, closed):
                t.cancel()
            self._procs.discard(proc)

    @staticmethod
    def _kill(proc: asyncio.subprocess.Process) -> None:
        """Stop a command's whole process group (the channel went away)."""
        with suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)

    async def _raylet_conn(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        """Answer the engine's liveness connection and keep it until either side closes."""
        self._peers.add(writer)
        try:
            writer.write(f"raylet {self.spec.name}\n".encode())
            await writer.drain()
            await reader.read()
        except (ConnectionError, OSError):
            pass
        finally:
            self._peers.discard(writer)
            writer.close()

    async def start(self) -> None:
        """Open the SSH port (and the raylet port for workers), reusing earlier ports when set."""
        self._server = await asyncssh.create_server(
            lambda: _NodeServer(self),
            "127.0.0.1",
            self.spec.port,
            server_host_keys=[str(self.spec.host_key)],
            authorized_client_keys=str(self.spec.authorized_keys),
            process_factory=self._handle,
            encoding=None,
            allow_scp=False,
            keepalive_interval=15,
        )
        self.spec.port = self._server.sockets[0].getsockname()[1]
        await self.start_raylet()
        self.log.debug("node up", port=self.spec.port)

    async def start_raylet(self) -> None:
        """Open a worker's raylet port (its earlier port when it had one)."""
        if self.spec.role == "worker" and self._raylet is None:
            self._raylet = await asyncio.start_server(
                self._raylet_conn, "127.0.0.1", self.spec.raylet_port
            )
            self.spec.raylet_port = self._raylet.sockets[0].getsockname()[1]

    async def stop_raylet(self) -> None:
        """Stop the worker's Ray worker only (as when its container dies): SSH stays up."""
        if self._raylet is not None:
            self._raylet.close()
            self._raylet = None
        for peer in list(self._peers):
            peer.close()

    async def stop(self) -> None:
        """Take the node off the network: close its servers and stop its commands."""
        await self.stop_raylet()
        if self._server is not None:
            self._server.close()
            with suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2)
            self._server = None
        for conn in list(self._conns):  # a lost node drops its sessions too
            conn.close()
        for proc in list(self._procs):
            self._kill(proc)
