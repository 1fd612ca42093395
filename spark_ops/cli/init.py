"""`spark-ops init`: write an inventory from the cluster you already run; say what is missing."""

from __future__ import annotations

import click

from spark_ops.cli.common import emit_json, run_async

_MARK = {"found": ("✓", "green"), "warn": ("!", "yellow"), "missing": ("✗", "red")}


@click.command()
@click.option(
    "--hosts",
    metavar="H1,H2,…",
    help="Nodes, first = head; each HOST, HOST:PORT or NAME=HOST[:PORT].",
)
@click.option(
    "--from-env",
    "from_env",
    metavar="HOST:PATH",
    help="Read CLUSTER_NODES, ETH_IF, IB_IF from the launch setup's .env on the head.",
)
@click.option(
    "--from-sparkrun",
    "from_sparkrun",
    is_flag=False,
    flag_value="",
    default=None,
    metavar="[NAME]",
    help="Read sparkrun cluster NAME (default: sparkrun's default) from ~/.config/sparkrun.",
)
@click.option(
    "--sparkrun-home",
    "sparkrun_home",
    metavar="DIR",
    help="The home whose .config/sparkrun and .cache/sparkrun to read (default: ~).",
)
@click.option("--user", help="SSH user on every node.")
@click.option("--identity", multiple=True, metavar="KEY", help="SSH private key (repeatable).")
@click.option(
    "--known-hosts", "known_hosts", metavar="FILE", help="known_hosts file to check keys."
)
@click.option("--port", type=click.IntRange(1, 65535), help="SSH port (default 22).")
@click.option("--recipe", metavar="PATH", help="The recipe's path on the head (else searched).")
@click.option(
    "--name",
    default="spark",
    show_default=True,
    help="Cluster name in the inventory (--from-sparkrun: the sparkrun name).",
)
@click.option(
    "-o",
    "--output",
    default="inventory/cluster.yaml",
    show_default=True,
    type=click.Path(dir_okay=False),
    help="Where to write the inventory.",
)
@click.option("--force", is_flag=True, help="Replace the output file if it exists.")
@click.option("--json", "as_json", is_flag=True, help="Findings and inventory as JSON on stdout.")
def cli(
    hosts: str | None,
    from_env: str | None,
    from_sparkrun: str | None,
    sparkrun_home: str | None,
    user: str | None,
    identity: tuple[str, ...],
    known_hosts: str | None,
    port: int | None,
    recipe: str | None,
    name: str,
    output: str,
    force: bool,
    as_json: bool,
) -> None:
    """Connect to the nodes, find recipe, watchdog, engine log and API, and write the inventory."""
    from spark_ops.discover import InitOptions, check_output, discover, write_inventory

    if sum((bool(hosts), bool(from_env), from_sparkrun is not None)) != 1:
        raise click.UsageError(
            "give exactly one of --hosts H1,H2,…, --from-env HOST:PATH or --from-sparkrun [NAME]"
        )
    check_output(output, force=force)  # before connecting to any node
    opts = InitOptions(
        hosts=hosts,
        from_env=from_env,
        user=user,
        identity=identity,
        known_hosts=known_hosts,
        port=port,
        recipe=recipe,
        name=name,
        from_sparkrun=from_sparkrun,
        sparkrun_home=sparkrun_home,
    )
    result = run_async(discover(opts))
    path = write_inventory(output, result.text, force=force)
    if as_json:
        emit_json({"path": str(path), **result.to_dict()})
        return
    click.secho(f"Wrote {path}:", bold=True)
    click.echo()
    click.echo(result.text)
    for f in result.findings:
        mark, color = _MARK.get(f.status, ("?", None))
        value = f" = {f.value}" if f.value is not None and f.status != "missing" else ""
        click.secho(f"{mark} {f.key}{value}: {f.detail}", fg=color)
    if result.complete:
        click.secho(f"Everything was found. Next: spark-ops -i {path} doctor", fg="green")
    else:
        n = len(result.missing())
        click.secho(
            f"{n} item(s) left as TODO lines in {path}: fill them in, then "
            f"spark-ops -i {path} doctor",
            fg="yellow",
        )
