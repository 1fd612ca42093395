"""Configuration of the simulated vLLM engine: YAML loading, merging and typed access."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from spark_ops.errors import ExitStatus, SparkOpsError
from spark_ops.yamlsafe import load_yaml

DEFAULT_CONFIG = Path(__file__).resolve().parents[2] / "recipes" / "sim" / "engine.yaml"
# Installed without the repo: the copy shipped as package data (a symlink in the repo).
PACKAGED_CONFIG = Path(__file__).resolve().parents[1] / "data" / "sim" / "engine.yaml"
FAULTS = (
    "exit_during_weights",
    "kv_alloc_fail",
    "nccl_timeout",
    "never_ready",
    "dead_while_serving",
    "wedged_while_serving",
    "rank_fail",
    "rank_lingers",
    "slow_decode",
)


class SimConfigError(SparkOpsError):
    """The simulator's YAML is missing, unreadable or has a bad value."""

    exit_status = ExitStatus.USAGE


def deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """Return base with over merged in; nested mappings merge, everything else is replaced."""
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def load_config(path: str | Path | None = None) -> dict[str, Any]:
    """Load the sim YAML (path, else $SPARK_SIM_CONFIG, else the repo's recipes/sim/engine.yaml)."""
    default = DEFAULT_CONFIG if DEFAULT_CONFIG.exists() else PACKAGED_CONFIG
    chosen = Path(path or os.environ.get("SPARK_SIM_CONFIG") or default)
    try:
        text = chosen.read_text(encoding="utf-8")
    except OSError as exc:
        raise SimConfigError(f"{chosen}: cannot read sim config: {exc.strerror}") from exc
    data = load_yaml(text, source=str(chosen), error=SimConfigError) or {}
    if not isinstance(data, dict):
        raise SimConfigError(f"{chosen}: top level must be a mapping")
    base = data.pop("base", None)
    if base:
        data = deep_merge(load_config(chosen.parent / str(base)), data)
    return data


def cfg_get(cfg: dict[str, Any], dotted: str) -> Any:
    """Return the value at a dotted key, raising SimConfigError naming the key when absent."""
    node: Any = cfg
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            raise SimConfigError(f"sim config: missing key {dotted!r}")
        node = node[part]
    return node


def cfg_float(cfg: dict[str, Any], dotted: str) -> float:
    """Return a numeric config value as float, naming the key when it is not a number."""
    value = cfg_get(cfg, dotted)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SimConfigError(f"sim config: {dotted} must be a number, got {value!r}")
    return float(value)


def scaled(cfg: dict[str, Any], dotted: str) -> float:
    """Return a duration from the config divided by time_scale."""
    return cfg_float(cfg, dotted) / time_scale(cfg)


def time_scale(cfg: dict[str, Any]) -> float:
    """Return the speed-up factor (> 0)."""
    value = cfg_float(cfg, "time_scale")
    if value <= 0:
        raise SimConfigError(f"sim config: time_scale must be > 0, got {value}")
    return value


def version_tuple(text: str) -> tuple[int, ...]:
    """Turn '0.32.0' into (0, 32, 0) for comparisons."""
    return tuple(int(p) for p in re.findall(r"\d+", text)[:3])


def moe_backend_choices(cfg: dict[str, Any]) -> list[str] | None:
    """Return the --moe-backend choices of the emulated version, or None before the flag existed."""
    version = version_tuple(str(cfg_get(cfg, "vllm_version")))
    choices: list[str] = []
    known = False
    for entry in cfg_get(cfg, "moe_backends_by_version"):
        if version_tuple(str(entry["since"])) <= version:
            known = True
            choices.extend(str(c) for c in entry["add"])
    return choices if known else None


def active_fault(cfg: dict[str, Any]) -> str | None:
    """Return the fault to inject ($SPARK_SIM_FAULT wins over the config key), validated."""
    fault = os.environ.get("SPARK_SIM_FAULT") or cfg.get("fault")
    if fault and fault not in FAULTS:
        raise SimConfigError(f"sim fault {fault!r} unknown; allowed: {', '.join(FAULTS)}")
    return str(fault) if fault else None
