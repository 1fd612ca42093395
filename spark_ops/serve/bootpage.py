"""The boot page: the live boot (phases, time in phase, ETA, lines) over server-sent events,
the engine log's tail between boots, and past boots' timelines."""

from __future__ import annotations

import math
from typing import Any

from spark_ops.readiness import PHASE_ORDER
from spark_ops.serve.html import esc, json_text, page, section, table, when

MAX_TAIL = 40  # log lines the page keeps of the engine's tail (as the watch keeps)

# writes with textContent only; an idle server (no boot since it started) or an event without a
# phase (the stream's hello, a tail line) shows words, never "undefined"
BOOT_JS = """
const phases=document.querySelectorAll('#phases li');
const el=id=>document.getElementById(id);
function put(id,text){const e=el(id);if(e.textContent!==text)e.textContent=text;}
function show(s){
 const order=[...phases].map(li=>li.dataset.phase);const at=order.indexOf(s.phase);
 phases.forEach((li,i)=>{li.className=at<0?'':(i<at?'done':(i===at?(s.active?'now':'done'):''))});
 put('bphase',s.phase||'—');
 put('bstate',s.active?'booting':'no boot under way');
 put('bphlabel',s.active?' · phase ':(s.phase?' · the last boot watched here ended at ':
  ' · no boot watched since this server started'));
 el('bphase').hidden=!s.active&&!s.phase;
 el('bfor').hidden=!s.active;
 put('bin',s.active?s.seconds_in_phase+' s':'');
 put('beta',s.eta_s==null?'unknown':s.eta_s+' s');
 put('berr',s.error||'');
 put('bmissing',(s.missing_workers&&s.missing_workers.length)?
  'missing workers: '+s.missing_workers.join('; '):'');
 put('blines',(s.lines||[]).join('\\n'));
}
function said(e){if(!e||!e.kind)return '—';if(e.kind==='hello')return 'connected';
 if(e.kind==='tail')return 'engine log line';return e.kind+(e.phase?' '+e.phase:'');}
show(JSON.parse(el('init').textContent));
const es=new EventSource(document.body.dataset.base+'/events');
es.addEventListener('boot',m=>{const d=JSON.parse(m.data);const tail=d.event&&d.event.kind==='tail';
 if(d.state&&!tail)show(d.state);
 put('blast',said(d.event));
 if(tail&&typeof d.event.line==='string'){const t=el('tail');
  const l=t.textContent?t.textContent.split('\\n'):[];l.push(d.event.line);
  t.textContent=l.slice(-MAX_TAIL).join('\\n');}});
""".replace("MAX_TAIL", str(MAX_TAIL))


def boot_page(boots: dict[str, Any], base: str = "") -> str:
    """The live boot (phases, time in phase, ETA, lines) and past boots' timelines."""
    live = boots["live"]
    given = boots.get("usual_s")
    usual = {k: v for k, v in (given if isinstance(given, dict) else {}).items()
             if _seconds(v) is not None}  # fmt: skip
    items = "".join(
        f'<li data-phase="{esc(p.value)}">{esc(p.value)}'
        f"{' ~' + esc(_secs(usual[p.value])) if p.value in usual else ''}</li>"
        for p in PHASE_ORDER
    )
    init = json_text(live)  # inside <script>: no tag can end it early, no quote reads as HTML
    for ch, code in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"), ("'", "\\u0027")):
        init = init.replace(ch, code)
    body = section(
        "Boot, live",
        "<p><span id=bstate></span><span id=bphlabel></span><strong id=bphase></strong>"
        "<span id=bfor> for <span id=bin></span> · ETA <span id=beta></span></span> · last "
        f"event <span id=blast class=muted>—</span></p><ol id=phases class=phases>{items}</ol>"
        '<p id=bmissing class="warn"></p>'
        f'<p id=berr class="bad"></p><pre id=blines></pre>'
        f'<script type="application/json" id=init>{init}</script>',
        ident="live",
    )
    tail = [str(x) for x in boots.get("tail") or []][-MAX_TAIL:]
    body += section(
        "Engine log, latest lines (between boots too)",
        f"<pre id=tail>{esc(chr(10).join(tail)) if tail else ''}</pre>"
        "<p class=muted>the head's engine log as this server follows it (the last "
        f"{MAX_TAIL} lines; the whole log is on the head)</p>",
        ident="logtail",
    )
    rows = []
    for b in boots.get("recorded") or []:
        durations = b.get("durations") if isinstance(b.get("durations"), dict) else {}
        timeline = ", ".join(f"{k} {_secs(v)}" for k, v in durations.items())
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
    return page("Boot", "/boot", body, script=BOOT_JS, base=base)


def _seconds(value: object) -> float | None:
    """A finite, non-negative number of seconds, else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) and number >= 0 else None


def _secs(value: object) -> str:
    """Seconds as text (`—` for anything but a finite, non-negative number)."""
    number = _seconds(value)
    return "—" if number is None else f"{number:.0f} s"
