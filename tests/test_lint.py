"""The house style holds: ruff (lint and format at 100 columns) and mypy are clean."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    """Run a tool from the repository root."""
    return subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=600)


@pytest.mark.skipif(
    shutil.which("ruff") is None, reason="ruff is not installed (pip install -e '.[test]')"
)
def test_ruff_lint_and_format() -> None:
    """No lint finding, and every file formatted black-style at 100 columns."""
    lint = _run("ruff", "check", ".", "--output-format", "concise")
    assert lint.returncode == 0, lint.stdout[-3000:]
    fmt = _run("ruff", "format", "--check", "--line-length", "100", ".")
    assert fmt.returncode == 0, fmt.stdout[-3000:]


def test_mypy_clean() -> None:
    """The package and the reference watchdog shipped beside it type-check."""
    pytest.importorskip("mypy")
    res = _run(sys.executable, "-m", "mypy", "spark_ops", "refwatchdog", "--no-incremental")
    assert res.returncode == 0, res.stdout[-3000:]
