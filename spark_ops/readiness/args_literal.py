"""vLLM's non-default args line: its dict literal, parsed even when values are object reprs."""

from __future__ import annotations

import ast
import re
from typing import Any


def parse_args_literal(text: str) -> dict[str, Any]:
    """Parse the `{...}` of a non-default args line; values that are not literals stay strings."""
    text = text.strip()
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        value = None
    if isinstance(value, dict):
        return {str(k): v for k, v in value.items()}
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return _parse_args_loosely(text)
    if isinstance(tree.body, ast.Dict):
        loose = _loose_value(tree.body, text)
        if isinstance(loose, dict):
            return {str(k): v for k, v in loose.items()}
    return _parse_args_loosely(text)


_SPECIAL_FLOATS = {"inf": float("inf"), "nan": float("nan")}


def _loose_value(node: ast.AST, src: str) -> Any:
    """Evaluate literal parts of an expression; other parts (object reprs) become their text."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Dict):
        return {
            _loose_value(k, src) if k is not None else "**": _loose_value(v, src)
            for k, v in zip(node.keys, node.values, strict=True)
        }
    if isinstance(node, ast.List):
        return [_loose_value(e, src) for e in node.elts]
    if isinstance(node, ast.Tuple):
        return tuple(_loose_value(e, src) for e in node.elts)
    if isinstance(node, ast.Name) and node.id in _SPECIAL_FLOATS:
        return _SPECIAL_FLOATS[node.id]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        inner = _loose_value(node.operand, src)
        if isinstance(inner, (int, float)) and not isinstance(inner, bool):
            return -inner if isinstance(node.op, ast.USub) else inner
    return ast.get_source_segment(src, node)


def _split_top_level(body: str) -> list[str]:
    """Split on commas that are not inside brackets or quotes."""
    parts: list[str] = []
    depth = 0
    quote: str | None = None
    start = 0
    i = 0
    while i < len(body):
        ch = body[i]
        if quote:
            if ch == "\\":
                i += 1
            elif ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(body[start:i])
            start = i + 1
        i += 1
    parts.append(body[start:])
    return [p for p in (s.strip() for s in parts) if p]


def _parse_args_loosely(text: str) -> dict[str, Any]:
    """Key by key parse of a dict repr holding non-literal values (or cut short)."""
    body = text.strip()
    if body.startswith("{"):
        body = body[1:]
    if body.endswith("}"):
        body = body[:-1]
    result: dict[str, Any] = {}
    for part in _split_top_level(body):
        m = re.match(r"""^(['"])(?P<key>.+?)\1\s*:\s*(?P<value>.*)$""", part, re.S)
        if not m:
            continue
        raw = m.group("value").strip()
        try:
            result[m.group("key")] = ast.literal_eval(raw)
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            result[m.group("key")] = raw
    return result
