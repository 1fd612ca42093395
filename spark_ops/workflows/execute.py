"""Executing a plan: one loop over a table from each kind of step to its runner.

For every step the run holds, in the table's order, the loop does the same: resolve the engine's
API where the step needs it, read what the step is judged against (`prepare`), report its start,
run it (as one atomic unit where its row says so: a signal waits for its end), report its finish
and write its journal record. A failure stops the steps that follow, except those that run on
every path out (`always`: the prune of a triggered restart's stamp, the budget report) and the
recovery of a failed boot (`recovers`: the rollback). Adding a step is one runner and one row;
docs/design.md says how.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from spark_ops import audit
from spark_ops.errors import Interrupted
from spark_ops.watchdog.identify import stamp_json, stamps_json
from spark_ops.workflows import booting, interrupt, prove, restart, steps
from spark_ops.workflows.execution import EventReporter, Execution, Row, failure_text
from spark_ops.workflows.gate import budget_refusal
from spark_ops.workflows.journal import RunJournal, write_facts
from spark_ops.workflows.operation import ApplyOptions, Operation, Outcome
from spark_ops.workflows.plan import Plan, StepKind, StepRun, StepRunner
from spark_ops.workflows.standing import standing

StepReporter = Callable[[StepRun], None]


def _restart_began(kind: StepKind) -> Callable[[Execution], bool]:
    """A prune runs once its restart started (a stamp may exist), on every path out."""
    return lambda ex: ex.began(kind)


def _restarting(ex: Execution) -> bool:
    """The budget is reported once the restart's part of the run began (drain or restart), or
    beside the checks a stopped run owed (a plan with no restart of its own)."""
    if not ex.plan.has(StepKind.RESTART):
        return True
    return bool(ex.entered & {StepKind.DRAIN, StepKind.RESTART})


def _leased(ex: Execution) -> bool:
    """The lease is ended once its step began (taken, found or half-taken), on every path out."""
    return ex.began(StepKind.LEASE)


def _not_rolled_back(ex: Execution) -> bool:
    """The checks follow the new recipe's boot, not a rollback's."""
    return not ex.out.rolled_back


# Every kind of step, in the order a run takes them; a run skips those it does not hold.
STEPS: dict[StepKind, Row] = {
    StepKind.SETTLE: Row(steps.settle, atomic=True),
    StepKind.MEASURE: Row(prove.measure_before, prepare=booting.before_disruption, fails=True),
    StepKind.WRITE: Row(steps.write, prepare=booting.before_disruption, atomic=True, engine=True),
    StepKind.LEASE: Row(steps.lease, prepare=booting.before_disruption, atomic=True),
    StepKind.DRAIN: Row(steps.drain, prepare=booting.before_disruption, engine=True),
    StepKind.RESTART: Row(
        restart.fire, prepare=booting.before_restart, atomic=True, engine=True, fails=True
    ),
    StepKind.BOOT: Row(restart.boot, fails=True),
    StepKind.PRUNE: Row(
        steps.prune,
        prepare=steps.prepare_prune,
        atomic=True,
        always=True,
        when=_restart_began(StepKind.RESTART),
    ),
    StepKind.VERIFY: Row(steps.verify, prepare=booting.before_checks, when=_not_rolled_back),
    StepKind.PROVE: Row(prove.measure_after, when=_not_rolled_back, fails=True),
    StepKind.ROLLBACK: Row(
        steps.restore,
        prepare=steps.prepare_rollback,
        atomic=True,
        recovers=steps.rollback_wanted,
    ),
    StepKind.RESTART_ROLLBACK: Row(
        restart.fire, prepare=restart.prepare_restart, atomic=True, fails=True
    ),
    StepKind.BOOT_ROLLBACK: Row(restart.boot, fails=True),
    StepKind.PRUNE_ROLLBACK: Row(
        steps.prune,
        prepare=steps.prepare_prune,
        atomic=True,
        always=True,
        when=_restart_began(StepKind.RESTART_ROLLBACK),
    ),
    StepKind.BUDGET: Row(steps.budget, always=True, when=_restarting),
    StepKind.RELEASE: Row(steps.release, atomic=True, always=True, when=_leased),
}


async def execute(
    op: Operation,
    plan: Plan,
    opts: ApplyOptions,
    *,
    on_step: StepReporter | None = None,
    on_event: EventReporter | None = None,
    on_proof: prove.ProofReporter | None = None,
    proof: prove.Proof | None = None,
) -> Outcome:
    """Run an apply or restart plan step by step: its intent first, then steps, then its end.

    The intent record is written on the head before anything changes (a failure to write it
    stops the run there); SIGINT / SIGTERM end the run after the atomic unit in progress and
    raise Interrupted, which says where the cluster stands and what converges it. `on_proof` is
    told of the proof once measure-before ends (before anything is written); `proof` is one
    measured before this run (a resumed rollout's), which measure-after proves the change against.
    """
    refused = budget_refusal(plan)  # the CLI refuses before its prompt; any other caller here
    if refused is not None:
        raise refused
    out = Outcome(plan, ok=False, proof=proof)
    journal = RunJournal(op, plan.operation, opts.command)
    await journal.intent(**intent_of(plan, opts))
    out.found.run = journal.run
    run = StepRunner(out.steps, on_step)
    ex = Execution(op, plan, opts, out, run, journal, on_event, on_proof)
    failure: BaseException | None = None
    try:
        with interrupt.listening(lambda sig: _note_where(out, sig)):
            await run_steps(ex)
    except (asyncio.CancelledError, KeyboardInterrupt):
        interrupt.absorb()
        failure = interrupted(plan, out, opts, run)
        raise failure from None
    except BaseException as exc:
        failure = exc
        raise
    finally:
        out.warnings.extend(n for n in ex.leases.notes if n not in out.warnings)  # once each
        await journal.steps(out.steps)
        try:
            entry = audit_entry(plan, opts, out, failure)
        except Exception as exc:  # an entry is written whatever went wrong: a minimal one
            entry = audit_minimal(plan, out, failure, exc)
        await journal.end(entry)
    return out


async def run_steps(ex: Execution) -> None:
    """The loop: every step the run holds, in the table's order; then the failure that stands."""
    for kind, row in STEPS.items():
        held = any(s.name == kind for s in ex.run.steps)
        if not (held or row.recovers) or not row.wanted(ex):
            continue
        try:
            await run_step(ex, kind, row)
        except BaseException as exc:  # a later failure replaces an earlier one, as in a finally
            if isinstance(exc, asyncio.CancelledError | KeyboardInterrupt):
                interrupt.absorb()  # the steps that run on every path out still run
            ex.failure = exc
    ex.out.ok = ex.failure is None and not ex.out.rolled_back
    if ex.failure is not None:
        raise ex.failure


async def run_step(ex: Execution, kind: StepKind, row: Row) -> None:
    """One step: engine, prepare, start, the runner (atomic where the row says), finish, journal."""
    if row.engine:
        await ex.op.api_url()  # before anything changes: a tunnel that fails changes nothing
    ex.entered.add(kind)
    if row.prepare is not None:
        await row.prepare(ex, kind)

    async def unit() -> None:
        """Start, run, finish and record the step."""
        ex.run.start(kind)
        attach: dict[str, Any] | None = None
        try:
            done = await row.run(ex, kind)
            attach = done.journal
            ex.run.finish(kind, done.detail, done.status)
        except BaseException as exc:
            if isinstance(exc, asyncio.CancelledError | KeyboardInterrupt):
                interrupt.absorb()  # its record below is still written
            if row.fails and ex.run.step(kind).status == "running":
                ex.run.fail(kind, failure_text(exc))
            raise
        finally:
            await ex.journal.steps(ex.run.steps, {kind: attach} if attach else None)

    await (interrupt.atomic(unit()) if row.atomic else unit())


def intent_of(plan: Plan, opts: ApplyOptions) -> dict[str, Any]:
    """The intent record's fields: what will be written where, whether a restart is triggered."""
    steps = [s.name for s in plan.steps]
    return {
        "args": _args(opts),
        "nodes": [c.host for c in plan.changes],
        "diff": "".join(c.diff for c in plan.changes),
        "detail": {
            "writes": write_facts(plan),
            "restart": StepKind.RESTART in steps,
            "steps": [str(s) for s in steps],
            "left_stamps": plan.facts.left_stamps or [],
            "budget": None if plan.facts.budget is None else plan.facts.budget.to_json(),
        },
        "settles": plan.facts.settles or [],
    }


def interrupted(plan: Plan, out: Outcome, opts: ApplyOptions, run: StepRunner) -> Interrupted:
    """The Interrupted error of a run stopped by a signal: the step, and where things stand."""
    why = f"interrupted ({interrupt.received() or 'KeyboardInterrupt'})"
    for s in out.steps:
        if s.status == "running":
            run.fail(s.name, why)
    where = out.found.interrupted_at or _where(out)
    said = standing(plan, out, opts.command or f"spark-ops {plan.operation}")
    hint = "run the same command again: it compares the engine with the recipe and finishes"
    if any(s.name is StepKind.ROLLBACK and s.status != "pending" for s in out.steps):
        hint = "the change was being rolled back: see `spark-ops status` before running it again"
    return Interrupted(f"{why} {where}", standing=said, hint=hint)


def _where(out: Outcome) -> str:
    """Where the run stands now: at the step running, or after the last one that ran."""
    running = [s.name for s in out.steps if s.status == "running"]
    if running:
        return f"at the {running[0]} step"
    began = [s.name for s in out.steps if s.status != "pending"]
    return f"after the {began[-1]} step" if began else "before the first step"


def _note_where(out: Outcome, signame: str) -> None:
    """Remember where the first signal found the run (later steps are its clean-up)."""
    if out.found.interrupted_at is None:
        out.found.interrupted_at = _where(out)


def _args(opts: ApplyOptions | None) -> dict[str, Any]:
    """The operator's arguments as the audit records them."""
    args: dict[str, Any] = {}
    for ch in opts.changes if opts is not None else ():
        args[ch.name.lstrip("-").replace("-", "_")] = "(removed)" if ch.remove else ch.value
    if opts is not None and opts.reason:
        args["reason"] = opts.reason
    if opts is not None and opts.force:
        args["force"] = True
    if opts is not None and opts.over_budget:
        args["over_budget"] = True
    if opts is not None and opts.prove is not None:
        args["prove"] = opts.prove.to_dict()
    return args


def audit_minimal(
    plan: Plan, out: Outcome, failure: BaseException | None, exc: Exception
) -> dict[str, Any]:
    """The audit entry when building the full one failed: operation, what was written, why."""
    return audit.make_entry(
        plan.operation,
        nodes=[c.host for c in plan.changes],
        outcome=f"failed: {type(failure).__name__ if failure else 'unknown'}",
        detail={"written": out.found.written or [], "entry_error": repr(exc)[:300]},
    )


def audit_entry(
    plan: Plan,
    opts: ApplyOptions | None = None,
    out: Outcome | None = None,
    failure: BaseException | None = None,
) -> dict[str, Any]:
    """The entry of an executed plan: operation, changes asked, nodes written, diffs, outcome."""
    args = _args(opts)
    if isinstance(failure, Interrupted):
        result = f"{failure.message}; " + "; ".join(failure.standing)
    elif failure is not None:
        result = f"failed: {getattr(failure, 'message', None) or failure or type(failure).__name__}"
    elif out is None:
        result = "not run"
    else:
        result = "rolled back" if out.rolled_back else "ok" if out.ok else "failed"
        bad = [c for c in out.checks if not c.ok]
        if result == "ok" and bad:
            names = ", ".join(sorted({f"{c.name}@{c.host}" for c in bad}))
            result = f"ok, checks failed: {names}"
        if out.history_problem is not None:
            result += f"; budget unknown: {out.history_problem.message}"
    detail: dict[str, Any] = {}
    if out is not None:
        detail = {"stamp": stamp_json(out.stamp), "pruned": stamps_json(out.pruned)}
        if out.proof is not None:
            detail["proof"] = out.proof.to_dict()
            if prove.regressed(out.proof) and out.rolled_back:
                result = "rolled back (regressed)"
    written = out.found.written if out is not None else None
    if written is not None:
        detail["written"] = list(written)  # what changed, even when a later step failed
    return audit.make_entry(
        plan.operation,
        args=args,
        nodes=[c.host for c in plan.changes],
        diff="".join(c.diff for c in plan.changes),
        outcome=result,
        detail=detail,
    )
