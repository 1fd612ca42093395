"""Minimal-diff recipe edits of either dialect: change only the lines a knob or flag lives on."""

from __future__ import annotations

from collections.abc import Sequence

from spark_ops.errors import KnobError, RecipeError, UnsupportedRecipe
from spark_ops.recipe.changes import Change
from spark_ops.recipe.dialect import Dialect, detect_dialect
from spark_ops.recipe.diff import verify_edit
from spark_ops.recipe.editor import Editor, RecipeEdit, version_for
from spark_ops.recipe.render import Renderings
from spark_ops.recipe.source import load_recipe_text
from spark_ops.recipe.sparkrun_edit import edit_sparkrun


def edit_recipe(
    text: str,
    changes: Sequence[Change],
    *,
    source: str,
    vllm_version: str | None = None,
    renders: Renderings | None = None,
) -> RecipeEdit:
    """Apply changes with a minimal diff; verify the result parses and renders to the request.

    Every RecipeError names the recipe (`source`) first, whichever check raised it. `renders`:
    the plan's renderings, which keep the old and the new text rendered for the plan's own use.
    """
    try:
        return _edit(text, changes, source=source, vllm_version=vllm_version, renders=renders)
    except RecipeError as exc:
        named = naming(exc, source)
        if named is exc:
            raise
        raise named from exc


def naming(exc: RecipeError, source: str) -> RecipeError:
    """The error itself when its message names `source`, else the same error prefixed with it."""
    if exc.message.startswith(f"{source}:") or type(exc) not in (
        RecipeError,
        KnobError,
        UnsupportedRecipe,
    ):
        return exc
    return type(exc)(f"{source}: {exc.message}", hint=exc.hint)


def _edit(
    text: str,
    changes: Sequence[Change],
    *,
    source: str,
    vllm_version: str | None,
    renders: Renderings | None,
) -> RecipeEdit:
    """edit_recipe's work (its errors are named by the caller)."""
    data = load_recipe_text(text, source=source)
    if detect_dialect(data, source=source) is Dialect.SPARKRUN:
        edit = edit_sparkrun(
            text, changes, source=source, vllm_version=vllm_version, renders=renders
        )
        return edit.edit
    container = data.get("container")
    version, version_warnings = version_for(container, source, vllm_version)
    editor = Editor(text, source, version)
    editor.apply_all(changes, str(container or ""), bool(vllm_version), version_warnings)
    verify_edit(text, editor.text, changes, source, version, renders)
    return RecipeEdit(editor.text, text, editor.warnings, version)
