"""Recipe files on the local disk, either dialect: read, render, show, edit (naming the file).

A sparkrun recipe's `include:` bases are read next to it; an edit may land in a base, and
FileEdit.target says which file to write.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from spark_ops.errors import KnobError, RecipeError, SparkOpsError, UnsupportedRecipe
from spark_ops.files import DEFAULT_KEEP_BACKUPS, sha256_of, write_file
from spark_ops.recipe.changes import Change
from spark_ops.recipe.dialect import Dialect, detect_dialect
from spark_ops.recipe.edit import edit_recipe
from spark_ops.recipe.render import Rendered, knob_values, render_recipe, serve_index
from spark_ops.recipe.source import load_recipe_text
from spark_ops.recipe.sparkrun_edit import FileEdit, edit_sparkrun
from spark_ops.recipe.sparkrun_render import sibling_reader
from spark_ops.yamlsafe import read_capped


def read_recipe(path: Path) -> str:
    """A recipe file as UTF-8 text, byte for byte (no newline translation)."""
    try:
        return read_capped(path, error=RecipeError).decode("utf-8")
    except OSError as exc:
        raise RecipeError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise RecipeError(f"{path}: not UTF-8 text: {exc}") from exc


def dialect_of(path: Path) -> Dialect:
    """The dialect a recipe file declares."""
    return detect_dialect(load_recipe_text(read_recipe(path), source=str(path)), source=str(path))


def render_file(path: Path) -> Rendered:
    """Render a recipe file (sparkrun includes read next to it)."""
    return render_recipe(read_recipe(path), source=str(path), includes=sibling_reader)


def knobs_of_file(path: Path) -> dict[str, object]:
    """The four knobs of a recipe file as vLLM would see them."""
    return knob_values(read_recipe(path), source=str(path), includes=sibling_reader)


def changes_for(path: Path, build: Callable[[], list[Change]]) -> list[Change]:
    """The changes `build` makes from the options; when a value is bad, a recipe that is not
    vLLM says so first (the value would not matter), and the value's error names the file."""
    try:
        return build()
    except KnobError as exc:
        refuse_non_vllm(path)
        raise KnobError(f"{path}: {exc.message}", hint=exc.hint) from exc


def refuse_non_vllm(path: Path) -> None:
    """UnsupportedRecipe when the file's command is not a vLLM server (SGLang, TRT-LLM, …)."""
    try:
        rendered = render_file(path)
    except SparkOpsError:
        return  # a file that does not render is reported by the edit itself
    if rendered.runtime != "vllm":
        raise UnsupportedRecipe(
            f"{path}: runtime {rendered.runtime!r}: spark-ops edits vLLM recipes only",
            hint="edit a non-vLLM recipe by hand",
        )
    if rendered.dialect != Dialect.SPARKRUN.value and serve_index(rendered.argv) is None:
        words = " ".join(rendered.argv[:2])
        raise UnsupportedRecipe(
            f"{path}: command is not `vllm serve` (it runs {words!r}); spark-ops edits vLLM "
            "recipes only",
            hint="edit this recipe by hand, or make its command a literal `vllm serve ...`",
        )


def edit_file(
    path: Path, changes: Sequence[Change], *, vllm_version: str | None = None
) -> FileEdit:
    """Edit a recipe file: the result names the file the edit lands in (a base, maybe)."""
    text = read_recipe(path)
    if dialect_of(path) is Dialect.SPARKRUN:
        return edit_sparkrun(
            text, changes, source=str(path), vllm_version=vllm_version, includes=sibling_reader
        )
    result = edit_recipe(text, changes, source=str(path), vllm_version=vllm_version)
    return FileEdit(str(path), result, [])


def write_edit(landed: FileEdit, *, keep_backups: int = DEFAULT_KEEP_BACKUPS) -> Path:
    """Write a confirmed edit to the file it lands in, with a backup; return the backup's path.

    Written only if the file still holds the text the edit was made from (a colleague's change
    meanwhile is refused, naming the file); through spark-ops' one local writer: atomic, mode
    kept, a symlink written through, the backup named and rotated by the one rule.
    """
    target = Path(landed.target)
    backup = write_file(
        target,
        landed.edit.text,
        error=RecipeError,
        keep_backups=max(keep_backups, 1),
        expect_sha256=sha256_of(landed.edit.original.encode("utf-8")),
    )
    assert backup is not None  # the file was there: its digest matched what was read
    return backup
