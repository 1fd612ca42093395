"""`spark-ops recipe`: set knobs with a minimal diff, render, show knob values (local files)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from spark_ops.errors import Aborted, RecipeError, SparkOpsError


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
@click.option("--json", "as_json", is_flag=True, help="The outcome as JSON on stdout.")
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
    as_json: bool,
) -> None:
    """Change knobs in FILE with a minimal diff; show the diff, then write atomically.

    The diff is the plan: on stdout unless -q (shown anyway when a prompt asks about it); with
    --json, one document on stdout (file, target, changed, diff, written, backup, warnings), the
    question, if any, on stderr.
    """
    from spark_ops.cli.common import quiet
    from spark_ops.recipe import changes_from_options
    from spark_ops.recipe.edit import naming
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
    except RecipeError as exc:  # the value is refused for this file: the message names it
        raise naming(exc, str(file)) from exc
    if not changes:
        raise RecipeError("nothing to change: give a knob option, --set, --flag or --unset-flag")
    warnings = _check_keys(file, changes, vllm_version)
    landed = edit_file(file, changes, vllm_version=vllm_version)
    result, target = landed.edit, Path(landed.target)
    warnings += list(result.warnings)
    doc: dict[str, Any] = {
        "file": str(file), "target": str(target), "lands_in": list(landed.reasons) if
        target != file else [], "changed": result.changed, "diff": "", "dry_run": dry_run,
        "written": False, "backup": None, "warnings": warnings,
    }  # fmt: skip
    hush = as_json or quiet()
    if not as_json:
        for warning in warnings:
            click.echo(f"warning: {warning}", err=True)
    if target != file and not hush:
        click.echo(f"{file}: the edit lands in {target} ({'; '.join(landed.reasons)})")
    if not result.changed:
        if not hush:
            click.echo(f"{target}: already as requested, nothing to write")
        return _set_done(doc, as_json)
    doc["diff"] = result.diff(str(target))
    asked = not yes and not dry_run
    if not hush or (asked and not as_json):  # -q: the diff only when a prompt asks about it
        click.echo(doc["diff"], nl=False)
    elif asked:  # --json: the plan the question is about, on stderr with it
        click.echo(json.dumps({"diff": doc["diff"], "target": str(target)}), err=True)
    if dry_run:
        if not hush:
            click.echo("(dry run: nothing written)")
        return _set_done(doc, as_json)
    if asked and not click.confirm(f"Write {target}?", default=False, err=True):
        raise Aborted(f"{target}: not written (declined)")
    backup = write_edit(landed)
    doc.update(written=True, backup=str(backup))
    if not hush:
        click.echo(f"wrote {target} (backup {backup.name})")
    return _set_done(doc, as_json)


def _set_done(doc: dict[str, Any], as_json: bool) -> None:
    """`recipe set`'s answer under --json: one document on stdout (nothing otherwise)."""
    if as_json:
        from spark_ops.cli.common import emit_json

        emit_json(doc)


def _check_keys(file: Path, changes: list[Any], vllm_version: str | None) -> list[str]:
    """Refuse --set/--flag keys the serve parser of the recipe's vLLM does not know exactly, when
    that parser's options are known here (a head's cached answer, the shipped 0.32.0 list);
    else say they are unchecked (apply checks them against the head's own vLLM): the warnings."""
    from spark_ops.recipe.changes import refuse_unknown_options, requested_flags
    from spark_ops.recipe.editor import resolve_version
    from spark_ops.recipe.source import load_recipe_text
    from spark_ops.workflows.preflight import local_serve_options

    try:
        text = file.read_text(encoding="utf-8")
        defaults = load_recipe_text(text, source=str(file)).get("defaults")
        version, unknown = resolve_version(text, str(file), vllm_version)
    except (OSError, UnicodeDecodeError, SparkOpsError):
        return []  # the edit itself names what is wrong with the file
    requested = requested_flags(changes, defaults if isinstance(defaults, dict) else {})
    if not requested:
        return []
    found = None if unknown else local_serve_options(version)
    given = ", ".join(g for g, _ in requested)
    if found is None or found.options is None:
        why = "its vLLM version is unknown" if unknown else f"no option list of vLLM {version} here"
        return [
            f"{given}: not checked against vLLM's parser ({why}); spark-ops apply checks them "
            "against the head's vLLM before writing"
        ]
    refuse_unknown_options(requested, found.options, f"vLLM {found.vllm_version} ({found.detail})")
    return []


@cli.command("render")
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def render_cmd(file: Path, as_json: bool) -> None:
    """Print the command FILE runs (after placeholders), its env, model and container."""
    import shlex

    from spark_ops.recipe.files import render_file

    rendered = render_file(file)  # an error is main's to report (as JSON under --json)
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

    values = knobs_of_file(file)
    dialect = dialect_of(file)
    if as_json:
        click.echo(json.dumps(values, indent=2))
        return
    click.echo(f"{'format':<22} {dialect.value}")
    for key, value in values.items():
        shown = "(vLLM default)" if value is None else value
        click.echo(f"{key:<22} {shown}")


if __name__ == "__main__":  # pragma: no cover
    cli(sys.argv[1:])
