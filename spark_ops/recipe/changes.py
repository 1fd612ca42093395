"""What an edit asks for: Change (knob, setting, flag) and its construction from CLI options."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from spark_ops.errors import KnobError, excerpt
from spark_ops.recipe.knobs import (
    KNOB_KEYS,
    KNOBS,
    NEWEST_KNOWN,
    moe_backends,
    parse_kv_cache_memory,
    parse_max_num_seqs,
)
from spark_ops.recipe.source import normalize_flag

_KEY = re.compile(r"^[A-Za-z_]\w*$")
_FLAG = re.compile(r"^--?[A-Za-z0-9][\w.-]*$")


@dataclass(frozen=True)
class Change:
    """One requested change: a knob, a defaults setting, or a command-line flag."""

    kind: str  # "knob" | "setting" | "flag"
    name: str  # knob name, defaults key, or flag (--name)
    value: object = None  # knob value, setting value, flag value (None: bare flag)
    remove: bool = False  # flag removal

    @classmethod
    def knob(cls, name: str, value: object) -> Change:
        """A knob change, validated (moe backend names are checked per version at edit time)."""
        knob = KNOB_KEYS.get(name)
        if knob is None:
            raise KnobError(f"unknown knob {name!r}; allowed: {', '.join(KNOBS)}")
        if knob == "max_num_seqs":
            return cls("knob", knob, parse_max_num_seqs(value))
        if knob == "kv_cache_memory":
            text = str(value).strip()
            parse_kv_cache_memory(text)
            return cls("knob", knob, text)
        if knob == "moe_backend":
            text = str(value).strip()
            if text not in moe_backends(NEWEST_KNOWN) or not text:
                raise KnobError(
                    f"--moe-backend: {text!r} is not a backend any known vLLM accepts; allowed: "
                    f"{', '.join(moe_backends(NEWEST_KNOWN))}"
                )
            return cls("knob", knob, text)
        return cls("knob", knob, _as_bool(value, "--enforce-eager"))

    @classmethod
    def setting(cls, key: str, value: object) -> Change:
        """A `defaults` key (or, when no such key, the matching literal flag); knobs route."""
        if not _KEY.match(key):
            raise KnobError(f"--set: key {key!r} is not a defaults key (letters, digits, _)")
        if key in KNOB_KEYS:
            return cls.knob(key, value)
        return cls("setting", key, str(value))

    @classmethod
    def flag(cls, flag: str, value: str | None = None, *, remove: bool = False) -> Change:
        """A flag set with a value, added bare (value None), or removed (remove=True)."""
        if not _FLAG.match(flag):
            raise KnobError(f"flag {flag!r} is not a command-line option (e.g. --max-model-len)")

        canon = normalize_flag(flag)
        for knob in KNOBS.values():
            if canon == knob.flag and not remove:
                if knob.boolean:
                    return cls.knob(knob.name, True if value is None else value)
                if value is None:
                    raise KnobError(f"flag {flag}: needs a value, e.g. {flag}=VALUE")
                return cls.knob(knob.name, value)
            if knob.boolean and canon == "--no-" + knob.flag[2:] and value is None and not remove:
                return cls.knob(knob.name, False)
        if value is not None and not remove:
            refuse_option_like(f"flag {canon}", value)
        return cls("flag", canon, None if remove else value, remove)

    def describe(self) -> str:
        """Short human description, e.g. 'max_num_seqs=64' or '--flag removed'."""
        if self.kind == "flag":
            if self.remove:
                return f"remove {self.name}"
            return self.name if self.value is None else f"{self.name}={self.value}"
        return f"{self.name}={self.value}"

    def to_dict(self) -> dict[str, object]:
        """Serialize for --json output."""
        return {"kind": self.kind, "name": self.name, "value": self.value, "remove": self.remove}


def _as_bool(value: object, what: str) -> bool:
    """Accept a bool or true/false/1/0/yes/no."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise KnobError(f"{what}: {value!r} is not a boolean; use true or false")


def refuse_option_like(what: str, value: str) -> None:
    """Refuse a flag value that vLLM's argparse would read as an option (`-a`, `--x`), not a number.

    `--served-model-name -a` fails at boot ("expected at least one argument"); `-1` is a value.
    """
    text = value.strip()
    if not text.startswith("-"):
        return
    try:
        float(text)
    except ValueError:
        raise KnobError(
            f"{what}: value {excerpt(text)} starts with '-', so vLLM would read it as an option; "
            "allowed: a value not starting with '-' (negative numbers are fine)",
            hint="nothing was written",
        ) from None


def changes_from_options(
    *,
    max_num_seqs: int | str | None = None,
    kv_cache_memory: str | int | None = None,
    moe_backend: str | None = None,
    enforce_eager: bool | None = None,
    sets: Iterable[str] = (),
    flags: Iterable[str] = (),
    unset_flags: Iterable[str] = (),
) -> list[Change]:
    """Build validated changes from CLI-style options; KnobError names the bad option/value."""
    changes: list[Change] = []
    if max_num_seqs is not None:
        changes.append(Change.knob("max_num_seqs", max_num_seqs))
    if kv_cache_memory is not None:
        changes.append(Change.knob("kv_cache_memory", kv_cache_memory))
    if moe_backend is not None:
        changes.append(Change.knob("moe_backend", moe_backend))
    if enforce_eager is not None:
        changes.append(Change.knob("enforce_eager", enforce_eager))
    for item in sets:
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise KnobError(f"--set {item!r}: use KEY=VALUE, e.g. --set max_model_len=65536")
        changes.append(Change.setting(key.strip(), value.strip()))
    for item in flags:
        text = item.strip()
        if "=" in text:
            name, _, value = text.partition("=")
            changes.append(Change.flag(name, value))
        elif " " in text:
            name, _, value = text.partition(" ")
            changes.append(Change.flag(name, value.strip()))
        else:
            changes.append(Change.flag(text))
    for item in unset_flags:
        changes.append(Change.flag(item.strip(), remove=True))
    return changes
