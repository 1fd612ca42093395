"""`spark-ops log`: the cluster's audit log, as every operator sees it on the head."""

from __future__ import annotations

from typing import Any

import click

from spark_ops.cli.common import emit_json, fleet_span, load_cluster, run_async, when


def _clean(value: object) -> str:
    """Text for one line of the log: control characters shown escaped (never a forged line)."""
    text = str(value)
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _list(value: object) -> list[object]:
    """A record's list, or none when a line holds something else there."""
    return value if isinstance(value, list) else []


def entry_line(e: dict[str, Any]) -> list[str]:
    """One operation as the fleet's log table shows it: outcome, what (with its arguments), who."""
    from spark_ops.workflows.oplog import args_text

    if "malformed" in e:
        return ["-", f"(unreadable line) {_clean(e['malformed'])[:80]}", "?"]
    raw_what = e.get("what")
    what: dict[str, Any] = raw_what if isinstance(raw_what, dict) else {}
    operation = f"{_clean(what.get('operation', '?'))} {_clean(args_text(what))}".strip()[:80]
    outcome = str(e.get("outcome", "")) or "-"
    if e.get("unattributed"):
        outcome = "unattributed"
    elif e.get("unfinished"):
        outcome = "did not end"
    elif e.get("settled_by"):
        outcome = f"finished by run {e['settled_by']}"
    return [_clean(outcome), operation, _clean(e.get("who", "?"))]


def echo_entries(entries: list[dict[str, Any]], *, diffs: bool) -> None:
    """Print operations (workflows.oplog) for a person, one block per operation."""
    from spark_ops.workflows.oplog import args_text

    if not entries:
        click.echo("The audit log is empty: no operation has been recorded on this cluster yet.")
        return
    for e in entries:
        if "malformed" in e:
            click.secho(f"(unreadable line) {_clean(e['malformed'])[:200]}", fg="yellow")
            continue
        raw_what = e.get("what")
        what: dict[str, Any] = raw_what if isinstance(raw_what, dict) else {}
        if e.get("unattributed"):
            click.secho(
                "(unattributed: not written by spark-ops on the head, never acted on) "
                f"{_clean(e.get('who', '?'))} {_clean(what.get('operation', '?'))}"
                f" outcome: {_clean(e.get('outcome', '-'))}",
                fg="yellow",
            )
            continue
        outcome = str(e.get("outcome", ""))
        if e.get("unfinished"):
            outcome = f"did not end (killed, or still running); last recorded: {e['last_step']}"
        elif e.get("settled_by"):
            outcome = f"did not end; finished by run {e['settled_by']}"
        color = "green" if outcome in ("ok", "done") else ("red" if outcome else None)
        stamp = e.get("started", e.get("when"))
        head = (
            f"{when(stamp)}  {_clean(e.get('who', '?'))} (account {_clean(e.get('account', '?'))})"
        )
        operation = f"{_clean(what.get('operation', '?'))} {_clean(args_text(what))}"
        click.echo(f"{head}  {operation}".rstrip())
        nodes = ", ".join(_clean(n) for n in _list(e.get("nodes"))) or "-"
        click.secho(f"    nodes: {nodes}  outcome: {_clean(outcome) or '-'}", fg=color)
        steps = [s for s in _list(e.get("steps")) if isinstance(s, dict)]
        if steps:
            said = ", ".join(f"{_clean(s.get('step'))} {_clean(s.get('status'))}" for s in steps)
            click.echo(f"    steps: {said}")
        if diffs and e.get("diff"):
            for line in str(e["diff"]).splitlines():  # a tab kept, every other control escaped
                click.echo("    " + "\t".join(_clean(part) for part in line.split("\t")))


@click.command()
@click.option(
    "--limit",
    "-n",
    type=click.IntRange(min=1),
    default=20,
    show_default=True,
    help="How many of the latest operations (each with its steps).",
)
@click.option("--diff", "diffs", is_flag=True, help="Show each entry's recipe diff too.")
@click.option(
    "--raw", is_flag=True, help="With --json: the audit file's lines as kept (-n counts lines)."
)
@click.option("--json", "as_json", is_flag=True, help="As JSON on stdout.")
@click.pass_context
def cli(ctx: click.Context, limit: int, diffs: bool, raw: bool, as_json: bool) -> None:
    """Show the audit log kept on the head: when, who, what, on which nodes, the outcome, the
    steps; one entry per operation (a run's intent, step records and end together). Under a
    fleet without --cluster: every cluster's, one table by time (docs/fleet.md)."""
    if raw and not as_json:
        raise click.UsageError("--raw is for --json (the audit file's lines as kept)")
    fleet = fleet_span(ctx)
    if fleet is not None:
        if raw:
            raise click.UsageError("--raw reads one cluster's audit file: give --cluster NAME")
        from spark_ops.cli.fleet import log_fleet

        ctx.exit(log_fleet(fleet, limit, as_json))
    cluster = load_cluster(ctx)
    from spark_ops.audit import read_log
    from spark_ops.workflows.oplog import read_log_operations

    if raw:
        entries = run_async(read_log(cluster, limit))
    else:
        entries = run_async(read_log_operations(cluster, limit))
    if as_json:
        emit_json(entries)
    else:
        echo_entries(entries, diffs=diffs)
