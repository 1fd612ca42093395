"""The pages: server-rendered HTML, inline CSS and a little inline JS, no external URL.

Every value shown goes through `esc` (html.escape): node names, recipe values, reasons, log lines
and diffs are text from the cluster and its operators, never markup. The boot page's script
writes only with textContent.
"""

from __future__ import annotations

import datetime as dt
import html
import json
import math
from collections.abc import Iterable, Sequence
from typing import Any

from spark_ops.readiness import PHASE_ORDER

CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:0;color:#1b1f24;background:#f6f7f9}
header{background:#1b1f24;color:#fff;padding:.6em 1em;display:flex;gap:1.5em;align-items:center}
header a{color:#cfd8e3;text-decoration:none}header a.on{color:#fff;font-weight:600}
main{padding:1em;max-width:1100px}section{background:#fff;border:1px solid #d8dde3;
border-radius:6px;padding:.6em 1em;margin:0 0 1em}h2{font-size:1.05em;margin:.2em 0 .5em}
table{border-collapse:collapse;width:100%}td,th{text-align:left;padding:.2em .6em;
border-bottom:1px solid #eef0f3;vertical-align:top}th{font-weight:600;color:#555}
.ok{color:#1a7f37}.warn{color:#9a6700}.bad{color:#cf222e}.muted{color:#777}
pre{background:#f6f8fa;padding:.5em;overflow-x:auto;font-size:12px;margin:.3em 0}
.add{color:#1a7f37}.del{color:#cf222e}.big{font-size:1.5em;font-weight:600}
ol.phases{list-style:none;padding:0;display:flex;flex-wrap:wrap;gap:.3em}
ol.phases li{padding:.3em .6em;border-radius:4px;background:#eef0f3}
ol.phases li.done{background:#dafbe1}ol.phases li.now{background:#fff8c5;font-weight:600}
"""

MAX_STAMPS_SHOWN = 500  # a history page stays a page: the newest stamps, the rest via the CLI
NAV = (("/", "Cluster"), ("/boot", "Boot"), ("/history", "History"), ("/sweeps", "Sweeps"))


def esc(value: object) -> str:
    """Any value as HTML text (None as a dash)."""
    if value is None:
        return "—"
    return html.escape(str(value), quote=True)


def when(stamp: object) -> str:
    """A Unix time as UTC text, escaped; a dash when absent or not a number."""
    if not isinstance(stamp, int | float) or not math.isfinite(stamp):
        return "—"
    try:
        text = dt.datetime.fromtimestamp(float(stamp), dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    except (OverflowError, OSError, ValueError):
        return esc(stamp)
    return esc(text)


def page(title: str, path: str, body: str, *, script: str = "") -> str:
    """A whole page around its body."""
    nav = "".join(
        f'<a href="{href}"{" class=on" if href == path else ""}>{esc(label)}</a>'
        for href, label in NAV
    )
    js = f"<script>{script}</script>" if script else ""
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width,initial-scale=1">'
        f"<title>{esc(title)} · spark-ops</title><style>{CSS}</style></head><body>"
        f"<header><strong>spark-ops</strong>{nav}<span class=muted>read-only</span></header>"
        f"<main>{body}</main>{js}</body></html>"
    )


def table(heads: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """A table of cells that are already HTML (escaped by the caller)."""
    head = "".join(f"<th>{esc(h)}</th>" for h in heads)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def section(title: str, inner: str, *, ident: str = "") -> str:
    """A titled box."""
    attr = f' id="{esc(ident)}"' if ident else ""
    return f"<section{attr}><h2>{esc(title)}</h2>{inner}</section>"


def diff_html(diff: str) -> str:
    """A unified diff, coloured, escaped."""
    out = []
    for line in diff.splitlines():
        cls = ""
        if line.startswith("+") and not line.startswith("+++"):
            cls = "add"
        elif line.startswith("-") and not line.startswith("---"):
            cls = "del"
        out.append(f'<span class="{cls}">{esc(line)}</span>' if cls else esc(line))
    return "<pre>" + "\n".join(out) + "</pre>"


def cluster_page(
    status: dict[str, Any], last_run: dict[str, Any] | None, doctor: dict[str, Any] | None = None
) -> str:
    """Nodes, engine, knobs in effect, budget and next slot, lock, runs, leftovers, the last
    doctor result."""
    v = status.get("verdict") or {}
    state = v.get("state", "?")
    cls = {"serving": "ok", "degraded": "warn"}.get(state, "bad")
    reasons = "; ".join(str(r) for r in v.get("reasons") or [])
    parts = [
        section(
            f"Cluster {status.get('cluster')}",
            f'<p id="verdict" class="big {cls}">{esc(state)}</p><p>{esc(reasons)}</p>'
            f"<p class=muted>read at {when(status.get('time'))}</p>",
        )
    ]
    rows = []
    for n in status.get("nodes") or []:
        up = '<span class="ok">up</span>' if n["reachable"] else '<span class="bad">DOWN</span>'
        detail = f"{esc(n['latency_ms'])} ms" if n["reachable"] else esc(n["error"])
        rows.append([esc(n["name"]), esc(n["role"]), esc(n["address"]), up, detail])
    parts.append(section("Nodes", table(["node", "role", "address", "", ""], rows)))
    parts.append(section("Budget", _budget(status.get("budget") or {}), ident="budget"))
    parts.append(section("Engine", _engine(status.get("engine") or {})))
    parts.append(section("Knobs", _knobs(status), ident="knobs"))
    parts.append(section("Lock and runs", _runs(status.get("runs") or {}, last_run)))
    parts.append(section("Doctor", _doctor(doctor), ident="doctor"))
    return page("Cluster", "/", "".join(parts))


def _doctor(last: dict[str, Any] | None) -> str:
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
        f"checks ok, by {esc(last.get('who'))} at {when(last.get('when'))}</p>"
    )
    rows = [
        [esc(c.get("status")), esc(c.get("name")), esc(c.get("host")), esc(c.get("detail")),
         esc(c.get("fix"))]
        for c in bad
    ]  # fmt: skip
    if rows:
        out += table(["", "check", "host", "detail", "fix"], rows)
    return out


def _budget(b: dict[str, Any]) -> str:
    """The restart budget box."""
    if "used" not in b:
        return f'<p class="bad">watchdog budget unreadable: {esc(b.get("error"))}</p>'
    spent = b["used"] >= b["allowed"]
    cls = "bad" if spent else "ok"
    out = (
        f'<p class="big {cls}">{esc(b["used"])} / {esc(b["allowed"])} restarts used</p>'
        f"<p>window {esc(round(float(b['window_s']) / 3600, 2))} h; "
    )
    if spent:
        out += f"next free slot at <strong>{when(b.get('next_free_at'))}</strong></p>"
    else:
        out += f"{esc(b.get('remaining'))} left now</p>"
    flags = []
    if b.get("pause"):  # lease.pause_shown's words: a lapsed lease is no pause
        flags.append(f'<span class="warn">{esc(b["pause"]["text"])}</span>')
    if b.get("gave_up"):
        flags.append(f'<span class="bad">watchdog GAVE UP: {esc(b.get("gave_up_reason"))}</span>')
    if flags:
        out += "<p>" + " · ".join(flags) + "</p>"
    return out


def _engine(e: dict[str, Any]) -> str:
    """The engine box."""
    if not e.get("up"):
        return f'<p class="bad">not serving: {esc(e.get("error"))}</p>'
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
    return table(["", ""], rows)


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


def _runs(runs: dict[str, Any], last_run: dict[str, Any] | None) -> str:
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
            f'{when(last_run["when"])}: <span class="{cls}">{esc(last_run["outcome"])}</span></p>'
        )
    return out


def history_page(status: dict[str, Any], audit: dict[str, Any]) -> str:
    """Every stamp with its reason and who; every audited change with its diff."""
    b = status.get("budget") or {}
    every = list(b.get("stamps") or [])
    rows = [
        [esc(s.get("stamp")), when(s.get("stamp")), esc(s.get("reason") or "(no journal entry)"),
         esc(s.get("by"))]
        for s in every[-MAX_STAMPS_SHOWN:]
    ]  # fmt: skip
    stamps = (
        table(["stamp", "time", "reason", "by"], rows) if rows else "<p>no stamp in the window</p>"
    )
    if len(every) > MAX_STAMPS_SHOWN:
        stamps = (
            f'<p class="warn">{len(every)} stamps in the window: the newest {MAX_STAMPS_SHOWN} '
            "shown (all of them: <code>spark-ops budget --json</code>)</p>" + stamps
        )
    if "error" in b:
        stamps = f'<p class="bad">{esc(b["error"])}</p>'
    elif "used" not in b:
        stamps = '<p class="bad">the restart history was not read (the head did not answer)</p>'
    entries = []
    for e in reversed(audit.get("entries") or []):
        if "malformed" in e:
            entries.append(f'<p class="warn">unreadable line: {esc(str(e["malformed"])[:200])}</p>')
            continue
        if e.get("phase") == "step":
            continue
        what: dict[str, Any] = e["what"] if isinstance(e.get("what"), dict) else {}
        args: dict[str, Any] = what["args"] if isinstance(what.get("args"), dict) else {}
        arg_text = " ".join(f"{k}={v}" for k, v in args.items())
        outcome = e.get("outcome") or ("did not end" if e.get("phase") == "intent" else "")
        cls = "ok" if outcome in ("ok", "done") else "bad"
        mark = (
            '<span class="warn">unattributed: not written by spark-ops on the head</span> '
            if e.get("unattributed")
            else ""
        )
        block = (
            f"<p>{mark}<strong>{when(e.get('when'))}</strong> {esc(e.get('who'))} "
            f"<code>{esc(what.get('operation'))} {esc(arg_text)}</code> "
            f"on {esc(', '.join(str(n) for n in e.get('nodes') or []))}: "
            f'<span class="{cls}">{esc(outcome)}</span></p>'
        )
        if e.get("diff"):
            block += diff_html(str(e["diff"]))
        entries.append(block)
    err = f'<p class="bad">{esc(audit["error"])}</p>' if audit.get("error") else ""
    body = section("Restart stamps in the window", stamps) + section(
        "Audit log (newest first)", err + ("".join(entries) or "<p>empty</p>")
    )
    return page("History", "/history", body)


BOOT_JS = """
const phases=document.querySelectorAll('#phases li');
function show(s){
 const order=[...phases].map(li=>li.dataset.phase);const at=order.indexOf(s.phase);
 phases.forEach((li,i)=>{li.className=i<at?'done':(i===at?(s.active?'now':'done'):'')});
 document.getElementById('bphase').textContent=s.phase||'—';
 document.getElementById('bstate').textContent=s.active?'booting':'no boot under way';
 document.getElementById('bin').textContent=s.active?s.seconds_in_phase+' s':'—';
 document.getElementById('beta').textContent=s.eta_s==null?'unknown':s.eta_s+' s';
 document.getElementById('berr').textContent=s.error||'';
 document.getElementById('blines').textContent=(s.lines||[]).join('\\n');
}
show(JSON.parse(document.getElementById('init').textContent));
const es=new EventSource('/events');
es.addEventListener('boot',m=>{const d=JSON.parse(m.data);show(d.state);
 document.getElementById('blast').textContent=d.event.kind+' '+d.event.phase;});
"""


def boot_page(boots: dict[str, Any]) -> str:
    """The live boot (phases, time in phase, ETA, lines) and past boots' timelines."""
    live = boots["live"]
    usual = boots.get("usual_s") or {}
    items = "".join(
        f'<li data-phase="{esc(p.value)}">{esc(p.value)}'
        f"{' ~' + esc(round(usual[p.value])) + ' s' if p.value in usual else ''}</li>"
        for p in PHASE_ORDER
    )
    init = json.dumps(live).replace("<", "\\u003c")  # inside <script>: no tag can end it early
    body = section(
        "Boot, live",
        f"<p><span id=bstate></span> · phase <strong id=bphase></strong> for "
        f"<span id=bin></span> · ETA <span id=beta></span> · last event "
        f"<span id=blast class=muted>—</span></p><ol id=phases class=phases>{items}</ol>"
        f'<p id=berr class="bad"></p><pre id=blines></pre>'
        f'<script type="application/json" id=init>{init}</script>',
        ident="live",
    )
    rows = []
    for b in boots.get("recorded") or []:
        durations = b.get("durations") or {}
        timeline = ", ".join(f"{k} {float(v):.0f} s" for k, v in durations.items())
        rows.append([when(b.get("at")), esc(_secs(b.get("total_s"))), esc(timeline)])
    past = table(["started", "total", "phases"], rows) if rows else "<p>no boot recorded</p>"
    watched = [
        [when(b.get("started_at")), esc(b.get("outcome")), esc(_secs(b.get("total_s"))),
         esc(b.get("error"))]
        for b in boots.get("watched_here") or []
    ]  # fmt: skip
    body += section("Boots recorded by spark-ops on this machine (the ETAs' source)", past)
    if watched:
        body += section(
            "Boots this server watched", table(["started", "outcome", "total", "error"], watched)
        )
    return page("Boot", "/boot", body, script=BOOT_JS)


def _secs(value: object) -> str:
    """Seconds as text."""
    return f"{float(value):.0f} s" if isinstance(value, int | float) else "—"


CHART_W, CHART_H, PAD = 640, 260, 40
COLORS = ("#0969da", "#bf3989", "#1a7f37", "#9a6700", "#8250df")


def svg_chart(series: list[dict[str, Any]], *, y_label: str) -> str:
    """An inline SVG line chart of (concurrency, value) series; dashed series are predictions,
    their untrusted points hollow and marked "?"."""
    points = [p for s in series for p in s["points"] if p[1] is not None]
    if not points:
        return "<p class=muted>nothing to draw</p>"
    xs = sorted({p[0] for p in points})
    y_max = max(p[1] for p in points) * 1.1 or 1.0
    x_max = max(xs) or 1

    def sx(x: float) -> float:
        """x (concurrency, log2 scale) to pixels."""
        return PAD + (CHART_W - 2 * PAD) * (math.log2(x) / math.log2(x_max) if x_max > 1 else 0)

    def sy(y: float) -> float:
        """y to pixels."""
        return CHART_H - PAD - (CHART_H - 2 * PAD) * y / y_max

    out = [
        f'<svg role="img" viewBox="0 0 {CHART_W} {CHART_H}" width="{CHART_W}" height="{CHART_H}"'
        ' xmlns="http://www.w3.org/2000/svg" font-size="11">',
        f'<line x1="{PAD}" y1="{CHART_H - PAD}" x2="{CHART_W - PAD}" y2="{CHART_H - PAD}" '
        'stroke="#999"/>',
        f'<line x1="{PAD}" y1="{PAD}" x2="{PAD}" y2="{CHART_H - PAD}" stroke="#999"/>',
        f'<text x="{CHART_W / 2}" y="{CHART_H - 8}" text-anchor="middle">concurrency</text>',
        f'<text x="4" y="{PAD - 12}">{esc(y_label)} (max {esc(round(y_max / 1.1, 1))})</text>',
    ]
    out += [
        f'<text x="{sx(x):.1f}" y="{CHART_H - PAD + 14}" text-anchor="middle">{esc(x)}</text>'
        for x in xs
        if x > 0
    ]
    for i, s in enumerate(series):
        color = COLORS[i % len(COLORS)]
        pts = [(x, y, trusted) for x, y, trusted in s["points"] if y is not None and x > 0]
        dash = ' stroke-dasharray="5 4"' if s["predicted"] else ""
        path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y, _ in pts)
        out.append(f'<polyline fill="none" stroke="{color}" points="{path}"{dash}>'
                   f"<title>{esc(s['label'])}</title></polyline>")  # fmt: skip
        for x, y, trusted in pts:
            fill = color if trusted else "#fff"
            out.append(
                f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="3.5" fill="{fill}" '
                f'stroke="{color}"><title>{esc(s["label"])}: {esc(x)} → {esc(round(y, 1))}'
                f"{'' if trusted else ' (not to be trusted)'}</title></circle>"
            )
            if not trusted:
                out.append(f'<text x="{sx(x) + 5:.1f}" y="{sy(y) - 5:.1f}" fill="#cf222e">?</text>')
        ly = PAD + 14 * i
        out.append(f'<text x="{CHART_W - PAD - 200}" y="{ly}" fill="{color}">{esc(s["label"])}'
                   "</text>")  # fmt: skip
    out.append("</svg>")
    return "".join(out)


def _series(runs: list[dict[str, Any]], key: str, whatif_key: str) -> list[dict[str, Any]]:
    """Measured series of each run and the predicted series of its what-if caps."""
    series = []
    for run in runs:
        result = run.get("result")
        if not result:
            continue
        levels = result.get("levels") or []
        pts = [
            (c, _num(lv.get(key)), True)
            for lv in levels
            if isinstance(lv, dict) and (c := _count(lv.get("max_concurrency"))) is not None
        ]
        series.append({"label": f"{run['file']} (measured)", "points": pts, "predicted": False})
        for cap in (run.get("whatif") or {}).get("caps") or []:
            pred = [
                (c, _num(p.get(whatif_key)), bool(p.get("trusted", True)))
                for p in cap["points"]
                if p.get("source") == "predicted"
                and (c := _count(p.get("concurrency"))) is not None
            ]
            if pred:
                label = f"{run['file']} what-if cap {cap['cap']} (predicted)"
                series.append({"label": label, "points": pred, "predicted": True})
    return series


def _count(value: object) -> int | None:
    """A concurrency level (a positive int) or None."""
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    return None


def _num(value: object) -> float | None:
    """A finite number or None."""
    if isinstance(value, int | float) and math.isfinite(value):
        return float(value)
    return None


def sweeps_page(sweeps: dict[str, Any]) -> str:
    """Saved sweeps: a table per run and charts of tok/s and per-user tok/s vs concurrency."""
    if sweeps.get("dir") is None:
        body = section(
            "Sweeps",
            "<p>no results directory: start the server with <code>--results DIR</code> "
            "(the JSON files <code>spark-ops bench -o DIR/NAME.json</code> writes)</p>",
        )
        return page("Sweeps", "/sweeps", body)
    runs = sweeps.get("runs") or []
    parts = []
    if sweeps.get("error"):
        parts.append(f'<p class="bad">{esc(sweeps["error"])}</p>')
    if runs:
        parts.append(
            section(
                "Aggregate tok/s",
                svg_chart(_series(runs, "output_throughput", "aggregate_tok_s"), y_label="tok/s"),
                ident="chart-aggregate",
            )
        )
        parts.append(
            section(
                "Per-user tok/s",
                svg_chart(
                    _series(runs, "per_user_tok_s", "per_user_tok_s"), y_label="tok/s per user"
                ),
                ident="chart-per-user",
            )
        )
        parts.append(
            "<p class=muted>solid: measured; dashed: what-if predictions (bench's own model), "
            "hollow points marked ? are the ones it says not to trust</p>"
        )
    for run in runs:
        if "error" in run:
            parts.append(section(run["file"], f'<p class="bad">{esc(run["error"])}</p>'))
            continue
        r = run["result"]
        rows = [
            [esc(lv.get("max_concurrency")), esc(_round(lv.get("output_throughput"))),
             esc(_round(lv.get("per_user_tok_s"))), esc(_round(lv.get("p99_ttft_ms"))),
             esc(lv.get("completed")), esc(lv.get("failed"))]
            for lv in r.get("levels") or []
        ]  # fmt: skip
        knobs = ", ".join(f"{k}={v}" for k, v in (r.get("knobs") or {}).items())
        info = f"<p>{esc(r.get('model'))} · {esc(r.get('started_at'))} · knobs {esc(knobs)}</p>"
        table_html = table(
            ["concurrency", "tok/s", "per user tok/s", "TTFT p99 ms", "done", "failed"], rows
        )
        warn = "".join(
            f'<p class="warn">{esc(w)}</p>' for w in (run.get("whatif") or {}).get("warnings") or []
        )
        if run.get("whatif_error"):
            warn += f'<p class="muted">what-if: {esc(run["whatif_error"])}</p>'
        parts.append(section(run["file"], info + table_html + warn))
    if not runs:
        parts.append(section("Sweeps", f"<p>no result in {esc(sweeps['dir'])}</p>"))
    return page("Sweeps", "/sweeps", "".join(parts))


def _round(value: object) -> object:
    """A number rounded to one decimal for a table."""
    return round(value, 1) if isinstance(value, float) else value
