"""The red team of 2026-12-05, round 7: a dead run's restart window that lies in the future of
the head's clock (a forged or hand-edited journal line, or the head's clock stepped back after a
torn restart) held off every restart until the clock reached it (docs/reliability.md, "round 7")."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from spark_ops.workflows import booting, converge
from spark_ops.workflows.journal import STAMP_GRACE_S
from spark_ops.workflows.plan import StepKind

NOW = 1_000_000.0  # the head's clock

CASES = [
    # the dead run's grace end (its restart command + STAMP_GRACE_S), followed rather than restarted
    pytest.param(NOW + 60.0, True, id="within-grace"),
    pytest.param(NOW + STAMP_GRACE_S, True, id="command-just-now"),
    pytest.param(NOW - 1.0, False, id="past-grace"),
    pytest.param(NOW + STAMP_GRACE_S + 3600.0, False, id="command-an-hour-ahead"),
    pytest.param(1e300, False, id="forged-1e300"),
]


async def _fixed(value: Any) -> Any:
    """An awaitable `value`."""
    return value


@pytest.mark.parametrize(("grace_end", "followed"), CASES)
async def test_a_window_ahead_of_the_clock_is_no_grace(
    monkeypatch: pytest.MonkeyPatch, grace_end: float, followed: bool
) -> None:
    """converge.boot_of_dead_run: a grace that ends later than a whole grace from now is none
    (main: 'no restart is planned' on every run until the head's clock reaches it)."""

    async def owed(op: Any) -> SimpleNamespace:
        return SimpleNamespace(run="R1", last_grace_end=grace_end)

    monkeypatch.setattr(converge, "checks_owed", owed)
    monkeypatch.setattr(converge, "engine_answers", lambda op: _fixed(False))
    monkeypatch.setattr(converge, "_booting", lambda op: _fixed(False))
    op = SimpleNamespace(watchdog=SimpleNamespace(clock=lambda: _fixed(NOW)))
    found = await converge.boot_of_dead_run(op)  # type: ignore[arg-type]
    assert (found is not None) == followed


@pytest.mark.parametrize(("grace_end", "followed"), CASES)
async def test_the_checks_wait_no_grace_ahead_of_the_clock(
    monkeypatch: pytest.MonkeyPatch, grace_end: float, followed: bool
) -> None:
    """booting.before_checks: the wait for the dead run's restart is the grace left, and none
    for a window ahead of the clock (main: the whole STAMP_GRACE_S, for an engine nobody starts)."""
    clock = {"at": NOW, "sleeps": 0}

    async def sleep(seconds: float) -> None:
        clock["at"] += seconds
        clock["sleeps"] += 1

    async def owed(op: Any) -> SimpleNamespace:
        return SimpleNamespace(run="R1", last_grace_end=grace_end)

    async def none(*args: Any, **kwargs: Any) -> None:
        return None

    said: list[str] = []
    monkeypatch.setattr(booting, "engine_answers", lambda op: _fixed(False))
    monkeypatch.setattr(booting, "boot_under_way", none)
    monkeypatch.setattr(booting, "wait_out_boot", none)
    monkeypatch.setattr(booting, "checks_owed", owed, raising=False)
    monkeypatch.setattr(booting, "asyncio", SimpleNamespace(sleep=sleep))
    monkeypatch.setattr(booting, "time", SimpleNamespace(monotonic=lambda: clock["at"]))
    log = SimpleNamespace(warning=lambda text, **kw: said.append(text))
    op = SimpleNamespace(watchdog=SimpleNamespace(clock=lambda: _fixed(clock["at"])), log=log)
    plan = SimpleNamespace(has=lambda kind: False, facts=SimpleNamespace(checks_owed="R1"))
    ex = SimpleNamespace(plan=plan, op=op, opts=SimpleNamespace(boot_wait_s=None))
    await booting.before_checks(ex, StepKind.VERIFY)  # type: ignore[arg-type]
    assert clock["at"] <= max(NOW, min(grace_end, NOW + STAMP_GRACE_S)) + booting.POLL_S
    assert (clock["sleeps"] > 0) == followed, clock
    assert any("plans the restart" in s for s in said), said
