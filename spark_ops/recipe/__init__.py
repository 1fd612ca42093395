"""Recipe concern: validation as vLLM parses it, minimal-diff edits, rendering."""

from __future__ import annotations

from typing import TYPE_CHECKING

from spark_ops import lazy_exports

if TYPE_CHECKING:  # the names are imported on first use (a command imports what it runs)
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
    from spark_ops.recipe.render import (
        Rendered,
        Renderings,
        knob_values,
        render_recipe,
        rendered_knobs,
    )
    from spark_ops.recipe.source import load_recipe_text

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "spark_ops.recipe.changes": ("Change", "changes_from_options"),
        "spark_ops.recipe.diff": ("changed_line_pairs", "unified_diff"),
        "spark_ops.recipe.edit": ("edit_recipe",),
        "spark_ops.recipe.editor": ("RecipeEdit",),
        "spark_ops.recipe.knobs": (
            "moe_backends",
            "parse_kv_cache_memory",
            "parse_max_num_seqs",
            "version_from_container",
        ),
        "spark_ops.recipe.render": (
            "Rendered",
            "Renderings",
            "knob_values",
            "render_recipe",
            "rendered_knobs",
        ),
        "spark_ops.recipe.source": ("load_recipe_text",),
    },
)


__all__ = [
    "Change",
    "RecipeEdit",
    "Rendered",
    "Renderings",
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
