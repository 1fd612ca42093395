"""`spark-ops recipe`: set knobs with a minimal diff, render, show knob values (local files)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from spark_ops.errors import Aborted, RecipeError, SparkOpsError


def _fail(err: SparkOpsError) -> None:
    """Print `error: <message>` (and the hint) to stderr and exit with the error's status."""
    click.echo(f"error: {err.message}", err=True)
    if err.hint:
        click.echo(f"hint: {err.hint}", err=True)
    raise SystemExit(int(err.exit_status))


@click.group(name="recipe")
def cli() -> None:
    """Edit, render and inspect vLLM recipe files."""


@cli.command("set")
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--max-num-seqs", "max_num_seqs", help="Engine cap on sequences per batch.")
@click.option("--kv-cache-memory", "kv_cache_memory", help="KV cache bytes per GPU (60G, 60g).")
@click.option("--moe-backend", "moe_backend", help="MoE kernel backend (auto, marlin, ...).")
@click.option("--enforce-eager/--no-enforce-eager", default=None, help="Disable CUDA graphs.")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE", help="Set a defaults key.")
@click.option("--flag", "flags", multiple=True, metavar="FLAG[=V]", help="Add or set a flag.")
@click.option("--unset-flag", "unset_flags", multiple=True, metavar="FLAG", help="Remove a flag.")
@click.option("--vllm-version", help="Version of the serving vLLM (else from the container tag).")
@click.option("--dry-run", is_flag=True, help="Show the diff, write nothing.")
@click.option("--yes", is_flag=True, help="Write without asking.")
def set_cmd(
    file: Path,
    max_num_seqs: str | None,
    kv_cache_memory: str | None,
    moe_backend: str | None,
    enforce_eager: bool | None,
    sets: tuple[str, ...],
    flags: tuple[str, ...],
    unset_flags: tuple[str, ...],
    vllm_version: str | None,
    dry_run: bool,
    yes: bool,
) -> None:
    """Change knobs in FILE with a minimal diff; show the diff, then write atomically."""
    from spark_ops.recipe import changes_from_options
    from spark_ops.recipe.files import changes_for, edit_file, write_edit

    try:
        changes = changes_for(
            file,
            lambda: changes_from_options(
                max_num_seqs=max_num_seqs,
                kv_cache_memory=kv_cache_memory,
                moe_backend=moe_backend,
                enforce_eager=enforce_eager,
                sets=sets,
                flags=flags,
                unset_flags=unset_flags,
            ),
        )
        if not changes:
            raise RecipeError(
                "nothing to change: give a knob option, --set, --flag or --unset-flag"
            )
        landed = edit_file(file, changes, vllm_version=vllm_version)
        result, target = landed.edit, Path(landed.target)
        for warning in result.warnings:
            click.echo(f"warning: {warning}", err=True)
        if target != file:
            click.echo(f"{file}: the edit lands in {target} ({'; '.join(landed.reasons)})")
        if not result.changed:
            click.echo(f"{target}: already as requested, nothing to write")
            return
        click.echo(result.diff(str(target)), nl=False)
        if dry_run:
            click.echo("(dry run: nothing written)")
            return
        if not yes and not click.confirm(f"Write {target}?", default=False):
            raise Aborted(f"{target}: not written (declined)")
        backup = write_edit(landed)
        click.echo(f"wrote {target} (backup {backup.name})")
    except SparkOpsError as err:
        _fail(err)


@cli.command("render")
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def render_cmd(file: Path, as_json: bool) -> None:
    """Print the command FILE runs (after placeholders), its env, model and container."""
    import shlex

    from spark_ops.recipe.files import render_file

    try:
        rendered = render_file(file)
    except SparkOpsError as err:
        _fail(err)
        return
    if as_json:
        click.echo(json.dumps(rendered.to_dict(), indent=2))
        return
    for note in rendered.notes:
        click.echo(f"note: {note}", err=True)
    click.echo(f"format:    {rendered.dialect} (runtime {rendered.runtime})")
    for base in rendered.chain:
        click.echo(f"include:   {base}")
    click.echo(f"model:     {rendered.model}")
    click.echo(f"container: {rendered.container}")
    for key, value in rendered.env.items():
        click.echo(f"env:       {key}={value}")
    click.echo(shlex.join(rendered.argv))


@cli.command("show")
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def show_cmd(file: Path, as_json: bool) -> None:
    """Show the four knobs of FILE as vLLM would see them."""
    from spark_ops.recipe.files import dialect_of, knobs_of_file

    try:
        values = knobs_of_file(file)
        dialect = dialect_of(file)
    except SparkOpsError as err:
        _fail(err)
        return
    if as_json:
        click.echo(json.dumps(values, indent=2))
        return
    click.echo(f"{'format':<22} {dialect.value}")
    for key, value in values.items():
        shown = "(vLLM default)" if value is None else value
        click.echo(f"{key:<22} {shown}")


if __name__ == "__main__":  # pragma: no cover
    cli(sys.argv[1:])
