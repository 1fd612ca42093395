"""The history page: the restart stamps in the watchdog's window, and the audit log as
operations (one entry per operation, its steps inside)."""

from __future__ import annotations

from typing import Any

from spark_ops.serve.html import diff_html, esc, page, section, table, when
from spark_ops.workflows.oplog import args_text, operations_of

MAX_STAMPS_SHOWN = 500  # a history page stays a page: the newest stamps, the rest via the CLI
MAX_OPERATIONS_SHOWN = 50  # the newest operations of the entries read; more: `spark-ops log`


def history_page(status: dict[str, Any], audit: dict[str, Any], base: str = "") -> str:
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
    ops = operations_of(audit.get("entries") or [])
    if len(ops) > MAX_OPERATIONS_SHOWN:
        ops = ops[-MAX_OPERATIONS_SHOWN:]
    entries = [_operation(op) for op in reversed(ops)]
    err = f'<p class="bad">{esc(audit["error"])}</p>' if audit.get("error") else ""
    log = err + ("".join(entries) or "<p>empty</p>")
    body = section("Restart stamps in the window", stamps) + section(
        "Audit log, one entry per operation (newest first)", log, ident="audit"
    )
    return page("History", "/history", body, base=base)


def _operation(e: dict[str, Any]) -> str:
    """One operation (workflows.oplog): when, who, what with its arguments that say something,
    nodes, its outcome (or that it did not end, with its last step), its steps and its diff."""
    if "malformed" in e:
        return f'<p class="warn">unreadable line: {esc(str(e["malformed"])[:200])}</p>'
    what: dict[str, Any] = e["what"] if isinstance(e.get("what"), dict) else {}
    arg_text = args_text(what)
    outcome = str(e.get("outcome") or "")
    if e.get("unfinished"):
        outcome = f"did not end (killed, or still running); last recorded: {e.get('last_step')}"
    elif e.get("settled_by"):
        outcome = f"did not end; finished by run {e['settled_by']}"
    cls = "ok" if outcome in ("ok", "done") else ("warn" if e.get("unfinished") else "bad")
    mark = (
        '<span class="warn">unattributed: not written by spark-ops on the head</span> '
        if e.get("unattributed")
        else ""
    )
    stamp = e.get("started", e.get("when"))
    nodes: list[Any] = e["nodes"] if isinstance(e.get("nodes"), list) else []
    block = (
        f"<div class=op><p>{mark}<strong>{when(stamp)}</strong> {esc(e.get('who'))} "
        f"<code>{esc(what.get('operation'))}{' ' if arg_text else ''}{esc(arg_text)}</code> "
        f"on {esc(', '.join(str(n) for n in nodes) or '—')}: "
        f'<span class="{cls}">{esc(outcome or "—")}</span></p>'
    )
    raw_steps = e.get("steps")
    steps = [s for s in raw_steps if isinstance(s, dict)] if isinstance(raw_steps, list) else []
    if steps:
        said = ", ".join(f"{s.get('step')} {s.get('status')}" for s in steps)
        block += f"<p class=muted>steps: {esc(said)}</p>"
    if e.get("diff"):
        block += diff_html(str(e["diff"]))
    return block + "</div>"
