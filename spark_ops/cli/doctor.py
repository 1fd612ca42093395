"""`spark-ops doctor`: every precondition of apply, one line each, with the fix for each failure."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import click

from spark_ops.cli.common import emit_json, fleet_span, load_cluster, run_async

if TYPE_CHECKING:  # the CLI imports its workflow when a command runs (start-up time)
    from spark_ops.doctor import DoctorReport

_MARK = {"ok": ("✓", "green"), "warn": ("!", "yellow"), "fail": ("✗", "red")}


def shown(text: str) -> str:
    """A check's text on one line of the terminal: what an audit line or a node answered may hold
    a newline, a carriage return or an escape sequence, shown as `?` (as status shows them)."""
    return "".join(c if c.isprintable() else "?" for c in text)


def echo_report(report: DoctorReport) -> None:
    """Print the checks for a person: mark, name, host, detail; the fix under each failure."""
    click.secho(f"Doctor: cluster {report.cluster} ({report.inventory})", bold=True)
    for c in report.checks:
        mark, color = _MARK[c.status]
        click.secho(f"{mark} {c.name:<18} {c.host:<8} {shown(c.detail)}", fg=color)
        if c.fix and c.status != "ok":
            click.echo(f"    fix: {shown(c.fix)}")
    counts = report.to_dict()["counts"]
    summary = f"{counts['ok']} ok, {counts['warn']} warning(s), {counts['fail']} failed"
    if report.ok:
        click.secho(f"Ready for apply: {summary}.", fg="green", bold=True)
    else:
        click.secho(f"Not ready for apply: {summary}.", fg="red", bold=True)


@click.command()
@click.option("--json", "as_json", is_flag=True, help="As JSON on stdout.")
@click.pass_context
def cli(ctx: click.Context, as_json: bool) -> None:
    """Check every precondition of apply without changing anything (exit 11 when one fails).

    Under a fleet without --cluster: every cluster, one table, the worst code (docs/fleet.md)."""
    from spark_ops.doctor import run_doctor
    from spark_ops.errors import ExitStatus

    fleet = fleet_span(ctx)
    if fleet is not None:
        from spark_ops.cli.fleet import doctor_fleet

        sys.exit(doctor_fleet(fleet, as_json))
    cluster = load_cluster(ctx)
    report = run_async(run_doctor(cluster))
    if as_json:
        emit_json(report.to_dict())
    else:
        echo_report(report)
    if not report.ok:
        sys.exit(int(ExitStatus.CHECK_FAILED))
