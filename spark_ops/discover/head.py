"""What every look around the head shares: the session and options it looks with, the findings
and inventory values it collects, read-only programs run on the head, and a path as the
inventory writes it (~/... under the remote home)."""

from __future__ import annotations

from typing import Any

from spark_ops.discover.options import Finding, InitOptions
from spark_ops.remote import ClusterSession, RemoteProgram, Result
from spark_ops.remote.programs.discover import TEST_PATH


def tilde(path: str, home: str) -> str:
    """Write a path under the remote home as ~/…"""
    home = home.rstrip("/")
    if home and (path == home or path.startswith(home + "/")):
        return "~" + path[len(home) :]
    return path


def api_url(args: dict[str, Any]) -> str:
    """http://HOST:PORT from recipe flags (0.0.0.0 and unset mean loopback on the head)."""
    host = str(args.get("--host") or "127.0.0.1")
    if host in ("0.0.0.0", "::", ""):
        host = "127.0.0.1"
    port = str(args.get("--port") or "8000")
    return f"http://{host}:{port}"


class HeadProbe:
    """The findings and values of a look around the head (Discovery's base, as its watchdog
    finder's)."""

    def __init__(self, session: ClusterSession, opts: InitOptions) -> None:
        """Bind to a session whose nodes are connected (or have errors recorded)."""
        self.session = session
        self.opts = opts
        self.cluster = session.cluster
        self.head = self.cluster.head.name
        self.findings: list[Finding] = []
        self.values: dict[str, Any] = {}
        self.home = ""

    def found(self, key: str, value: Any, detail: str) -> None:
        """Record something found and the value to write."""
        self.values[key] = value
        self.findings.append(Finding(key, "found", value, detail))

    def missing(self, key: str, detail: str) -> None:
        """Record something not found (a TODO line)."""
        self.findings.append(Finding(key, "missing", None, detail))

    def warn(self, key: str, detail: str, value: Any = None) -> None:
        """Record a warning (written, but worth a look)."""
        self.findings.append(Finding(key, "warn", value, detail))

    async def sh(
        self, program: RemoteProgram[Result], *args: str, host: str | None = None
    ) -> tuple[bool, str]:
        """Run a read-only program on the head (or host); (exit 0, stdout)."""
        res = await self.session.call(host or self.head, program, *args)
        return res.ok, res.stdout

    async def exists(self, path: str, host: str | None = None, test: str = "-f") -> bool:
        """Whether a path exists on a node (`test -f` by default)."""
        return await self.session.call(host or self.head, TEST_PATH, test, path)

    def _path(self, value: Any) -> str:
        """A path written as ~/… when under the remote home."""
        return tilde(str(value), self.home)
