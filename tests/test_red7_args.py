"""The red team of 2026-12-05, round 7: hostile audit values through oplog.args_text, rendered by
each reader (`log`, the fleet's log table, serve's history page) (docs/reliability.md, round 7)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import click
import pytest

from spark_ops.audit import parse_lines
from spark_ops.cli.log import echo_entries, entry_line
from spark_ops.serve.history import _operation
from spark_ops.workflows.oplog import args_text, operations_of


def _line(prove: str) -> str:
    """An apply's intent line whose --prove value is `prove` (JSON text)."""
    head = json.dumps({"run": "r1", "phase": "intent", "who": "mallory", "what": {}})
    return head[:-3] + '{"operation": "apply", "args": {"prove": ' + prove + "}}}"


def _deepest() -> dict[str, Any]:
    """The deepest --prove value the audit reader still parses (a line nested one more is read
    as malformed): the reader's own recursion bound, which the renderer then meets deeper."""
    lo, hi = 1, 5000
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if "malformed" in parse_lines(_line("[" * mid + "]" * mid))[0]:
            hi = mid - 1
        else:
            lo = mid
    return parse_lines(_line("[" * lo + "]" * lo))[0]


def _nested(depth: int, render: Callable[[], object]) -> object:
    """`render` called `depth` frames further down the stack (a reader's own call depth)."""
    return _nested(depth - 1, render) if depth else render()


def _echo(entries: list[dict[str, Any]]) -> str:
    """What `spark-ops log` prints for `entries`."""
    out: list[str] = []
    echo, secho = click.echo, click.secho
    click.echo = click.secho = lambda message=None, **kw: out.append(str(message))  # type: ignore
    try:
        echo_entries(entries, diffs=False)
    finally:
        click.echo, click.secho = echo, secho
    return "\n".join(out)


def _attributed(e: dict[str, Any]) -> dict[str, Any]:
    """The entry as if the head's program wrote it (`log` shows no arguments of any other)."""
    return {k: v for k, v in e.items() if k != "unattributed"}


READERS = {
    "log": lambda e: _echo(operations_of([_attributed(e)])),
    "fleet-log-table": lambda e: " ".join(entry_line(operations_of([e])[0])),
    "history-page": lambda e: _operation(operations_of([e])[0]),
}


@pytest.mark.parametrize("reader", list(READERS))
def test_the_deepest_readable_value_renders(reader: str) -> None:
    """A --prove value nested as deep as the reader parses: json.dumps in args_text, called some
    frames deeper than the parse, raised RecursionError (a traceback in `log`, a 500 page)."""
    entry = _deepest()
    shown = _nested(40, lambda: READERS[reader](entry))
    assert "apply" in str(shown) and "prove=" in str(shown)


HOSTILE = [
    # the --prove value (JSON text), what the rendering must not hold, what it holds
    pytest.param('{"a": "\\u001b[31m\\u0000x"}', "\x1b", "prove=", id="escape-nested"),
    pytest.param('"\\u001b]0;title\\u0007"', "\x1b", "prove=", id="escape-top"),
    pytest.param('{"<img src=x onerror=alert(1)>": 1}', "\x00", "<img", id="html-key"),
    pytest.param("[" + ",".join(["1"] * 20000) + "]", "\n", "prove=", id="huge-list"),
]


@pytest.mark.parametrize(("prove", "never", "holds"), HOSTILE)
@pytest.mark.parametrize("reader", ["log", "fleet-log-table"])
def test_hostile_values_in_the_terminal(reader: str, prove: str, never: str, holds: str) -> None:
    """Control characters (nested or not) never reach the terminal raw; a line stays a line."""
    shown = str(READERS[reader](parse_lines(_line(prove))[0]))
    first = shown.splitlines()[0] if reader == "log" else shown
    assert never not in first and holds in first


@pytest.mark.parametrize(("prove", "never", "holds"), HOSTILE)
def test_hostile_values_in_the_history_page(prove: str, never: str, holds: str) -> None:
    """The history page escapes every value: no markup from a value."""
    shown = str(READERS["history-page"](parse_lines(_line(prove))[0]))
    assert "<img" not in shown and "prove=" in shown


@pytest.mark.parametrize(
    ("args", "text"),
    [
        pytest.param({1: 2, None: "x"}, "1=2 None=x", id="keys-not-strings"),
        pytest.param({"n": float("nan"), "i": float("inf")}, "n=nan i=inf", id="nan-inf"),
        pytest.param({"p": {"x": float("nan")}}, 'p={"x":NaN}', id="nan-nested"),
        pytest.param({"p": [b"\xff"]}, "p=[\"b'\\\\xff'\"]", id="bytes-nested"),
    ],
)
def test_values_no_json_holds(args: dict[Any, Any], text: str) -> None:
    """Values only a hand-built record holds (the reader refuses NaN): shown, never raised."""
    assert args_text({"args": args}) == text
