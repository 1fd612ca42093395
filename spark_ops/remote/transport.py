"""What a transport to one node is: the Connector base class every transport implements (SSH in
remote/connector.py, a local shell in the tests), the HeldProcess the cluster lock runs over, and
the Result of one remote command. Nothing here speaks SSH."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncIterator
from dataclasses import dataclass

from spark_ops.errors import CommandError, RemoteError
from spark_ops.inventory import Node


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


class HeldProcess(ABC):
    """A command started with its stdin open: what the cluster lock needs of a transport.

    The command reads its stdin until end of input (the lock's holder waits on it), so the lock
    lasts exactly as long as the channel: a holder that dies closes it, and the lock frees itself.
    """

    @abstractmethod
    async def readline(self) -> str:
        """The next stdout line with its newline; "" at end of output."""

    @abstractmethod
    async def read(self) -> str:
        """The rest of stdout, up to end of output."""

    @abstractmethod
    async def finish(self, timeout: float) -> None:
        """Close stdin (the command then ends), wait for it up to timeout, release the channel."""


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

    async def process(self, command: str) -> HeldProcess:
        """Start a command with its stdin held open (the cluster lock runs over this).

        A transport that cannot keep a command's stdin open says so here, naming itself: the
        lock never falls back to a weaker form (a lock file without a live holder is stale).
        """
        raise RemoteError(
            self.node.name,
            f"the {type(self).__name__} transport cannot hold a command with open stdin, so it "
            "cannot hold the cluster lock",
            hint="reach the head over SSH (the default connector)",
        )

    @abstractmethod
    async def forward(self, dest_host: str, dest_port: int) -> int:
        """Forward a local loopback port to dest_host:dest_port as seen from the node."""

    @abstractmethod
    async def close(self) -> None:
        """Close the connection."""

    def host_key(self) -> str | None:
        """The SHA256 fingerprint of the host key the node answered with (None: no such key)."""
        return None
