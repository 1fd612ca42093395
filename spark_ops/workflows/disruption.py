"""The watchdog's lease around a planned disruption: how long, what the plan says, how it ends.

A restart (apply, restart, rollback, an experiment's configuration) and load that can starve the
watchdog's probe (bench, experiment: workflows/probe_load.py) pause the watchdog with a lease
(watchdog/lease.py) for as long as the disruption can last, and end it on every path out. A run
killed meanwhile leaves a lease that lapses at its expiry, or that the next run's settle step
ends (it names the dead run). A pause someone else set is never removed; one found or appearing
meanwhile is reported.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from spark_ops.errors import SparkOpsError
from spark_ops.inventory import Cluster
from spark_ops.remote import sha256
from spark_ops.watchdog import lease
from spark_ops.watchdog.contract import operator
from spark_ops.workflows import interrupt
from spark_ops.workflows.journal import Run
from spark_ops.workflows.operation import ApplyOptions, Operation
from spark_ops.workflows.plan import OperationKind

if TYPE_CHECKING:  # a type only: the bench is imported where a load runs
    from spark_ops.bench.gate import LoadPoint

MARGIN_S = 300.0  # prune, verify and the steps between, past the boot's own deadline


def restart_lease_seconds(cluster: Cluster, opts: ApplyOptions) -> float:
    """How long a restart's lease lasts: the drain, the boot (twice with a rollback), a margin;
    with --prove also the measurement after the change (run inside this lease) and the boot of
    the rollback a failed gate makes."""
    boots = 2 if opts.rollback_on_failure or opts.prove is not None else 1
    drain = opts.drain_timeout_s if opts.drain else 0.0
    deadline = opts.deadline_s or cluster.engine.boot_deadline_s  # --deadline, as the boot uses
    measure = 0.0
    if opts.prove is not None:
        probe = cluster.watchdog.probe
        measure = measurement_seconds(opts.prove.point, None, probe.timeout_s if probe else 60.0)
    return lease.lease_seconds(drain + boots * deadline + measure + MARGIN_S)


def open_loop_concurrency(max_concurrency: int | None, requests: int, cap: int | None) -> int:
    """The concurrency an open loop's levels count as against the probe: --max-concurrency when
    given; else its requests in flight are unbounded, counted at or above the cap (up to all of
    a level's requests at once)."""
    if max_concurrency is not None:
        return max_concurrency
    return max(requests, cap or 0)


def measurement_seconds(point: LoadPoint, cap: int | None, request_s: float) -> float:
    """A bound on how long one measurement at a load point lasts: its rounds (its requests, at
    most min(concurrency, cap) at a time; an open loop's concurrency as open_loop_concurrency
    counts it) at twice a request's time, plus an open loop's arrival span (requests / rate). A
    request's time not known: the caller's stand-in (the probe's timeout), as LoadGuard.seconds
    takes it."""
    at_once = point.concurrency or open_loop_concurrency(point.max_concurrency, point.requests, cap)
    if cap:
        at_once = min(at_once, cap)
    rounds = math.ceil(point.requests / max(1, at_once))
    span = point.requests / point.request_rate if point.request_rate else 0.0
    return rounds * request_s * 2 + span


def lease_description(cluster: Cluster, opts: ApplyOptions) -> str:
    """The plan's lease step: what is paused, until when, why; or the risk that remains."""
    wd = cluster.watchdog
    if not wd.pause_file:
        probe = wd.probe
        return "no lease: " + lease.risk_without_pause(
            probe.failures if probe else None, probe.interval_s if probe else None
        )
    seconds = restart_lease_seconds(cluster, opts)
    prove = ", the measurement after the change, a rollback's boot" if opts.prove else ""
    return (
        f"pause the watchdog with a lease in {wd.pause_file} for at most {seconds} s (drain, "
        f"restart, boot, prune, verify{prove}): it must not restart the engine during the planned "
        "restart; ended after the run, else it lapses by itself (a pause already there is kept)"
    )


@dataclass
class Leases:
    """The leases one run took, to end them all on the way out."""

    op: Operation
    run: str
    held: list[lease.LeaseHeld] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # each said once

    def note(self, text: str) -> None:
        """Keep a note once."""
        if text not in self.notes:
            self.notes.append(text)

    async def take(self, why: str, seconds: float) -> lease.LeaseHeld:
        """Take a lease (one atomic unit: a signal waits for it, and its end follows); none in a
        pause file the watchdog does not read (its config names another: it would pause nothing)."""
        try:
            wrong = await self.op.watchdog.pause_file_disagrees()
        except SparkOpsError:  # unknown: the take says what it finds
            wrong = ""
        if wrong:
            held = lease.LeaseHeld(self.op.cluster.watchdog.pause_file, "failed", why, error=wrong)
            self.held.append(held)
            self.note(held.text())
            self.op.log.warning("watchdog lease", detail=held.text())
            return held
        held = await interrupt.atomic(
            lease.take(self.op.session, run=self.run, holder=operator(), why=why, seconds=seconds)
        )
        if held.state == "found":  # a lease past its expiry pauses nothing (the watchdog ignores)
            found = lease.parse_lease(held.found)
            if found is not None and not found.live(await self.op.watchdog.clock()):
                held.state = "lapsed"
        self.held.append(held)
        if held.state in ("found", "lapsed", "failed"):
            self.note(held.text())
            self.op.log.warning("watchdog lease", detail=held.text())
        return held

    async def end_all(self) -> list[str]:
        """End every lease this run holds (atomic each); what happened to each, in words."""
        said: list[str] = []
        for held in [h for h in self.held if h.state == "held" and h.path]:
            assert held.path is not None
            text = await interrupt.atomic(lease.end(self.op.session, held.path, held.sha))
            self.held.remove(held)
            said.append(text)
            if text != "ended":
                self.note(text)
        return said


@contextlib.asynccontextmanager
async def leased(
    leases: Leases, why: str, seconds: float, on_take: Callable[[lease.LeaseHeld], None] | None
) -> AsyncIterator[lease.LeaseHeld]:
    """Hold a lease for the block, ended on every way out (an error, a cancellation too)."""
    held = await leases.take(why, seconds)
    if on_take is not None:
        on_take(held)
    try:
        yield held
    finally:  # after a cancellation too: each end is an atomic unit a second signal waits for
        await leases.end_all()


async def settle_leases(op: Operation, dead: Sequence[Run]) -> str:
    """End the lease a dead run left in the pause file (its content names the run); what was
    done, in words ("" when nothing of theirs is there)."""
    path = op.cluster.watchdog.pause_file
    if not path or not dead:
        return ""
    try:
        text = await op.session.read_file(op.cluster.head.name, path, sudo=True)
    except SparkOpsError as exc:
        return f"the pause file {path} could not be read ({exc.message}): left as it is"
    if text is None:
        return ""
    found = lease.parse_lease(text)
    # a bench runs without the cluster lock: its run may be alive, its lease lapses by itself
    runs = {r.run for r in dead if r.operation != OperationKind.BENCH_LOAD}
    if found is None or found.run not in runs:
        return ""
    said = await lease.end(op.session, path, sha256(text))
    if said == "ended":
        return f"ended the watchdog lease run {found.run} left ({path})"
    return f"the lease run {found.run} left: {said}"
