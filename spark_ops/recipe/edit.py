"""Minimal-diff recipe edits: change only the lines a knob, setting or flag lives on."""

from __future__ import annotations

import json
import string
from collections.abc import Sequence
from dataclasses import dataclass, field

from spark_ops.errors import RecipeError, SparkOpsError, UnsupportedRecipe
from spark_ops.recipe.changes import Change
from spark_ops.recipe.diff import unified_diff
from spark_ops.recipe.knobs import (
    KNOBS,
    LEGACY_MOE_SETTINGS,
    NEWEST_KNOWN,
    has_moe_flag,
    legacy_env_warnings,
    validate_moe_backend,
    version_from_container,
)
from spark_ops.recipe.render import Option, parse_options, render_recipe, serve_index
from spark_ops.recipe.source import Entry, RecipeText, load_recipe_text, scan_shell


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


Edit = tuple[int, int, str]


def _apply(text: str, edits: list[Edit]) -> str:
    """Apply (start, end, replacement) edits; same-start insertions keep their order."""
    ordered = sorted(enumerate(edits), key=lambda item: (item[1][0], item[0]), reverse=True)
    last_start = len(text) + 1
    for _, (start, end, repl) in ordered:
        if end > last_start:
            raise RecipeError(f"internal: overlapping edits at offset {start}")
        text = text[:start] + repl + text[end:]
        last_start = start
    return text


class _Command:
    """The command block of a recipe text: its words and options, refused if not vllm serve."""

    def __init__(self, rt: RecipeText) -> None:
        """Scan the command block and its options."""
        self.rt = rt
        start, end = rt.command_range()
        self.scan = scan_shell(rt.text, start, end)
        src = rt.source
        if self.scan.rest_start is not None:
            line = rt.line_of(self.scan.rest_start) + 1
            raise UnsupportedRecipe(
                f"{src}: line {line}: a second shell command starts inside 'command' (bash ends "
                "the first at a blank or `#` line inside a continuation); refusing to edit",
                hint="remove the blank/comment line, or move comments after the last line",
            )
        self.tokens = self.scan.tokens
        first = serve_index([t.value for t in self.tokens])
        if first is None:
            words = " ".join(t.value for t in self.tokens[:2])
            raise UnsupportedRecipe(
                f"{src}: command is not `vllm serve` (it runs {words!r}); spark-ops will not guess "
                "where its flags go",
                hint="edit this recipe by hand, or make its command a literal `vllm serve ...`",
            )
        self.options = parse_options(self.tokens, first)

    def find(self, names: Sequence[str]) -> list[Option]:
        """Options whose canonical name is one of `names`."""
        return [opt for opt in self.options if opt.name in names]

    def placeholder_uses(self, key: str) -> int:
        """How many `{key}` fields the active command words use."""
        count = 0
        for tok in self.tokens:
            for _, fname, _, _ in string.Formatter().parse(
                tok.raw.replace("{{", "").replace("}}", "")
            ):
                if fname == key:
                    count += 1
        return count

    def insert_line(self, body: str) -> list[Edit]:
        """Edits adding `body` as a continuation line before the last line (or after the first)."""
        rt = self.rt
        first_line = rt.line_of(self.tokens[0].start)
        last_line = rt.line_of(self.tokens[-1].end - 1)
        owner = {opt.value_token.start: opt.flag for opt in self.options if opt.value_token}
        while last_line > first_line:
            head = next(t for t in self.tokens if rt.line_of(t.end - 1) >= last_line)
            if head.start not in owner:
                break
            last_line = rt.line_of(owner[head.start].start)
        if last_line > first_line:
            line = rt.lines[last_line]
            indent = line[: len(line) - len(line.lstrip(" \t"))]
            eol = "\r\n" if line.endswith("\r\n") else "\n"
            return [(rt.offsets[last_line], rt.offsets[last_line], f"{indent}{body} \\{eol}")]
        line = rt.lines[first_line]
        content_end = rt.offsets[first_line] + len(line.rstrip("\r\n"))
        if self.tokens[-1].end != len(rt.text[:content_end].rstrip(" \t")):
            raise UnsupportedRecipe(
                f"{rt.source}: line {first_line + 1}: the one-line command ends in a comment; "
                "cannot add a continuation line safely"
            )
        indent = line[: len(line) - len(line.lstrip(" \t"))] + "    "
        newline = "" if line.endswith("\n") else "\n"
        tail = "\n" if line.endswith("\n") else ""
        return [
            (self.tokens[-1].end, content_end, f" \\{newline}"),
            (
                content_end + len(line) - len(line.rstrip("\r\n")),
                content_end + len(line) - len(line.rstrip("\r\n")),
                f"{indent}{body}{tail}",
            ),
        ]

    def remove(self, opt: Option) -> list[Edit]:
        """Edits removing an option (and its value): the whole line when it stands alone."""
        rt = self.rt
        last = opt.value_token or opt.flag
        start, end = opt.flag.start, last.end
        line_no = rt.line_of(start)
        line = rt.lines[line_no]
        body = line.rstrip("\r\n").rstrip(" \t")
        continued = body.endswith("\\")
        if continued:
            body = body[:-1].rstrip(" \t")
        if body.strip() == rt.text[start:end] and rt.line_of(end - 1) == line_no:
            edits: list[Edit] = [(rt.offsets[line_no], rt.offsets[line_no + 1], "")]
            if not continued:
                prev = [t for t in self.tokens if t.end <= start]
                if prev:
                    pline = rt.line_of(prev[-1].end - 1)
                    ptext = rt.lines[pline].rstrip("\r\n")
                    cut = len(ptext.rstrip(" \t")) - 1
                    if ptext.rstrip(" \t").endswith("\\"):
                        keep = len(ptext[:cut].rstrip(" \t"))
                        base = rt.offsets[pline]
                        edits.append((base + keep, base + len(ptext), ""))
            return edits
        idx = self.tokens.index(last)
        nxt = self.tokens[idx + 1] if idx + 1 < len(self.tokens) else None
        if nxt is not None and rt.line_of(nxt.start) == line_no:
            return [(start, nxt.start, "")]
        pos = self.tokens.index(opt.flag)
        prev_tok = self.tokens[pos - 1]
        cut_from = prev_tok.end if rt.line_of(prev_tok.end - 1) == line_no else start
        return [(cut_from, end, "")]


def _yaml_scalar(value: str, old_raw: str | None) -> str:
    """Spell a string value as a YAML scalar that reads back as exactly `value`."""
    import yaml

    if old_raw and old_raw[0] == "'":
        return "'" + value.replace("'", "''") + "'"
    if old_raw and old_raw[0] == '"':
        return json.dumps(value, ensure_ascii=False)
    try:
        loaded = yaml.safe_load(f"k: {value}")
    except yaml.YAMLError:
        loaded = None
    ok = isinstance(loaded, dict) and not isinstance(loaded.get("k"), bool)
    if ok and loaded is not None and str(loaded.get("k")) == value and "#" not in value:
        return value
    return json.dumps(value, ensure_ascii=False)


class _Editor:
    """Applies changes one at a time to the current text, collecting warnings."""

    def __init__(self, text: str, source: str, version: str) -> None:
        """Start from the original text."""
        self.text = text
        self.source = source
        self.version = version
        self.warnings: list[str] = []

    def warn(self, message: str) -> None:
        """Record a warning once."""
        if message not in self.warnings:
            self.warnings.append(message)

    def apply(self, change: Change) -> None:
        """Apply one change to the current text."""
        rt = RecipeText(self.text, source=self.source)
        if change.kind == "setting":
            edits = self._setting(rt, change)
        elif change.kind == "flag":
            edits = self._flag(rt, change.name, change.value, change.remove, set())
        elif change.name == "moe_backend" and not has_moe_flag(self.version):
            edits = self._legacy_moe(rt, str(change.value))
        else:
            edits = self._knob(rt, change)
        self.text = _apply(self.text, edits)

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
        cmd = _Command(rt)
        names = aliases | {flag}
        found = cmd.find(sorted(names))
        negated = cmd.find(["--no-" + flag[2:]]) if value is None else []
        if remove:
            edits: list[Edit] = []
            for opt in found:
                edits += cmd.remove(opt)
            return edits
        if len(found) > 1:
            self.warn(
                f"{self.source}: {flag} appears {len(found)} times in command; vLLM takes the "
                "last: all were set"
            )
        if value is None:
            edits = [(opt.flag.start, opt.flag.end, flag) for opt in negated]
            if negated:
                self.warn(f"{self.source}: replaced --no-{flag[2:]} with {flag}")
            if not found and not negated:
                edits += cmd.insert_line(flag)
            return edits
        text = str(value)
        if not found:
            return cmd.insert_line(f"{flag} {text}")
        return self._set_values(rt, cmd, found, flag, text)

    def _set_values(
        self, rt: RecipeText, cmd: _Command, found: list[Option], flag: str, text: str
    ) -> list[Edit]:
        """Set each occurrence: its defaults placeholder when unshared, else the literal."""
        edits: list[Edit] = []
        keys: dict[str, int] = {}
        for opt in found:
            key = _placeholder(opt)
            if key is not None:
                keys[key] = keys.get(key, 0) + 1
        edited_defaults: set[str] = set()
        for opt in found:
            if _dashed(opt.spelled) != flag:
                self.warn(f"{self.source}: {opt.spelled} written as its full name {flag}")
                edits.append((opt.flag.start, opt.flag.start + len(opt.spelled), flag))
            key = _placeholder(opt)
            entry = rt.entry("defaults", key) if key else None
            if key and entry is None:
                raise RecipeError(
                    f"{self.source}: {flag} uses placeholder {{{key}}} but 'defaults' has no "
                    f"key {key!r}"
                )
            if key and entry and cmd.placeholder_uses(key) == keys[key]:
                if key not in edited_defaults:
                    edits.append(_entry_edit(rt, entry, _yaml_scalar(text, entry.raw)))
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
        if entry is not None:
            if _Command(rt).placeholder_uses(key) == 0:
                self.warn(f"{self.source}: defaults.{key} is not used by command")
            return [_entry_edit(rt, entry, _yaml_scalar(value, entry.raw))]
        flag = "--" + key.replace("_", "-")
        if not _Command(rt).find([flag]):
            self.warn(f"{self.source}: no defaults.{key} and no {flag} in command: added {flag}")
        return self._flag(rt, flag, value, False, set())

    def _legacy_moe(self, rt: RecipeText, backend: str) -> list[Edit]:
        """Before vLLM 0.18: select the MoE backend through the recipe's env mapping."""
        validate_moe_backend(backend, self.version)
        edits: list[Edit] = []
        cmd = _Command(rt)
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
                edits.append(_entry_edit(rt, entry, _yaml_scalar(val, entry.raw)))
            else:
                adds.append(f"{key}: {json.dumps(val)}")
        if adds:
            edits.append(_env_insert(rt, adds))
        self.warn(f"{self.source}: vLLM {self.version} < 0.18: MoE backend set through env vars")
        return edits


def _entry_edit(rt: RecipeText, entry: Entry, scalar: str) -> Edit:
    """Replace a mapping value, keeping a trailing comment in its column when there is room."""
    if not entry.raw or entry.raw[0] in "|>[{&*!":
        raise UnsupportedRecipe(
            f"{rt.source}: line {entry.line + 1}: {entry.key!r} is not a one-line scalar "
            f"({entry.raw or 'value on the next lines'!r}); spark-ops edits only `key: value`"
        )
    line_end = rt.offsets[entry.line] + len(rt.lines[entry.line].rstrip("\r\n"))
    rest = rt.text[entry.value_end : line_end]
    gap = len(rest) - len(rest.lstrip(" "))
    if gap and rest[gap:].startswith("#"):
        width = max(1, gap - (len(scalar) - len(entry.raw)))
        return (entry.value_start, entry.value_end + gap, scalar + " " * width)
    return (entry.value_start, entry.value_end, scalar)


def _placeholder(opt: Option) -> str | None:
    """The defaults key when the option's value is exactly one `{key}` placeholder."""
    raw = opt.flag.raw.split("=", 1)[1] if opt.inline else (opt.value_token or opt.flag).raw
    if opt.value is None:
        return None
    raw = raw.strip("'\"")
    if raw.startswith("{") and raw.endswith("}") and raw[1:-1].isidentifier():
        return raw[1:-1]
    return None


def _value_edit(opt: Option, text: str) -> Edit:
    """Replace an option's value word (or the part after `=`), or add a missing value."""
    if opt.inline:
        at = opt.flag.start + opt.flag.raw.index("=") + 1
        return (at, opt.flag.end, _quote(text))
    if opt.value_token is None:
        return (opt.flag.end, opt.flag.end, " " + _quote(text))
    return (opt.value_token.start, opt.value_token.end, _quote(text))


def _quote(text: str) -> str:
    """Quote a value for the shell when it needs it (and keep str.format braces literal)."""
    import shlex

    escaped = text.replace("{", "{{").replace("}", "}}")
    return escaped if escaped == shlex.quote(escaped) else shlex.quote(escaped)


def _env_insert(rt: RecipeText, adds: list[str]) -> Edit:
    """An edit adding `KEY: "value"` lines to the env mapping (creating it if needed)."""
    block = rt.blocks.get("env")
    if block is not None and block.entries:
        last = block.entries[-1]
        indent = rt.lines[last.line][: len(rt.lines[last.line]) - len(rt.lines[last.line].lstrip())]
        at = rt.offsets[last.line + 1]
        prefix = "" if rt.lines[last.line].endswith("\n") else "\n"
        return (at, at, prefix + "".join(f"{indent}{a}\n" for a in adds))
    body = "".join(f"  {a}\n" for a in adds)
    if block is not None:
        head = rt.lines[block.line]
        eol_at = rt.offsets[block.line] + len(head.rstrip("\r\n"))
        return (
            rt.offsets[block.line],
            rt.offsets[block.line + 1] if head.endswith("\n") else eol_at,
            "env:\n" + body,
        )
    at = rt.offsets[rt.blocks["command"].line]
    return (at, at, "env:\n" + body + "\n")


def resolve_version(text: str, source: str, vllm_version: str | None) -> tuple[str, list[str]]:
    """The vLLM version to edit for: explicit, else the container tag's, else newest (warned)."""
    if vllm_version:
        return vllm_version, []
    data = load_recipe_text(text, source=source)
    found = version_from_container(str(data.get("container") or ""))
    if found:
        return found, []
    return NEWEST_KNOWN, [
        f"{source}: vLLM version unknown (no --vllm-version and container "
        f"{data.get('container')!r} names none): assuming {NEWEST_KNOWN}"
    ]


def edit_recipe(
    text: str, changes: Sequence[Change], *, source: str, vllm_version: str | None = None
) -> RecipeEdit:
    """Apply changes with a minimal diff; verify the result parses and renders to the request."""
    load_recipe_text(text, source=source)
    version, version_warnings = resolve_version(text, source, vllm_version)
    editor = _Editor(text, source, version)
    if any(c.kind == "knob" and c.name == "moe_backend" for c in changes):
        editor.warnings += version_warnings
    for change in changes:
        editor.apply(change)
    _verify(text, editor.text, changes, source, version)
    return RecipeEdit(editor.text, text, editor.warnings, version)


def _verify(old: str, new: str, changes: Sequence[Change], source: str, version: str) -> None:
    """Check the new text keeps every other key and renders with each requested value."""
    before = load_recipe_text(old, source=source)
    after = load_recipe_text(new, source=source)
    for key in set(before) | set(after):
        if key not in ("defaults", "env", "command") and before.get(key) != after.get(key):
            raise RecipeError(f"{source}: internal: edit changed key {key!r}; nothing written")
    try:
        render_recipe(old, source=source).args()
    except SparkOpsError:
        return
    old_rendered = render_recipe(old, source=source)
    rendered = render_recipe(new, source=source)
    args = rendered.args()
    _check_others(old_rendered.args(), args, old_rendered.env, rendered.env, changes, source)
    for change in changes:
        if not _took_effect(change, args, rendered.env, after.get("defaults") or {}, version):
            raise RecipeError(
                f"{source}: internal: {change.describe()} did not take effect in the rendered "
                "command; nothing written"
            )


def _check_others(
    old_args: dict[str, object],
    args: dict[str, object],
    old_env: dict[str, str],
    env: dict[str, str],
    changes: Sequence[Change],
    source: str,
) -> None:
    """Check that flags and env vars no change asked for kept their effective values."""
    if any(c.kind == "setting" for c in changes):
        return  # a defaults key may feed any number of flags
    allowed = {KNOBS[c.name].flag if c.kind == "knob" else c.name for c in changes}
    allowed |= {"--" + name[5:] for name in allowed if name.startswith("--no-")}
    for key in set(old_args) | set(args):
        if key not in allowed and old_args.get(key) != args.get(key):
            raise RecipeError(f"{source}: internal: edit changed {key} too; nothing written")
    legacy = set(LEGACY_MOE_SETTINGS["auto"]) if "--moe-backend" in allowed else set()
    for key in set(old_env) | set(env):
        if key not in legacy and old_env.get(key) != env.get(key):
            raise RecipeError(f"{source}: internal: edit changed env {key}; nothing written")


def _took_effect(
    change: Change, args: dict[str, object], env: dict[str, str], defaults: dict, version: str
) -> bool:
    """Whether the rendered result shows a change."""
    if change.kind == "setting":
        if change.name in defaults:
            return str(defaults[change.name]) == str(change.value) or _same_number(
                defaults[change.name], str(change.value)
            )
        return args.get("--" + change.name.replace("_", "-")) == change.value
    if change.kind == "flag":
        if change.remove and change.name.startswith("--no-"):
            return args.get("--" + change.name[5:]) is not False
        if change.remove:
            return args.get(change.name) in (None, False)
        return args.get(change.name) == (True if change.value is None else str(change.value))
    spec = KNOBS[change.name]
    if spec.boolean:
        return (args.get(spec.flag) is True) == bool(change.value)
    if change.name == "moe_backend" and not has_moe_flag(version):
        wanted = LEGACY_MOE_SETTINGS[str(change.value)]
        return all(env.get(k) == v for k, v in wanted.items() if v is not None)
    return args.get(spec.flag) == str(change.value)


def _same_number(value: object, text: str) -> bool:
    """Whether a YAML-loaded number equals the requested text numerically (0.90 vs 0.9)."""
    try:
        return float(str(value)) == float(text)
    except ValueError:
        return False


def _dashed(flag: str) -> str:
    """A long flag with underscores written as dashes (vLLM accepts both)."""
    return "--" + flag[2:].replace("_", "-") if flag.startswith("--") else flag
