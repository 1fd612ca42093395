"""Issue 21 #1 and #7 on the embedded cluster: a restart meets the watchdog's budget before anything
is written or locked, and the confirmation waits without the cluster lock, then runs only the
plan it showed.

Both fail on a tool that restarts over a spent budget (plan exit 0, apply restarts) or that asks
its question while holding the lock (status shows the lock held while the prompt waits).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import time
from typing import Any

import pytest
import yaml
from conftest import REPO, Sim, cluster_files
from test_e2e_apply import spark_ops, tree_digest

from spark_ops.errors import ExitStatus

FIXTURES = REPO / "tests" / "fixtures" / "gate"
SPENT = yaml.safe_load((FIXTURES / "spent.yaml").read_text())
DIFFERENCES = yaml.safe_load((FIXTURES / "differences.yaml").read_text())


@pytest.mark.parametrize("case", DIFFERENCES, ids=[c["name"] for c in DIFFERENCES])
def test_plan_differences(case: dict[str, Any]) -> None:
    """What makes the plan under the lock another plan than the one shown (and what does not)."""
    from spark_ops.workflows.gate import plan_differences
    from spark_ops.workflows.plan import Plan, PlanFacts

    def plan(side: dict[str, Any]) -> Plan:
        """A restart plan with the case's facts and warnings."""
        p = Plan("restart", "sim", facts=PlanFacts.from_json(side.get("facts", {})))
        p.warnings = list(side.get("warnings", []))
        p.add("restart", "force a restart")
        return p

    found = plan_differences(plan(case["shown"]), plan(case["now"]))
    assert len(found) == len(case["expect"]), found
    for line, words in zip(found, case["expect"], strict=True):
        assert words in line, found


def audit_records(sim: Sim) -> list[dict[str, Any]]:
    """The head's audit log (empty when nothing was ever recorded)."""
    path = cluster_files(sim.history)["audit"]
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


@pytest.mark.slow
def test_spent_budget_refuses_every_restart_path(sim: Sim, cli_env: dict[str, str]) -> None:
    """2/2 used: plan, apply, restart, rollback and experiment refuse (exit 16) with the next slot,
    write nothing, leave no lock held (a --yes run plans under the lock and lets it go as it
    refuses); `restart --over-budget` goes ahead and says so everywhere."""
    now = int(time.time())
    sim.history.write_text("".join(f"{now - age}\n" for age in SPENT["ages"]))
    backup = sim.recipe.with_name(sim.recipe.name + ".bak.20261201T000000.000000Z")
    backup.write_text(sim.recipe.read_text().replace("max_num_seqs: 6 ", "max_num_seqs: 7 "))
    owner = cluster_files(sim.history)["owner"]
    before, history, audit = tree_digest(sim.root), sim.history.read_text(), audit_records(sim)
    for case in SPENT["cases"]:
        res = spark_ops(cli_env, *case["command"])
        said = f"{case['name']}: exit {res.returncode}\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
        assert res.returncode == ExitStatus.OVER_BUDGET, said
        for words in case.get("stdout", []):
            assert words in res.stdout, said
        for words in case.get("stderr", []):
            assert words in res.stderr, said
        assert re.search(SPENT["next_slot"], res.stdout + res.stderr), said
        if "json_stdout" in case:
            doc = json.loads(res.stdout)
            assert doc["ok"] is case["json_stdout"]["ok"], said
            assert doc["refused"]["error"] == case["json_stdout"]["refused"], said
            assert doc["plan"]["facts"]["budget"]["spent"] is True, said
            assert re.search(SPENT["next_slot"], doc["refused"]["message"]), said
        if "json_stderr" in case:
            err = json.loads(res.stderr.strip().splitlines()[-1])
            assert err["error"] == case["json_stderr"]["error"], said
            assert err["budget"]["used"] == 2 and err["budget"]["allowed"] == 2, said
        assert tree_digest(sim.root) == before, f"{case['name']} wrote something"
        assert sim.history.read_text() == history, case["name"]
        assert not (owner.exists() and owner.read_text()), f"{case['name']} left the lock held"
    assert audit_records(sim) == audit, "a refused run records no intent"
    backup.unlink()

    res = spark_ops(cli_env, "restart", "--yes", "--no-drain", "--over-budget", "--json")
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout)
    gate = out["plan"]["facts"]["budget"]
    assert gate["spent"] is True and gate["over_budget_given"] is True
    assert any(w.startswith("--over-budget given: ") for w in out["plan"]["warnings"])
    assert any("no slot left" in w for w in out["warnings"]), "the end says so, no green ✓"
    assert sim.history.read_text() == history, "the planned stamp is pruned all the same"
    intents = [r for r in audit_records(sim) if r.get("phase") == "intent"]
    assert intents and intents[-1]["what"]["args"].get("over_budget") is True, intents[-1:]
    assert intents[-1]["detail"]["budget"]["spent"] is True


def _ask(env: dict[str, str], *args: str) -> subprocess.Popen[bytes]:
    """The real CLI, left at its confirmation (stdin a pipe nobody answers yet)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "spark_ops.cli.main", *args],
        env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    assert proc.stderr is not None
    seen = b""
    while b"Proceed?" not in seen:
        chunk = os.read(proc.stderr.fileno(), 4096)
        assert chunk, f"the CLI ended before asking: {seen.decode(errors='replace')[-2000:]}"
        seen += chunk
    return proc


def _edit_recipe(sim: Sim) -> str:
    """A colleague edits the recipe (another key than the one asked)."""
    text = sim.recipe.read_text().replace("max_model_len: 131072", "max_model_len: 65536")
    sim.recipe.write_text(text)
    return "the recipe changed"


def _restart_elsewhere(sim: Sim) -> str:
    """The watchdog's history gains a stamp (a restart somebody else made)."""
    with sim.history.open("a") as fh:
        fh.write(f"{int(time.time())}\n")
    return "the restart budget: 1/2 used -> 2/2 used"


@pytest.mark.slow
def test_prompt_waits_without_the_lock_and_runs_only_the_plan_shown(
    sim: Sim, cli_env: dict[str, str]
) -> None:
    """While `apply` waits for its answer the lock is free (status says so, no run under way);
    the cluster changes meanwhile (a colleague's recipe edit, then a restart stamp); `y`: the run
    refuses (exit 17) naming the change, writes nothing, records nothing."""
    for meanwhile in (_edit_recipe, _restart_elsewhere):
        proc = _ask(cli_env, "apply", "--max-num-seqs", "8", "--no-drain")
        try:
            res = spark_ops(cli_env, "status", "--json")
            state = json.loads(res.stdout)
            assert state["runs"]["lock_held"] is False, state["runs"]
            assert res.returncode != ExitStatus.RESTARTING, res.stdout[-2000:]
            changed = meanwhile(sim)
            before, history = tree_digest(sim.root), sim.history.read_text()
            audit = audit_records(sim)
            _out, err = proc.communicate(b"y\n", timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
        text = err.decode(errors="replace")
        assert proc.returncode == ExitStatus.PLAN_CHANGED, text[-3000:]
        assert "what changed since the plan was shown" in text and changed in text, text[-3000:]
        assert tree_digest(sim.root) == before, "nothing written"
        assert sim.history.read_text() == history
        assert audit_records(sim) == audit, "no intent recorded"


async def test_the_question_leaves_the_event_loop_running(monkeypatch: pytest.MonkeyPatch) -> None:
    """While `Proceed?` waits, the loop goes on (SSH keepalives answered: a prompt left a minute
    used to drop every connection, red team); the answer then comes back as click reads it."""
    import io
    import os

    from spark_ops.cli.common import confirm

    read_end, write_end = os.pipe()
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(os.fdopen(read_end, "rb")))
    ticks = 0

    async def tick() -> None:
        """Count the loop's turns while the question waits."""
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0.01)

    ticker = asyncio.create_task(tick())
    asker = asyncio.create_task(confirm("Proceed?"))
    give_up = time.monotonic() + 60  # the loop turns while the question waits: a count, no speed
    while ticks <= 5:
        assert time.monotonic() < give_up, f"the loop turned {ticks} times"
        await asyncio.sleep(0.01)
    assert not asker.done()
    print(f"reached: {ticks} loop turns while the question waited")
    os.write(write_end, b"y\n")
    os.close(write_end)
    assert await asyncio.wait_for(asker, 10) is True
    ticker.cancel()


LIMITS = yaml.safe_load((FIXTURES / "limits.yaml").read_text())


def test_the_gate_counts_the_watchdogs_own_budget(sim: Sim, cli_env: dict[str, str]) -> None:
    """Red team: the budget the watchdog enforces (its config's) is the one a restart meets; the
    inventory's `watchdog.budget` differing is said in the plan (fixtures/gate/limits.yaml)."""
    config = sim.head / ".config" / "spark-watchdog.yaml"
    shipped, inventory = config.read_text(), sim.inventory.read_text()
    for case in LIMITS:
        wd, inv = case["watchdog"], case["inventory"]
        config.write_text(
            shipped.replace("max: 2\n", f"max: {wd['max']}\n").replace(
                "window: 21600\n", f"window: {wd['window']}\n"
            )
        )
        sim.inventory.write_text(
            inventory.replace(
                "budget: {max_restarts: 2, window_s: 21600}",
                f"budget: {{max_restarts: {inv['max_restarts']}, window_s: {inv['window_s']}}}",
            )
        )
        res = spark_ops(cli_env, "plan", "--max-num-seqs", "8", "--json")
        said = f"{case['name']}: exit {res.returncode}\n{res.stdout[-3000:]}\n{res.stderr[-2000:]}"
        assert res.returncode == case["exit"], said
        doc = json.loads(res.stdout)
        gate = doc["plan"]["facts"]["budget"]
        assert (gate["allowed"], gate["used"]) == (case["allowed"], case["used"]), said
        assert "the watchdog's config node1:" in gate["limits_source"], said
        warned = [w for w in doc["plan"]["warnings"] if "watchdog.budget" in w]
        if case["says"] is None:
            assert gate["inventory_disagrees"] is None and not warned, said
        else:
            assert case["says"] in gate["inventory_disagrees"], said
            assert warned and case["says"] in warned[0], said
            if case["exit"]:
                assert case["says"] in doc["refused"]["message"], said
    # the watchdog's config not readable where its commands say: counted against the inventory's,
    # and the plan says which file could not be read (a relative --config names no one file)
    config.write_text(shipped)
    sim.inventory.write_text(inventory)
    for spelled, says in (("~/.config/nowhere.yaml", "no watchdog config at node1:~/.config/"),
                          ("wd.yaml", "its config 'wd.yaml' is a relative path")):  # fmt: skip
        sim.inventory.write_text(
            inventory.replace("--config ~/.config/spark-watchdog.yaml", f"--config {spelled}")
        )
        res = spark_ops(cli_env, "plan", "--max-num-seqs", "8", "--json")
        assert res.returncode == 0, res.stderr[-2000:]
        doc = json.loads(res.stdout)
        gate = doc["plan"]["facts"]["budget"]
        assert gate["limits_source"] == "the inventory's watchdog.budget"
        assert (
            says in gate["inventory_disagrees"] and "may not enforce" in gate["inventory_disagrees"]
        )
        assert any(says in w for w in doc["plan"]["warnings"]), doc["plan"]["warnings"]
        text = spark_ops(cli_env, "budget")  # a person reading `budget` is told it too
        assert says in " ".join(text.stdout.split()) and "may not enforce" in text.stdout, text
    # another watchdog with a --config of its own format: its budget is the inventory's, unwarned
    sim.inventory.write_text(
        inventory.replace(
            "spark-watchdog --config ~/.config/spark-watchdog.yaml",
            "my-watchdog --config ~/.config/my-watchdog.conf",
        )
    )
    res = spark_ops(cli_env, "plan", "--max-num-seqs", "8", "--json")
    gate = json.loads(res.stdout)["plan"]["facts"]["budget"]
    assert gate["limits_source"] == "the inventory's watchdog.budget", res.stdout[-2000:]
    assert gate["inventory_disagrees"] is None
