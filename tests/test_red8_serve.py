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

from aiohttp import ClientSession, web

from spark_ops.serve import app as app_module
from spark_ops.serve.auth import TokenSource
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
