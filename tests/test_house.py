"""The house holds: the import graph is visible (module level) and acyclic, and points one way.

Read from the sources with ast, nothing imported: no function-level import of the project's own
modules outside cli/, no cycle among module-level imports (a package's `__init__` counted as the
module it is), no forbidden direction (tests/fixtures/house/rules.yaml, each with its reason), no
private name imported across modules, no `op: Any` in workflow code. The checker itself is first
run on the small broken trees of tests/fixtures/house/cases.yaml, so that a check gone blind fails.
"""

from __future__ import annotations

import ast
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).parent / "fixtures" / "house"
RULES: dict[str, Any] = yaml.safe_load((FIXTURES / "rules.yaml").read_text("utf-8"))
CASES: list[dict[str, Any]] = yaml.safe_load((FIXTURES / "cases.yaml").read_text("utf-8"))


@dataclass(frozen=True)
class ImportSite:
    """One import statement: where it is, what it names, whether it runs at module level."""

    path: str
    line: int
    target: str  # the module imported (a submodule when a from-import names one)
    names: tuple[str, ...]
    from_module: str | None  # the module of a from-import
    module_level: bool


def module_name(rel: Path) -> str:
    """spark_ops/a/b.py -> spark_ops.a.b; spark_ops/a/__init__.py -> spark_ops.a."""
    parts = list(rel.with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking(node: ast.If) -> bool:
    """An `if TYPE_CHECKING:` block (its imports never run)."""
    return "TYPE_CHECKING" in ast.unparse(node.test)


def _sites(tree: ast.Module, rel: str, here: str, modules: set[str]) -> list[ImportSite]:
    """Every import that runs (TYPE_CHECKING blocks skipped), marked module-level or not."""
    out: list[ImportSite] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        """Walk, noting whether we are inside a function body."""
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _type_checking(child):
                for stmt in child.orelse:
                    visit_stmt(stmt, in_function)
                continue
            visit_stmt(child, in_function)

    def visit_stmt(child: ast.AST, in_function: bool) -> None:
        """One node: record an import, or descend."""
        if isinstance(child, ast.Import):
            for alias in child.names:
                out.append(
                    ImportSite(
                        rel, child.lineno, alias.name, (), None, module_level=not in_function
                    )
                )
        elif isinstance(child, ast.ImportFrom):
            base = child.module or ""
            if child.level:  # relative: resolve against this module's package
                pkg = here.split(".")
                if not rel.endswith("__init__.py"):
                    pkg = pkg[:-1]
                pkg = pkg[: len(pkg) - (child.level - 1)]
                base = ".".join(pkg + ([base] if base else []))
            names = tuple(a.name for a in child.names)
            for name in names:
                sub = f"{base}.{name}"
                target = sub if sub in modules else base
                out.append(ImportSite(rel, child.lineno, target, (name,), base, not in_function))
        else:
            inner = in_function or isinstance(
                child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda
            )
            visit(child, inner)

    visit(tree, False)
    return out


def _within(module: str, prefix: str) -> bool:
    """module is prefix or inside it."""
    return module == prefix or module.startswith(prefix + ".")


class House:
    """The sources under root/spark_ops, parsed once."""

    def __init__(self, root: Path) -> None:
        """Parse every module of the package."""
        self.root = root
        files = sorted((root / "spark_ops").rglob("*.py"))
        self.paths = {module_name(p.relative_to(root)): p for p in files}
        self.trees = {m: ast.parse(p.read_text("utf-8"), str(p)) for m, p in self.paths.items()}
        modules = set(self.paths)
        self.sites = {
            m: _sites(t, self.rel(m), m, modules) for m, t in self.trees.items()
        }  # fmt: skip

    def rel(self, module: str) -> str:
        """The module's path relative to the root, with forward slashes."""
        return self.paths[module].relative_to(self.root).as_posix()

    def lazy_imports(self) -> list[str]:
        """Function-level imports of the project's own modules outside the allowed places."""
        allowed = tuple(RULES["lazy_imports_allowed"])
        found = {
            f"{s.path}:{s.line}: function-level import of {s.target}"
            for m in self.sites
            for s in self.sites[m]
            if not s.module_level and _within(s.target, "spark_ops")
            if not s.path.startswith(allowed)
        }
        return sorted(found)

    def graph(self) -> dict[str, set[str]]:
        """Module-level edges; importing a.b.c also runs a and a.b unless we are inside them."""
        edges: dict[str, set[str]] = {}
        for m, sites in self.sites.items():
            deps: set[str] = set()
            for s in sites:
                if not s.module_level or s.target not in self.paths:
                    continue
                deps.add(s.target)
                parts = s.target.split(".")
                for k in range(2, len(parts)):
                    ancestor = ".".join(parts[:k])
                    if ancestor in self.paths and not _within(m, ancestor):
                        deps.add(ancestor)
            edges[m] = deps - {m}
        return edges

    def cycles(self) -> list[str]:
        """One shortest cycle per strongly connected group of modules, from its first module."""
        edges = self.graph()
        found: list[str] = []
        seen: set[str] = set()
        for start in sorted(edges):
            if start in seen:
                continue
            path = _shortest_cycle(edges, start)
            if path:
                seen.update(path)
                found.append("import cycle: " + " -> ".join([*path, start]))
        return found

    def forbidden(self) -> list[str]:
        """Imports (any level) that point the wrong way, per rules.yaml."""
        out: list[str] = []
        for rule in RULES["forbidden"]:
            for m, sites in self.sites.items():
                if not _within(m, rule["importer"]):
                    continue
                if any(_within(m, e) for e in rule.get("except", [])):
                    continue
                for s in sites:
                    if _within(s.target, rule["imports"]) and not _within(s.target, m):
                        out.append(f"{s.path}:{s.line}: {m} imports {s.target} ({rule['why']})")
        return out

    def private_imports(self) -> list[str]:
        """`from x import _name` where x is another module (dunders are public)."""
        return [
            f"{s.path}:{s.line}: private name {name} imported from {s.from_module}"
            for sites in self.sites.values()
            for s in sites
            if s.from_module and _within(s.from_module, "spark_ops")
            for name in s.names
            if name.startswith("_") and not (name.startswith("__") and name.endswith("__"))
        ]

    def untyped_parameters(self) -> list[str]:
        """Workflow parameters (op, plan, …) annotated Any although their class exists."""
        rule = RULES["typed_parameters"]
        out: list[str] = []
        for m, tree in self.trees.items():
            rel = self.rel(m)
            if not rel.startswith(rule["under"]):
                continue
            for node in ast.walk(tree):
                if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    continue
                args = node.args
                for arg in [*args.posonlyargs, *args.args, *args.kwonlyargs]:
                    real = rule["names"].get(arg.arg)
                    text = _annotation(arg.annotation)
                    if real and text is not None and "Any" in _names(text):
                        out.append(
                            f"{rel}:{node.lineno}: {node.name}({arg.arg}: {text}): "
                            f"give it its real type, {real}"
                        )
        return out

    def yaml_loads(self) -> list[str]:
        """YAML parsed anywhere but the one loader (its alias and size guards skipped)."""
        rule = RULES["yaml_loader"]
        out: list[str] = []
        for m, tree in self.trees.items():
            rel = self.rel(m)
            if rel == rule["module"]:
                continue
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and node.module == "yaml":
                    used = [a.name for a in node.names if a.name in rule["parsers"]]
                elif (
                    isinstance(node, ast.Attribute)
                    and isinstance(node.value, ast.Name)
                    and node.value.id == "yaml"
                    and node.attr in rule["parsers"]
                ):
                    used = [node.attr]
                else:
                    continue
                out.extend(
                    f"{rel}:{node.lineno}: yaml.{name} outside {rule['module']} ({rule['why']})"
                    for name in used
                )
        return out

    def findings(self) -> list[str]:
        """Everything wrong, sorted."""
        return sorted(
            self.lazy_imports()
            + self.cycles()
            + self.forbidden()
            + self.private_imports()
            + self.untyped_parameters()
            + self.yaml_loads()
        )


def _annotation(node: ast.expr | None) -> str | None:
    """An annotation's text (a string annotation read as the expression it holds)."""
    if node is None:
        return None
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    return ast.unparse(node)


def _names(text: str) -> set[str]:
    """The bare names an annotation expression uses."""
    return {n.id for n in ast.walk(ast.parse(text, mode="eval")) if isinstance(n, ast.Name)}


def _shortest_cycle(edges: dict[str, set[str]], start: str) -> list[str] | None:
    """The shortest path start -> … -> start (breadth first, neighbours in name order)."""
    parent: dict[str, str | None] = {start: None}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for nxt in sorted(edges.get(node, ())):
            if nxt == start:
                path = [node]
                while parent[path[-1]] is not None:
                    path.append(parent[path[-1]])  # type: ignore[arg-type]
                return path[::-1]
            if nxt not in parent and nxt in edges:
                parent[nxt] = node
                queue.append(nxt)
    return None


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_checker_sees_each_broken_rule(case: dict[str, Any], tmp_path: Path) -> None:
    """On a small tree breaking one rule, the checker reports exactly that."""
    for rel, text in case["files"].items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text, "utf-8")
    findings = House(tmp_path).findings()
    assert len(findings) == len(case["findings"]), findings
    for want in case["findings"]:
        assert any(want in f for f in findings), (want, findings)


@pytest.fixture(scope="module")
def house() -> House:
    """The real package."""
    return House(REPO)


def test_no_function_level_import_of_our_own_modules(house: House) -> None:
    """The dependency graph is visible at the top of each module (cli/ aside, for start-up)."""
    assert house.lazy_imports() == []


def test_import_graph_has_no_cycle(house: House) -> None:
    """Module-level imports form no cycle, package __init__ files included."""
    assert house.cycles() == []


def test_imports_point_one_way(house: House) -> None:
    """Core never imports the CLI; the inventory no remote code; history.py nothing of ours."""
    assert house.forbidden() == []


def test_no_private_name_crosses_modules(house: House) -> None:
    """A name used by another module is public, under a real name."""
    assert house.private_imports() == []


def test_workflow_parameters_carry_their_real_types(house: House) -> None:
    """No `op: Any` (nor plan, opts, out) in workflows/."""
    assert house.untyped_parameters() == []


def test_yaml_is_read_through_the_one_loader(house: House) -> None:
    """No yaml.safe_load / yaml.load outside spark_ops/yamlsafe.py: every file gets its guards."""
    assert house.yaml_loads() == []


def second_names(root: Path) -> list[str]:
    """Imports, in tests and benchmarks, of tests/ modules by a second name (`tests.ground`).

    tests/ is on sys.path (pytest puts it there, benchmarks/ insert it): the test ground is
    `ground`, a helper module `cases`, `conftest`, `test_init`. Two names load one module twice:
    `ground.GroundUnavailable is not tests.ground.GroundUnavailable`, and an `except` written with
    one name misses what the other raises.
    """
    out: list[str] = []
    for path in sorted([*(root / "tests").rglob("*.py"), *(root / "benchmarks").rglob("*.py")]):
        for node in ast.walk(ast.parse(path.read_text("utf-8"), str(path))):
            if isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            rel = path.relative_to(root).as_posix()
            out.extend(
                f"{rel}:{node.lineno}: imports {n}; import {n[6:] or 'it'} by its one name"
                for n in names
                if n == "tests" or n.startswith("tests.")
            )
    return out


def test_the_test_ground_has_one_name(tmp_path: Path) -> None:
    """Every test and benchmark imports tests/ground as `ground`, never as `tests.ground`."""
    assert second_names(REPO) == []
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "tests" / "ground").mkdir(parents=True)
    (tmp_path / "tests" / "ground" / "x.py").write_text("from . import GroundError\n")
    (tmp_path / "tests" / "test_x.py").write_text(
        "from ground import GroundError\nimport tests.ground.sshd\n"
        "def f():\n    from tests.ground import GroundUnavailable\n"
    )
    assert second_names(tmp_path) == [
        "tests/test_x.py:2: imports tests.ground.sshd; import ground.sshd by its one name",
        "tests/test_x.py:4: imports tests.ground; import ground by its one name",
    ]


def test_the_graph_is_the_one_python_sees(house: House) -> None:
    """Sanity: the checker sees the edges the issue named, now pointing the right way."""
    edges = house.graph()
    assert "spark_ops.inventory" in edges["spark_ops.remote.connector"]
    assert not any(_within(d, "spark_ops.remote") for d in edges["spark_ops.inventory"])
    assert "spark_ops.workflows.operation" in edges["spark_ops.workflows.postboot"]
