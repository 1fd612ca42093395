"""The red team of 2026-12-05, round 5: a plan's renderings (recipe.render.Renderings,
Plan.rendered) never answer for a text, or a base, that changed between the plan shown and the
plan under the lock (docs/reliability.md, "The red team of 2026-12-05, round 5")."""

from __future__ import annotations

import pytest

from spark_ops.errors import RecipeError
from spark_ops.recipe import Change, Renderings, edit_recipe
from spark_ops.recipe.sparkrun_edit import edit_sparkrun

SHELL = """\
model: org/tiny
container: vllm:latest
defaults:
  model: org/tiny
  max_num_seqs: {seqs}
command: |
  vllm serve {{model}} --max-num-seqs {{max_num_seqs}} --port 8000
"""

BASE = """\
recipe_version: "2"
model: org/tiny-moe
runtime: vllm
container: ghcr.io/example/vllm:v0.33.0
defaults:
  port: 8000
  max_num_seqs: 8
command: |
  vllm serve {{model}} --port {{port}} {seqs}
"""

TOP = """\
recipe_version: "2"
include: base
defaults:
  max_num_seqs: 16
"""


@pytest.mark.parametrize(
    ("shown", "locked"),
    [
        pytest.param(8, 32, id="colleague-edit-between-the-plans"),
        pytest.param(32, 8, id="colleague-reverts-between-the-plans"),
    ],
)
def test_a_colleagues_text_is_rendered_anew(shown: int, locked: int) -> None:
    """Case 6: the recipe a colleague edits between the plan shown and the plan under the lock
    (which reuses the shown plan's renderings) is rendered from its new text: its knobs and the
    edit's check are the new text's."""
    renders = Renderings()
    first = SHELL.format(seqs=shown)
    assert renders.knobs(first, source="head:r.yaml")["max_num_seqs"] == shown
    second = SHELL.format(seqs=locked)
    assert renders.knobs(second, source="head:r.yaml")["max_num_seqs"] == locked
    edit = edit_recipe(second, [Change("knob", "max_num_seqs", 64)], source="h:r", renders=renders)
    assert "max_num_seqs: 64" in edit.text and f"max_num_seqs: {locked}" in edit.original


def test_a_base_changed_between_two_edits_is_read_anew() -> None:
    """Case 7: a sparkrun recipe whose base (its `include:`) changes between the two plans,
    its own text unchanged: the plan under the lock checks the edit against the new base (a
    base whose command holds the value literally takes the edit), never the memo's rendering."""
    renders = Renderings()
    bases = {"base": BASE.format(seqs="--max-num-seqs {max_num_seqs}")}

    def reader(name: str, source: str) -> tuple[str, str]:
        return bases[name], f"{name}.yaml"

    change = [Change("knob", "max_num_seqs", 64)]
    first = edit_sparkrun(TOP, change, source="top.yaml", includes=reader, renders=renders)
    assert "max_num_seqs: 64" in first.edit.text
    bases["base"] = BASE.format(seqs="--max-num-seqs 4")
    second = edit_sparkrun(TOP, change, source="top.yaml", includes=reader, renders=renders)
    assert (first.target, second.target) == ("top.yaml", "base.yaml"), second.reasons
    assert "--max-num-seqs 64" in second.edit.text


def test_copies_differing_between_nodes_each_render_their_own() -> None:
    """Case 8: two copies that differ (--force) share one plan's renderings: each node's edit is
    made and checked from its own text, and the broken copy is named as it is refused."""
    renders = Renderings()
    good, broken = SHELL.format(seqs=8), SHELL.format(seqs=8).replace("{max_num_seqs}", "{nope}")
    edit = edit_recipe(
        good, [Change("knob", "max_num_seqs", 64)], source="node1:r", renders=renders
    )
    assert "max_num_seqs: 64" in edit.text
    with pytest.raises(RecipeError, match="node2:r"):
        edit_recipe(broken, [Change("knob", "max_num_seqs", 64)], source="node2:r", renders=renders)
