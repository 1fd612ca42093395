"""Data-driven sparkrun v2 edit cases: tests/fixtures/sparkrun/<case>/{*.yaml, case.yaml, after/}.

case.yaml: `file` (the recipe named), `changes`, then either `target` (the file the edit lands
in), `why` (words of the reason), `touches` and after/<target> (its expected text), or `error`.
Each successful case is also loaded by the real sparkrun: the edited chain renders to the same
words in sparkrun as in spark-ops.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from cases import changes_of
from ground import GroundUnavailable
from ground.sparkrun_venv import bash_words, run_oracle, sparkrun_bin

from spark_ops import errors
from spark_ops.recipe import render_recipe
from spark_ops.recipe.diff import lines_outside
from spark_ops.recipe.files import edit_file
from spark_ops.recipe.sparkrun_render import sibling_reader

CASES = Path(__file__).parent / "fixtures" / "sparkrun"
NAMES = sorted(p.name for p in CASES.iterdir() if (p / "case.yaml").is_file())


def spec_of(name: str) -> dict[str, Any]:
    """A case's case.yaml."""
    return dict(yaml.safe_load((CASES / name / "case.yaml").read_text(encoding="utf-8")))


def run_case(name: str, folder: Path) -> tuple[dict[str, Any], Any]:
    """Edit the case's recipe in `folder` (a copy of the case)."""
    spec = spec_of(name)
    return spec, edit_file(folder / spec["file"], changes_of(spec))


@pytest.mark.parametrize("name", NAMES)
def test_case(name: str, tmp_path: Path) -> None:
    """The edit lands in the named file with the expected text, or is refused as expected."""
    folder = tmp_path / name
    shutil.copytree(CASES / name, folder)
    spec = spec_of(name)
    if "error" in spec:
        err_type = getattr(errors, spec["error"]["type"])
        with pytest.raises(err_type, match=spec["error"]["match"]):
            run_case(name, folder)
        return
    spec, result = run_case(name, folder)
    assert Path(result.target).name == spec["target"]
    assert any(spec["why"] in why for why in result.reasons), result.reasons
    expected = (folder / "after" / spec["target"]).read_bytes().decode("utf-8")
    assert result.edit.text == expected
    assert lines_outside(result.edit.original, result.edit.text, spec["touches"]) == []
    Path(result.target).write_bytes(result.edit.text.encode("utf-8"))
    again = run_case(name, folder)[1]
    assert again.edit.text == result.edit.text, "a second identical edit must change nothing"


def test_edited_chains_render_the_same_in_sparkrun(tmp_path: Path) -> None:
    """sparkrun's loader (include resolution, flag map) renders every edited chain as spark-ops."""
    try:
        sparkrun_bin()
    except GroundUnavailable as exc:
        pytest.skip(str(exc))
    tops: list[Path] = []
    for name in NAMES:
        if "error" in spec_of(name):
            continue
        folder = tmp_path / name
        shutil.copytree(CASES / name, folder, ignore=shutil.ignore_patterns("after", "case.yaml"))
        spec, result = run_case(name, folder)
        Path(result.target).write_bytes(result.edit.text.encode("utf-8"))
        tops.append(folder / spec["file"])
    oracle = run_oracle(tops, tmp_path / "home")
    for top, entry in zip(tops, oracle, strict=True):
        assert "error" not in entry, entry
        text = top.read_bytes().decode("utf-8")
        mine = render_recipe(text, source=str(top), includes=sibling_reader)
        assert mine.argv == bash_words(str(entry["command"])), top


def test_recipe_set_cli_names_and_writes_the_file_that_holds_the_knob(tmp_path: Path) -> None:
    """`recipe set top.yaml` says the edit lands in base.yaml, writes it (with a backup) only."""
    from click.testing import CliRunner

    from spark_ops.cli.recipe import cli

    folder = tmp_path / "chain"
    shutil.copytree(CASES / "include_knob_in_base_defaults", folder)
    top_before = (folder / "top.yaml").read_bytes()
    out = CliRunner().invoke(
        cli, ["set", str(folder / "top.yaml"), "--max-num-seqs", "64", "--yes"]
    )
    assert out.exit_code == 0, out.output
    assert f"the edit lands in {folder / 'base.yaml'}" in out.output
    assert "reads {max_num_seqs}, set in" in out.output
    assert (folder / "top.yaml").read_bytes() == top_before
    expected = (folder / "after" / "base.yaml").read_bytes()
    assert (folder / "base.yaml").read_bytes() == expected
    assert len(list(folder.glob("base.yaml.bak.*"))) == 1
    shown = CliRunner().invoke(cli, ["render", str(folder / "top.yaml")])
    assert "format:    sparkrun (runtime vllm)" in shown.output
    assert "--max-num-seqs 64" in shown.output and "--port 9000" in shown.output
