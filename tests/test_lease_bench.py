"""Issue 30 #2 and the plans of #4 on the embedded cluster: `bench --concurrency 64` at cap 6, the
reference watchdog probing every 2 s with a 3 s timeout (a probe queued behind 58 requests times
out). With a pause file the level runs under a lease the watchdog honours, written to the run's
journal as step records and ended after; without one it is refused before any request is sent
(exit 9, the arithmetic shown); `--unleased-load` runs it. The plan says which, per level, before
the load: for bench, for an experiment's configurations (`--dry-run`), and when the inventory does
not describe the watchdog's probe. And `restart --dry-run --json` without a pause file names the
risk that remains (#1). One cluster for the module."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import Sim, start_sim

from spark_ops.errors import ExitStatus

pytestmark = pytest.mark.slow

STATE = ".local/state/spark-watchdog"
BENCH = ["bench", "--concurrency", "64", "--repeats", "1"]


@pytest.fixture(scope="module")
def probing(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sim]:
    """Cap 6, the reference watchdog probing every 2 s with a 3 s timeout."""
    from spark_ops.sim.control import down, wait_serving

    s = start_sim(
        tmp_path_factory.mktemp("lease-bench") / "sim", time_scale=10.0,
        watchdog_interval_s=2.0, watchdog_probe_timeout_s=3.0,
    )  # fmt: skip
    try:
        wait_serving(s.state)
        yield s
    finally:
        down(s.root)


def cli(inventory: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Run the real CLI against the embedded cluster (this inventory)."""
    env = dict(os.environ, SPARK_OPS_INVENTORY=str(inventory))
    env.pop("SPARK_OPS_CLUSTER", None)
    env.pop("SPARK_OPS_FLEET", None)
    return subprocess.run(
        [sys.executable, "-m", "spark_ops.cli.main", *args],
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip


def without(sim: Sim, tmp_path: Path, *keys: str) -> Path:
    """A copy of the cluster's inventory without these watchdog keys."""
    data = yaml.safe_load(sim.inventory.read_text())
    (cluster,) = data["clusters"].values()
    for key in keys:
        del cluster["watchdog"][key]
    path = tmp_path / f"no-{'-'.join(keys)}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def flat(text: str) -> str:
    """Text as one line of words."""
    return " ".join(text.split())


def pause(sim: Sim) -> Path:
    """The watchdog's pause file (the inventory's watchdog.pause_file)."""
    return sim.head / STATE / "pause"


def audit_of(sim: Sim, run_operation: str) -> list[dict[str, Any]]:
    """The audit records of the last run of this operation (its intent, steps and end)."""
    res = cli(sim.inventory, "log", "--json", "--raw", "--limit", "200")
    entries = [e for e in json.loads(res.stdout) if isinstance(e, dict)]
    intents = [
        e for e in entries
        if e.get("phase") == "intent" and (e.get("what") or {}).get("operation") == run_operation
    ]  # fmt: skip
    assert intents, f"no {run_operation} run in the audit log: {res.stdout[-2000:]}"
    run = intents[-1]["run"]
    return [e for e in entries if e.get("run") == run]


def test_bench_64_at_cap_6_is_leased_and_the_lease_ended(probing: Sim) -> None:
    """The plan says C=64 is leased before any request (nothing measured before it: an unknown
    request time counts as a timeout); the watchdog's probe times out behind the load and it
    stands down; the lease is recorded as step records of the bench-load run and ended."""
    sim = probing
    history = sim.history.read_bytes()
    log = sim.head / "watchdog.log"
    logged = len(log.read_bytes())
    res = cli(sim.inventory, *BENCH, "--output-tokens", "300")
    err = res.stderr
    assert res.returncode == 0, err[-3000:]
    planned = err.index("C=64: leased (concurrency 64 at max_num_seqs 6: 58 requests queue")
    leased = err.index("note: concurrency 64: watchdog paused until")
    assert planned < leased, "the plan is shown before the load"
    assert "10 round(s) of an unknown request time (nothing measured before it)" in err
    assert not pause(sim).exists(), "the lease was ended"
    assert sim.history.read_bytes() == history, "the budget is exactly as before"
    said = log.read_bytes()[logged:].decode("utf-8", "replace")
    assert "timed out after 3 s" in said, f"the load starved the probe: {said[-3000:]}"
    assert '"event": "restarting"' not in said, "the watchdog stood down"
    records = audit_of(sim, "bench-load")
    steps = [s for e in records if e.get("phase") == "step" for s in e["steps"]]
    lease = [s for s in steps if s["step"] == "lease"]
    assert [s["status"] for s in lease] == ["taking", "done"], steps
    assert lease[-1]["level"] == 64 and lease[-1]["lease"]["state"] == "held"
    assert lease[-1]["lease"]["sha"] and lease[-1]["lease"]["expires"]
    release = [s for s in steps if s["step"] == "release"]
    assert [(s["status"], s["detail"]) for s in release] == [("done", "ended")], steps
    intent = next(e for e in records if e.get("phase") == "intent")
    assert intent["detail"]["load"]["levels"][0]["action"] == "lease"
    assert next(e for e in records if e.get("phase") == "end")["outcome"] == "ok"


def test_without_a_pause_file_bench_64_is_refused_then_run_unleased(
    probing: Sim, tmp_path: Path
) -> None:
    """No watchdog.pause_file: refused before any request with the arithmetic (exit 9, said
    once); `restart --dry-run --json` names the risk that remains; `--unleased-load` runs the
    level, saying so once (a short request: the probe is not starved here)."""
    sim = probing
    inv = without(sim, tmp_path, "pause_file")
    res = cli(inv, *BENCH, "--output-tokens", "300")
    assert res.returncode == ExitStatus.ABORTED == 9, res.stderr[-3000:]
    err = flat(res.stderr)
    assert "C=64: REFUSED (concurrency 64 at max_num_seqs 6:" in err
    assert (
        "error: concurrency 64 would starve the watchdog's probe and the watchdog cannot be paused "
        "(no watchdog.pause_file): refused before any request was sent; C=64: concurrency 64 at "
        "max_num_seqs 6: 58 requests queue, the probe waits for 59 to finish, 6 at a time = 10 "
        "round(s) of an unknown request time (nothing measured before it): taken as a timeout; "
        "after 3 failed probes (about 7 s) the watchdog restarts the engine" in err
    ), err[-3000:]
    assert "--unleased-load" in err and err.count("would starve the watchdog's probe and") == 1
    assert "C=64:" not in res.stdout and "tok/s" not in err, "no level ran"
    # #1: a planned restart without a pause file says which risk remains (nothing changed)
    plan = cli(inv, "restart", "--dry-run", "--json")
    assert plan.returncode == 0, plan.stderr[-3000:]
    steps = {s["name"]: s["description"] for s in json.loads(plan.stdout)["plan"]["steps"]}
    assert steps["lease"] == (
        "no lease: the watchdog is not paused (the inventory names no watchdog.pause_file): it "
        "may restart the engine itself during the boot or under load (its probe fails 3 times in "
        "a row: about 6 s), spending a slot of its budget that spark-ops cannot prune (an "
        "automatic stamp)"
    ), steps
    # --unleased-load: the operator's explicit option runs it, and it is said once
    history = sim.history.read_bytes()
    res = cli(inv, *BENCH, "--output-tokens", "8", "--unleased-load")
    assert res.returncode == 0, res.stderr[-3000:]
    err = flat(res.stderr)
    assert "C=64: runs UNLEASED (--unleased-load)" in err, err[-3000:]
    assert err.count("note: concurrency 64: unleased (--unleased-load):") == 1, err[-3000:]
    assert not pause(sim).exists() and sim.history.read_bytes() == history


def test_an_undescribed_probe_is_named_once_and_never_run_past(
    probing: Sim, tmp_path: Path
) -> None:
    """No watchdog.probe: with a pause file a level at the cap or above is leased (the risk
    named once, with the key to set); with no pause file either, bench and an experiment's
    --dry-run refuse it up front (exit 9) naming watchdog.probe."""
    sim = probing
    inv = without(sim, tmp_path, "probe")
    res = cli(inv, "bench", "--concurrency", "1,64", "--repeats", "1", "--output-tokens", "8")
    assert res.returncode == 0, res.stderr[-3000:]
    err = flat(res.stderr)
    assert err.count("the inventory has no watchdog.probe") == 1, err[-3000:]
    assert "set watchdog.probe: {interval_s, timeout_s, failures}" in err
    assert "C=64: leased (at max_num_seqs 6 the probe queues behind 59 request(s)" in err
    assert "note: concurrency 64: watchdog paused until" in err
    assert not pause(sim).exists(), "the lease was ended"
    bare = without(sim, tmp_path, "probe", "pause_file")
    res = cli(bare, "bench", "--concurrency", "1,64", "--repeats", "1")
    assert res.returncode == ExitStatus.ABORTED, res.stderr[-3000:]
    err = flat(res.stderr)
    assert "refused before any request was sent" in err and "C=1:" not in res.stdout
    assert "hint: set watchdog.probe: {interval_s, timeout_s, failures}" in err, err[-2000:]
    assert "leave it out (--concurrency 1)" in err
    args = ["experiment", "--max-num-seqs", "6,64", "--measure-all", "--concurrency", "1,64"]
    res = cli(bare, *args, "--dry-run", "--state", str(tmp_path / "exp.json"))
    assert res.returncode == ExitStatus.ABORTED, res.stdout[-2000:] + res.stderr[-2000:]
    said = flat(res.stdout + res.stderr)
    assert "max_num_seqs=6, load against the watchdog (max_num_seqs 6;" in said, said[-3000:]
    assert "max_num_seqs=64, load against the watchdog (max_num_seqs 64;" in said
    assert said.count("the inventory has no watchdog.probe") == 1, said[-3000:]
    # each cap asked is a level too (levels 1, 6, 64): 6 and 64 queue the probe at cap 6
    assert "experiment would refuse: concurrency 6, 64 would starve the watchdog's probe" in said
    assert "refused before anything was changed (no restart, no request)" in said
    assert "Dry run: nothing was changed." in said


def test_the_experiments_plan_shows_each_level_up_front(probing: Sim, tmp_path: Path) -> None:
    """The README's experiment with a pause file: per configuration, which levels run as is and
    from which measured request time each is leased, before anything is changed."""
    res = cli(
        probing.inventory, "experiment", "--max-num-seqs", "6,64", "--measure-all",
        "--concurrency", "1,6,16,64", "--dry-run", "--state", str(tmp_path / "exp.json"),
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    out = flat(res.stdout)
    assert "max_num_seqs=6, load against the watchdog (max_num_seqs 6; the watchdog's probe" in out
    assert "C=1: runs as is (below max_num_seqs 6" in out
    assert "C=16: leased if the sweep measures a request at 1.5 s or more, else it runs" in out
    assert "C=64: leased if the sweep measures a request at 0.3 s or more" in out
    assert "C=1, 6, 16: run as is (below max_num_seqs 64" in out
    assert "C=64: leased if the sweep measures a request at 3 s or more" in out, out[-3000:]
