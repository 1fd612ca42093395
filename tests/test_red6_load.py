"""The red team of 2026-12-05, round 6: another program on the engine's port (bench's one request
loop, spark_ops/bench/load.py and client.py). A body without end — /v1/models, an error answer, a
200 stream without a line end — is read no further than a bound, and the request fails naming
what came; a body cut mid-way or a connection reset is a failed request, never a figure
(docs/reliability.md, "The red team of 2026-12-05, round 6")."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from aiohttp import web

from spark_ops.bench.client import RequestRecord, StreamClient
from spark_ops.bench.load import discover_model
from spark_ops.errors import BenchUnreachable

SENT_AT_MOST = 32 << 20  # what a garbage server sends before it ends
CHUNK = b"x" * (64 << 10)
BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}


def _flood(status: int, sent: list[int]) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """A handler answering `status` with SENT_AT_MOST bytes of one line, counting what it got
    out before the client went away."""

    async def handler(request: web.Request) -> web.StreamResponse:
        """Write newline-free bytes until the budget or the client ends."""
        resp = web.StreamResponse(status=status)
        await resp.prepare(request)
        try:
            while sent[0] < SENT_AT_MOST:
                await resp.write(CHUNK)
                sent[0] += len(CHUNK)
        except (ConnectionError, RuntimeError):
            return resp
        await resp.write_eof()
        return resp

    return handler


async def _cut(request: web.Request) -> web.StreamResponse:
    """A 200 stream cut mid-way: a token chunk, then the connection dropped."""
    resp = web.StreamResponse(status=200)
    await resp.prepare(request)
    await resp.write(b'data: {"choices":[{"delta":{"content":"a"}}]}\n\n')
    assert request.transport is not None
    request.transport.abort()
    return resp


async def _done_only(_request: web.Request) -> web.Response:
    """200 and `[DONE]` at once: no token, no usage."""
    return web.Response(body=b"data: [DONE]\n\n", content_type="text/event-stream")


async def _serve(routes: dict[str, Any], run: Callable[[StreamClient], Awaitable[Any]]) -> Any:
    """Serve routes on loopback and run `run` with a client on them."""
    app = web.Application()
    for path, handler in routes.items():
        app.router.add_route("*", path, handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        async with StreamClient(f"http://127.0.0.1:{port}", timeout_s=30) as client:
            return await run(client)
    finally:
        await runner.cleanup()


def test_a_models_list_without_end_is_refused_unread() -> None:
    """/v1/models answering 200 with bytes without end: bench stopped reading at a bound and
    named the server (before: read whole, 32 MiB and more, until the 10 s timeout)."""
    sent = [0]

    async def run(client: StreamClient) -> str:
        """Look for the model."""
        with pytest.raises(BenchUnreachable) as err:
            await discover_model(client)
        return err.value.message

    message = asyncio.run(_serve({"/v1/models": _flood(200, sent)}, run))
    assert "/v1/models" in message
    assert sent[0] < SENT_AT_MOST


STREAMS = [("a 200 without a line end", 200, "line"), ("a 503 without end", 503, "HTTP 503")]


@pytest.mark.parametrize(("case", "status", "said"), STREAMS, ids=[s[0] for s in STREAMS])
def test_a_body_without_end_fails_the_request_at_a_bound(case: str, status: int, said: str) -> None:
    """The request fails naming what came, the rest left unread."""
    sent = [0]

    async def run(client: StreamClient) -> RequestRecord:
        """One request."""
        return await client.stream("/v1/chat/completions", BODY, 0)

    rec = asyncio.run(_serve({"/v1/chat/completions": _flood(status, sent)}, run))
    assert not rec.ok and said in (rec.error or ""), (case, rec.error)
    assert sent[0] < SENT_AT_MOST, case


HELD = [("cut mid-way", _cut, False), ("[DONE] and no token", _done_only, True)]


@pytest.mark.parametrize(("case", "handler", "ok"), HELD, ids=[h[0] for h in HELD])
def test_a_short_answer_is_what_it_is(case: str, handler: Any, ok: bool) -> None:
    """Held: a stream cut mid-way fails; `[DONE]` alone is a request of no token."""

    async def run(client: StreamClient) -> RequestRecord:
        """One request."""
        return await client.stream("/v1/chat/completions", BODY, 0)

    rec = asyncio.run(_serve({"/v1/chat/completions": handler}, run))
    assert rec.ok is ok, (case, rec.error)
    assert rec.output_tokens == (0 if ok else 1)
