"""The red team of 2026-12-05, round 6: `exec --edit`'s one-line edit (spark_ops/linesub.py) on a
line ended by any of the breaks str.splitlines knows — YAML reads \\x85, U+2028 and U+2029 as line
ends too — rewrites the line and keeps its end: `.*` no longer eats the break and joins two lines
(docs/reliability.md, "The red team of 2026-12-05, round 6")."""

from __future__ import annotations

import pytest

from spark_ops.lineedit import LINE_BREAKS
from spark_ops.linesub import sub_line

ENDS = ["\r\n", *LINE_BREAKS]


@pytest.mark.parametrize("end", ENDS, ids=[repr(e) for e in ENDS])
def test_the_edited_line_keeps_its_end(end: str) -> None:
    """`^(max_num_seqs:).*` -> `\\1 64` on a line ended by `end`: the next line stays its own."""
    text = f"max_num_seqs: 8{end}port: 8000\n"
    done = sub_line(r"^(max_num_seqs:).*", r"\1 64", text)
    assert done["hits"] == [0]
    assert done["text"] == f"max_num_seqs: 64{end}port: 8000\n"
    assert (done["old"], done["new"]) == ("max_num_seqs: 8", "max_num_seqs: 64")


CASES = [
    ("no trailing newline", "a: 1\nmax_num_seqs: 8", "a: 1\nmax_num_seqs: 64"),
    ("CRLF everywhere", "a: 1\r\nmax_num_seqs: 8\r\n", "a: 1\r\nmax_num_seqs: 64\r\n"),
    ("a lone CR", "a: 1\rmax_num_seqs: 8\r", "a: 1\rmax_num_seqs: 64\r"),
    ("a BOM first", "\ufeffmax_num_seqs: 8\n", "\ufeffmax_num_seqs: 64\n"),
]


@pytest.mark.parametrize(("case", "text", "want"), CASES, ids=[c[0] for c in CASES])
def test_held_line_ends(case: str, text: str, want: str) -> None:
    """Held: the file's own line ends kept, the rest byte for byte."""
    done = sub_line(r"(max_num_seqs:).*", r"\1 64", text)
    assert done.get("text") == want, case
