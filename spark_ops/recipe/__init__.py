"""Recipe concern: validation as vLLM parses it, minimal-diff edits, rendering."""

from __future__ import annotations

from spark_ops.recipe.changes import Change, changes_from_options
from spark_ops.recipe.diff import changed_line_pairs, unified_diff
from spark_ops.recipe.edit import edit_recipe
from spark_ops.recipe.editor import RecipeEdit
from spark_ops.recipe.knobs import (
    moe_backends,
    parse_kv_cache_memory,
    parse_max_num_seqs,
    version_from_container,
)
from spark_ops.recipe.render import Rendered, knob_values, render_recipe, rendered_knobs
from spark_ops.recipe.source import load_recipe_text

__all__ = [
    "Change",
    "RecipeEdit",
    "Rendered",
    "changed_line_pairs",
    "changes_from_options",
    "edit_recipe",
    "knob_values",
    "load_recipe_text",
    "moe_backends",
    "parse_kv_cache_memory",
    "parse_max_num_seqs",
    "render_recipe",
    "rendered_knobs",
    "unified_diff",
    "version_from_container",
]
