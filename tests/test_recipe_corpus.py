"""Every community recipe of the shared corpus takes each knob with a minimal diff."""

from __future__ import annotations

from pathlib import Path

import pytest

from spark_ops.errors import UnsupportedRecipe
from spark_ops.recipe import Change, edit_recipe, knob_values, render_recipe
from spark_ops.recipe.diff import lines_outside
from spark_ops.recipe.knobs import LEGACY_MOE_SETTINGS, has_moe_flag

CORPUS = Path(__file__).resolve().parents[2] / "shared" / "corpus" / "recipes"
FILES = sorted(CORPUS.glob("*.yaml")) if CORPUS.is_dir() else []
#: Corpus recipes whose command is not `vllm serve` (an entrypoint script): refused.
NOT_VLLM = {
    "recipes__deepseek-v4-flash-0731-spark-b12x.yaml",
    "recipes__deepseek-v4-flash-fp8-aiden.yaml",
}
KNOB_CASES = [
    ("max_num_seqs", 37, "--max-num-seqs", "37", ["max-num-seqs", "max_num_seqs"]),
    ("kv_cache_memory", "60G", "--kv-cache-memory-bytes", "60G", ["kv-cache-memory", "kv_cache"]),
    ("moe_backend", "marlin", "--moe-backend", "marlin", ["moe-backend", "VLLM_"]),
    ("enforce_eager", True, "--enforce-eager", None, ["enforce-eager"]),
    ("enforce_eager", False, "--enforce-eager", None, ["enforce-eager"]),
]

pytestmark = pytest.mark.skipif(not FILES, reason=f"shared recipe corpus not found at {CORPUS}")


def occurrences(argv: list[str], flag: str, value: str | None) -> int:
    """How many times argv carries `flag value` / `flag=value` (or the bare flag)."""
    count = 0
    for i, word in enumerate(argv):
        bare = value is None and word == flag
        valued = word == flag and argv[i + 1 : i + 2] == [value]
        count += bare or valued or word == f"{flag}={value}"
    return count


def test_corpus_has_35_recipes() -> None:
    """The corpus is the expected one."""
    assert len(FILES) == 35


@pytest.mark.parametrize("path", FILES, ids=[p.name for p in FILES])
@pytest.mark.parametrize("knob, value, flag, shown, words", KNOB_CASES)
def test_corpus_knob(
    path: Path, knob: str, value: object, flag: str, shown: str | None, words: list[str]
) -> None:
    """Edit one knob: only its lines change; the rendered command carries it exactly once."""
    text = path.read_bytes().decode("utf-8")
    change = Change.knob(knob, value)
    if path.name in NOT_VLLM:
        with pytest.raises(UnsupportedRecipe, match="not `vllm serve`"):
            edit_recipe(text, [change], source=path.name)
        return
    result = edit_recipe(text, [change], source=path.name)
    assert lines_outside(text, result.text, words) == []
    rendered = render_recipe(result.text, source=path.name)
    if knob == "moe_backend" and not has_moe_flag(result.vllm_version):
        settings = LEGACY_MOE_SETTINGS[str(value)]
        assert {k: rendered.env.get(k) for k in settings} == settings
        assert occurrences(rendered.argv, flag, shown) == 0
        return
    wanted = (1 if value else 0) if knob == "enforce_eager" else 1
    assert occurrences(rendered.argv, flag, shown) == wanted
    values = knob_values(result.text, source=path.name)
    expected = {"kv_cache_memory": 64424509440}.get(knob, value)
    assert values["kv_cache_memory_bytes" if knob == "kv_cache_memory" else knob] == expected
    untouched = render_recipe(text, source=path.name).args()
    after = rendered.args()
    for key in set(untouched) | set(after):
        if key not in (flag, "--kv-cache-memory"):
            assert untouched.get(key) == after.get(key), key
