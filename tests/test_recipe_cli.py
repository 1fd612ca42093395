"""`spark-ops recipe` set/render/show through click's CliRunner on real files."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from spark_ops.errors import ExitStatus


class Ran:
    """What `spark-ops recipe ARGS` did: its exit code and its stdout and stderr together."""

    def __init__(self, exit_code: int, output: str) -> None:
        """Keep the code and the text."""
        self.exit_code = exit_code
        self.output = output


def recipe_cli(args: list[str], input: str | None = None) -> Ran:
    """`spark-ops recipe ARGS` as the entry point runs it: errors mapped to their exit codes."""
    from spark_ops.cli.main import main

    with CliRunner().isolation(input=input) as streams:
        try:
            main(["recipe", *args])
            code = 0
        except SystemExit as exc:
            code = int(exc.code or 0)
        out = streams[0].getvalue() + (streams[1].getvalue() if streams[1] else b"")
    return Ran(code, out.decode("utf-8", "replace"))


GLM = Path(__file__).resolve().parents[1] / "recipes" / "glm-5.3-flash.yaml"


@pytest.fixture
def recipe(tmp_path: Path) -> Path:
    """A writable copy of the GLM recipe."""
    path = tmp_path / "glm.yaml"
    shutil.copy(GLM, path)
    return path


def test_set_dry_run_writes_nothing(recipe: Path) -> None:
    """--dry-run shows the diff and leaves the file and directory alone."""
    before = recipe.read_bytes()
    out = recipe_cli(["set", str(recipe), "--max-num-seqs", "64", "--dry-run"])
    assert out.exit_code == 0, out.output
    assert "+  max_num_seqs: 64" in out.output
    assert recipe.read_bytes() == before
    assert sorted(p.name for p in recipe.parent.iterdir()) == ["glm.yaml"]


def test_set_yes_writes_with_backup(recipe: Path) -> None:
    """--yes writes atomically and keeps a timestamped backup of the old bytes."""
    before = recipe.read_bytes()
    args = ["set", str(recipe), "--kv-cache-memory", "40g", "--no-enforce-eager", "--yes"]
    out = recipe_cli(args)
    assert out.exit_code == 0, out.output
    text = recipe.read_text(encoding="utf-8")
    assert "--kv-cache-memory-bytes 40g \\" in text and "--enforce-eager" not in text
    backups = list(recipe.parent.glob("glm.yaml.bak.*"))
    assert len(backups) == 1 and backups[0].read_bytes() == before
    assert not list(recipe.parent.glob(".glm.yaml.*"))
    show = recipe_cli(["show", str(recipe), "--json"])
    assert json.loads(show.output)["kv_cache_memory_bytes"] == 40_000_000_000


def test_set_declined_aborts(recipe: Path) -> None:
    """Answering no leaves the file and exits with ABORTED."""
    before = recipe.read_bytes()
    out = recipe_cli(["set", str(recipe), "--max-num-seqs", "9"], input="n\n")
    assert out.exit_code == ExitStatus.ABORTED
    assert recipe.read_bytes() == before


def test_set_rejects_bad_value(recipe: Path) -> None:
    """A value vLLM would reject exits RECIPE with `error:` on stderr."""
    out = recipe_cli(["set", str(recipe), "--kv-cache-memory", "60GB", "--yes"])
    assert out.exit_code == ExitStatus.RECIPE
    assert f"error: {recipe}: --kv-cache-memory-bytes: '60GB' is not accepted" in out.output


def test_set_unknown_moe_for_version(recipe: Path) -> None:
    """--vllm-version decides which backend names exist."""
    args = ["set", str(recipe), "--moe-backend", "b12x", "--vllm-version", "0.22.0", "--yes"]
    out = recipe_cli(args)
    assert out.exit_code == ExitStatus.RECIPE
    assert "not a backend vLLM 0.22.0 knows" in out.output


@pytest.mark.parametrize(
    ("version", "status", "says"),
    [
        ("0.32.0", ExitStatus.RECIPE, "--max-num-seq is not an option (vLLM would expand the "
         "abbreviation to --max-num-seqs); did you mean --max-num-seqs?"),
        ("0.31.0", 0, "warning: --set max_num_seq: not checked against vLLM's parser"),
    ],
)  # fmt: skip
def test_set_key_typo(
    recipe: Path, version: str, status: int, says: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A --set key vLLM lacks is refused when the version's option list is known here (the
    shipped 0.32.0 list), else written with a warning that apply checks it on the head."""
    monkeypatch.setenv("HOME", str(recipe.parent))  # no cached lists of this machine's heads
    before = recipe.read_bytes()
    args = ["set", str(recipe), "--set", "max_num_seq=48", "--vllm-version", version, "--yes"]
    out = recipe_cli(args)
    assert out.exit_code == status, out.output
    assert says in out.output
    assert (recipe.read_bytes() == before) is (status != 0)


def test_set_generic_and_nothing_to_do(recipe: Path) -> None:
    """--set/--flag/--unset-flag work; an edit to the current value writes nothing."""
    args = ["set", str(recipe), "--set", "max_model_len=65536", "--flag", "--enable-prefix-caching"]
    args += ["--unset-flag", "--trust-remote-code", "--yes"]
    out = recipe_cli(args)
    assert out.exit_code == 0, out.output
    rendered = json.loads(recipe_cli(["render", str(recipe), "--json"]).output)
    assert "--enable-prefix-caching" in rendered["argv"]
    assert "--trust-remote-code" not in rendered["argv"]
    assert rendered["argv"][rendered["argv"].index("--max-model-len") + 1] == "65536"
    out = recipe_cli(["set", str(recipe), "--max-num-seqs", "6", "--yes"])
    assert out.exit_code == 0 and "nothing to write" in out.output
    out = recipe_cli(["set", str(recipe)])
    assert out.exit_code == ExitStatus.RECIPE and "nothing to change" in out.output


def test_render_and_show_text(recipe: Path) -> None:
    """Plain output lists the command and the knobs."""
    out = recipe_cli(["render", str(recipe)])
    assert out.exit_code == 0
    assert "vllm serve zai-org/GLM-5.3-Flash-NVFP4 --host 0.0.0.0" in out.output
    out = recipe_cli(["show", str(recipe)])
    assert "moe_backend" in out.output and "marlin" in out.output


def test_missing_file_and_bad_recipe(tmp_path: Path) -> None:
    """Unreadable or invalid recipes exit RECIPE naming the file."""
    missing = tmp_path / "none.yaml"
    out = recipe_cli(["show", str(missing)])
    assert out.exit_code == ExitStatus.RECIPE and "none.yaml: cannot read" in out.output
    bad = tmp_path / "bad.yaml"
    bad.write_text("command: |\n  /opt/entry.sh\n", encoding="utf-8")
    out = recipe_cli(["set", str(bad), "--max-num-seqs", "3", "--yes"])
    assert out.exit_code == ExitStatus.RECIPE and "not `vllm serve`" in out.output


def test_set_through_a_symlink_keeps_link_and_own_backups(recipe: Path) -> None:
    """`recipe set` on a symlinked recipe writes the target, keeps the link, backs up a copy by
    the one naming rule, and rotates (10 kept) only such backups, never the operator's own."""
    from spark_ops.headlib import backup

    real = recipe.parent / "real" / recipe.name
    real.parent.mkdir()
    shutil.move(recipe, real)
    recipe.symlink_to(real)
    mine = recipe.parent / f"{recipe.name}.bak.2025-11-30-known-good"
    mine.write_text("mine\n")
    for value in range(20, 32):
        out = recipe_cli(["set", str(recipe), "--max-num-seqs", str(value), "--yes"])
        assert out.exit_code == 0, out.output
    assert recipe.is_symlink()
    ours = [p for p in recipe.parent.iterdir() if backup.is_backup_name(str(recipe), p.name)]
    assert len(ours) == backup.DEFAULT_KEEP_BACKUPS and not any(p.is_symlink() for p in ours)
    assert mine.read_text() == "mine\n"
    show = recipe_cli(["show", str(recipe), "--json"])
    assert json.loads(show.output)["max_num_seqs"] == 31


SGLANG = """recipe_version: "2"
model: org/m
runtime: sglang
container: lmsysorg/sglang:v0.5.4
command: |
  python3 -m sglang.launch_server --model-path {model} --port 8000
"""


@pytest.mark.parametrize(
    "text, wanted",
    [
        (SGLANG, "runtime 'sglang': spark-ops edits vLLM recipes only"),
        ("name: t\ncommand: |\n  trtllm-serve org/m --port 1\n", "command is not `vllm serve`"),
    ],
)
def test_bad_value_on_non_vllm_recipe_says_not_vllm_first(
    tmp_path: Path, text: str, wanted: str
) -> None:
    """A bad value given for a non-vLLM recipe: the recipe is named as not vLLM, not the value."""
    path = tmp_path / "other.yaml"
    path.write_text(text, encoding="utf-8")
    out = recipe_cli(["set", str(path), "--max-num-seqs", "lots"])
    assert out.exit_code == ExitStatus.RECIPE, out.output
    assert f"{path}: " in out.output and wanted in out.output
    assert path.read_text(encoding="utf-8") == text


def test_bad_value_error_names_the_file(recipe: Path) -> None:
    """A bad value for a vLLM recipe: the error names the file and the value; nothing written."""
    before = recipe.read_bytes()
    out = recipe_cli(["set", str(recipe), "--max-num-seqs", "lots"])
    assert out.exit_code != 0
    assert f"{recipe}: " in out.output and "lots" in out.output, out.output
    assert recipe.read_bytes() == before
