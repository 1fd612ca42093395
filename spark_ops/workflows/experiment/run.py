"""`spark-ops experiment`: apply each configuration, sweep it, compare them, restore the start.

One Operation (one cluster lock) covers the whole run. Progress is kept in a local state file,
written atomically after each configuration, so that an interrupted experiment can be resumed
without redoing finished configurations. The comparison across configurations and its reading
(`read_experiment`) are pure functions of the sweep results.
"""

from __future__ import annotations

import asyncio
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spark_ops import audit
from spark_ops.bench.sweep import SweepConfig, SweepResult, run_sweep
from spark_ops.errors import Interrupted, OverBudget, SparkOpsError, VerifyError
from spark_ops.log import get_logger
from spark_ops.recipe import Change, render_recipe, rendered_knobs
from spark_ops.watchdog.identify import stamp_json, stamps_json, stamps_text
from spark_ops.workflows.converge import effective_args
from spark_ops.workflows.disruption import Leases
from spark_ops.workflows.execute import execute
from spark_ops.workflows.experiment.reading import ExperimentReading
from spark_ops.workflows.experiment.state import (
    REASON,
    ExperimentState,
    Hook,
    changes_for,
    label,
    now_iso,
)
from spark_ops.workflows.facts import BudgetGate
from spark_ops.workflows.gate import next_slot, spent_sentence
from spark_ops.workflows.journal import RunJournal
from spark_ops.workflows.loadguard import LoadGuard
from spark_ops.workflows.operation import ApplyOptions, Operation, jsonable
from spark_ops.workflows.plan import OperationKind
from spark_ops.workflows.plans import plan_apply
from spark_ops.workflows.probe_load import cap_of, plan_load


@dataclass
class Hooks:
    """Callbacks the CLI gives to show progress (each optional)."""

    on_config: Hook | None = None  # (index, total, label, restart: bool)
    on_step: Hook | None = None
    on_event: Hook | None = None
    on_level: Hook | None = None
    on_note: Hook | None = None

    def note(self, text: str) -> None:
        """Pass a one-line note on."""
        if self.on_note is not None:
            self.on_note(text)


@dataclass
class ApplySettings:
    """How each configuration is applied (same meaning as apply's options)."""

    drain: bool = True
    drain_timeout_s: float = 120.0
    deadline_s: float | None = None
    force: bool = False
    over_budget: bool = False  # restart even when the watchdog's budget has no slot left
    unleased_load: bool = False  # run a level that starves the watchdog's probe without a lease


async def current_knobs(op: Operation) -> dict[str, Any]:
    """The recipe's knob values on the head; kv_cache_memory as written (e.g. '60G')."""
    texts = await op.read_recipes()
    text = texts.get(op.cluster.head.name, next(iter(texts.values())))
    rendered = render_recipe(text, source=op.cluster.recipe.path)  # once, for both readings
    knobs = jsonable(rendered_knobs(rendered))
    kv = rendered.args().get("--kv-cache-memory-bytes")
    return {**knobs, "kv_cache_memory": kv if isinstance(kv, str) else None}


async def _stamps(op: Operation) -> tuple[int, list[float]]:
    """Used restarts and the stamps in the window, as the head sees them."""
    view = await op.watchdog.budget()
    return view.used, sorted(float(s["stamp"]) for s in view.stamps)


async def _apply(
    op: Operation, changes: list[Change], settings: ApplySettings, hooks: Hooks, reason: str
) -> dict[str, Any]:
    """Plan and execute one apply; a failed boot or check raises; returns what it did."""
    opts = ApplyOptions(
        changes=changes, force=settings.force, drain=settings.drain,
        drain_timeout_s=settings.drain_timeout_s, deadline_s=settings.deadline_s, reason=reason,
        command="spark-ops experiment --resume", over_budget=settings.over_budget,
    )  # fmt: skip
    plan = await plan_apply(op, opts)
    if not plan.steps:  # the recipe holds it and the engine runs it (convergence by state)
        return {"restarted": False, "knobs": plan.facts.knobs_after}
    outcome = await execute(op, plan, opts, on_step=hooks.on_step, on_event=hooks.on_event)
    if not plan.restarts:  # only a dead run finished
        return {"restarted": False, "knobs": plan.facts.knobs_after}
    bad = [c for c in outcome.checks if not c.ok]
    if bad:
        raise VerifyError(
            f"after the restart, check {bad[0].name} on {bad[0].host} failed: {bad[0].detail}",
            hint="the engine does not run the configuration asked for; fix it, then --resume",
        )
    return {
        "restarted": True,
        "knobs": plan.facts.knobs_after,
        "stamp": stamp_json(outcome.stamp),
        "pruned": stamps_json(outcome.pruned),
        "boot_s": outcome.boot.total_s if outcome.boot is not None else None,
    }


async def _run_config(
    op: Operation, state: ExperimentState, config: dict[str, Any], settings: ApplySettings,
    hooks: Hooks, secrets: dict[str, Any],
) -> dict[str, Any]:  # fmt: skip
    """Apply one configuration, sweep it, check the budget is as before."""
    used_before, before = await _stamps(op)
    reason = f"{REASON}: {label(config)})"
    applied = await _apply(op, changes_for(config), settings, hooks, reason)
    sweep_opts = {k: v for k, v in state.spec.sweep.items() if k != "prompts_path"}
    prompts = state.spec.sweep.get("prompts_path")
    cfg = SweepConfig(
        base_url=await op.api_url(), knobs=applied["knobs"],
        prompts_path=Path(prompts) if prompts else None, **sweep_opts, **secrets,
    )  # fmt: skip
    result = await _leased_sweep(op, cfg, settings, hooks)
    used_after, after = await _stamps(op)
    new = sorted(set(after) - set(before))
    if new:
        hooks.note(f"new restart stamp(s) {new} appeared during {label(config)} (not ours: kept)")
    return {
        "label": label(config),
        "knobs": config,
        "apply": applied,
        "budget": {"used_before": used_before, "used_after": used_after, "new_stamps": new},
        "budget_as_before": not new,
        "sweep": result.to_dict(),
        "finished_at": now_iso(),
    }


async def _leased_sweep(
    op: Operation, cfg: SweepConfig, settings: ApplySettings, hooks: Hooks
) -> SweepResult:
    """Sweep one configuration; a level that would starve the watchdog's probe runs under a lease
    of its own journal run (ended on every way out), or is refused (probe_load.py)."""
    cap = cap_of(cfg.knobs)
    wd = op.cluster.watchdog
    plan = plan_load(cfg.levels, cap, wd.probe, wd.pause_file, unleased=settings.unleased_load)
    journal = RunJournal(op, OperationKind.EXPERIMENT_LOAD, "spark-ops experiment")
    await journal.intent(
        detail={"knobs": cfg.knobs, "levels": list(cfg.levels), "load": plan.record()}
    )
    leases = Leases(op, journal.run)
    guard = LoadGuard(
        leases, wd.probe, cap, cfg.repeats, unleased=settings.unleased_load,
        on_note=hooks.note, journal=journal, begun=True, plan=plan,
    )  # fmt: skip
    outcome = "failed"
    try:
        result = await run_sweep(cfg, on_level=hooks.on_level, guard=guard.level)
        outcome = "ok"
        return result
    finally:
        await leases.end_all()
        for text in leases.notes:
            hooks.note(text)
        await journal.end(audit.make_entry(OperationKind.EXPERIMENT_LOAD, outcome=outcome))


@dataclass
class ExperimentOutcome:
    """How the run ended: the state (results, restore), the reading, the budget at both ends."""

    state: ExperimentState
    reading: ExperimentReading
    budget_before: dict[str, Any]
    budget_after: dict[str, Any] | None
    interrupted: bool = False
    failure: SparkOpsError | None = None

    @property
    def ok(self) -> bool:
        """True when every configuration was measured and the restore (if asked) worked."""
        restored = self.state.restore is None or self.state.restore.get("ok", False)
        return self.state.status == "finished" and restored

    def to_dict(self) -> dict[str, Any]:
        """Serialize for --json."""
        return {
            "ok": self.ok,
            "status": self.state.status,
            "interrupted": self.interrupted,
            "error": self.failure.to_dict() if self.failure else None,
            "budget_before": self.budget_before,
            "budget_after": self.budget_after,
            "state": self.state.to_dict(),
            "reading": self.reading.to_dict(),
            "downtime": {
                "restarts": self.state.restarts_done(),
                "boot_s": self.state.downtime_s(),
                "predicted": sorted(self.state.spec.predicted()),
            },
            "confirmations": [
                {"predicted_from": base, **c.to_dict()} for base, c in self.state.confirmations()
            ],
        }


async def run_experiment(
    op: Operation, state: ExperimentState, path: Path, *, settings: ApplySettings | None = None,
    hooks: Hooks | None = None, secrets: dict[str, Any] | None = None,
) -> ExperimentOutcome:  # fmt: skip
    """Run every unfinished configuration, then restore (also after a failure or Ctrl-C)."""
    settings = settings or ApplySettings()
    hooks = hooks or Hooks()
    log = get_logger(cluster=state.spec.cluster, op="experiment")
    if state.in_progress:
        hooks.note(f"the previous run was killed while applying {state.in_progress}")
    # under the lock no other experiment runs: a stamp of ours in the window is a leftover of a
    # killed run (every restart of ours is pruned by apply, or at the end of an interrupted run)
    await _prune_leftovers(op, [], hooks)
    used, stamps = await _stamps(op)
    budget_before: dict[str, Any] = {"used": used, "stamps": stamps}
    state.status, state.error, state.restore = "running", None, None
    state.save(path)
    failure: SparkOpsError | None = None
    interrupted = False
    configs = state.spec.measured()
    try:
        for i, config in enumerate(configs, 1):
            name = label(config)
            if name in state.results:
                hooks.note(f"{name}: measured in an earlier run; skipped")
                continue
            if hooks.on_config is not None:
                hooks.on_config(i, len(configs), name)
            state.in_progress = name
            state.save(path)
            state.results[name] = await _run_config(
                op, state, config, settings, hooks, secrets or {}
            )
            state.in_progress = None
            state.save(path)
            log.info("experiment_config_done", config=name)
        if state.spec.confirm:
            await _confirm(op, state, path, settings, hooks, secrets or {})
        state.status = "finished"
    except (asyncio.CancelledError, KeyboardInterrupt, Interrupted):  # Interrupted: inside an apply
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            task.uncancel()
        interrupted = True
        state.status = "interrupted"
        state.error = {"error": "Interrupted", "message": "interrupted by the operator"}
    except Exception as exc:  # any failure still ends in the restore
        failure = (
            exc if isinstance(exc, SparkOpsError) else SparkOpsError(f"{type(exc).__name__}: {exc}")
        )
        state.status = "failed"
        state.error = failure.to_dict()
    refused_at = state.in_progress
    state.save(path)
    if state.spec.restore:
        state.restore = await _restore(op, state, settings, hooks)
        state.save(path)
    if isinstance(failure, OverBudget):  # "nothing was changed" is true of one apply, not the run
        failure = midway_refusal(state, failure, refused_at)
        state.error = failure.to_dict()
        state.save(path)
    budget_after: dict[str, Any] | None
    try:
        await _prune_leftovers(op, budget_before["stamps"], hooks)
        state.in_progress = None  # handled: only a killed run leaves it set
        state.save(path)
        used, stamps = await _stamps(op)
        budget_after = {"used": used, "stamps": stamps}
    except SparkOpsError:
        budget_after = None
    return ExperimentOutcome(
        state, state.reading(), budget_before, budget_after, interrupted, failure
    )


async def _prune_leftovers(op: Operation, keep: list[float], hooks: Hooks) -> list[float]:
    """Prune stamps of our own restarts that an interruption left (before their own prune)."""
    view = await op.watchdog.budget()
    ours = [
        float(s["stamp"])
        for s in view.stamps
        if float(s["stamp"]) not in keep and str(s.get("reason", "")).startswith(REASON)
    ]
    if not ours:
        return []
    result = await op.watchdog.prune(stamps=ours, reason=f"{REASON}: left by an interruption)")
    removed = [float(x) for x in result["removed_stamps"]]
    hooks.note(
        f"pruned {stamps_text(removed)}: restart stamp(s) of this experiment left by an "
        "interruption"
    )
    return removed


async def _restore(
    op: Operation, state: ExperimentState, settings: ApplySettings, hooks: Hooks
) -> dict[str, Any]:
    """Put the starting knob values back (one more planned restart when they differ)."""
    start = {a: state.start_knobs.get(a) for a in state.spec.axes}
    hooks.note(f"restoring the starting configuration: {label(start)} (Ctrl-C again abandons it)")
    try:
        done = await _apply(op, changes_for(start), settings, hooks, f"{REASON}: restore)")
    except (asyncio.CancelledError, KeyboardInterrupt, Interrupted):
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            task.uncancel()  # what runs now is still read (a second Ctrl-C abandons that too)
        return {
            "ok": False, "knobs": start, "error": "interrupted during the restore",
            "command": apply_command(start), **await standing_now(op, list(start)),
        }  # fmt: skip
    except OverBudget as exc:  # refused before anything was written: the start is not back
        return {
            "ok": False, "knobs": start, "refused": True, "budget": exc.budget,
            "error": f"its restart was refused too: {spent_sentence(exc.gate)}"
            if isinstance(exc.gate, BudgetGate) else exc.message,
            "command": apply_command(start),
        }  # fmt: skip
    except Exception as exc:  # reported, never raised: the run's own outcome comes first
        return {
            "ok": False, "knobs": start, "error": getattr(exc, "message", str(exc)),
            "command": apply_command(start), **await standing_now(op, list(start)),
        }  # fmt: skip
    return {
        "ok": True,
        "knobs": start,
        "restarted": done["restarted"],
        "pruned": done.get("pruned"),
        "boot_s": done.get("boot_s"),
    }


async def standing_now(op: Operation, axes: list[str]) -> dict[str, Any]:
    """After a restore that failed: the values the recipe holds now and what the engine runs
    (`engine_now`: up, and its effective values of the axes, or None when its log names none);
    whatever cannot be read is said, never raised."""
    out: dict[str, Any] = {}
    try:
        knobs = await current_knobs(op)
        out["recipe_now"] = {a: knobs.get(a) for a in axes}
    except Exception as exc:  # reported: the restore's failure comes first
        out["recipe_now"] = {"error": getattr(exc, "message", str(exc))}
    try:
        await op.api_url()
        async with op.engine(timeout=5) as api:
            up = await api.health()
    except Exception:  # an engine that does not answer is what is reported
        up = False
    args = await effective_args(op.session)
    engine: dict[str, Any] = {"up": bool(up), "knobs": None}
    if args is not None:
        named = {k.lstrip("-").replace("-", "_"): v for k, v in args.items()}
        engine["knobs"] = {
            a: named.get(a, named.get(f"{a}_bytes")) for a in axes
        }  # kv_cache_memory is the engine's kv_cache_memory_bytes
    out["engine_now"] = engine
    return out


def apply_command(knobs: dict[str, Any]) -> str:
    """The `spark-ops apply` that sets these knob values, quoted for the operator's local shell (a
    value vLLM defaults is left out)."""
    words = ["spark-ops", "apply"]
    for key, value in knobs.items():
        if value is None:
            continue
        if key == "enforce_eager":
            words.append("--enforce-eager" if value else "--no-enforce-eager")
        else:
            words += [f"--{key.replace('_', '-')}", str(value)]
    return shlex.join(words)


def midway_refusal(state: ExperimentState, refused: OverBudget, at: str | None) -> OverBudget:
    """A restart refused by the budget after the experiment changed the cluster: what it changed,
    where the recipe stands, when the next slot frees, and the ways on (`--over-budget`)."""
    gate = refused.gate
    applied = [name for name, r in state.results.items() if (r.get("apply") or {}).get("restarted")]
    restore = state.restore
    start = label({a: state.start_knobs.get(a) for a in state.spec.axes})
    if not applied:
        changed = "this run changed nothing (no configuration was applied)"
    else:
        changed = (
            f"this run applied {', then '.join(applied)} (restarted, its stamp pruned each time)"
        )
        if restore is None:
            changed += f"; the recipe holds {applied[-1]} (--no-restore)"
        elif restore.get("ok"):
            changed += f"; the starting configuration ({start}) is back"
        else:
            why_not = "its restart was refused too" if restore.get("refused") else restore["error"]
            changed += (
                f"; the recipe and the engine hold {applied[-1]}: the starting configuration "
                f"({start}) was not put back ({why_not})"
            )
    if isinstance(gate, BudgetGate):
        why, slot = spent_sentence(gate), f"once the next slot frees, {next_slot(gate)},"
    else:
        why, slot = refused.message, "later"
    back = ""
    if restore is not None and restore.get("refused"):
        back = (
            f"; to put the starting configuration back: `{restore['command']}` {slot} or now "
            "with --over-budget"
        )
    return OverBudget(
        f"the restart for {at or 'the next configuration'} was refused: {why}. {changed[0].upper()}"
        f"{changed[1:]}",
        budget=gate,
        hint=f"`spark-ops experiment --resume` continues {slot.rstrip(',')}; or `spark-ops "
        "experiment --resume --over-budget` now, knowing a failed boot then stays down until "
        f"someone restarts it{back}",
    )


async def _confirm(
    op: Operation, state: ExperimentState, path: Path, settings: ApplySettings, hooks: Hooks,
    secrets: dict[str, Any],
) -> None:  # fmt: skip
    """--confirm: when the recommended configuration was predicted, restart with it and sweep."""
    winner = state.reading().recommended
    predicted = state.spec.predicted()
    if winner is None or winner not in predicted or winner in state.results:
        hooks.note(f"--confirm: the recommendation ({winner}) was measured; no restart needed")
        return
    config = next(c for c in state.spec.every_configuration() if label(c) == winner)
    hooks.note(f"--confirm: restarting with the predicted winner {winner} to measure it")
    if hooks.on_config is not None:
        hooks.on_config(len(state.spec.measured()) + 1, len(state.spec.measured()) + 1, winner)
    state.in_progress = winner
    state.save(path)
    state.results[winner] = await _run_config(op, state, config, settings, hooks, secrets)
    state.results[winner]["confirmed"] = True
    state.in_progress = None
    state.save(path)


__all__ = [
    "ApplySettings",
    "ExperimentOutcome",
    "Hooks",
    "current_knobs",
    "run_experiment",
]
