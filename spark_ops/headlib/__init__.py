"""The head-side foundation: the atomic writer, the backup naming rule, the flock, and the restart
history's format and journal.

Standard library only, and importing nothing of spark-ops but itself: history.py runs on the head
without spark-ops installed, sent to its python3 as one program (`python3 - ARGS`) that
`head_program` builds from these modules' sources and history.py's. The local writer
(spark_ops/files.py), the remote writer (remote/shell.py renders the backup rule into sh), the
reference watchdog (refwatchdog/daemon.py) and history.py all import these modules: one
implementation each. `history_format` (parse, read, budget) and `history_journal` are what
history.py's program reads with; spark-ops and the reference watchdog read with them too.
"""

from __future__ import annotations

from importlib import resources

# The modules, in the order each one's imports need (what head_program sends before its program).
MODULES = ("errors", "proc", "atomic", "backup", "flock", "history_format", "history_journal")


def head_program(source: str, filename: str) -> str:
    """One stdlib-only program for `python3 -`: this package's modules, then source as __main__.

    Each module is compiled under its own name into sys.modules (a stub `spark_ops` package holds
    them), so `from spark_ops.headlib.atomic import atomic_write` in source works on a node where
    spark-ops is not installed; every source travels as a Python string literal.
    """
    lines = [
        f"# {filename} with spark_ops.headlib ({', '.join(MODULES)}), for python3 -\n",
        "import sys as _sys, types as _types\n",
        "def _install(_name, _source):\n",
        "    _m = _types.ModuleType(_name)\n",
        "    _sys.modules[_name] = _m\n",
        "    _parent, _, _leaf = _name.rpartition('.')\n",
        "    if _parent:\n",
        "        setattr(_sys.modules[_parent], _leaf, _m)\n",
        "    if _source is None:\n",
        "        _m.__path__ = []\n",
        "    else:\n",
        "        _path = _name.replace('.', '/') + '.py'\n",
        "        exec(compile(_source, _path, 'exec', dont_inherit=True), _m.__dict__)\n",
        "_install('spark_ops', None)\n",
        f"_install({__name__!r}, None)\n",
    ]
    for module in MODULES:
        text = resources.files(__name__).joinpath(module + ".py").read_text(encoding="utf-8")
        lines.append(f"_install({__name__ + '.' + module!r}, {text!r})\n")
    lines.append("del _sys, _types, _install\n")
    lines.append(f"exec(compile({source!r}, {filename!r}, 'exec', dont_inherit=True))\n")
    return "".join(lines)
