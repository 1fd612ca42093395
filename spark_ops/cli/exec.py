"""`spark-ops exec`: run a command (or an atomic one-line edit) on every node, output per host."""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

import click

from spark_ops.cli.common import emit_json, load_cluster, quiet, run_async

if TYPE_CHECKING:  # the CLI imports its workflow when a command runs (start-up time)
    from spark_ops.fanout import FanoutReport


def _nodes(value: str | None) -> list[str] | None:
    """Split --nodes a,b into names (None: all nodes)."""
    if not value:
        return None
    return [n.strip() for n in value.split(",") if n.strip()]


def _echo_lines(host: str, text: str, *, width: int, err: bool) -> None:
    """Print text with each line prefixed by the host name (like pssh -P)."""
    if not text:
        return
    sep = "!" if err else "|"
    for line in text.splitlines():
        click.echo(f"{host:<{width}} {sep} {line}", err=err)


def render(report: FanoutReport) -> None:
    """Print a fan-out report for a person: output per host, then a one-line summary on stderr."""
    width = max((len(h.host) for h in report.hosts), default=0)
    for h in report.hosts:
        _echo_lines(h.host, h.stdout, width=width, err=False)
        _echo_lines(h.host, h.stderr, width=width, err=True)
        if report.mode == "edit" and h.kind in ("ok", "unchanged"):
            what = "unchanged" if h.kind == "unchanged" else f"-> {h.extra.get('new_line')!r}"
            backup = f" (backup {h.extra['backup']})" if h.extra.get("backup") else ""
            click.echo(f"{h.host:<{width}} | {h.extra.get('old_line')!r} {what}{backup}")
        if h.kind == "exit":
            click.secho(f"{h.host:<{width}} ✗ exit {h.exit_code}", fg="red", err=True)
        elif not h.ok:
            click.secho(f"{h.host:<{width}} ✗ {h.kind}: {h.error}", fg="red", err=True)
    if report.note and not quiet():
        click.echo(report.note, err=True)
    good = len(report.hosts) - len(report.failed)
    color = "green" if report.ok else "red"
    if good < len(report.hosts) or not quiet():  # -q: the count only when a host failed
        click.secho(f"{good}/{len(report.hosts)} ok in {report.seconds:.2f} s", fg=color, err=True)


class ExecCommand(click.Command):
    """exec's command: an unknown option before `--` is refused, never sent as the command."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        """Refuse `--node n2 -- ls` (a mistyped option) before click takes it for the command."""
        takes: dict[str, int] = {}
        for param in self.params:
            if isinstance(param, click.Option):
                for name in (*param.opts, *param.secondary_opts):
                    takes[name] = 0 if param.is_flag else param.nargs
        takes.update({name: 0 for name in ctx.help_option_names})
        i = 0
        while i < len(args):
            arg = args[i]
            if arg == "--" or not arg.startswith("-") or arg == "-":
                break
            name, eq, _ = arg.partition("=")
            if name not in takes:
                raise click.UsageError(
                    f"exec has no option {arg!r}; give the remote command after --, and exec's "
                    f"own options ({', '.join(sorted(n for n in takes if n.startswith('--')))}) "
                    "before it",
                    ctx=ctx,
                )
            i += 1 + (0 if eq else takes[name])
        return super().parse_args(ctx, args)


@click.command(
    cls=ExecCommand,
    context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False},
)
@click.option("--nodes", "nodes", help="Comma-separated node names (default: every node).")
@click.option("--json", "as_json", is_flag=True, help="Per-host results as JSON on stdout.")
@click.option(
    "--timeout",
    type=float,
    help="Seconds per host (default: ssh.command_timeout); not with --edit.",
)
@click.option(
    "--shell", is_flag=True, help="COMMAND is one shell string, run as is (pipes, $VARS)."
)
@click.option(
    "--edit", "edit_path", metavar="PATH", help="Edit one line of PATH atomically instead."
)
@click.option(
    "--sub", nargs=2, metavar="REGEX REPLACEMENT", help="With --edit: the line and its rewrite."
)
@click.option(
    "--changes-recipe",
    is_flag=True,
    help="COMMAND changes the recipe (or another cluster file): run it under the cluster lock "
    "and record it in the audit log, as --edit always is.",
)
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
@click.pass_context
def cli(
    ctx: click.Context,
    nodes: str | None,
    as_json: bool,
    timeout: float | None,
    shell: bool,
    edit_path: str | None,
    sub: tuple[str, str] | None,
    changes_recipe: bool,
    command: tuple[str, ...],
) -> None:
    """Run COMMAND on every node (remote argv exactly as given); exit non-zero if a host failed.

    \b
      spark-ops exec -- nvidia-smi --query-gpu=memory.used --format=csv
      spark-ops exec --nodes node2,node3 --timeout 5 -- free -g
      spark-ops exec --shell -- 'dmesg | grep -i xid | tail -3'
      spark-ops exec --edit ~/recipe.yaml --sub '^( *max_num_seqs:).*' '\\1 64'
    """
    from spark_ops import fanout, lineedit

    if timeout is not None and timeout <= 0:
        raise click.BadParameter(f"must be > 0, got {timeout}", param_hint="--timeout")
    if edit_path is not None and (
        sub is None or command or shell or timeout is not None or changes_recipe
    ):
        raise click.UsageError("--edit PATH takes --sub REGEX REPLACEMENT, and no COMMAND")
    if edit_path is None and sub is not None:
        raise click.UsageError("--sub goes with --edit PATH")
    if edit_path is None and not command:
        raise click.UsageError("give the command after --, e.g. spark-ops exec -- uptime")
    cluster = load_cluster(ctx)
    if edit_path is not None:
        assert sub is not None
        edit = lineedit.LineEdit(edit_path, sub[0], sub[1])
        report = run_async(lineedit.edit_line(cluster, edit, nodes=_nodes(nodes)))
    else:
        report = run_async(
            fanout.run_command(
                cluster,
                command,
                nodes=_nodes(nodes),
                timeout=timeout,
                shell=shell,
                changes_recipe=changes_recipe,
            )
        )
    if as_json:
        emit_json(report.to_dict())
    else:
        render(report)
    code = int(report.exit_status())
    fast_exit(code)
    ctx.exit(code)


def fast_exit(code: int) -> None:
    """End the process now, skipping interpreter teardown (~10% of a short run), when safe.

    Only when stdout/stderr are the process's own (not a test runner's capture) and
    SPARK_OPS_NO_FAST_EXIT is unset: all connections are closed and all output is flushed first.
    """
    if os.environ.get("SPARK_OPS_NO_FAST_EXIT"):
        return
    sys.stdout.flush()
    sys.stderr.flush()
    if sys.stdout is not sys.__stdout__ or sys.stderr is not sys.__stderr__:
        return
    os._exit(code)
