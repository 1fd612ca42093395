"""`vllm serve` command line of the sim engine: known flags, generic extras, non-default args."""

from __future__ import annotations

import argparse
import functools
import json
from dataclasses import dataclass, field
from importlib import resources
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


@functools.cache
def real_options() -> tuple[str, ...]:
    """Every option string of the real `vllm serve` parser the sim answers for: captured from
    vLLM 0.32.0's CPU build into spark_ops/data/sim/vllm-serve-options.json (its `source` says
    how)."""
    text = resources.files("spark_ops.data").joinpath("sim", "vllm-serve-options.json")
    return tuple(json.loads(text.read_text(encoding="utf-8"))["options"])


def serve_options(cfg: dict[str, Any]) -> list[str]:
    """The option strings this sim engine accepts: the real parser's (without --moe-backend
    before vLLM 0.18, like the emulated version), plus the sim's own --sim-config."""
    drop = set() if moe_backend_choices(cfg) is not None else {"--moe-backend"}
    return sorted({*real_options(), "--sim-config"} - drop)


def _dashed(name: str) -> str:
    """`--a_b.c_d` -> `--a-b.c_d`: underscores before the first dot as dashes, like vLLM."""
    head, dot, tail = name[2:].partition(".")
    return "--" + head.replace("_", "-") + dot + tail


def _split_unknown(
    parser: argparse.ArgumentParser, cfg: dict[str, Any], argv: list[str]
) -> tuple[list[str], dict[str, Any]]:
    """Separate flags of the real parser this sim does not model (echoed with their values) from
    its own; a flag the real parser lacks, or an abbreviation of several, exits 2 as vLLM does
    (a unique abbreviation is taken as the flag it abbreviates, as argparse does)."""
    own = {o for a in parser._actions for o in a.option_strings}
    known = set(serve_options(cfg))
    kept: list[str] = []
    extras: dict[str, Any] = {}
    unrecognized: list[str] = []
    i = 0
    while i < len(argv):
        tok = argv[i]
        name, eq, value = tok.partition("=")
        if tok.startswith("--") and len(tok) > 2:
            name = _dashed(name)
            base = name.split(".", 1)[0]
            if base not in known and "." not in name:
                hits = [o for o in known if o.startswith(name)]
                if len(hits) > 1:
                    parser.error(f"ambiguous option: {name} could match {', '.join(sorted(hits))}")
                name = base = hits[0] if hits else name
            if name in own:  # the sim's parser takes it and its values (nargs) from here
                kept.append(name + eq + value)
                i += 1
                continue
            has_value = bool(eq) or (i + 1 < len(argv) and not argv[i + 1].startswith("--"))
            if not eq and has_value:
                value, i = argv[i + 1], i + 1
            if base not in known:
                unrecognized += [tok] if eq or not has_value else [tok, value]
            else:
                key = name[2:].replace("-", "_")
                if has_value:
                    extras[key] = _coerce(value)
                elif key.startswith("no_"):
                    extras[key[3:]] = False
                else:
                    extras[key] = True
            i += 1
            continue
        if tok.startswith("-O"):  # vLLM reads -O3, -O=3 and -O 3 as --optimization-level
            level = tok[2:].lstrip("=")
            if not level and i + 1 < len(argv) and argv[i + 1] in ("0", "1", "2", "3"):
                level, i = argv[i + 1], i + 1
            extras["optimization_level"] = _coerce(level or "3")
            i += 1
            continue
        number = tok[1:].replace(".", "", 1).isdigit()
        if tok.startswith("-") and len(tok) > 1 and tok not in own and not number:
            if tok in known:
                extras[tok[1:]] = True  # e.g. -q: echoed, not interpreted
            else:
                unrecognized.append(tok)
            i += 1
            continue
        kept.append(tok)
        i += 1
    if unrecognized:
        parser.error(f"unrecognized arguments: {' '.join(unrecognized)}")
    return kept, extras


def parse_serve_args(cfg: dict[str, Any], argv: list[str]) -> ServeArgs:
    """Parse `vllm serve` arguments (argparse exits 2 on a bad known flag, like vLLM)."""
    parser = build_parser(cfg)
    kept, extras = _split_unknown(parser, cfg, argv)
    ns = parser.parse_args(kept)
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
