"""Text-level editing primitives: offset edits, the command block view, YAML scalar edits."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence

from spark_ops.errors import RecipeError, UnsupportedRecipe
from spark_ops.recipe.flags import resolve_flag
from spark_ops.recipe.render import Option, parse_options, serve_index
from spark_ops.recipe.source import (
    SECOND_COMMAND_HINT,
    Entry,
    RecipeText,
    prelude_end,
    scan_shell,
)
from spark_ops.yamlsafe import load_yaml

Edit = tuple[int, int, str]


#: A line feed that is not part of a CRLF.
_LONE_LF = re.compile(r"(?<!\r)\n")


def apply_edits(text: str, edits: list[Edit]) -> str:
    """Apply (start, end, replacement) edits; same-start insertions keep their order. In a file
    whose lines all end in CRLF, the inserted lines end in CRLF too."""
    ordered = sorted(enumerate(edits), key=lambda item: (item[1][0], item[0]), reverse=True)
    last_start = len(text) + 1
    crlf = "\r\n" in text and _LONE_LF.search(text) is None
    for _, (start, end, repl) in ordered:
        if end > last_start:
            raise RecipeError(f"internal: overlapping edits at offset {start}")
        if crlf:
            repl = _LONE_LF.sub("\r\n", repl)
            if repl.startswith("\r\n") and text[:start].endswith("\r"):
                repl = repl[1:]
        text = text[:start] + repl + text[end:]
        last_start = start
    return text


class CommandView:
    """The command block of a recipe text: its words and options, refused if not vllm serve."""

    def __init__(self, rt: RecipeText, *, loose: bool = False) -> None:
        """Scan the command block and its options (`loose`: sparkrun's `\\ ` line ends)."""
        self.rt = rt
        start, end = rt.command_range()
        start = prelude_end(rt.text, start, end)
        self.folded = rt.folded()
        self.scan = scan_shell(rt.text, start, end, loose=loose, folded=self.folded)
        src = rt.source
        if self.scan.rest_start is not None:
            why = self.scan.second_command(lambda at: rt.line_of(at) + 1)
            raise UnsupportedRecipe(
                f"{src}: 'command': {why}; refusing to edit", hint=SECOND_COMMAND_HINT
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
        try:
            self.options = parse_options(self.tokens, first)
        except RecipeError as exc:
            bad = [rt.line_of(t.start) + 1 for t in self.tokens if _ambiguous(t.value)]
            where = f"line {bad[0]}: " if bad else ""
            raise type(exc)(f"{src}: {where}{exc.message}", hint=exc.hint) from None

    def find(self, names: Sequence[str]) -> list[Option]:
        """Options whose canonical name is one of `names`."""
        return [opt for opt in self.options if opt.name in names]

    def placeholder_uses(self, key: str) -> int:
        """How many `{key}` fields the active command words use."""
        field = re.compile(r"(?<!\{)\{" + re.escape(key) + r"\}(?!\})")
        return sum(len(field.findall(tok.raw)) for tok in self.tokens)

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
            cont = "" if self.folded else " \\"
            return [(rt.offsets[last_line], rt.offsets[last_line], f"{indent}{body}{cont}{eol}")]
        line = rt.lines[first_line]
        content_end = rt.offsets[first_line] + len(line.rstrip("\r\n"))
        if self.tokens[-1].end != len(rt.text[:content_end].rstrip(" \t")):
            raise UnsupportedRecipe(
                f"{rt.source}: line {first_line + 1}: the one-line command ends in a comment; "
                "cannot add a continuation line safely"
            )
        if self.folded:
            raise UnsupportedRecipe(
                f"{rt.source}: line {first_line + 1}: a one-line folded command (`>-`); "
                "spark-ops adds flags to commands of several lines",
                hint="write the command as `command: |` with `\\` line ends",
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


def _ambiguous(word: str) -> bool:
    """Whether vLLM's parser refuses an option word as an ambiguous abbreviation."""
    try:
        resolve_flag(word.split("=", 1)[0])
    except RecipeError:
        return True
    return False


def yaml_scalar(value: str, old_raw: str | None) -> str:
    """Spell a string value as a YAML scalar that reads back as exactly `value`."""
    if old_raw and old_raw[0] == "'":
        return "'" + value.replace("'", "''") + "'"
    if old_raw and old_raw[0] == '"':
        return json.dumps(value, ensure_ascii=False)
    try:
        loaded = load_yaml(f"k: {value}", source="the new value", error=RecipeError)
    except RecipeError:
        loaded = None
    ok = isinstance(loaded, dict) and not isinstance(loaded.get("k"), bool)
    if ok and loaded is not None and str(loaded.get("k")) == value and "#" not in value:
        return value
    return json.dumps(value, ensure_ascii=False)


def entry_edit(rt: RecipeText, entry: Entry, scalar: str) -> Edit:
    """Replace only a mapping value's bytes (spacing and a trailing comment stay as they are)."""
    if not entry.raw or entry.raw[0] in "|>[{&*!":
        raise UnsupportedRecipe(
            f"{rt.source}: line {entry.line + 1}: {entry.key!r} is not a one-line scalar "
            f"({entry.raw or 'value on the next lines'!r}); spark-ops edits only `key: value`"
        )
    return (entry.value_start, entry.value_end, scalar)


def mapping_insert(rt: RecipeText, key: str, adds: list[str], *, before_command: bool) -> Edit:
    """An edit adding `adds` lines to the top-level mapping `key`, after its last entry and with
    its indentation; a missing mapping is created before `command:` (`before_command`), else at
    the end of the file."""
    block = rt.blocks.get(key)
    if block is not None and block.entries:
        last = rt.lines[block.entries[-1].line]
        indent = last[: len(last) - len(last.lstrip())]
        at = rt.offsets[block.entries[-1].line + 1]
        prefix = "" if last.endswith("\n") else "\n"
        return (at, at, prefix + "".join(f"{indent}{a}\n" for a in adds))
    body = f"{key}:\n" + "".join(f"  {a}\n" for a in adds)
    if block is not None:
        head = rt.lines[block.line]
        end = rt.offsets[block.line + 1] if head.endswith("\n") else len(rt.text)
        return (rt.offsets[block.line], end, body)
    if before_command:
        at = rt.offsets[rt.blocks["command"].line]
        return (at, at, body + "\n")
    prefix = "" if not rt.text or rt.text.endswith("\n") else "\n"
    return (len(rt.text), len(rt.text), f"{prefix}\n{body}")
