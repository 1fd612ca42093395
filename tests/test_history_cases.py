"""Data-driven cases for history.py, run as spark-ops runs it: source on stdin of python3 -."""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spark_ops.headlib import history_format
from spark_ops.headlib.backup import is_backup_name, list_backups
from spark_ops.watchdog import history
from spark_ops.watchdog.contract import history_source

SOURCE = history_source().encode()  # history.py with headlib, as sent to the head
CASES = Path(__file__).parent / "fixtures" / "history"
CASE_DIRS = sorted(p for p in CASES.iterdir() if (p / "case.json").is_file())


def run_script(args: list[str], cwd: Path) -> tuple[int, dict[str, Any], str]:
    """Run history.py from stdin like spark-ops does over SSH; return (rc, JSON, stderr)."""
    proc = subprocess.run(
        [sys.executable, "-", *args], input=SOURCE, cwd=cwd, capture_output=True, timeout=60
    )
    out = proc.stdout.decode()
    lines = out.strip().splitlines()
    assert len(lines) == 1, f"expected one JSON line on stdout, got {out!r}"
    return proc.returncode, json.loads(lines[0]), proc.stderr.decode()


def assert_subset(expected: Any, actual: Any, where: str = "$") -> None:
    """Dicts match on the expected keys (recursively); lists and scalars match exactly."""
    if isinstance(expected, dict):
        assert isinstance(actual, dict), f"{where}: expected an object, got {actual!r}"
        for key, value in expected.items():
            assert key in actual, f"{where}.{key} missing in {actual!r}"
            assert_subset(value, actual[key], f"{where}.{key}")
    elif isinstance(expected, list):
        assert isinstance(actual, list) and len(actual) == len(expected), (
            f"{where}: expected {expected!r}, got {actual!r}"
        )
        for i, (e, a) in enumerate(zip(expected, actual, strict=True)):
            assert_subset(e, a, f"{where}[{i}]")
    else:
        assert expected == actual, f"{where}: expected {expected!r}, got {actual!r}"


@pytest.mark.parametrize("case", CASE_DIRS, ids=[p.name for p in CASE_DIRS])
def test_case(case: Path, tmp_path: Path) -> None:
    """Run one fixture case and compare exit code, output and the file afterwards."""
    spec = json.loads((case / "case.json").read_text())
    shutil.copy(case / "history", tmp_path / "history")
    journal = tmp_path / "journal.jsonl"
    if (case / "journal.jsonl").exists():
        shutil.copy(case / "journal.jsonl", journal)
    args = [a.replace("{journal}", str(journal)) for a in spec["args"]]
    args[1:1] = ["--history", "history"]
    before = (tmp_path / "history").read_bytes()
    rc, out, err = run_script(args, tmp_path)
    assert rc == spec["exit"], f"exit {rc}, stderr {err!r}, out {out!r}"
    assert_subset(spec["expect"], out)
    after = case / "history.after"
    if after.exists():
        assert (tmp_path / "history").read_bytes() == after.read_bytes()
    elif args[0] in ("read", "budget") or rc != 0:
        assert (tmp_path / "history").read_bytes() == before
    if rc != 0:
        assert err.strip(), "a failure must explain itself on stderr"
        assert not list(tmp_path.glob("history.bak.*")), "no backup when nothing changed"
    if args[0] == "prune" and rc == 0 and not out["dry_run"] and out["removed"]:
        backup = Path(tmp_path / out["backup"])
        assert backup.read_bytes() == before, "the backup holds the old content"


def test_prune_journal_and_backups_rotate(tmp_path: Path) -> None:
    """Each prune writes a backup (keeping the last N) and one journal line per removed stamp."""
    hist = tmp_path / "h"
    hist.write_text("".join(f"{1764400000 + i}\n" for i in range(6)))
    for i in range(5):
        rc, out, _ = run_script(
            [
                "prune",
                "--history",
                "h",
                "--stamp",
                str(1764400000 + i),
                "--keep-backups",
                "3",
                "--by",
                "spark-ops",
                "--reason",
                f"round {i}",
            ],
            tmp_path,
        )
        assert rc == 0 and out["kept"] == 5 - i
    backups = sorted(tmp_path.glob("h.bak.*"))
    assert len(backups) == 3
    assert backups[-1].read_text() == "1764400004\n1764400005\n"
    records, malformed = history.read_journal(str(tmp_path / "h.journal.jsonl"))
    assert not malformed
    assert [(r["stamp"], r["action"], r["by"], r["reason"]) for r in records] == [
        (1764400000 + i, "prune", "spark-ops", f"round {i}") for i in range(5)
    ]
    assert set(records[0]) >= {"time", "stamp", "reason", "forced", "by", "action"}


def test_append_journal_then_planned_prune(tmp_path: Path) -> None:
    """A forced restart by spark-ops recorded with append is found again by prune --planned."""
    (tmp_path / "h").write_text("1764400000\n")
    rc, out, _ = run_script(
        [
            "append",
            "--history",
            "h",
            "--stamp",
            "1764410000",
            "--forced",
            "--by",
            "spark-ops",
            "--reason",
            "max-num-seqs 64",
        ],
        tmp_path,
    )
    assert rc == 0 and out["journal"] == "h.journal.jsonl"
    run_script(["append", "--history", "h", "--stamp", "1764420000", "--by", "watchdog"], tmp_path)
    rc, out, _ = run_script(["prune", "--history", "h", "--planned"], tmp_path)
    assert [r["stamp"] for r in out["removed"]] == [1764410000]
    assert (tmp_path / "h").read_text() == "1764400000\n1764420000\n"
    rc, out, _ = run_script(["prune", "--history", "h", "--planned"], tmp_path)
    assert rc == 0 and out["removed"] == [] and out["backup"] is None


def test_missing_history_is_empty(tmp_path: Path) -> None:
    """A history that does not exist yet reads as empty; budget is fully free."""
    rc, out, _ = run_script(["budget", "--history", "nope", "--now", "100"], tmp_path)
    assert rc == 0 and out["used"] == 0 and out["next_free_at"] == 100
    rc, out, _ = run_script(["read", "--history", "nope"], tmp_path)
    assert rc == 0 and out["exists"] is False and out["entries"] == []


def test_io_error_exit_4(tmp_path: Path) -> None:
    """A history path that is a directory is an IO error: exit 4 naming the path."""
    (tmp_path / "d").mkdir()
    rc, out, err = run_script(["read", "--history", "d"], tmp_path)
    assert rc == 4 and out["error"] == "io" and "d" in out["message"] and "d" in err


def test_clock(tmp_path: Path) -> None:
    """clock prints this node's time."""
    import time

    before = time.time()
    rc, out, _ = run_script(["clock"], tmp_path)
    assert rc == 0 and before - 1 <= out["time"] <= time.time() + 1


def test_mode_preserved(tmp_path: Path) -> None:
    """Rewriting keeps the file's permission bits."""
    hist = tmp_path / "h"
    hist.write_text("1\n2\n")
    hist.chmod(0o600)
    rc, _, _ = run_script(["prune", "--history", "h", "--stamp", "1"], tmp_path)
    assert rc == 0 and (hist.stat().st_mode & 0o777) == 0o600


LINE_PARTS = [
    b'{"ts": 1764400000}',
    b'{"ts": 1764400001.5, "reason": "x"}',
    b'{"ts": true}',
    b'{"ts": -1}',
    b'{"reason": "no ts"}',
    b'{"ts": 1}, {"ts": 2}',
    b'{"ts": "1"}',
    b"[1]",
    b"1764400002",
    b"",
    b"   ",
    b'{"ts": 3',
    b'{"a": "}"}',
    b"\xff{}",
]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(LINE_PARTS), max_size=12))
def test_batch_json_matches_line_by_line(lines: list[bytes]) -> None:
    """The one-call JSON fast path gives the same entries and malformed lines as line by line."""
    data = b"\n".join(lines) + b"\n"
    fast = history.parse_history(data, fmt="jsonl")
    original = history_format._batch_json  # parse_history's home (history.py re-exports it)
    try:
        history_format._batch_json = lambda lines: None
        slow = history.parse_history(data, fmt="jsonl")
    finally:
        history_format._batch_json = original
    assert fast.to_dict() == slow.to_dict()


NODE_PYTHONS = sorted(
    {"/usr/bin/python3", *glob.glob(os.path.expanduser("~/.pyenv/versions/3.[789].*/bin/python3"))}
)


@pytest.mark.parametrize("python", NODE_PYTHONS)
def test_runs_on_node_pythons(python: str, tmp_path: Path) -> None:
    """history.py (with headlib, as sent) runs from stdin on the Pythons a node may have (3.7+),
    with the same answers, and needs nothing but the standard library (-I -S: no site-packages,
    no PYTHONPATH, so no spark-ops)."""
    if not os.access(python, os.X_OK):
        pytest.skip(f"{python} not installed")
    (tmp_path / "h").write_text('{"ts": 1764400000}\n{"ts": 1764410000}\nbroken\n')
    for args, key, expected in [
        (["budget", "--now", "1764410001"], "used", 2),
        (["prune", "--stamp", "1764400000"], "kept", 1),
        (["append", "--stamp", "1764420000"], "line", 3),
        (["read"], "count", 2),
    ]:
        proc = subprocess.run(
            [python, "-I", "-S", "-", args[0], "--history", "h", *args[1:]],
            input=SOURCE, cwd=tmp_path, capture_output=True, timeout=60,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout)[key] == expected
    assert (tmp_path / "h").read_text() == (
        '{"ts": 1764410000}\nbroken\n{"ts": 1764420000, "reason": "", "by": "", "forced": false}\n'
    )


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root (spark-ops runs history.py with sudo)")
def test_root_keeps_files_usable_for_the_watchdog_user() -> None:
    """Run as root (sudo), history.py leaves files owned by the watchdog's user, who can go on."""
    nobody = 65534
    base = Path(tempfile.mkdtemp(dir="/tmp"))
    try:
        base.chmod(0o755)
        state = base / "state"
        state.mkdir()
        os.chown(state, nobody, nobody)
        hist = state / "h"
        hist.write_text("1764400000\n1764410000\n")
        os.chown(hist, nobody, nobody)
        for args in (["prune", "--stamp", "1764400000"], ["append", "--stamp", "1764430000"]):
            proc = subprocess.run(
                [sys.executable, "-", args[0], "--history", str(hist), *args[1:]],
                input=SOURCE, capture_output=True, timeout=60,
            )  # fmt: skip
            assert proc.returncode == 0, proc.stderr
        for name in ("h", "h.lock", "h.journal.jsonl"):
            assert (state / name).stat().st_uid == nobody, name
        proc = subprocess.run(
            ["/usr/bin/python3", "-", "append", "--history", str(hist), "--stamp", "1764440000"],
            input=SOURCE, capture_output=True, timeout=60, user=nobody, group=nobody,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        assert hist.read_text() == "1764410000\n1764430000\n1764440000\n"
    finally:
        shutil.rmtree(base)


def test_symlinked_history_written_through_foreign_backups_kept(tmp_path: Path) -> None:
    """A symlinked history stays a link (the watchdog counts the target); its backups are copies;
    rotation keeps the operator's own `h.bak.known-good` and removes only spark-ops' backups."""
    real = tmp_path / "data" / "restarts"
    real.parent.mkdir()
    real.write_text("".join(f"{1764400000 + i}\n" for i in range(6)))
    (tmp_path / "h").symlink_to(real)
    mine = tmp_path / "h.bak.known-good"
    mine.write_text("mine\n")
    for i in range(5):
        rc, out, err = run_script(
            ["prune", "--history", "h", "--stamp", str(1764400000 + i), "--keep-backups", "2"],
            tmp_path,
        )
        assert rc == 0, err
        assert not Path(out["backup"]).is_symlink()
    assert (tmp_path / "h").is_symlink() and real.read_text() == "1764400005\n"
    ours = sorted(p.name for p in tmp_path.glob("h.bak.*") if p != mine)
    assert len(ours) == 2 and all(is_backup_name("h", n) for n in ours), ours
    assert mine.read_text() == "mine\n"
    assert list_backups(str(tmp_path / "h"))[-1].endswith(ours[-1])
