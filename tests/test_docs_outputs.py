"""The docs' output blocks are what the commands print now (issue 35, "Docs that cannot go stale").

scripts/docs_outputs.py runs every block under a `<!-- run -->` marker on a fresh embedded cluster;
here it runs with --check, so a block that differs from what runs now (times, ports, stamps and
pids masked) fails the suite; every block that shows `$ spark-ops` or its output (fenced or
indented, in README.md and any docs/*.md) carries a marker, run or not run with its reason; and a
stale block is caught (tests/fixtures/docs_outputs/stale.md).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "docs_outputs.py"
FIXTURES = Path(__file__).parent / "fixtures" / "docs_outputs"
sys.path.insert(0, str(SCRIPT.parent))

import docs_outputs  # noqa: E402


def _check(*docs: Path) -> subprocess.CompletedProcess:
    """The script's --check on the given docs, as a maintainer runs it."""
    return subprocess.run(
        [sys.executable, str(SCRIPT), "--check", *map(str, docs)],
        capture_output=True,
        text=True,
        timeout=1200,
    )


def test_every_command_shown_carries_a_marker() -> None:
    """A `$ spark-ops` block is either run by the script or says why it is not."""
    unmarked = [u for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
                for u in docs_outputs.unmarked_blocks(p)]  # fmt: skip
    assert unmarked == [], "\n".join(unmarked)


def test_unmarked_blocks_are_found_fenced_indented_or_pasted() -> None:
    """The check finds a `$ spark-ops` block fenced or indented, the command on any line, and
    output pasted without its command; a marked block and a command alone are not flagged."""
    found = docs_outputs.unmarked_blocks(FIXTURES / "unmarked.md")
    assert found == [
        "tests/fixtures/docs_outputs/unmarked.md:5: $ spark-ops status",
        "tests/fixtures/docs_outputs/unmarked.md:12: $ spark-ops budget",
        "tests/fixtures/docs_outputs/unmarked.md:17: ✓ verify (0.1 s): 9/9 checks passed",
    ], found


@pytest.mark.parametrize(
    ("line", "want"),
    [
        ("✓ restart (2.3 s): stamp 1796423800 (printed",
         "✓ restart (DURATION): stamp STAMP (printed"),
        ('"engine_pid": 981, "pid": 32427', '"engine_pid": PID, "pid": PID'),
        ("backup x.bak.20261204T223644.097775Z", "backup x.bak.STAMPTIME"),
        ("paused until 2026-12-04 23:13:39 UTC (run 20261204T223638-4330d3)",
         "paused until DATETIME UTC (run RUN)"),
        ("127.0.0.1:33485 reachable (242 ms)", "127.0.0.1:PORT reachable (DURATION)"),
        ("verify (0.6 s): 16/16 checks passed", "verify (DURATION): 16/16 checks passed"),
        ("next free slot in 3 h 59 min; 60 GiB", "next free slot in DURATION; N GiB"),
        ("next free slot in 4 h; 60 GiB", "next free slot in DURATION; N GiB"),
    ],
    ids=["duration-stamp", "pids", "backup-stamp", "clock-and-run", "port-ms", "counts-kept",
         "duration-parts", "duration-one-part"],
)  # fmt: skip
def test_what_varies_is_masked_and_what_matters_is_kept(line: str, want: str) -> None:
    """Masks hide what differs between two runs; a check count (the "9/9" that went stale) stays."""
    assert docs_outputs.masked([line], False) == [want]


def test_a_stale_block_fails_the_check_naming_it() -> None:
    """The budget shown was printed by an older run: --check exits 1 with the block's diff."""
    res = _check(FIXTURES / "stale.md")
    assert res.returncode == 1, res.stdout + res.stderr
    assert "stale.md:14 (the doc)" in res.stdout, res.stdout
    assert "-Restarts used: 0/2" in res.stdout and "+Restarts used: 1/2" in res.stdout
    assert "stale.md:9" not in res.stdout, "the block that is true passes"
    assert "1 block(s) differ" in res.stdout


GENERATED = sorted(
    p for p in (ROOT / "docs").glob("*.md") if "<!-- docs-outputs:" in p.read_text("utf-8")
)


@pytest.mark.slow
@pytest.mark.timeout(1800)  # one embedded cluster per document, every block run (twice at most)
@pytest.mark.parametrize("doc", GENERATED, ids=[p.name for p in GENERATED])
def test_the_docs_show_what_runs_now(doc: Path) -> None:
    """Every generated block of the document is what its commands print on the embedded cluster
    today (each document is one session of its own)."""
    res = _check(doc)
    if res.returncode == 1:
        # a stale block differs on every run; one that differed once only is timing on a busy
        # machine (a probe in flight during a drain): it is shown, and the second run decides
        print("first run differed:\n" + res.stdout[-6000:])
        res = _check(doc)
    assert res.returncode == 0, res.stdout[-6000:] + res.stderr[-3000:]
