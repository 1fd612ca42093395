"""The connections of one `serve`: a limit on how many are open at once and a deadline on each
request's head, kept by wrapping aiohttp's protocol factory (serve.app's `guarded` middleware
marks a connection busy while its request is answered)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

MAX_CONNECTIONS = 256  # open connections at once; more are closed on arrival
HEADER_TIMEOUT_S = 10.0  # a request's head arrives within this of the connection or last answer
KEEPALIVE_S = 15.0  # an idle keep-alive connection is closed after this

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Guard:
    """The connections of one server: a limit on their count and a deadline on each request's
    head (a slow or silent client is closed, never kept)."""

    def __init__(self, limit: int = MAX_CONNECTIONS, header_s: float = HEADER_TIMEOUT_S) -> None:
        """Nothing open yet."""
        self.limit = limit
        self.header_s = header_s
        self.open: dict[asyncio.Transport, float] = {}  # transport -> head deadline (0: busy)
        self.refused = 0
        self.expired = 0

    def connected(self, transport: asyncio.Transport) -> bool:
        """Count a new connection; False (and it is closed) when the limit is reached."""
        if len(self.open) >= self.limit:
            self.refused += 1
            transport.abort()
            return False
        self.open[transport] = time.monotonic() + self.header_s
        return True

    def busy(self, transport: asyncio.Transport | None, busy: bool) -> None:
        """A request's head arrived (busy) or its answer was sent (the next head's deadline)."""
        if transport in self.open:
            self.open[transport] = 0.0 if busy else time.monotonic() + self.header_s + KEEPALIVE_S

    def sweep(self) -> None:
        """Close every connection whose request head is late."""
        now = time.monotonic()
        for transport, due in list(self.open.items()):
            if due and due < now:
                self.expired += 1
                self.open.pop(transport, None)
                transport.abort()

    def wrap(self, factory: Callable[[], asyncio.BaseProtocol]) -> Callable[[], asyncio.Protocol]:
        """The protocol factory of the listening socket: aiohttp's, counted and timed."""
        guard = self

        class Counted(asyncio.Protocol):
            """aiohttp's protocol for one connection, with the guard's bookkeeping around it."""

            def __init__(self) -> None:
                """aiohttp's handler for this connection."""
                self.inner: Any = factory()
                self.transport: asyncio.Transport | None = None
                self.admitted = False  # aiohttp was told of it: it is told of its end too

            def connection_made(self, transport: asyncio.BaseTransport) -> None:
                """Counted, or closed at once over the limit."""
                assert isinstance(transport, asyncio.Transport)
                self.transport = transport
                if guard.connected(transport):
                    self.admitted = True
                    self.inner.connection_made(transport)

            def connection_lost(self, exc: Exception | None) -> None:
                """Forget it; aiohttp's handler ends with it (one the sweep closed too)."""
                if self.transport is not None:
                    guard.open.pop(self.transport, None)
                if self.admitted:
                    self.admitted = False
                    self.inner.connection_lost(exc)

            def data_received(self, data: bytes) -> None:
                """To aiohttp."""
                self.inner.data_received(data)

            def eof_received(self) -> bool | None:
                """To aiohttp."""
                return bool(self.inner.eof_received())

            def pause_writing(self) -> None:
                """To aiohttp."""
                self.inner.pause_writing()

            def resume_writing(self) -> None:
                """To aiohttp."""
                self.inner.resume_writing()

        return Counted


GUARD: web.AppKey[Guard] = web.AppKey("guard", Guard)


@web.middleware
async def guarded(request: web.Request, handler: Handler) -> web.StreamResponse:
    """The request's head is in: no head deadline while it is answered, a new one after."""
    guard = request.config_dict[GUARD]
    guard.busy(request.transport, True)
    try:
        return await handler(request)
    finally:
        guard.busy(request.transport, False)
