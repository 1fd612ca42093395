"""`spark-ops budget` and `spark-ops budget prune`: the restart budget and its clean-up."""

from __future__ import annotations

import decimal
import math
import re
from typing import TYPE_CHECKING, Any

import click

from spark_ops.cli.common import (
    command_line,
    confirm,
    emit_json,
    fleet_span,
    load_cluster,
    quiet,
    run_async,
    when,
)
from spark_ops.errors import excerpt

if TYPE_CHECKING:
    from spark_ops.watchdog.contract import BudgetView
    from spark_ops.workflows.budget import PrunePlan, PruneReport

_AGO = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")
_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400}


_MAX_STAMP = 1e11  # a Unix time past the year 5000 is a typo, not a stamp


def _unix_time(value: str, what: str) -> float:
    """A finite, non-negative Unix time; click.BadParameter (exit 2, before connecting) if not."""
    try:
        number = float(value)
    except ValueError:
        number = math.nan
    if not (math.isfinite(number) and 0 <= number < _MAX_STAMP) or len(value) > 40:
        raise click.BadParameter(
            f"{excerpt(value)}: give {what}",
        )
    return number


class StampType(click.ParamType):
    """An exact stamp: a finite Unix time (nan, inf, negative or absurd values refused)."""

    name = "STAMP"

    def convert(self, value: Any, param: Any, ctx: Any) -> float:
        """Parse one --stamp value."""
        if isinstance(value, float):
            value = repr(value)
        try:
            stamp = _unix_time(str(value), "a Unix time such as 1764470000.5")
        except click.BadParameter as exc:
            self.fail(exc.message, param, ctx)
        if decimal.Decimal(repr(stamp)) != decimal.Decimal(str(value).strip()):
            # 1796150875.0000001 is the float 1796150875.0: matching it would remove the line
            # 1796150875, which the operator did not name
            self.fail(
                f"{value!r} has more digits than a stamp holds exactly (it would match "
                f"{stamp!r}); give the stamp as the history shows it, or the line with --raw",
                param,
                ctx,
            )
        return stamp


def parse_time(value: str | None) -> tuple[float | None, float | None]:
    """A Unix time, or a duration ago like 90m / 6h: returns (absolute, seconds_ago)."""
    if value is None:
        return None, None
    m = _AGO.match(value.strip())
    if m:
        return None, float(m.group(1)) * _UNIT[m.group(2)]
    return _unix_time(value, "a Unix time (1764470000) or a duration ago (90m, 6h, 2d)"), None


def echo_budget(view: BudgetView) -> None:
    """Print the budget for a person."""
    from spark_ops.watchdog.identify import fmt_stamp

    color = "red" if view.used >= view.allowed else "green"
    click.secho(
        f"Restarts used: {view.used}/{view.allowed} in the last {view.window_s / 3600:g} h "
        f"(history {view.history_file})",
        fg=color,
        bold=True,
    )
    for s in view.stamps:
        reason = s["reason"] or "(no journal entry)"
        by = f" by {s['by']}" if s["by"] else ""
        click.echo(
            f"  {fmt_stamp(s['stamp'])}  {when(float(s['stamp']))}  "
            f"{s['age_s'] / 60:.0f} min ago  {reason}{by}"
        )
    if view.used >= view.allowed:
        click.echo(f"Next slot frees at {when(view.next_free_at)}")
    pause = view.to_dict()["pause"]  # lease.pause_shown's words: a lapsed lease is no pause
    if pause:
        click.secho(f"{pause['text'][0].upper()}{pause['text'][1:]}.", fg="yellow")
    if view.gave_up:
        click.secho(f"Watchdog GAVE UP: {view.gave_up_reason}", fg="red")
    if view.disagreement:  # which budget was counted, when the watchdog's own may differ
        click.secho(f"warning: {view.disagreement}", fg="yellow")
    for m in view.malformed:
        click.secho(f"  malformed line kept as is: {m}", fg="yellow")
    for f in view.flagged:
        click.secho(
            f"  line {f['line']} {f['raw']!r} is counted here, but holds {f['why']}: a bash "
            "watchdog may not count it (rewrite it as digits alone)",
            fg="yellow",
        )


@click.group(invoke_without_command=True)
@click.option("--json", "as_json", is_flag=True, help="As JSON on stdout.")
@click.pass_context
def cli(ctx: click.Context, as_json: bool) -> None:
    """Show the restart budget: used / allowed, stamps with reasons, next free slot, flags."""
    if ctx.invoked_subcommand is not None:
        return
    from spark_ops.workflows import Operation, budget_view

    fleet = fleet_span(ctx)  # under a fleet without --cluster: every cluster's (docs/fleet.md)
    if fleet is not None:
        from spark_ops.cli.fleet import budget_fleet

        ctx.exit(budget_fleet(fleet, as_json))
    cluster = load_cluster(ctx)

    async def flow() -> Any:
        """Read the budget from the head."""
        async with Operation.open(cluster, "budget", lock=False, nodes=[cluster.head.name]) as op:
            return await budget_view(op)

    view = run_async(flow())
    if as_json:
        emit_json(view.to_dict())
    else:
        echo_budget(view)


@cli.command("prune")
@click.option(
    "--stamp", "stamps", multiple=True, type=StampType(), help="Exact stamp (repeatable)."
)
@click.option(
    "--raw", "raws", multiple=True, help="An exact history line (a JSON-lines record; repeatable)."
)
@click.option("--since", help="Stamps at or after: Unix time or duration ago (90m, 6h).")
@click.option("--until", help="With --since: stamps at or before this time.")
@click.option("--planned", is_flag=True, help="Stamps the journal marks as planned restarts.")
@click.option(
    "--clear-gave-up", is_flag=True, help="Then remove the gave-up file if there is room."
)
@click.option("--dry-run", is_flag=True, help="Show the plan (the exact lines); change nothing.")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@click.option("--json", "as_json", is_flag=True, help="As JSON on stdout.")
@click.pass_context
def prune_cmd(ctx: click.Context, **kw: Any) -> None:
    """Remove chosen stamps from the restart history (under its lock, with a backup).

    The selection is resolved into the exact lines first; those are shown, confirmed, and then
    exactly those are removed: a stamp the watchdog appends meanwhile is kept (and reported).
    """
    from spark_ops.errors import Aborted
    from spark_ops.lock import refuse_if_locked
    from spark_ops.workflows.budget import (
        PruneSelection,
        execute_prune,
        plan_prune,
        resolve_times,
        settle_under_lock,
    )
    from spark_ops.workflows.operation import Operation

    since, since_ago = parse_time(kw["since"])
    until, until_ago = parse_time(kw["until"])
    if not (kw["stamps"] or kw["raws"] or kw["since"] or kw["planned"] or kw["clear_gave_up"]):
        raise click.UsageError("choose --stamp, --raw, --since, --planned or --clear-gave-up")
    if kw["until"] and not kw["since"]:
        raise click.UsageError("--until needs --since")
    cluster = load_cluster(ctx)

    async def flow() -> tuple[PrunePlan, BudgetView, PruneReport | None]:
        """Plan, show, confirm, execute exactly the plan."""
        async with Operation.open(
            cluster, "budget prune", lock=False, nodes=[cluster.head.name]
        ) as op:
            if not kw["dry_run"]:
                await refuse_if_locked(op.session)  # before the question; taken after it
            lo, hi = await resolve_times(op, since, since_ago, until, until_ago)
            selection = PruneSelection(kw["stamps"], kw["raws"], lo, hi, kw["planned"])
            plan = await plan_prune(op, selection, clear_gave_up=kw["clear_gave_up"])
            plan.command = command_line()
            if not kw["as_json"]:  # -q: the lines only when a prompt asks about them
                echo_prune_plan(plan, hush=quiet() and (kw["yes"] or not plan.chosen))
            if kw["dry_run"]:
                return plan, await op.watchdog.budget(), None
            asked = plan.chosen and not kw["yes"]
            if asked and not await confirm(f"Remove these {len(plan.chosen)}?"):
                raise Aborted("not confirmed; nothing was removed")
            async with op.hold_lock():
                await settle_under_lock(op, plan)
                report = await execute_prune(op, plan)
            return plan, report.budget or await op.watchdog.budget(), report

    plan, budget_now, report = run_async(flow())
    if report is None:
        if kw["as_json"]:
            emit_json({"dry_run": True, "plan": plan.to_dict(), "budget": budget_now.to_dict()})
        else:
            click.echo("Dry run: nothing was removed.")
            click.echo(f"Budget now: {budget_now.used}/{budget_now.allowed} used.")
        return
    if kw["as_json"]:
        emit_json({"dry_run": False, **report.to_dict()})
        return
    echo_prune_report(report, hush=quiet())


def echo_prune_plan(plan: PrunePlan, *, hush: bool = False) -> None:
    """Print the exact lines a prune will remove (`hush`, -q: only what needs a look)."""
    if hush:
        pass
    elif plan.chosen:
        click.echo(f"Would remove {len(plan.chosen)} line(s) from {plan.history_file}:")
        for e in plan.chosen:
            click.echo(f"  {e.raw}  ({when(e.stamp)})")
    elif not plan.selection.empty and not hush:
        what = "stamp of a planned restart" if plan.selection.planned else "line that matches"
        click.echo(f"Nothing to remove: {plan.history_file} holds no {what}.")
    for nf in plan.not_found:  # -q: a warning on stderr (stdout keeps only --json's answer)
        _said(f"{nf} is not in the history", hush)
    for note in plan.notes:
        _said(f"note: {note}", hush)
    for warning in plan.warnings:  # a stamp that is not a planned one: said even under -q
        click.secho(f"warning: {warning}", fg="yellow", err=hush)
    if plan.clear_gave_up and not hush:
        click.echo("Then remove the gave-up file, if the budget has room.")


def _said(text: str, hush: bool) -> None:
    """A line worth a look: with the report on stdout, or under -q a `warning:` on stderr."""
    if hush:
        click.secho(f"warning: {text}", fg="yellow", err=True)
    else:
        click.secho(f"  {text}", fg="yellow")


def echo_prune_report(report: PruneReport, *, hush: bool = False) -> None:
    """Print what the prune removed, and what changed since the preview (-q: the changes only)."""
    if report.plan.chosen and not hush:
        from spark_ops.watchdog.identify import stamps_text

        click.echo(f"Removed {stamps_text(report.removed_stamps)}; backup at {report.backup}")
    for raw in report.vanished:
        _said(f"{raw} was already gone when the prune ran", hush)
    for raw in report.appended_kept:
        _said(f"{raw} appeared after the preview and was kept (not confirmed)", hush)
    if report.gave_up_cleared is not None and not hush:
        click.echo(f"Gave-up file removed: {'yes' if report.gave_up_cleared else 'no'}")
    b = report.budget
    if b is not None and not hush:
        click.echo(f"Budget now: {b.used}/{b.allowed} used.")
