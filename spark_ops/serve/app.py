"""The aiohttp application: token auth, the pages, the JSON endpoints, /metrics and /events.

Read-only: every route is a GET (HEAD too); anything else is 405. No action is offered.

Bounded (issue 34): at most MAX_CONNECTIONS connections at once (more are closed at once), a
request's head must arrive within HEADER_TIMEOUT_S of the connection or of the previous answer,
a handler answers within HANDLER_TIMEOUT_S (503 otherwise; /events streams), idle keep-alive ends
after KEEPALIVE_S, and no secret nor traceback of a bad request reaches a log (auth.RedactFilter).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

from aiohttp import web
from yarl import URL

from spark_ops.inventory import Cluster
from spark_ops.log import get_logger
from spark_ops.serve.auth import COOKIE, Sessions, TokenSource, same_token
from spark_ops.serve.guard import GUARD, KEEPALIVE_S, Guard, Handler, guarded
from spark_ops.serve.html import esc, json_text, page, section
from spark_ops.serve.metrics import render_metrics
from spark_ops.serve.pages import (
    boot_page,
    cluster_page,
    cluster_sections,
    history_page,
    sweeps_page,
)
from spark_ops.serve.source import Source, last_run

SOURCE: web.AppKey[Source] = web.AppKey("source", Source)
TOKEN: web.AppKey[TokenSource] = web.AppKey("token", TokenSource)
SESSIONS: web.AppKey[Sessions] = web.AppKey("sessions", Sessions)
BASE: web.AppKey[str] = web.AppKey("base", str)  # "" at /, "/c/NAME" for a fleet's cluster
SOURCES: web.AppKey[list[Source]] = web.AppKey("sources", list)  # every cluster served
SSE_KEEPALIVE_S = 15.0
ERROR_METRIC = "spark_ops_serve_answer_failed"
HANDLER_TIMEOUT_S = 30.0  # a page or API answer is ready within this (503 otherwise)
STREAMS = ("/events", "/events/cluster", "/events/fleet")  # answers that last: no deadline
SEND_S = 30.0  # a stream's client takes each part within this (never reading: let go)
LIVE_S = 5.0  # the live cluster page gets its sections again this often (the cache's age)
HEADERS = {
    "Cache-Control": "no-store",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    # inline style and script only: nothing is loaded from anywhere
    "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; "
    "script-src 'unsafe-inline'; connect-src 'self'; img-src 'self' data:; "
    "form-action 'none'; frame-ancestors 'none'",
}


@web.middleware
async def auth(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every request carries the token: Bearer header, the session cookie, or ?token= once."""
    token = request.config_dict[TOKEN].current()
    sessions = request.config_dict[SESSIONS]
    if token is None:  # the token file is gone or refused: nobody is let in (the log said why)
        raise _unauthorized()
    header = request.headers.get("Authorization", "")
    scheme, _, given = header.partition(" ")
    if scheme.lower() == "bearer" and same_token(given.strip(), token):
        return await _headers(await handler(request))
    if "token" in request.query:
        if not same_token(request.query.get("token"), token):
            raise _unauthorized()
        response = web.HTTPSeeOther(location=same_page(request.path, request.query))
        https = request.secure or request.headers.get("X-Forwarded-Proto", "") == "https"
        response.set_cookie(COOKIE, sessions.issue(token), httponly=True, samesite="Strict",
                            path="/", secure=https, max_age=int(sessions.lifetime))  # fmt: skip
        raise response
    if sessions.valid(request.cookies.get(COOKIE), token):
        return await _headers(await handler(request))
    raise _unauthorized()


@web.middleware
async def deadline(request: web.Request, handler: Handler) -> web.StreamResponse:
    """A handler answers within HANDLER_TIMEOUT_S (503 otherwise); /events streams on."""
    if local_path(request) in STREAMS:
        return await handler(request)
    try:
        return await asyncio.wait_for(handler(request), HANDLER_TIMEOUT_S)
    except TimeoutError:
        raise web.HTTPServiceUnavailable(
            text=f"503: no answer within {HANDLER_TIMEOUT_S:.0f} s\n", headers=HEADERS
        ) from None


@web.middleware
async def shown(request: web.Request, handler: Handler) -> web.StreamResponse:
    """An unexpected error while reading or drawing is a shown error (200, the page or document
    saying what failed), never a 500; logged without the request's secrets."""
    try:
        return await handler(request)
    except web.HTTPException:
        raise
    except Exception as exc:
        where = local_path(request)
        if where in STREAMS:
            raise
        what = f"this answer could not be made ({type(exc).__name__}); it is logged"
        get_logger(op="serve").error("answer failed", path=request.path, error=repr(exc)[:300])
        if where == "/metrics":
            body = f"# {what}\n{ERROR_METRIC} 1\n"
            return web.Response(text=body, headers={"Content-Type": "text/plain; version=0.0.4"})
        if where.startswith("/api/"):
            return _json({"error": what})
        said = section("Not shown", f'<p class="bad">{esc(what)}</p>')
        return _html(page("Error", where, said, base=request_base(request)))


def request_base(request: web.Request) -> str:
    """The base of the cluster a request is for ("" at the top, "/c/NAME" under a fleet)."""
    apps = request.match_info.apps
    return apps[-1].get(BASE, "") if apps else ""


def local_path(request: web.Request) -> str:
    """The request's path under its cluster's base: a fleet serves each cluster's pages under
    /c/NAME, and its streams and /metrics are known by their path there."""
    base = request_base(request)
    if base and request.path.startswith(base + "/"):
        return request.path[len(base) :]
    return request.path


def same_page(path: str, query: Mapping[str, str]) -> str:
    """The address to send a browser to after ?token=: this server's page, without the token
    (a path like `//other.host/` or `/\\other` becomes one of ours, never another site)."""
    kept = {k: v for k, v in query.items() if k != "token"}
    return str(URL.build(path="/" + path.lstrip("/\\"), query=kept))


def _unauthorized() -> web.HTTPUnauthorized:
    """401 with a short plain answer (no page, nothing about the cluster)."""
    return web.HTTPUnauthorized(
        text="401: this spark-ops server needs its token (Authorization: Bearer TOKEN, or the URL "
        "it printed at start)\n",
        headers={"WWW-Authenticate": 'Bearer realm="spark-ops"', **HEADERS},
    )


async def _headers(response: web.StreamResponse) -> web.StreamResponse:
    """The security headers on an answer not yet sent (an SSE stream sets its own)."""
    if not response.prepared:
        response.headers.update(HEADERS)
    return response


def _html(text: str) -> web.Response:
    """An HTML answer."""
    return web.Response(text=text, content_type="text/html", charset="utf-8")


def _json(data: Any) -> web.Response:
    """A JSON answer (what `status --json` and friends print): valid JSON always, a number that
    is not finite (NaN, Infinity) written as null."""
    return web.Response(text=json_text(data), content_type="application/json")


async def _status(request: web.Request) -> dict[str, Any]:
    """status' data, cached."""
    return dict(await request.app[SOURCE].status.get())


async def _cluster_data(request: web.Request) -> tuple[list[Any], dict[str, Any]]:
    """What the cluster page shows: status, the last run, the doctor report (positional) and the
    nodes' facts, the engine's load and the live boot (by name)."""
    src = request.app[SOURCE]
    status, audit, hardware = await asyncio.gather(
        _status(request), src.audit.get(), src.hardware.get()
    )
    more = {"hardware": hardware, "load": src.load.ring.view(), "boot": src.boot.state.snapshot()}
    return [status, last_run(audit["entries"]), src.doctor()], more


async def cluster_view(request: web.Request) -> web.Response:
    """The cluster page."""
    args, more = await _cluster_data(request)
    return _html(cluster_page(*args, **more, base=request.app[BASE]))


async def cluster_events(request: web.Request) -> web.StreamResponse:
    """GET /events/cluster: the cluster page's sections again every LIVE_S seconds (`event:
    cluster`), from the shared cached readings (live_stream)."""

    async def draw(now: float) -> str:
        """The cluster page's sections now."""
        args, more = await _cluster_data(request)
        return cluster_sections(*args, **more, now=now, base=request.app[BASE])

    return await live_stream(request, "cluster", draw, ident="summary")


async def live_stream(
    request: web.Request, event: str, draw: Callable[[float], Awaitable[str]], *, ident: str
) -> web.StreamResponse:
    """A live page's stream: every LIVE_S seconds `draw(now)`'s sections as `event` (JSON
    {now, html}). A drawing that fails sends an error section (id `ident`) and the stream goes
    on; it ends when the request's credential no longer holds, looked at again after each
    drawing (the token moved, rotated or its session ended)."""
    response = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "X-Accel-Buffering": "no", **HEADERS}
    )
    await response.prepare(request)
    try:
        while still_allowed(request):
            now = time.time()
            try:
                html = await draw(now)
            except Exception as exc:  # one bad reading: said, and the next one may be good
                get_logger(op="serve").error(f"live {event} failed", error=repr(exc)[:300])
                said = f"the live {event} page could not be drawn ({type(exc).__name__})"
                said += "; it is logged"
                html = section("Not shown", f'<p class="bad">{esc(said)}</p>', ident=ident)
            if not still_allowed(request):  # the credential ended while it was drawn
                break
            await send(request, response, sse({"now": now, "html": html}, event))
            await asyncio.sleep(LIVE_S)
    except (ConnectionResetError, asyncio.CancelledError):
        pass
    return response


def still_allowed(request: web.Request) -> bool:
    """The request's credential (Bearer header or session cookie) still holds against the
    current token: a stream re-checks it before each send."""
    token = request.config_dict[TOKEN].current()
    if token is None:
        return False
    scheme, _, given = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() == "bearer" and same_token(given.strip(), token):
        return True
    return request.config_dict[SESSIONS].valid(request.cookies.get(COOKIE), token)


async def api_nodes(request: web.Request) -> web.Response:
    """GET /api/nodes: each node's hardware (GPU, memory, power, MemAvailable, engine rank)."""
    return _json(await request.app[SOURCE].hardware.get())


async def api_load(request: web.Request) -> web.Response:
    """GET /api/load: the engine's running/waiting requests and tok/s over the last hour."""
    return _json(request.app[SOURCE].load.ring.view())


async def history_view(request: web.Request) -> web.Response:
    """The history and audit page."""
    src = request.app[SOURCE]
    return _html(
        history_page(await _status(request), await src.audit.get(), base=request.app[BASE])
    )


async def boot_view(request: web.Request) -> web.Response:
    """The boot page."""
    return _html(boot_page(request.app[SOURCE].boots(), base=request.app[BASE]))


async def sweeps_view(request: web.Request) -> web.Response:
    """The sweeps page."""
    return _html(sweeps_page(await request.app[SOURCE].sweeps(), base=request.app[BASE]))


async def api_status(request: web.Request) -> web.Response:
    """GET /api/status: `spark-ops status --json`'s document."""
    return _json(await _status(request))


async def api_budget(request: web.Request) -> web.Response:
    """GET /api/budget: the budget as status read it (`spark-ops budget --json`'s fields)."""
    return _json((await _status(request)).get("budget") or {})


async def api_log(request: web.Request) -> web.Response:
    """GET /api/log: the audit log's last entries (`spark-ops log --json`), and the last run."""
    audit = dict(await request.app[SOURCE].audit.get())
    audit["last_run"] = last_run(audit["entries"])
    return _json(audit)


async def api_boot(request: web.Request) -> web.Response:
    """GET /api/boot: the live boot and past boots."""
    return _json(request.app[SOURCE].boots())


async def api_sweeps(request: web.Request) -> web.Response:
    """GET /api/sweeps: saved sweeps and their what-if."""
    return _json(await request.app[SOURCE].sweeps())


async def metrics_view(request: web.Request) -> web.Response:
    """GET /metrics: Prometheus text format."""
    src = request.app[SOURCE]
    status = await _status(request)
    audit = await src.audit.get()
    body = render_metrics(
        status, src.boot.state.snapshot(), last_run(audit["entries"]), src.doctor(),
        hardware=await src.hardware.get(), load=src.load.ring.view(), cluster=src.cluster.name,
    )  # fmt: skip
    return web.Response(body=body, headers={"Content-Type": "text/plain; version=0.0.4"})


async def events(request: web.Request) -> web.StreamResponse:
    """GET /events: server-sent events of the live boot (`event: boot`, one JSON per event)."""
    src = request.app[SOURCE]
    response = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "X-Accel-Buffering": "no", **HEADERS}
    )
    await response.prepare(request)
    queue = src.boot.subscribe()
    try:
        hello = {"event": {"kind": "hello"}, "state": src.boot.state.snapshot()}
        await send(request, response, sse(hello))
        while still_allowed(request):
            try:
                item = await asyncio.wait_for(src.boot.take(queue), SSE_KEEPALIVE_S)
            except TimeoutError:
                if still_allowed(request):
                    await send(request, response, b": keepalive\n\n")
                continue
            if item is None:  # too far behind: dropped; the browser reconnects
                break
            if still_allowed(request):
                await send(request, response, sse(item))
    except (ConnectionResetError, asyncio.CancelledError):
        pass
    finally:
        src.boot.unsubscribe(queue)
    return response


async def send(request: web.Request, response: web.StreamResponse, data: bytes) -> None:
    """Part of a stream, within SEND_S: a client that does not take it in time (it never reads;
    every buffer is full) is let go, its connection closed (ConnectionResetError)."""
    try:
        await asyncio.wait_for(response.write(data), SEND_S)
    except TimeoutError:
        if request.transport is not None:
            request.transport.abort()
        raise ConnectionResetError("the client does not read its stream") from None


def sse(item: dict[str, Any], kind: str = "boot") -> bytes:
    """One server-sent event (JSON on one data line: no newline of a log line can split it)."""
    return f"event: {kind}\ndata: {json_text(item)}\n\n".encode()


def root_app(token: str | TokenSource, guard: Guard | None = None) -> web.Application:
    """The application every request enters: its bounds, the one token, shown errors."""
    app = web.Application(middlewares=[guarded, auth, deadline, shown], handler_args={
        "max_line_size": 8190, "max_field_size": 8190, "keepalive_timeout": KEEPALIVE_S,
    })  # fmt: skip
    app[GUARD] = guard or Guard()
    app[TOKEN] = token if isinstance(token, TokenSource) else TokenSource(token)
    app[SESSIONS] = Sessions()
    app[SOURCES] = []
    return app


def new_source(cluster: Cluster, results: Path | None, ttl: float | None) -> Source:
    """The readers of one cluster (the default cache age unless `ttl` is given)."""
    if ttl is None:
        return Source(cluster, results=results)
    return Source(cluster, results=results, ttl=ttl)


def add_cluster(app: web.Application, src: Source, base: str = "") -> None:
    """One cluster's pages, JSON, streams and /metrics on `app` (its paths under `base`, as its
    pages link them); its boot watch and load scrape run while `app` does."""
    app[SOURCE] = src
    app[BASE] = base
    for path, handler in (
        ("/", cluster_view), ("/history", history_view), ("/boot", boot_view),
        ("/sweeps", sweeps_view), ("/api/status", api_status), ("/api/budget", api_budget),
        ("/api/log", api_log), ("/api/boot", api_boot), ("/api/sweeps", api_sweeps),
        ("/metrics", metrics_view), ("/events", events), ("/events/cluster", cluster_events),
        ("/api/nodes", api_nodes), ("/api/load", api_load),
    ):  # fmt: skip
        app.router.add_get(path, handler)

    async def lifecycle(app: web.Application) -> Any:
        """Start the boot watch and the load scrape with the app, stop them with the app."""
        src.boot.start()
        src.load.start()
        src.hardware.refresh()  # the first node reading begins now, not with the first page
        yield
        await src.load.stop()
        await src.boot.stop()
        await src.close()

    app.cleanup_ctx.append(lifecycle)


def make_app(
    cluster: Cluster,
    token: str | TokenSource,
    *,
    results: Path | None = None,
    ttl: float | None = None,
    guard: Guard | None = None,
) -> web.Application:
    """The application for one cluster, at /; its boot watch runs while the app does."""
    app = root_app(token, guard)
    src = new_source(cluster, results, ttl)
    app[SOURCES].append(src)
    add_cluster(app, src)
    return app
