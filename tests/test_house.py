"""The house holds: the import graph is visible (module level) and acyclic, and points one way.

The house is spark_ops/ and the reference watchdog beside it (refwatchdog/, a program of its own):
nothing of spark_ops imports refwatchdog, and refwatchdog imports from spark_ops only the contract
and foundation modules rules.yaml lists.

Read from the sources with ast, nothing imported: no function-level import of the project's own
modules outside cli/ (`importlib.import_module("…")`, under any name, and `__import__` count as
imports; one with a computed name is refused), no cycle among module-level imports (a package's
`__init__` counted as the module it is; only the branch of `if TYPE_CHECKING:` that never runs is
skipped), no forbidden direction and no arrow between the package's parts that
tests/fixtures/house/rules.yaml does not list with its reason, no private name imported across
modules or used as `module._x`, no `op: Any` (nor `typing.Any`, nor Any renamed) where the
parameter's class exists, no YAML parsed outside the one loader, and no "who am I" but
account.py's. The checker itself is first run on the small broken trees of
tests/fixtures/house/cases.yaml, so that a check gone blind fails.
"""

from __future__ import annotations

import ast
import re
from collections import deque
from dataclasses import dataclass
from itertools import product
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("spark_ops", "refwatchdog")  # the product and the reference watchdog it ships
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


def _is_type_checking(node: ast.expr) -> bool:
    """`TYPE_CHECKING` or `typing.TYPE_CHECKING` itself (nothing more)."""
    if isinstance(node, ast.Name):
        return node.id == "TYPE_CHECKING"
    return isinstance(node, ast.Attribute) and node.attr == "TYPE_CHECKING"


def _branches_that_run(node: ast.If) -> list[ast.stmt]:
    """The statements of an `if` that may run: all of them, but the body of `if TYPE_CHECKING:`
    and the else of `if not TYPE_CHECKING:` (imports there are for the type checker only)."""
    if _is_type_checking(node.test):
        return node.orelse
    if (
        isinstance(node.test, ast.UnaryOp)
        and isinstance(node.test.op, ast.Not)
        and _is_type_checking(node.test.operand)
    ):
        return node.body
    return [*node.body, *node.orelse]


# Calls that import a module named by a string: an edge of the graph like any import statement.
_DYNAMIC_IMPORTS = {"import_module", "__import__"}


def _import_functions(tree: ast.Module) -> set[str]:
    """The names importlib's import_module goes by in a module: itself, and any `as` renaming."""
    names = set(_DYNAMIC_IMPORTS)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "importlib":
            names.update(a.asname for a in node.names if a.name == "import_module" and a.asname)
    return names


def _dynamic_import(node: ast.Call, names: set[str] = _DYNAMIC_IMPORTS) -> ast.expr | None:
    """The module-name argument of importlib.import_module(...) / __import__(...) (under any of
    names), else None."""
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    if name not in names or not node.args:
        return None
    return node.args[0]


def _sites(tree: ast.Module, rel: str, here: str, modules: set[str]) -> list[ImportSite]:
    """Every import that runs (TYPE_CHECKING blocks skipped), marked module-level or not."""
    out: list[ImportSite] = []
    importers = _import_functions(tree)

    def visit(node: ast.AST, in_function: bool) -> None:
        """Walk, noting whether we are inside a function body."""
        for child in ast.iter_child_nodes(node):
            visit_stmt(child, in_function)

    def visit_stmt(child: ast.AST, in_function: bool) -> None:
        """One node: record an import, or descend (into the branches of an `if` that run)."""
        if isinstance(child, ast.If):
            visit_stmt(child.test, in_function)
            for stmt in _branches_that_run(child):
                visit_stmt(stmt, in_function)
        elif isinstance(child, ast.Import):
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
            if (
                isinstance(child, ast.Call)
                and (arg := _dynamic_import(child, importers)) is not None
            ):
                target = arg.value if isinstance(arg, ast.Constant) else None
                out.append(
                    ImportSite(
                        rel,
                        child.lineno,
                        target if isinstance(target, str) else DYNAMIC,
                        (),
                        None,
                        module_level=not in_function,
                    )
                )
            inner = in_function or isinstance(
                child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda
            )
            visit(child, inner)

    visit(tree, False)
    return out


DYNAMIC = "<a module named at run time>"  # import_module(name) with a computed name


def _part(module: str, base: str) -> str:
    """The part of the package a module belongs to: base.x for base.x.y.z (base for base)."""
    return ".".join(module.split(".")[:2]) if _within(module, base) else module


def _within(module: str, prefix: str) -> bool:
    """module is prefix or inside it."""
    return module == prefix or module.startswith(prefix + ".")


def _ours(module: str) -> bool:
    """A module of the house: spark_ops or the reference watchdog."""
    return any(_within(module, p) for p in PACKAGES)


class House:
    """The sources under root/spark_ops and root/refwatchdog, parsed once."""

    def __init__(self, root: Path, rules: dict[str, Any] | None = None) -> None:
        """Parse every module of the package; check it against rules (rules.yaml's by default)."""
        self.root = root
        self.rules = RULES if rules is None else rules
        files = [f for p in PACKAGES for f in sorted((root / p).rglob("*.py"))]
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
        allowed = tuple(self.rules["lazy_imports_allowed"])
        found = {
            f"{s.path}:{s.line}: function-level import of {s.target}"
            for m in self.sites
            for s in self.sites[m]
            if not s.module_level and _ours(s.target)
            if not s.path.startswith(allowed)
        }
        return sorted(found)

    def dynamic_imports(self) -> list[str]:
        """import_module(name) with a name computed at run time: an edge no reader can see."""
        allowed = tuple(self.rules["lazy_imports_allowed"])
        return sorted(
            f"{s.path}:{s.line}: import of a module named at run time (name it in an import)"
            for sites in self.sites.values()
            for s in sites
            if s.target == DYNAMIC and not s.path.startswith(allowed)
        )

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
        for rule in self.rules["forbidden"]:
            for m, sites in self.sites.items():
                if not _within(m, rule["importer"]):
                    continue
                if any(_within(m, e) for e in rule.get("except", [])):
                    continue
                for s in sites:
                    if any(_within(s.target, e) for e in rule.get("except_imports", [])):
                        continue
                    if _within(s.target, rule["imports"]) and not _within(s.target, m):
                        out.append(f"{s.path}:{s.line}: {m} imports {s.target} ({rule['why']})")
        return out

    def new_arrows(self) -> list[str]:
        """Imports (any level) from one part of the package into another that rules.yaml lacks."""
        if self.rules.get("arrows") is None:
            return []
        base = "spark_ops"
        free = {f"{base}.{p}" for p in self.rules["foundation"]}
        out: list[str] = []
        for m, sites in self.sites.items():
            if not _within(m, base):  # refwatchdog: its imports of spark_ops are a forbidden rule
                continue
            here = _part(m, base)
            allowed = self.rules["arrows"].get(here.removeprefix(base + "."), {}).get("to", [])
            for s in sites:
                there = _part(s.target, base)
                if not _within(s.target, base) or there in (here, base):
                    continue
                if any(_within(s.target, f) for f in free):  # a foundation part or module
                    continue
                if "*" in allowed or any(_within(s.target, f"{base}.{a}") for a in allowed):
                    continue
                out.append(
                    f"{s.path}:{s.line}: {m} imports {s.target}: "
                    f"{here.removeprefix(base + '.')} -> {there.removeprefix(base + '.')} "
                    "is no arrow of rules.yaml (list it there with its reason)"
                )
        return out

    def unused_arrows(self) -> list[str]:
        """Arrows rules.yaml lists that no import uses: a stale arrow makes the picture false."""
        base = "spark_ops"
        used = {
            (_part(m, base).removeprefix(base + "."), s.target)
            for m, sites in self.sites.items()
            for s in sites
            if _within(s.target, base)
        }
        return [
            f"rules.yaml: arrow {part} -> {a} is used by no import (remove it, and from design.md)"
            for part, rule in (self.rules.get("arrows") or {}).items()
            for a in rule["to"]
            if a != "*"
            if not any(h == part and _within(t, f"{base}.{a}") for h, t in used)
        ]

    def private_imports(self) -> list[str]:
        """`from x import _name` where x is another module (dunders are public)."""
        return [
            f"{s.path}:{s.line}: private name {name} imported from {s.from_module}"
            for sites in self.sites.values()
            for s in sites
            if s.from_module and _ours(s.from_module)
            for name in s.names
            if name.startswith("_") and not (name.startswith("__") and name.endswith("__"))
        ]

    def private_attributes(self) -> list[str]:
        """`module._name` where module is another module of ours (imported as a module)."""
        out: list[str] = []
        for m, tree in self.trees.items():
            aliases = self._module_aliases(tree, m)
            for node in ast.walk(tree):
                if not isinstance(node, ast.Attribute) or not _private(node.attr):
                    continue
                owner = _dotted(node.value)
                if owner is None:
                    continue
                first, _, rest = owner.partition(".")
                module = aliases.get(first, first) + (f".{rest}" if rest else "")
                if module in self.paths and module != m:
                    out.append(
                        f"{self.rel(m)}:{node.lineno}: private name {node.attr} used as an "
                        f"attribute of {module}"
                    )
        return sorted(out)

    def _module_aliases(self, tree: ast.Module, here: str) -> dict[str, str]:
        """The local names a module gives our modules: `import a.b as x`, `from a import b`."""
        out: dict[str, str] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.asname and a.name in self.paths:
                        out[a.asname] = a.name
            elif isinstance(node, ast.ImportFrom):
                for site in _sites(ast.Module([node], []), self.rel(here), here, set(self.paths)):
                    name = site.names[0]
                    alias = next(a.asname or a.name for a in node.names if a.name == name)
                    if site.target in self.paths and site.target.endswith("." + name):
                        out[alias] = site.target
        return out

    def untyped_parameters(self) -> list[str]:
        """Parameters (op, session, cluster, plan, …) annotated Any although their class exists."""
        out: list[str] = []
        for rule, (m, tree) in product(self.rules["typed_parameters"], self.trees.items()):
            rel = self.rel(m)
            if not rel.startswith(rule["under"]):
                continue
            anys = _any_names(tree)
            for node in ast.walk(tree):
                if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    continue
                args = node.args
                for arg in [*args.posonlyargs, *args.args, *args.kwonlyargs]:
                    real = rule["names"].get(arg.arg)
                    text = _annotation(arg.annotation)
                    if real and text is not None and _says_any(text, anys):
                        out.append(
                            f"{rel}:{node.lineno}: {node.name}({arg.arg}: {text}): "
                            f"give it its real type, {real}"
                        )
        return out

    def yaml_loads(self) -> list[str]:
        """YAML parsed anywhere but the one loader (its alias and size guards skipped)."""
        rule = self.rules["yaml_loader"]
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
            + self.new_arrows()
            + self.unused_arrows()
            + self.private_imports()
            + self.private_attributes()
            + self.untyped_parameters()
            + self.yaml_loads()
            + self.dynamic_imports()
        )


def _private(name: str) -> bool:
    """_x is private; __x__ (a dunder) is not."""
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _dotted(node: ast.expr) -> str | None:
    """a.b.c for a chain of names and attributes, else None."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        inner = _dotted(node.value)
        return None if inner is None else f"{inner}.{node.attr}"
    return None


def _annotation(node: ast.expr | None) -> str | None:
    """An annotation's text (a string annotation read as the expression it holds)."""
    if node is None:
        return None
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    return ast.unparse(node)


def _any_names(tree: ast.Module) -> set[str]:
    """The names `typing.Any` goes by in a module: Any, and any `from typing import Any as X`."""
    names = {"Any"}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module in ("typing", "typing_extensions"):
            names.update(a.asname for a in node.names if a.name == "Any" and a.asname)
    return names


def _says_any(text: str, anys: set[str]) -> bool:
    """Whether an annotation uses Any: bare, renamed, or as an attribute (`typing.Any`, `t.Any`)."""
    try:
        expr = ast.parse(text, mode="eval")
    except SyntaxError:
        return False
    return any(
        (isinstance(n, ast.Name) and n.id in anys)
        or (isinstance(n, ast.Attribute) and n.attr == "Any")
        for n in ast.walk(expr)
    )


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
    """On a small tree breaking one rule, the checker reports exactly that (the arrows between
    parts checked only where the case gives its own)."""
    for rel, text in case["files"].items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text, "utf-8")
    findings = House(tmp_path, {**RULES, "arrows": case.get("arrows")}).findings()
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


def test_every_arrow_between_parts_is_listed(house: House) -> None:
    """An import from one part of the package into another is an arrow rules.yaml gives a reason."""
    assert house.new_arrows() == []


def test_every_listed_arrow_is_used(house: House) -> None:
    """rules.yaml lists no arrow that no import draws (so design.md's table, drawn from it, is the
    real graph)."""
    assert house.unused_arrows() == []


ARROWS_BEGIN = "<!-- arrows: drawn from tests/fixtures/house/rules.yaml; tests/test_house.py -->"
ARROWS_END = "<!-- /arrows -->"


def arrows_table(rules: dict[str, Any]) -> str:
    """The arrows of rules.yaml as design.md shows them: one row per part, what it imports."""
    rows = ["| part | imports (besides the foundation: " + ", ".join(rules["foundation"]) + ") |"]
    rows.append("|---|---|")
    for part in sorted(rules["arrows"]):
        to = rules["arrows"][part]["to"]
        shown = "everything" if "*" in to else ", ".join(f"`{a}`" for a in sorted(to))
        rows.append(f"| `{part}` | {shown} |")
    return "\n".join(rows)


def test_design_md_draws_the_real_arrows() -> None:
    """docs/design.md's table of arrows is rules.yaml's (which the import graph is checked
    against): a new or removed arrow fails here until the page shows it."""
    text = (REPO / "docs" / "design.md").read_text("utf-8")
    assert ARROWS_BEGIN in text and ARROWS_END in text, "design.md lost its table of arrows"
    shown = text.split(ARROWS_BEGIN, 1)[1].split(ARROWS_END, 1)[0].strip()
    expected = arrows_table(RULES)
    assert shown == expected, "paste into docs/design.md:\n" + expected


def test_no_module_is_imported_by_a_computed_name(house: House) -> None:
    """import_module(name) outside cli/ names its module, so the graph shows the edge."""
    assert house.dynamic_imports() == []


def test_no_private_name_crosses_modules(house: House) -> None:
    """A name used by another module is public, under a real name (imported or as `mod._x`)."""
    assert house.private_imports() == []
    assert house.private_attributes() == []


def test_workflow_parameters_carry_their_real_types(house: House) -> None:
    """No `op: Any` (nor session, cluster, plan; opts and out in workflows/), however spelled."""
    assert house.untyped_parameters() == []


def test_yaml_is_read_through_the_one_loader(house: House) -> None:
    """No yaml.safe_load / yaml.load outside spark_ops/yamlsafe.py: every file gets its guards."""
    assert house.yaml_loads() == []


# Ways to ask who runs the process, besides spark_ops/account.py's local_account (the account
# database): the environment's say ($LOGNAME, $USER: anyone's to set) or a second copy of it.
_WHO_CALLS = {("getpass", "getuser"), ("os", "getlogin"), ("pwd", "getpwuid")}
_WHO_VARIABLES = {"LOGNAME", "USER", "LNAME", "USERNAME"}
WHO_AM_I = "spark_ops/account.py"
WHO_EXEMPT = ("spark_ops/sim/",)  # the simulator hands its own environment on to the nodes


def who_am_i_copies(root: Path) -> list[str]:
    """Places outside account.py that ask who runs the process (getpass, os.getlogin, pwd, or the
    environment's $LOGNAME / $USER)."""
    out: list[str] = []
    for path in [p for pkg in PACKAGES for p in sorted((root / pkg).rglob("*.py"))]:
        rel = path.relative_to(root).as_posix()
        if rel == WHO_AM_I or rel.startswith(WHO_EXEMPT):
            continue
        for node in ast.walk(ast.parse(path.read_text("utf-8"), rel)):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
                if (node.value.id, node.attr) in _WHO_CALLS:
                    out.append(f"{rel}:{node.lineno}: {node.value.id}.{node.attr}")
            elif isinstance(node, ast.ImportFrom) and node.module in ("getpass", "pwd"):
                out.append(f"{rel}:{node.lineno}: from {node.module} import …")
            elif isinstance(node, ast.Constant) and node.value in _WHO_VARIABLES:
                out.append(f"{rel}:{node.lineno}: ${node.value}")
    return sorted(out)


def test_one_who_am_i(tmp_path: Path) -> None:
    """Who runs spark-ops is asked in one place, the account database (spark_ops/account.py)."""
    assert who_am_i_copies(REPO) == []
    (tmp_path / "refwatchdog").mkdir()
    (tmp_path / "refwatchdog" / "daemon.py").write_text(
        "import getpass, os\nwho = getpass.getuser() or os.environ.get('LOGNAME')\n"
    )
    assert who_am_i_copies(tmp_path) == [
        "refwatchdog/daemon.py:2: $LOGNAME",
        "refwatchdog/daemon.py:2: getpass.getuser",
    ]


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


def string_keyed_facts(root: Path) -> list[str]:
    """Lines of the package that reach a plan's or a run's facts by a string key, or a step by
    its name as text (both are dataclass fields and a StepKind: workflows/plan.py)."""
    fact = re.compile(r"\bfacts(\[|\.get\(|\.setdefault\(|\.update\(|\.pop\()")
    step = re.compile(
        r"""\.name\s*[!=]=\s*["']|["'][a-z-]+["']\s+(not\s+)?in\s+(\{s\.name|steps\b)"""
    )
    out: list[str] = []
    for path in sorted((root / "spark_ops").rglob("*.py")):
        steps_here = "workflows" in path.parts or "cli" in path.parts  # where steps are run, shown
        for n, line in enumerate(path.read_text("utf-8").splitlines(), 1):
            if fact.search(line) or (steps_here and step.search(line)):
                out.append(f"{path.relative_to(root).as_posix()}:{n}: {line.strip()}")
    return out


def test_facts_and_steps_are_typed(tmp_path: Path) -> None:
    """No `facts[...]` / `facts.get(` in spark_ops, and no step matched by its name as text in
    workflows/ or cli/; the checker sees both in a small tree."""
    assert string_keyed_facts(REPO) == []
    (tmp_path / "spark_ops" / "workflows").mkdir(parents=True)
    (tmp_path / "spark_ops" / "workflows" / "x.py").write_text(
        'a = plan.facts["budget"]\nb = plan.facts.get("engine")\nif "restart" in steps:\n'
        '    pass\nif s.name == "boot":\n    pass\nc = plan.facts.budget\n'
    )
    assert [line.split(":")[1] for line in string_keyed_facts(tmp_path)] == ["1", "2", "3", "5"]


EXECUTOR_MAX_LINES = 400  # the executor reads in one sitting: its loop and its table of steps


def test_the_executor_reads_in_one_sitting() -> None:
    """workflows/execute.py holds one loop and one table (its runners live beside it) and stays
    under 400 lines; every StepKind has its row in the table."""
    path = REPO / "spark_ops" / "workflows" / "execute.py"
    lines = path.read_text("utf-8").count("\n")
    assert lines < EXECUTOR_MAX_LINES, f"{path.name}: {lines} lines"
    from spark_ops.workflows.execute import STEPS
    from spark_ops.workflows.plan import StepKind

    assert set(STEPS) == set(StepKind), set(StepKind) - set(STEPS)


# The plan, its gate and its run hold typed facts: no `dict[str, Any]` in a dataclass field of
# these modules. to_json / to_dict return types (the JSON they produce) may stay dict[str, Any]:
# only field annotations are read. The one exception left is named with its reason.
TYPED_FACT_MODULES = (
    "spark_ops/workflows/plan.py",
    "spark_ops/workflows/gate.py",
    "spark_ops/workflows/operation.py",
    "spark_ops/workflows/facts.py",
)
UNTYPED_FIELDS_ALLOWED: set[str] = set()  # none: every fact has its type


def untyped_fact_fields(root: Path, modules: tuple[str, ...]) -> list[str]:
    """Dataclass fields of `modules` whose annotation holds `dict[str, Any]` (any nesting)."""
    out: list[str] = []
    for rel in modules:
        tree = ast.parse((root / rel).read_text("utf-8"))
        anys = _any_names(tree)
        for node in ast.walk(tree):
            if not isinstance(node, ast.ClassDef) or not any(
                "dataclass" in ast.unparse(d) for d in node.decorator_list
            ):
                continue
            for item in node.body:
                if not isinstance(item, ast.AnnAssign) or not isinstance(item.target, ast.Name):
                    continue
                text = _annotation(item.annotation) or ""
                expr = ast.parse(text, mode="eval")
                loose = any(
                    isinstance(n, ast.Subscript)
                    and _dotted(n.value) in ("dict", "Dict", "typing.Dict", "Mapping")
                    and isinstance(n.slice, ast.Tuple)
                    and _says_any(ast.unparse(n.slice.elts[1]), anys)
                    for n in ast.walk(expr)
                )
                where = f"{rel}: {node.name}.{item.target.id}"
                if loose and where not in UNTYPED_FIELDS_ALLOWED:
                    out.append(f"{where}: {text}")
    return out


def test_plan_gate_and_run_fields_are_typed(tmp_path: Path) -> None:
    """No dataclass field of the plan, the gate, the operation's outcome or the facts is a
    `dict[str, Any]` (but the preflight answer, named above); the checker sees one in a tree."""
    assert untyped_fact_fields(REPO, TYPED_FACT_MODULES) == []
    bad = tmp_path / "x.py"
    bad.write_text(
        "from dataclasses import dataclass\nfrom typing import Any\n\n@dataclass\nclass F:\n"
        "    a: dict[str, Any] | None = None\n    b: list[dict[str, Any]]\n"
        "    c: dict[str, int]\n\n    def to_json(self) -> dict[str, Any]:\n        return {}\n"
    )
    assert untyped_fact_fields(tmp_path, ("x.py",)) == [
        "x.py: F.a: dict[str, Any] | None",
        "x.py: F.b: list[dict[str, Any]]",
    ]
