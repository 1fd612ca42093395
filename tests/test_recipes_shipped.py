"""Every recipe shipped in recipes/ is valid: it loads, renders to `vllm serve`, has the knobs."""

from __future__ import annotations

from pathlib import Path

import pytest

from spark_ops.recipe import knob_values, load_recipe_text, render_recipe

RECIPES = sorted(
    p for p in (Path(__file__).resolve().parents[1] / "recipes").rglob("*.yaml")
    if p.name != "engine.yaml"  # the simulator's parameters, not a recipe
)  # fmt: skip


def test_there_are_shipped_recipes() -> None:
    """The GLM example and the embedded cluster's recipe are there."""
    assert {p.name for p in RECIPES} >= {"glm-5.3-flash.yaml", "glm-5.3-flash-sim.yaml"}


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.name)
def test_shipped_recipe_is_valid(path: Path) -> None:
    """Loads, renders to a vllm serve command line, and states the four knobs."""
    text = path.read_text(encoding="utf-8")
    load_recipe_text(text, source=str(path))
    rendered = render_recipe(text, source=str(path))
    assert rendered.argv[:2] == ["vllm", "serve"]
    knobs = knob_values(text, source=str(path))
    assert knobs["max_num_seqs"] == 6
    assert knobs["kv_cache_memory_bytes"] == 60 * 1024**3
    assert knobs["moe_backend"] == "marlin" and knobs["enforce_eager"] is True
