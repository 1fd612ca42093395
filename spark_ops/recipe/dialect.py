"""Which recipe format a file is written in: spark-vllm-docker's run-recipe, or sparkrun v2.

Detected from the file's own `recipe_version`, never guessed: "1" (or no version, the
run-recipe default) is the spark-vllm-docker format; "2" is sparkrun's. A file without a
version that uses keys only sparkrun knows is refused with the key named.
"""

from __future__ import annotations

import enum
from typing import Any

from spark_ops.errors import RecipeError, UnsupportedRecipe


class Dialect(enum.Enum):
    """A recipe format spark-ops reads and edits."""

    EUGR = "spark-vllm-docker"
    SPARKRUN = "sparkrun"


#: Top-level keys only a sparkrun v2 recipe has (run-recipe ignores or rejects them).
SPARKRUN_ONLY_KEYS = (
    "include",
    "overrides",
    "runtime",
    "executor_config",
    "min_nodes",
    "max_nodes",
)


def detect_dialect(data: dict[str, Any], *, source: str) -> Dialect:
    """The dialect a parsed recipe declares; RecipeError for an unknown or unstated one."""
    version = data.get("recipe_version")
    if version is None:
        stray = [key for key in SPARKRUN_ONLY_KEYS if key in data]
        if stray:
            raise UnsupportedRecipe(
                f"{source}: no 'recipe_version', but key {stray[0]!r} is sparkrun's; spark-ops "
                "will not guess the format",
                hint='add recipe_version: "2" (sparkrun) or remove the sparkrun keys '
                '(recipe_version: "1", spark-vllm-docker run-recipe)',
            )
        return Dialect.EUGR
    text = str(version).strip()
    if text == "1":
        return Dialect.EUGR
    if text == "2":
        return Dialect.SPARKRUN
    raise RecipeError(
        f"{source}: recipe_version {version!r} is not one spark-ops knows; allowed: "
        '"1" (spark-vllm-docker run-recipe) or "2" (sparkrun)'
    )


def check_sparkrun_shape(data: dict[str, Any], *, source: str) -> None:
    """The value types sparkrun's loader insists on: RecipeError naming the key."""
    command = data.get("command")
    if command is not None and not isinstance(command, str):
        raise RecipeError(f"{source}: key 'command' must be a string (a `command: |` block)")
    for key in ("defaults", "env", "metadata", "executor_config"):
        if data.get(key) is not None and not isinstance(data[key], dict):
            raise RecipeError(f"{source}: key {key!r} must be a mapping, got {data[key]!r}")
    include = data.get("include")
    if include is not None and (not isinstance(include, str) or not include.strip()):
        raise RecipeError(
            f"{source}: key 'include' must name one recipe (a sibling file or @registry/name), "
            f"got {include!r}"
        )
    if "env_templates" in data:
        raise RecipeError(f"{source}: 'env_templates' is not a sparkrun recipe key; use 'env'")
