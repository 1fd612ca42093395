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
