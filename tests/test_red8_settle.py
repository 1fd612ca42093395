"""The red team of 2026-12-06, round 8: the staged files of a dead run (a run SIGKILLed once every
node staged its write, before any rename) and who finishes that run (docs/reliability.md, round
8). One embedded cluster for the module (tests/crash/harness.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from crash.harness import COMMANDS, CrashCluster, KillPoint, run_interrupted

pytestmark = pytest.mark.slow

STAGED = KillPoint("write:running", target="staged")


def _staged(c: CrashCluster) -> list[Path]:
    """Every staged file in a recipe copy's directory (any run's, any file's)."""
    return [p for r in c.recipe_copies for p in r.parent.glob(".*.spark-ops.*")]


def _cli(c: CrashCluster, *args: str) -> subprocess.CompletedProcess[str]:
    """Run spark-ops ARGS on the module's cluster."""
    return subprocess.run(
        [sys.executable, "-m", "spark_ops.cli.main", *args],
        env=c.env(), capture_output=True, text=True, check=False, timeout=300,
    )  # fmt: skip


def _apply_killed_after_staging(c: CrashCluster) -> list[str]:
    """apply SIGKILLed once both nodes staged: its staged files are there; its arguments."""
    args, _ = COMMANDS["apply"].arrange(c)
    killed = run_interrupted(c.env(), args, STAGED, c.root)
    assert killed.fired, killed.stderr[-800:]
    assert len(_staged(c)) == len(c.recipe_copies), _staged(c)
    return args


def _settle_said(c: CrashCluster) -> str:
    """What the last run's settle step recorded, as the audit holds it."""
    steps = [s for e in c.audit() for s in e.get("steps") or [] if isinstance(s, dict)]
    said = [s for s in steps if s.get("step") == "settle" and s.get("status") == "done"]
    return json.dumps(said[-1] if said else None)


def test_a_prune_leaves_a_dead_apply_with_staged_files_to_apply(
    crash_cluster: CrashCluster,
) -> None:
    """apply killed after staging, then `budget prune --planned` (a planned stamp to remove):
    the prune does not finish that apply (it cannot remove the staged files: it reaches the head
    only), so the next apply's settle step removes them. Before the fix the prune settled the
    run (nothing written), and its staged files stayed beside both copies for good."""
    c = crash_cluster
    args = _apply_killed_after_staging(c)
    c.planned_append()
    pruned = _cli(c, "budget", "prune", "--planned", "--yes", "--json")
    assert pruned.returncode == 0, pruned.stderr[-1500:]
    rerun = _cli(c, *args)
    assert rerun.returncode == 0, rerun.stderr[-1500:]
    assert not _staged(c), f"left: {_staged(c)}"
    assert "removed the staged file(s) a dead run left" in _settle_said(c)


def _forge_intent(c: CrashCluster, writes: list[dict[str, Any]]) -> str:
    """An intent line in the head's audit log as the head's program writes it (its account
    first): a run that began and never ended, its writes as given. Its run id."""
    audit = next((c.root / "state").glob("*.audit.jsonl"))
    run = "20200101T000000-" + os.urandom(3).hex()
    line = {
        "when": time.time(), "account": "operator", "uid": os.getuid(), "operation": "apply",
        "run": run, "phase": "intent", "who": "operator@elsewhere", "pid": 1,
        "detail": {"writes": writes},
    }  # fmt: skip
    with audit.open("a") as f:
        f.write(json.dumps(line) + "\n")
    return run


def test_the_settle_step_says_where_it_could_not_look(crash_cluster: CrashCluster) -> None:
    """A dead run whose intent names a node the inventory no longer has (or whose removal fails
    on a node): the run goes on and its settle step says which staged files it did not look for
    (before the fix a warning in the log alone: nothing under --json, nothing in the audit)."""
    c = crash_cluster
    if not list((c.root / "state").glob("*.audit.jsonl")):
        _cli(c, *COMMANDS["apply"].arrange(c)[0])  # the audit log exists once a run wrote
    path = "~/" + c.rel_recipe
    _forge_intent(c, [{"host": "node9", "path": path}, {"host": "node2", "path": path}])
    rerun = _cli(c, *COMMANDS["apply"].arrange(c)[0])
    assert rerun.returncode == 0, rerun.stderr[-1500:]
    said = _settle_said(c)
    assert "not looked for beside node9:" in said, said


def test_a_retargeted_recipe_link_leaves_no_staged_file(crash_cluster: CrashCluster) -> None:
    """The recipe a symlink (`recipe -> real-a.yaml`), apply killed after staging beside real-a,
    the link retargeted to real-b.yaml, apply again: the dead run's staged files (their names carry
    its run id) are removed beside whatever file they were staged for (before the fix both
    `.real-a.yaml.spark-ops.<run>.<n>` stayed for good: the removal looked beside real-b only)."""
    c = crash_cluster
    texts = [p.read_text() for p in c.recipe_copies]
    for p, text in zip(c.recipe_copies, texts, strict=True):
        for name in ("real-a.yaml", "real-b.yaml"):
            (p.parent / name).write_text(text)
        p.unlink()
        p.symlink_to("real-a.yaml")
    try:
        args = _apply_killed_after_staging(c)
        staged = [p for r in c.recipe_copies for p in r.parent.glob(".real-a.yaml.spark-ops.*")]
        assert len(staged) == len(c.recipe_copies), staged
        for p in c.recipe_copies:
            p.unlink()
            p.symlink_to("real-b.yaml")
        rerun = _cli(c, *args)
        assert rerun.returncode == 0, rerun.stderr[-1500:]
        assert not [p for p in staged if p.exists() or p.is_symlink()], "left beside real-a"
    finally:
        for p in c.recipe_copies:
            text = p.read_text()
            p.unlink()
            p.write_text(text)
            for name in ("real-a.yaml", "real-b.yaml"):
                (p.parent / name).unlink(missing_ok=True)
