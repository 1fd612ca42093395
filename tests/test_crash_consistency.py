"""Crash consistency in CI: every step boundary of apply SIGKILLed once, and a fixed-seed sample.

The harness (tests/crash/harness.py) runs the CLI as a black box on one embedded cluster shared by
the module: it interrupts the command at the kill point, runs the same command again with --yes
and checks (a) the recipe copies are old or new, whole, agreeing; (b) the engine runs what the
recipe says; (c) the history holds exactly the watchdog's own entries; (d) every changing run has
an audit record; (e) every lock is free; (f) no lease of spark-ops' outlives the re-run, none
left by the kill is without a bounded expiry, an operator's pause is kept — plus the operator's
own file beside the recipe untouched and no staged file left. The full sweep (200+ points, every
command and signal) is benchmarks/crash_sweep.py. SPARK_OPS_CRASH_RECORD=FILE appends one JSON
line per case.

Every case failed before issue 20's fixes (items 1-3, SIGTERM): the records of that run are in
docs/reliability.md. A case that regresses fails here with the checks that did not hold.
"""

from __future__ import annotations

import json
import os

import pytest
from crash.harness import (
    BOUNDARIES,
    CaseResult,
    CrashCluster,
    KillPoint,
    random_points,
    restart_command_points,
    run_case,
    write_record,
)

from spark_ops.watchdog.lease import parse_lease

pytestmark = pytest.mark.slow

SEED = 20

# every case held once the run journal, convergence by state and the atomic units landed; a case
# that fails again on a future change gets an xfail(strict) reason here, naming its issue item
APPLY_XFAIL: dict[str, str] = {}

# the lease's boundaries of restart and rollback: before the lease, after it, inside the boot
# (rollback's is in SAMPLE), after its release
LEASE_POINTS: list[tuple[str, KillPoint]] = [
    ("restart", KillPoint("lease:running")),
    ("restart", KillPoint("lease:done")),
    ("restart", KillPoint("boot:running", delay=0.5)),
    ("restart", KillPoint("release:done")),
    ("rollback", KillPoint("lease:running")),
    ("rollback", KillPoint("lease:done")),
    ("rollback", KillPoint("release:done")),
]

SAMPLE: list[tuple[str, KillPoint, str | None]] = [
    ("apply", KillPoint("boot:running", signal="INT"), None),
    ("apply", KillPoint("restart:running", delay=0.4, signal="TERM"), None),
    ("apply", restart_command_points(1, SEED)[0], None),
    ("rollback", KillPoint("boot:running"), None),
    ("prune-planned", random_points("prune-planned", 1, SEED, max_delay=0.5)[0], None),
]


def _check(c: CrashCluster, command: str, point: KillPoint) -> CaseResult:
    """Run one case and fail naming every check that did not hold and the state left."""
    result = run_case(c, command, point)
    write_record(os.environ.get("SPARK_OPS_CRASH_RECORD"), result)
    assert result.fired, f"the kill point {point.label} was never reached: {result.state}"
    if command == "apply" and point == KillPoint(*BOUNDARIES["apply"][-1]):
        seen = [(b, 1) for b in result.state["boundaries_seen"] if b != "lock:done"]
        assert seen == BOUNDARIES["apply"], "the kill points are the boundaries apply prints"
    assert result.ok, (
        f"{command} {point.label}: killed exit {result.killed_exit}, re-run exit "
        f"{result.rerun_exit}; failed: {[k for k, v in result.checks.items() if not v]}\n"
        + "\n".join(result.problems)
        + f"\nstate: {result.state}\nre-run printed:\n{result.rerun_lines[-1500:]}"
    )
    return result


def _marked(command: str, point: KillPoint, reason: str | None) -> object:
    """A pytest param for a case, xfail(strict) when it fails today."""
    marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
    return pytest.param(command, point, marks=marks, id=f"{command}-{point.label}")


APPLY_CASES = [
    _marked("apply", KillPoint(b, k), APPLY_XFAIL.get(b)) for b, k in BOUNDARIES["apply"]
]


@pytest.mark.parametrize(("command", "point"), APPLY_CASES)
def test_apply_sigkilled_at_each_step_boundary(
    crash_cluster: CrashCluster, command: str, point: KillPoint
) -> None:
    """apply SIGKILLed when each step starts and ends, then re-run: the cluster converges."""
    _check(crash_cluster, command, point)


def test_staged_files_of_a_run_killed_before_its_renames_are_removed(
    crash_cluster: CrashCluster,
) -> None:
    """apply SIGKILLed once every node staged its write and none renamed: the re-run's settle step
    removes that run's staged files (their names carry its run id) and converges; a staged file
    of another run (a colleague's, its id not a dead run's) is left as it is."""
    others = [p.parent / f".{p.name}.spark-ops.20200101T000000-abcdef.000001" for p in
              crash_cluster.recipe_copies]  # fmt: skip
    for p in others:
        p.write_text("another run's staged file\n")
    try:
        result = _check(crash_cluster, "apply", KillPoint("write:running", target="staged"))
        killed, rerun = result.state["caps_after_kill"], result.state["caps_after_rerun"]
        assert all(k != r for k, r in zip(killed, rerun, strict=True)), "none renamed by the kill"
        said = json.dumps(crash_cluster.audit()[-3:])  # the re-run's settle step, as recorded
        assert "removed the staged file(s) a dead run left" in said, said
        assert all(p.read_text() == "another run's staged file\n" for p in others)
    finally:
        for p in others:
            p.unlink(missing_ok=True)


# the boundaries where a pause file is read or written (the lease taken, the boot it covers, its
# release) and one before: the others touch no pause (CI's time; every apply boundary held once,
# docs/reliability.md)
PAUSE_POINTS = {"write:done", "lease:running", "lease:done", "boot:running", "release:running",
                "release:done"}  # fmt: skip
PAUSE_CASES = [
    _marked("apply", KillPoint(b, k), APPLY_XFAIL.get(b))
    for b, k in BOUNDARIES["apply"]
    if b in PAUSE_POINTS
]


@pytest.mark.parametrize(("command", "point"), PAUSE_CASES)
def test_an_operators_pause_is_never_removed(
    crash_cluster: CrashCluster, command: str, point: KillPoint
) -> None:
    """An operator paused the watchdog before apply: the run keeps the pause (reported), is
    SIGKILLed at each boundary around the lease, re-run: the pause is there as it was, and the run
    converged."""
    said = "paused by alice: switch maintenance\n"
    crash_cluster.pause.write_text(said)
    try:
        result = _check(crash_cluster, command, point)
        # (f) compared it before the harness's repair removed it: as it was after kill and re-run
        assert result.state["pause_after_kill"] == said == result.state["pause_after_rerun"]
    finally:
        crash_cluster.pause.unlink(missing_ok=True)


@pytest.mark.parametrize(
    ("command", "point"), [pytest.param(c, p, id=f"{c}-{p.label}") for c, p in LEASE_POINTS]
)
def test_restart_and_rollback_killed_around_their_lease(
    crash_cluster: CrashCluster, command: str, point: KillPoint
) -> None:
    """restart and rollback SIGKILLed before the lease, after it, in the boot, after the release:
    a lease the kill left is bounded and the re-run's settle step ends it; the run converges."""
    result = _check(crash_cluster, command, point)
    if point.boundary == "lease:done":  # the kill left our lease, bounded; the re-run ended it
        assert result.state["pause_after_kill"] is not None, result.state
        assert result.state["pause_after_rerun"] is None, result.state


def test_an_experiment_killed_inside_its_leased_level(crash_cluster: CrashCluster) -> None:
    """experiment at cap 6, --concurrency 1,64, the watchdog's probe timeout 2 s: level 64 queues
    the probe 10 rounds and runs under a lease; SIGKILL inside it. The lease left is bounded, the
    re-run (--resume, as the tool's hint says) ends it in its settle step and takes its own for
    the level, the run converges, and nothing of spark-ops' is left paused."""
    c = crash_cluster
    timeout = c.probe_timeout()
    c.set_probe_timeout(2.0)
    try:
        result = _check(c, "experiment-leased-level", KillPoint("lease-C64:done", delay=0.5))
    finally:
        c.set_probe_timeout(timeout)
    left = parse_lease(result.state["pause_after_kill"] or "")
    assert left is not None and "concurrency 64 at max_num_seqs 6" in left.why, result.state
    assert result.state["pause_after_rerun"] is None, result.state  # its settle step ended it


@pytest.mark.parametrize(("command", "point"), [_marked(cmd, p, why) for cmd, p, why in SAMPLE])
def test_sample_of_signals_and_commands(
    crash_cluster: CrashCluster, command: str, point: KillPoint
) -> None:
    """SIGINT, SIGTERM, the restart command killed, restart, rollback, prune: a fixed sample."""
    _check(crash_cluster, command, point)
