"""Running the server: listen (loopback unless told), serve one cluster or a fleet until
cancelled, then close every connection and reader (the application itself: serve.app and, for a
fleet, serve.fleetapp)."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
from collections.abc import Callable
from pathlib import Path

from aiohttp import web

from spark_ops.errors import ConflictError
from spark_ops.fleet import Fleet
from spark_ops.inventory import Cluster
from spark_ops.log import get_logger
from spark_ops.serve.app import SOURCES, Guard, make_app
from spark_ops.serve.auth import TokenSource, guard_http_logs
from spark_ops.serve.fleetapp import make_fleet_app


class ServeError(ConflictError):
    """The server cannot listen where asked (the port taken, the address not ours): exit 19."""


def is_loopback(host: str) -> bool:
    """True for an address only this machine reaches."""
    if host == "localhost":
        return True
    with contextlib.suppress(ValueError):
        return ipaddress.ip_address(host).is_loopback
    return False


async def serve(
    cluster: Cluster | Fleet,
    token: str,
    *,
    host: str,
    port: int,
    results: Path | None = None,
    on_ready: Callable[[str], None] | None = None,
    token_path: Path | None = None,
    guard: Guard | None = None,
) -> None:
    """Run the server until cancelled; on_ready gets the base URL once it listens. A fleet is
    served whole: its overview at /, each cluster under /c/NAME/ (serve.fleetapp)."""
    guard_http_logs()
    guard = guard or Guard()
    tokens = TokenSource(token, token_path)
    if isinstance(cluster, Fleet):
        log = get_logger(cluster="fleet", op="serve")
        app = make_fleet_app(cluster, tokens, guard=guard)
    else:
        log = get_logger(cluster=cluster.name, op="serve")
        app = make_app(cluster, tokens, results=results, guard=guard)
    runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
    await runner.setup()
    loop = asyncio.get_running_loop()
    assert runner.server is not None  # made by setup()
    try:
        server = await loop.create_server(guard.wrap(runner.server), host, port, backlog=128)
    except OSError as exc:
        await runner.cleanup()
        raise ServeError(
            f"cannot listen on {host}:{port}: {exc.strerror or exc}",
            hint="choose another --port, or stop what listens there",
        ) from exc
    sockets = server.sockets
    bound = int(sockets[0].getsockname()[1]) if sockets else port
    shown = f"[{host}]" if ":" in host else host
    url = f"http://{shown}:{bound}"
    log.info("serving", url=url, loopback=is_loopback(host))
    if on_ready is not None:
        on_ready(url)
    try:
        while True:
            await asyncio.sleep(1.0)
            guard.sweep()
    finally:
        server.close()
        for transport in list(guard.open):
            transport.abort()
        with contextlib.suppress(TimeoutError):  # first the CPU work: a sweep read's child
            await asyncio.wait_for(asyncio.gather(*(s.close() for s in app[SOURCES])), 5.0)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(runner.cleanup(), 5.0)
