"""How an option's spelling is read, row by row of tests/fixtures/recipe_flags/spellings.yaml:
spark-ops' one resolution (underscores, abbreviations, `=`, aliases, last one wins, an ambiguous
prefix refused), and the installed vLLM's own serve parser on the same rows (skipped without it)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from ground.vllm import VENV

from spark_ops.errors import RecipeError
from spark_ops.recipe.render import effective_args, parse_options
from spark_ops.recipe.source import Token

ROWS: list[dict[str, Any]] = yaml.safe_load(
    (Path(__file__).parent / "fixtures" / "recipe_flags" / "spellings.yaml").read_text("utf-8")
)


def read(words: list[str]) -> dict[str, object]:
    """The effective options spark-ops reads from `vllm serve MODEL WORDS`."""
    tokens = [Token(w, w, 0, 0) for w in ["vllm", "serve", "org/M", *words]]
    return effective_args(parse_options(tokens, 2))


@pytest.mark.parametrize("row", ROWS, ids=[" ".join(r["words"]) for r in ROWS])
def test_spark_ops_reads_the_spelling_as_vllm(row: dict[str, Any]) -> None:
    """The option and value of the row, or the refusal naming every candidate."""
    if "ambiguous" in row:
        with pytest.raises(RecipeError, match="ambiguous") as info:
            read(row["words"])
        assert ", ".join(row["ambiguous"]) in info.value.message
        return
    value = row["value"]
    assert read(row["words"])[row["option"]] == (value if isinstance(value, bool) else str(value))


# Runs in the vLLM venv: each row parsed by vLLM's own `vllm serve` parser (as `vllm` builds it),
# and the canonical spelling of the row's option and value, for the same destination.
_ORACLE = r"""
import contextlib, io, json, sys
from vllm.entrypoints.cli.serve import ServeSubcommand
from vllm.utils.argparse_utils import FlexibleArgumentParser
top = FlexibleArgumentParser(description="oracle")
ServeSubcommand().subparser_init(top.add_subparsers(required=False, dest="subparser"))
def parse(words, dest):
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            ns = top.parse_args(["serve", "org/M", *words])
    except SystemExit:
        return {"error": err.getvalue().strip().splitlines()[-1]}
    return {"value": repr(getattr(ns, dest))}
out = []
for words, canonical, dest in json.load(sys.stdin):
    out.append([parse(words, dest), parse(canonical, dest) if canonical else None])
print(json.dumps(out))
"""


def canonical(row: dict[str, Any]) -> list[str] | None:
    """The row's option and value in vLLM's own full spelling (None for an ambiguous row)."""
    if "ambiguous" in row:
        return None
    option, value = row["option"], row["value"]
    if value is True:
        return [option]
    if value is False:
        return ["--no-" + option[2:]]
    return [option, str(value)]


@pytest.mark.realvllm
def test_vllm_reads_each_row_so() -> None:
    """vLLM's parser takes each row's words as its canonical spelling, or refuses the ambiguous
    prefix naming the same candidates."""
    python = VENV / "bin" / "python"
    if not python.is_file():
        pytest.skip(f"no vLLM CPU venv at {VENV} (run: bash .ci/install-ground.sh)")
    jobs = [
        [r["words"], canonical(r), (r.get("option") or "--x")[2:].replace("-", "_")] for r in ROWS
    ]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_LOGGING_LEVEL": "ERROR"}
    done = subprocess.run(
        [str(python), "-c", _ORACLE], input=json.dumps(jobs), capture_output=True, text=True,
        env=env, check=True, timeout=900,
    )  # fmt: skip
    answers = json.loads(done.stdout.strip().splitlines()[-1])
    for row, (got, want) in zip(ROWS, answers, strict=True):
        if "ambiguous" in row:
            assert "ambiguous option" in got.get("error", ""), (row, got)
            named = got["error"].split(" could match ", 1)[1].split(", ")
            assert sorted(named) == row["ambiguous"], (row, got)
            continue
        assert "error" not in got and got == want, (row, got, want)
