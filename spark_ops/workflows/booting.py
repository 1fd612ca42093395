"""A boot in progress is not a quiet moment (issue 30 #4).

Before a planned restart spark-ops drains the engine: "no request in flight" is the quiet moment a
restart waits for. An engine that is booting — the watchdog's own restart, a colleague's by hand —
has no request in flight either, and killing it then throws that boot away (10–30 minutes on the
real cluster) and races the watchdog. So the moment is read first: the engine's instance alive on
the head while its API does not answer is a boot under way; the run waits for it to end (served,
or its engine gone), with the ETA the boot history gives, and refuses (exit 15) past its wait.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

from spark_ops.engine.instance import current_instance
from spark_ops.errors import BootUnderWayError, SparkOpsError
from spark_ops.readiness import BootHistory, history_key
from spark_ops.workflows.converge import checks_owed, engine_answers
from spark_ops.workflows.execution import Execution
from spark_ops.workflows.journal import STAMP_GRACE_S, grace_left
from spark_ops.workflows.operation import ApplyOptions, Operation
from spark_ops.workflows.plan import StepKind
from spark_ops.workflows.restart import prepare_restart

POLL_S = 2.0


@dataclass(frozen=True)
class BootUnderWay:
    """An engine instance that runs on the head and does not answer yet: a boot under way."""

    instance: str
    started_at: float | None  # the instance's start, head clock
    elapsed_s: float | None
    eta_s: float | None  # seconds left, by the boot history (None: no earlier boot known)

    def describe(self) -> str:
        """The boot in words: which instance, for how long, and when it should serve."""
        since = f" for {self.elapsed_s:.0f} s" if self.elapsed_s is not None else ""
        eta = (
            f"; it should serve in about {self.eta_s:.0f} s (the boot history)"
            if self.eta_s is not None
            else "; no earlier boot is known to give an ETA"
        )
        return f"the engine ({self.instance}) is booting{since} and does not answer yet{eta}"

    def to_dict(self) -> dict[str, Any]:
        """Serialize for --json and the journal."""
        return {
            "instance": self.instance, "started_at": self.started_at,
            "elapsed_s": self.elapsed_s, "eta_s": self.eta_s,
        }  # fmt: skip


async def boot_under_way(op: Operation) -> BootUnderWay | None:
    """The boot under way on the head, or None (the engine answers, or no instance of it runs)."""
    if await engine_answers(op):
        return None
    try:
        instance = await current_instance(op.session, op.cluster)
    except SparkOpsError:
        return None
    if instance is None or not instance.alive:
        return None
    started = instance.engine_started_at or instance.started_at
    elapsed: float | None = None
    if started is not None:
        try:
            elapsed = max(0.0, await op.watchdog.clock() - started)
        except SparkOpsError:
            elapsed = None
    previous = BootHistory().previous(history_key(op.cluster), served=True) or {}
    total = previous.get("total_s")
    eta = (
        max(0.0, float(total) - elapsed)
        if isinstance(total, int | float) and elapsed is not None
        else None
    )
    return BootUnderWay(instance.label(), started, elapsed, eta)


def _hung(op: Operation, opts: ApplyOptions, boot: BootUnderWay, then: str) -> bool:
    """A boot older than the boot deadline (`--deadline`, else the inventory's) is a hang, not a
    boot: what follows (`then`: the restart it needs, or the checks) goes ahead, said in the log."""
    deadline = opts.deadline_s or op.cluster.engine.boot_deadline_s
    hung = boot.elapsed_s is not None and boot.elapsed_s >= deadline
    if hung:
        op.log.warning(
            f"the engine has booted for longer than the boot deadline without answering: hung, "
            f"{then}", boot=boot.describe(), deadline_s=deadline,
        )  # fmt: skip
    return hung


async def wait_out_boot(
    op: Operation, opts: ApplyOptions, *, checks: bool = False
) -> BootUnderWay | None:
    """Wait for a boot under way to end before a planned restart; the boot first seen, or None.

    Ends when the engine answers, its instance is gone (a failed boot: the restart is then what
    it needs) or it has booted longer than the boot deadline (a hang, not a boot); refuses
    with BootUnderWayError (exit 15) once `--boot-wait` (default: the inventory's boot deadline)
    has passed, or at once with `--boot-wait 0`. Never kills a boot. `checks`: what waits is a
    stopped run's checks (no restart in this run), and the words say so.
    """
    then = "checking it now" if checks else "restarting it"
    first = await boot_under_way(op)
    if first is None or _hung(op, opts, first, then):
        return None
    wait = op.cluster.engine.boot_deadline_s if opts.boot_wait_s is None else opts.boot_wait_s
    op.log.warning("boot under way: waiting for it", boot=first.describe(), wait_s=wait)
    end = time.monotonic() + wait
    latest = first
    while time.monotonic() < end:
        await asyncio.sleep(min(POLL_S, max(0.0, end - time.monotonic())))
        now = await boot_under_way(op)
        if now is None or _hung(op, opts, now, then):
            op.log.warning(
                "the boot under way ended: " + ("checking now" if checks else "restarting now"),
                instance=first.instance,
            )
            return first
        latest = now
    if checks:
        raise BootUnderWayError(
            f"{latest.describe()}; the checks wait for it to serve "
            f"(waited {wait:g} s; nothing was changed)",
            hint="run the same command again once it serves (`spark-ops status`), or give "
            "--boot-wait SECONDS to wait longer",
        )
    raise BootUnderWayError(
        f"{latest.describe()}; a restart now would kill that boot, so none was made "
        f"(waited {wait:g} s; no recipe written, no restart made)",
        hint="wait for it (`spark-ops status`), or give --boot-wait SECONDS to wait longer; an "
        "engine that hangs rather than boots is stopped by its pid (`spark-ops status` names it)",
    )


async def before_disruption(ex: Execution, kind: StepKind) -> None:
    """The first of write, lease, drain and restart waits out a boot under way (once per run; a
    plan with no restart disrupts no boot)."""
    if ex.quiet or not ex.plan.has(StepKind.RESTART):
        return
    ex.quiet = True
    await wait_out_boot(ex.op, ex.opts)


async def before_checks(ex: Execution, kind: StepKind) -> None:
    """Checks a run owes without a restart of its own (a stopped run's) wait for the boot under
    way to serve; a run that restarted followed its own boot already."""
    if not ex.plan.has(StepKind.RESTART):
        if ex.plan.facts.checks_owed:
            await _engine_started(ex.op, ex.plan.facts.checks_owed, ex.opts.boot_wait_s)
        await wait_out_boot(ex.op, ex.opts, checks=True)


async def _engine_started(op: Operation, run: str, boot_wait_s: float | None) -> None:
    """Give the dead run's restart until its grace ends (STAMP_GRACE_S after its command, on the
    head's clock) to start the engine: the watchdog may be between stopping the old engine and
    starting the new one. Past that grace, or `--boot-wait` (`boot_wait_s`, when shorter; 0: no
    wait), nothing is waited for: the checks then find the engine down, and the log says that
    the next run plans the restart."""
    if await engine_answers(op) or await boot_under_way(op) is not None:
        return
    owed = await checks_owed(op)
    grace_end = owed.last_grace_end if owed is not None and owed.run == run else None
    if grace_end is None:
        return
    limit = STAMP_GRACE_S if boot_wait_s is None else min(STAMP_GRACE_S, boot_wait_s)
    by_option = f", and --boot-wait {boot_wait_s:g} s" if limit < STAMP_GRACE_S else ""
    op.log.warning(
        f"the engine does not answer and no boot is under way: waiting for the restart of run "
        f"{run} to start it (at most until {STAMP_GRACE_S:.0f} s after its restart command"
        f"{by_option})"
    )
    end = time.monotonic() + limit
    while time.monotonic() < end:
        try:
            left = grace_left(grace_end, await op.watchdog.clock())
        except SparkOpsError:
            break
        if left <= 0:
            break
        await asyncio.sleep(min(POLL_S, left))
        if await engine_answers(op) or await boot_under_way(op) is not None:
            return
    within = f"{STAMP_GRACE_S:.0f} s of its restart command{by_option}"
    op.log.warning(
        f"the restart of run {run} did not start the engine within {within}: the checks find it "
        "down; run the same command again, which then plans the restart"
    )


async def before_restart(ex: Execution, kind: StepKind) -> None:
    """The restart's reads, after a boot under way was waited out (when no earlier step did)."""
    await before_disruption(ex, kind)
    await prepare_restart(ex, kind)
