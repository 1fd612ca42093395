"""The house: every sh program and every shell quoting is in spark_ops/remote/ (docs/design.md).

Read from the sources with ast, nothing imported: outside remote/, no call of shlex.quote or
quote_path (nor `from shlex import quote`), and no string literal that reads as sh (`sh -c`,
`set -e`, `"$1"`, `${X:-}`, `command -v`, redirections to /dev/null, `then … fi`, `do … done`,
pipes into awk/grep/…, `$(…)`) but the few listed below with their reason. Docstrings are prose.
The checker is first run on small planted sources, so that a check gone blind fails.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "spark_ops"
REFWATCHDOG = REPO / "refwatchdog"  # the reference watchdog beside it: no sh of its own either
HOME = "spark_ops/remote/"

SH = re.compile(
    r"\bsh -c\b|\bset -e|\"\$[@1-9]\"|\$\{[A-Za-z_][A-Za-z_0-9]*[:}]|\bcommand -v\b|/dev/null"
    r"|\bthen\b.*\bfi\b|\bdo\b.*\bdone\b|#!/bin/sh|\|\s*(awk|grep|head|tail|sort|tr|cut)\b|\$\("
)

# Shell text outside remote/ that is not a program spark-ops runs on a node, each with its reason.
ALLOWED: dict[str, str] = {
    "spark_ops/sim/": "the embedded cluster writes its own shims and checks on the test ground",
    "spark_ops/inventory/model.py": (
        "DEFAULT_WORKER_CHECK is an inventory default the operator may replace (data, not a "
        "program; the inventory may not import remote/)"
    ),
    "spark_ops/recipe/source.py": "'$(' is what the recipe checker refuses, not a program",
    "spark_ops/verify/checks.py": "a hint telling the operator what to run by hand",
}


def _docstrings(tree: ast.AST) -> set[int]:
    """The ids of the docstring constants of a module, its classes and functions."""
    out: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            first = node.body[0] if node.body else None
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


def _names(node: ast.ImportFrom) -> set[str]:
    """The names a from-import takes."""
    return {a.name for a in node.names}


def _quoting_call(node: ast.AST) -> str | None:
    """`shlex.quote(…)`, `quote_path(…)`, `x.quote_path(…)` or `from shlex import quote`."""
    if isinstance(node, ast.ImportFrom) and node.module == "shlex" and "quote" in _names(node):
        return "from shlex import quote"
    if not isinstance(node, ast.Call):
        return None
    func = node.func
    if isinstance(func, ast.Attribute):
        if func.attr == "quote" and isinstance(func.value, ast.Name) and func.value.id == "shlex":
            return "shlex.quote()"
        if func.attr == "quote_path":
            return "quote_path()"
    if isinstance(func, ast.Name) and func.id == "quote_path":
        return "quote_path()"
    return None


def escapes(rel: str, source: str) -> list[str]:
    """Shell quoting calls and sh-like string literals in one module outside remote/."""
    if rel.startswith(HOME) or rel.startswith(tuple(ALLOWED)):
        return []
    tree = ast.parse(source, rel)
    docs = _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        call = _quoting_call(node)
        if call is not None:
            found.append(f"{rel}:{getattr(node, 'lineno', 0)}: {call} outside remote/")
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            m = SH.search(node.value)
            if m:
                found.append(f"{rel}:{node.lineno}: sh outside remote/ ({m.group(0)!r})")
    return found


PLANTED = [
    ("spark_ops/x.py", "import shlex\nc = 'rm -- ' + shlex.quote(p)\n"),
    ("spark_ops/x.py", "from shlex import quote\n"),
    ("spark_ops/x.py", "from spark_ops.remote import quote_path\nc = f'test -r {quote_path(p)}'\n"),
    ("spark_ops/x.py", "import spark_ops.remote as r\nc = r.quote_path(p)\n"),
    ("spark_ops/x.py", "P = '''\nset -eu\nrm -f -- \"$1\"\n'''\n"),
    ("spark_ops/x.py", 'c = f\'for f in {g}; do [ -f "$f" ] && echo "$f"; done\'\n'),
    ("spark_ops/x.py", "c = 'sh -c ' + prog\n"),
    ("spark_ops/x.py", "c = 'x=$(cat f)'\n"),
    ("spark_ops/a/b.py", "c = cmd + \" | grep -a 'args' | tail -n 1\"\n"),
]


@pytest.mark.parametrize("rel,source", PLANTED)
def test_checker_sees_planted_escapes(rel: str, source: str) -> None:
    """Each planted quoting call or sh literal outside remote/ is found; inside, it is not."""
    assert escapes(rel, source), source
    assert not escapes("spark_ops/remote/programs/x.py", source)


def test_checker_reads_docstrings_as_prose() -> None:
    """A docstring that shows `sh -c '…'` is prose, not a program."""
    assert not escapes("spark_ops/x.py", 'def f():\n    """Runs `sh -c "$1"`."""\n')


def test_no_sh_program_or_quoting_outside_remote() -> None:
    """Every sh program and every shell quoting of the package (and of the reference watchdog
    shipped beside it) is in spark_ops/remote/."""
    found = []
    for path in [*sorted(PACKAGE.rglob("*.py")), *sorted(REFWATCHDOG.rglob("*.py"))]:
        rel = path.relative_to(REPO).as_posix()
        found += escapes(rel, path.read_text("utf-8"))
    assert not found, "\n".join(found)
