"""The `spark-ops` entry point: a click group whose subcommands are imported only when used.

Only this package maps SparkOpsError to exit codes (spark_ops.errors.ExitStatus).
"""

from __future__ import annotations

import errno
import importlib
import json
import os
import sys
from typing import Any

import click

from spark_ops import __version__
from spark_ops.errors import ExitStatus, OutputError, SparkOpsError

# errors writing stdout that are the reader's or the disk's, not a bug: a short message, exit 18
_OUTPUT_ERRNOS = {errno.EPIPE: "the reader closed it", errno.ENOSPC: "no space left on device"}
_OUTPUT_ERRNOS[errno.EDQUOT] = "disk quota exceeded"

# name -> (module, attribute, one-line help shown by --help without importing the module)
COMMANDS: dict[str, tuple[str, str, str]] = {
    "apply": (
        "spark_ops.cli.apply",
        "apply_cmd",
        "Change engine knobs, restart, wait, prune the stamp.",
    ),
    "plan": (
        "spark_ops.cli.apply",
        "plan_cmd",
        "Show what apply would change (same as apply --dry-run).",
    ),
    "restart": (
        "spark_ops.cli.apply",
        "restart_cmd",
        "Planned maintenance restart: no recipe change.",
    ),
    "rollback": ("spark_ops.cli.apply", "rollback_cmd", "Restore a recipe backup and restart."),
    "rollout": (
        "spark_ops.cli.rollout",
        "rollout_cmd",
        "Apply a change over the fleet, canary first, each cluster proved.",
    ),
    "budget": ("spark_ops.cli.budget", "cli", "Show the restart budget; prune planned stamps."),
    "status": (
        "spark_ops.cli.status",
        "cli",
        "Nodes, engine, load, watchdog and budget at a glance.",
    ),
    "recipe": ("spark_ops.cli.recipe", "cli", "Edit or render a local recipe file."),
    "bench": ("spark_ops.cli.bench", "cli", "Throughput sweep over concurrency levels."),
    "experiment": (
        "spark_ops.cli.experiment",
        "cli",
        "Apply each configuration, sweep, compare, restore.",
    ),
    "sim": ("spark_ops.cli.sim", "cli", "The embedded simulated cluster (up, down, status)."),
    "init": ("spark_ops.cli.init", "cli", "Write an inventory from the cluster you already run."),
    "doctor": ("spark_ops.cli.doctor", "cli", "Check every precondition of apply, with fixes."),
    "log": ("spark_ops.cli.log", "cli", "The audit log kept on the head: who did what, when."),
    "exec": ("spark_ops.cli.exec", "cli", "Run a command on every node (fan-out)."),
    "serve": (
        "spark_ops.cli.serve",
        "cli",
        "The cluster's (or the fleet's) read-only web page and /metrics, behind a token.",
    ),
}


class LazyGroup(click.Group):
    """A group that imports a subcommand's module only when that subcommand runs."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        """Every registered name, in order."""
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        """Import and return the command."""
        if cmd_name not in COMMANDS:
            return None
        module, attr, _ = COMMANDS[cmd_name]
        cmd = getattr(importlib.import_module(module), attr)
        cmd.name = cmd_name
        return cmd

    def invoke(self, ctx: click.Context) -> Any:
        """Run the subcommand; stdout refusing the output becomes an OutputError, not a traceback.

        click turns EPIPE into a silent exit 1 by itself; caught here first, it gets its own code.
        """
        try:
            return super().invoke(ctx)
        except OSError as exc:
            error = _output_error(exc)
            if error is exc:
                raise
            raise error from exc

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """List commands with their one-line help without importing them."""
        rows = [(name, short) for name, (_, _, short) in COMMANDS.items()]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "-i",
    "--inventory",
    envvar="SPARK_OPS_INVENTORY",
    type=click.Path(dir_okay=False),
    help="Inventory file (env SPARK_OPS_INVENTORY).",
)
@click.option(
    "--fleet",
    envvar="SPARK_OPS_FLEET",
    type=click.Path(dir_okay=False),
    help="Fleet file naming several inventories (env SPARK_OPS_FLEET; docs/fleet.md).",
)
@click.option(
    "-c",
    "--cluster",
    envvar="SPARK_OPS_CLUSTER",
    help="Cluster name: of the fleet, or of an inventory holding several (env SPARK_OPS_CLUSTER).",
)
@click.option("-v", "--verbose", count=True, help="Log lines on stderr (-vv for debug).")
@click.option("-q", "--quiet", is_flag=True, help="Only warnings and errors on stderr.")
@click.option("--log-json", is_flag=True, help="Log lines on stderr, as JSON lines.")
@click.version_option(__version__, prog_name="spark-ops")
@click.pass_context
def cli(
    ctx: click.Context,
    inventory: str | None,
    fleet: str | None,
    cluster: str | None,
    verbose: int,
    quiet: bool,
    log_json: bool,
) -> None:
    """Operate a vLLM cluster of DGX Spark nodes: knobs, planned restarts, budget, sweeps."""
    from spark_ops.log import cli_verbosity, configure

    level = cli_verbosity(verbose, quiet=quiet, as_json=_JSON["flag"], log_json=log_json)
    configure(level, json=log_json or _JSON["flag"])
    ctx.obj = {"inventory": inventory, "cluster": cluster, "verbose": verbose, "quiet": quiet}
    ctx.obj["fleet"] = fleet
    typed = click.core.ParameterSource.COMMANDLINE
    ctx.obj["typed"] = {
        name for name in ("inventory", "fleet") if ctx.get_parameter_source(name) is typed
    }


_JSON = {"flag": False}  # --json on this command line (log lines are JSON only then)


def _output_error(exc: OSError) -> Exception:
    """An OSError from writing stdout as an OutputError; any other OSError as it was.

    A broken pipe counts only when stdout's reader is gone (a socket's EPIPE is not stdout's).
    """
    if exc.errno not in _OUTPUT_ERRNOS or (exc.errno == errno.EPIPE and not _stdout_closed()):
        return exc
    _silence_stdout()
    return OutputError(
        f"stdout: cannot write the output: {_OUTPUT_ERRNOS[exc.errno]}; the output was cut short",
        hint="run again with stdout to a reader that takes it all (or a disk with room)",
    )


def _stdout_closed() -> bool:
    """True when stdout is a pipe whose reader has gone (poll says POLLERR)."""
    import select

    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(ev & select.POLLERR for _, ev in poller.poll(0))
    except (OSError, ValueError, AttributeError):
        return False


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so that nothing buffered fails again at exit."""
    try:
        fd = os.open(os.devnull, os.O_WRONLY)
        os.dup2(fd, sys.stdout.fileno())
        os.close(fd)
    except (OSError, ValueError, AttributeError):
        pass


def _usage_error(exc: click.ClickException, as_json: bool) -> None:
    """A click usage error in the shape of every error: error:/hint: lines, or one JSON object."""
    data: dict[str, object] = {"error": "UsageError", "message": exc.format_message()}
    ctx = getattr(exc, "ctx", None)
    if ctx is not None:
        usage = ctx.get_usage().strip().removeprefix("Usage:").strip()
        data["hint"] = f"see {ctx.command_path} --help (usage: {usage})"
    if as_json:
        click.echo(json.dumps(data), err=True)
        return
    click.secho(f"error: {data['message']}", fg="red", err=True)
    if "hint" in data:
        click.echo(f"hint: {data['hint']}", err=True)


def _report_error(exc: SparkOpsError, as_json: bool) -> None:
    """Print an error for a person (or as JSON) on stderr."""
    if as_json:
        click.echo(json.dumps(exc.to_dict()), err=True)
        return
    said = sys.modules.get("spark_ops.cli.common")  # loaded when a step line was printed
    step = getattr(said, "SAID", {}).get(exc.message)
    if step is not None:  # its ✗ line above says it: once is enough
        click.secho(f"error: the {step} step failed (the ✗ {step} line above)", fg="red", err=True)
    else:
        click.secho(f"error: {exc.message}", fg="red", err=True)
    lines = getattr(exc, "lines", None)
    if lines:
        click.echo("  log lines that show why:", err=True)
        for line in lines[-12:]:
            click.echo(f"    {line}", err=True)
    changes = getattr(exc, "changes", None)
    if changes:
        click.echo("  what changed since the plan was shown:", err=True)
        for line in changes[:20]:
            click.echo(f"    {line}", err=True)
    standing = getattr(exc, "standing", None)
    if standing:
        click.echo("  where the cluster stands:", err=True)
        for line in standing:
            click.echo(f"    {line}", err=True)
    if exc.hint:
        click.echo(f"hint: {exc.hint}", err=True)


def _json_flag(args: list[str]) -> bool:
    """True when --json was given (before any `--`): every command's --json is a flag."""
    words = args[: args.index("--")] if "--" in args else args
    return "--json" in words


def main(argv: list[str] | None = None) -> Any:
    """Run the CLI, mapping errors to ExitStatus codes."""
    args = sys.argv[1:] if argv is None else argv
    as_json = _JSON["flag"] = _json_flag(args)
    try:
        try:
            rc = cli.main(args=args, prog_name="spark-ops", standalone_mode=False)
            sys.stdout.flush()  # what is still buffered fails here, not at exit
        except OSError as exc:
            error = _output_error(exc)
            if error is exc:
                raise
            raise error from exc
    except SparkOpsError as exc:
        _report_error(exc, as_json)
        sys.exit(int(exc.exit_status))
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(int(ExitStatus.ABORTED))
    except click.ClickException as exc:
        _usage_error(exc, as_json)
        sys.exit(int(ExitStatus.USAGE))
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        sys.exit(int(ExitStatus.ABORTED))
    sys.exit(int(rc) if isinstance(rc, int) else int(ExitStatus.OK))


if __name__ == "__main__":
    main()
