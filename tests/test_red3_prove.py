"""The red team of 2026-12-05, round 3 (apply --prove, rollout, its journal): the cases fixed.

Each test failed before its fix (docs/reliability.md, "The red team of 2026-12-05, round 3").
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from spark_ops.bench.gate import LoadPoint, Thresholds
from spark_ops.errors import BenchError
from spark_ops.workflows.operation import ApplyOptions
from spark_ops.workflows.prove import Proving

INVENTORY = """\
clusters:
  c:
    nodes:
      node1: {host: 127.0.0.1, port: 22, role: head}
    recipe: {path: ~/recipe.yaml, nodes: [node1]}
    watchdog:
      restart_command: spark-watchdog --restart-now
      history_file: ~/restarts
      pause_file: ~/pause
      budget: {max_restarts: 2, window_s: 21600}
      probe: {interval_s: 5, timeout_s: 10, failures: 3}
    engine:
      api: {url: "http://127.0.0.1:8000"}
      boot_deadline_s: 300
"""


def _cluster(tmp_path: Path):  # type: ignore[no-untyped-def]
    from spark_ops.inventory import load_inventory

    inv = tmp_path / "inventory.yaml"
    inv.write_text(INVENTORY)
    return load_inventory(inv).cluster()


def _proving(**point: object) -> Proving:
    return Proving(LoadPoint(**point), Thresholds())  # type: ignore[arg-type]


def test_case1_a_prove_rate_whose_arrivals_never_end_is_refused() -> None:
    """`--prove-rate 1e-9`: 32 arrivals spread over 32e9 s; planned, and measure-before would
    hold the cluster lock (and its lease) for ever. Refused while validating, naming the span."""
    with pytest.raises(BenchError, match="arrivals alone last 32,000,000,000 s"):
        _proving(request_rate=1e-9, requests=32, output_tokens=64).validate()
    _proving(request_rate=0.5, requests=32, output_tokens=64).validate()  # 64 s: fine


def test_case2_the_measurements_lease_covers_every_request(tmp_path: Path) -> None:
    """measure-before at concurrency 8 over cap 6, 4000 requests: the lease was one round's
    (160 s) for a measurement of ~530 s on the embedded cluster; it lapsed with the load on.
    Its guard now counts the rounds of every request (and an open loop's arrival span)."""
    from spark_ops.workflows.loadguard import LoadGuard
    from spark_ops.workflows.probe_load import ProbeWait

    cluster = _cluster(tmp_path)
    wait = ProbeWait(8, 6, None, "nothing measured before it", 10.0)
    one_round = LoadGuard(None, cluster.watchdog.probe, 6, 1).seconds(wait)
    every = LoadGuard(None, cluster.watchdog.probe, 6, 500).seconds(wait)  # 4000 / 8
    assert one_round == 160 and every >= 4000 / 6 * 10
    spanned = LoadGuard(None, cluster.watchdog.probe, 6, 1).seconds(wait, 1800)
    assert spanned == one_round + 1800


def test_case3_the_restarts_lease_covers_measure_after_and_the_rollback(tmp_path: Path) -> None:
    """apply --prove runs measure-after, and on a regression a rollback's boot, inside the
    restart's lease, which counted only the drain, one boot and a margin (720 s)."""
    from spark_ops.workflows.disruption import lease_description, restart_lease_seconds

    cluster = _cluster(tmp_path)
    plain = ApplyOptions(changes=[])
    assert restart_lease_seconds(cluster, plain) == 720  # as before
    proving = _proving(concurrency=4, requests=300, output_tokens=64)
    proved = ApplyOptions(changes=[], prove=proving)
    # two boots (the rollback's) + 300/4 rounds at twice the probe's 10 s timeout
    assert restart_lease_seconds(cluster, proved) == 120 + 2 * 300 + 75 * 10 * 2 + 300
    assert "the measurement after the change, a rollback's boot" in lease_description(
        cluster, proved
    )


ROLLOUT = {
    "key": "k", "fleet": "fleet.yaml", "command": "c", "args": {}, "parallel": 1,
    "started": 1.0, "stopped": "", "finished": False,
    "clusters": [{"name": "east", "role": "canary", "state": "running"}],
}  # fmt: skip


@pytest.mark.parametrize(
    "text",
    ['{"key": "abc", "fleet": ', "[1]", json.dumps({**ROLLOUT, "started": "soon"}),
     json.dumps({k: v for k, v in ROLLOUT.items() if k != "clusters"}), "null"],
    ids=["truncated", "a-list", "started-as-text", "no-clusters", "null"],
)  # fmt: skip
def test_case4_a_journal_truncated_or_hand_edited_is_named(text: str, tmp_path: Path) -> None:
    """`rollout --resume` (and the same command) over a journal cut short or edited: a
    JSONDecodeError / ValueError / KeyError traceback, exit 1. Now a RolloutError naming the
    file; an unreadable journal of another rollout does not hide this fleet's own."""
    from spark_ops.workflows.rollout import Rollout, RolloutError, RolloutJournal

    journal = RolloutJournal(tmp_path)
    bad = tmp_path / "rollout-0000000000000000.json"
    bad.write_text(text)
    with pytest.raises(RolloutError, match="not a rollout journal") as got:
        journal.load("0000000000000000")
    assert str(bad) in got.value.message
    with pytest.raises(RolloutError, match=r"unreadable: .*rollout-0000000000000000\.json"):
        journal.unfinished("fleet.yaml")
    journal.save(Rollout.from_dict(ROLLOUT))
    found = journal.unfinished("fleet.yaml")
    assert found is not None and found.key == "k"


def test_case5_a_dead_prove_run_finished_by_a_rerun_is_said_unproven() -> None:
    """apply --prove SIGKILLed inside measure-after, then the same command again: it finished
    the dead run and said `Done`, exit 0, the change in place and never proven. The plan now
    warns that it is not proven and what to run."""
    from spark_ops.workflows.converge import unproven_change
    from spark_ops.workflows.journal import Run

    intent = {"what": {"operation": "apply", "args": {"max_num_seqs": 8, "prove": {"point": {}}}}}
    steps = [
        {"step": "measure-before", "status": "done"},
        {"step": "write", "status": "done", "written": ["node1:~/recipe.yaml"]},
        {"step": "verify", "status": "done"},
        {"step": "measure-after", "status": "running"},
    ]
    said = unproven_change(Run("r1", intent, steps))
    assert "NOT proven" in said and "rollback" in said
    assert unproven_change(Run("r1", intent, [*steps, {"step": "measure-after",
                                                        "status": "done"}])) == ""  # fmt: skip
    assert unproven_change(Run("r1", intent, steps[:1])) == ""  # nothing written
    plain = {"what": {"operation": "apply", "args": {"max_num_seqs": 8}}}
    assert unproven_change(Run("r1", plain, steps)) == ""  # not a proof run


def test_case6_a_second_rollout_of_the_fleet_at_once_is_refused(tmp_path: Path) -> None:
    """A second `rollout` of the same fleet while the first ran: it took the first's journal as
    its own ("(resumed)"), failed on the canary's cluster lock and wrote the journal finished;
    the first SIGKILLed after that, `rollout --resume` found nothing and the same command
    started a new rollout (the canary's change in place, never proven). Now the second is
    refused while the first holds the fleet's lock (a flock: freed however the first dies)."""
    import subprocess
    import sys

    from spark_ops.workflows.rollout import RolloutError, RolloutJournal

    fleet = tmp_path / "fleet.yaml"
    fleet.write_text("clusters: []\n")
    journal = RolloutJournal(tmp_path / "j")
    holder = (
        "import sys, time; from spark_ops.workflows.rollout import RolloutJournal as J\n"
        f"with J(__import__('pathlib').Path({str(tmp_path / 'j')!r})).held({str(fleet)!r}):\n"
        "    print('held', flush=True); time.sleep(30)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", holder], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
        refused = f"running on this machine already \\(pid {proc.pid}"
        with pytest.raises(RolloutError, match=refused), journal.held(str(fleet)):
            pass
        with journal.held(str(tmp_path / "other.yaml")):  # another fleet: its own lock
            pass
    finally:
        proc.kill()
        proc.wait()
    with journal.held(str(fleet)):  # its holder killed: free
        pass


@pytest.mark.parametrize(
    ("edit", "refused"),
    [
        ({"prove_requests": "many"}, "option prove_requests = 'many'"),
        ({"parallel": -5}, "option parallel = -5"),
        ({"max_num_seqs": "$(touch /tmp/x)"}, None),  # the knob's own validation refuses it
        ({"over_budget": True}, "option over_budget is set"),
        ({"max_tps_drop": -1}, "option max_tps_drop = -1"),
    ],
    ids=["requests-as-text", "parallel-negative", "knob-hostile", "over-budget", "limit-negative"],
)  # fmt: skip
def test_case7_a_hand_edited_journals_options_are_checked_as_typed(
    edit: dict, refused: str | None, tmp_path: Path
) -> None:
    """`rollout --resume` ran the journal's options as they were: `prove_requests: "many"` a
    TypeError traceback; `over_budget: true` was never refused (the CLI checked the command
    line's, before the journal's replaced them), so a cluster the journal held running was
    applied past its budget. Each option is now checked by its own type and range."""
    from spark_ops.cli.rollout import _args, _journal_args, rollout_cmd
    from spark_ops.workflows.rollout import Rollout, RolloutError

    ctx = rollout_cmd.make_context("rollout", ["--max-num-seqs", "8", "--set", "a=1"])
    args = json.loads(json.dumps(_args(ctx.params)))  # as the journal holds them
    path = tmp_path / "rollout-k.json"
    ro = Rollout("k", "fleet.yaml", "c", args, 1, [])
    got = _journal_args(ctx, ro, path)
    assert got["max_num_seqs"] == "8" and got["sets"] == ("a=1",) and got["prove_requests"] == 32
    ro.args = {**args, **edit}
    if refused is None:
        _journal_args(ctx, ro, path)  # passes here; apply_options_of refuses the value
        from spark_ops.cli.apply_options import apply_options_of
        from spark_ops.errors import KnobError

        with pytest.raises(KnobError, match="is not allowed"):
            apply_options_of({**ctx.params, **_journal_args(ctx, ro, path), "prove": True})
        return
    with pytest.raises(RolloutError, match=refused.replace("(", r"\(").replace("$", r"\$")) as e:
        _journal_args(ctx, ro, path)
    assert str(path) in e.value.message


@pytest.mark.parametrize("failure", ["regressed", "boot"])
def test_case8_a_run_interrupted_inside_its_rollback_says_the_previous_recipe(
    failure: str,
) -> None:
    """apply --prove's gate failed, the rollback restored the previous recipe and SIGTERM came
    inside `restart-rollback`: the report said `recipe: the new content … engine: the new
    engine serves (its boot was followed to the end)`, `next: run the same command again` (it
    would make the regressed change again). It now says the previous recipe, the rollback's
    restart not followed, and why it was rolled back; the same for a failed boot's rollback."""
    from spark_ops.errors import BootError
    from spark_ops.workflows.operation import Outcome
    from spark_ops.workflows.plan import FileChange, Plan, Step, StepKind, StepRun
    from spark_ops.workflows.prove import Regressed
    from spark_ops.workflows.standing import standing

    kinds = [StepKind.WRITE, StepKind.RESTART, StepKind.BOOT, StepKind.PRUNE, StepKind.VERIFY]
    plan = Plan("apply", "c", [FileChange("node1", "~/r.yaml", "x", "", "new")],
                [Step(k, k.value, ("node1",)) for k in kinds])  # fmt: skip
    out = Outcome(plan, ok=False, pruned=[1.0, 2.0])
    for s in out.steps:
        s.status = "done"
    out.error = Regressed("regressed") if failure == "regressed" else BootError("no boot")
    restarted = {StepKind.ROLLBACK: "done", StepKind.RESTART_ROLLBACK: "failed"}
    for kind, status in restarted.items():
        out.steps.append(StepRun(Step(kind, kind.value, ("node1",)), status))
    lines = standing(plan, out, "spark-ops apply --max-num-seqs 16 --prove")
    said = "\n".join(lines)
    assert "the previous content restored on node1" in lines[0], said
    assert "a restart with the previous recipe was triggered" in lines[1], said
    why = "gate failed" if failure == "regressed" else "failed to boot"
    assert why in lines[-1] and "would make the change again" in lines[-1], said
    assert "new engine serves" not in said and "new content" not in said
    out.steps[-1].status = "pending"  # interrupted before the rollback's restart
    assert "the engine of the change still runs" in standing(plan, out, "c")[1]


def test_case6b_the_rollout_lock_never_follows_a_symlink(tmp_path: Path) -> None:
    """The fleet's lock file replaced by a symlink to an operator's file: refused naming it, the
    operator's file untouched."""
    import hashlib

    from spark_ops.workflows.rollout import RolloutError, RolloutJournal

    fleet = tmp_path / "fleet.yaml"
    theirs = tmp_path / "operator.txt"
    theirs.write_text("operator data\n")
    (tmp_path / "j").mkdir()
    digest = hashlib.sha256(str(fleet.resolve()).encode()).hexdigest()[:16]
    (tmp_path / "j" / f"fleet-{digest}.lock").symlink_to(theirs)
    journal = RolloutJournal(tmp_path / "j")
    with (
        pytest.raises(RolloutError, match="rollout lock cannot be opened"),
        journal.held(str(fleet)),
    ):
        pass
    assert theirs.read_text() == "operator data\n"
