"""The red team of 2026-12-06, round 8: serve's connection guard (serve/guard.py) and the live
stream (app.live_stream) after their split (docs/reliability.md, round 8). In process, on
loopback: a root app with the guard's middleware, a page and a live stream of its own."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import ClientSession, ClientTimeout, web

from spark_ops.serve import app as app_module
from spark_ops.serve import auth
from spark_ops.serve.auth import COOKIE, TokenSource
from spark_ops.serve.guard import Guard

TOKEN = "tok-" + "r8" * 16
ROTATED = "new-" + "r8" * 16
DEADLINE_S = 30.0  # a generous bound on what the loopback answers in (a loaded machine)


def _write_token(path: Path, token: str) -> None:
    """The token file as serve accepts it: ours, regular, mode 0600 (a new inode: a rotation)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(token + "\n")
    tmp.chmod(0o600)
    os.replace(tmp, path)


@contextlib.asynccontextmanager
async def _served(tmp_path: Path, guard: Guard) -> AsyncIterator[tuple[str, Path, Any]]:
    """The root app (its guard, token and sessions) with `/` and a live stream, listening on a
    free loopback port through the guard's protocol factory; yields (base URL, token file, the
    aiohttp server)."""
    token_file = tmp_path / "token"
    _write_token(token_file, TOKEN)
    app = app_module.root_app(TokenSource(TOKEN, token_file), guard)

    async def page(request: web.Request) -> web.Response:
        """A page."""
        return web.Response(text="page")

    async def stream(request: web.Request) -> web.StreamResponse:
        """A live stream whose drawing is one word."""

        async def draw(now: float) -> str:
            """The section."""
            return "<section id=x>x</section>"

        return await app_module.live_stream(request, "cluster", draw, ident="x")

    app.router.add_get("/", page)
    app.router.add_get("/events/cluster", stream)
    runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
    await runner.setup()
    assert runner.server is not None
    server = await asyncio.get_running_loop().create_server(
        guard.wrap(runner.server), "127.0.0.1", 0
    )
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}", token_file, runner.server
    finally:
        server.close()
        for transport in list(guard.open):
            transport.abort()
        await runner.cleanup()


async def _until(predicate: Any, what: str) -> None:
    """Wait until predicate() holds (DEADLINE_S at most)."""
    deadline = time.monotonic() + DEADLINE_S
    while not predicate():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.05)


def test_connections_the_sweep_closes_end_their_handlers(tmp_path: Path) -> None:
    """Clients that open a connection and never send a request head: the guard's sweep closes
    them, and aiohttp's handler of each ends with it (before the fix the guard forgot the
    connection without telling aiohttp: one handler task and its server entry per silent client,
    kept for as long as serve ran)."""

    async def scenario() -> None:
        guard = Guard(limit=256, header_s=0.2)
        async with _served(tmp_path, guard) as (url, _, server):
            host, port = url.removeprefix("http://").split(":")
            socks = [socket.create_connection((host, int(port))) for _ in range(20)]
            try:
                await _until(lambda: len(server.connections) == 20, "20 connections seen")
                await asyncio.sleep(0.3)
                guard.sweep()
                assert guard.expired == 20 and not guard.open
                await _until(
                    lambda: not server.connections,
                    f"aiohttp still holds {len(server.connections)} swept connection(s)",
                )
                async with ClientSession() as client:  # and the server still answers
                    got = await client.get(url, headers={"Authorization": f"Bearer {TOKEN}"})
                    assert got.status == 200
            finally:
                for s in socks:
                    s.close()

    asyncio.run(scenario())


async def _cookie(client: ClientSession, url: str) -> str:
    """The session cookie the login URL (?token=) sets."""
    got = await client.get(f"{url}/?token={TOKEN}", allow_redirects=False)
    assert got.status == 303, got.status
    return got.cookies[COOKIE].value


@pytest.mark.parametrize("change", ["rotated", "removed"])
def test_a_session_cookie_ends_with_its_token(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, change: str
) -> None:
    """A browser's session cookie, taken with the token that is then rotated (or whose file is
    removed): pages answer 401 and its live stream ends (before the fix a rotated token left
    every cookie of the old one valid for its 12 hours: pages and streams alike); the new token
    gets a new cookie that works."""
    monkeypatch.setattr(auth, "TOKEN_RECHECK_S", 0.0)
    monkeypatch.setattr(app_module, "LIVE_S", 0.05)

    async def scenario() -> None:
        async with _served(tmp_path, Guard()) as (url, token_file, _):
            timeout = ClientTimeout(total=DEADLINE_S)
            async with ClientSession(timeout=timeout) as client:
                cookie = {COOKIE: await _cookie(client, url)}
                assert (await client.get(url, cookies=cookie)).status == 200
                stream = await client.get(f"{url}/events/cluster", cookies=cookie)
                assert stream.status == 200
                assert b"event: cluster" in await stream.content.readuntil(b"\n\n")
                if change == "rotated":
                    _write_token(token_file, ROTATED)
                else:
                    token_file.unlink()
                rest = await asyncio.wait_for(stream.content.read(), DEADLINE_S)
                assert stream.content.at_eof(), "the stream ended"
                assert len(rest) < 1 << 16, "it ended within a few parts"
                assert (await client.get(url, cookies=cookie)).status == 401
                if change == "rotated":
                    got = await client.get(f"{url}/?token={ROTATED}", allow_redirects=False)
                    fresh = {COOKIE: got.cookies[COOKIE].value}
                    assert (await client.get(url, cookies=fresh)).status == 200

    asyncio.run(scenario())
