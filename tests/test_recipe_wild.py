"""Recipes as the public registries hold them (tests/fixtures/recipes/wild/, SOURCE.md there):
every recipe × knob is edited by spark-ops and the result rendered by the tool that runs the file.

The oracle of a file is the tool that can run it: spark-vllm-docker's run-recipe for a
`recipe_version: "1"` file whose command its `str.format(**defaults)` fills (re-done here from
its documented behaviour: format, drop a trailing `\\`, bash splits the words); sparkrun 0.4.2's
own loader (one process for the whole corpus) for every other file. A case is:

- exact: the oracle's words carry the knob once with its value (none for enforce_eager=False),
  every other word is unchanged, spark-ops renders the same words and `show` reports the
  value, at most two lines changed, line endings kept, a second identical edit changes nothing;
- refused: spark-ops raised an error and wrote nothing (the reason is tallied);
- wrong: anything else. There must be none. The counts are the table in docs/sparkrun.md and
  docs/recipes.md.
"""

from __future__ import annotations

import difflib
import re
import shutil
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml
from ground import GroundUnavailable
from ground.sparkrun_venv import run_oracle, sparkrun_bin

from spark_ops.errors import SparkOpsError
from spark_ops.recipe import Change, edit_recipe, knob_values, parse_kv_cache_memory, render_recipe
from spark_ops.recipe.knobs import LEGACY_MOE_SETTINGS, has_moe_flag

WILD = Path(__file__).parent / "fixtures" / "recipes" / "wild"
FILES = sorted(p for p in WILD.glob("*/*.yaml"))
DOCS = [
    Path(__file__).resolve().parents[1] / "docs" / name for name in ("sparkrun.md", "recipes.md")
]
#: knob, value, flag, the word after the flag (None: a bare flag).
CASES: list[tuple[str, object, str, str | None]] = [
    ("max_num_seqs", 77, "--max-num-seqs", "77"),
    ("kv_cache_memory", "12G", "--kv-cache-memory-bytes", "12G"),
    ("moe_backend", "triton", "--moe-backend", "triton"),
    ("enforce_eager", True, "--enforce-eager", None),
    ("enforce_eager", False, "--enforce-eager", None),
    ("set:max_model_len", "65536", "--max-model-len", "65536"),
]
SHOWN = {"max_num_seqs": "max_num_seqs", "kv_cache_memory": "kv_cache_memory_bytes"}
SPELLINGS = {
    "--max-num-seqs": ("--max-num-seqs", "--max_num_seqs"),
    "--kv-cache-memory-bytes": (
        "--kv-cache-memory-bytes",
        "--kv_cache_memory_bytes",
        "--kv-cache-memory",
        "--kv_cache_memory",
    ),
    "--moe-backend": ("--moe-backend", "--moe_backend"),
    "--enforce-eager": ("--enforce-eager", "--enforce_eager", "--no-enforce-eager"),
    "--max-model-len": ("--max-model-len", "--max_model_len"),
}


def run_recipe_can_run(data: dict[str, Any]) -> bool:
    """Whether run-recipe runs this file: recipe_version "1" and a command it can format."""
    if str(data.get("recipe_version")) != "1" or not isinstance(data.get("command"), str):
        return False
    try:
        data["command"].format(**(data.get("defaults") or {}))
    except (KeyError, IndexError, ValueError, AttributeError):
        return False
    return True


def run_recipe_command(text: str) -> str:
    """run-recipe's command for a file: formatted with defaults, a trailing `\\` dropped."""
    data = yaml.safe_load(text)
    command = str(data["command"]).format(**(data.get("defaults") or {})).rstrip()
    if command.endswith("\\"):
        command = command.rstrip("\\\n").rstrip()
    return command


def serve_part(command: str) -> str:
    """The `vllm serve` command of a command that first runs a few finished lines (each ending
    in `;` or `&&`): bash runs those as written, then this one."""
    lines = command.split("\n")
    serve = [n for n, line in enumerate(lines) if re.search(r"(^|/|\s)vllm\s+serve\b", line)]
    if len(serve) != 1 or serve[0] == 0:
        return command
    before = [line.rstrip().rstrip("\\").rstrip() for line in lines[: serve[0]]]
    if all(line.endswith((";", "&&")) for line in before if line and not line.startswith("#")):
        return "\n".join(lines[serve[0] :])
    return command


def bash_words_all(commands: list[str]) -> list[list[str]]:
    """The words bash makes of the first command of each (one bash for all; no globbing; the
    first command's words are printed, never run)."""
    script = (
        'args() { printf "%s\\0" "$@"; exit 0; }\n'
        "while IFS= read -r -d '' cmd; do printf '\\1'; ( eval \"args $cmd\" ); done"
    )
    proc = subprocess.run(
        [shutil.which("bash") or "/bin/bash", "--norc", "--noprofile", "-f", "-c", script],
        input=b"".join(serve_part(c).encode("utf-8", "surrogateescape") + b"\0" for c in commands),
        capture_output=True,
        env={"PATH": "/nonexistent"},
        timeout=300,
        check=False,
    )
    chunks = proc.stdout.decode("utf-8", "surrogateescape").split("\1")[1:]
    assert len(chunks) == len(commands), proc.stderr[-2000:]
    return [chunk.split("\0")[:-1] for chunk in chunks]


def strip_flag(words: list[str], flag: str, bare: bool) -> list[str]:
    """The words without any spelling of a flag (and its value)."""
    names = SPELLINGS[flag]
    out: list[str] = []
    skip = False
    for word in words:
        if skip:
            skip = False
            continue
        if word in names:
            skip = not bare and not word.startswith("--no-")
            continue
        if word.split("=", 1)[0] in names and "=" in word:
            continue
        out.append(word)
    return out


def carried(words: list[str], flag: str, value: str | None) -> int:
    """How many times the words carry any spelling of flag (bare, spaced or `=`)."""
    names = SPELLINGS[flag]
    if value is None:
        return sum(word in names for word in words)
    return sum(word in names or word.split("=", 1)[0] in names for word in words)


def last_value(words: list[str], flag: str) -> str | None:
    """The value vLLM takes for a flag (last wins)."""
    value = None
    for i, word in enumerate(words):
        if word in SPELLINGS[flag]:
            value = words[i + 1] if i + 1 < len(words) else None
        elif "=" in word and word.split("=", 1)[0] in SPELLINGS[flag]:
            value = word.split("=", 1)[1]
    return value


def changed_lines(before: str, after: str) -> int:
    """Lines changed, added or removed."""
    matcher = difflib.SequenceMatcher(
        None, before.splitlines(keepends=True), after.splitlines(keepends=True), autojunk=False
    )
    return sum(
        max(i2 - i1, j2 - j1) for op, i1, i2, j1, j2 in matcher.get_opcodes() if op != "equal"
    )


def endings_kept(before: str, after: str) -> bool:
    """A CRLF file stays CRLF on every line, an LF file gets no CR."""
    lone = len(re.findall(r"(?<!\r)\n", before))
    if "\r\n" in before and lone == 0:
        return not re.search(r"(?<!\r)\n", after)
    if "\r\n" not in before:
        return "\r\n" not in after
    return True


def change_of(knob: str, value: object) -> Change:
    """The Change a case makes."""
    return Change.setting(knob[4:], value) if knob.startswith("set:") else Change.knob(knob, value)


def refusal_kind(message: str) -> str:
    """A short name of a refusal's reason, for the table."""
    kinds = [
        ("is a vLLM knob, not a", "not vLLM (SGLang, TRT-LLM): the knob named with its own flag"),
        ("edits vLLM recipes only", "not vLLM (SGLang, TRT-LLM): the knob named with its own flag"),
        (
            "command is not `vllm serve`",
            "not vLLM (SGLang, TRT-LLM): the knob named with its own flag",
        ),
        ("without 'command'", "not vLLM (SGLang, TRT-LLM): the knob named with its own flag"),
        ("env' must be a mapping", "'env' written as a list (run-recipe needs a mapping)"),
        ("second shell command", "a line end no `\\` escapes ends the command, another follows"),
        (
            "bash would run more than the one command",
            "shell code (`$(…)`, a loop) before `vllm serve`",
        ),
        ("written as '>", "a folded command with a `\\`, deeper or blank line"),
    ]
    for needle, kind in kinds:
        if needle in message:
            return kind
    return message


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Every file × case edited by spark-ops; every original and edit rendered by its oracle."""
    if not FILES:
        pytest.skip("no wild corpus")
    try:
        sparkrun_bin()
    except GroundUnavailable as exc:
        pytest.skip(str(exc))
    work = tmp_path_factory.mktemp("wild")
    rows: list[dict[str, Any]] = []
    to_sparkrun: list[Path] = []
    for path in FILES:
        text = path.read_bytes().decode("utf-8")
        data = yaml.safe_load(text)
        oracle = "run-recipe" if run_recipe_can_run(data) else "sparkrun"
        if oracle == "sparkrun":
            to_sparkrun.append(path)
        for number, (knob, value, flag, shown) in enumerate(CASES):
            row: dict[str, Any] = {
                "path": path,
                "oracle": oracle,
                "case": (knob, value, flag, shown),
            }
            rows.append(row)
            try:
                result = edit_recipe(text, [change_of(knob, value)], source=path.name)
            except SparkOpsError as exc:
                row["refused"] = exc.message
                continue
            out = work / str(number) / path.name
            out.parent.mkdir(exist_ok=True)
            out.write_bytes(result.text.encode("utf-8"))
            row["out"], row["text"], row["version"] = out, result.text, result.vllm_version
            if oracle == "sparkrun":
                to_sparkrun.append(out)
    loaded = {Path(str(e["path"])): e for e in run_oracle(to_sparkrun, work / "home")}
    commands: dict[Path, str] = {}
    runtimes: dict[Path, str] = {}
    for row in rows:
        for found in (row["path"], row.get("out")):
            if found is None or found in commands:
                continue
            path = Path(found)
            if row["oracle"] == "run-recipe":
                commands[path] = run_recipe_command(path.read_bytes().decode("utf-8"))
                runtimes[path] = "run-recipe"
            else:
                entry = loaded[path]
                assert "error" not in entry, entry
                commands[path], runtimes[path] = str(entry["command"]), str(entry["runtime"])
    split = bash_words_all(list(commands.values()))
    words = dict(zip(commands, split, strict=True))
    for path, runtime in runtimes.items():
        if runtime == "run-recipe":
            runtimes[path] = "vllm" if any("vllm" in w for w in words[path][:3]) else "other"
    return {"rows": rows, "words": words, "runtime": runtimes}


def oracle_words(corpus: dict[str, Any], path: Path) -> tuple[list[str], str]:
    """The words the file's own tool runs, and its runtime."""
    return corpus["words"][path], corpus["runtime"][path]


def judge(corpus: dict[str, Any], row: dict[str, Any]) -> str:
    """'exact', or what is wrong with an edit."""
    knob, value, flag, shown = row["case"]
    before, runtime = oracle_words(corpus, row["path"])
    after, _ = oracle_words(corpus, row["out"])
    original = row["path"].read_bytes().decode("utf-8")
    text = row["text"]
    if not runtime.startswith("vllm"):
        return f"edited a {runtime} recipe"
    mine = render_recipe(text, source=row["out"].name).argv
    if mine != after:
        return f"spark-ops renders {mine} but the oracle runs {after}"
    legacy = knob == "moe_backend" and not has_moe_flag(row["version"])
    if legacy:
        env = render_recipe(text, source=row["out"].name).env
        settings = LEGACY_MOE_SETTINGS[str(value)]
        if any(env.get(k) != v for k, v in settings.items()):
            return "legacy MoE variables not set"
        if carried(after, flag, None) or strip_flag(after, flag, False) != strip_flag(
            before, flag, False
        ):
            return f"legacy MoE path dropped or changed words: {before} -> {after}"
    else:
        bare = shown is None
        wanted = 0 if value is False else 1
        if carried(after, flag, shown) != wanted:
            return f"{flag} carried {carried(after, flag, shown)} times"
        if not bare and last_value(after, flag) != shown:
            return f"{flag} is {last_value(after, flag)!r}"
        if strip_flag(after, flag, bare) != strip_flag(before, flag, bare):
            return "other words changed"
        if changed_lines(original, text) > 2:
            return f"{changed_lines(original, text)} lines changed"
        if not knob.startswith("set:"):
            shown_value = knob_values(text, source=row["out"].name)[SHOWN.get(knob, knob)]
            expected: object = value
            if knob == "kv_cache_memory":
                expected = parse_kv_cache_memory(str(value))
            if shown_value != expected:
                return f"show reports {shown_value!r}, the command has {value!r}"
    if not endings_kept(original, text):
        return "line endings changed"
    again = edit_recipe(text, [change_of(knob, value)], source=row["out"].name)
    if again.text != text:
        return "a second identical edit changed the file"
    return "exact"


@pytest.fixture(scope="module")
def tally(corpus: dict[str, Any]) -> dict[str, Any]:
    """Each case judged: exact, refused (by reason) or wrong (with what)."""
    exact: Counter[str] = Counter()
    refused: Counter[tuple[str, str]] = Counter()
    wrong: list[tuple[str, tuple[object, ...], str]] = []
    nonvllm: set[Path] = set()
    for row in corpus["rows"]:
        runtime = corpus["runtime"][row["path"]]
        if not runtime.startswith("vllm"):
            nonvllm.add(row["path"])
        family = "vllm" if runtime.startswith("vllm") else "other"
        if "refused" in row:
            refused[(family, refusal_kind(row["refused"]))] += 1
            continue
        verdict = judge(corpus, row)
        if verdict == "exact":
            exact[family] += 1
        else:
            wrong.append((row["path"].name, row["case"], verdict))
    return {"exact": exact, "refused": refused, "wrong": wrong, "nonvllm": nonvllm}


def test_corpus_is_the_one_of_source_md() -> None:
    """Every file is listed in SOURCE.md, from at least 20 repositories."""
    source = (WILD / "SOURCE.md").read_text(encoding="utf-8")
    listed = set(re.findall(r"^\| ((?:sparkrun|eugr)/\S+) \|", source, re.M))
    assert listed == {f"{p.parent.name}/{p.name}" for p in FILES}
    repos = set(re.findall(r"^\| [^|/]+/[^|]+ \| ([0-9a-f]{40}) \|", source, re.M))
    assert len(FILES) >= 150 and len(repos) >= 20


def test_no_edit_is_wrong(tally: dict[str, Any]) -> None:
    """No case where spark-ops writes and the command run differs from what it reports."""
    assert tally["wrong"] == [], "\n".join(map(str, tally["wrong"][:20]))


def test_vllm_cases_are_99_percent_exact(tally: dict[str, Any]) -> None:
    """At least 99% of the cases on vLLM recipes are exact."""
    vllm_refused = sum(n for (family, _), n in tally["refused"].items() if family == "vllm")
    total = tally["exact"]["vllm"] + vllm_refused
    assert tally["exact"]["vllm"] >= 0.99 * total, tally["refused"]


def test_counts_are_docs_table(tally: dict[str, Any]) -> None:
    """docs/sparkrun.md's wild-corpus table is what this run measured."""
    vllm_refused = sum(n for (family, _), n in tally["refused"].items() if family == "vllm")
    other_refused = sum(n for (family, _), n in tally["refused"].items() if family != "vllm")
    vllm_files = len(FILES) - len(tally["nonvllm"])
    rows = [
        f"| vLLM recipes | {vllm_files} | {vllm_files * len(CASES)} | "
        f"{tally['exact']['vllm']} | {vllm_refused} | {len(tally['wrong'])} |",
        f"| SGLang / TRT-LLM recipes | {len(tally['nonvllm'])} | "
        f"{len(tally['nonvllm']) * len(CASES)} | {tally['exact']['other']} | {other_refused} | 0 |",
    ]
    for (family, kind), n in sorted(tally["refused"].items()):
        rows.append(f"| {family} | {kind} | {n} |")
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        missing = [row for row in rows if row not in text]
        assert not missing, f"{doc.name} lacks the measured rows:\n" + "\n".join(missing)
