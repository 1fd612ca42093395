"""The one YAML loader for files an operator (or a colleague) hands spark-ops.

PyYAML's safe loader shares an aliased node, but anything that walks the result (validation,
`repr` in an error) expands it: nine levels of `[*a, *a, …]` are gigabytes. Here an alias count
past a small limit, or a text past a size limit, is refused at once, naming the file and line.
"""

from __future__ import annotations

import re
from typing import Any

from spark_ops.errors import SparkOpsError

MAX_ALIASES = 64  # real inventories and recipes use a handful (`<<: *defaults`)
MAX_YAML_BYTES = 1 << 20  # 1 MiB: a recipe or an inventory is a few kilobytes


def load_yaml(
    text: str,
    *,
    source: str,
    error: type[SparkOpsError],
    max_aliases: int = MAX_ALIASES,
    max_bytes: int = MAX_YAML_BYTES,
) -> Any:
    """Parse YAML text safely; `error` naming `source` for bad YAML, too many aliases or bytes."""
    import yaml

    size = len(text.encode("utf-8", "surrogatepass"))
    if size > max_bytes:
        raise error(
            f"{source}: {size:,} bytes, more than the {max_bytes:,} spark-ops reads; refused "
            "before parsing",
            hint="check that the path names the right file",
        )

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml: ~10x the pure parser
    try:
        if len(_ALIAS_LIKE.findall(text)) > max_aliases:  # only then count the real aliases
            _count_aliases(yaml, loader, text, source, error, max_aliases)
        return yaml.load(text, Loader=loader)
    except yaml.YAMLError as exc:
        raise error(f"{source}: not valid YAML: {exc}") from exc


_ALIAS_LIKE = re.compile(r"\*[^\s,\[\]{}]")


def _count_aliases(
    yaml: Any, loader: Any, text: str, source: str, error: type[SparkOpsError], limit: int
) -> None:
    """Walk the parse events (no value is built) and refuse the alias past the limit."""
    seen = 0
    for event in yaml.parse(text, Loader=loader):
        if isinstance(event, yaml.AliasEvent):
            seen += 1
            if seen > limit:
                raise error(
                    f"{source}: line {event.start_mark.line + 1}: more than {limit} YAML "
                    "aliases (*name); refused (an alias bomb expands to gigabytes)",
                    hint="write the values out, or use fewer anchors",
                )
