"""The watchdog's restart command: its {reason} / {by} placeholders checked and filled in one
pass (each value one shell-quoted word), and the stamps it prints read back."""

from __future__ import annotations

import json
import math
import re

from spark_ops.errors import WatchdogError
from spark_ops.remote.quoting import quote_word

PLACEHOLDERS = ("reason", "by")
_PLACEHOLDER_RE = re.compile(r"\{(" + "|".join(PLACEHOLDERS) + r")\}")


def _quoted_spans(template: str) -> list[tuple[int, int]]:
    """The (start, end) spans of the template that a POSIX shell reads inside quotes."""
    spans: list[tuple[int, int]] = []
    i, n = 0, len(template)
    while i < n:
        ch = template[i]
        if ch == "\\":
            i += 2
            continue
        if ch in ("'", '"'):
            j = i + 1
            while j < n and template[j] != ch:
                j += 2 if (ch == '"' and template[j] == "\\") else 1
            spans.append((i, j))
            i = j + 1
            continue
        i += 1
    return spans


def check_restart_template(template: str, key: str = "watchdog.restart_command") -> None:
    """Refuse a restart command whose {reason} / {by} sits inside quotes (its value would not be
    one quoted word there)."""
    spans = _quoted_spans(template)
    for m in _PLACEHOLDER_RE.finditer(template):
        if any(a < m.start() < b for a, b in spans):
            raise WatchdogError(
                f"{key}: {m.group(0)} is inside quotes in {template!r}; spark-ops puts each value "
                "in as one shell-quoted word, so write the placeholder unquoted "
                f"(e.g. --reason {{reason}})"
            )


def check_value(name: str, value: str) -> str:
    """A value for a placeholder: text that encodes as UTF-8 and holds no NUL."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise WatchdogError(
            f"--{name} {value.encode('utf-8', 'surrogateescape')!r}: not valid UTF-8; "
            "allowed: any UTF-8 text without NUL"
        ) from None
    if "\0" in value:
        raise WatchdogError(f"--{name}: holds a NUL byte; allowed: any UTF-8 text without NUL")
    return value


def fill_restart_command(template: str, values: dict[str, str]) -> str:
    """Substitute every placeholder in ONE pass, each value one shell-quoted word.

    A value that itself holds `{by}` or `$(...)` stays inert text: replacements are never scanned
    again. Other braces (`${HOME}`, `{a,b}`) are left to the shell as written.
    """
    check_restart_template(template)
    for name, value in values.items():
        check_value(name, value)
    return _PLACEHOLDER_RE.sub(lambda m: quote_word(values[m.group(1)]), template)


def reported_stamps(output: str) -> list[float]:
    """Every {"stamp": …} (or `stamp: N`) line of a restart command's output, in order: the
    reference watchdog prints one per restart, so a command that restarted twice prints two."""
    out: list[float] = []
    for line in output.strip().splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                obj = json.loads(line)
            except (ValueError, RecursionError):
                continue
            value = obj.get("stamp") if isinstance(obj, dict) else None
            if isinstance(value, int | float) and not isinstance(value, bool):
                out.extend([float(value)] if math.isfinite(value) else [])
            continue
        m = re.match(r"^stamp[=:]\s*([0-9]+(?:\.[0-9]+)?)$", line)
        if m:
            out.append(float(m.group(1)))
    return out
