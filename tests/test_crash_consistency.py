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

import os
from collections.abc import Iterator

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

pytestmark = pytest.mark.slow

SEED = 20

# every case held once the run journal, convergence by state and the atomic units landed; a case
# that fails again on a future change gets an xfail(strict) reason here, naming its issue item
APPLY_XFAIL: dict[str, str] = {}

SAMPLE: list[tuple[str, KillPoint, str | None]] = [
    ("apply", KillPoint("boot:running", signal="INT"), None),
    ("apply", KillPoint("restart:running", delay=0.4, signal="TERM"), None),
    ("apply", restart_command_points(1, SEED)[0], None),
    ("rollback", KillPoint("boot:running"), None),
    ("prune-planned", random_points("prune-planned", 1, SEED, max_delay=0.5)[0], None),
]


@pytest.fixture(scope="module")
def crash_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CrashCluster]:
    """One embedded cluster (2 nodes, the recipe on both) for every case of the module."""
    c = CrashCluster(tmp_path_factory.mktemp("crash"))
    try:
        yield c
    finally:
        c.close()


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


def test_an_operators_pause_is_never_removed(crash_cluster: CrashCluster) -> None:
    """An operator paused the watchdog before apply: the run keeps the pause (reported), is
    SIGKILLed at its boot, re-run: the pause is there as it was, and the run converged."""
    said = "paused by alice: switch maintenance\n"
    crash_cluster.pause.write_text(said)
    try:
        result = _check(crash_cluster, "apply", KillPoint("boot:running"))
        # (f) compared it before the harness's repair removed it: as it was after kill and re-run
        assert result.state["pause_after_kill"] == said == result.state["pause_after_rerun"]
    finally:
        crash_cluster.pause.unlink(missing_ok=True)


@pytest.mark.parametrize(("command", "point"), [_marked(cmd, p, why) for cmd, p, why in SAMPLE])
def test_sample_of_signals_and_commands(
    crash_cluster: CrashCluster, command: str, point: KillPoint
) -> None:
    """SIGINT, SIGTERM, the restart command killed, restart, rollback, prune: a fixed sample."""
    _check(crash_cluster, command, point)
