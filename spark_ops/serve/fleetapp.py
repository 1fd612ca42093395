"""`serve` under a fleet: one process, one token, every cluster (docs/fleet.md).

The fleet's overview is at / (a row per cluster: reachable, engine, budget, last run, its link),
each cluster's own pages, JSON, streams and /metrics under /c/NAME/ (serve.app.add_cluster, the
same handlers as a single cluster's), and /metrics at the top has every cluster's samples, each
with its `cluster` label. Every cluster is read on its own, within its own deadline: one that does
not answer is a row (and an absent family of samples) of its own, never a slower page.
"""

from __future__ import annotations

import asyncio
import time
import weakref
from typing import Any

from aiohttp import web

from spark_ops.fleet import Fleet, Member
from spark_ops.serve.app import SOURCES, Guard, add_cluster, live_stream, new_source, root_app
from spark_ops.serve.auth import TokenSource
from spark_ops.serve.html import ago, esc, page, section, table, url, when
from spark_ops.serve.metrics import PREFIX, render_metrics
from spark_ops.serve.pages import live_js
from spark_ops.serve.source import Source, last_run

FLEET_STREAM = "/events/fleet"
FLEET_JS = live_js(FLEET_STREAM, "fleet")
READ_S = 20.0  # a cluster's reading for the overview or /metrics: at most this (the page's is 30)
MEMBERS: web.AppKey[list[tuple[Member, Source]]] = web.AppKey("members", list)
# each cluster's reading still under way (per `hardware`): a page or a stream past its deadline
# leaves it running and the next one waits on it, never a second one piled behind it
PENDING: weakref.WeakKeyDictionary[Source, dict[bool, asyncio.Future[list[Any]]]] = (
    weakref.WeakKeyDictionary()
)
PASSING = {"serving": "ok", "degraded": "warn", "restarting": "warn", "experimenting": "warn"}
ANSWERED = PREFIX + "fleet_cluster_answered"


def cluster_base(name: str) -> str:
    """Where a fleet's cluster is served: /c/NAME (its pages below it)."""
    return f"/c/{name}"


def make_fleet_app(
    fleet: Fleet,
    token: str | TokenSource,
    *,
    ttl: float | None = None,
    guard: Guard | None = None,
) -> web.Application:
    """The fleet's application: the overview and /metrics at the top, each cluster's app under
    its base; one token and one session for all of them."""
    app = root_app(token, guard)
    members: list[tuple[Member, Source]] = []
    for m in fleet.members:
        src = new_source(m.cluster, None, ttl)
        sub = web.Application()
        add_cluster(sub, src, cluster_base(m.name))
        app.router.add_get(cluster_base(m.name), to_its_page)  # before its prefix takes it
        app.add_subapp(cluster_base(m.name) + "/", sub)
        app[SOURCES].append(src)
        members.append((m, src))
    app[MEMBERS] = members
    app.router.add_get("/", overview)
    app.router.add_get(FLEET_STREAM, fleet_events)
    app.router.add_get("/metrics", fleet_metrics)
    return app


async def to_its_page(request: web.Request) -> web.StreamResponse:
    """GET /c/NAME: to the cluster's page, /c/NAME/ (its links are relative to that)."""
    raise web.HTTPFound(location=request.path + "/")


def deadline_s(m: Member) -> float:
    """How long one cluster's reading may take here: its own deadline, within the page's."""
    return min(m.deadline_s, READ_S)


async def reading(m: Member, src: Source, *, hardware: bool = False) -> dict[str, Any]:
    """One cluster's status and audit (and node facts), within its deadline; `error` instead
    when it did not answer in time. The read goes on (shielded) and is kept for the next page."""
    pending = PENDING.setdefault(src, {})
    read = pending.get(hardware)
    if read is None or read.done():  # else the one left running by a reader past its deadline
        reads: list[Any] = [src.status.get(), src.audit.get()]
        if hardware:
            reads.append(src.hardware.get())
        read = pending[hardware] = asyncio.gather(*reads)
        read.add_done_callback(_retrieved)
    try:
        got = await asyncio.wait_for(asyncio.shield(read), deadline_s(m))
    except TimeoutError:
        return {"error": f"no answer within {deadline_s(m):g} s"}
    return {"status": got[0], "audit": got[1], "hardware": got[2] if hardware else None}


def _retrieved(read: asyncio.Future[list[Any]]) -> None:
    """A reading that ended after every reader's deadline: its error taken (logged by the
    cached reader already), never an 'exception was never retrieved' at shutdown."""
    if not read.cancelled():
        read.exception()


async def _readings(request: web.Request, *, hardware: bool = False) -> list[dict[str, Any]]:
    """Every cluster's reading at once, in the fleet's order."""
    members = request.app[MEMBERS]
    return list(await asyncio.gather(*(reading(m, src, hardware=hardware) for m, src in members)))


async def overview_rows(request: web.Request, now: float) -> list[list[str]]:
    """Every cluster's row of the fleet's table, in the fleet's order."""
    members = request.app[MEMBERS]
    readings = await _readings(request)
    return [overview_row(m.name, r, now) for (m, _), r in zip(members, readings, strict=True)]


async def overview(request: web.Request) -> web.Response:
    """GET /: the fleet's page, a row per cluster; live (FLEET_STREAM sends its table again)."""
    rows = await overview_rows(request, time.time())
    return web.Response(text=overview_page(rows), content_type="text/html", charset="utf-8")


def fleet_section(rows: list[list[str]]) -> str:
    """The fleet's table (cells already HTML) in its section (what FLEET_STREAM sends again)."""
    heads = ["cluster", "reachable", "engine", "budget", "last run", "read"]
    return section(f"Fleet: {len(rows)} clusters", table(heads, rows), ident="fleet")


def overview_page(rows: list[list[str]]) -> str:
    """The fleet's table in its page, with the script that keeps it live."""
    return page("Fleet", "/", fleet_section(rows), script=FLEET_JS, fleet=True)


async def fleet_events(request: web.Request) -> web.StreamResponse:
    """GET /events/fleet: the fleet's table again every LIVE_S seconds (`event: fleet`), each
    cluster read as the page reads it (cached, within its deadline; app.live_stream)."""

    async def draw(now: float) -> str:
        """The fleet's table now."""
        return fleet_section(await overview_rows(request, now))

    return await live_stream(request, "fleet", draw, ident="fleet")


def overview_row(name: str, r: dict[str, Any], now: float) -> list[str]:
    """One cluster's row: its link, nodes reachable, verdict and engine, budget, last run; a
    cluster that did not answer says so in every cell but its name."""
    link = f'<a href="{url(cluster_base(name), "/")}">{esc(name)}</a>'
    if "error" in r:
        said = f'<span class="bad">{esc(r["error"])}</span>'
        return [link, '<span class="bad">unreachable</span>', said, "—", "—", "—"]
    status = r["status"]
    nodes = status.get("nodes") or []
    up = sum(1 for n in nodes if isinstance(n, dict) and n.get("reachable"))
    cls = "ok" if nodes and up == len(nodes) else "bad"
    gone = "unreachable: " if not up else ""
    reach = f'<span class="{cls}">{gone}{up}/{len(nodes)} nodes</span>'
    state = (status.get("verdict") or {}).get("state", "?")
    engine = "up" if (status.get("engine") or {}).get("up") else "down"
    verdict = f'<span class="{PASSING.get(state, "bad")}">{esc(state)}</span> (engine {engine})'
    budget = status.get("budget") or {}
    used = f"{esc(budget['used'])}/{esc(budget.get('allowed'))}" if "used" in budget else "—"
    run = last_run(r["audit"].get("entries") or [])
    ran = "none"
    if run:
        ran = (
            f"{esc(run['operation'])}: "
            f'<span class="{"ok" if run["ok"] else "bad"}">{esc(run["outcome"])}</span> '
            f"at {when(run['when'])}"
        )
    return [link, reach, verdict, used, ran, ago("status", status.get("time"), now)]


async def fleet_metrics(request: web.Request) -> web.Response:
    """GET /metrics: every cluster's samples (each with its `cluster` label), and which
    clusters answered within their deadline."""
    members = request.app[MEMBERS]
    texts = []
    answered = []
    for (m, src), r in zip(members, await _readings(request, hardware=True), strict=True):
        answered.append((m.name, "error" not in r))
        if "error" in r:
            continue
        one = render_metrics(
            r["status"], src.boot.state.snapshot(), last_run(r["audit"]["entries"]),
            src.doctor(), hardware=r["hardware"], load=src.load.ring.view(), cluster=m.name,
        )  # fmt: skip
        texts.append(one.decode())
    head = (
        f"# HELP {ANSWERED} 1 when the cluster answered this page within its deadline.\n"
        f"# TYPE {ANSWERED} gauge\n"
    )
    samples = "".join(f'{ANSWERED}{{cluster="{n}"}} {1.0 if ok else 0.0}\n' for n, ok in answered)
    return web.Response(
        text=merge_metrics([head + samples, *texts]),
        headers={"Content-Type": "text/plain; version=0.0.4"},
    )


def merge_metrics(texts: list[str]) -> str:
    """Prometheus text pages as one: each family's HELP and TYPE once, then every page's samples
    of it (a family may not be split, nor said twice)."""
    families: dict[str, list[str]] = {}
    heads: dict[str, list[str]] = {}
    for text in texts:
        name = ""
        for line in text.splitlines():
            if line.startswith(("# HELP ", "# TYPE ")):
                name = line.split(" ", 3)[2]
                if name not in heads:
                    heads[name] = []
                    families[name] = []
                if len(heads[name]) < 2 and line not in heads[name]:
                    heads[name].append(line)
            elif line and not line.startswith("#"):
                families.setdefault(name, []).append(line)
    out = []
    for name, samples in families.items():
        out.extend(heads.get(name, []))
        out.extend(samples)
    return "\n".join(out) + "\n"
