"""The minimal-diff editor of an eugr recipe (the sparkrun editor builds on it): change only the
lines a knob, setting or flag lives on."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field

from spark_ops.errors import KnobError, RecipeError, UnsupportedRecipe, excerpt
from spark_ops.recipe.changes import Change, refuse_option_like
from spark_ops.recipe.command import (
    CommandView,
    Edit,
    apply_edits,
    entry_edit,
    mapping_insert,
    yaml_scalar,
)
from spark_ops.recipe.diff import unified_diff
from spark_ops.recipe.flags import resolve_flag
from spark_ops.recipe.knobs import (
    KNOBS,
    LEGACY_MOE_SETTINGS,
    NEWEST_KNOWN,
    has_moe_flag,
    legacy_env_warnings,
    validate_moe_backend,
    version_from_container,
    version_is_guessed,
)
from spark_ops.recipe.render import Option
from spark_ops.recipe.source import RecipeText, load_recipe_text
from spark_ops.remote.quoting import quote_word


@dataclass
class RecipeEdit:
    """The result of an edit: new text, warnings, whether anything changed."""

    text: str
    original: str
    warnings: list[str] = field(default_factory=list)
    vllm_version: str = NEWEST_KNOWN

    @property
    def changed(self) -> bool:
        """Whether the text differs from the original."""
        return self.text != self.original

    def diff(self, path: str) -> str:
        """Unified diff of the edit."""
        return unified_diff(self.original, self.text, path)

    def to_dict(self) -> dict[str, object]:
        """Serialize for --json output."""
        return {"changed": self.changed, "warnings": self.warnings, "vllm": self.vllm_version}


class Editor:
    """Applies changes one at a time to the current text, collecting warnings."""

    def __init__(self, text: str, source: str, version: str) -> None:
        """Start from the original text."""
        self.text = text
        self.source = source
        self.version = version
        self.warnings: list[str] = []

    #: Whether a `\\` followed by blanks continues a command line (sparkrun repairs it).
    loose = False

    def view(self, rt: RecipeText) -> CommandView:
        """The command of the current text."""
        return CommandView(rt, loose=self.loose)

    def warn(self, message: str) -> None:
        """Record a warning once."""
        if message not in self.warnings:
            self.warnings.append(message)

    def apply_all(
        self, changes: Sequence[Change], image: str, explicit: bool, version_warnings: list[str]
    ) -> None:
        """Apply every change; the version read from a tag that is not vLLM's own image is a
        guess (`explicit`: the version was given), and its warnings count for a MoE change."""
        if not explicit and not version_warnings and version_is_guessed(image):
            self.guessed_from = image
        if any(c.kind == "knob" and c.name == "moe_backend" for c in changes):
            self.warnings += version_warnings
        for change in changes:
            self.apply(change)

    def apply(self, change: Change) -> None:
        """Apply one change to the current text."""
        rt = RecipeText(self.text, source=self.source)
        if change.kind == "setting":
            edits = self._setting(rt, change)
        elif change.kind == "flag":
            edits = self._flag(rt, resolve_flag(change.name), change.value, change.remove, set())
        elif change.name == "moe_backend" and not has_moe_flag(self.version):
            edits = self._legacy_moe(rt, str(change.value))
        else:
            edits = self._knob(rt, change)
        self.text = apply_edits(self.text, edits)

    def _knob(self, rt: RecipeText, change: Change) -> list[Edit]:
        """Edits for one of the four knobs."""
        spec = KNOBS[change.name]
        if spec.boolean:
            return self._flag(rt, spec.flag, None, not change.value, set(spec.aliases))
        value = str(change.value)
        if change.name == "kv_cache_memory" and rt.entry("env", "VLLM_CPU_KVCACHE_SPACE"):
            self.warn(
                f"{self.source}: env VLLM_CPU_KVCACHE_SPACE overrides --kv-cache-memory-bytes "
                "on vLLM's CPU build; remove it for the flag to count"
            )
        if change.name == "moe_backend":
            validate_moe_backend(value, self.version)
            env = rt.blocks.get("env")
            keys = [e.key for e in env.entries] if env else []
            for message in legacy_env_warnings(keys, self.version):
                self.warn(f"{self.source}: {message}")
        return self._flag(rt, spec.flag, value, False, set(spec.aliases))

    def _flag(
        self, rt: RecipeText, flag: str, value: object, remove: bool, aliases: set[str]
    ) -> list[Edit]:
        """Set, add bare, or remove a flag in the command; placeholders edited in defaults."""
        cmd = self.view(rt)
        names = aliases | {flag}
        carrier = self._flag_in_default(rt, cmd, names | {"--no-" + flag[2:]})
        if carrier is not None:
            return self._edit_default_words(rt, carrier, flag, value, remove, names)
        found = cmd.find(sorted(names))
        negated = cmd.find(["--no-" + flag[2:]]) if value is None else []
        if not remove:
            _refuse_dotted_mix(rt, cmd, flag)
        if remove:
            edits: list[Edit] = []
            for opt in found:
                edits += cmd.remove(opt)
            return edits
        if len(found) > 1 and not remove:
            self.warn(f"{self.source}: {_occurrences(rt, flag, found)}: all were set")
        if value is None:
            edits = [(opt.flag.start, opt.flag.end, flag) for opt in negated]
            if negated:
                self.warn(f"{self.source}: replaced --no-{flag[2:]} with {flag}")
            if not found and not negated:
                edits += cmd.insert_line(flag)
            return edits
        text = str(value)
        if not found:
            return cmd.insert_line(f"{flag} {_quote(text)}")
        return self._set_values(rt, cmd, found, flag, text)

    def _flag_in_default(self, rt: RecipeText, cmd: CommandView, names: set[str]) -> str | None:
        """The defaults key whose value (pasted into the command by its `{placeholder}`) holds
        one of these flags among its words, if any: that value, not a new line, decides."""
        defaults = load_recipe_text(rt.text, source=self.source).get("defaults") or {}
        for key, val in defaults.items():
            if not isinstance(val, str) or not cmd.placeholder_uses(str(key)):
                continue
            if any(_word_option(word) in names for word in val.split()):
                return str(key)
        return None

    def _edit_default_words(
        self,
        rt: RecipeText,
        key: str,
        flag: str,
        value: object,
        remove: bool,
        names: set[str],
    ) -> list[Edit]:
        """Set a bare flag inside a defaults value that the command pastes in (`{key}`)."""
        entry = rt.entry("defaults", key)
        current = (load_recipe_text(rt.text, source=self.source).get("defaults") or {})[key]
        if entry is None or value is not None:
            raise UnsupportedRecipe(
                f"{self.source}: {flag} is set inside defaults.{key} ({current!r}), which the "
                f"command pastes in through {{{key}}}: a flag added to the command would be "
                "overridden or doubled; nothing written",
                hint=f"edit defaults.{key} by hand, or move {flag} out of it into the command",
            )
        negation = "--no-" + flag[2:]
        words = [w for w in current.split() if _word_option(w) not in names | {negation}]
        if not remove:
            words.append(flag)
        new = " ".join(words)
        self.warn(f"{self.source}: {flag} is set through defaults.{key} ({{{key}}}): edited there")
        if new == current:
            return []
        return [entry_edit(rt, entry, yaml_scalar(new, entry.raw))]

    def _set_values(
        self, rt: RecipeText, cmd: CommandView, found: list[Option], flag: str, text: str
    ) -> list[Edit]:
        """Set each occurrence: its defaults placeholder when unshared, else the literal."""
        edits: list[Edit] = []
        keys: dict[str, int] = {}
        for opt in found:
            key = placeholder_of(opt)
            if key is not None:
                keys[key] = keys.get(key, 0) + 1
        edited_defaults: set[str] = set()
        for opt in found:
            key = placeholder_of(opt)
            entry = rt.entry("defaults", key) if key else None
            if key and entry is None:
                raise RecipeError(
                    f"{self.source}: {flag} uses placeholder {{{key}}} but 'defaults' has no "
                    f"key {key!r}"
                )
            if key and entry and cmd.placeholder_uses(key) == keys[key]:
                _plain_word(self.source, key, text)
                if key not in edited_defaults:
                    edits.append(entry_edit(rt, entry, yaml_scalar(text, entry.raw)))
                    edited_defaults.add(key)
                continue
            if key:
                self.warn(
                    f"{self.source}: placeholder {{{key}}} also feeds other flags; set {flag} "
                    f"literally and left defaults.{key} unchanged"
                )
            edits.append(_value_edit(opt, text))
        return edits

    def _setting(self, rt: RecipeText, change: Change) -> list[Edit]:
        """A defaults key, or the literal flag when the recipe has no such key."""
        key, value = change.name, str(change.value)
        entry = rt.entry("defaults", key)
        flag = resolve_flag("--" + key)
        if entry is not None:
            view = self.view(rt)
            if view.placeholder_uses(key) == 0 and view.find([flag]):
                self.warn(
                    f"{self.source}: defaults.{key} is not used by command, which sets {flag} "
                    "itself: that flag was set"
                )
                return self._flag(rt, flag, value, False, set())
            _plain_word(self.source, key, value)
            edits = [entry_edit(rt, entry, yaml_scalar(value, entry.raw))]
            if view.placeholder_uses(key) == 0:
                self.warn(
                    f"{self.source}: defaults.{key} was not used by command: added "
                    f"{flag} {{{key}}} to it"
                )
                edits += view.insert_line(f"{flag} {{{key}}}")
            return edits
        if not self.view(rt).find([flag]):
            self.warn(f"{self.source}: no defaults.{key} and no {flag} in command: added {flag}")
        return self._flag(rt, flag, value, False, set())

    #: The container image tag the version was read from, when it was not given (a guess).
    guessed_from: str | None = None

    def _legacy_moe(self, rt: RecipeText, backend: str) -> list[Edit]:
        """Before vLLM 0.18: select the MoE backend through the recipe's env mapping."""
        if self.guessed_from is not None:
            has_flag = bool(self.view(rt).find(["--moe-backend"]))
            raise UnsupportedRecipe(
                f"{self.source}: the image {self.guessed_from!r} is read as vLLM {self.version} "
                "only from its tag, and a tag is often the image's own release; before 0.18 the "
                "MoE backend is set through VLLM_* variables "
                + ("and the recipe's own --moe-backend line would be deleted; " if has_flag else "")
                + "spark-ops will not pick that path on a guess; nothing written",
                hint="give the engine's version: --vllm-version X.Y.Z (the head's `vllm "
                "--version`; apply's preflight reads it)",
            )
        validate_moe_backend(backend, self.version)
        edits: list[Edit] = []
        cmd = self.view(rt)
        for opt in cmd.find(["--moe-backend"]):
            self.warn(f"{self.source}: vLLM {self.version} has no --moe-backend flag: removed it")
            edits += cmd.remove(opt)
        adds: list[str] = []
        for key, val in LEGACY_MOE_SETTINGS[backend].items():
            entry = rt.entry("env", key)
            if val is None:
                if entry is not None:
                    edits.append((rt.offsets[entry.line], rt.offsets[entry.line + 1], ""))
            elif entry is not None:
                edits.append(entry_edit(rt, entry, yaml_scalar(val, entry.raw)))
            else:
                adds.append(f"{key}: {json.dumps(val)}")
        if adds:
            edits.append(mapping_insert(rt, "env", adds, before_command=True))
        self.warn(f"{self.source}: vLLM {self.version} < 0.18: MoE backend set through env vars")
        return edits


def _plain_word(source: str, key: str, value: str) -> None:
    """Refuse a value that reaches bash through `{key}` unquoted unless it is one plain word.

    str.format pastes defaults into the command text that bash then reads: `x; touch f`, `$(…)`
    or a space would change the command itself. A literal flag value is quoted instead.
    """
    if value and quote_word(value) == value:
        refuse_option_like(f"{source}: defaults.{key} (through {{{key}}})", value)
        return
    raise KnobError(
        f"{source}: value {excerpt(value)} for defaults.{key} would reach bash unquoted through "
        f"{{{key}}} in command, and is not one plain word; allowed: letters, digits and @%+=:,./-",
        hint=f"nothing was written; to pass such a value, write the flag literally (--flag "
        f"--{key.replace('_', '-')}=VALUE), which spark-ops quotes",
    )


def placeholder_of(opt: Option) -> str | None:
    """The defaults key when the option's value is exactly one `{key}` placeholder."""
    if opt.value is None:
        return None
    raw = (opt.value_token or opt.flag).raw
    if opt.inline:
        at = raw.find("=") + 1 or len(opt.spelled)
        raw = raw[at:]
    raw = raw.strip("'\"")
    if raw.startswith("{") and raw.endswith("}") and raw[1:-1].isidentifier():
        return raw[1:-1]
    return None


def _value_edit(opt: Option, text: str) -> Edit:
    """Replace an option's value word (or the part after `=`), or add a missing value."""
    if opt.inline:
        return (opt.flag.start + _inline_at(opt), opt.flag.end, _quote(text))
    if opt.value_token is None:
        return (opt.flag.end, opt.flag.end, " " + _quote(text))
    return (opt.value_token.start, opt.value_token.end, _quote(text))


def _inline_at(opt: Option) -> int:
    """Where an inline value starts in its word as written: after `=`, or after a one-letter
    option it is joined to (`-n2`); UnsupportedRecipe when the word's quoting hides that."""
    if "=" in opt.flag.raw:
        return opt.flag.raw.index("=") + 1
    if opt.flag.raw.startswith(opt.spelled):
        return len(opt.spelled)
    raise UnsupportedRecipe(
        f"{opt.flag.raw!r}: a value joined to its option inside quotes; spark-ops edits "
        f"`{opt.spelled} VALUE` or `{opt.spelled}=VALUE`",
        hint=f"write it as {opt.spelled} {opt.value}",
    )


def _quote(text: str) -> str:
    """Quote a value for the shell when it needs it (and keep str.format braces literal)."""
    escaped = text.replace("{", "{{").replace("}", "}}")
    return escaped if escaped == quote_word(escaped) else quote_word(escaped)


def resolve_version(text: str, source: str, vllm_version: str | None) -> tuple[str, list[str]]:
    """The vLLM version to edit a recipe text for (version_for its container)."""
    data = load_recipe_text(text, source=source)
    return version_for(data.get("container"), source, vllm_version)


def version_for(container: object, source: str, explicit: str | None) -> tuple[str, list[str]]:
    """The vLLM version to edit for: explicit, else the container tag's, else newest (warned)."""
    if explicit:
        return explicit, []
    found = version_from_container(str(container or ""))
    if found:
        return found, []
    return NEWEST_KNOWN, [
        f"{source}: vLLM version unknown (no --vllm-version and container {container!r} "
        f"names none): assuming {NEWEST_KNOWN}"
    ]


def _word_option(word: str) -> str:
    """The option a word of a defaults value names (as vLLM resolves it), else the word."""
    return resolve_flag(word.split("=", 1)[0]) if word.startswith("-") else word


def _refuse_dotted_mix(rt: RecipeText, cmd: CommandView, flag: str) -> None:
    """Refuse to set a JSON option beside its dotted fields, or a field beside the whole JSON:
    vLLM gathers every `--x.field` word into one `--x` given after all the others (the last
    wins), so a whole `--x` never counts beside a field, and a field drops the whole one's
    other keys."""
    base, dot, _ = flag.partition(".")
    clash = [o for o in cmd.options if (o.name == base if dot else o.name.startswith(flag + "."))]
    if not clash:
        return
    where = f"line {rt.line_of(clash[0].flag.start) + 1} `{_written(clash[0])}`"
    why = (
        f"the command gives the whole {base} ({where}): vLLM would put {flag} in a new {base} "
        f"after it, dropping every other key of that one"
        if dot
        else f"the command gives its fields ({where}): vLLM gathers them into a {flag} it "
        "takes after every other word, so this value would not count"
    )
    raise UnsupportedRecipe(
        f"{rt.source}: {flag}: {why}; refusing to edit",
        hint=f"write {base} one way in the command (its whole JSON, or its fields), by hand",
    )


def _occurrences(rt: RecipeText, flag: str, found: list[Option]) -> str:
    """`flag` given several times: each spelling with its line, and the one vLLM takes (last)."""
    where = [f"line {rt.line_of(opt.flag.start) + 1} `{_written(opt)}`" for opt in found]
    last = rt.line_of(found[-1].flag.start) + 1
    return (
        f"{flag} appears {len(found)} times in command ({', '.join(where)}); vLLM takes the "
        f"last (line {last})"
    )


def _written(opt: Option) -> str:
    """An option as the recipe writes it (flag and value words)."""
    if opt.value_token is None:
        return opt.flag.raw
    return f"{opt.flag.raw} {opt.value_token.raw}"
