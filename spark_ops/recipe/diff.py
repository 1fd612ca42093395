"""Diffs of recipe texts: a unified diff for people, changed-line pairs for checks."""

from __future__ import annotations

import difflib


def unified_diff(old: str, new: str, path: str) -> str:
    """A unified diff of two texts (a/PATH, b/PATH), empty when equal."""
    lines = difflib.unified_diff(
        old.splitlines(keepends=True), new.splitlines(keepends=True), f"a/{path}", f"b/{path}"
    )
    out = []
    for line in lines:
        out.append(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n")
    return "".join(out)


def _core(line: str) -> str:
    """A line without its trailing ` \\` continuation."""
    return line.rstrip().removesuffix("\\").rstrip()


def changed_line_pairs(old: str, new: str) -> list[tuple[str, str]]:
    """(old, new) pairs of changed lines ("" when absent); a pure ` \\` change is ignored."""
    a, b = old.split("\n"), new.split("\n")
    pairs: list[tuple[str, str]] = []
    matcher = difflib.SequenceMatcher(a=a, b=b, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            continue
        olds, news = a[i1:i2], b[j1:j2]
        for k in range(max(len(olds), len(news))):
            pair = (olds[k] if k < len(olds) else "", news[k] if k < len(news) else "")
            if pair[0] and pair[1] and _core(pair[0]) == _core(pair[1]):
                continue
            pairs.append(pair)
    return pairs


def lines_outside(old: str, new: str, words: list[str]) -> list[tuple[str, str]]:
    """Changed line pairs that mention none of `words` (empty when the edit stayed on them)."""
    return [
        (before, after)
        for before, after in changed_line_pairs(old, new)
        if not any(w in before or w in after for w in words)
    ]
