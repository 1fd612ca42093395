"""Docs that cannot go stale (issue 35): every section the docs, the README and the product's own
messages cite exists.

Three kinds of citation are read:
- a Markdown link to a file of the repository, with or without `#anchor` (GitHub's heading slug);
- a file and a quoted heading, `docs/troubleshooting.md, 'The engine answers …'` (the quote is a
  prefix of a heading of that file, wrapped lines joined);
- a bare `docs/NAME.md` named in the product's strings (the file exists).
The product's strings are read with `ast` (implicitly joined literals are one string), so a hint
that cites a section is checked like a doc.
"""

from __future__ import annotations

import ast
import re
import unicodedata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md"), ROOT / "docs" / "alerts.yml"])
FENCE_RE = re.compile(r"^\s*(```|~~~)")
HEADING_RE = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
LINK_RE = re.compile(r"\]\(([^)\s]+)\)")
QUOTED_RE = re.compile(
    r"(?:docs/)?(?P<file>[a-z][a-z0-9-]*\.md),\s*(?:section\s+)?"
    r"(?P<q>['\"\u201c\u2018])(?P<title>[^'\"\u201d\u2019]{3,}?)['\"\u201d\u2019]"
)
BARE_RE = re.compile(r"\bdocs/(?P<file>[a-z][a-z0-9-]*\.md)")


def prose(path: Path) -> list[str]:
    """A Markdown file's lines outside code fences (what a reader sees as text)."""
    out, fenced = [], False
    for line in path.read_text(encoding="utf-8").splitlines():
        if FENCE_RE.match(line):
            fenced = not fenced
            continue
        out.append("" if fenced else line)
    return out


def headings(path: Path) -> list[str]:
    """The headings of a Markdown file, as written (code fences skipped)."""
    return [m.group(2) for line in prose(path) if (m := HEADING_RE.match(line))]


def slug(title: str) -> str:
    """GitHub's anchor for a heading: lower case, markup and punctuation dropped, spaces to `-`."""
    text = re.sub(r"[`*_]|<[^>]+>", lambda m: "_" if m.group(0) == "_" else "", title)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text).lower()
    kept = "".join(c for c in text if c in " -_" or unicodedata.category(c)[0] in "LN")
    return kept.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every anchor GitHub makes for a Markdown file's headings (repeats numbered -1, -2, …)."""
    seen: dict[str, int] = {}
    out = set()
    for title in headings(path):
        base = slug(title)
        n = seen.get(base, 0)
        out.add(base if n == 0 else f"{base}-{n}")
        seen[base] = n + 1
    return out


def normal(text: str) -> str:
    """Text compared as a reader does: markup dropped, spaces folded, case ignored."""
    return " ".join(re.sub(r"[`*]", "", text).split()).casefold()


def doc_file(name: str) -> Path:
    """The repository file a citation names (docs/ first, then the top level)."""
    for base in (ROOT / "docs", ROOT):
        if (base / name).exists():
            return base / name
    return ROOT / "docs" / name


def quoted_problems(text: str) -> list[str]:
    """What is wrong with every `FILE.md, "Heading"` citation in a text (empty when none)."""
    problems = []
    for m in QUOTED_RE.finditer(" ".join(text.split())):
        target = doc_file(m.group("file"))
        if not target.exists():
            problems.append(f"{m.group('file')}: no such file")
            continue
        want = normal(m.group("title").rstrip(" .…"))
        titles = [normal(h) for h in headings(target)]
        titles += [re.sub(r"^(\d+\.)+\s*", "", t) for t in titles]  # "9. Serve" cited as "Serve"
        if not any(t.startswith(want) for t in titles):
            problems.append(f"{m.group('file')}, {m.group('title')!r}: no such section")
    return problems


def link_problems(path: Path) -> list[str]:
    """What is wrong with a Markdown file's links into the repository (web links not read)."""
    problems = []
    for number, line in enumerate(prose(path), 1):
        for target in LINK_RE.findall(line):
            if re.match(r"[a-z]+:", target):
                continue
            name, _, anchor = target.partition("#")
            file = (path.parent / name).resolve() if name else path
            if not file.exists():
                problems.append(f"line {number}: {target}: no such file")
            elif anchor and file.suffix == ".md" and anchor not in anchors(file):
                problems.append(f"line {number}: {target}: no such section in {file.name}")
    return problems


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_section_a_doc_cites_exists(path: Path) -> None:
    """A doc's links and `FILE.md, "Heading"` citations name files and sections that exist."""
    text = "\n".join(prose(path)) if path.suffix == ".md" else path.read_text(encoding="utf-8")
    problems = quoted_problems(text) + (link_problems(path) if path.suffix == ".md" else [])
    assert problems == [], f"{path.relative_to(ROOT)}: " + "; ".join(problems)


def product_strings() -> list[tuple[str, str]]:
    """Every string literal of spark_ops/ and refwatchdog/, as (where, text); implicitly joined
    ones are one."""
    out = []
    for file in [
        p for pkg in ("spark_ops", "refwatchdog") for p in sorted((ROOT / pkg).rglob("*.py"))
    ]:
        for node in ast.walk(ast.parse(file.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                out.append((f"{file.relative_to(ROOT)}:{node.lineno}", node.value))
    return out


def test_every_doc_and_section_the_product_cites_exists() -> None:
    """A hint or docstring that names docs/FILE.md (and a section of it) names what exists."""
    problems = []
    for where, text in product_strings():
        problems += [f"{where}: {p}" for p in quoted_problems(text)]
        problems += [
            f"{where}: docs/{m.group('file')}: no such file"
            for m in BARE_RE.finditer(text)
            if not (ROOT / "docs" / m.group("file")).exists()
        ]
    assert problems == []


@pytest.mark.parametrize(
    ("title", "anchor"),
    [
        ("5. The budget gate of a planned restart", "5-the-budget-gate-of-a-planned-restart"),
        ("Lower caps without a restart: the what-if", "lower-caps-without-a-restart-the-what-if"),
        ("`spark-ops serve`: the page", "spark-ops-serve-the-page"),
        ("Exit codes & hints (v2)", "exit-codes--hints-v2"),
        ("snake_case_key", "snake_case_key"),
    ],
)
def test_anchors_are_githubs(title: str, anchor: str) -> None:
    """The checker's slugs are GitHub's, so a link it accepts works on the rendered page."""
    assert slug(title) == anchor


def test_the_checker_sees_a_missing_section(tmp_path: Path) -> None:
    """A cited section that is not there is reported, by file and title."""
    assert quoted_problems('see docs/troubleshooting.md, "No such heading anywhere"') == [
        "troubleshooting.md, 'No such heading anywhere': no such section"
    ]
    page = tmp_path / "page.md"
    page.write_text("# Top\n\n[x](#top) [y](#gone) [z](nothing.md)\n```\n# not a heading\n```\n")
    assert link_problems(page) == [
        "line 3: #gone: no such section in page.md",
        "line 3: nothing.md: no such file",
    ]
