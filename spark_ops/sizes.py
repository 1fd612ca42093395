"""vLLM's human-readable ints, read as vLLM reads them: spark-ops' one size parser.

A module of its own, with nothing but the standard library and errors.py, because both the
recipe's knobs and the simulated vLLM (a process started at every simulated boot) import it.
"""

from __future__ import annotations

import re

from spark_ops.errors import excerpt

# vLLM's human-readable ints (`--kv-cache-memory-bytes`, `--max-model-len`, ...): a number with one
# suffix, K M G T binary, k m g t decimal (decimals only with these, computed in floating point as
# vLLM does: 1.001g is 1000999999), else whatever Python's int() takes.
_SUFFIXED = re.compile(r"(\d+(?:\.\d+)?)([kKmMgGtT])")


def parse_human_int(text: str) -> int:
    """The int vLLM makes of a human-readable value (60G, 60g, 1.5g, 1024); ValueError if none.

    spark-ops' one size parser: the recipe's knobs (recipe/knobs.py) check values with it, adding
    their own rules, and the simulated vLLM parses its command line with it.
    """
    value = text.strip()
    match = _SUFFIXED.fullmatch(value)
    if match is not None and match.group(2).isupper() and "." in match.group(1):
        raise ValueError(
            f"invalid value {excerpt(text)}: decimals are allowed only with lowercase (decimal) "
            "suffixes k m g t"
        )
    try:
        if match is None:
            return int(value)
        number, suffix = match.groups()
        power = "kmgt".index(suffix.lower()) + 1
        if suffix.islower():
            return int(float(number) * 1000**power)
        return int(number) * 1024**power
    except (ValueError, OverflowError):
        raise ValueError(
            f"invalid value {excerpt(text)}: use an integer or a number with one suffix "
            "(K M G T binary, k m g t decimal)"
        ) from None


def human_bytes(n: int | float) -> str:
    """A byte count as a person reads it: 60 GiB, 1.5 GiB, 512 MiB, 100 B (binary units)."""
    value = float(n)
    for unit in ("TiB", "GiB", "MiB", "KiB"):
        scale = 1024.0 ** ("KMGT".index(unit[0]) + 1)
        if abs(value) >= scale:
            scaled = value / scale
            return f"{scaled:.0f} {unit}" if scaled == int(scaled) else f"{scaled:.1f} {unit}"
    return f"{value:.0f} B"


def human_value(key: str, value: object) -> str:
    """A knob's or an arg's value as a person reads it: a byte count (`…_bytes`, an integer or
    its digits) in binary units (60 GiB), anything else as it is."""
    if key.endswith("_bytes") and not isinstance(value, bool):
        if isinstance(value, int):
            return human_bytes(value)
        if isinstance(value, str) and value.isdigit():
            return human_bytes(int(value))
    return str(value)


def human_share(fraction: float) -> str:
    """A fraction 0..1 as a percentage (KV cache usage): 0 %, <0.1 %, 12.3 %, 100 %."""
    pct = float(fraction) * 100
    if pct == 0:
        return "0 %"
    return "<0.1 %" if 0 < pct < 0.1 else f"{pct:.1f} %".replace(".0 %", " %")


def human_count(value: float) -> str:
    """A gauge that counts things (requests running): 1, not 1.0."""
    return f"{value:.0f}" if float(value) == int(value) else f"{value:.1f}"
