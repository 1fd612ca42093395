"""Load that knows the watchdog's probe: before a level is sent, would the probe time out?

The watchdog probes the engine every `interval_s` with a tiny completion that waits `timeout_s`
at most; `failures` failed probes in a row make it restart the engine (inventory
`watchdog.probe`). At concurrency c on an engine capped at max_num_seqs m, c - m requests wait
in the engine's queue and the probe joins behind them: it gets a slot after c - m + 1 requests
finished, m at a time, so it waits about ceil((c - m + 1) / m) x T, T the time of one request at
the cap (from the sweep's own measurements, else the engine's e2e latency metric). A level whose
wait is not below the probe's timeout is run under a lease on the watchdog (disruption.py), or
refused with the arithmetic shown; it never runs unleased unless the operator said so.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from spark_ops import audit
from spark_ops.bench.stats import LevelResult
from spark_ops.bench.sweep import SweepConfig, SweepResult, run_sweep
from spark_ops.errors import ExitStatus, SparkOpsError
from spark_ops.inventory import Cluster, WatchdogProbe
from spark_ops.workflows.disruption import Leases
from spark_ops.workflows.journal import RunJournal
from spark_ops.workflows.operation import Operation, head_knobs

MARGIN_S = 120.0  # a leased level's lease past its expected length


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
    timeout_s: float

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
        """True when the probe would time out (an unknown wait behind a full queue counts)."""
        wait = self.wait_s
        return wait is None or wait >= self.timeout_s

    def arithmetic(self) -> str:
        """The reckoning, in words."""
        c, m = self.concurrency, self.cap
        if m is None:
            return f"concurrency {c}: the engine's max_num_seqs is not known"
        if not self.rounds:
            return f"concurrency {c} <= max_num_seqs {m}: a slot stays free for the probe"
        head = (
            f"concurrency {c} at max_num_seqs {m}: {c - m} requests queue, the probe waits for "
            f"{self.ahead} to finish, {m} at a time = {self.rounds} round(s)"
        )
        if self.request_s is None:
            return f"{head} of an unknown request time ({self.source}): taken as a timeout"
        verdict = ">=" if self.trips else "<"
        return (
            f"{head} x {self.request_s:.1f} s a request ({self.source}) = {self.wait_s:.0f} s "
            f"{verdict} the watchdog's probe timeout {self.timeout_s:g} s"
        )

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
    engine_request_s: float | None, probe: WatchdogProbe,
) -> ProbeWait:  # fmt: skip
    """The probe's wait at this level from what the sweep measured so far."""
    if cap is None:
        return ProbeWait(concurrency, None, None, "no max_num_seqs", probe.timeout_s)
    t, source = request_time(levels, cap, engine_request_s)
    return ProbeWait(concurrency, cap, t, source, probe.timeout_s)


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
    journal: RunJournal | None = None  # its intent written before the first lease (bench)
    begun: bool = False

    def _say(self, text: str) -> None:
        """Pass a note on."""
        if self.on_note is not None:
            self.on_note(text)

    def check(self, concurrency: int, levels: Sequence[LevelResult]) -> ProbeWait | None:
        """The probe's wait at this level (None when the inventory does not describe the probe)."""
        if self.probe is None:
            return None
        return probe_wait(concurrency, self.cap, levels, self.engine_request_s, self.probe)

    def seconds(self, wait: ProbeWait) -> float:
        """How long a leased level may last: its runs' rounds at the request time, a margin."""
        t = wait.request_s if wait.request_s is not None else self.probe_timeout()
        cap = wait.cap or wait.concurrency
        return self.repeats * math.ceil(wait.concurrency / cap) * t * 2 + MARGIN_S

    def probe_timeout(self) -> float:
        """The probe's timeout (a request time stand-in when none is known)."""
        return self.probe.timeout_s if self.probe is not None else 60.0

    @contextlib.asynccontextmanager
    async def level(self, concurrency: int, levels: Sequence[LevelResult]) -> AsyncIterator[None]:
        """Hold what this level needs while it runs (a lease, or nothing), or refuse it."""
        wait = self.check(concurrency, levels)
        if wait is None or not wait.trips:
            yield
            return
        sum_up = wait.arithmetic()
        if self.leases is not None and self.leases.op.cluster.watchdog.pause_file:
            if self.journal is not None and not self.begun:
                await self.journal.intent(detail={"levels": [concurrency], "cap": self.cap})
                self.begun = True
            why = f"load at concurrency {concurrency} (run {self.leases.run}): {sum_up}"
            held = await self.leases.take(why, self.seconds(wait))
            if held.state in ("held", "found"):
                self._say(f"concurrency {concurrency}: {held.text()}")
                try:
                    yield
                finally:
                    await self.leases.end_all()
                return
        if not self.unleased:
            raise ProbeWouldTrip(
                f"concurrency {concurrency} would starve the watchdog's probe: {sum_up}; the "
                "watchdog cannot be paused (no watchdog.pause_file, or the lease failed), so its "
                f"probe would fail and after {wait_text(self.probe)} it restarts the engine",
                hint="leave the level out (--levels), configure watchdog.pause_file, or run it "
                "anyway with --unleased-load (the watchdog may restart the engine: a slot spent)",
            )
        self._say(f"concurrency {concurrency}: unleased (--unleased-load): {sum_up}")
        yield


async def sweep_cluster(
    cluster: Cluster, config: SweepConfig, *, unleased: bool = False,
    on_note: Callable[[str], None] | None = None, **kw: Any,
) -> SweepResult:  # fmt: skip
    """`bench` against the inventory's engine: each level that would starve the watchdog's probe
    runs under a lease of a `bench-load` journal run (written only when one is taken), or is
    refused (LoadGuard)."""
    async with Operation.open(cluster, "bench", lock=False, nodes=[cluster.head.name]) as op:
        config.base_url = await op.api_url()
        config.knobs = config.knobs or await head_knobs(op)
        cap = cap_of(config.knobs)
        journal = RunJournal(op, "bench-load", "spark-ops bench")
        leases = Leases(op, journal.run)
        guard = LoadGuard(
            leases, cluster.watchdog.probe, cap, config.repeats, unleased=unleased,
            on_note=on_note, journal=journal,
        )  # fmt: skip
        outcome = "failed"
        try:
            result = await run_sweep(config, guard=guard.level, **kw)
            outcome = "ok"
            return result
        finally:
            await leases.end_all()
            for text in leases.notes:
                if on_note is not None:
                    on_note(text)
            if guard.begun:
                await journal.end(audit.make_entry("bench-load", outcome=outcome))


def cap_of(knobs: dict[str, Any] | None) -> int | None:
    """The engine's max_num_seqs from a sweep's knobs (None when not known)."""
    knob = (knobs or {}).get("max_num_seqs")
    if isinstance(knob, bool) or not isinstance(knob, int | str):
        return None
    return int(knob) if str(knob).isdigit() else None


def wait_text(probe: WatchdogProbe | None) -> str:
    """How long failing probes take to make the watchdog act, in words."""
    if probe is None:
        return "a few failed probes"
    return f"{probe.failures} failed probes (about {probe.trip_s():.0f} s)"
