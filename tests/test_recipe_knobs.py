"""Knob validation as vLLM parses it, version knowledge, and Change construction."""

from __future__ import annotations

import pytest

from spark_ops.errors import KnobError
from spark_ops.recipe import (
    Change,
    changes_from_options,
    moe_backends,
    parse_kv_cache_memory,
    parse_max_num_seqs,
    version_from_container,
)
from spark_ops.recipe.knobs import backend_from_legacy_env, legacy_env_warnings, parse_version

# The accepted and refused values of --kv-cache-memory are in tests/fixtures/sizes/cases.yaml
# (tests/test_sizes.py), one table with the simulated vLLM's parser and vLLM's own.


def test_kv_cache_memory_huge_value_shown_cut() -> None:
    """A huge value is refused with a message that shows it cut, not whole."""
    with pytest.raises(KnobError, match=r"characters\) is not accepted") as info:
        parse_kv_cache_memory("9" * 10_000)
    assert len(info.value.message) < 500


@pytest.mark.parametrize("value", [0, -3, "abc", "1.5", True, "", "99999999999999999999", "70000"])
def test_max_num_seqs_rejected(value: object) -> None:
    """--max-num-seqs takes positive integers only."""
    with pytest.raises(KnobError, match=r"positive integer|more than 65,536"):
        parse_max_num_seqs(value)


def test_max_num_seqs_accepted() -> None:
    """Strings and ints are accepted."""
    assert parse_max_num_seqs("64") == 64
    assert parse_max_num_seqs(1) == 1


@pytest.mark.parametrize(
    "container, version",
    [
        ("vllm/vllm-openai:v0.19.1", "0.19.1"),
        ("vllm/vllm-openai:v0.17.0-aarch64-cu130", "0.17.0"),
        ("vllm/vllm-openai:v0.26.0", "0.26.0"),
        ("eugr-spark-vllm-deepseek-v4-reap-gb10:0.26-dgfix", "0.26"),
        ("vllm/vllm-openai:glm53-flash-arm64-cu130", None),
        ("vllm-node-b12x", None),
        ("ghcr.io/x/vllm-thing@sha256:2e07", None),
        ("nginx:1.25", None),
        ("", None),
    ],
)
def test_version_from_container(container: str, version: str | None) -> None:
    """A version comes only from a vLLM image's version tag."""
    assert version_from_container(container) == version


def test_moe_backends_by_version() -> None:
    """0.18 brings the flag, 0.22 adds flashinfer_b12x/emulation, 0.33 adds b12x."""
    assert moe_backends("0.17.1") == ()
    assert "marlin" in moe_backends("0.18.0")
    assert "flashinfer_b12x" not in moe_backends("0.21.9")
    assert {"flashinfer_b12x", "emulation"} <= set(moe_backends("0.22.0"))
    assert "b12x" not in moe_backends("0.32.0")
    assert "b12x" in moe_backends("v0.33.0")
    with pytest.raises(KnobError, match="not understood"):
        parse_version("latest")


def test_legacy_env_warnings() -> None:
    """Deprecated from 0.22, ignored from 0.33, silent before."""
    keys = ["VLLM_USE_FLASHINFER_MOE_FP4", "OTHER"]
    assert legacy_env_warnings(keys, "0.19.0") == []
    assert "deprecated" in legacy_env_warnings(keys, "0.22.0")[0]
    assert "ignores them" in legacy_env_warnings(keys, "0.33.0")[0]
    assert legacy_env_warnings(["OTHER"], "0.33.0") == []


def test_backend_from_legacy_env() -> None:
    """The env spelling reads back as a backend when it is clear."""
    assert backend_from_legacy_env({"VLLM_MXFP4_USE_MARLIN": "1"}) == "marlin"
    assert backend_from_legacy_env({"VLLM_USE_FLASHINFER_MOE_FP4": "1"}) == "flashinfer_cutlass"
    assert backend_from_legacy_env({}) is None


def test_changes_from_options() -> None:
    """Options become validated changes, in a stable order."""
    changes = changes_from_options(
        max_num_seqs="64",
        kv_cache_memory="60G",
        moe_backend="marlin",
        enforce_eager=False,
        sets=["max_model_len=65536", "max_num_seqs=8"],
        flags=["--enable-prefix-caching", "--max-model-len=1024", "--kv-cache-dtype fp8"],
        unset_flags=["--trust-remote-code"],
    )
    assert [c.describe() for c in changes] == [
        "max_num_seqs=64",
        "kv_cache_memory=60G",
        "moe_backend=marlin",
        "enforce_eager=False",
        "max_model_len=65536",
        "max_num_seqs=8",
        "--enable-prefix-caching",
        "--max-model-len=1024",
        "--kv-cache-dtype=fp8",
        "remove --trust-remote-code",
    ]


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"max_num_seqs": "0"}, "positive integer"),
        ({"kv_cache_memory": "60GiB"}, "not accepted"),
        ({"moe_backend": "fastest"}, "allowed: auto"),
        ({"sets": ["max_model_len"]}, "KEY=VALUE"),
        ({"sets": ["bad key=1"]}, "not a defaults key"),
        ({"flags": ["enable-prefix-caching"]}, "not a command-line option"),
        ({"flags": ["--max-num-seqs"]}, "needs a value"),
        ({"sets": ["enforce_eager=maybe"]}, "not a boolean"),
    ],
)
def test_changes_from_options_rejects(kwargs: dict, match: str) -> None:
    """Bad options raise KnobError naming the option and what is allowed."""
    with pytest.raises(KnobError, match=match):
        changes_from_options(**kwargs)


def test_flag_spellings_route_to_knobs() -> None:
    """--flag forms of the four knobs become knob changes."""
    assert Change.flag("--enforce-eager") == Change.knob("enforce_eager", True)
    assert Change.flag("--no-enforce-eager") == Change.knob("enforce_eager", False)
    assert Change.flag("--kv-cache-memory", "8g") == Change.knob("kv_cache_memory", "8g")
    assert Change.setting("kv_cache_memory_bytes", "8g") == Change.knob("kv_cache_memory", "8g")
    assert Change.flag("--max_model_len", "5").name == "--max-model-len"


def test_an_edit_the_rendered_command_does_not_show_is_refused() -> None:
    """verify_edit's promise: a new text whose rendered command does not carry each requested
    value is an internal error and nothing is written (here the "new" text is the old one)."""
    from pathlib import Path

    from spark_ops.errors import RecipeError
    from spark_ops.recipe import Change
    from spark_ops.recipe.diff import verify_edit

    path = Path(__file__).parent / "fixtures" / "recipes" / "all_four_knobs" / "before.yaml"
    old = path.read_text("utf-8")
    change = Change.knob("max_num_seqs", 64)
    with pytest.raises(RecipeError, match="did not take effect in the rendered command"):
        verify_edit(old, old, [change], "node1:recipe.yaml", "0.26.0")
    verify_edit(old, old.replace("max_num_seqs: 6", "max_num_seqs: 64"), [change], "r", "0.26.0")
