"""Load that knows the watchdog's probe: before a level is sent, would the probe time out?

The watchdog probes the engine every `interval_s` with a tiny completion that waits `timeout_s`
at most; `failures` failed probes in a row make it restart the engine (inventory
`watchdog.probe`). At concurrency c on an engine capped at max_num_seqs m, c - m requests wait
in the engine's queue and the probe joins behind them: it gets a slot after c - m + 1 requests
finished, m at a time, so it waits about ceil((c - m + 1) / m) x T, T the time of one request at
the cap (from the sweep's own measurements, else the engine's e2e latency metric). A level whose
wait is not below the probe's timeout is run under a lease on the watchdog (disruption.py), or
refused with the arithmetic shown; it never runs unleased unless the operator said so.

A probe the inventory does not describe (no `watchdog.probe`) has no timeout to compare with: a
level that queues the probe (c >= m) counts as starving it, as an unknown request time does. The
plan (`plan_load`) says up front, per level, whether it runs as is, under a lease, or is refused,
with the arithmetic; a refusal that does not depend on what the sweep measures is made there,
before any request is sent.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from spark_ops import audit
from spark_ops.bench.openloop import RateConfig, RateResult, arrival_times, run_rates
from spark_ops.bench.stats import LevelResult
from spark_ops.bench.sweep import SweepConfig, SweepResult, run_sweep
from spark_ops.errors import ExitStatus, SparkOpsError
from spark_ops.inventory import Cluster, WatchdogProbe
from spark_ops.workflows.disruption import Leases, open_loop_concurrency
from spark_ops.workflows.journal import RunJournal
from spark_ops.workflows.operation import Operation, head_knobs
from spark_ops.workflows.plan import OperationKind

MARGIN_S = 120.0  # a leased level's lease past its expected length
MAX_RECORDED = 64  # levels the journal's intent names (the rest counted)
NO_PROBE = (
    "the watchdog's probe is not described (the inventory has no watchdog.probe), so whether a "
    "level starves it cannot be computed"
)
PROBE_FIX = (
    "set watchdog.probe: {interval_s, timeout_s, failures} in the inventory to the watchdog's own "
    "probe (`spark-ops doctor` shows the reference watchdog's)"
)


class ProbeWouldTrip(SparkOpsError):
    """A load level would starve the watchdog's probe and no lease can be held: refused."""

    exit_status = ExitStatus.ABORTED


@dataclass(frozen=True)
class ProbeWait:
    """How long the watchdog's probe waits at one level, and how that was worked out."""

    concurrency: int
    cap: int | None
    request_s: float | None  # one request's time at the cap
    source: str  # where request_s came from
    timeout_s: float | None  # None: the inventory does not describe the probe (watchdog.probe)

    @property
    def ahead(self) -> int:
        """Requests queued ahead of the probe (0 while a slot is free)."""
        if self.cap is None:
            return 0
        return max(0, self.concurrency - self.cap + 1) if self.concurrency >= self.cap else 0

    @property
    def rounds(self) -> int:
        """Rounds of the cap the probe waits for."""
        return math.ceil(self.ahead / self.cap) if self.cap and self.ahead else 0

    @property
    def wait_s(self) -> float | None:
        """The probe's expected wait (None: the request time is not known)."""
        if not self.rounds:
            return 0.0
        return None if self.request_s is None else self.rounds * self.request_s

    @property
    def trips(self) -> bool:
        """True when the probe would time out (an unknown wait, or an unknown timeout, behind a
        full queue counts)."""
        if not self.rounds:
            return False
        wait = self.wait_s
        return wait is None or self.timeout_s is None or wait >= self.timeout_s

    def arithmetic(self) -> str:
        """The reckoning, in words."""
        c, m = self.concurrency, self.cap
        if m is None:
            return f"concurrency {c}: the engine's max_num_seqs is not known"
        if not self.rounds:
            return f"concurrency {c} < max_num_seqs {m}: a slot stays free for the probe"
        head = (
            f"concurrency {c} at max_num_seqs {m}: {c - m} requests queue, the probe waits for "
            f"{self.ahead} to finish, {m} at a time = {self.rounds} round(s)"
        )
        if self.request_s is None:
            head = f"{head} of an unknown request time ({self.source})"
        else:
            t, wait = self.request_s, self.wait_s
            head = f"{head} x {t:.1f} s a request ({self.source}) = {wait:.0f} s"
        if self.timeout_s is None:
            return f"{head}, against a probe timeout that is not known: counted as starving it"
        if self.request_s is None:
            return f"{head}: taken as a timeout"
        verdict = ">=" if self.trips else "<"
        return f"{head} {verdict} the watchdog's probe timeout {self.timeout_s:g} s"

    def to_dict(self) -> dict[str, Any]:
        """Serialize for --json and the state file."""
        return {
            "concurrency": self.concurrency, "cap": self.cap, "ahead": self.ahead,
            "rounds": self.rounds, "request_s": self.request_s, "source": self.source,
            "wait_s": self.wait_s, "timeout_s": self.timeout_s, "trips": self.trips,
        }  # fmt: skip


def request_time(
    levels: Sequence[LevelResult], cap: int, engine_request_s: float | None
) -> tuple[float | None, str]:
    """One request's time at the cap: from the sweep's latest measured level (its run's length
    over its rounds), else the engine's mean e2e latency; and where it came from."""
    for level in reversed(levels):
        if level.completed and level.duration > 0:
            rounds = math.ceil(level.max_concurrency / cap)
            return level.duration / rounds, f"measured at concurrency {level.max_concurrency}"
    if engine_request_s is not None and engine_request_s > 0:
        return engine_request_s, "the engine's mean e2e request latency"
    return None, "nothing measured yet"


def probe_wait(
    concurrency: int, cap: int | None, levels: Sequence[LevelResult],
    engine_request_s: float | None, probe: WatchdogProbe | None,
) -> ProbeWait:  # fmt: skip
    """The probe's wait at this level from what the sweep measured so far (a probe the inventory
    does not describe: no timeout to compare with)."""
    timeout = probe.timeout_s if probe is not None else None
    if cap is None:
        return ProbeWait(concurrency, None, None, "no max_num_seqs", timeout)
    t, source = request_time(levels, cap, engine_request_s)
    return ProbeWait(concurrency, cap, t, source, timeout)


@dataclass(frozen=True)
class LevelPlan:
    """What a load level will meet, said before the sweep: run as is, leased, refused, or run
    unleased (--unleased-load); `certain` False when the sweep's own measurements decide (a
    request time of `threshold_s` or more at that level makes the probe time out)."""

    concurrency: int
    action: str  # run | lease | refuse | unleased
    certain: bool
    why: str
    threshold_s: float | None = None

    def text(self) -> str:
        """One line of the plan."""
        c = self.concurrency
        if self.action == "run":
            return f"C={c}: runs as is ({self.why})"
        verb = {
            "lease": "leased", "refuse": "REFUSED" if self.certain else "refused",
            "unleased": "runs UNLEASED (--unleased-load)",
        }[self.action]  # fmt: skip
        if self.certain:
            return f"C={c}: {verb} ({self.why})"
        after = "" if self.action == "refuse" else ", else it runs as is"
        return (
            f"C={c}: {verb} if the sweep measures a request at {self.threshold_s:.3g} s or "
            f"more{after} ({self.why})"
        )

    def to_dict(self) -> dict[str, Any]:
        """Serialize for --json and the journal."""
        return {
            "concurrency": self.concurrency, "action": self.action, "certain": self.certain,
            "threshold_s": self.threshold_s, "why": self.why, "text": self.text(),
        }  # fmt: skip


@dataclass(frozen=True)
class LoadPlan:
    """The levels of one sweep against the watchdog's probe, before any request is sent."""

    cap: int | None
    probe: WatchdogProbe | None
    pause_file: str | None
    unleased: bool
    levels: list[LevelPlan]
    said: tuple[str, ...] = ()  # said first (an open loop: the concurrency its levels count as)

    def notes(self) -> list[str]:
        """The risks said once for the whole sweep (not at every level)."""
        queued = [lv for lv in self.levels if lv.action != "run"]
        said = list(self.said)
        if self.probe is None and queued:
            said.append(
                f"{NO_PROBE}: a level at or above max_num_seqs counts as starving it; {PROBE_FIX}"
            )
        if not self.pause_file and queued:
            said.append(
                "no watchdog.pause_file: the watchdog cannot be paused, so a level that would "
                "starve its probe is refused"
                + (" (run anyway: --unleased-load)" if self.unleased else " unless --unleased-load")
            )
        if self.cap is None:
            said.append(
                "the engine's max_num_seqs is not known (the recipe does not set it): whether a "
                "level queues the watchdog's probe cannot be told"
            )
        return said

    def header(self) -> str:
        """What the load is checked against, in words."""
        p = self.probe
        probe = (
            f"the watchdog's probe every {p.interval_s:g} s, timeout {p.timeout_s:g} s, a restart "
            f"after {p.failures} failures"
            if p is not None
            else "the watchdog's probe not described (no watchdog.probe)"
        )
        cap = f"max_num_seqs {self.cap}" if self.cap is not None else "max_num_seqs unknown"
        pause = f"lease in {self.pause_file}" if self.pause_file else "no pause file"
        return f"load against the watchdog ({cap}; {probe}; {pause})"

    def lines(self) -> list[str]:
        """The header, the risks said once, and a line per level (levels that run as is share
        one line)."""
        out = [self.header(), *self.notes()]
        free = [lv for lv in self.levels if lv.action == "run"]
        if free:
            cs = ", ".join(str(lv.concurrency) for lv in free)
            why = (
                "the engine's max_num_seqs is not known" if self.cap is None
                else f"below max_num_seqs {self.cap}: a slot stays free for the probe"
            )  # fmt: skip
            out.append(f"C={cs}: run{'s' if len(free) == 1 else ''} as is ({why})")
        out += [lv.text() for lv in self.levels if lv.action != "run"]
        return out

    def refused(self) -> list[LevelPlan]:
        """The levels refused whatever the sweep measures."""
        return [lv for lv in self.levels if lv.action == "refuse" and lv.certain]

    def refusal(self) -> ProbeWouldTrip | None:
        """The error that refuses the sweep before any request is sent (None: nothing refused)."""
        return refusal_of([("", self)])

    def record(self) -> dict[str, Any]:
        """What the load run's intent records: the levels that meet the probe (a bounded list:
        an audit line stays small whatever --concurrency lists)."""
        meet = [lv for lv in self.levels if lv.action != "run"]
        return {
            "cap": self.cap, "probe": asdict(self.probe) if self.probe is not None else None,
            "pause_file": self.pause_file, "unleased": self.unleased,
            "levels": [
                {k: v for k, v in lv.to_dict().items() if k not in ("why", "text")}
                for lv in meet[:MAX_RECORDED]
            ],
            "more": max(0, len(meet) - MAX_RECORDED),
        }  # fmt: skip

    def to_dict(self) -> dict[str, Any]:
        """Serialize for --json and the experiment's plan."""
        return {
            "cap": self.cap, "probe": asdict(self.probe) if self.probe is not None else None,
            "pause_file": self.pause_file, "unleased": self.unleased,
            "levels": [lv.to_dict() for lv in self.levels], "lines": self.lines(),
        }  # fmt: skip


def refusal_of(
    plans: Sequence[tuple[str, LoadPlan]], before: str = "any request was sent"
) -> ProbeWouldTrip | None:
    """The refusal of one sweep, or of several (an experiment's configurations, each named),
    before anything is done; None when no level is refused whatever the sweeps measure."""
    refusing = [(name, plan) for name, plan in plans if plan.refused()]
    if not refusing:
        return None
    out = {lv.concurrency for _, plan in refusing for lv in plan.refused()}
    keep = sorted({lv.concurrency for _, plan in plans for lv in plan.levels} - out)
    probe = refusing[0][1].probe
    parts = []
    for name, plan in refusing:
        levels = "; ".join(f"C={lv.concurrency}: {lv.why}" for lv in plan.refused())
        parts.append(f"{name}: {levels}" if name else levels)
    cs = ", ".join(str(c) for c in sorted(out))
    leave = f"leave {'it' if len(out) == 1 else 'them'} out" + (
        f" (--concurrency {','.join(map(str, keep))})" if keep else ""
    )
    fix = f"{PROBE_FIX}; " if probe is None else ""
    return ProbeWouldTrip(
        f"concurrency {cs} would starve the watchdog's probe and the watchdog cannot be paused "
        f"(no watchdog.pause_file): refused before {before}; {' | '.join(parts)}; "
        f"after {wait_text(probe)} the watchdog restarts the engine",
        hint=f"{fix}configure watchdog.pause_file (a lease pauses the watchdog for the level), "
        f"{leave}, or run anyway with --unleased-load (the watchdog may restart the engine: a "
        "slot of its budget spent)",
    )


def plan_load(
    levels: Sequence[int], cap: int | None, probe: WatchdogProbe | None,
    pause_file: str | None, *, unleased: bool = False, measured: bool = False,
    engine_request_s: float | None = None,
) -> LoadPlan:  # fmt: skip
    """Before the sweep, what each level will meet: the probe's queue at the cap, against its
    timeout. A level measured after another one is decided by that measurement (conditional, with
    its threshold); the first one that queues the probe, with nothing measured before it
    (`measured`: a resumed sweep's levels), meets an unknown request time: taken as a timeout."""
    act = "lease" if pause_file else ("unleased" if unleased else "refuse")
    rows: list[LevelPlan] = []
    known = measured or (engine_request_s is not None and engine_request_s > 0)
    for c in levels:
        wait = ProbeWait(c, cap, None, "nothing measured before it", None)
        if cap is None or not wait.rounds:
            rows.append(LevelPlan(c, "run", True, wait.arithmetic()))
        elif probe is None:
            why = (
                f"at max_num_seqs {cap} the probe queues behind {wait.ahead} request(s): "
                f"{wait.rounds} round(s), against a timeout that is not known (no watchdog.probe)"
            )
            rows.append(LevelPlan(c, act, True, why))
        elif not known:
            first = ProbeWait(c, cap, None, "nothing measured before it", probe.timeout_s)
            rows.append(LevelPlan(c, act, True, first.arithmetic()))
        else:
            threshold = probe.timeout_s / wait.rounds
            why = (
                f"at max_num_seqs {cap} the probe queues behind {wait.ahead} request(s): "
                f"{wait.rounds} round(s) x a request's time against its {probe.timeout_s:g} s "
                "timeout"
            )
            rows.append(LevelPlan(c, act, False, why, threshold))
        known = True  # every later level has this one's measurement
    return LoadPlan(cap, probe, pause_file, unleased, rows)


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


def plan_open_loop(
    rates: Sequence[float], max_concurrency: int | None, requests: int, cap: int | None,
    probe: WatchdogProbe | None, pause_file: str | None, *, unleased: bool = False,
) -> LoadPlan:  # fmt: skip
    """An open loop's plan: each rate a level at open_loop_concurrency, planned as a concurrency
    level is (nothing measured: an unknown request time), and said so first."""
    c = open_loop_concurrency(max_concurrency, requests, cap)
    at = f"open loop at {', '.join(f'{r:g}' for r in rates)} req/s"
    if max_concurrency is not None:
        said = f"{at}: at most {c} request(s) in flight (--max-concurrency), each rate as C={c}"
    else:
        free = ""
        if cap is not None and cap > 1:
            free = f"; --max-concurrency {cap - 1} or less leaves the probe a slot"
        said = (
            f"{at} without --max-concurrency: its requests in flight are unbounded, counted as at "
            f"or above max_num_seqs{f' {cap}' if cap else ''}, each rate as C={c} (its {requests} "
            f"requests at once{', counted at the cap' if c > requests else ''}{free})"
        )
    plan = plan_load([c], cap, probe, pause_file, unleased=unleased)
    return replace(plan, said=(said,))


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


def cap_of(knobs: dict[str, Any] | None) -> int | None:
    """The engine's max_num_seqs from a sweep's knobs (None when not known)."""
    knob = (knobs or {}).get("max_num_seqs")
    if isinstance(knob, bool) or not isinstance(knob, int | str):
        return None
    cap = int(knob) if str(knob).isdigit() else 0
    return cap if cap > 0 else None  # 0 is no cap vLLM runs with: not known


def wait_text(probe: WatchdogProbe | None) -> str:
    """How long failing probes take to make the watchdog act, in words."""
    if probe is None:
        return "a few failed probes"
    return f"{probe.failures} failed probes (about {probe.trip_s():.0f} s)"
