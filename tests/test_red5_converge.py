"""The red team of 2026-12-05, round 5: a dead run's restart followed, not restarted again
(converge.boot_of_dead_run, booting.before_checks), and the rollback that finishes a dead
apply --prove (docs/reliability.md, "The red team of 2026-12-05, round 5")."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from spark_ops.cli.apply import _echo_outcome
from spark_ops.errors import WatchdogError
from spark_ops.workflows import booting, converge, postboot
from spark_ops.workflows.plan import FileChange, OperationKind, Plan, StepKind

GRACE_END = 10_000.0  # the dead run's restart command + STAMP_GRACE_S, head clock


class Head:
    """A head whose clock, engine and boot the test drives: the clock moves only by sleeps."""

    def __init__(self, at: float, *, starts_at: float | None = None) -> None:
        """The head clock at `at`; the engine answers from `starts_at` on (None: never)."""
        self.at, self.starts_at, self.sleeps = at, starts_at, 0
        self.said: list[str] = []

    async def clock(self) -> float:
        """The head's clock."""
        return self.at

    async def sleep(self, seconds: float) -> None:
        """A poll's sleep: the head's clock moves on."""
        self.sleeps += 1
        self.at += seconds

    def monotonic(self) -> float:
        """The local clock, moved by the same sleeps."""
        return self.at

    async def answers(self, op: Any) -> bool:
        """Whether the engine answers now."""
        return self.starts_at is not None and self.at >= self.starts_at

    def warning(self, text: str, **fields: Any) -> None:
        """A log line."""
        self.said.append(text)


def _dead_run(restarted: bool = True) -> SimpleNamespace:
    """A dead run R1 whose restart command opened a window (none: killed before its record)."""
    return SimpleNamespace(run="R1", last_grace_end=GRACE_END if restarted else None)


def _op(head: Head) -> SimpleNamespace:
    """An operation on that head."""
    return SimpleNamespace(watchdog=SimpleNamespace(clock=head.clock), log=head)


async def _none(*args: Any, **kwargs: Any) -> None:
    """Nothing (no boot under way, no wait)."""
    return None


@pytest.fixture
def drive(monkeypatch: pytest.MonkeyPatch) -> Any:
    """before_checks of a re-run owing R1's checks, on a head the test describes."""

    async def run(head: Head, restarted: bool = True, boot_wait_s: float | None = None) -> Head:
        """Run before_checks; the head after."""

        async def owed(op: Any) -> SimpleNamespace:
            return _dead_run(restarted)

        monkeypatch.setattr(booting, "engine_answers", head.answers)
        monkeypatch.setattr(booting, "boot_under_way", _none)
        monkeypatch.setattr(booting, "wait_out_boot", _none)
        monkeypatch.setattr(booting, "checks_owed", owed, raising=False)
        monkeypatch.setattr(booting, "asyncio", SimpleNamespace(sleep=head.sleep))
        monkeypatch.setattr(booting, "time", SimpleNamespace(monotonic=head.monotonic))
        plan = SimpleNamespace(has=lambda kind: False, facts=SimpleNamespace(checks_owed="R1"))
        ex = SimpleNamespace(plan=plan, op=_op(head), opts=SimpleNamespace(boot_wait_s=boot_wait_s))
        await booting.before_checks(ex, StepKind.VERIFY)  # type: ignore[arg-type]
        return head

    return run


async def test_a_torn_restart_past_its_grace_is_not_waited_for(drive: Any) -> None:
    """Case 1: the dead run's restart stopped the engine and never started it (the restart
    command killed with spark-ops), and the re-run's checks begin 100 s after that grace ended:
    main waited another STAMP_GRACE_S (120 s, silent) for an engine nobody starts, then failed
    its checks. Now the wait ends with the grace, and the log says what the next run does."""
    head = await drive(Head(GRACE_END + 100.0))
    assert head.sleeps == 0, "waited past the dead run's grace"
    assert any("plans the restart" in s for s in head.said), head.said


async def test_the_wait_for_a_dead_runs_restart_ends_with_its_grace(drive: Any) -> None:
    """Case 2: checks begun 30 s before the grace ends wait those 30 s at most (head clock),
    said in the log from its start (main: 120 s from the step's start, nothing said)."""
    head = await drive(Head(GRACE_END - 30.0))
    assert head.at <= GRACE_END + booting.POLL_S, "waited past the dead run's grace"
    assert head.said and "waiting for the restart of run R1" in head.said[0], head.said


async def test_an_engine_started_during_the_wait_ends_it(drive: Any) -> None:
    """Case 3: the watchdog starts the engine 10 s into the wait: the checks follow at once,
    no warning that the restart is missing."""
    head = await drive(Head(GRACE_END - 60.0, starts_at=GRACE_END - 50.0))
    assert head.at < GRACE_END - 40.0
    assert not any("plans the restart" in s for s in head.said), head.said


@pytest.mark.parametrize("boot_wait", [0.0, 10.0])
async def test_boot_wait_bounds_the_wait_for_a_dead_runs_restart(
    drive: Any, boot_wait: float
) -> None:
    """Stop 41: `--boot-wait 0` ("no wait for a boot") waited up to the dead run's grace anyway
    (120 s); the wait now ends with `--boot-wait` when it is shorter, and the log says so."""
    head = await drive(Head(GRACE_END - 60.0), boot_wait_s=boot_wait)
    assert head.at <= GRACE_END - 60.0 + boot_wait + booting.POLL_S, "waited past --boot-wait"
    assert any(f"--boot-wait {boot_wait:g} s" in s and "plans the restart" in s for s in head.said)


ANSWERS = [
    # engine answers, instance runs, head clock, restart window, clock unreadable, followed
    pytest.param(True, False, GRACE_END - 60, True, False, False, id="old-engine-serves"),
    pytest.param(False, True, GRACE_END + 900, True, False, True, id="instance-boots"),
    pytest.param(False, False, GRACE_END - 60, True, False, True, id="within-grace"),
    pytest.param(False, False, GRACE_END + 1, True, False, False, id="past-grace"),
    pytest.param(False, False, GRACE_END - 60, False, False, False, id="no-window"),
    pytest.param(False, False, GRACE_END - 60, True, True, False, id="clock-unreadable"),
]


@pytest.mark.parametrize(("answers", "boots", "at", "window", "no_clock", "followed"), ANSWERS)
async def test_which_dead_restart_is_followed_rather_than_restarted(
    monkeypatch: pytest.MonkeyPatch,
    answers: bool,
    boots: bool,
    at: float,
    window: bool,
    no_clock: bool,
    followed: bool,
) -> None:
    """Case 4: a dead run killed before its restart command reached the watchdog (the old
    engine still serves, or no window recorded) is restarted; so is one past its grace, or when
    the head's clock cannot be read; a boot under way, or a restart within its grace, is not."""

    async def owed(op: Any) -> SimpleNamespace:
        return _dead_run(window)

    async def clock() -> float:
        if no_clock:
            raise WatchdogError("the head's clock cannot be read")
        return at

    async def fixed(value: bool) -> bool:
        return value

    monkeypatch.setattr(converge, "checks_owed", owed)
    monkeypatch.setattr(converge, "engine_answers", lambda op: fixed(answers))
    monkeypatch.setattr(converge, "_booting", lambda op: fixed(boots))
    op = SimpleNamespace(watchdog=SimpleNamespace(clock=clock))
    found = await converge.boot_of_dead_run(op)  # type: ignore[arg-type]
    assert (found is not None) == followed


def _prove_run() -> SimpleNamespace:
    """A dead apply --prove that wrote its change and never measured after it."""
    return SimpleNamespace(
        run="P1",
        operation="apply",
        last_step="restart",
        written=["head"],
        intent={"who": "alice", "what": {"args": {"prove": {"requests": 32}}}},
        step=lambda name: None,
        summary=lambda: {"run": "P1"},
    )


@pytest.mark.parametrize(
    ("operation", "changes", "unproven"),
    [
        pytest.param(OperationKind.ROLLBACK, True, None, id="rollback-replaces-it"),
        pytest.param(OperationKind.APPLY, False, ["P1"], id="apply-finishes-it"),
        pytest.param(OperationKind.RESTART, False, ["P1"], id="restart-finishes-it"),
        pytest.param(OperationKind.ROLLBACK, False, ["P1"], id="rollback-to-the-same-text"),
    ],
)
async def test_the_rollback_the_warning_advises_is_not_exit_11(
    monkeypatch: pytest.MonkeyPatch, operation: OperationKind, changes: bool, unproven: Any
) -> None:
    """Case 5: a dead apply --prove's warning says "to prove it, `spark-ops rollback`"; that
    rollback, which restores the recipe before the unproven change, was marked as finishing it
    unproven (facts.unproven) and so exited 11 ("NOT proven") after a good rollback."""

    async def dead(op: Any) -> list[SimpleNamespace]:
        return [_prove_run()]

    async def empty() -> list[Any]:
        return []

    async def marks() -> dict[str, Any]:
        return {}

    monkeypatch.setattr(converge, "dead_runs", dead)
    monkeypatch.setattr(converge, "left_by", lambda r, entries, marks: ([], []))
    plan = Plan(operation, "c")
    if changes:
        plan.changes.append(FileChange("head", "/r.yaml", "0" * 64, "-a\n+b\n", "b\n", "a\n"))
    op = SimpleNamespace(
        watchdog=SimpleNamespace(entries=empty, journal_by_stamp=marks),
        locked=True,
        cluster=SimpleNamespace(head=SimpleNamespace(name="head")),
    )
    await converge.plan_settle(op, plan)  # type: ignore[arg-type]
    assert plan.facts.unproven == unproven
    assert plan.has(StepKind.SETTLE)


class _Api:
    """An engine API that answers no completion."""

    async def __aenter__(self) -> _Api:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    async def complete(self, timeout: float) -> bool:
        """No completion."""
        return False


@pytest.mark.parametrize(
    ("followed", "said"),
    [
        pytest.param(False, "no completion within 10 s: the engine does not serve", id="dead-run"),
        pytest.param(True, "the engine answered once, then no completion", id="own-boot"),
    ],
)
async def test_still_serving_says_what_this_run_saw(followed: bool, said: str) -> None:
    """Case 9 (found on the embedded cluster): the checks a dead run owed, its torn restart
    having left the engine down, said `the engine answered once, then no completion` of an
    engine this run never saw answer."""
    op = SimpleNamespace(
        cluster=SimpleNamespace(engine=SimpleNamespace(probe_timeout_s=10.0)),
        engine=lambda timeout: _Api(),
    )
    check = await postboot._still_serving(op, "node1", followed=followed)  # type: ignore[arg-type]
    assert not check.ok and said in check.detail


@pytest.mark.parametrize(
    ("boot", "headline"),
    [
        pytest.param(None, "Checks failed (this run followed no boot of its own)", id="dead-run"),
        pytest.param(SimpleNamespace(), "The new engine serves, but checks failed", id="own"),
    ],
)
def test_failed_checks_headline_claims_no_engine_it_did_not_see(
    capsys: pytest.CaptureFixture[str], boot: Any, headline: str
) -> None:
    """Case 9's headline: `The new engine serves, but checks failed` printed over the checks of a
    dead run whose engine is down (no boot followed by this run)."""
    check = SimpleNamespace(ok=False, name="still-serving", host="node1", detail="down")
    outcome = SimpleNamespace(
        proof=None, rolled_back=False, ok=True, checks_ok=False, boot=boot, warnings=[],
        checks=[check], history_problem=None, budget=None,
    )  # fmt: skip
    _echo_outcome(outcome)  # type: ignore[arg-type]
    assert headline in capsys.readouterr().out
