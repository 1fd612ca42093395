"""Load held against the watchdog's probe while it runs (bench's closed and open loops).

The load plan (probe_load.py) says before the sweep what each level meets; here the guard holds a
level that would starve the probe under a lease of a `bench-load` journal run (each lease and its
end a step record), or refuses it, and `sweep_cluster` / `rates_cluster` run bench's loops against
the inventory's engine under it.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from spark_ops import audit
from spark_ops.bench.openloop import RateConfig, RateResult, arrival_times, run_rates
from spark_ops.bench.stats import LevelResult
from spark_ops.bench.sweep import SweepConfig, SweepResult, run_sweep
from spark_ops.inventory import Cluster, WatchdogProbe
from spark_ops.workflows.disruption import Leases, open_loop_concurrency
from spark_ops.workflows.journal import RunJournal
from spark_ops.workflows.operation import Operation, head_knobs
from spark_ops.workflows.plan import OperationKind
from spark_ops.workflows.probe_load import (
    PROBE_FIX,
    LoadPlan,
    ProbeWait,
    ProbeWouldTrip,
    cap_of,
    plan_load,
    plan_open_loop,
    probe_wait,
    wait_text,
)

MARGIN_S = 120.0  # a leased level's lease past its expected length


@dataclass
class LoadGuard:
    """Called by the sweep before each level: runs it as is, under a lease, or refuses it."""

    leases: Leases | None  # None: no way to pause the watchdog here
    probe: WatchdogProbe | None
    cap: int | None
    repeats: int
    engine_request_s: float | None = None
    unleased: bool = False  # --unleased-load: the operator accepts the risk
    on_note: Callable[[str], None] | None = None
    journal: RunJournal | None = None  # the run whose steps record each level's lease
    begun: bool = False  # its intent written (bench writes it before its first lease only)
    plan: LoadPlan | None = None  # the plan shown before the sweep (recorded with the intent)

    def _say(self, text: str) -> None:
        """Pass a note on."""
        if self.on_note is not None:
            self.on_note(text)

    def check(self, concurrency: int, levels: Sequence[LevelResult]) -> ProbeWait:
        """The probe's wait at this level (a probe the inventory does not describe has no timeout:
        a level that queues it counts as starving it)."""
        return probe_wait(concurrency, self.cap, levels, self.engine_request_s, self.probe)

    def seconds(self, wait: ProbeWait, span_s: float = 0.0) -> float:
        """How long a leased level may last: its runs' rounds at the request time, a margin, and
        `span_s` (an open loop's arrival schedule: its sending time)."""
        t = wait.request_s if wait.request_s is not None else self.probe_timeout()
        cap = wait.cap or wait.concurrency
        return self.repeats * math.ceil(wait.concurrency / cap) * t * 2 + MARGIN_S + span_s

    def probe_timeout(self) -> float:
        """The probe's timeout (a request time stand-in when none is known)."""
        return self.probe.timeout_s if self.probe is not None else 60.0

    async def _record(self, step: str, status: str, **extra: Any) -> None:
        """One step record of the run's journal (never raises; nothing without a journal)."""
        if self.journal is not None and self.begun:
            await self.journal.note(step, status, **extra)

    @contextlib.asynccontextmanager
    async def level(
        self, concurrency: int, levels: Sequence[LevelResult], span_s: float = 0.0
    ) -> AsyncIterator[None]:
        """Hold what this level needs while it runs (a lease, or nothing), or refuse it; `span_s`
        lengthens its lease (an open loop's schedule)."""
        wait = self.check(concurrency, levels)
        if not wait.trips:
            yield
            return
        sum_up = wait.arithmetic()
        if self.leases is not None and self.leases.op.cluster.watchdog.pause_file:
            if self.journal is not None and not self.begun:
                load = self.plan.record() if self.plan is not None else None
                await self.journal.intent(
                    detail={"levels": [concurrency], "cap": self.cap, "load": load}
                )
                self.begun = True
            path = self.leases.op.cluster.watchdog.pause_file
            await self._record("lease", "taking", level=concurrency, path=path)
            why = f"load that would starve its probe: {sum_up}"
            held = await self.leases.take(why, self.seconds(wait, span_s))
            taken = held.state in ("held", "found")
            await self._record(
                "lease", "done" if taken else "skipped", level=concurrency,
                lease=held.to_dict(), detail=held.text()[:1000],
            )  # fmt: skip
            if taken:
                self._say(f"concurrency {concurrency}: {held.text()}")
                try:
                    yield
                finally:  # each end an atomic unit; its record after it
                    said = await self.leases.end_all()
                    await self._record(
                        "release", "done", level=concurrency,
                        detail="; ".join(said) or "no lease of this run to end",
                    )  # fmt: skip
                return
        if not self.unleased:
            fix = f"{PROBE_FIX}, " if self.probe is None else ""
            raise ProbeWouldTrip(
                f"concurrency {concurrency} would starve the watchdog's probe: {sum_up}; the "
                "watchdog cannot be paused (no watchdog.pause_file, or the lease failed), so its "
                f"probe would fail and after {wait_text(self.probe)} it restarts the engine",
                hint=f"{fix}leave the level out (--concurrency), configure watchdog.pause_file, "
                "or run it anyway with --unleased-load (the watchdog may restart the engine: a "
                "slot spent)",
            )
        self._say(f"concurrency {concurrency}: unleased (--unleased-load): {sum_up}")
        yield


@contextlib.asynccontextmanager
async def cluster_load(
    cluster: Cluster, knobs: dict[str, Any] | None, plan_of: Callable[[int | None], LoadPlan],
    repeats: int, *, unleased: bool = False, on_note: Callable[[str], None] | None = None,
    on_plan: Callable[[LoadPlan], None] | None = None,
) -> AsyncIterator[tuple[str, dict[str, Any] | None, LoadGuard]]:  # fmt: skip
    """Load against the inventory's engine (bench's closed and open loops): its URL (tunnelled)
    and knobs, the load plan first (`plan_of` the engine's cap; `on_plan`), a level refused
    whatever the sweep measures refused before any request is sent; then the guard that holds
    each level under a lease of a `bench-load` journal run (written only when one is taken, each
    lease and its end a step record), or refuses it."""
    async with Operation.open(cluster, "bench", lock=False, nodes=[cluster.head.name]) as op:
        url = await op.api_url()
        knobs = knobs or await head_knobs(op)
        cap = cap_of(knobs)
        plan = plan_of(cap)
        if on_plan is not None:
            on_plan(plan)
        refused = plan.refusal()
        if refused is not None:
            raise refused
        journal = RunJournal(op, OperationKind.BENCH_LOAD, "spark-ops bench")
        leases = Leases(op, journal.run)
        guard = LoadGuard(
            leases, cluster.watchdog.probe, cap, repeats, unleased=unleased,
            on_note=on_note, journal=journal, plan=plan,
        )  # fmt: skip
        outcome = "failed"
        try:
            yield url, knobs, guard
            outcome = "ok"
        finally:
            await leases.end_all()
            for text in leases.notes:
                if on_note is not None:
                    on_note(text)
            if guard.begun:
                await journal.end(audit.make_entry(OperationKind.BENCH_LOAD, outcome=outcome))


async def sweep_cluster(
    cluster: Cluster, config: SweepConfig, *, unleased: bool = False,
    on_note: Callable[[str], None] | None = None,
    on_plan: Callable[[LoadPlan], None] | None = None, **kw: Any,
) -> SweepResult:  # fmt: skip
    """`bench` against the inventory's engine: the load plan first (which levels run as is,
    leased or refused, with the arithmetic), then each level under the guard (cluster_load)."""
    done = {lv.max_concurrency for lv in kw.get("done") or ()}
    wd = cluster.watchdog

    def plan_of(cap: int | None) -> LoadPlan:
        """The levels still to run against the engine's cap."""
        return plan_load(
            [c for c in config.levels if c not in done], cap, wd.probe, wd.pause_file,
            unleased=unleased, measured=bool(done),
        )  # fmt: skip

    async with cluster_load(
        cluster, config.knobs, plan_of, config.repeats, unleased=unleased, on_note=on_note,
        on_plan=on_plan,
    ) as (url, knobs, guard):  # fmt: skip
        config.base_url, config.knobs = url, knobs
        return await run_sweep(config, guard=guard.level, **kw)


async def rates_cluster(
    cluster: Cluster, config: RateConfig, *, unleased: bool = False,
    on_note: Callable[[str], None] | None = None,
    on_plan: Callable[[LoadPlan], None] | None = None, **kw: Any,
) -> RateResult:  # fmt: skip
    """`bench --request-rate` against the inventory's engine: the plan first (plan_open_loop),
    then each rate under the guard as a concurrency level is (cluster_load), its lease lengthened
    by the level's arrival schedule."""
    wd = cluster.watchdog
    mc, requests = config.max_concurrency, config.requests

    def plan_of(cap: int | None) -> LoadPlan:
        """The rates against the engine's cap."""
        return plan_open_loop(
            config.rates, mc, requests, cap, wd.probe, wd.pause_file, unleased=unleased
        )

    async with cluster_load(
        cluster, config.knobs, plan_of, 1, unleased=unleased, on_note=on_note, on_plan=on_plan
    ) as (url, knobs, guard):
        config.base_url, config.knobs = url, knobs
        c = open_loop_concurrency(mc, requests, guard.cap)

        def held(rate: float) -> contextlib.AbstractAsyncContextManager[None]:
            """The guard around one rate: its concurrency, its schedule's span."""
            span = arrival_times(requests, rate, config.arrivals, config.seed)[-1]
            return guard.level(c, [], span)

        return await run_rates(config, guard=held, **kw)
