"""The red team of 2026-12-05, round 7: the fleet's live stream /events/fleet (and its neighbour
/events/cluster) against a hung cluster, a token rotated while a table is being read, and
hostile status values (docs/reliability.md, round 7). In process, the readings replaced."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from spark_ops.fleet import load_fleet
from spark_ops.serve import app as app_module
from spark_ops.serve import auth, fleetapp
from spark_ops.serve.auth import TokenSource

DEADLINE_S = 60.0  # a generous bound on one event on a loaded machine
TOKEN = "tok-" + "r7" * 16
HOSTILE = "<img src=x onerror=alert(1)>"


def _free_port() -> int:
    """A loopback port nobody listens on (the head's SSH port: nothing answers)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _fleet(tmp_path: Path) -> Any:
    """A fleet of two one-node clusters, east and west, whose heads nobody answers."""
    lines = ["clusters:"]
    for name in ("east", "west"):
        inv = tmp_path / f"{name}.yaml"
        inv.write_text(
            "clusters:\n  c:\n    ssh: {connect_timeout: 2}\n    nodes:\n"
            f"      node1: {{host: 127.0.0.1, port: {_free_port()}, role: head}}\n"
            f"    recipe: {{path: /{name}.yaml}}\n"
            f"    watchdog: {{restart_command: 'true', history_file: /{name}}}\n"
        )
        lines.append(f"  - {{name: {name}, inventory: {inv}}}")
    (tmp_path / "fleet.yaml").write_text("\n".join(lines) + "\n")
    return load_fleet(tmp_path / "fleet.yaml")


def _status(state: str = "serving", used: object = 1) -> dict[str, Any]:
    """A cluster's status document as the page reads it."""
    return {
        "nodes": [{"name": "node1", "reachable": True}], "verdict": {"state": state},
        "engine": {"up": True}, "time": time.time(),
        "budget": {"used": used, "allowed": 3, "window_s": 21600},
    }  # fmt: skip


@contextlib.asynccontextmanager
async def _served(
    tmp_path: Path, statuses: dict[str, Callable[[], Any]], audit: dict[str, Any] | None = None
) -> AsyncIterator[tuple[Any, Path]]:
    """The fleet's app in this process, each cluster's status read by `statuses[name]`; yields
    (client, the token file)."""
    from aiohttp.test_utils import TestClient, TestServer

    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    app = fleetapp.make_fleet_app(_fleet(tmp_path), TokenSource(TOKEN, token_file), ttl=0.0)
    for m, src in app[fleetapp.MEMBERS]:
        src.status.read = statuses[m.name]

        async def entries() -> dict[str, Any]:
            return audit or {"entries": []}

        src.audit.read = entries
    async with TestClient(TestServer(app)) as client:
        client.session.headers["Authorization"] = f"Bearer {TOKEN}"
        yield client, token_file


async def _events(response: Any, count: int) -> list[str]:
    """The next `count` events' html ([] past the stream's end)."""
    seen: list[str] = []
    while len(seen) < count:
        line = (await asyncio.wait_for(response.content.readline(), DEADLINE_S)).decode()
        if not line:
            break
        if line.startswith("data: "):
            seen.append(json.loads(line[6:])["html"])
    return seen


async def _serving() -> dict[str, Any]:
    """A cluster that answers at once."""
    return _status()


async def _hung() -> dict[str, Any]:
    """A cluster whose reading never ends."""
    await asyncio.Event().wait()
    raise AssertionError("unreachable")


@pytest.fixture
def fast(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tables every 20 ms, a reading's deadline 0.2 s, the token file looked at on every check."""
    monkeypatch.setattr(app_module, "LIVE_S", 0.02)
    monkeypatch.setattr(fleetapp, "READ_S", 0.2)
    monkeypatch.setattr(auth, "TOKEN_RECHECK_S", 0.0)
    monkeypatch.setattr(app_module, "SEND_S", 1.0, raising=False)


@pytest.mark.usefixtures("fast")
async def test_a_hung_cluster_leaves_the_other_rows_and_the_tasks_bounded(tmp_path: Path) -> None:
    """west hangs: every table still has east's row and says west did not answer; the readings
    left waiting on west do not grow with the tables sent."""
    async with _served(tmp_path, {"east": _serving, "west": _hung}) as (client, _):
        r = await client.get("/events/fleet")
        first = await _events(r, 3)
        tasks = len(asyncio.all_tasks())
        later = await _events(r, 15)
        grown = len(asyncio.all_tasks()) - tasks
        r.close()
    for html in first + later:
        assert "serving" in html and "no answer within 0.2 s" in html, html
    assert grown <= 4, f"{grown} more tasks after 15 tables"


@pytest.mark.usefixtures("fast")
async def test_a_token_rotated_while_the_table_is_read_gets_no_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The token file rotated while the next table was being read (a hung cluster holds it up to
    its deadline): that table is not sent; the stream ends (main sent it, under the old token)."""
    real = fleetapp.overview_rows
    calls = {"n": 0}
    token_file: list[Path] = []

    async def rotating(request: Any, now: float) -> list[list[str]]:
        calls["n"] += 1
        rows = await real(request, now)
        if calls["n"] == 2:
            token_file[0].write_text("tok-" + "new" * 12 + "\n")
        return rows

    monkeypatch.setattr(fleetapp, "overview_rows", rotating)
    async with _served(tmp_path, {"east": _serving, "west": _serving}) as (client, file):
        token_file.append(file)
        r = await client.get("/events/fleet")
        seen = await _events(r, 3)
        r.close()
    assert len(seen) == 1, f"{len(seen)} tables sent; the token rotated while the second was read"


@pytest.mark.usefixtures("fast")
async def test_the_cluster_stream_sends_nothing_after_a_rotation_during_its_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """/events/cluster under the fleet: the same (its sections read while the token rotated)."""
    real = app_module._cluster_data
    calls = {"n": 0}
    token_file: list[Path] = []

    async def rotating(request: Any) -> Any:
        calls["n"] += 1
        got = await real(request)
        if calls["n"] == 2:
            token_file[0].write_text("tok-" + "new" * 12 + "\n")
        return got

    monkeypatch.setattr(app_module, "_cluster_data", rotating)
    async with _served(tmp_path, {"east": _serving, "west": _serving}) as (client, file):
        token_file.append(file)
        r = await client.get("/c/east/events/cluster")
        seen = await _events(r, 3)
        r.close()
    assert len(seen) == 1, f"{len(seen)} events sent; the token rotated while the second was read"


@pytest.mark.usefixtures("fast")
async def test_hostile_status_values_stay_text_in_the_streamed_section(tmp_path: Path) -> None:
    """A verdict, a budget and an audit line carrying markup: escaped, and the event holds the
    one section the page's script replaces (id fleet), nothing else at the top."""

    async def hostile() -> dict[str, Any]:
        return _status(state=HOSTILE, used=f"</section><section id=x>{HOSTILE}")

    audit = {
        "entries": [
            {"run": "r1", "phase": "end", "what": {"operation": HOSTILE}, "outcome": HOSTILE,
             "when": time.time()},
        ]
    }  # fmt: skip
    async with _served(tmp_path, {"east": hostile, "west": _serving}, audit) as (client, _):
        r = await client.get("/events/fleet")
        (html,) = await _events(r, 1)
        r.close()
        page = await (await client.get("/")).text()
    assert "<img" not in html and "<section id=x>" not in html, html
    assert html.startswith('<section id="fleet"') and html.count("<section") == 1, html
    assert '<section id="fleet"' in page and "/events/fleet" in page


@pytest.mark.usefixtures("fast")
async def test_a_client_that_never_reads_is_let_go(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client that opens /events/fleet and never reads: once the socket's buffers are full, a
    part it does not take within SEND_S ends its stream (main: the handler waited for ever,
    holding its connection and the Guard's slot, even after its token was rotated)."""
    big = '<section id="fleet">' + "x" * (1 << 20) + "</section>"
    monkeypatch.setattr(fleetapp, "fleet_section", lambda rows: big)
    ended = asyncio.Event()
    real = fleetapp.fleet_events

    async def watched(request: Any) -> Any:
        try:
            return await real(request)
        finally:
            ended.set()

    monkeypatch.setattr(fleetapp, "fleet_events", watched)
    async with _served(tmp_path, {"east": _serving, "west": _serving}) as (client, _):
        host, port = client.server.host, client.server.port
        _reader, writer = await asyncio.open_connection(host, port)
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        head = f"GET /events/fleet HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n\r\n"
        writer.write(head.encode())
        await writer.drain()
        try:  # tables of 1 MiB every 20 ms: every buffer is full at once
            await asyncio.wait_for(ended.wait(), 30.0)
        finally:
            writer.close()
