"""A command imports what it runs: each command's modules, read from a fresh process, against its
path in the import graph (tests/import_graph.py), and the packages that export names lazily."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import import_graph as graph
import pytest


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory holding an inventory whose nodes refuse (import_graph.refusing_inventory)."""
    work = tmp_path_factory.mktemp("imports")
    graph.refusing_inventory(work)
    return work


COMMANDS = {
    "help": ["--help"],
    "exec": ["exec", "--", "true"],
    "edit": ["exec", "--edit", "~/recipe.yaml", "--sub", "^a: .*", "a: 1"],
    "status": ["status"],
}


@pytest.mark.parametrize("name", list(COMMANDS))
def test_a_command_loads_only_modules_on_its_path(name: str, workdir: Path) -> None:
    """No spark_ops module, and no package spark_ops imports, that the command's path does not
    import: a package __init__ importing its siblings eagerly fails here."""
    argv = ["-i", str(workdir / "inventory.yaml"), *COMMANDS[name]]
    modules = graph.loaded(argv, workdir)
    assert graph.off_path(argv, modules) == []
    if name != "help":  # the command ran up to its connect: the path was taken, not skipped
        assert "asyncssh" in modules and "spark_ops.remote.session" in modules


def test_the_named_cases(workdir: Path) -> None:
    """The issue's own examples: exec never imports the executor, --help never aiohttp/asyncssh."""
    inv = ["-i", str(workdir / "inventory.yaml")]
    assert "spark_ops.workflows.execute" not in graph.loaded([*inv, "exec", "--", "true"], workdir)
    helps = graph.loaded(["--help"], workdir)
    assert not {"aiohttp", "asyncssh", "yaml", "structlog"} & helps


def test_the_path_finds_an_eager_package() -> None:
    """The derivation itself: a module imported only by its package's __init__ is off the path."""
    ours, _ = graph.path_of("spark_ops.cli.exec")
    assert "spark_ops.workflows.interrupt" in ours  # run_async's signal handling
    assert "spark_ops.workflows" in ours  # its parent package, loaded first
    assert "spark_ops.workflows.execute" not in ours  # only the package's exports name it


def lazy_packages() -> list[str]:
    """The spark_ops packages that export names through spark_ops.lazy_exports."""
    return [
        m
        for m in graph.all_modules()
        if (p := graph.module_file(m)) is not None
        and p.name == "__init__.py"
        and graph.lazy_map(ast.parse(p.read_text("utf-8")))
    ]


@pytest.mark.parametrize("package", lazy_packages())
def test_every_lazy_name_resolves(package: str) -> None:
    """Each exported name is defined by its module, named in __all__ and in the TYPE_CHECKING
    imports (what mypy sees), and is no submodule's name (the import system would bind the
    module over it)."""
    path = graph.module_file(package)
    assert path is not None
    tree = ast.parse(path.read_text("utf-8"))
    names = graph.lazy_map(tree)
    checked = {
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and graph.type_checking(node)
        for sub in node.body
        if isinstance(sub, ast.ImportFrom)
        for alias in sub.names
    }
    mod = importlib.import_module(package)
    assert sorted(names) == sorted(mod.__all__) == sorted(checked)
    for name, where in names.items():
        assert graph.module_file(f"{package}.{name}") is None, name
        assert getattr(mod, name) is getattr(importlib.import_module(where), name)
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        _ = mod.nope
