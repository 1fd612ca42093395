"""`apply --prove`: a change kept only when the engine serves a load point as well as before.

Two steps join an apply's plan when `--prove` is given: `measure-before` (after any settle, before
the recipe is written: the running engine, the old recipe) and `measure-after` (after the boot,
the prune and the checks: the same point on the new engine), whose verdict is bench/gate.py's
`prove` with the operator's limits. A failed verdict raises `Regressed`; the executor's rollback
steps then restore the previous recipe, restart it through the watchdog and prune that restart's
stamp, and the run ends rolled back (exit REGRESSED). A measurement after the change that fails
(the engine does not answer) fails the gate with its reason; one before the change stops the run
before anything is written.

The load is load on the cluster: each measurement runs under the watchdog lease exactly as
`bench` runs a level (probe_load.LoadGuard: a point at or above the engine's max_num_seqs would
queue the watchdog's probe, so it is leased, or refused when the watchdog cannot be paused), and
a point bench would refuse is refused while planning, before anything changes.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from spark_ops.bench.gate import (
    Endpoint,
    LoadPoint,
    Measurement,
    Thresholds,
    Verdict,
    measure,
    prove,
)
from spark_ops.errors import BenchError, ExitStatus, SparkOpsError
from spark_ops.workflows.disruption import Leases, open_loop_concurrency
from spark_ops.workflows.execution import Done, Execution
from spark_ops.workflows.loadguard import LoadGuard
from spark_ops.workflows.plan import Plan, StepKind
from spark_ops.workflows.probe_load import cap_of, plan_load, refusal_of

MAX_SPAN_S = 3600.0  # an open loop's arrivals at most this long (requests / rate)
MAX_REQUESTS = 10_000  # a proof's requests at most (each measured twice, the cluster locked)
MAX_TOKENS = 4_194_304  # requests x output tokens at most: what one measurement decodes


class Regressed(SparkOpsError):
    """The gate failed after the change: the change is rolled back."""

    exit_status = ExitStatus.REGRESSED
    proof: Proof | None = None  # the proof that failed (before, after and the verdict)


@dataclass(frozen=True)
class Proving:
    """What `--prove` measures at and the limits its verdict applies."""

    point: LoadPoint
    thresholds: Thresholds
    unleased: bool = False  # --unleased-load: a point that would starve the probe runs anyway

    def validate(self) -> None:
        """Raise BenchError on a point or a limit out of range (an open loop whose arrivals
        alone last longer than MAX_SPAN_S: the measurement is made twice, under a lease)."""
        self.point.validate()
        self.thresholds.validate()
        p = self.point
        if p.requests > MAX_REQUESTS:
            raise BenchError(
                f"--prove-requests {p.requests}: a proof sends at most {MAX_REQUESTS:,} requests "
                "(measured before and after the change, the cluster lock held throughout)"
            )
        if p.requests * p.output_tokens > MAX_TOKENS:
            raise BenchError(
                f"--prove-requests {p.requests} x --prove-output-tokens {p.output_tokens}: "
                f"{p.requests * p.output_tokens:,} tokens to decode; a proof's measurement decodes "
                f"at most {MAX_TOKENS:,} (the cluster lock is held until both measurements end)"
            )
        if p.request_rate is not None and p.requests / p.request_rate > MAX_SPAN_S:
            raise BenchError(
                f"--prove-rate {p.request_rate:g} with {p.requests} requests: the arrivals alone "
                f"last {p.requests / p.request_rate:,.0f} s; a proof's measurement may last at "
                f"most {MAX_SPAN_S:,.0f} s of arrivals (a higher rate or fewer requests)"
            )

    def concurrency(self, cap: int | None) -> int:
        """Requests in flight at most (what the watchdog's probe queues behind): a concurrency
        as given; an arrival rate counted as bench counts an open loop (open_loop_concurrency)."""
        p = self.point
        if p.concurrency:
            return p.concurrency
        return open_loop_concurrency(p.max_concurrency, p.requests, cap)

    def limits_text(self) -> str:
        """The limits in words."""
        t = self.thresholds
        return (
            f"tok/s -{t.max_tok_s_drop_pct:g}%, TTFT p95 +{t.max_ttft_p95_rise_pct:g}%, "
            f"TPOT p95 +{t.max_tpot_p95_rise_pct:g}%, errors <= {t.max_errors}"
        )

    def to_dict(self) -> dict[str, Any]:
        """Serialize for --json and the journal."""
        return {
            "point": self.point.to_dict(),
            "thresholds": self.thresholds.to_dict(),
            "unleased": self.unleased,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Proving:
        """Rebuild from to_dict() output."""
        return cls(
            LoadPoint.from_dict(data.get("point") or {}),
            Thresholds.from_dict(data.get("thresholds") or {}),
            bool(data.get("unleased", False)),
        )


@dataclass(frozen=True)
class Proof:
    """A run's proof: what it measures at, the engine before the change and after, the verdict
    (after and verdict once measure-after ran)."""

    proving: Proving
    before: Measurement
    after: Measurement | None = None
    verdict: Verdict | None = None

    @property
    def regressed(self) -> bool:
        """True when the verdict is in and failed."""
        return self.verdict is not None and not self.verdict.ok

    def to_dict(self) -> dict[str, Any]:
        """Serialize for --json, the journals and the audit (after, verdict only once known)."""
        data = {"proving": self.proving.to_dict(), "before": self.before.to_dict()}
        if self.after is not None:
            data["after"] = self.after.to_dict()
        if self.verdict is not None:
            data["verdict"] = self.verdict.to_dict()
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Proof:
        """Rebuild from to_dict() output."""
        after, verdict = data.get("after"), data.get("verdict")
        return cls(
            Proving.from_dict(data["proving"]),
            Measurement.from_dict(data["before"]),
            Measurement.from_dict(after) if isinstance(after, dict) else None,
            Verdict.from_dict(verdict) if isinstance(verdict, dict) else None,
        )


ProofReporter = Callable[[Proof], None]  # told of the proof as soon as measure-before ends


def add_prove_steps(plan: Plan, proving: Proving, head: str) -> None:
    """Insert measure-before ahead of the write and measure-after behind the checks; refuse a
    point that bench would refuse at the cap before or after the change (ProbeWouldTrip)."""
    wd_note = f"at {proving.point.text()}, under a watchdog lease when it would queue the probe"
    at = next(i for i, s in enumerate(plan.steps) if s.name is StepKind.WRITE)
    before = plan.add(StepKind.MEASURE, f"measure the running engine {wd_note}", [head])
    plan.steps.remove(before)
    plan.steps.insert(at, before)
    after = plan.add(
        StepKind.PROVE,
        f"measure the new engine at the same point; keep the change only if the gate passes "
        f"({proving.limits_text()}), else roll back",
        [head],
    )
    plan.steps.remove(after)
    plan.steps.insert(next(i for i, s in enumerate(plan.steps) if s.name is StepKind.VERIFY) + 1,
                      after)  # fmt: skip


def add_resumed_proof(plan: Plan, proving: Proving, head: str) -> None:
    """A change found in place by a resumed rollout: measure-after joins the plan (behind the
    checks, when the plan holds them), proven against the measurement saved before the change."""
    after = plan.add(
        StepKind.PROVE,
        f"measure the engine at the point measured before the change; keep it only if the gate "
        f"passes ({proving.limits_text()}), else roll it back",
        [head],
    )
    later = [i for i, s in enumerate(plan.steps) if s.name in (StepKind.BUDGET, StepKind.RELEASE)]
    if later:
        plan.steps.remove(after)
        plan.steps.insert(later[0], after)


def prove_refusal(
    plan: Plan, proving: Proving, probe: Any, pause_file: str | None
) -> SparkOpsError | None:
    """The refusal bench would make of this point at the engine's cap before and after."""
    named = []
    for label, knobs in (("before", plan.facts.knobs_before), ("after", plan.facts.knobs_after)):
        cap = cap_of(knobs)
        load = plan_load([proving.concurrency(cap)], cap, probe, pause_file,
                         unleased=proving.unleased)  # fmt: skip
        named.append((f"the engine {label} the change", load))
    return refusal_of(named, before="anything changed")


async def _measure(ex: Execution, knobs: dict[str, Any] | None) -> Measurement:
    """One measurement at the point, held as bench holds a level (a lease of this run's)."""
    proving = ex.opts.prove
    assert proving is not None
    op = ex.op
    wd = op.cluster.watchdog
    leases = Leases(op, ex.journal.run)  # its own: ending it never ends the restart's lease
    point = proving.point
    cap = cap_of(knobs)
    at_once = proving.concurrency(cap)
    guard = LoadGuard(  # its lease covers every request of the point, not one round of it
        leases, wd.probe, cap, math.ceil(point.requests / at_once),
        unleased=proving.unleased, journal=ex.journal, begun=True,
    )  # fmt: skip
    span = point.requests / point.request_rate if point.request_rate else 0.0
    endpoint = Endpoint(await op.api_url(), model=op.cluster.engine.model)
    try:
        async with guard.level(at_once, [], span):
            return await measure(endpoint, proving.point)
    finally:
        await leases.end_all()
        for text in leases.notes:
            ex.leases.note(text)


def measurement_text(m: Measurement) -> str:
    """One line: the figures a gate compares."""

    def fig(v: float | None, unit: str) -> str:
        """A figure or a dash."""
        return "–" if v is None else f"{v:.1f}{unit}"

    return (
        f"{fig(m.tok_s, ' tok/s')}, TTFT p95 {fig(m.ttft_p95_ms, ' ms')}, "
        f"TPOT p95 {fig(m.tpot_p95_ms, ' ms')}, {m.errors} error(s)"
    )


async def measure_before(ex: Execution, kind: StepKind) -> Done:
    """Measure the running engine at the point (a failure stops the run: nothing is written)."""
    m = await _measure(ex, ex.plan.facts.knobs_before)
    ex.out.proof = Proof(_proving(ex), m)
    if ex.on_proof is not None:  # the rollout journals it before anything is written
        ex.on_proof(ex.out.proof)
    return Done(measurement_text(m), journal={"measurement": m.to_dict()})


async def measure_after(ex: Execution, kind: StepKind) -> Done:
    """Measure the new engine at the same point and prove it; a failed gate raises Regressed."""
    proving = _proving(ex)
    proof = ex.out.proof
    assert proof is not None  # measure-before ran, or a resumed rollout gave its saved one
    before = proof.before
    failed: str | None = None
    try:
        after = await _measure(ex, ex.plan.facts.knobs_after)
    except SparkOpsError as exc:  # unreachable, refused: the gate fails with the reason
        failed = exc.message
        after = Measurement(None, None, None, None, point=proving.point)
    verdict = prove(before, after, proving.thresholds)
    if failed is not None:
        verdict.problems.append(f"the measurement after the change failed: {failed}")
    ex.out.proof = replace(proof, after=after, verdict=verdict)
    attach = {"measurement": after.to_dict(), "verdict": verdict.to_dict()}
    if verdict.ok:
        return Done(f"{measurement_text(after)}; gate passed: kept", journal=attach)
    await ex.journal.note(kind.value, "failed", **attach)
    why = "; ".join(line.strip() for line in verdict.lines()[1:])
    error = Regressed(
        f"the change regressed at {proving.point.text()}: {why}; rolling back",
        hint="the verdict table shows before and after side by side",
    )
    error.proof = ex.out.proof
    raise error


def _proving(ex: Execution) -> Proving:
    """The run's --prove options (the step is planned only with them)."""
    assert ex.opts.prove is not None
    return ex.opts.prove


def regressed(proof: Proof | None) -> bool:
    """True when a run's proof holds a failed verdict."""
    return proof is not None and proof.regressed
