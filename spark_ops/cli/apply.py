"""`spark-ops apply | plan | restart`: parse, show the plan, confirm, execute, report."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from spark_ops.cli.apply_options import (
    apply_options_of,
    knob_options,
    over_budget_option,
    prove_options,
    restart_options,
)
from spark_ops.cli.common import (
    confirm,
    echo_plan,
    emit_json,
    load_cluster,
    quiet,
    run_async,
    step_reporter,
    when,
)

if TYPE_CHECKING:  # the CLI imports its workflow when a command runs (start-up time)
    from spark_ops.bench.gate import Verdict
    from spark_ops.errors import OverBudget
    from spark_ops.workflows import Outcome
    from spark_ops.workflows.plan import Plan


def _flow(ctx: click.Context, operation: str, kw: dict[str, Any]) -> int:
    """connect → plan → show → confirm → lock → the same plan again, or nothing → execute."""
    from spark_ops.cli.progress import make_reporter
    from spark_ops.errors import Aborted, RecipeError, VerifyError
    from spark_ops.lock import refuse_if_locked
    from spark_ops.readiness import history_key
    from spark_ops.workflows import (
        Operation,
        plan_apply,
        plan_restart,
        plan_rollback,
    )
    from spark_ops.workflows.execute import execute
    from spark_ops.workflows.gate import budget_refusal, ensure_same, replan_refused

    opts = apply_options_of(kw, operation)
    cluster = load_cluster(ctx)
    as_json = kw["as_json"]

    async def make_plan(op: Operation, shown: Plan | None) -> Plan:
        """The plan of this operation, as the cluster stands now."""
        if operation == "apply":
            return await plan_apply(op, opts, shown)
        if operation == "rollback":
            return await plan_rollback(op, opts, kw.get("to"), shown)
        return await plan_restart(op, opts, shown)

    def show(plan: Plan) -> int | None:
        """Show the plan; the exit code when the run ends here (nothing to do, a dry run); a
        plan over the budget refused."""
        asked = bool(plan.steps) and not kw["yes"] and not kw["dry_run"]
        if not as_json and quiet() and not (asked or kw["dry_run"]):  # -q: shown when asked
            for w in plan.warnings:
                click.secho(f"warning: {w}", fg="yellow", err=True)
        elif not as_json:
            echo_plan(plan)
        if not plan.steps:
            if as_json:
                emit_json({"ok": True, "plan": plan.to_dict(), "changed": False})
            elif not quiet():
                click.echo(
                    "The recipe already has this content on every node and the engine runs "
                    "it: nothing to do."
                )
            return 0
        refusal = budget_refusal(plan)
        if kw["dry_run"]:
            return _dry_run(plan, refusal, as_json, operation)
        if refusal is not None:
            raise refusal
        return None

    async def flow() -> int:
        """Plan without the lock, show, confirm; then lock, plan again, run only the plan shown
        (with --yes nothing waits: the plan is made once, under the lock, and run as shown)."""
        async with Operation.open(cluster, operation, lock=False) as op:
            if not kw["dry_run"]:
                await refuse_if_locked(op.session)  # before the plan and the question, not after
            if kw["yes"] and not kw["dry_run"]:  # nothing waits: the lock first, one plan
                async with op.hold_lock():
                    plan = await make_plan(op, None)
                    done = show(plan)
                    return done if done is not None else await run(op, plan)
            plan = await make_plan(op, None)
            done = show(plan)
            if done is not None:
                return done
            if not await confirm("\nProceed?"):
                raise Aborted("not confirmed; nothing was changed")
            async with op.hold_lock():
                try:
                    final = await make_plan(op, plan)
                except (RecipeError, VerifyError) as exc:  # copies now differ, recipe broken…
                    raise replan_refused(exc) from exc
                ensure_same(plan, final)  # the plan shown, or nothing
                return await run(op, final)

    async def run(op: Operation, plan: Plan) -> int:
        """Execute the plan under the lock and report it."""
        reporter = make_reporter(
            cluster.name,
            json_lines=as_json,
            history=history_key(cluster),
            workers_expected=len(cluster.workers),
            quiet=quiet(),
        )
        try:
            outcome = await execute(
                op, plan, opts, on_step=step_reporter(as_json, reporter), on_event=reporter
            )
        finally:
            reporter.close()
        if as_json:
            emit_json(outcome.to_dict())
        else:
            _echo_outcome(outcome)
        return exit_of(outcome)

    return run_async(flow())


def exit_of(outcome: Outcome) -> int:
    """An executed plan's exit code: regressed, rolled back, checks failed (or a dead
    apply --prove's change finished unproven), budget unknown."""
    from spark_ops.errors import ExitStatus
    from spark_ops.workflows.prove import regressed

    if outcome.rolled_back and regressed(outcome.proof):
        return int(ExitStatus.REGRESSED)
    if outcome.rolled_back:
        return int(ExitStatus.BOOT_FAILED)
    if not outcome.checks_ok:
        return int(ExitStatus.CHECK_FAILED)
    if outcome.proof is None and outcome.plan.facts.unproven:  # a dead proof's change finished
        return int(ExitStatus.CHECK_FAILED)
    # the engine serves, but the budget is unknown: watchdog.history_file is wrong
    return int(ExitStatus.BUDGET) if outcome.history_problem else 0


def _dry_run(plan: Plan, refusal: OverBudget | None, as_json: bool, operation: str) -> int:
    """Show what the run would do (refuse, when the budget is spent); its code is the run's."""
    if as_json:
        doc: dict[str, Any] = {"ok": refusal is None, "dry_run": True, "plan": plan.to_dict()}
        if refusal is not None:
            doc["refused"] = refusal.to_dict()
        emit_json(doc)
    else:
        if refusal is not None:
            click.secho(f"\n{operation} would refuse: {refusal.message}", fg="red", bold=True)
            click.echo(f"hint: {refusal.hint}")
        click.echo("\nDry run: nothing was changed.")
    return int(refusal.exit_status) if refusal is not None else 0


def _echo_outcome(outcome: Outcome) -> None:
    """Summarise an executed plan for a person."""
    from spark_ops.watchdog.identify import stamps_text
    from spark_ops.workflows.prove import regressed

    hush = quiet()  # -q: the failures and warnings only
    if not hush:
        click.echo()
    if outcome.proof is not None and outcome.proof.verdict is not None:
        echo_proof(outcome.proof.verdict)
    if outcome.rolled_back and regressed(outcome.proof):
        click.secho(
            "The change regressed at the load point; the previous recipe is serving again.",
            fg="yellow",
        )
    elif outcome.rolled_back:
        click.secho(
            "The new recipe failed to boot; the previous recipe is serving again.", fg="yellow"
        )
    elif outcome.ok and outcome.checks_ok:
        boot = outcome.boot
        if hush:
            pass
        elif boot is None and outcome.plan.facts.checks_owed:
            click.secho(
                f"Done: the checks run {outcome.plan.facts.checks_owed} skipped ran; "
                "the engine serves.",
                fg="green",
                bold=True,
            )
        elif boot is None and outcome.plan.facts.unproven and outcome.proof is None:
            click.secho(
                "The unfinished run(s) are finished; the change of "
                f"{', '.join(outcome.plan.facts.unproven)} stays in place, NOT proven (exit 11).",
                fg="yellow",
                bold=True,
            )
        elif boot is None:
            click.secho("Done: the unfinished run(s) are finished.", fg="green", bold=True)
        else:
            total = boot.total_s
            how = "from the engine's start" if boot.engine_started_at else "of waiting"
            cmd = boot.restart_command_s
            apart = f"; restart command {cmd:.1f} s" if cmd is not None else ""
            click.secho(
                f"Done: engine serving (boot {total:.1f} s {how}{apart}).", fg="green", bold=True
            )
    elif outcome.ok and outcome.boot is None:  # a dead run's checks: no boot followed here
        click.secho("Checks failed (this run followed no boot of its own):", fg="red", bold=True)
    elif outcome.ok:
        click.secho("The new engine serves, but checks failed:", fg="red", bold=True)
    for warning in getattr(outcome, "warnings", []):
        click.secho(f"  ! {warning}", fg="yellow")
    for c in outcome.checks:
        if hush and c.ok:
            continue
        mark = "✓" if c.ok else "✗"
        click.secho(f"  {mark} {c.name} [{c.host}]: {c.detail}", fg=None if c.ok else "red")
    problem = outcome.history_problem
    if problem:
        click.secho(f"✗ Restart budget UNKNOWN: {problem.message}.", fg="red", bold=True)
        click.secho(f"  fix: {problem.hint}", fg="red")
    if outcome.budget and not hush:
        b = outcome.budget
        click.echo(
            f"Restart budget: {b.used}/{b.allowed} used in the last {b.window_s / 3600:g} h; "
            f"pruned {stamps_text(outcome.pruned)}"
        )


def echo_proof(verdict: Verdict) -> None:
    """The gate's before and after side by side, and its verdict."""
    from spark_ops.bench.gate import render_verdict

    click.echo(render_verdict(verdict).rstrip())


@click.command("apply")
@knob_options
@restart_options
@click.option(
    "--prove", is_flag=True,
    help="Measure a load point before the change and again after it; keep the change only if "
    "the gate passes, else roll it back (exit 23). The point and limits: --prove-* and --max-*.",
)  # fmt: skip
@prove_options
@click.option(
    "--rollback-on-failure", is_flag=True, help="Restore the old recipe if the boot fails."
)
@click.pass_context
def apply_cmd(ctx: click.Context, **kw: Any) -> int:
    """Change knobs in the recipe, force a restart, wait for the boot, prune the planned stamp."""
    return _flow(ctx, "apply", kw)


@click.command("plan")
@knob_options
@over_budget_option
@click.option("--json", "as_json", is_flag=True, help="The plan as JSON on stdout.")
@click.pass_context
def plan_cmd(ctx: click.Context, **kw: Any) -> int:
    """Show the per-node diff and the steps apply would take; change nothing."""
    kw.update(
        dry_run=True, yes=False, no_drain=False, drain_timeout=0.0, deadline=None, reason=None
    )
    return _flow(ctx, "apply", kw)


@click.command("restart")
@restart_options
@click.pass_context
def restart_cmd(ctx: click.Context, **kw: Any) -> int:
    """Planned maintenance restart through the watchdog; its stamp is pruned like apply's."""
    return _flow(ctx, "restart", kw)


@click.command("rollback")
@restart_options
@click.option("--to", help="Restore the backup whose time stamp contains this (default: latest).")
@click.option("--list", "list_only", is_flag=True, help="List the recipe backups and stop.")
@click.pass_context
def rollback_cmd(ctx: click.Context, **kw: Any) -> int:
    """Restore a recipe backup on every node, restart, wait, prune the planned stamp."""
    if kw.pop("list_only"):
        return _list_backups(ctx, kw["as_json"])
    return _flow(ctx, "rollback", kw)


def _list_backups(ctx: click.Context, as_json: bool) -> int:
    """Show the recipe backups: when, before what, which a rollback restores, how to undo."""
    from spark_ops.workflows import Operation, list_backups
    from spark_ops.workflows.plans import BackupInfo, describe_backups

    cluster = load_cluster(ctx)

    async def flow() -> dict[str, list[BackupInfo]]:
        """Read the backup names."""
        async with Operation.open(
            cluster, "rollback", lock=False, nodes=cluster.recipe.nodes
        ) as op:
            found = await list_backups(op)
            return {host: describe_backups(names) for host, names in found.items()}

    backups = run_async(flow())
    if as_json:
        emit_json({host: [b.to_dict() for b in infos] for host, infos in backups.items()})
        return 0
    for host, infos in backups.items():
        click.secho(f"{host}:", bold=True)
        if not infos:
            click.echo("  (no backup: nothing to roll back to)")
        for b in infos:
            made = when(b.made_at) if b.made_at is not None else "time unknown"
            what = "before an apply" if b.before == "apply" else "before a rollback"
            mark = (
                click.style("  <- `spark-ops rollback` restores this", fg="green")
                if b.default
                else ""
            )
            click.echo(f"  {b.tag}  {made}  {what}{mark}")
            click.echo(click.style(f"      {b.path}", dim=True))
    click.echo(
        "\nRestore another: `spark-ops rollback --to TAG`. A rollback keeps the version it replaced"
        "\n(`… before a rollback`): `spark-ops rollback --to` that tag undoes the rollback."
    )
    return 0
