"""Every run converges (issue 20, items 1-4): killed or interrupted, the next run finishes it.

One embedded cluster for the module; each case in tests/fixtures/converge/cases.yaml runs a
command, stops it by a signal at a named moment, checks what the records say, runs the follow-up
command and checks that the cluster converged: the engine runs what the recipe says, the history
holds exactly the watchdog's own entries, no run is left unfinished.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import Sim, start_sim

CASES: list[dict[str, Any]] = yaml.safe_load(
    (Path(__file__).parent / "fixtures" / "converge" / "cases.yaml").read_text("utf-8")
)


@pytest.fixture(scope="module")
def msim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sim]:
    """One embedded cluster for every case (quick boots)."""
    from spark_ops.sim.control import down

    s = start_sim(tmp_path_factory.mktemp("converge") / "sim", boot_scale=0.5)
    try:
        yield s
    finally:
        down(s.root)


def env_for(sim: Sim, inventory: Path | None = None) -> dict[str, str]:
    """The CLI's environment for this cluster (or another inventory of it)."""
    env = dict(os.environ)
    env["SPARK_OPS_INVENTORY"] = str(inventory or sim.inventory)
    env.pop("SPARK_OPS_CLUSTER", None)
    env.pop("SPARK_OPS_FLEET", None)
    return env


def cli(env: dict[str, str], *args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    """Run spark-ops to its end."""
    return subprocess.run(
        [sys.executable, "-m", "spark_ops.cli.main", *args],
        env=env, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


def no_journal_inventory(sim: Sim) -> Path:
    """The same cluster, seen as a watchdog without a journal (its records are not read)."""
    data = yaml.safe_load(sim.inventory.read_text())
    cluster = next(iter(data["clusters"].values()))
    cluster["watchdog"]["journal_file"] = "~/.local/state/spark-watchdog/not-kept.jsonl"
    path = sim.inventory.with_name("no-journal.yaml")
    path.write_text(yaml.safe_dump(data))
    return path


def run_and_stop(
    env: dict[str, str], args: list[str], kill: dict[str, str], sig: int, history: Path
) -> tuple[int, str]:
    """Start the CLI with --json, send `sig` at the moment `kill` names; its exit code, stderr."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "spark_ops.cli.main", *args, "--yes", "--json"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stderr is not None
    seen: list[str] = []
    if "stamp" in kill:  # the moment the watchdog's stamp lands in the history
        before = history.read_text()
        deadline = time.monotonic() + 120
        while history.read_text() == before and time.monotonic() < deadline:
            time.sleep(0.02)
        proc.send_signal(sig)
    else:
        for line in proc.stderr:
            seen.append(line)
            with contextlib.suppress(ValueError, AttributeError):
                step = json.loads(line).get("step") or {}
                if step.get("name") == kill["step"] and step.get("status") == kill["status"]:
                    proc.send_signal(sig)
                    break
    _, err = proc.communicate(timeout=180)
    return proc.returncode, "".join(seen) + err


def status(env: dict[str, str]) -> dict[str, Any]:
    """`spark-ops status --json`."""
    res = cli(env, "status", "--json")
    return json.loads(res.stdout)


def audit(env: dict[str, str]) -> list[dict[str, Any]]:
    """The head's audit log."""
    return json.loads(cli(env, "log", "--json", "--raw", "--limit", "400").stdout)


def wait_serving(env: dict[str, str], timeout: float = 120) -> dict[str, Any]:
    """Status once the engine answers again (a killed run's boot goes on without it)."""
    deadline = time.monotonic() + timeout
    while True:
        data = status(env)
        if data["engine"].get("up") or time.monotonic() > deadline:
            return data
        time.sleep(1)


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_the_next_run_converges(msim: Sim, case: dict[str, Any]) -> None:
    """Stop the run as the case says; the records tell how far it got; the next run finishes."""
    env = env_for(msim)
    for setup in case["setup"]:
        assert cli(env, *setup, "--yes").returncode == 0
    wait_serving(env)
    run_env = env_for(msim, no_journal_inventory(msim)) if case.get("inventory") else env
    history_before = msim.history.read_text()
    entries_before = len(audit(env))
    expect = case["expect"]
    sig = getattr(signal, case["signal"])
    code, err = run_and_stop(run_env, case["run"], case["kill"], sig, msim.history)
    assert code == expect.get("exit", -sig), err[-3000:]
    time.sleep(1.0)  # the head notices the dropped connection
    new = audit(env)[entries_before:]
    killed = [e for e in new if e.get("phase") == "intent"]
    assert killed, f"no intent record for the killed run: {new}"
    if "audit_of_killed" in expect:
        recorded = ["intent"] + [
            s["step"] for e in new if e.get("phase") == "step" for s in e["steps"]
            if s.get("status") in ("done", "running", "triggered")
        ]  # fmt: skip
        for name in expect["audit_of_killed"]:
            assert name in recorded, f"{name} not recorded: {recorded}"
    if "unfinished_before_rerun" in expect:
        assert len(status(env)["runs"]["unfinished"]) == expect["unfinished_before_rerun"]
    if "standing" in expect:
        error = json.loads(err.strip().splitlines()[-1])
        assert len(error["standing"]) == expect["standing"], error
        ends = [e for e in new if e.get("phase") == "end"]
        assert ends and ends[-1]["outcome"].startswith(expect["audit_outcome"]), ends
    if expect.get("history") == "as_before" and "then" not in case:
        assert msim.history.read_text() == history_before
    res = cli(run_env, *case["then"], "--yes")
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    for words in expect.get("rerun_says", []):
        assert words in res.stdout, res.stdout[-3000:]
    after = wait_serving(env)
    assert after["engine"].get("up"), after["engine"]
    recipe = after["recipe"]["knobs"]["max_num_seqs"]
    effective = (after["engine"].get("effective") or {}).get("max_num_seqs")
    assert str(effective) == str(recipe), f"engine runs {effective}, recipe says {recipe}"
    if isinstance(expect.get("engine_max_num_seqs"), int):
        assert int(recipe) == expect["engine_max_num_seqs"]
    if expect.get("history") == "as_before":
        assert msim.history.read_text() == history_before, "exactly the watchdog's own entries"
    assert len(after["runs"]["unfinished"]) == expect.get("unfinished_after", 0), after["runs"]
    assert not after["runs"]["lock_held"]
