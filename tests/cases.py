"""What the data-driven recipe cases share: a case.yaml's `changes` as spark-ops Changes.

tests/fixtures/recipes/ (eugr) and tests/fixtures/sparkrun/ (sparkrun v2) spell an edit the same
way: `- {knob: K, value: V}`, `- {set: KEY, value: V}`, `- {flag: --F, value: V}`,
`- {unset_flag: --F}`.
"""

from __future__ import annotations

from typing import Any

from spark_ops.recipe import Change


def changes_of(spec: dict[str, Any]) -> list[Change]:
    """Build Change objects from a case.yaml `changes` list."""
    out: list[Change] = []
    for item in spec.get("changes", []):
        if "knob" in item:
            out.append(Change.knob(item["knob"], item["value"]))
        elif "set" in item:
            out.append(Change.setting(item["set"], item["value"]))
        elif "unset_flag" in item:
            out.append(Change.flag(item["unset_flag"], remove=True))
        else:
            out.append(Change.flag(item["flag"], item.get("value")))
    return out
