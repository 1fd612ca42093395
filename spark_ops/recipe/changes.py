"""What an edit asks for: Change (knob, setting, flag) and its construction from CLI options."""

from __future__ import annotations

import difflib
import re
from collections.abc import Collection, Iterable
from dataclasses import dataclass

from spark_ops.errors import KnobError, excerpt
from spark_ops.recipe.flags import dashed
from spark_ops.recipe.knobs import (
    KNOB_KEYS,
    KNOBS,
    NEWEST_KNOWN,
    moe_backends,
    parse_kv_cache_memory,
    parse_max_num_seqs,
)
from spark_ops.recipe.sparkrun_maps import VLLM_FLAG_MAP

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
                known = list(moe_backends(NEWEST_KNOWN))
                near = difflib.get_close_matches(text, known, n=2, cutoff=0.6)
                raise KnobError(
                    f"--moe-backend: {text!r} is not a backend any known vLLM accepts; allowed: "
                    f"{', '.join(known)}",
                    hint=f"did you mean --moe-backend {' or '.join(near)}? nothing was written"
                    if near
                    else "choose one of the backends listed; nothing was written",
                )
            return cls("knob", knob, text)
        return cls("knob", knob, _as_bool(value, "--enforce-eager"))

    @classmethod
    def setting(cls, key: str, value: object) -> Change:
        """A `defaults` key (or, when no such key, the matching literal flag); knobs route."""
        if not _KEY.match(key):
            snake = key.replace("-", "_").lstrip("_")
            hint = (
                f"--set takes the recipe's defaults keys (snake_case): --set {snake}={value}"
                f" (or the option: --{key.lstrip('-')} {value})"
                if _KEY.match(snake)
                else "--set KEY=VALUE with KEY of letters, digits and _ (a recipe defaults key)"
            )
            raise KnobError(
                f"--set: key {key!r} is not a defaults key (letters, digits, _)", hint=hint
            )
        if key in KNOB_KEYS:
            return cls.knob(key, value)
        return cls("setting", key, str(value))

    @classmethod
    def flag(cls, flag: str, value: str | None = None, *, remove: bool = False) -> Change:
        """A flag set with a value, added bare (value None), or removed (remove=True)."""
        if not _FLAG.match(flag):
            raise KnobError(f"flag {flag!r} is not a command-line option (e.g. --max-model-len)")

        canon = dashed(flag)
        for knob in KNOBS.values():
            canon = knob.flag if canon in knob.aliases else canon
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


def requested_flags(
    changes: Iterable[Change], defaults_keys: Collection[str] = ()
) -> list[tuple[str, str]]:
    """The vLLM options a user's `--set` / `--flag` keys name: (as given, option), in order.

    A key sparkrun maps to a flag (VLLM_FLAG_MAP) names that flag; another `--set` key the recipe
    holds in `defaults` is a recipe key, not an option; knobs and removals are not checked (a
    knob's flag is fixed; removing an option vLLM lacks is a fix).
    """
    out: list[tuple[str, str]] = []
    for change in changes:
        if change.kind == "flag" and not change.remove:
            out.append((f"--flag {change.name}", change.name))
        elif change.kind == "setting" and change.name in VLLM_FLAG_MAP:  # sparkrun's own flag
            out.append((f"--set {change.name}", VLLM_FLAG_MAP[change.name]))
        elif change.kind == "setting" and change.name not in defaults_keys:
            out.append((f"--set {change.name}", dashed("--" + change.name)))
    return out


OPTIMIZATION_LEVELS = ("0", "1", "2", "3")  # vLLM's -O<n> (OptimizationLevel)
# vLLM's options that take JSON (so OPTION.FIELD=VALUE): its config and kwargs options, and the
# short names of three of them (facts of vLLM's arg_utils)
JSON_OPTION_SUFFIXES = ("-config", "-kwargs", "-overrides", "-per-prompt")
JSON_SHORT_OPTIONS = {"-cc": "--compilation-config", "-ac": "--attention-config",
                      "-sc": "--speculative-config"}  # fmt: skip
_FIELDS = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*(\.[A-Za-z_][A-Za-z0-9_-]*)*\+?")


# Options named like JSON ones that take plain text (a fact of vLLM's arg_utils: the generation
# config is a folder, "auto" or "vllm"; its fields go in --override-generation-config)
NOT_JSON_OPTIONS = frozenset({"--generation-config"})


def json_option(option: str) -> bool:
    """True for a vLLM option that takes a JSON value (its fields settable as OPTION.FIELD)."""
    if option in NOT_JSON_OPTIONS:
        return False
    return option in JSON_SHORT_OPTIONS or (
        option.startswith("--") and option.endswith(JSON_OPTION_SUFFIXES)
    )


def option_problem(option: str, options: Collection[str]) -> str | None:
    """Why `option` is not one of the serve parser's `options` (None: it is one): unknown, or an
    abbreviation vLLM's argparse would silently expand; with "did you mean" when one is near."""
    if option.startswith("-O") and not option.startswith("--"):
        if "--optimization-level" not in options:
            return "no -O (optimization level) here"
        level = option[3:] if option[2:3] == "=" else option[2:]
        if level in ("", *OPTIMIZATION_LEVELS):  # bare -O: its level is the next word
            return None
        return (
            f"-O takes an optimization level ({', '.join(OPTIMIZATION_LEVELS)}, as -O3), not "
            f"{level!r}; a field of the compilation config is --compilation-config.FIELD=VALUE"
        )
    name = option.split("=", 1)[0]
    base, dot, fields = name.partition(".")  # `--compilation-config.mode`: a field of a JSON option
    if base in options:
        if not dot:
            return None
        if not json_option(base):
            takes = sorted(o for o in options if json_option(o) and o.startswith("--"))
            close = difflib.get_close_matches(base, takes, n=3, cutoff=0.6)
            also = f"; did you mean {' or '.join(close)}?" if close else ""
            return (
                f"{base} takes no dotted field (vLLM's OPTION.FIELD sets a field of a "
                f"JSON option, such as --compilation-config.mode){also}"
            )
        if not _FIELDS.fullmatch(fields):
            return f"{fields!r} is not a field name (letters, digits, _ between dots)"
        return None
    longs = sorted(o for o in options if o.startswith("--"))
    hits = [o for o in longs if o.startswith(base)] if base.startswith("--") else []
    if hits:
        expands = (
            f"vLLM would expand the abbreviation to {hits[0]}"
            if len(hits) == 1
            else f"an abbreviation of {len(hits)} options"
        )
        return f"{base} is not an option ({expands}); did you mean {' or '.join(hits[:3])}?"
    near = difflib.get_close_matches(base, longs, n=3, cutoff=0.6)
    guess = f"; did you mean {' or '.join(near)}?" if near else ""
    return f"{base} is not an option{guess}"


def refuse_unknown_options(
    requested: Iterable[tuple[str, str]], options: Collection[str], parser: str
) -> None:
    """KnobError naming every requested key the parser does not know exactly (nothing written)."""
    known = set(options)
    bad = [f"{given}: {why}" for given, opt in requested if (why := option_problem(opt, known))]
    if bad:
        raise KnobError(
            f"{parser} does not take: " + "; ".join(bad),
            hint="nothing was written; write the option in full, as `vllm serve --help=all` "
            "lists it",
        )
