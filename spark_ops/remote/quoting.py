"""The one shell quoting: a value as one literal word, a remote path with its leading ~ expanded.

Standard library only and importing nothing of spark-ops, so a part that puts a value into shell
text (the recipe's editor and sparkrun renderer, the watchdog's identify) imports it without the
remote layer's SSH client: it is a foundation module (tests/fixtures/house/rules.yaml). Every
RemoteProgram quotes its arguments with these (remote/program.py).
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable


def quote_word(value: str) -> str:
    """One literal shell word: the value exactly, whatever it holds (the one use of shlex.quote)."""
    return shlex.quote(value)


def quote_path(path: str) -> str:
    """Quote a remote path for the shell, expanding a leading ~ to $HOME and nothing else."""
    if path == "~":
        return '"$HOME"'
    if path.startswith("~/"):
        return '"$HOME"/' + quote_word(path[2:])
    return quote_word(path)


def quote_args(args: Iterable[str]) -> str:
    """Join arguments into one shell command line, each one literal word."""
    return " ".join(quote_word(str(a)) for a in args)
