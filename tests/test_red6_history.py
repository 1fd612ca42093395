"""The red team of 2026-12-05, round 6: the history program (`exit_on_hangup` in its __main__)
signalled at each step of append and prune — before the backup, after the history's rename and
before its journal line, inside the journal's append, twice in a row — leaves the history and its
journal consistent: a stamp gone has its prune line, a stamp added its restart line, and nothing
staged beside (docs/reliability.md, "The red team of 2026-12-05, round 6")."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

STAMPS = (1_700_000_000, 1_700_000_100, 1_700_000_200)

# The program as the head runs it (its __main__), one of its steps wrapped to signal it.
DRIVER = """
import os, signal, sys
from spark_ops.headlib.proc import exit_on_hangup
from spark_ops.watchdog import history as h
where, signame, times = sys.argv[1], sys.argv[2], int(sys.argv[3])
def hit():
    for _ in range(times):
        os.kill(os.getpid(), getattr(signal, signame))
def wrap(name, before):
    real = getattr(h, name, None)
    if real is None:  # the program's step moved: say so, never pass as a signalled run
        sys.exit(97)
    def wrapped(*a, **k):
        if before:
            hit()
        out = real(*a, **k)
        if not before:
            hit()
        return out
    setattr(h, name, wrapped)
{"backup": lambda: wrap("write_backup", True),
 "renamed": lambda: wrap("atomic_write", False),
 "journal": lambda: wrap("append_journal", True)}[where]()
exit_on_hangup()
sys.exit(h.main(sys.argv[4:]))
"""

POINTS = ("backup", "renamed", "journal")
SIGNALS = (("SIGTERM", 1), ("SIGHUP", 1), ("SIGTERM", 2), ("SIGINT", 1))


def _run(tmp: Path, where: str, signame: str, times: int, args: list[str]) -> int:
    """Run the program on tmp's history with one step signalled; its exit code."""
    hist = tmp / "history"
    cmd = [sys.executable, "-c", DRIVER, where, signame, str(times), args[0], "--history",
           str(hist), *args[1:]]  # fmt: skip
    # SIGINT's default back: a process started with it ignored (an xdist worker's child, a
    # shell's background job) would otherwise ignore it, and the step run whole
    res = subprocess.run(
        cmd, capture_output=True, timeout=60, check=False,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    assert res.returncode != 97, f"the driver found no {where!r} step to signal"
    return res.returncode


def _state(tmp: Path) -> tuple[list[int], list[dict[str, Any]], list[str]]:
    """(stamps in the history, journal records, files beside it other than its own)."""
    hist = tmp / "history"
    stamps = [int(x) for x in hist.read_text().split()]
    journal = tmp / "history.journal.jsonl"
    records = [json.loads(x) for x in journal.read_text().splitlines()] if journal.exists() else []
    own = {"history", "history.journal.jsonl", "history.lock"}
    beside = [p.name for p in tmp.iterdir() if p.name not in own and ".bak." not in p.name]
    return stamps, records, beside


@pytest.fixture()
def history(tmp_path: Path) -> Path:
    """A watchdog's history of three stamps, no journal yet."""
    (tmp_path / "history").write_text("".join(f"{s}\n" for s in STAMPS))
    return tmp_path


@pytest.mark.parametrize("where", POINTS)
@pytest.mark.parametrize(("signame", "times"), SIGNALS, ids=[f"{s}x{n}" for s, n in SIGNALS])
def test_a_signalled_prune_leaves_history_and_journal_agreeing(
    history: Path, where: str, signame: str, times: int
) -> None:
    """The middle stamp pruned, the program signalled: either nothing happened, or the stamp is
    gone and the journal says it was pruned; never a prune the journal does not know."""
    code = _run(history, where, signame, times, ["prune", "--stamp", str(STAMPS[1])])
    assert code != 0  # it was signalled
    stamps, records, beside = _state(history)
    pruned = [r["stamp"] for r in records if r.get("action") == "prune"]
    assert beside == []
    assert stamps in (list(STAMPS), [STAMPS[0], STAMPS[2]])
    assert pruned == ([] if stamps == list(STAMPS) else [STAMPS[1]]), (stamps, records)


@pytest.mark.parametrize("where", ("renamed", "journal"))
@pytest.mark.parametrize(("signame", "times"), SIGNALS, ids=[f"{s}x{n}" for s, n in SIGNALS])
def test_a_signalled_append_leaves_history_and_journal_agreeing(
    history: Path, where: str, signame: str, times: int
) -> None:
    """A forced stamp appended by spark-ops, the program signalled: the stamp in the history has
    its journal line (else `prune --planned` can never find it, and it spends a budget slot)."""
    new = STAMPS[-1] + 50
    args = ["append", "--stamp", str(new), "--forced", "--by", "spark-ops:op"]
    code = _run(history, where, signame, times, args)
    assert code != 0
    stamps, records, beside = _state(history)
    assert beside == []
    assert stamps in (list(STAMPS), [*STAMPS, new])
    written = [r["stamp"] for r in records if r.get("action") == "restart"]
    assert written == ([] if stamps == list(STAMPS) else [new]), (stamps, records)


FAILURES = (
    ("usage", ["prune", "--stamp", "1", "--keep-backups", "0"], 2),
    ("strict", ["prune", "--stamp", "1", "--strict"], 5),
)


@pytest.mark.parametrize(("case", "args", "code"), FAILURES, ids=[f[0] for f in FAILURES])
def test_a_failure_whose_session_is_gone_keeps_its_code(
    history: Path, case: str, args: list[str], code: int
) -> None:
    """The SSH channel gone (stdout and stderr both closed) when the program fails: its stderr
    line met EPIPE and it ended with exit 1 ("a bug") instead of the failure's own code."""
    hist = str(history / "history")
    cmd = [sys.executable, "-m", "spark_ops.watchdog.history", args[0], "--history", hist,
           *args[1:]]  # fmt: skip
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert p.stdout is not None and p.stderr is not None
    p.stdout.close()
    p.stderr.close()
    assert (case, p.wait(timeout=60)) == (case, code)
    assert _state(history)[0] == list(STAMPS)
