"""`spark-ops rollout`: parse, show the rollout's plan, confirm, run it, report each cluster."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from spark_ops.cli.apply_options import (
    apply_options_of,
    knob_options,
    prove_options,
    restart_options,
)
from spark_ops.cli.common import chosen_fleet, command_line, confirm, emit_json, quiet, run_async

if TYPE_CHECKING:
    from spark_ops.workflows.plan import StepRun
    from spark_ops.workflows.rollout import ClusterStep, Rollout

# options that say how this invocation runs, not what the rollout is (left out of its identity)
_HOW = ("yes", "dry_run", "as_json", "resume", "journal_dir")


def _args(kw: dict[str, Any]) -> dict[str, Any]:
    """The options that make the rollout what it is, as JSON values (its journal keeps them)."""
    return {k: list(v) if isinstance(v, tuple) else v for k, v in kw.items() if k not in _HOW}


@click.command("rollout")
@knob_options
@restart_options
@prove_options
@click.option("--canary", help="The cluster changed first (default: the fleet's first).")
@click.option("--parallel", type=click.IntRange(1), default=1, show_default=True,
              help="After the canary, change this many clusters at a time.")  # fmt: skip
@click.option("--resume", is_flag=True,
              help="Resume the fleet's unfinished rollout with its own options (running the "
              "same command again finds it too).")  # fmt: skip
@click.option(
    "--journal-dir", type=click.Path(file_okay=False, path_type=Path),
    default=Path("~/.local/state/spark-ops/rollouts"), show_default=True,
    envvar="SPARK_OPS_ROLLOUT_DIR", help="Where the rollout's journal is kept on this machine.",
)  # fmt: skip
@click.pass_context
def rollout_cmd(ctx: click.Context, **kw: Any) -> int:
    """Apply a change over the fleet: the canary first, each cluster proved; a regression stops."""
    from spark_ops.workflows.rollout import RolloutJournal

    fleet = chosen_fleet(ctx)
    if fleet is None:
        raise click.UsageError("rollout spans a fleet: give --fleet FILE (docs/fleet.md)")
    if (ctx.find_root().obj or {}).get("cluster") is not None:
        raise click.UsageError("rollout spans the fleet: --cluster names one cluster (use apply)")
    if kw["over_budget"]:
        raise click.UsageError("rollout never forces a cluster past its restart budget")
    journal = RolloutJournal(kw["journal_dir"])
    if kw["dry_run"]:
        return _run(ctx, fleet, kw, journal)
    with journal.held(fleet.path):  # one rollout of a fleet at a time on this machine
        return _run(ctx, fleet, kw, journal)


def _run(ctx: click.Context, fleet: Any, kw: dict[str, Any], journal: Any) -> int:
    """Find the rollout to resume (or none), then plan and run it."""
    from spark_ops.workflows.rollout import RolloutError

    found = None
    if kw["resume"]:
        found = journal.unfinished(fleet.path)
        if found is None:
            raise RolloutError(
                f"no unfinished rollout of {fleet.path} in {kw['journal_dir']}",
                hint="start one: spark-ops rollout --max-num-seqs N",
            )
        kw = {**kw, **_journal_args(ctx, found, journal.path(found.key))}
    kw["prove"] = True
    opts = apply_options_of(kw)
    if kw["canary"] is not None:
        fleet.member(kw["canary"])  # an unknown name refused before anything is read
    return run_async(_flow(fleet, kw, opts, journal, found))


def _journal_args(ctx: click.Context, found: Rollout, path: Path) -> dict[str, Any]:
    """A resumed rollout's options from its journal, each checked by its own option's type and
    range as on the command line (a journal is a file on this machine: hand-edited, it is
    refused naming the option, never run as it says); --over-budget is refused as typed."""
    from spark_ops.workflows.rollout import RolloutError

    params = {p.name: p for p in ctx.command.params}
    out: dict[str, Any] = {}
    for name, value in found.args.items():
        param = params.get(name)
        if param is None or name in _HOW or name == "prove":
            continue  # not an option of rollout's (prove is set below, always)
        try:
            out[name] = param.type_cast_value(ctx, value)
        except (click.BadParameter, TypeError, ValueError) as exc:
            message = exc.format_message() if isinstance(exc, click.ClickException) else str(exc)
            raise RolloutError(
                f"{path}: option {name} = {value!r} is not one rollout takes: {message}",
                hint=f"fix it in {path} or move the journal away and start the rollout again",
            ) from None
    if out.get("over_budget"):
        raise RolloutError(
            f"{path}: option over_budget is set: rollout never forces a cluster past its "
            "restart budget",
            hint=f"fix it in {path} or move the journal away and start the rollout again",
        )
    return out


async def _flow(fleet: Any, kw: dict[str, Any], opts: Any, journal: Any, found: Any) -> int:
    """Plan, show, confirm, run, report."""
    from spark_ops.doctor import run_doctor
    from spark_ops.errors import Aborted
    from spark_ops.workflows.rollout import exit_of, plan_rollout, rollout_key, run_rollout

    args = _args(kw)
    known = found or journal.load(rollout_key(fleet.path, args))
    if known is not None and known.finished:
        known = None  # a finished rollout: the same command starts a new one
    ro = await plan_rollout(
        fleet, kw["canary"], kw["parallel"], command_line(), args,
        lambda c: run_doctor(c, keep=False), done=known,
    )  # fmt: skip
    as_json = kw["as_json"]
    if not as_json:
        _echo_plan(ro, opts, resumed=known is not None)
    if kw["dry_run"]:
        if as_json:
            emit_json({"dry_run": True, "rollout": ro.to_dict()})
        else:
            click.echo("\nDry run: nothing was changed.")
        return 0
    if not kw["yes"] and not await confirm("\nProceed?"):
        raise Aborted("not confirmed; nothing was changed")
    ro = await run_rollout(fleet, ro, opts, journal, say=_say(as_json),
                           on_cluster=None if as_json else _echo_cluster)  # fmt: skip
    if as_json:
        emit_json({"rollout": ro.to_dict(), "exit": exit_of(ro)})
    else:
        _echo_report(ro)
    return exit_of(ro)


def _say(as_json: bool) -> Any:
    """Each cluster's steps on stderr, named by cluster."""

    def say(name: str, step: StepRun) -> None:
        """One step transition."""
        if as_json:
            click.echo(json.dumps({"cluster": name, "step": step.to_dict()}), err=True)
        elif step.status == "running":
            click.echo(f"[{name}] … {step.description}", err=True)
        elif not quiet() or step.status not in ("done",):
            mark = {"done": "✓", "failed": "✗", "skipped": "-"}.get(step.status, "?")
            click.echo(f"[{name}] {mark} {step.name} : {step.detail}", err=True)

    return say


def _echo_plan(ro: Rollout, opts: Any, *, resumed: bool) -> None:
    """The rollout's plan: the change, the gate, the order with each cluster's budget and doctor."""
    click.secho(f"Rollout over {ro.fleet}" + (" (resumed)" if resumed else ""), bold=True)
    change = ", ".join(f"{c.name}={'(removed)' if c.remove else c.value}" for c in opts.changes)
    click.echo(f"  change: {change}")
    p = opts.prove
    click.echo(f"  gate: at {p.point.text()}; keep when {p.limits_text()}")
    how = "one at a time" if ro.parallel == 1 else f"{ro.parallel} at a time"
    click.echo(f"  order: the canary first, then the rest {how}; a regression stops the rollout")
    click.echo(f"  {'#':>2}  {'CLUSTER':<14}{'ROLE':<8}{'BUDGET':<8}{'DOCTOR':<11}PLAN")
    for i, c in enumerate(ro.clusters, 1):
        todo = c.state in ("pending", "running", "unproven")
        plan = "apply --prove" if todo else f"{c.state}: {c.reason}"
        click.echo(f"  {i:>2}  {c.name:<14}{c.role:<8}{c.budget:<8}{c.doctor:<11}{plan}")


def _echo_cluster(step: ClusterStep) -> None:
    """One cluster's result as soon as it is known."""
    click.secho(f"[{step.name}] {step.state}: {step.reason}", bold=True, err=True)


def _echo_report(ro: Rollout) -> None:
    """One section per cluster: kept, rolled back with its verdict table, skipped, not reached."""
    from spark_ops.bench.gate import render_verdict
    from spark_ops.workflows.rollout import pending_names, shown_state

    click.echo()
    click.secho("Rollout report", bold=True)
    for c in ro.clusters:
        state = shown_state(c, ro)
        color = {"kept": "green", "rolled-back": "yellow", "failed": "red", "unproven": "red"}.get(
            state
        )
        reason = c.reason if state != "not reached" else "the rollout stopped before it"
        click.secho(f"\n{c.name} ({c.role}): {state.upper()}: {reason}", fg=color, bold=True)
        if c.proof is not None and c.proof.verdict is not None:
            click.echo(render_verdict(c.proof.verdict).rstrip())
    if ro.stopped:
        left = ", ".join(pending_names(ro)) or "none"
        click.secho(f"\nStopped: {ro.stopped}. Not reached: {left}.", fg="yellow")
    else:
        click.secho("\nRollout finished.", fg="green")
