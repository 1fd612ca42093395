"""The finished levels of an interrupted sweep, kept in a file that `bench --resume` continues.

After every level the sweep's settings and its finished levels are written (spark-ops' one atomic
writer), so a Ctrl-C, a lost tunnel or a killed process loses at most the level under way. A
resumed sweep must be the same sweep: the settings that shape the figures are compared, and a
file of another sweep is refused naming the setting that differs.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from spark_ops.bench.stats import LevelResult
from spark_ops.bench.sweep import SweepConfig
from spark_ops.errors import BenchError
from spark_ops.files import write_file

SCHEMA = "spark-ops.bench-partial/1"
# the settings a resumed sweep must share with the interrupted one (its figures depend on them)
SAME = ("api", "mode", "output_tokens", "duration_s", "rate", "repeats", "warmup", "seed",
        "steady_fraction", "prompts_path", "levels")  # fmt: skip
OPTIONS = {"duration_s": "--duration", "prompts_path": "--prompts", "levels": "--concurrency"}


def default_partial_path() -> Path:
    """~/.local/state/spark-ops/bench-<UTC time>.partial.json (one per sweep started)."""
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return Path.home() / ".local" / "state" / "spark-ops" / f"bench-{stamp}.partial.json"


def save_partial(path: Path, config: SweepConfig, levels: list[LevelResult]) -> None:
    """Write the sweep's settings (no secrets) and its finished levels, atomically."""
    data = {
        "schema": SCHEMA,
        "config": config.to_dict(),
        "levels": [lv.to_dict() for lv in levels],
    }
    text = json.dumps(data, indent=2, ensure_ascii=False) + "\n"
    write_file(path, text, make_parents=True)  # a failure is an OutputError naming it


def load_partial(path: Path, config: SweepConfig) -> list[LevelResult]:
    """The finished levels kept in `path`; BenchError naming the file if not this sweep's."""
    try:
        data: Any = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise BenchError(f"{path}: no such file to resume") from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise BenchError(f"{path}: cannot read the partial sweep: {exc}") from exc
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise BenchError(
            f"{path}: not a partial sweep (expected schema {SCHEMA!r})",
            hint="--resume takes the file an interrupted `spark-ops bench` named",
        )
    try:
        kept = data["config"]
        mine = config.to_dict()
        for key in SAME:
            if kept.get(key) != mine.get(key):
                option = OPTIONS.get(key, "--" + key.replace("_", "-"))
                raise BenchError(
                    f"{path}: the interrupted sweep ran with {key}={kept.get(key)!r}, this one "
                    f"with {mine.get(key)!r}: give the same {option} to resume it"
                )
        return [LevelResult.from_dict(lv) for lv in data["levels"]]
    except (KeyError, TypeError, AttributeError) as exc:
        raise BenchError(f"{path}: partial sweep has a bad or missing key: {exc}") from exc


def remove_partial(path: Path) -> None:
    """Remove a partial file once its sweep is finished (only a file of this schema)."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return
    if isinstance(data, dict) and data.get("schema") == SCHEMA:
        Path(path).unlink(missing_ok=True)
