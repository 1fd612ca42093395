"""Rendering as run-recipe does it, effective args, knob values, YAML checks, diffs."""

from __future__ import annotations

from pathlib import Path

import pytest

from spark_ops.errors import RecipeError, UnsupportedRecipe
from spark_ops.recipe import (
    Change,
    edit_recipe,
    knob_values,
    load_recipe_text,
    render_recipe,
    unified_diff,
)

GLM = Path(__file__).resolve().parents[1] / "recipes" / "glm-5.3-flash.yaml"


def test_glm_example_renders() -> None:
    """The shipped GLM recipe renders to the expected command, env and knobs."""
    text = GLM.read_text(encoding="utf-8")
    rendered = render_recipe(text, source=str(GLM))
    assert rendered.argv[:3] == ["vllm", "serve", "zai-org/GLM-5.3-Flash-NVFP4"]
    assert rendered.model == "zai-org/GLM-5.3-Flash-NVFP4"
    assert rendered.container == "vllm/vllm-openai:glm53-flash-arm64-cu130"
    assert rendered.env["RAY_memory_monitor_refresh_ms"] == "0"
    args = rendered.args()
    assert args["--tensor-parallel-size"] == "4"
    assert args["--distributed-executor-backend"] == "ray"
    assert knob_values(text, source="glm") == {
        "max_num_seqs": 6,
        "kv_cache_memory_bytes": 64_424_509_440,
        "moe_backend": "marlin",
        "enforce_eager": True,
    }


def test_glm_example_edit_roundtrip() -> None:
    """Raising max_num_seqs on the GLM recipe changes one defaults line, comment kept."""
    text = GLM.read_text(encoding="utf-8")
    result = edit_recipe(text, [Change.knob("max_num_seqs", 64)], source="glm.yaml")
    diff = result.diff("glm.yaml").splitlines()
    assert [line for line in diff if line[:1] in "+-" and line[:3] not in ("+++", "---")] == [
        "-  max_num_seqs: 6          # interactive default; raise for batch work",
        "+  max_num_seqs: 64          # interactive default; raise for batch work",
    ]
    assert result.warnings == []


ARGS_RECIPE = """\
name: args
defaults:
  seqs: 4
  json: '{"a": 1}'
command: |
  exec vllm serve org/M \\
    --max-num-seqs 2 --max_num_seqs={seqs} \\
    -tp 2 \\
    --kv-cache-memory 8g \\
    --compilation-config '{{"mode": 3}}' \\
    --speculative-config '{json}' \\
    --enforce-eager --no-enforce-eager \\
    --enable-prefix-caching \\
    --default-chat-template-kwargs.thinking=true \\
    --served-model-name "my model"  # inline comment
    # --max-num-seqs 99
"""


def test_args_last_wins_and_spellings() -> None:
    """Effective flags: last wins, =/space forms, aliases, bare True, --no-x False."""
    rendered = render_recipe(ARGS_RECIPE, source="args.yaml")
    args = rendered.args()
    assert args["--max-num-seqs"] == "4"
    assert args["--tensor-parallel-size"] == "2"
    assert args["--kv-cache-memory-bytes"] == "8g"
    assert args["--compilation-config"] == '{"mode": 3}'
    assert args["--speculative-config"] == '{"a": 1}'
    assert args["--enforce-eager"] is False
    assert args["--enable-prefix-caching"] is True
    assert args["--default-chat-template-kwargs.thinking"] == "true"
    assert args["--served-model-name"] == "my model"
    assert "99" not in rendered.argv and "#" not in " ".join(rendered.argv)
    assert knob_values(ARGS_RECIPE, source="a")["enforce_eager"] is False


def test_missing_placeholder_names_key() -> None:
    """A placeholder without a defaults key is refused, naming the key."""
    text = "name: x\ncommand: |\n  vllm serve m --port {port}\n"
    with pytest.raises(RecipeError, match="no key 'port'"):
        render_recipe(text, source="x.yaml")
    with pytest.raises(RecipeError, match="placeholders must be named"):
        render_recipe("command: vllm serve m --x {0}\n", source="x.yaml")


def test_not_vllm_serve_renders_but_has_no_args() -> None:
    """An entrypoint command renders to argv; its flags are refused."""
    rendered = render_recipe("command: |\n  exec /opt/entry.sh --a 1\n", source="e.yaml")
    assert rendered.argv == ["exec", "/opt/entry.sh", "--a", "1"]
    assert not rendered.is_vllm_serve()
    with pytest.raises(UnsupportedRecipe, match="not `vllm serve`"):
        rendered.args()


def test_second_command_refused() -> None:
    """A blank line inside a continuation ends the command in bash: refused with the line."""
    text = "command: |\n  vllm serve m \\\n\n  --port 1\n"
    with pytest.raises(UnsupportedRecipe, match="command line 3"):
        render_recipe(text, source="b.yaml")


@pytest.mark.parametrize(
    "text, match",
    [
        ("command: [unclosed\n", "not valid YAML"),
        ("- a\n- b\n", "must be a YAML mapping"),
        ("name: x\n", "key 'command' is missing"),
        ("command: |\n  vllm serve m\ndefaults: [1]\n", "'defaults' must be a mapping"),
        ("command: 3\n", "key 'command'"),
    ],
)
def test_load_recipe_text_errors(text: str, match: str) -> None:
    """YAML and required keys are checked, naming the file and key."""
    with pytest.raises(RecipeError, match=match) as info:
        load_recipe_text(text, source="bad.yaml")
    assert "bad.yaml" in info.value.message


def test_unified_diff_marks_missing_newline() -> None:
    """The diff names the path and shows a missing final newline."""
    diff = unified_diff("a\nb", "a\nc", "r.yaml")
    assert diff.startswith("--- a/r.yaml\n+++ b/r.yaml\n")
    assert "\\ No newline at end of file" in diff
    assert unified_diff("same\n", "same\n", "r.yaml") == ""


def test_folded_command_edited_without_backslashes() -> None:
    """A plain folded command (`>-`) takes a new line of its own, no `\\` (YAML folds it)."""
    text = "command: >-\n  vllm serve m\n  --port 1\n"
    result = edit_recipe(text, [Change.knob("max_num_seqs", 3)], source="f.yaml")
    assert result.text == "command: >-\n  vllm serve m\n  --max-num-seqs 3\n  --port 1\n"
    assert render_recipe(result.text, source="f.yaml").argv[-4:] == [
        "--max-num-seqs",
        "3",
        "--port",
        "1",
    ]


@pytest.mark.parametrize(
    "body",
    [
        "  vllm serve m \\\n  --port 1\n",
        "  vllm serve m\n    --port 1\n",
        "  vllm serve m\n\n  --port 1\n",
    ],
)
def test_folded_command_with_breaks_refused(body: str) -> None:
    """A folded command with a `\\`, a deeper line or a blank line is refused, named."""
    with pytest.raises(UnsupportedRecipe, match="folded ones"):
        edit_recipe("command: >\n" + body, [Change.knob("max_num_seqs", 3)], source="f.yaml")


def test_env_created_for_legacy_moe() -> None:
    """Before 0.18 a recipe without env gets one, and a --moe-backend flag is dropped."""
    text = "name: x\ncommand: |\n  vllm serve m \\\n    --moe-backend marlin \\\n    --port 1\n"
    result = edit_recipe(
        text, [Change.knob("moe_backend", "cutlass")], source="x.yaml", vllm_version="0.17.0"
    )
    rendered = render_recipe(result.text, source="x.yaml")
    assert rendered.env["VLLM_NVFP4_GEMM_BACKEND"] == "cutlass"
    assert "--moe-backend" not in rendered.argv
    assert any("no --moe-backend flag" in w for w in result.warnings)
    flow = "name: x\nenv: {}\ncommand: |\n  vllm serve m --port 1\n"
    result = edit_recipe(
        flow, [Change.knob("moe_backend", "marlin")], source="x.yaml", vllm_version="0.17.0"
    )
    assert render_recipe(result.text, source="x.yaml").env["VLLM_MXFP4_USE_MARLIN"] == "1"
    with pytest.raises(RecipeError, match="legacy environment variables can only select"):
        edit_recipe(text, [Change.knob("moe_backend", "triton")], source="x", vllm_version="0.17")


def test_self_check_refuses_collateral_changes() -> None:
    """The post-edit check refuses a result where an unrequested flag or env var moved."""
    from spark_ops.recipe.diff import check_others

    change = [Change.knob("max_num_seqs", 8)]
    check_others({"--max-num-seqs": "4"}, {"--max-num-seqs": "8"}, {}, {}, change, "r.yaml")
    with pytest.raises(RecipeError, match="changed --port too"):
        check_others({"--port": "1"}, {"--port": "2"}, {}, {}, change, "r.yaml")
    with pytest.raises(RecipeError, match="changed env A"):
        check_others({}, {}, {"A": "1"}, {}, change, "r.yaml")
