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
before any request is sent. The guard that holds each level while it runs: loadguard.py.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from spark_ops.bench.stats import LevelResult
from spark_ops.errors import ExitStatus, SparkOpsError
from spark_ops.inventory import WatchdogProbe
from spark_ops.workflows.disruption import open_loop_concurrency

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
