"""The pages' common parts: the style, the frame, tables, boxes, times and ages as text.

Every value shown goes through `esc` (html.escape): node names, recipe values, reasons, log lines
and diffs are text from the cluster and its operators, never markup.
"""

from __future__ import annotations

import datetime as dt
import html
import json
import math
from collections.abc import Iterable, Sequence
from typing import Any

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
.age{color:#777;font-size:.9em}.grid{display:grid;grid-template-columns:repeat(auto-fill,
minmax(240px,1fr));gap:.6em}.panel{border:1px solid #eef0f3;border-radius:4px;padding:.4em .6em}
.panel h3{font-size:1em;margin:0 0 .3em}.panel dl{margin:0;display:grid;
grid-template-columns:auto 1fr;gap:0 .6em}.panel dt{color:#555}.panel dd{margin:0}
"""

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


def age_text(seconds: float) -> str:
    """An age as a person reads it: "just now", "40 s", "5 min", "3 h", "2 d" (AGE_JS's rule)."""
    s = max(0.0, seconds)
    if s < 5:
        return "just now"
    if s < 90:
        return f"{s:.0f} s old"
    if s < 90 * 60:
        return f"{s / 60:.0f} min old"
    if s < 36 * 3600:
        return f"{s / 3600:.0f} h old"
    return f"{s / 86400:.0f} d old"


def ago(what: str, at: object, now: float) -> str:
    """`what` and its age ("doctor report 3 h old"), ticking in the page (AGE_JS); the age of
    something never read is said so."""
    if not isinstance(at, int | float) or not math.isfinite(at) or at <= 0:
        return f"<span class=age>{esc(what)}: not read yet</span>"
    return (
        f'<span class=age data-at="{float(at):.3f}" data-what="{esc(what)}">'
        f"{esc(what)} {esc(age_text(now - float(at)))}</span>"
    )


# every .age element's text, kept current from the server's clock (`skew`: its time minus ours)
AGE_JS = """
let skew=0;
function ageText(s){s=Math.max(0,s);if(s<5)return 'just now';if(s<90)return Math.round(s)+' s old';
 if(s<5400)return Math.round(s/60)+' min old';if(s<129600)return Math.round(s/3600)+' h old';
 return Math.round(s/86400)+' d old';}
function ages(){const now=Date.now()/1000+skew;document.querySelectorAll('.age[data-at]')
 .forEach(e=>{e.textContent=e.dataset.what+' '+ageText(now-Number(e.dataset.at));});}
setInterval(ages,1000);
"""


def url(base: str, path: str) -> str:
    """The one place a page's address is made: `path` ("/boot") under the cluster's `base`
    ("" for the single cluster served at /, "/c/NAME" for a fleet's cluster); escaped."""
    return esc(base.rstrip("/") + path)


def page(
    title: str, path: str, body: str, *, script: str = "", base: str = "", fleet: bool = False
) -> str:
    """A whole page around its body; under a fleet (a `base`) its nav leads back to the fleet,
    and the fleet's own page (`fleet`) has no cluster's nav."""
    nav = "".join(
        f'<a href="{url(base, href)}"{" class=on" if href == path else ""}>{esc(label)}</a>'
        for href, label in NAV
    )
    if fleet:
        nav = '<a href="/" class=on>Fleet</a>'
    elif base:
        nav = f'<a href="/">Fleet</a><span>{esc(base.rsplit("/", 1)[-1])}</span>' + nav
    js = f"<script>{script}</script>" if script else ""
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width,initial-scale=1">'
        f"<title>{esc(title)} · spark-ops</title><style>{CSS}</style></head>"
        f'<body data-base="{url(base, "")}">'
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


def json_text(data: Any) -> str:
    """`data` as strict JSON (no NaN nor Infinity: those are null)."""
    return json.dumps(finite(data), default=str, allow_nan=False)


def finite(data: Any) -> Any:
    """`data` with every float that is not finite replaced by None (dicts, lists, tuples)."""
    if isinstance(data, float):
        return data if math.isfinite(data) else None
    if isinstance(data, dict):
        return {k: finite(v) for k, v in data.items()}
    if isinstance(data, list | tuple):
        return [finite(v) for v in data]
    return data
