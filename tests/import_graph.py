"""The import graph of spark_ops, read from its sources, and what a command loads when it runs.

`loaded(argv)` runs `spark-ops ARGV` in a fresh interpreter and returns its sys.modules at exit;
`path_of(root)` is every spark_ops module the code reachable from `root` imports (each module's
imports anywhere in it, outside `if TYPE_CHECKING:`; `from pkg import name` counts the module
that defines name, so a package that exports lazily adds only what is used). A package's own
imports count only when the package itself is imported, not when it is merely the parent of a
module imported: a package __init__ that imports its siblings eagerly drags them in off the path.
Used by tests/test_imports.py and benchmarks/startup.py (one derivation of a command's path).
"""

from __future__ import annotations

import ast
import json
import os
import socket
import subprocess
import sys
from functools import cache
from pathlib import Path

import spark_ops

PACKAGE = Path(spark_ops.__file__).resolve().parent
STDLIB = frozenset(sys.stdlib_module_names)

# Runs the CLI as its console script does, then writes sys.modules (JSON) to argv[1] at exit.
COLLECT = r"""
import atexit, json, sys
out = sys.argv[1]
atexit.register(lambda: open(out, "w").write(json.dumps(sorted(sys.modules))))
sys.argv = ["spark-ops", *sys.argv[2:]]
from spark_ops.cli.main import main
main()
"""


def module_file(name: str) -> Path | None:
    """The source file of a spark_ops module or package (None when there is none)."""
    if name != "spark_ops" and not name.startswith("spark_ops."):
        return None
    parts = name.split(".")[1:]
    rel = Path(*parts)
    candidates = [PACKAGE / rel / "__init__.py"]
    if parts:
        candidates.append((PACKAGE / rel).with_suffix(".py"))
    for path in candidates:
        if path.is_file():
            return path
    return None


def lazy_map(tree: ast.Module) -> dict[str, str]:
    """name -> module of a package that exports through spark_ops.lazy_exports."""
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and getattr(node.func, "id", None) == "lazy_exports"
            and len(node.args) == 2
        ):
            exports = ast.literal_eval(node.args[1])
            return {n: mod for mod, names in exports.items() for n in names}
    return {}


def type_checking(node: ast.AST) -> bool:
    """True for an `if TYPE_CHECKING:` block."""
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and getattr(test, "id", None) == "TYPE_CHECKING"


@cache
def imports_of(name: str) -> tuple[frozenset[str], frozenset[str]]:
    """(spark_ops modules, other top-level modules) that module `name` imports at run time."""
    path = module_file(name)
    if path is None:
        return frozenset(), frozenset()
    tree = ast.parse(path.read_text("utf-8"))
    is_package = path.name == "__init__.py"
    ours: set[str] = set()
    others: set[str] = set()

    def target(full: str) -> None:
        """Record one imported module."""
        if full == "spark_ops" or full.startswith("spark_ops."):
            ours.add(full)
        else:
            others.add(full.split(".")[0])

    def visit(node: ast.AST) -> None:
        """Walk the tree, skipping TYPE_CHECKING blocks."""
        if type_checking(node):
            return
        if isinstance(node, ast.Import):
            for alias in node.names:
                target(alias.name)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = name.split(".")[: len(name.split(".")) - node.level + is_package]
                base = ".".join([*parts, *([base] if base else [])])
            path = module_file(base)
            lazy = lazy_map(ast.parse(path.read_text("utf-8"))) if path else {}
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                if module_file(sub) is not None:
                    target(sub)  # a submodule: its package is only its parent
                elif alias.name in lazy:
                    target(lazy[alias.name])
                else:
                    target(base)  # a name of the package itself: its own imports run
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return frozenset(ours), frozenset(others)


def parents(name: str) -> list[str]:
    """The packages a module's import runs first (spark_ops, spark_ops.x, …)."""
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def path_of(*roots: str) -> tuple[set[str], set[str]]:
    """(spark_ops modules, other top-level modules) on the path of code starting at roots."""
    ours: set[str] = set()
    others: set[str] = set()
    todo = list(roots)
    followed: set[str] = set()
    while todo:
        name = todo.pop()
        if name in followed:
            continue
        followed.add(name)
        ours.add(name)
        ours.update(parents(name))  # loaded, but their own imports are not followed
        mine, theirs = imports_of(name)
        others |= theirs
        todo.extend(mine - followed)
    return {m for m in ours if module_file(m) is not None}, others


def command_roots(argv: list[str]) -> list[str]:
    """The modules a command line starts from: the CLI and its subcommand's module."""
    from spark_ops.cli.main import COMMANDS

    words = [w for w in argv if not w.startswith("-")]
    roots = ["spark_ops.cli.main"]
    for w in words:
        if w in COMMANDS:
            roots.append(COMMANDS[w][0])
            break
    return roots


def refusing_inventory(work: Path) -> Path:
    """An inventory of two loopback nodes whose ports refuse: a command runs up to its connect
    (its whole import path taken) and fails there, with no cluster needed."""
    ports = []
    for _ in range(2):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            ports.append(int(s.getsockname()[1]))
    (work / "known_hosts").write_text("")
    path = work / "inventory.yaml"
    path.write_text(
        "clusters:\n"
        "  c:\n"
        f"    ssh: {{connect_timeout: 5, agent: false, config: /dev/null, "
        f"known_hosts: {work / 'known_hosts'}}}\n"
        "    nodes:\n"
        f"      node1: {{host: 127.0.0.1, port: {ports[0]}, user: nobody, role: head}}\n"
        f"      node2: {{host: 127.0.0.1, port: {ports[1]}, user: nobody}}\n"
        "    recipe: {path: ~/recipe.yaml}\n"
        "    watchdog: {restart_command: 'true', history_file: ~/restarts}\n"
    )
    return path


def importable(modules: set[str]) -> tuple[list[str], list[str]]:
    """Of a process's modules, (spark_ops modules, third-party top-level packages): what a
    `python -c 'import …'` of the same path imports."""
    ours = sorted(m for m in modules if module_file(m) is not None)
    theirs = sorted(
        m
        for m in modules
        if "." not in m and not m.startswith("_") and m not in STDLIB and m != "spark_ops"
    )
    return ours, theirs


def loaded(argv: list[str], cwd: Path, env: dict[str, str] | None = None) -> set[str]:
    """The modules a fresh `spark-ops ARGV` process holds at exit."""
    out = cwd / "modules.json"
    out.unlink(missing_ok=True)
    run_env = dict(os.environ if env is None else env, SPARK_OPS_NO_FAST_EXIT="1")
    subprocess.run(
        [sys.executable, "-c", COLLECT, str(out), *argv],
        cwd=cwd, env=run_env, capture_output=True, timeout=120, check=False,
    )  # fmt: skip
    return set(json.loads(out.read_text()))


def off_path(argv: list[str], modules: set[str]) -> list[str]:
    """The modules a run of argv loaded that are not on its path: spark_ops modules, and the
    third-party packages spark_ops imports itself, that no module on the path imports."""
    ours, others = path_of(*command_roots(argv))
    direct = set().union(*(imports_of(m)[1] for m in all_modules())) - STDLIB
    bad = [m for m in modules if module_file(m) is not None and m not in ours]
    bad += [m for m in modules if m in direct and m not in others]
    return sorted(bad)


def all_modules() -> list[str]:
    """Every spark_ops module name, from the files."""
    names = []
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts.pop()
        names.append(".".join(parts))
    return sorted(names)
