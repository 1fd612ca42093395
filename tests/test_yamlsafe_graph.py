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


def _inventory(text: str) -> object:
    """The inventory's reader."""
    from spark_ops.inventory import parse_inventory

    return parse_inventory(text, "given.yaml")


def _recipe(text: str) -> object:
    """A recipe's reader (either dialect)."""
    from spark_ops.recipe.source import load_recipe_text

    return load_recipe_text(text, source="given.yaml")


def _sparkrun_recipe(text: str) -> object:
    """A sparkrun recipe's reader."""
    from spark_ops.recipe.sparkrun_render import parse_yaml

    return parse_yaml(text, source="given.yaml")


def _prompts(text: str) -> object:
    """bench's prompt file."""
    import tempfile

    from spark_ops.bench.workload import load_prompts

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "given.yaml"
        path.write_text(text, "utf-8")
        return load_prompts(path)


BY_ID = {c["id"]: c for c in CASES}
HOSTILE = ["chain-of-12-anchors-120-deep", "doubling-bomb-under-the-alias-count",
           "self-holding-mapping", "mapping-chain"]  # fmt: skip


@pytest.mark.parametrize("reader", [_inventory, _recipe, _sparkrun_recipe, _prompts],
                         ids=lambda f: f.__name__.strip("_"))  # fmt: skip
@pytest.mark.parametrize("case_id", HOSTILE)
def test_every_reader_refuses_what_aliases_build(reader: Any, case_id: str) -> None:
    """Each file spark-ops reads with the loader refuses the case, naming the file."""
    case = BY_ID[case_id]
    with pytest.raises(SparkOpsError, match=case["refusal"]) as info:
        reader(build(case))
    assert "given.yaml" in info.value.message


@pytest.mark.parametrize("case_id", HOSTILE)
def test_a_typed_value_holding_aliases_is_spelled_whole(case_id: str) -> None:
    """A value the operator types (`apply --set`, an env value) is spelled as a YAML scalar by
    loading it: what its aliases build is refused there too, and the value quoted whole (the
    doubling bomb hung the speller's str() of it before)."""
    from spark_ops.recipe.command import yaml_scalar

    text = build(BY_ID[case_id])
    value = "[" + ", ".join(line.split(": ", 1)[1] for line in text.splitlines()) + "]"
    assert json.loads(yaml_scalar(value, None)) == value
