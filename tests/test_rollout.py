"""`apply --prove` and `rollout` (docs/fleet.md) on three real embedded clusters at once.

One module, three 2-node sims started once (east, west, north; west with the sim fault
`slow_decode`, which slows its decode only at max_num_seqs 8). The cells follow each other on the
same clusters, each case under tests/fixtures/rollout/: a rollout whose second cluster regresses
(the canary kept, west rolled back with its numbers shown, north untouched, every budget as
before), then a rollout killed once its second cluster's restart is in that cluster's history and
resumed: without the measurement journalled before the change it stops there, unproven; with it,
the change found in place is proven against it and the rollout converges.
Behaviour only: no duration is asserted.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from conftest import Sim, start_sim

from spark_ops.bench import gate

CASES = Path(__file__).parent / "fixtures" / "rollout"
NAMES = ("east", "west", "north")


@dataclass
class Fleet3:
    """Three running embedded clusters, the fleet file naming them, the CLI's environment."""

    sims: dict[str, Sim]
    root: Path
    env: dict[str, str]

    def journal(self) -> dict | None:
        """The one rollout journal in the journal directory (None before it is written)."""
        found = sorted((self.root / "journal").glob("rollout-*.json"))
        return json.loads(found[-1].read_text()) if found else None

    def files(self) -> dict[str, tuple[bytes, bytes, bytes]]:
        """Each cluster's history, recipe and engine pid file, as bytes."""
        pid = Path(".local/state/spark-watchdog/engine.pid")
        return {
            n: (s.history.read_bytes(), s.recipe.read_bytes(), (s.head / pid).read_bytes())
            for n, s in self.sims.items()
        }


@pytest.fixture(scope="module")
def fleet3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet3]:
    """Three embedded clusters side by side; west regresses at max_num_seqs 8."""
    from spark_ops.sim.control import down, wait_serving

    root = tmp_path_factory.mktemp("rollout")
    sims: dict[str, Sim] = {}
    try:
        for name in NAMES:
            fault = "slow_decode" if name == "west" else None
            sims[name] = start_sim(root / name, nodes=2, executor="mp", fault=fault)
        for s in sims.values():
            wait_serving(s.state)
        lines = [f"  - {{name: {n}, inventory: {n}/inventory.yaml}}" for n in NAMES]
        (root / "fleet.yaml").write_text("clusters:\n" + "\n".join(lines) + "\n")
        env = {k: v for k, v in os.environ.items() if not k.startswith("SPARK_OPS_")}
        env["SPARK_OPS_FLEET"] = str(root / "fleet.yaml")
        env["SPARK_OPS_ROLLOUT_DIR"] = str(root / "journal")
        yield Fleet3(sims, root, env)
    finally:
        for s in sims.values():
            down(s.root)


def _case(name: str) -> dict:
    """A case of tests/fixtures/rollout/."""
    return yaml.safe_load((CASES / f"{name}.yaml").read_text())


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """The real CLI."""
    return subprocess.run(
        [sys.executable, "-m", "spark_ops.cli.main", *args],
        env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip


def _said(done: subprocess.CompletedProcess[str]) -> str:
    """What a run printed, for a failure's message: each cluster's state and reason, and stderr."""
    try:
        clusters = json.loads(done.stdout)["rollout"]["clusters"]
        said = [f"{c['name']}: {c['state']} ({c.get('reason')})" for c in clusters]
    except (ValueError, KeyError, TypeError):
        said = [done.stdout[-2000:]]
    return "\n".join(said) + "\n" + done.stderr[-3000:]


def _recipe_ok(want: str, before: bytes, after: bytes) -> bool:
    """The recipe as the case says: unchanged (byte for byte), or holding a line."""
    return after == before if want == "unchanged" else want in after.decode()


def test_the_limits_help_states_are_the_gates_own() -> None:
    """`--max-*` defaults in the help are bench/gate.py's defaults."""
    from spark_ops.cli.apply import apply_cmd

    out = " ".join(CliRunner().invoke(apply_cmd, ["--help"], terminal_width=200).output.split())
    for flag, value in (
        ("--max-tps-drop", gate.DEFAULT_MAX_TOK_S_DROP_PCT),
        ("--max-ttft-rise", gate.DEFAULT_MAX_TTFT_P95_RISE_PCT),
        ("--max-tpot-rise", gate.DEFAULT_MAX_TPOT_P95_RISE_PCT),
        ("--max-errors", gate.DEFAULT_MAX_ERRORS),
    ):
        assert f"default: {value};" in out.split(f"{flag} ", 1)[1].split(" --", 1)[0], flag


def test_apply_prove_plans_its_measurements(fleet3: Fleet3) -> None:
    """apply --prove --dry-run: measure-before ahead of the write, measure-after behind the
    checks, in the plan shown and its JSON; nothing changes."""
    before = fleet3.files()
    args = ["--cluster", "north", "apply", "--max-num-seqs", "8", "--prove", "--dry-run"]
    done = _cli(fleet3.env, *args, "--json")
    assert done.returncode == 0, done.stderr
    steps = [s["name"] for s in json.loads(done.stdout)["plan"]["steps"]]
    assert steps.index("measure-before") < steps.index("write")
    assert steps.index("verify") < steps.index("measure-after") < steps.index("budget")
    assert fleet3.files() == before


def test_a_regression_stops_the_rollout(fleet3: Fleet3) -> None:
    """The canary kept, west rolled back with its numbers shown, north not reached; every
    history byte for byte as before (the planned stamps pruned)."""
    case = _case("regression")
    before = fleet3.files()
    done = _cli(fleet3.env, *case["args"])
    assert done.returncode == case["exit"], _said(done)
    after = fleet3.files()
    for name in NAMES:
        assert after[name][0] == before[name][0], f"{name}: its restart history changed"
        assert _recipe_ok(case["recipe"][name], before[name][1], after[name][1]), name
        assert (after[name][2] != before[name][2]) == case["restarted"][name], name
    journal = fleet3.journal()
    assert journal is not None and journal["finished"]
    states = {c["name"]: c["state"] for c in journal["clusters"]}
    assert states == case["states"]
    west = next(c for c in journal["clusters"] if c["name"] == "west")
    verdict = west["proof"]["verdict"]
    assert not verdict["ok"] and any(c["metric"] == "tpot_p95_ms" and not c["ok"]
                                     for c in verdict["checks"])  # fmt: skip
    for name, shown in case["shown"].items():
        assert f"{name} (" in done.stdout and f": {shown}:" in done.stdout, name
    report = done.stdout.split("west (next)", 1)[1].split("north (next)", 1)[0]
    assert "TPOT p95 ms" in report and "FAIL" in report  # the numbers, side by side


def test_a_killed_rollout_resumes_and_converges(fleet3: Fleet3) -> None:
    """SIGKILL once the second cluster's restart is in its history (its measurement before the
    change journalled, the one after not taken). Resumed without the saved measurement, the change
    found in place is left unproven (never kept) and the rollout stops, saying what to run;
    resumed with it, the change is proven against it and the rollout converges, the canary not
    redone; every history as before but for a restart the watchdog journalled as its own."""
    case = _case("resume")
    for p in (fleet3.root / "journal").glob("rollout-*.json"):
        p.unlink()
    before = fleet3.files()
    started = time.time()
    victim = fleet3.sims[case["kill_after"]].history
    proc = subprocess.Popen(
        [sys.executable, "-m", "spark_ops.cli.main", *case["args"]], env=fleet3.env,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        while proc.poll() is None:  # read the cluster's history, never a clock
            if victim.read_bytes() != before[case["kill_after"]][0]:
                break
            time.sleep(0.2)
        assert proc.poll() is None, "the rollout ended before it could be killed"
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait()
    canary_pid = fleet3.files()[case["canary"]][2]
    journal = fleet3.journal()
    assert journal is not None and not journal["finished"]
    step = next(c for c in journal["clusters"] if c["name"] == case["kill_after"])
    assert step["state"] == "running" and set(step["proof"]) == {"proving", "before"}
    path = next((fleet3.root / "journal").glob("rollout-*.json"))
    saved, step["proof"] = step["proof"], None
    path.write_text(json.dumps(journal))
    done = _cli(fleet3.env, "rollout", "--resume", "--yes", "--json")
    assert done.returncode == case["unproven"]["exit"], _said(done)
    result = json.loads(done.stdout)["rollout"]
    got = {c["name"]: (c["state"], c["reason"]) for c in result["clusters"]}
    assert {n: s for n, (s, _) in got.items()} == case["unproven"]["states"], got
    reason = next(c["reason"] for c in result["clusters"] if c["name"] == case["kill_after"])
    assert f"--cluster {case['kill_after']} rollback" in reason
    journal = fleet3.journal()
    assert journal is not None and not journal["finished"]
    next(c for c in journal["clusters"] if c["name"] == case["kill_after"])["proof"] = saved
    path.write_text(json.dumps(journal))
    done = _cli(fleet3.env, "rollout", "--resume", "--yes", "--json")
    assert done.returncode == case["exit"], _said(done)
    result = json.loads(done.stdout)["rollout"]
    got = {c["name"]: (c["state"], c["reason"]) for c in result["clusters"]}
    assert {n: s for n, (s, _) in got.items()} == case["states"], got
    proof = next(c["proof"] for c in result["clusters"] if c["name"] == case["kill_after"])
    assert proof["before"] == saved["before"] and proof["verdict"]["ok"]
    after = fleet3.files()
    assert after[case["canary"]][2] == canary_pid  # the canary was not redone
    for name in NAMES:  # the planned stamps pruned; a restart the watchdog made itself kept
        kept = before[name][0].decode().split() + _own_restarts(fleet3.sims[name], started)
        assert sorted(after[name][0].decode().split()) == sorted(kept), f"{name}: its history"
        assert _recipe_ok(case["recipe"][name], before[name][1], after[name][1]), name


def _own_restarts(sim: Sim, since: float) -> list[str]:
    """The stamps of the restarts the watchdog journalled as its own since a time: a restart the
    SIGKILL tore (the embedded server ends a dropped session's processes, the new engine too)
    leaves the engine down, and once the dead run's lease has ended the watchdog restarts it."""
    journal = sim.history.with_name("restarts.journal.jsonl")
    lines = journal.read_text().splitlines() if journal.exists() else []
    records = [json.loads(li) for li in lines if li.strip()]
    return [
        str(r["stamp"])
        for r in records
        if r.get("by") == "watchdog" and r.get("action") == "restart" and r["time"] >= since
    ]


RULES = yaml.safe_load((CASES / "rules.yaml").read_text())


@pytest.mark.parametrize("case", RULES, ids=[c["name"] for c in RULES])
def test_the_rollouts_rules(case: dict, tmp_path: Path) -> None:
    """batches, exit and the shown state of a rollout as its journal holds it; the journal
    written and read back whole, each proof as its JSON (an unfinished one found by its fleet)."""
    from spark_ops.workflows.prove import Proof
    from spark_ops.workflows.rollout import (
        ClusterStep,
        Rollout,
        RolloutJournal,
        batches,
        exit_of,
        shown_state,
    )

    proofs = case.get("proofs", {})
    steps = [
        ClusterStep(
            n,
            "canary" if i == 0 else "next",
            state=s,
            exit=case.get("exits", {}).get(n),
            proof=Proof.from_dict(proofs[n]) if n in proofs else None,
        )
        for i, (n, s) in enumerate(case["states"].items())
    ]
    ro = Rollout("k", "fleet.yaml", "spark-ops rollout", {}, case["parallel"], steps,
                 stopped=case.get("stopped", ""),
                 finished=case.get("finished", bool(case.get("stopped"))))  # fmt: skip
    assert batches(ro) == case["batches"]
    assert exit_of(ro) == case["exit"]
    assert {c.name: shown_state(c, ro) for c in ro.clusters} == case["shown"]
    journal = RolloutJournal(tmp_path)
    journal.save(ro)
    assert journal.load("k") == ro
    for name, proof in proofs.items():
        assert ro.step(name).to_dict()["proof"] == proof, name
    assert (journal.unfinished("fleet.yaml") is None) == ro.finished
