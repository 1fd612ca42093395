"""Where the cluster stands after a run stopped early: recipe, engine, stamp, checks, next command.

An interrupted run (SIGINT, SIGTERM) prints these lines and records them in its audit entry, so
that the operator who pressed Ctrl-C, and the colleague who reads `spark-ops log` later, know what
was done, what was not, and the one command that converges.
"""

from __future__ import annotations

from spark_ops.errors import ExitStatus
from spark_ops.watchdog.identify import fmt_stamp
from spark_ops.workflows.operation import Outcome
from spark_ops.workflows.plan import Plan, StepKind, StepRun


def _status(out: Outcome, kind: StepKind) -> str:
    """A step's status in the run, or "absent" when the run has no such step."""
    found: StepRun | None = next((s for s in out.steps if s.name == kind), None)
    return found.status if found is not None else "absent"


def standing(plan: Plan, out: Outcome, command: str) -> list[str]:
    """Plain lines on the recipe, the engine, the planned stamp, the checks and what to run."""
    write, restart, boot = (
        _status(out, k) for k in (StepKind.WRITE, StepKind.RESTART, StepKind.BOOT)
    )
    hosts = ", ".join(c.host for c in plan.changes)
    if write == "absent":
        recipe = "recipe: not part of this run (unchanged)"
    elif write == "done":
        recipe = f"recipe: the new content on {hosts} (written whole, backups kept)"
    else:
        recipe = "recipe: unchanged on every node (the write had not begun, or was undone whole)"
    if restart in ("absent", "pending"):
        engine = "engine: not restarted; the engine that ran before still runs"
    elif boot == "done":
        engine = "engine: the new engine serves (its boot was followed to the end)"
    else:
        engine = (
            "engine: a restart was triggered; its boot was not followed to the end "
            "(`spark-ops status` shows what runs now)"
        )
    if out.pruned:
        stamp = f"planned stamp: pruned ({', '.join(fmt_stamp(s) for s in out.pruned)})"
    elif restart in ("absent", "pending"):
        stamp = "planned stamp: none (no restart was triggered)"
    elif out.stamp is not None:
        stamp = (
            f"planned stamp {fmt_stamp(out.stamp)}: still in the history; remove it with "
            f"`spark-ops budget prune --stamp {fmt_stamp(out.stamp)}`"
        )
    else:
        stamp = (
            "planned stamp: not identified; this run's restart window is recorded on the head, "
            "and `spark-ops budget prune --planned` finds its stamp"
        )
    rolled = _rolled_back(out, hosts)
    if rolled is not None:  # the run was rolling its change back: that is where it stands
        recipe, engine = rolled
    verify = _status(out, StepKind.VERIFY)
    if verify == "done":
        failed = [c for c in out.checks if not c.ok]
        checks = f"checks: ran, {len(failed)} failed" if failed else "checks: ran, all passed"
    elif verify == "absent":
        checks = "checks: none in this run"
    else:
        checks = "checks: not run"
    changed = write == "done" or restart not in ("absent", "pending")
    after = (
        f"next: run `{command}` again; it compares the engine with the recipe and finishes"
        if changed
        else "next: nothing was changed; run the command again to do it"
    )
    if rolled is not None:
        after = (
            f"next: the change was being rolled back ({why_rolled_back(out)}); `spark-ops status` "
            f"shows what runs; `{command}` again would make the change again"
        )
    return [recipe, engine, stamp, checks, after]


def why_rolled_back(out: Outcome) -> str:
    """Why the run rolled its change back: its gate failed, or its boot did."""
    if out.error is not None and out.error.exit_status is ExitStatus.REGRESSED:
        return "apply --prove's gate failed after the change"
    return "the new recipe failed to boot"


def _rolled_back(out: Outcome, hosts: str) -> tuple[str, str] | None:
    """The recipe and engine lines of a run interrupted while rolling back (None: it was not)."""
    restore = _status(out, StepKind.ROLLBACK)
    if restore in ("absent", "pending"):
        return None
    if restore == "done":
        recipe = f"recipe: the previous content restored on {hosts} (the change rolled back)"
    else:
        recipe = (
            "recipe: the rollback's write was interrupted: each copy is whole, the previous or "
            "the new text (`spark-ops status` shows which)"
        )
    restart, boot = (_status(out, k) for k in (StepKind.RESTART_ROLLBACK, StepKind.BOOT_ROLLBACK))
    if restart in ("absent", "pending"):
        engine = "engine: not restarted on the previous recipe; the engine of the change still runs"
    elif boot == "done":
        engine = "engine: the previous recipe's engine serves (its boot was followed to the end)"
    else:
        engine = (
            "engine: a restart with the previous recipe was triggered; its boot was not followed "
            "to the end (`spark-ops status` shows what runs now)"
        )
    return recipe, engine
