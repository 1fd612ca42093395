"""What YAML aliases build, refused by the one loader before any value is constructed: a value
nested past 128 levels through alias chains, one written out past the node limit, one holding
itself (cases: tests/fixtures/yamlsafe/graph_cases.yaml)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from spark_ops.errors import SparkOpsError
from spark_ops.yamlsafe import load_yaml

CASES = yaml.safe_load(
    (Path(__file__).parent / "fixtures" / "yamlsafe" / "graph_cases.yaml").read_text("utf-8")
)


def build(case: dict[str, Any]) -> str:
    """The YAML text a case describes."""
    if "text" in case:
        return str(case["text"])
    shape, n = case["shape"], int(case["anchors"])
    if shape == "doubling":
        return "a0: &a0 [x, x]\n" + "".join(
            f"a{i}: &a{i} [*a{i - 1}, *a{i - 1}]\n" for i in range(1, n)
        )
    levels = int(case["levels"])
    lines = ["a0: &a0 x"]
    for i in range(1, n + 1):
        deep = levels + (int(case.get("extra", 0)) if i == n else 0)
        if shape == "chain":
            lines.append(f"a{i}: &a{i} " + "[" * deep + f"*a{i - 1}" + "]" * deep)
        else:
            lines.append(f"a{i}: &a{i} " + "{k: " * deep + f"*a{i - 1}" + "}" * deep)
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_what_aliases_build_is_measured_before_it_is_built(case: dict[str, Any]) -> None:
    """A refusal names the file and says why; a text that loads walks (json.dumps) whole."""
    text = build(case)
    if "refusal" in case:
        with pytest.raises(SparkOpsError, match=case["refusal"]):
            load_yaml(text, source="given.yaml", error=SparkOpsError)
    else:
        json.dumps(load_yaml(text, source="given.yaml", error=SparkOpsError))
