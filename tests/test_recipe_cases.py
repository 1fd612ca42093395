"""Data-driven recipe edit cases: tests/fixtures/recipes/<case>/{before,after,case}.yaml.

case.yaml: `changes`, then `error`, or `touches` (with `warnings`); `knobs_before`/`knobs_after`:
knobs `recipe show` reads from before.yaml / the edited text (the one resolution of flags)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from cases import changes_of

from spark_ops import errors
from spark_ops.recipe import edit_recipe, knob_values, render_recipe
from spark_ops.recipe.diff import changed_line_pairs, lines_outside

CASES = Path(__file__).parent / "fixtures" / "recipes"
NAMES = sorted(p.name for p in CASES.iterdir() if (p / "case.yaml").is_file())


def assert_touches_only(old: str, new: str, allowed: list[str]) -> None:
    """Every changed line (before or after) mentions an allowed word (flag, key or env var)."""
    outside = lines_outside(old, new, allowed)
    assert not outside, f"lines changed outside {allowed}: {outside}"


@pytest.mark.parametrize("name", NAMES)
def test_case(name: str) -> None:
    """Apply the case's changes; compare with after.yaml, warnings, errors, touched lines."""
    folder = CASES / name
    spec = yaml.safe_load((folder / "case.yaml").read_text(encoding="utf-8"))
    before = (folder / "before.yaml").read_bytes().decode("utf-8")
    source = f"{name}/before.yaml"
    shown = knob_values(before, source=source) if "knobs_before" in spec else {}
    assert {k: shown[k] for k in spec.get("knobs_before", {})} == spec.get("knobs_before", {})
    if "error" in spec:
        err_type = getattr(errors, spec["error"]["type"])
        with pytest.raises(err_type, match=spec["error"]["match"]) as info:
            edit_recipe(
                before, changes_of(spec), source=source, vllm_version=spec.get("vllm_version")
            )
        assert isinstance(info.value, errors.SparkOpsError)
        return
    result = edit_recipe(
        before, changes_of(spec), source=source, vllm_version=spec.get("vllm_version")
    )
    after = (folder / "after.yaml").read_bytes().decode("utf-8")
    assert result.text == after
    assert result.changed == (before != after)
    for wanted in spec.get("warnings", []):
        assert any(wanted in w for w in result.warnings), (wanted, result.warnings)
    if not spec.get("warnings"):
        assert result.warnings == []
    assert_touches_only(before, result.text, spec["touches"])
    shown = knob_values(result.text, source=source) if "knobs_after" in spec else {}
    assert {k: shown[k] for k in spec.get("knobs_after", {})} == spec.get("knobs_after", {})
    again = edit_recipe(
        result.text, changes_of(spec), source=source, vllm_version=spec.get("vllm_version")
    )
    assert again.text == result.text, "a second identical edit must change nothing"


def test_at_least_twenty_cases() -> None:
    """The suite keeps at least 20 cases."""
    assert len(NAMES) >= 20


def test_changed_lines_helper_sees_real_changes() -> None:
    """The touched-lines check itself fails on an unrelated change."""
    with pytest.raises(AssertionError):
        assert_touches_only("a\n--port 1\n", "a\n--port 2\n", ["--max-num-seqs"])
    assert changed_line_pairs("x \\\ny\n", "x\ny\n") == []


@pytest.mark.parametrize("name", NAMES)
def test_after_renders(name: str) -> None:
    """Every after.yaml still renders (parses, placeholders filled, one command)."""
    after = CASES / name / "after.yaml"
    if after.is_file():
        render_recipe(after.read_text(encoding="utf-8"), source=str(after)).args()
