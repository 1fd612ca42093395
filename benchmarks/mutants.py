"""Curated mutants of the risky rooms: each one breaks a promise, and a test must say so.

Usage: python benchmarks/mutants.py [--only NAME] [--keep]

For every mutant below (a room, one exact piece of source, what it is replaced by, and the tests
that state the promise it breaks) the script copies the package and the tests into a scratch
directory, applies the one change there, and runs only those tests against the copy (PYTHONPATH
puts the copy first, for the CLI's subprocesses too). A mutant is killed when its tests fail; one
whose tests all pass survived, and the script exits 1 naming it. The tree it runs from is never
changed. The table printed at the end is the one docs/contracts.md keeps.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEADLINE_S = 900.0  # one mutant's tests; a hang counts as killed only if the tests fail


@dataclass(frozen=True)
class Mutant:
    """One change to one file, and the tests that must fail because of it."""

    room: str
    name: str
    path: str  # relative to the repository
    old: str  # exact text, found once
    new: str
    tests: tuple[str, ...]  # pytest node ids or `file -k expr` pieces


JOURNAL = ("tests/test_journal.py", "-k", "journal_case")
GATE = ("tests/test_gate.py", "-k", "plan_differences")
HISTORY = ("tests/test_history_cases.py",)
IDENTIFY = ("tests/test_stamp_contract.py", "-k", "test_identify")
RECIPE = ("tests/test_recipe_knobs.py", "tests/test_recipe_cases.py")
AUTH = ("tests/test_serve.py", "-k", "same_token or every_route or token_in_the_url")

MUTANTS = [
    Mutant("journal", "a settler that died in its settle step counted as done",
           "spark_ops/workflows/journal.py",
           'if settle == "done" or', 'if settle in ("done", "failed", "running") or', JOURNAL),
    Mutant("journal", "a failed prune record counted as pruned",
           "spark_ops/workflows/journal.py",
           'prune.get("status") in ("done", "skipped")',
           'prune.get("status") in ("done", "skipped", "failed")', JOURNAL),
    Mutant("journal", "a settler whose end is not ok finishes the runs it names",
           "spark_ops/workflows/journal.py",
           'r.end.get("outcome") == "ok"', 'r.end is not None', JOURNAL),
    Mutant("journal", "the stamp a dead run identified is ignored",
           "spark_ops/workflows/journal.py",
           'stamp=finite_number(merged.get("stamp")),', "stamp=None,", JOURNAL),
    Mutant("gate", "more restarts used compared against used + 1",
           "spark_ops/workflows/gate.py",
           "int(b.used) > int(a.used)", "int(b.used) > int(a.used) + 1", GATE),
    Mutant("gate", "the watchdog's allowed restarts changed meanwhile is no difference",
           "spark_ops/workflows/gate.py",
           "if a.allowed != b.allowed or int(b.used)", "if int(b.used)", GATE),
    Mutant("history", "the budget counts a stamp exactly one window old",
           "spark_ops/headlib/history_format.py",
           "inside = sorted(s for s in stamps if s > now - window)",
           "inside = sorted(s for s in stamps if s >= now - window - 1)", HISTORY),
    Mutant("history", "a budget with one slot left is called spent",
           "spark_ops/headlib/history_format.py",
           '"over_budget": used >= allowed,', '"over_budget": used >= allowed - 1,', HISTORY),
    Mutant("identify", "no slack around the restart's head-clock window",
           "spark_ops/watchdog/identify.py",
           "lo, hi = window[0] - SLACK_S, window[1] + SLACK_S", "lo, hi = window", IDENTIFY),
    Mutant("identify", "new entries neither planned nor automatic are not refused",
           "spark_ops/watchdog/identify.py",
           "    if not unknown:\n", "    if True:\n", IDENTIFY),
    Mutant("identify", "a repeated line is not a new entry",
           "spark_ops/watchdog/identify.py",
           "if left[e.raw] > 0:", "if left[e.raw] >= 0:", IDENTIFY),
    Mutant("recipe edit", "the \"did not take effect\" check disabled",
           "spark_ops/recipe/diff.py",
           "if not took_effect(change, args, after.env,",
           "if False and not took_effect(change, args, after.env,", RECIPE),
    Mutant("serve auth", "an empty token accepted",
           "spark_ops/serve/auth.py",
           "    if not given:\n        return False\n", "    if not given:\n        return True\n",
           AUTH),
    Mutant("serve auth", "a wrong ?token= still sets a session",
           "spark_ops/serve/app.py",
           'if not same_token(request.query.get("token"), token):', "if False:", AUTH),
]  # fmt: skip


def scratch_copy(where: Path) -> Path:
    """The package, the tests and the project file copied under `where` (beside a `shared` link,
    as tests/conftest.py finds the shared corpus next to the repository)."""
    repo = where / "repo"
    repo.mkdir()
    for name in ("spark_ops", "refwatchdog", "tests", "benchmarks"):
        shutil.copytree(REPO / name, repo / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "conftest.py"):
        if (REPO / name).exists():
            shutil.copy2(REPO / name, repo / name)
    shared = REPO.parent / "shared"
    if shared.exists():
        (where / "shared").symlink_to(shared)
    return repo


def apply(repo: Path, m: Mutant) -> str:
    """Put the mutant into the copy; returns the original text to restore."""
    target = repo / m.path
    text = target.read_text("utf-8")
    if text.count(m.old) != 1:
        raise SystemExit(f"{m.path}: the text of mutant {m.name!r} is found {text.count(m.old)} "
                         "times, not once: update benchmarks/mutants.py")  # fmt: skip
    target.write_text(text.replace(m.old, m.new), "utf-8")
    return text


def run_tests(repo: Path, tests: tuple[str, ...]) -> tuple[bool, float]:
    """(killed, seconds): whether the tests failed against the mutated copy."""
    env = {**os.environ, "PYTHONPATH": str(repo), "PYTHONDONTWRITEBYTECODE": "1"}
    argv = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *tests]
    began = time.monotonic()
    try:
        res = subprocess.run(argv, cwd=repo, env=env, capture_output=True, timeout=DEADLINE_S)
    except subprocess.TimeoutExpired:
        return False, time.monotonic() - began
    return res.returncode not in (0, 5), time.monotonic() - began


def main() -> int:
    """Run every mutant (or the one named); print the table; exit 1 when one survived."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", help="run the mutants whose name contains this")
    ap.add_argument("--keep", action="store_true", help="keep the scratch directory")
    args = ap.parse_args()
    chosen = [m for m in MUTANTS if not args.only or args.only in m.name]
    where = Path(tempfile.mkdtemp(prefix="spark-ops-mutants-"))
    try:
        repo = scratch_copy(where)
        for tests in dict.fromkeys(m.tests for m in chosen):  # each set once, unmutated
            failed, _ = run_tests(repo, tests)
            if failed:
                print(f"unmutated, {' '.join(tests)} fails: nothing to judge", file=sys.stderr)
                return 2
        rows, survivors = [], []
        for m in chosen:
            original = apply(repo, m)
            try:
                killed, seconds = run_tests(repo, m.tests)
            finally:
                (repo / m.path).write_text(original, "utf-8")
            rows.append((m.room, m.name, "killed" if killed else "SURVIVED", seconds))
            if not killed:
                survivors.append(m.name)
            print(f"{rows[-1][2]:9} {m.room:11} {m.name} ({seconds:.0f} s)", file=sys.stderr)
    finally:
        if not args.keep:
            shutil.rmtree(where, ignore_errors=True)
    print("| room | mutant | result | tests ran (s) |")
    print("| --- | --- | --- | --- |")
    for room, name, result, seconds in rows:
        print(f"| {room} | {name} | {result} | {seconds:.0f} |")
    print(f"\n{len(rows) - len(survivors)}/{len(rows)} killed; survivors: {survivors or 'none'}")
    return 1 if survivors else 0


if __name__ == "__main__":
    sys.exit(main())
