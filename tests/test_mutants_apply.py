"""The curated mutants still apply: each one's exact text is found once in the code as it is."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _mutants() -> list:
    """benchmarks/mutants.py's MUTANTS, loaded as a module of its own."""
    spec = importlib.util.spec_from_file_location(
        "spark_ops_mutants", REPO / "benchmarks" / "mutants.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return list(module.MUTANTS)


@pytest.mark.parametrize("mutant", _mutants(), ids=lambda m: f"{m.room}: {m.name}")
def test_the_mutant_applies_to_the_code_as_it_is(mutant) -> None:  # type: ignore[no-untyped-def]
    """A refactor that moves a mutant's text must move the mutant with it (never silently none)."""
    text = (REPO / mutant.path).read_text("utf-8")
    assert text.count(mutant.old) == 1, (
        f"{mutant.path}: {mutant.old!r} found {text.count(mutant.old)} times"
    )
    for test in mutant.tests:
        if test.startswith("tests/"):
            assert (REPO / test.split("::")[0]).is_file(), test
