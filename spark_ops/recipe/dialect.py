"""Which recipe format a file is written in: spark-vllm-docker's run-recipe, or sparkrun v2.

Detected from the file's own `recipe_version`, never guessed from its look: "2" is sparkrun's.
"1" (or no version, the old run-recipe default) is the spark-vllm-docker format, except where
run-recipe could not run the file and sparkrun can, which makes it sparkrun's:

- no version, but a key only sparkrun knows (sparkrun reads a missing version as "2");
- a version other than "1" and "2" (sparkrun reads every version but "1" as its own format;
  run-recipe accepts only "1");
- "1", but a command that run-recipe's `str.format(**defaults)` rejects: a
  `{placeholder}` that `defaults` does not hold (sparkrun fills `{model}` from `model:`) or
  braces that are not a placeholder (JSON). sparkrun loads such a v1 file and runs it.
"""

from __future__ import annotations

import enum
from typing import Any

from spark_ops.errors import RecipeError


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
    """The dialect a parsed recipe declares; RecipeError for a version neither tool reads."""
    return dialect_and_reason(data, source=source)[0]


def dialect_and_reason(data: dict[str, Any], *, source: str) -> tuple[Dialect, str]:
    """The dialect and, where it is not the declared version itself, why (for `render`)."""
    version = data.get("recipe_version")
    text = "" if version is None else str(version).strip()
    if text == "2":
        return Dialect.SPARKRUN, ""
    if version is None:
        stray = [key for key in SPARKRUN_ONLY_KEYS if key in data]
        if stray:
            return Dialect.SPARKRUN, (
                f"no 'recipe_version', and key {stray[0]!r} is sparkrun's: sparkrun reads the "
                'file as recipe_version "2"'
            )
    elif text != "1":
        if not text.isdigit() or len(text) > 3:
            raise RecipeError(
                f"{source}: recipe_version {version!r} is not one spark-ops knows; allowed: "
                '"1" (spark-vllm-docker run-recipe) or "2" (sparkrun; sparkrun also reads any '
                'other number as "2")'
            )
        return Dialect.SPARKRUN, (
            f'recipe_version {text!r}: run-recipe accepts only "1", sparkrun reads it as "2"'
        )
    why = _run_recipe_cannot_format(data) if text == "1" else ""
    if why:
        return Dialect.SPARKRUN, (
            f"run-recipe cannot fill its command ({why}); sparkrun loads this v1 file and runs "
            "it, so it is read as sparkrun does"
        )
    return Dialect.EUGR, ""


def _run_recipe_cannot_format(data: dict[str, Any]) -> str:
    """Why run-recipe's `command.format(**defaults)` fails on this file ('' when it does not)."""
    command, defaults = data.get("command"), data.get("defaults")
    if not isinstance(command, str) or not isinstance(defaults, (dict, type(None))):
        return ""
    params = {str(k): v for k, v in (defaults or {}).items()}
    try:
        command.format(**params)
    except KeyError as exc:
        return f"{{{exc.args[0]}}} is not in 'defaults'"
    except (IndexError, ValueError, AttributeError) as exc:
        return f"braces that are not a placeholder: {exc}"
    return ""


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
