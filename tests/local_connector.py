"""A second, real transport for tests: commands run by this machine's sh, in a node's own HOME.

It implements the Connector base class only (no SSH anywhere), so a test that holds the cluster
lock through it shows that the lock needs nothing but the base class.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import AsyncIterator
from contextlib import suppress
from pathlib import Path

from spark_ops.errors import CommandTimeout, RemoteError
from spark_ops.inventory import Node, SSHSettings
from spark_ops.remote import Connector, HeldProcess, Result


class _LocalHeld(HeldProcess):
    """A local sh process with its stdin open."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        """Wrap a started process."""
        self.proc = proc

    async def readline(self) -> str:
        """The next stdout line."""
        assert self.proc.stdout is not None
        return (await self.proc.stdout.readline()).decode("utf-8", "replace")

    async def read(self) -> str:
        """The rest of stdout."""
        assert self.proc.stdout is not None
        return (await self.proc.stdout.read()).decode("utf-8", "replace")

    async def finish(self, timeout: float) -> None:
        """Close stdin, wait; kill the group if it outstays timeout."""
        assert self.proc.stdin is not None
        with suppress(Exception):
            self.proc.stdin.close()
        try:
            await asyncio.wait_for(self.proc.wait(), timeout)
        except asyncio.TimeoutError:
            self.kill()
            await self.proc.wait()

    def kill(self) -> None:
        """SIGKILL the command's process group (a holder dying)."""
        with suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)


class LocalConnector(Connector):
    """Runs a node's commands with this machine's sh, HOME set to that node's directory."""

    def __init__(self, node: Node, ssh: SSHSettings, *, home: Path) -> None:
        """Remember the node and its HOME."""
        super().__init__(node)
        self.env = {**os.environ, "HOME": str(home)}
        self.held: list[_LocalHeld] = []

    async def connect(self) -> None:
        """Nothing to open."""

    async def _start(self, command: str) -> asyncio.subprocess.Process:
        """Start sh -c command in its own session."""
        return await asyncio.create_subprocess_exec(
            "sh", "-c", command, env=self.env, start_new_session=True,
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip

    async def run(self, command: str, *, input: str | None = None, timeout: float) -> Result:
        """Run to completion with a deadline."""
        start = time.monotonic()
        proc = await self._start(command)
        try:
            out, err = await asyncio.wait_for(
                proc.communicate(input.encode() if input else None), timeout
            )
        except asyncio.TimeoutError:
            with suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()
            raise CommandTimeout(
                self.node.name, f"command timed out after {timeout:.0f}s"
            ) from None
        return Result(
            self.node.name, command, proc.returncode, out.decode("utf-8", "replace"),
            err.decode("utf-8", "replace"), time.monotonic() - start,
        )  # fmt: skip

    async def stream(self, command: str) -> AsyncIterator[str]:
        """Yield stdout lines; closing stops the command."""
        proc = await self._start(command)
        assert proc.stdout is not None
        try:
            async for line in proc.stdout:
                yield line.decode("utf-8", "replace").rstrip("\n")
        finally:
            with suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()

    async def process(self, command: str) -> HeldProcess:
        """Start a command with its stdin held open."""
        held = _LocalHeld(await self._start(command))
        self.held.append(held)
        return held

    async def forward(self, dest_host: str, dest_port: int) -> int:
        """A local node needs no tunnel: refused, naming why."""
        raise RemoteError(self.node.name, "a local connector opens no tunnels")

    async def close(self) -> None:
        """Stop whatever is still held."""
        for held in self.held:
            held.kill()
