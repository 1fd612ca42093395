"""The red team of 2026-12-05, round 4: an audit line's fields of the wrong type, every reader.

Each field of a run's intent, step and end lines (and of `what`, `detail`, a step) is given each
hostile value in turn; every reader of the audit must show it or say it unknown, never raise, never
write invalid JSON, never pass a control character to the terminal (docs/reliability.md, "The red
team of 2026-12-05, round 4"). Found on the embedded cluster with `spark-ops log`, `log --json`,
`log --diff`, `status`, `doctor`: tracebacks for 1e308, NaN, ±Infinity, 10**400 as a time; NaN
written into `log --json`; doctor and `log --diff` printing a hand-written newline or escape.
"""

from __future__ import annotations

import json
from typing import Any

import click
import pytest
from click.testing import CliRunner

from spark_ops import audit
from spark_ops.cli.common import when
from spark_ops.cli.doctor import echo_report
from spark_ops.cli.log import echo_entries, entry_line
from spark_ops.doctor.report import DoctorReport
from spark_ops.serve.fleetapp import overview_row
from spark_ops.serve.history import history_page
from spark_ops.workflows.journal import finite_number, runs_of, unfinished_runs
from spark_ops.workflows.oplog import operations_of

ATTRIBUTED = {"when": 1796499018.0, "account": "root", "uid": 0, "who": "root@vm"}
INTENT = {
    **ATTRIBUTED,
    "what": {"operation": "apply", "args": {"max_num_seqs": 8, "reason": "planned"}},
    "nodes": ["node1"],
    "diff": "--- a/r\n+++ b/r\n@@ -1 +1 @@\n-  max_num_seqs: 6\n+  max_num_seqs: 8\n",
    "outcome": "begun",
    "detail": {"writes": [{"host": "node1", "path": "~/r.yaml"}], "restart": True},
    "run": "R",
    "phase": "intent",
    "command": "spark-ops apply --max-num-seqs 8 --yes",
    "settles": [],
}
STEP = {
    **ATTRIBUTED,
    "run": "R",
    "phase": "step",
    "steps": [{"step": "restart", "status": "done", "stamp": 1796499019.0, "window_from": 1.0}],
}
END = {**ATTRIBUTED, "outcome": "ok", "detail": {"stamp": 1796499019}, "run": "R", "phase": "end"}

# JSON text for each value: NaN and Infinity are what a hand-edited line may hold
VALUES = {
    "number": "7",
    "huge-float": "1e308",
    "negative": "-1e30",
    "huge-int": "1" + "0" * 400,
    "nan": "NaN",
    "infinity": "Infinity",
    "minus-infinity": "-Infinity",
    "list": '[1, "x", {"step": 5}]',
    "dict": '{"a": {"b": 1}}',
    "null": "null",
    "bool": "true",
    "control": json.dumps("a\x1b[31mRED\r\nforged\x00\x07"),
    "long": json.dumps("x" * 100_000),
}


def _paths(line: dict[str, Any]) -> list[tuple[str, ...]]:
    """Every field of a line, one level into `what`, `detail` and each step."""
    out: list[tuple[str, ...]] = [(k,) for k in line]
    for k in ("what", "detail"):
        if isinstance(line.get(k), dict):
            out += [(k, sub) for sub in line[k]]
    for i, s in enumerate(line.get("steps") or []):
        out += [("steps", str(i), sub) for sub in s]
    return out


def _lines(value: str) -> str:
    """The audit file's text: each field of each line given `value`, each variant its own run
    (its end dropped once more, so it is unfinished too)."""
    out = []
    n = 0
    for line in (INTENT, STEP, END):
        for path in _paths(line):
            for ended in (True, False):
                n += 1
                run = f"R{n}"
                trio = [json.loads(json.dumps(x)) for x in (INTENT, STEP, END)]
                trio = trio if ended else trio[:2]
                texts = []
                for t in trio:
                    t["run"] = run
                    text = json.dumps(t)
                    if t["phase"] == line["phase"]:
                        text = _set(t, path, value)
                    texts.append(text)
                out += texts
    return "\n".join(out) + "\n"


def _set(line: dict[str, Any], path: tuple[str, ...], value: str) -> str:
    """The JSON text of line with the field at path replaced by the JSON text value."""
    marker = "\u0000MARK\u0000"
    target: Any = line
    for k in path[:-1]:
        target = target[int(k)] if isinstance(target, list) else target[k]
    target[path[-1]] = marker
    return json.dumps(line).replace(json.dumps(marker), value)


def _terminal(fn: Any, *args: Any, **kw: Any) -> str:
    """What fn prints through click, as a terminal would get it (colours on)."""

    @click.command()
    def show() -> None:
        """Run fn."""
        fn(*args, **kw)

    res = CliRunner().invoke(show, [], color=True)
    if res.exception is not None:
        raise res.exception
    return res.output


def _no_control(text: str) -> None:
    """No escape sequence but click's colours, no carriage return, NUL or bell."""
    stripped = text
    for code in ("\x1b[0m", "\x1b[31m", "\x1b[32m", "\x1b[33m", "\x1b[36m", "\x1b[1m"):
        stripped = stripped.replace(code, "")
    assert not any(c in stripped for c in "\x1b\r\x00\x07"), repr(stripped[:300])
    assert "\nforged" not in stripped  # a hand-written newline never starts a line of its own


@pytest.mark.parametrize("name", list(VALUES))
def test_every_reader_takes_any_field_of_any_type(name: str) -> None:
    """log, log --json, log --diff, the fleet's log table, status and doctor (unfinished runs),
    serve's history page and fleet overview: each reads every variant without raising, in
    strict JSON, one line per line."""
    entries = audit.parse_lines(_lines(VALUES[name]))
    assert not any("malformed" in e for e in entries)
    json.dumps(entries, allow_nan=False)  # log --json --raw, the fleet's log --json
    ops = operations_of(entries)
    json.dumps(ops, allow_nan=False, default=str)  # log --json
    _no_control(_terminal(echo_entries, ops, diffs=True))  # log, log --diff
    for op in ops:
        assert len(entry_line(op)) == 3  # the fleet's log table
        finite_number(op.get("started", op.get("when")))  # the fleet's log sorts by it
        when(op.get("started", op.get("when")))
    report = DoctorReport("c", "inv")
    for r in unfinished_runs(runs_of(entries)):
        s = r.summary()
        json.dumps(s.__dict__ if hasattr(s, "__dict__") else str(s), allow_nan=False, default=str)
        report.add("unfinished-runs", "node1", "fail", f"run {r.run} ({r.operation} by "
                   f"{s.who or '?'}) did not end; last recorded: {r.last_step}",
                   f"finish it: {r.command}")  # fmt: skip  # doctor's own words
    _no_control(_terminal(echo_report, report))
    history_page({}, {"entries": entries})
    overview_row("c", {"status": {}, "audit": {"entries": entries}}, 1796499999.0)  # fleet serve


@pytest.mark.parametrize("stamp", [1e308, -1e30, 10**400, float("nan"), float("inf"), True, "x"])
def test_a_time_no_clock_can_show_is_a_dash(stamp: object) -> None:
    """`when` (log, status, the fleet's table) of a time out of every clock's range."""
    assert when(stamp) == "-"
    assert finite_number(10**400) is None and finite_number(float("nan")) is None
