"""The cluster page: server-rendered HTML, inline CSS and a little inline JS, no external URL.

Every value shown goes through `esc` (html.escape). The page is live: `/events/cluster` sends its
sections again as the readings change (the same escaped HTML this module renders, parsed by the
browser's DOMParser, whose scripts never run), and every kept fact says its age. The other pages
live beside it (bootpage, history, sweeps); their renderers are importable from here too.
"""

from __future__ import annotations

import math
import time
from typing import Any

from spark_ops.serve.bootpage import boot_page
from spark_ops.serve.charts import budget_gauge, stamp_timeline, time_series
from spark_ops.serve.history import history_page
from spark_ops.serve.html import AGE_JS, ago, esc, page, section, table, url, when
from spark_ops.serve.metrics import facts_fresh, fresh_sample
from spark_ops.serve.sweepspage import svg_chart, sweeps_page

__all__ = ["boot_page", "cluster_page", "cluster_sections", "history_page", "live_js",
           "svg_chart", "sweeps_page"]  # fmt: skip

# states an operator waits through (amber), not a fault (red)
PASSING = {"serving": "ok", "degraded": "warn", "restarting": "warn", "experimenting": "warn"}
GIB = 1024**3


def live_js(stream: str, event: str) -> str:
    """A live page's script: each `event` of `stream` (under the page's base) brings the page's
    sections again as HTML, each replacing the section of its id; the ages count on."""
    return (
        AGE_JS
        + f"""
const es=new EventSource(document.body.dataset.base+'{stream}');
es.addEventListener('{event}',m=>{{const d=JSON.parse(m.data);skew=d.now-Date.now()/1000;
 const doc=new DOMParser().parseFromString('<main>'+d.html+'</main>','text/html');
 doc.querySelectorAll('main > section[id]').forEach(s=>{{const old=document.getElementById(s.id);
  if(old)old.replaceWith(document.adoptNode(s));}});
 document.body.dataset.updates=String(Number(document.body.dataset.updates||0)+1);ages();}});
"""
    )


CLUSTER_JS = live_js("/events/cluster", "cluster")


def cluster_sections(
    status: dict[str, Any],
    last_run: dict[str, Any] | None,
    doctor: dict[str, Any] | None = None,
    *,
    hardware: dict[str, Any] | None = None,
    load: dict[str, Any] | None = None,
    boot: dict[str, Any] | None = None,
    now: float | None = None,
    base: str = "",
) -> str:
    """The cluster page's sections, each with its id (what /events/cluster sends again)."""
    now = time.time() if now is None else now
    v = status.get("verdict") or {}
    state = v.get("state", "?")
    cls = PASSING.get(state, "bad")
    reasons = "; ".join(str(r) for r in v.get("reasons") or [])
    live = ""
    if state in ("restarting", "experimenting") or (boot or {}).get("active"):
        live = f'<p><a id=bootlink href="{url(base, "/boot")}">follow the boot live</a></p>'
    parts = [
        section(
            f"Cluster {status.get('cluster')}",
            f'<p id="verdict" class="big {cls}">{esc(state)}</p><p>{esc(reasons)}</p>{live}'
            f"<p>{ago('status', status.get('time'), now)}, read at {when(status.get('time'))}</p>",
            ident="summary",
        )
    ]
    parts.append(section("Nodes", _nodes(status, hardware, now), ident="nodes"))
    budget = status.get("budget") or {}
    parts.append(section("Budget", _budget(budget, now=now), ident="budget"))
    engine = _engine(status.get("engine") or {}, state, status.get("runs") or {}, base)
    parts.append(section("Engine", engine, ident="engine"))
    up = bool((status.get("engine") or {}).get("up"))
    parts.append(section("Load, last hour", _load(load, now, engine_up=up), ident="load"))
    parts.append(section("Knobs", _knobs(status), ident="knobs"))
    parts.append(section("Lock and runs", _runs(status.get("runs") or {}, last_run, now),
                         ident="runs"))  # fmt: skip
    parts.append(section("Doctor", _doctor(doctor, now), ident="doctor"))
    return "".join(parts)


def cluster_page(
    status: dict[str, Any],
    last_run: dict[str, Any] | None,
    doctor: dict[str, Any] | None = None,
    **more: Any,
) -> str:
    """Verdict, nodes and their panels, budget and its window, engine, load, knobs, lock and
    runs, the last doctor result; live (CLUSTER_JS)."""
    body = cluster_sections(status, last_run, doctor, **more)
    return page("Cluster", "/", body, script=CLUSTER_JS, base=more.get("base", ""))


def _num(value: object) -> float | None:
    """A finite number or None."""
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def _nodes(status: dict[str, Any], hardware: dict[str, Any] | None, now: float) -> str:
    """One panel per node: reachable and latency, then what its node facts say (GPU use,
    memory and power, MemAvailable, the engine rank on it)."""
    known = (hardware or {}).get("nodes") or {}
    panels = []
    for n in status.get("nodes") or []:
        name = n.get("name")
        up = '<span class="ok">up</span>' if n.get("reachable") else '<span class="bad">DOWN</span>'
        detail = f"{esc(n.get('latency_ms'))} ms" if n.get("reachable") else esc(n.get("error"))
        rows = [("role", esc(n.get("role"))), ("address", esc(n.get("address"))),
                ("reachable", f"{up} {detail}")]  # fmt: skip
        f = known.get(name) if isinstance(name, str) else None
        if isinstance(f, dict):
            fresh = bool(n.get("reachable")) and facts_fresh(hardware, now)
            if not fresh and not f.get("error"):
                why = "the node does not answer now" if not n.get("reachable") else "not read since"
                read = ago("read", (hardware or {}).get("time"), now)
                rows.append(("facts", f'<span class="warn stale">stale ({why}): {read}</span>'))
            rows += _fact_rows(f)
        dl = "".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in rows)
        panels.append(
            f'<div class=panel id="node-{esc(name)}"><h3>{esc(name)}</h3><dl>{dl}</dl></div>'
        )
    when_read = ago("node facts", (hardware or {}).get("time"), now) if hardware else ""
    said = (hardware or {}).get("error")
    err = f'<p class="bad">{esc(said)}</p>' if said else ""
    return f"<div class=grid>{''.join(panels)}</div>{err}<p>{when_read}</p>"


def _fact_rows(f: dict[str, Any]) -> list[tuple[str, str]]:
    """A node's facts as panel rows (each escaped)."""
    if f.get("error"):
        return [("facts", f'<span class="bad">{esc(f["error"])}</span>')]
    rows = []
    gpu = f.get("gpu")
    if isinstance(gpu, dict):
        util, power = _num(gpu.get("util_pct")), _num(gpu.get("power_w"))
        used, total = _num(gpu.get("mem_used_mib")), _num(gpu.get("mem_total_mib"))
        rows.append(("GPU", esc(gpu.get("name"))))
        rows.append(("GPU use", "—" if util is None else f"{util:.0f} %"))
        rows.append(("GPU memory", "unified with the host (no figure)" if total is None
                     else f"{(used or 0) / 1024:.1f} / {total / 1024:.1f} GiB"))  # fmt: skip
        rows.append(("power", "—" if power is None else f"{power:.1f} W"))
    else:
        rows.append(("GPU", f"<span class=muted>{esc(f.get('gpu_note') or 'no GPU read')}</span>"))
    avail, mtotal = _num(f.get("mem_available")), _num(f.get("mem_total"))
    if avail is not None:
        of = f" of {mtotal / GIB:.1f}" if mtotal else ""
        rows.append(("MemAvailable", f"{avail / GIB:.1f}{of} GiB"))
    ranks = [str(r) for r in f.get("ranks") or []]
    rows.append(("engine", esc("; ".join(ranks)) if ranks else "<span class=muted>no rank</span>"))
    return rows


def _doctor(last: dict[str, Any] | None, now: float) -> str:
    """The last doctor result kept on this machine: when, who, counts, the checks not ok."""
    if last is None:
        return (
            "<p class=muted>no doctor run kept on this machine: run "
            "<code>spark-ops doctor</code></p>"
        )
    if "error" in last:
        return f'<p class="bad">last doctor report unreadable: {esc(last["error"])}</p>'
    report = last["report"]
    checks = [c for c in report["checks"] if isinstance(c, dict)]
    bad = [c for c in checks if c.get("status") != "ok"]
    cls = "ok" if report.get("ok") else "bad"
    verdict = "ready for apply" if report.get("ok") else "not ready for apply"
    out = (
        f'<p><span class="{cls}">{verdict}</span>: {len(checks) - len(bad)} of {len(checks)} '
        f"checks ok, by {esc(last.get('who'))} at {when(last.get('when'))} "
        f"({ago('doctor report', last.get('when'), now)})</p>"
    )
    rows = [
        [esc(c.get("status")), esc(c.get("name")), esc(c.get("host")), esc(c.get("detail")),
         esc(c.get("fix"))]
        for c in bad
    ]  # fmt: skip
    if rows:
        out += table(["", "check", "host", "detail", "fix"], rows)
    return out


def _budget(b: dict[str, Any], *, now: float | None = None) -> str:
    """The restart budget box: the gauge, the next free slot, the window's stamps on a line and
    in a list (when, who, why)."""
    if "used" not in b:
        return f'<p class="bad">watchdog budget unreadable: {esc(b.get("error"))}</p>'
    now = time.time() if now is None else now
    spent = b["used"] >= b["allowed"]
    cls = "bad" if spent else "ok"
    out = (
        f'<p class="big {cls}">{esc(b["used"])} / {esc(b["allowed"])} restarts used</p>'
        f"{budget_gauge(int(b['used']), int(b['allowed']))}"
        f"<p>window {esc(round(float(b['window_s']) / 3600, 2))} h; "
    )
    if spent:
        out += f"next free slot at <strong id=nextfree>{when(b.get('next_free_at'))}</strong></p>"
    else:
        out += f"<span id=nextfree>{esc(b.get('remaining'))} left now</span></p>"
    flags = []
    if b.get("pause"):  # lease.pause_shown's words: a lapsed lease is no pause
        flags.append(f'<span class="warn">{esc(b["pause"]["text"])}</span>')
    if b.get("gave_up"):
        flags.append(f'<span class="bad">watchdog GAVE UP: {esc(b.get("gave_up_reason"))}</span>')
    if flags:
        out += "<p>" + " · ".join(flags) + "</p>"
    stamps = [s for s in b.get("stamps") or [] if isinstance(s, dict)]
    head_now = _num(b.get("now"))
    window = _num(b.get("window_s"))
    if head_now is not None and window is not None:
        out += stamp_timeline(stamps, now=head_now, window_s=window,
                              next_free=_num(b.get("next_free_at")))  # fmt: skip
    rows = [
        [when(s.get("stamp")), esc(s.get("by")), esc(s.get("reason") or "(no journal entry)")]
        for s in reversed(stamps[-20:])
    ]
    if rows:
        out += table(["stamp in the window", "by", "why"], rows)
    return out


def _engine(
    e: dict[str, Any], state: str = "", runs: dict[str, Any] | None = None, base: str = ""
) -> str:
    """The engine box: its models, version and load; while a run restarts it, amber with the run
    and the live boot; down, with the reason status gave."""
    if not e.get("up"):
        if state in ("restarting", "experimenting"):
            run = (runs or {}).get("experiment") or (runs or {}).get("in_progress")
            return (
                f'<p class="warn" id=enginestate>restarting: {esc(run or "a run holds the lock")}'
                "</p><p>the engine answers again when its boot ends: "
                f'<a href="{url(base, "/boot")}">follow the boot live</a></p>'
            )
        why = e.get("error") or "the engine did not answer and status recorded no reason"
        out = f'<p class="bad" id=enginestate>not serving: {esc(why)}</p>'
        inst = e.get("instance") or {}
        if inst:
            out += f"<p>instance: {esc(inst.get('source'))} pid {esc(inst.get('pid'))}</p>"
        return out
    rows = [
        ["models", esc(", ".join(str(m) for m in e.get("models") or []))],
        ["vLLM", esc(e.get("version"))],
        ["running / waiting", f"{esc(e.get('running'))} / {esc(e.get('waiting'))}"],
        ["KV cache usage", esc(e.get("kv_cache_usage"))],
    ]
    inst = e.get("instance") or {}
    if inst:
        rows.append(["instance", f"{esc(inst.get('source'))} pid {esc(inst.get('pid'))}"])
    left = e.get("leftovers") or []
    if left:
        names = ", ".join(f"{p['pid']} ({p['name']})" for p in left)
        rows.append(["left by a dead engine", f'<span class="bad">{esc(names)}</span>'])
        rows.append(["fix", f"<code>{esc(e.get('leftovers_fix'))}</code>"])
    else:
        rows.append(["leftovers", '<span class="ok">none</span>'])
    busy = ""
    if state in ("restarting", "experimenting"):  # the outgoing engine still answers
        busy = (
            '<p class="warn" id=enginestate>a run is restarting it: '
            f"{esc((runs or {}).get('experiment') or (runs or {}).get('in_progress'))} · "
            f'<a href="{url(base, "/boot")}">follow the boot live</a></p>'
        )
    return busy + table(["", ""], rows)


def _knobs(status: dict[str, Any]) -> str:
    """The recipe's knobs and the engine's effective arguments."""
    r = status.get("recipe") or {}
    e = status.get("engine") or {}
    if "knobs" not in r:
        return f'<p class="bad">recipe: {esc(r.get("error"))}</p>'
    eff = e.get("effective") or {}
    rows = [[esc(k), esc(v), esc(eff.get(k, ""))] for k, v in r["knobs"].items()]
    same = "" if r.get("same_on_all_nodes") else '<p class="bad">recipe copies DIFFER</p>'
    return f"<p>recipe <code>{esc(r.get('path'))}</code></p>{same}" + table(
        ["knob", "recipe", "effective (engine log)"], rows
    )


def _runs(runs: dict[str, Any], last_run: dict[str, Any] | None, now: float) -> str:
    """The lock's holder, unfinished runs, the last run."""
    if "error" in runs:
        return f'<p class="bad">runs unreadable: {esc(runs["error"])}</p>'
    if "lock_held" not in runs:  # the head did not answer: nothing is known, nothing is "free"
        return '<p class="bad">lock and runs unknown: the head did not answer</p>'
    out = (
        f'<p class="warn">lock held: {esc(runs.get("in_progress"))}</p>'
        if runs.get("lock_held")
        else "<p>lock free</p>"
    )
    rows = [
        [esc(r.get("run")), esc(r.get("operation")), esc(r.get("who")), esc(r.get("last_step")),
         f"<code>{esc(r.get('command'))}</code>"]
        for r in runs.get("unfinished") or []
    ]  # fmt: skip
    if rows:
        out += table(["unfinished run", "operation", "who", "last step", "finish it"], rows)
    else:
        out += "<p>no unfinished run</p>"
    if last_run:
        cls = "ok" if last_run["ok"] else "bad"
        out += (
            f"<p>last run: {esc(last_run['operation'])} by {esc(last_run['who'])} at "
            f'{when(last_run["when"])}: <span class="{cls}">{esc(last_run["outcome"])}</span> '
            f"({ago('last run', last_run.get('when'), now)})</p>"
        )
    return out


def _load(load: dict[str, Any] | None, now: float, *, engine_up: bool = True) -> str:
    """Running and waiting requests and generated tok/s over the last hour, from the engine's
    /metrics as this server scraped it; the last figures are `now` only while current (the
    engine up, the scrape within two intervals), else said stale with their age."""
    if not load:
        return "<p class=muted>the engine's load is not scraped by this server</p>"
    samples = [x for x in load.get("samples") or [] if isinstance(x, dict)]
    span = float(load.get("span_s") or 3600)

    def pts(key: str) -> list[tuple[float, float | None]]:
        """One series."""
        return [(float(x["at"]), _num(x.get(key))) for x in samples]

    last = next((x for x in reversed(samples) if x.get("running") is not None), None)
    rate = next((x for x in reversed(samples) if x.get("tok_s") is not None), None)
    figures = (
        f"{esc(last.get('running'))} running, {esc(last.get('waiting'))} waiting, "
        f"{esc(_tok(rate.get('tok_s') if rate else None))} tok/s"
        if last
        else ""
    )
    if not last:
        said = "<p id=loadnow class=muted>no answer from the engine's /metrics yet</p>"
    elif fresh_sample(load, engine_up, now) is not None:
        said = f"<p id=loadnow>now: {figures}</p>"
    else:
        why = "the engine is down now" if not engine_up else "no answer since"
        said = (
            f'<p id=loadnow class="warn stale">stale ({why}): {figures}, '
            f"{ago('last answer', last.get('at'), now)}</p>"
        )
    requests = time_series([("running", pts("running")), ("waiting", pts("waiting"))],
                           now=now, span_s=span, ident="chart-requests")  # fmt: skip
    tok = time_series([("generated tok/s", pts("tok_s"))], now=now, span_s=span, ident="chart-tok")
    err = f'<p class="warn">{esc(load["error"])}</p>' if load.get("error") else ""
    age = ago("engine scrape", load.get("last_ok"), now)
    return (
        f"{said}{err}<h3>requests</h3>{requests}<h3>tok/s</h3>{tok}<p>{age}, every "
        f"{esc(load.get('interval_s'))} s, {len(samples)} kept</p>"
    )


def _tok(value: object) -> str:
    """tok/s rounded for text."""
    v = _num(value)
    return "—" if v is None else f"{v:.1f}"
