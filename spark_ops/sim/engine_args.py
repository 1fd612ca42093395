"""`vllm serve` command line of the sim engine: known flags, generic extras, non-default args."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import Any

from spark_ops.sim.engine_config import cfg_get, moe_backend_choices
from spark_ops.sizes import parse_human_int

# Order in which vLLM lists non-default args (front-end args first, then engine args).
_ORDER = [
    "model_tag", "host", "port", "model", "trust_remote_code", "max_model_len",
    "distributed_executor_backend", "tensor_parallel_size", "enforce_eager", "served_model_name",
    "gpu_memory_utilization", "kv_cache_memory_bytes", "kv_cache_dtype", "max_num_batched_tokens",
    "max_num_seqs", "moe_backend", "shutdown_timeout",
]  # fmt: skip


@dataclass
class ServeArgs:
    """Parsed `vllm serve` arguments plus the flags we only echo."""

    values: dict[str, Any]
    non_default: dict[str, Any]
    extras: dict[str, Any] = field(default_factory=dict)
    sim_config: str | None = None

    def __getattr__(self, name: str) -> Any:
        """Read a known flag's value by attribute."""
        try:
            return self.__dict__["values"][name]
        except KeyError as exc:
            raise AttributeError(name) from exc

    @property
    def served_name(self) -> str:
        """Return the model name the API serves (first --served-model-name, else the model)."""
        names = self.values.get("served_model_name")
        return str(names[0]) if names else str(self.values["model"])


def _human_int(text: str) -> int:
    """Argparse type wrapper for vLLM's human-readable ints."""
    try:
        return parse_human_int(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def build_parser(cfg: dict[str, Any]) -> argparse.ArgumentParser:
    """Build the parser for the known flags of the emulated vLLM version."""
    d = cfg_get(cfg, "defaults")
    p = argparse.ArgumentParser(prog="vllm serve", usage="vllm serve [model_tag] [options]")
    p.add_argument("model_tag")
    p.add_argument("--host", default=d["host"])
    p.add_argument("--port", type=int, default=d["port"])
    p.add_argument("--served-model-name", nargs="+", default=None)
    p.add_argument("--tensor-parallel-size", "-tp", type=int, default=d["tensor_parallel_size"])
    p.add_argument("--max-model-len", type=_human_int, default=None)
    p.add_argument("--max-num-seqs", type=int, default=d["max_num_seqs"])
    p.add_argument("--max-num-batched-tokens", type=_human_int, default=d["max_num_batched_tokens"])
    p.add_argument("--kv-cache-memory-bytes", type=_human_int, default=None)
    p.add_argument("--gpu-memory-utilization", type=float, default=d["gpu_memory_utilization"])
    choices = moe_backend_choices(cfg)
    if choices is not None:
        p.add_argument("--moe-backend", choices=choices, default=d["moe_backend"])
    p.add_argument("--enforce-eager", action=argparse.BooleanOptionalAction, default=False)
    p.add_argument(
        "--distributed-executor-backend",
        choices=["ray", "mp", "uni", "external_launcher"],
        default=None,
    )
    p.add_argument("--trust-remote-code", action="store_true", default=False)
    p.add_argument("--kv-cache-dtype", default=d["kv_cache_dtype"])
    p.add_argument("--shutdown-timeout", type=int, default=d["shutdown_timeout"])
    p.add_argument("--sim-config", default=None, help="YAML with the simulator's parameters")
    return p


def _coerce(text: str) -> Any:
    """Turn an unknown flag's value into int, float or str like argparse types would."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def _split_unknown(
    parser: argparse.ArgumentParser, argv: list[str]
) -> tuple[list[str], dict[str, Any]]:
    """Separate flags the parser does not know (nor abbreviates) and their values."""
    known_opts = [o for a in parser._actions for o in a.option_strings]
    kept: list[str] = []
    extras: dict[str, Any] = {}
    i = 0
    while i < len(argv):
        tok = argv[i]
        name = tok.split("=", 1)[0]
        if (
            tok.startswith("--")
            and len(tok) > 2
            and not any(o.startswith(name) for o in known_opts)
        ):
            key = name[2:].replace("-", "_")
            if "=" in tok:
                extras[key] = _coerce(tok.split("=", 1)[1])
            elif i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                extras[key] = _coerce(argv[i + 1])
                i += 1
            elif key.startswith("no_"):
                extras[key[3:]] = False
            else:
                extras[key] = True
            i += 1
            continue
        if (
            tok.startswith("-")
            and not tok.startswith("--")
            and len(tok) > 1
            and tok not in known_opts
            and not tok[1:].replace(".", "", 1).isdigit()
        ):
            extras[tok[1:]] = True  # e.g. -O3: echoed, not interpreted
            i += 1
            continue
        kept.append(tok)
        i += 1
    return kept, extras


def parse_serve_args(cfg: dict[str, Any], argv: list[str]) -> ServeArgs:
    """Parse `vllm serve` arguments (argparse exits 2 on a bad known flag, like vLLM)."""
    parser = build_parser(cfg)
    kept, extras = _split_unknown(parser, argv)
    ns = parser.parse_args(kept)
    if "moe_backend" in extras and moe_backend_choices(cfg) is None:
        value = extras["moe_backend"]
        parser.error(f"unrecognized arguments: --moe-backend {value}")  # flag added in 0.18
    values = vars(ns)
    sim_config = values.pop("sim_config")
    values["model"] = values["model_tag"]
    defaults = {a.dest: a.default for a in parser._actions}
    non_default: dict[str, Any] = {}
    for key in _ORDER:
        if key in ("model_tag", "model") or (key in values and values[key] != defaults.get(key)):
            non_default[key] = values[key]
    non_default.update(extras)
    return ServeArgs(values=values, non_default=non_default, extras=extras, sim_config=sim_config)
