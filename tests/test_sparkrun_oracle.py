"""The real sparkrun as the oracle: for every recipe of the sparkrun corpus, sparkrun's own loader
(sparkrun 0.4.2 in its venv, offline) renders the file — and each file spark-ops edited — to the
same serve command spark-ops renders; an edited knob is there once with its new value and every
other word is unchanged. SGLang recipes refuse the vLLM knobs with a reason naming the knob.
The counts are the table in docs/sparkrun.md.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest
from ground import GroundUnavailable
from ground.sparkrun_venv import bash_words, flag_maps, run_oracle, sparkrun_bin

from spark_ops.errors import UnsupportedRecipe
from spark_ops.recipe import Change, edit_recipe, knob_values, render_recipe
from spark_ops.recipe.diff import lines_outside
from spark_ops.recipe.sparkrun_maps import (
    VLLM_BOOL_KEYS,
    VLLM_FLAG_MAP,
    VLLM_NEGATABLE_KEYS,
)

CORPUS = next(
    (
        p / "shared" / "corpus" / "sparkrun"
        for p in Path(__file__).resolve().parents
        if (p / "shared" / "corpus" / "sparkrun").is_dir()
    ),
    Path(__file__).resolve().parents[2] / "shared" / "corpus" / "sparkrun",
)
FILES = sorted(CORPUS.glob("*.yaml")) if CORPUS.is_dir() else []
DOC = Path(__file__).resolve().parents[1] / "docs" / "sparkrun.md"
#: knob, value, flag, the word after the flag (None: a bare flag), words the diff may touch.
KNOB_CASES = [
    ("max_num_seqs", 77, "--max-num-seqs", "77", ["max-num-seqs", "max_num_seqs"]),
    ("kv_cache_memory", "12G", "--kv-cache-memory-bytes", "12G", ["kv-cache-memory", "kv_cache"]),
    ("moe_backend", "triton", "--moe-backend", "triton", ["moe-backend", "moe_backend"]),
    ("enforce_eager", True, "--enforce-eager", None, ["enforce-eager", "enforce_eager"]),
    ("enforce_eager", False, "--enforce-eager", None, ["enforce-eager", "enforce_eager"]),
    ("set:max_model_len", "65536", "--max-model-len", "65536", ["max-model-len", "max_model_len"]),
]


def _ground() -> None:
    """Skip (a failure under SPARK_OPS_REQUIRE_GROUND) without the corpus or sparkrun."""
    if not FILES:
        pytest.skip(f"sparkrun corpus not found at {CORPUS}")
    try:
        sparkrun_bin()
    except GroundUnavailable as exc:
        pytest.skip(str(exc))


def without(words: list[str], flag: str, bare: bool) -> list[str]:
    """The words with every occurrence of a flag (and its value) removed."""
    out: list[str] = []
    skip = False
    for word in words:
        if skip:
            skip = False
            continue
        if word == flag:
            skip = not bare
            continue
        if word.startswith(flag + "="):
            continue
        out.append(word)
    return out


def occurrences(words: list[str], flag: str, value: str | None) -> int:
    """How many times words carry `flag value` / `flag=value` (or the bare flag)."""
    count = 0
    for i, word in enumerate(words):
        spaced = word == flag and (value is None or words[i + 1 : i + 2] == [value])
        count += spaced or (value is not None and word == f"{flag}={value}")
    return count


@pytest.fixture(scope="module")
def outcome(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """Render and edit every corpus recipe with spark-ops, then load all with sparkrun once."""
    _ground()
    work = tmp_path_factory.mktemp("sparkrun-oracle")
    edited: list[tuple[Path, Path, tuple[object, ...], str]] = []
    refused: list[tuple[Path, tuple[object, ...], str]] = []
    for path in FILES:
        text = path.read_bytes().decode("utf-8")
        for case in KNOB_CASES:
            knob, value = case[0], case[1]
            change = (
                Change.setting(str(knob)[4:], value)
                if str(knob).startswith("set:")
                else Change.knob(str(knob), value)
            )
            try:
                result = edit_recipe(text, [change], source=path.name)
            except UnsupportedRecipe as exc:
                refused.append((path, case, exc.message))
                continue
            folder = work / f"{knob}-{value}"
            folder.mkdir(exist_ok=True)
            out = folder / path.name
            out.write_bytes(result.text.encode("utf-8"))
            edited.append((path, out, case, result.text))
    home = work / "home"
    oracle = run_oracle([*FILES, *(e[1] for e in edited)], home)
    by_path = {Path(str(entry["path"])): entry for entry in oracle}
    return {"edited": edited, "refused": refused, "oracle": by_path, "home": home}


def sparkrun_words(outcome: dict[str, object], path: Path) -> list[str]:
    """The serve command sparkrun renders for a file, as bash splits it."""
    entry = outcome["oracle"][path]  # type: ignore[index]
    assert "error" not in entry, entry
    return bash_words(str(entry["command"]))


def test_corpus_is_the_one_of_source_md() -> None:
    """40 recipes: 37 vLLM, 3 SGLang."""
    _ground()
    runtimes = Counter(re.search(r"(?m)^runtime: *(\S+)", p.read_text()).group(1) for p in FILES)  # type: ignore[union-attr]
    assert len(FILES) == 40 and runtimes == {"vllm": 37, "sglang": 3}


def test_flag_maps_are_sparkrun_s(tmp_path: Path) -> None:
    """spark-ops' copy of the flag map is the installed sparkrun's, order included."""
    _ground()
    maps = flag_maps(tmp_path / "home")
    assert list(maps["vllm"].items()) == list(VLLM_FLAG_MAP.items())  # type: ignore[attr-defined]
    assert set(maps["vllm_bool"]) == VLLM_BOOL_KEYS  # type: ignore[arg-type]
    assert set(maps["vllm_negatable"]) == VLLM_NEGATABLE_KEYS  # type: ignore[arg-type]


@pytest.mark.parametrize("path", FILES, ids=[p.name for p in FILES])
def test_render_and_show_agree(outcome: dict[str, object], path: Path) -> None:
    """spark-ops renders each recipe to sparkrun's words, env and runtime family."""
    text = path.read_bytes().decode("utf-8")
    rendered = render_recipe(text, source=path.name)
    words = sparkrun_words(outcome, path)
    assert rendered.argv == words
    entry = outcome["oracle"][path]  # type: ignore[index]
    assert rendered.env == entry["env"]
    assert rendered.runtime == ("sglang" if entry["runtime"] == "sglang" else "vllm")
    if rendered.runtime != "vllm":
        with pytest.raises(UnsupportedRecipe, match="max_num_seqs"):
            knob_values(text, source=path.name)
        return
    shown = knob_values(text, source=path.name)
    seqs = [words[i + 1] for i, w in enumerate(words[:-1]) if w == "--max-num-seqs"]
    assert shown["max_num_seqs"] == (int(seqs[-1]) if seqs else None)
    assert shown["enforce_eager"] == ("--enforce-eager" in words)


def test_every_edit_renders_the_same_in_sparkrun(outcome: dict[str, object]) -> None:
    """Each edited file: sparkrun's words == spark-ops' words; the knob once; the rest kept."""
    edited = outcome["edited"]
    assert edited
    for original, out, case, text in edited:  # type: ignore[attr-defined]
        _knob, value, flag, shown, touch = case
        before = sparkrun_words(outcome, original)
        after = sparkrun_words(outcome, out)
        assert render_recipe(text, source=out.name).argv == after, out
        bare = shown is None
        wanted = 0 if value is False else 1
        assert occurrences(after, flag, shown) == wanted, (out, after)
        assert len(after) - len(without(after, flag, bare)) == wanted * (1 if bare else 2)
        assert without(after, flag, bare) == without(before, flag, bare), out
        assert lines_outside(original.read_text(), text, touch) == []


def test_sglang_refuses_each_knob_naming_it(outcome: dict[str, object]) -> None:
    """Every refusal is an SGLang recipe, and the message names the knob and SGLang's flag."""
    for path, case, message in outcome["refused"]:  # type: ignore[attr-defined]
        assert "sglang" in path.read_text()
        knob = str(case[0]).removeprefix("set:")
        assert knob in message or "edits vLLM recipes only" in message, message


def test_counts_are_docs_table(outcome: dict[str, object]) -> None:
    """docs/sparkrun.md's table is what this run measured."""
    counts: Counter[str] = Counter()
    for _original, _out, case, _text in outcome["edited"]:  # type: ignore[attr-defined]
        counts[f"{case[0]}={case[1]}"] += 1
    refused: Counter[str] = Counter()
    for _path, case, _message in outcome["refused"]:  # type: ignore[attr-defined]
        refused[f"{case[0]}={case[1]}"] += 1
    rows = [f"| render | {len(FILES)} | 0 |"]
    vllm = sum(1 for p in FILES if "runtime: vllm" in p.read_text())
    rows.append(f"| show (the four knobs) | {vllm} | {len(FILES) - vllm} |")
    for case in KNOB_CASES:
        name = f"{case[0]}={case[1]}"
        shown = name.replace("set:", "--set ") if name.startswith("set:") else f"set {name}"
        rows.append(f"| {shown} | {counts[name]} | {refused[name]} |")
    doc = DOC.read_text(encoding="utf-8")
    for row in rows:
        assert row in doc, f"docs/sparkrun.md lacks the measured row {row!r}"
