"""Render a sparkrun v2 recipe as sparkrun 0.4.2 does for a solo launch (facts from its source).

The chain: `include:` bases merged in (mappings merge, `defaults`/`env` values atomic, `null`
deletes), then the placeholder values (recipe `defaults`, then `model`, `model_revision` when
pinned, `resolved_model_path`). A `command:` template is rendered by repeated `{key}`
substitution (a key with no value stays literal, as in sparkrun), braces that are no
placeholder kept; a recipe without `command:` is built from the flag map. sparkrun then adds
`--served-model-name` when the command lacks it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from copy import deepcopy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from spark_ops.errors import RecipeError, UnsupportedRecipe
from spark_ops.recipe.dialect import check_sparkrun_shape
from spark_ops.recipe.source import parse_yaml
from spark_ops.recipe.sparkrun_maps import (
    VLLM_BOOL_KEYS,
    VLLM_FLAG_MAP,
    VLLM_NEGATABLE_KEYS,
    VLLM_RUNTIMES,
    VLLM_SKIPPED_IN_LOOP,
    parse_bool,
)
from spark_ops.remote.quoting import quote_word

#: Deepest include chain sparkrun accepts.
MAX_INCLUDE_DEPTH = 8
_SAFE_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._+-]*$")
_SPAN = re.compile(r"\{[^{}]*\}")
_FIELD = re.compile(r"\{(.*?)\}")
_LB, _RB = "\x00", "\x01"
_MAX_PASSES = 10
_SERVED_NAME = re.compile(r"--(?:served-model-name|model-name|alias)[=\s]+(\S+)", re.IGNORECASE)
_RAY = re.compile(r"--distributed-executor-backend[=\s]+ray\b")

#: Reads a sibling include: (name, including file's source) -> (text, source of the base).
IncludeReader = Callable[[str, str], tuple[str, str]]


@dataclass
class Layer:
    """One file of an include chain: its source (path), text and parsed data."""

    source: str
    text: str
    data: dict[str, Any]


@dataclass
class Chain:
    """A recipe with its include bases (outermost base first, the file itself last)."""

    layers: list[Layer]
    merged: dict[str, Any]

    @property
    def top(self) -> Layer:
        """The file the user named."""
        return self.layers[-1]

    def holder(self, section: str, key: str | None = None) -> Layer | None:
        """The layer whose value wins for a top-level key (or a key of a mapping section)."""
        for layer in reversed(self.layers):
            if key is None:
                if section in layer.data:
                    return layer if layer.data[section] is not None else None
                continue
            block = layer.data.get(section)
            if section in layer.data and block is None:
                return None  # `section: null` deletes what the bases had
            if isinstance(block, dict) and key in block:
                return layer if block[key] is not None else None
        return None


def sibling_reader(name: str, including: str) -> tuple[str, str]:
    """Read `include: name` next to the including file, as sparkrun resolves sibling bases."""
    directory = Path(including).parent
    suffixes = (".yaml", ".yml")
    candidates = (
        [directory / name]
        if name.endswith(suffixes)
        else [directory / (name + suffix) for suffix in suffixes]
    )
    for candidate in candidates:
        if candidate.is_file():
            if not candidate.resolve().is_relative_to(directory.resolve()):
                raise RecipeError(
                    f"{including}: include {name!r} resolves outside its directory "
                    f"({candidate.resolve()})"
                )
            try:
                return candidate.read_bytes().decode("utf-8"), str(candidate)
            except (OSError, UnicodeDecodeError) as exc:
                raise RecipeError(f"{candidate}: cannot read include base: {exc}") from exc
    raise RecipeError(f"{including}: include {name!r} not found next to it")


def load_chain(text: str, *, source: str, reader: IncludeReader | None) -> Chain:
    """Parse a recipe and its include bases; RecipeError for cycles, depth, registry refs."""
    layers: list[Layer] = []
    seen: set[str] = {str(Path(source).resolve())} if Path(source).is_file() else set()
    cur_text, cur_source = text, source
    while True:
        data = parse_yaml(cur_text, source=cur_source)
        check_sparkrun_shape(data, source=cur_source)
        if layers and str(data.get("recipe_version", "2")).strip() == "1":
            raise UnsupportedRecipe(f"{cur_source}: an include base must be a v2 recipe")
        layers.insert(0, Layer(cur_source, cur_text, data))
        ref = data.get("include")
        if ref is None:
            break
        name = str(ref).strip()
        if len(layers) > MAX_INCLUDE_DEPTH:
            raise RecipeError(f"{source}: include chain deeper than {MAX_INCLUDE_DEPTH} recipes")
        if name.startswith("@"):
            raise UnsupportedRecipe(
                f"{cur_source}: include {name!r} names a registry recipe; spark-ops resolves "
                "sibling includes only (sparkrun would clone the registry)",
                hint="copy the base next to the recipe and include it by file name",
            )
        if not _SAFE_NAME.match(name):
            raise RecipeError(
                f"{cur_source}: include {name!r} must name a file in the same directory "
                "(no path separators)"
            )
        if reader is None:
            raise UnsupportedRecipe(
                f"{cur_source}: include {name!r}: the base cannot be read here (no file "
                "location); render or edit it with `spark-ops recipe` on the file itself"
            )
        cur_text, cur_source = reader(name, cur_source)
        key = str(Path(cur_source).resolve())
        if key in seen or cur_source == source:
            raise RecipeError(f"{source}: include cycle: {name!r} is already in the chain")
        seen.add(key)
    merged = deepcopy(layers[0].data)
    for layer in layers[1:]:
        merged = merge_layers(merged, layer.data)
    return Chain(layers, merged)


def merge_layers(base: dict[str, Any], outer: dict[str, Any]) -> dict[str, Any]:
    """sparkrun's include merge: mappings by key, defaults/env values atomic, null deletes."""
    merged = deepcopy(base)
    merged.pop("include", None)
    for key, value in outer.items():
        if key == "include":
            continue
        if value is None:
            merged.pop(key, None)
        elif key == "overrides" and isinstance(value, list) and isinstance(merged.get(key), list):
            merged[key] = merged[key] + deepcopy(value)
        elif isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge_map(merged[key], value, atomic=key in ("defaults", "env"))
        else:
            merged[key] = deepcopy(value)
    return merged


def _merge_map(base: dict[str, Any], outer: dict[str, Any], *, atomic: bool) -> dict[str, Any]:
    """Merge one mapping section."""
    result = dict(base)
    for key, value in outer.items():
        if value is None:
            result.pop(key, None)
        elif not atomic and isinstance(value, dict) and isinstance(result.get(key), dict):
            result[key] = _merge_map(result[key], value, atomic=False)
        else:
            result[key] = deepcopy(value)
    return result


def runtime_family(data: dict[str, Any]) -> str:
    """'vllm', 'sglang' or the runtime's own name, as sparkrun resolves it."""
    runtime = str(data.get("runtime") or "")
    command = str(data.get("command") or "").strip()
    if not runtime:
        if re.match(r"^(?:sglang\s+serve|python3?\s+-m\s+sglang\.launch_server)\b", command):
            return "sglang"
        if re.match(r"^(?:llama-server|trtllm-serve)\b", command):
            return command.split()[0]
        return "vllm"
    return "vllm" if runtime in VLLM_RUNTIMES else runtime


def placeholder_values(data: dict[str, Any]) -> dict[str, Any]:
    """The values `{key}` placeholders read: defaults (escapes collapsed), then model facts."""
    values: dict[str, Any] = {}
    for key, value in (data.get("defaults") or {}).items():
        if isinstance(value, str) and "{{" in value:
            value = value.replace("{{", "{").replace("}}", "}")
        values[str(key)] = value
    model = data.get("model", "")
    values.setdefault("model", model)
    if data.get("model_revision"):
        values.setdefault("model_revision", data["model_revision"])
    cluster = data.get("cluster_config")
    path = cluster.get("resolved_model_path") if isinstance(cluster, dict) else None
    values.setdefault("resolved_model_path", path or model)
    return values


def fill_template(template: str, values: dict[str, Any]) -> str:
    """Substitute `{key}` until stable (10 passes at most); unknown or null keys stay literal."""
    escapes = "{{" in template
    masked: list[str] = []
    i = 0
    while i < len(template):
        ch = template[i]
        if ch in "{}" and template.startswith(ch * 2, i):
            sentinel = _LB if ch == "{" else _RB
            masked.append(sentinel if escapes else sentinel * 2)
            i += 2
            continue
        if ch == "{":
            span = _SPAN.match(template, i)
            if span:
                masked.append(span.group())
                i = span.end()
                continue
        masked.append(_LB if ch == "{" else _RB if ch == "}" else ch)
        i += 1
    text = "".join(masked)

    def one(match: re.Match[str]) -> str:
        """One field: its value as str(), or the field itself when there is none."""
        value = values.get(match.group().strip("{}"))
        return match.group() if value is None else str(value)

    for _ in range(_MAX_PASSES):
        nxt = _FIELD.sub(one, text)
        if nxt == text:
            break
        text = nxt
    return text.replace(_LB, "{").replace(_RB, "}")


def unfilled(template: str, values: dict[str, Any]) -> list[str]:
    """Placeholder names of a template that have no value (sparkrun passes them literally)."""
    masked = template.replace("{{", "").replace("}}", "")
    names = [m.group()[1:-1] for m in _SPAN.finditer(masked)]
    return [n for n in names if n.isidentifier() and values.get(n) is None]


def flag_value(value: object) -> str:
    """A structured flag value as sparkrun writes it: JSON for mappings/lists, else str()."""
    if isinstance(value, (dict, list, tuple)):
        return quote_word(json.dumps(value, separators=(",", ":"), default=str))
    if isinstance(value, str) and value.strip()[:1] in ("{", "["):
        return quote_word(value.strip())
    return str(value)


def _append(command: str, *parts: str) -> str:
    """Append words after the command, dropping a dangling line continuation first."""
    body = command.rstrip()
    while body.endswith("\\") and not body.endswith("\\\\"):
        body = body[:-1].rstrip()
    return " ".join([body, *parts]) if body else " ".join(parts)


def _has_flag(command: str, flag: str) -> bool:
    """Whether a flag is a whole word of the command (`--flag` or `--flag=value`)."""
    return re.search(r"(?<!\S)" + re.escape(flag) + r"(?=[=\s]|$)", command) is not None


@dataclass
class SparkrunCommand:
    """A rendered sparkrun serve command and how it was made."""

    text: str
    family: str
    from_template: bool
    literal_placeholders: list[str] = field(default_factory=list)


def build_command(data: dict[str, Any], *, source: str) -> SparkrunCommand:
    """The solo serve command sparkrun runs for merged recipe data."""
    family = runtime_family(data)
    values = placeholder_values(data)
    template = data.get("command")
    if template:
        text = fill_template(template.strip(), values)
        text = re.sub(r"\\[ \t]+\n", "\\\n", text)
        missing = unfilled(template, values)
        if family == "vllm":
            backend = values.get("distributed_executor_backend")
            if backend is not None:
                text = _reconcile(text, "--distributed-executor-backend", str(backend))
        if family in ("vllm", "sglang"):
            text = _served_name(text, data, values, family)
        return SparkrunCommand(text, family, True, missing)
    if family != "vllm":
        raise UnsupportedRecipe(
            f"{source}: runtime {data.get('runtime')!r} without 'command': spark-ops builds "
            "command-less recipes for vLLM only"
        )
    return SparkrunCommand(_structured(data, values), family, False)


def _reconcile(command: str, flag: str, value: str) -> str:
    """Force a flag to a value (replace its first occurrence, else append it)."""
    if _has_flag(command, flag):
        replaced, count = re.subn(
            r"(?<!\S)" + re.escape(flag) + r"(=|\s+(?:\\\n\s*)?)\S+",
            lambda m: f"{flag}{m.group(1)}{value}",
            command,
            count=1,
        )
        if count:
            return replaced
    return _append(command, f"{flag} {value}")


def _served_name(text: str, data: dict[str, Any], values: dict[str, Any], family: str) -> str:
    """sparkrun's fill: `--served-model-name` appended when the command has none."""
    declared = values.get("served_model_name")
    if declared is None and family == "vllm":
        found = _SERVED_NAME.search(str(data.get("command") or ""))
        name = found.group(1).strip("\"'") if found else ""
        declared = name if name and "{" not in name and "}" not in name else data.get("model")
    if declared is None or not str(declared) or _has_flag(text, "--served-model-name"):
        return text
    return _append(text, f"--served-model-name {declared}")


def _structured(data: dict[str, Any], values: dict[str, Any]) -> str:
    """A command-less vLLM recipe: `vllm serve MODEL` then the flag map over defaults."""
    model = str(data.get("model") or "")
    parts = ["vllm", "serve", model]
    revision = data.get("model_revision")
    cluster = data.get("cluster_config")
    pre_placed = isinstance(cluster, dict) and cluster.get("resolved_model_path")
    if revision and not model.startswith("/") and ":" not in model and not pre_placed:
        parts += ["--revision", quote_word(str(revision))]
    tp = values.get("tensor_parallel")
    if tp:
        parts += ["-tp", str(tp)]
    for key, flag in VLLM_FLAG_MAP.items():
        value = values.get(key)
        if key in VLLM_SKIPPED_IN_LOOP or value is None:
            continue
        if key in VLLM_BOOL_KEYS:
            if parse_bool(value):
                parts.append(flag)
            elif key in VLLM_NEGATABLE_KEYS:
                parts.append("--no-" + flag[2:])
        else:
            parts += [flag, flag_value(value)]
    return _served_name(" ".join(parts), data, values, "vllm")


def uses_ray(data: dict[str, Any]) -> bool:
    """Whether sparkrun resolves this vLLM recipe to its Ray runtime (vllm-ray)."""
    backend = (data.get("defaults") or {}).get("distributed_executor_backend", "")
    return str(backend).lower() == "ray" or bool(_RAY.search(str(data.get("command") or "")))
