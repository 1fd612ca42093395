"""The engine-log commands: built in remote/shell.py (not in the inventory), target quoted.

The table in tests/fixtures/remote/engine_log_commands.yaml states each command exactly; a plain
file with a hostile name is then read for real by the commands run in `sh`.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from spark_ops.inventory import EngineSettings
from spark_ops.remote import engine_log_follow, engine_log_recent

CASES: list[dict[str, Any]] = yaml.safe_load(
    (Path(__file__).parent / "fixtures" / "remote" / "engine_log_commands.yaml").read_text("utf-8")
)


def _command(case: dict[str, Any]) -> str:
    """The command a case's call builds."""
    engine = EngineSettings(**case["engine"])
    if "recent" in case["call"]:
        return engine_log_recent(engine, case["call"]["recent"])
    return engine_log_follow(engine, **case["call"]["follow"])


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_command(case: dict[str, Any]) -> None:
    """Each kind and variant builds exactly the command stated."""
    assert _command(case) == case["want"]


def test_hostile_file_name_is_read_not_run(tmp_path: Path) -> None:
    """A log named with quotes and `$()` is read by sh, and nothing in its name runs."""
    name = "vllm $(touch pwned) it's `touch pwned2`.log"
    (tmp_path / name).write_text("".join(f"line {i}\n" for i in range(10)), "utf-8")
    engine = EngineSettings(log_kind="file", log_target=f"~/{name}")
    env = {"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}
    recent = subprocess.run(
        ["sh", "-c", engine_log_recent(engine, 3)], cwd=tmp_path, env=env,
        capture_output=True, text=True, timeout=30, check=True,
    )  # fmt: skip
    assert recent.stdout == "line 7\nline 8\nline 9\n"
    offset = len("".join(f"line {i}\n" for i in range(8)))
    follow = subprocess.run(
        ["timeout", "2", "sh", "-c", engine_log_follow(engine, from_offset=offset)], cwd=tmp_path,
        env=env, capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    assert follow.stdout == "line 8\nline 9\n"
    assert not (tmp_path / "pwned").exists() and not (tmp_path / "pwned2").exists()
