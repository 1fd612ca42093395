"""What stands between a plan and its execution: the restart budget, and "the plan shown is run".

The budget gate: a planned restart is refused while the watchdog's restart budget has no slot
left (used >= allowed in its window, as the history's `budget` computes it), because if that
boot failed the watchdog could not restart the engine. `--over-budget` lets it through, and the
plan, its JSON and the run's journal say so. The rule and its reason: docs/watchdog.md.

The plan check: the CLI plans without the cluster lock, shows the plan, asks, then takes the lock
and plans again; `plan_differences` lists what differs between the two (recipe copies, steps,
knobs, the engine instance, the budget, warnings). Any difference refuses the run (PlanChanged):
the CLI executes exactly the plan it showed.
"""

from __future__ import annotations

import datetime as dt
import math
import re
from collections.abc import Sequence
from typing import Any

from spark_ops.engine.identity import EngineReading
from spark_ops.engine.instance import stop_hint
from spark_ops.engine.ranks import ambiguous_hint, ambiguous_words, rank_warning, rank_words
from spark_ops.errors import ExitStatus, OverBudget, PlanChanged, SparkOpsError
from spark_ops.watchdog.history import budget_of
from spark_ops.workflows.facts import BudgetGate, EngineFact, Gate, UnreadableBudget
from spark_ops.workflows.operation import ApplyOptions, Operation
from spark_ops.workflows.plan import Plan, PlanFacts, StepKind, as_json

# Warnings on unfinished runs say whether the plan was made under the lock: compared as facts.
UNFINISHED_MARK = " did not finish; last recorded: "


def in_words(seconds: float) -> str:
    """A wait as a person reads it: "47 min", "2 h 5 min", "less than a minute"."""
    if seconds < 60:
        return "less than a minute"
    minutes = math.ceil(seconds / 60)
    hours, rest = divmod(minutes, 60)
    if not hours:
        return f"{minutes} min"
    return f"{hours} h {rest} min" if rest else f"{hours} h"


def next_slot(budget: BudgetGate) -> str:
    """When the next restart slot frees, relative and in UTC: "in 47 min (at 03:12 UTC)"."""
    wait = float(budget.next_free_at) - float(budget.now)
    at = dt.datetime.fromtimestamp(float(budget.next_free_at), dt.timezone.utc)
    return f"in {in_words(wait)} (at {at:%H:%M} UTC)"


async def read_gate(op: Operation, over_budget: bool, settled: Sequence[float] = ()) -> Gate:
    """The budget a planned restart meets, as the history's own `budget` computes it.

    No slot left is used >= allowed (the watchdog's rule, WatchdogContract.budget). `settled`:
    stamps this run removes before its restart (left by dead runs): the window is counted again
    without them, by the history's own `budget_of`. A budget that cannot be read is kept as its
    error and refused alike (the restart's stamp could not be pruned).
    """
    try:
        view = await op.watchdog.budget()
    except SparkOpsError as exc:
        return UnreadableBudget(exc.message, over_budget)
    stamps = [float(s["stamp"]) for s in view.stamps]
    gone = [s for s in stamps if any(abs(s - x) < 1e-6 for x in settled)]
    counted = budget_of(
        [s for s in stamps if s not in gone],
        allowed=view.allowed,
        window=view.window_s,
        now=view.now,
    )
    return BudgetGate(
        used=counted["used"],
        allowed=view.allowed,
        remaining=counted["remaining"],
        window_s=view.window_s,
        now=view.now,
        next_free_at=counted["next_free_at"],
        history_file=view.history_file,
        spent=counted["over_budget"],
        settled=len(gone),  # left by dead runs, removed first: not counted
        over_budget_given=over_budget,
        limits_source=view.limits_source,  # the watchdog's own max / window, when readable
        inventory_disagrees=view.disagreement or None,
    )


def spent_sentence(gate: BudgetGate) -> str:
    """What a spent budget means for a restart, and when the next slot frees (one sentence)."""
    mine = f", not counting {gate.settled} left by unfinished runs" if gate.settled else ""
    whose = f"; {gate.inventory_disagrees}" if gate.inventory_disagrees else ""
    return (
        f"the watchdog's restart budget is spent: {gate.used}/{gate.allowed} restarts in "
        f"the last {float(gate.window_s) / 3600:g} h{mine} (history {gate.history_file}"
        f"{whose}); if this restart's boot failed, the watchdog could not restart the engine. "
        f"The next slot frees {next_slot(gate)}"
    )


def gate_refusal(gate: Gate | None, *, ignore_option: bool = False) -> OverBudget | None:
    """The refusal a restart meets at this budget, or None (a slot left, or --over-budget)."""
    if gate is None or (gate.over_budget_given and not ignore_option):
        return None
    if isinstance(gate, UnreadableBudget):
        return OverBudget(
            f"the restart budget cannot be read ({gate.error}): the restart's stamp could not "
            "be pruned, nor a failed boot restarted by the watchdog; nothing was changed",
            budget=gate,
            hint="fix the history first (`spark-ops doctor`), or pass --over-budget",
        )
    if not gate.spent:
        return None
    return OverBudget(
        f"{spent_sentence(gate)}; nothing was changed",
        budget=gate,
        hint="wait for the slot; or remove planned stamps left by earlier runs (`spark-ops "
        "budget` shows them, `spark-ops budget prune --planned` removes them); or pass "
        "--over-budget to restart anyway, knowing a failed boot then stays down until someone "
        "restarts it",
    )


class BootWouldFail(SparkOpsError):
    """A restart refused before anything is written: a check doctor makes says its boot would fail
    (a worker's Ray worker down, a worker unreachable, a worker's rank of an earlier engine, a dead
    engine's processes on the head)."""

    exit_status = ExitStatus.CHECK_FAILED


async def missing_workers(op: Operation) -> list[str]:
    """Workers whose Ray worker cannot be up: no SSH answer, or the worker check says not running.

    The check (`engine.worker_check`, default `pgrep -x raylet`) counts only when it exits 1, its
    "no such process"; any other failure (not installed, no permission) leaves the node unknown,
    never wrongly named missing. Doctor's ray-worker check, the plan's worker gate and the boot
    watch's missing workers read the same answer.
    """
    engine = op.cluster.engine
    names = [n.name for n in op.cluster.workers]
    check = engine.worker_check or "true"
    results = await op.session.run_all(check, names, check=False, timeout=5)
    missing = []
    for host, res in results.items():
        if isinstance(res, SparkOpsError):
            missing.append(f"{host} (no SSH answer)")
        elif engine.worker_check and engine.worker_down(res.exit_code):
            missing.append(f"{host} (`{check}` exited 1: its {engine.worker_part} is not running)")
    return missing


async def check_workers(op: Operation, plan: Plan) -> None:
    """Refuse a restart whose boot would wait for a missing worker (doctor's ray-worker check)."""
    missing = await missing_workers(op)
    if not missing:
        return
    names = [m.split(" ", 1)[0] for m in missing]
    raise BootWouldFail(
        f"the restart would fail: a tensor-parallel boot needs every worker, and "
        f"{'; '.join(missing)}; nothing was written and the engine was not restarted",
        hint=f"start the {op.cluster.engine.worker_part} on {', '.join(names)} (the launcher's "
        "container, e.g. `docker ps -a`, `docker logs vllm_node`), check with `spark-ops "
        "doctor`, then run the command again",
    )


def check_ranks(plan: Plan, reading: EngineReading) -> None:
    """Refuse a restart whose new rank would start beside an earlier engine's rank (doctor's
    engine-leftovers on the workers): one that outlived a restart of the running engine holds
    its share of the node's memory, the launcher did not stop it, and vLLM refuses to start a
    rank with less free memory than its own gpu_memory_utilization share. With the head's engine
    down, the ranks it left are only named (the restart's launcher may stop them). Judged from
    the plan's one reading of the engine (engine.identity.read_engine), as check_leftovers."""
    try:
        left = reading.rank_leftovers()
    except SparkOpsError:
        return  # the head's engine unknown: no rank can be told from it
    stray = left.stray()
    plan.warnings.extend(
        f"ranks on {n} not checked: {why}" for n, why in left.nodes.items() if isinstance(why, str)
    )
    if stray and not left.engine_running:
        plan.warnings.extend(rank_warning(n, p) for n, p in stray.items())
    elif stray or left.ambiguous:
        words = [rank_words(n, p) for n, p in stray.items()]
        words += [ambiguous_words(n, p) for n, p in left.ambiguous.items()]
        hints = [f"on {n}: {stop_hint(p)}" for n, p in stray.items()]
        hints += [ambiguous_hint(n, p) for n, p in left.ambiguous.items()]
        why = (
            "it outlived the engine's last restart and holds its share of the node's memory, so"
            if stray
            else "the one that is not the engine's holds its share of the node's memory, so"
        )
        raise BootWouldFail(
            f"the restart would fail: {'; '.join(words)}; {why} "
            "the new rank started beside it would find less free than it asks (vLLM refuses that "
            "start); nothing was written and the engine was not restarted",
            hint="stop it: "
            + "; ".join(hints)
            + "; check with `spark-ops doctor`, then run the command again",
        )


def check_leftovers(op: Operation, reading: EngineReading) -> None:
    """Refuse a restart while the head's dead engine left processes (doctor's failing
    engine-leftovers check): they hold memory (GPU memory on a real node) into the next boot,
    which then fails. Ranks left on the workers (an engine without Ray) are warned about apart
    (check_ranks). A head whose processes cannot be read refuses nothing."""
    try:
        instance, own, _ = reading.leftovers()
    except SparkOpsError as exc:
        op.log.warning("engine leftovers not checked", error=exc.message)
        return
    if not own or instance is None:
        return
    head = op.cluster.head.name
    stop = stop_hint(own)
    names = ", ".join(f"pid {p.pid} ({p.name})" for p in own)
    raise BootWouldFail(
        f"the restart would fail: the engine ({instance.label()}) on {head} is dead and its "
        f"processes still run there: {names}; they hold memory into the next boot, so nothing "
        "was written and the engine was not restarted",
        hint=f"stop them on {head}: `spark-ops exec --nodes {head} -- {stop}`; check with "
        "`spark-ops doctor` (engine-leftovers), then run the command again",
    )


async def check_budget(
    op: Operation, opts: ApplyOptions, plan: Plan, reading: EngineReading
) -> None:
    """Record in a restart's plan the budget it meets and the engine it replaces (as read)."""
    gate = await read_gate(op, opts.over_budget, plan.facts.left_stamp_values or ())
    plan.facts.budget = gate
    if isinstance(gate, BudgetGate) and gate.inventory_disagrees:
        plan.warnings.append(gate.inventory_disagrees)
    if opts.over_budget and gate_refusal(gate, ignore_option=True) is not None:
        plan.warnings.append(over_budget_warning(gate))
    inst = None if isinstance(reading.instance, SparkOpsError) else reading.instance
    plan.facts.engine = None if inst is None else EngineFact(inst.key, inst.alive)


def over_budget_warning(gate: Gate) -> str:
    """The plan's warning when --over-budget lets a restart through (no relative time in it:
    the plan made again under the lock must read the same)."""
    if isinstance(gate, UnreadableBudget):
        why = f"the restart budget cannot be read ({gate.error})"
    else:
        at = dt.datetime.fromtimestamp(float(gate.next_free_at), dt.timezone.utc)
        why = (
            f"the watchdog's restart budget is spent ({gate.used}/{gate.allowed} in the last "
            f"{float(gate.window_s) / 3600:g} h; the next slot frees at {at:%H:%M} UTC)"
        )
    return (
        f"--over-budget given: {why}; if this boot fails, the engine stays down until someone "
        "restarts it"
    )


def budget_refusal(plan: Plan) -> OverBudget | None:
    """The refusal of a plan whose restart meets a spent (or unreadable) budget, or None."""
    if not plan.has(StepKind.RESTART):
        return None
    return gate_refusal(plan.facts.budget)


_NUMBERS = re.compile(r"\d+(?:[.:]\d+)*")


def plan_differences(shown: Plan, now: Plan) -> list[str]:
    """What differs between the plan shown to the operator and the one made under the lock."""
    out: list[str] = []
    before = {(c.host, c.path): c for c in shown.changes}
    after = {(c.host, c.path): c for c in now.changes}
    for key in sorted(set(before) | set(after)):
        a, b = before.get(key), after.get(key)
        where = f"{key[0]}:{key[1]}"
        if a is None or b is None:
            out.append(f"{where}: {'no longer' if b is None else 'now'} to be written")
        elif a.old_sha != b.old_sha:
            out.append(f"{where}: the recipe changed (sha256 {a.old_sha[:12]} -> {b.old_sha[:12]})")
        elif a.diff != b.diff:
            out.append(f"{where}: the change to write differs")
    steps_a = [(s.name, s.description) for s in shown.steps]
    steps_b = [(s.name, s.description) for s in now.steps]
    if steps_a != steps_b:
        gone = [d for d in steps_a if d not in steps_b]
        new = [d for d in steps_b if d not in steps_a]
        out.extend(f"step no longer planned: {d}" for _, d in gone)
        out.extend(f"step now planned: {d}" for _, d in new)
    for fact, label, known_only in PlanFacts.compared():
        a, b = getattr(shown.facts, fact), getattr(now.facts, fact)
        if known_only and (a is None or b is None):
            continue  # not known once (the engine slow to answer): nothing to compare
        if a != b:
            out.append(f"{label}: {_short(a)} -> {_short(b)}")
    out.extend(_budget_difference(shown.facts.budget, now.facts.budget))
    # a warning is the same warning when only its figures moved (a count, a time of day): the
    # facts above and the budget rule judge those
    seen = {_NUMBERS.sub("#", w) for w in shown.warnings if UNFINISHED_MARK not in w}
    fresh = [w for w in now.warnings if UNFINISHED_MARK not in w]
    out.extend(f"new warning: {w}" for w in sorted(fresh) if _NUMBERS.sub("#", w) not in seen)
    return out


def _budget_difference(a: Gate | None, b: Gate | None) -> list[str]:
    """The budget's difference: more restarts used, or readable/spent no more (an aged-out
    stamp that only frees room is no difference)."""
    if a is None or b is None or a == b:
        return [] if (a is None) == (b is None) else ["the restart budget: read only once"]
    if not isinstance(a, BudgetGate) or not isinstance(b, BudgetGate):
        if isinstance(a, UnreadableBudget) and isinstance(b, UnreadableBudget):
            return []  # unreadable both times (another error): refused alike
        return [f"the restart budget: {_budget_text(a)} -> {_budget_text(b)}"]
    if a.allowed != b.allowed or int(b.used) > int(a.used) or (b.spent and not a.spent):
        return [f"the restart budget: {_budget_text(a)} -> {_budget_text(b)}"]
    return []


def _budget_text(gate: Gate) -> str:
    """A budget fact in a few words."""
    if isinstance(gate, UnreadableBudget):
        return f"unreadable ({gate.error})"
    return f"{gate.used}/{gate.allowed} used"


def _short(value: Any) -> str:
    """A fact as a difference line shows it, as its JSON (cut, never whole)."""
    text = repr(as_json(value))
    return text if len(text) <= 200 else text[:200] + "…"


def ensure_same(shown: Plan, now: Plan) -> None:
    """Refuse (PlanChanged) when the plan made under the lock is not the plan shown."""
    refuse_changes(plan_differences(shown, now))


def facts_differences(
    shown: dict[str, Any], now: dict[str, Any], budgets: tuple[Gate | None, Gate | None]
) -> list[str]:
    """What differs between two plans given as dicts (e.g. an experiment's), and the budgets
    their restarts meet (shown, now)."""
    out = [
        f"{key}: {_short(shown.get(key))} -> {_short(now.get(key))}"
        for key in sorted(set(shown) | set(now))
        if shown.get(key) != now.get(key)
    ]
    return out + _budget_difference(*budgets)


def replan_refused(exc: SparkOpsError) -> PlanChanged:
    """The plan made under the lock could not be made at all (the recipe copies now differ, the
    recipe no longer parses…): the cluster changed since the plan shown, and nothing runs."""
    return PlanChanged(
        "the cluster changed while the plan waited for an answer: the plan cannot be made again "
        "under the lock; nothing was changed",
        changes=[exc.message],
        hint=exc.hint or "run the command again: it shows the plan for the cluster as it is now",
    )


def refuse_changes(changes: list[str]) -> None:
    """Raise PlanChanged naming each difference; nothing when there is none."""
    if not changes:
        return
    raise PlanChanged(
        f"the cluster changed while the plan waited for an answer; the plan shown is not what "
        f"would run now ({len(changes)} difference(s)); nothing was changed",
        changes=changes,
        hint="run the command again: it shows the plan for the cluster as it is now",
    )
