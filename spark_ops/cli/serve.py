"""`spark-ops serve`: the cluster's read-only page and /metrics, behind a token."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import TYPE_CHECKING

import click

from spark_ops.cli.common import fleet_span, load_cluster, run_async

if TYPE_CHECKING:
    from spark_ops.fleet import Fleet
    from spark_ops.inventory import Cluster


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option(
    "--port", type=click.IntRange(0, 65535), default=8765, show_default=True, help="Port (0: any)."
)
@click.option(
    "--token-file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Read the token from FILE (yours, mode 0600). Default: one generated and kept 0600 in "
    "~/.local/state/spark-ops/serve.token.",
)
@click.option(
    "--results",
    type=click.Path(file_okay=False, exists=True, path_type=Path),
    help="Directory of saved sweeps (bench -o DIR/NAME.json) for the sweeps page.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the URLs as one JSON object.")
@click.pass_context
def cli(
    ctx: click.Context,
    host: str,
    port: int,
    token_file: Path | None,
    results: Path | None,
    as_json: bool,
) -> None:
    """Serve the cluster's page, its boot live, history, sweeps and /metrics (read-only).

    Under a fleet without --cluster: the fleet's page at /, each cluster's pages under
    /c/NAME/, and /metrics with every cluster's samples; one process, one token.

    Every request needs the token: `Authorization: Bearer TOKEN` (scripts, Prometheus), or the
    URL printed at start once in a browser (it sets an HttpOnly session cookie). Binds 127.0.0.1
    unless --host says otherwise; no action (apply, restart, prune) is offered.
    """
    from spark_ops.serve.auth import kept_token, read_token_file
    from spark_ops.serve.server import is_loopback, serve

    if token_file is not None:  # refused before the inventory is even read
        token, where = read_token_file(token_file), token_file
    else:
        token, where = kept_token()
    fleet = fleet_span(ctx)
    if fleet is not None and results is not None:
        raise click.UsageError(
            "--results shows one cluster's sweeps: with a fleet, add --cluster NAME"
        )
    if fleet is not None:
        target: Cluster | Fleet = fleet
        what = f"fleet {fleet.path} ({', '.join(fleet.names())})"
    else:
        target = load_cluster(ctx)
        what = f"cluster {target.name}"
    if not is_loopback(host):
        click.secho(
            f"warning: listening on {host}: anyone who can reach it and has the token reads the "
            "cluster; put TLS in front (docs/user-guide.md, reverse proxy)",
            fg="yellow",
            err=True,
        )

    def ready(url: str) -> None:
        """Say where the server listens (stdout: the answer) once it does."""
        login = f"{url}/?token={token}"
        if as_json:
            click.echo(json.dumps({"url": url, "login_url": login, "token_file": str(where)}))
        else:
            click.echo(login)
            click.echo(f"spark-ops serve: {what} on {url} (token in {where}; "
                       "Ctrl-C stops)", err=True)  # fmt: skip

    with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C: the server stops, nothing to undo
        run_async(
            serve(target, token, host=host, port=port, results=results, on_ready=ready,
                  token_path=where)
        )  # fmt: skip
