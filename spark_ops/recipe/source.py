"""Recipe text structure: top-level key blocks, mapping entries and the command's shell tokens."""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from spark_ops.errors import RecipeError, UnsupportedRecipe, excerpt
from spark_ops.recipe.dialect import Dialect, check_sparkrun_shape, detect_dialect
from spark_ops.yamlsafe import load_yaml

MAX_RECIPE_BYTES = 256 << 10  # a recipe is a few kilobytes; 256 KiB is refused at once

_TOP_KEY = re.compile(r"^([A-Za-z_][\w.-]*)[ \t]*:(?=[ \t\r]|$)")
_CHILD = re.compile(r"^([ \t]+)([A-Za-z_][\w.-]*)[ \t]*:[ \t]*")


def split_lines(text: str) -> list[str]:
    """Split on '\\n' only, keeping line ends; the last item may lack one (or be empty)."""
    parts = text.split("\n")
    lines = [part + "\n" for part in parts[:-1]]
    if parts[-1]:
        lines.append(parts[-1])
    return lines


def load_recipe_text(text: str, *, source: str) -> dict[str, Any]:
    """Parse and check a recipe (either dialect): valid YAML, a mapping, the keys' types.

    A text over 256 KiB or with more than a few dozen aliases is refused before it is parsed. One
    edit reads the same text several times (edit, version, verify, render): it is parsed once.
    """
    return dict(_parsed(text, source))


def parse_yaml(text: str, *, source: str) -> dict[str, Any]:
    """Parse a recipe file with the one safe YAML loader: a mapping, else RecipeError naming it."""
    data = load_yaml(
        text,
        source=source,
        error=RecipeError,
        max_bytes=MAX_RECIPE_BYTES,
        same_value_ok=True,
        scalar_last_wins=True,
    )
    if not isinstance(data, dict):
        raise RecipeError(f"{source}: a recipe must be a YAML mapping, got {type(data).__name__}")
    return data


@functools.lru_cache(maxsize=8)
def _parsed(text: str, source: str) -> dict[str, Any]:
    """The checked mapping of a recipe text, parsed once per text (callers copy, never mutate)."""
    data = parse_yaml(text, source=source)
    if detect_dialect(data, source=source) is Dialect.SPARKRUN:
        check_sparkrun_shape(data, source=source)
        return data
    command = data.get("command")
    if not isinstance(command, str) or not command.strip():
        raise RecipeError(
            f"{source}: key 'command' is missing or not a string; it must hold the `vllm serve` "
            "command (a `command: |` block)"
        )
    for key in ("defaults", "env"):
        if data.get(key) is not None and not isinstance(data[key], dict):
            raise RecipeError(f"{source}: key {key!r} must be a mapping, got {excerpt(data[key])}")
    return data


@dataclass
class Entry:
    """One `key: value` line of a mapping, with the value's span in the text."""

    key: str
    line: int
    value_start: int
    value_end: int
    raw: str


@dataclass
class Block:
    """A top-level key and the lines that belong to it."""

    key: str
    line: int
    end: int  # exclusive line index
    entries: list[Entry] = field(default_factory=list)


class RecipeText:
    """Offsets of lines, top-level blocks and mapping entries of one recipe text."""

    def __init__(self, text: str, *, source: str) -> None:
        """Index the text's lines and top-level keys (the last duplicate wins, as in YAML)."""
        self.text = text
        self.source = source
        self.lines = split_lines(text)
        self.offsets: list[int] = []
        pos = 0
        for line in self.lines:
            self.offsets.append(pos)
            pos += len(line)
        self.offsets.append(pos)
        self.blocks: dict[str, Block] = {}
        starts = [i for i, line in enumerate(self.lines) if _TOP_KEY.match(line)]
        for n, start in enumerate(starts):
            end = starts[n + 1] if n + 1 < len(starts) else len(self.lines)
            key = _TOP_KEY.match(self.lines[start]).group(1)  # type: ignore[union-attr]
            self.blocks[key] = Block(key, start, end, self._entries(start, end))

    def line_of(self, offset: int) -> int:
        """Line index holding a text offset."""
        lo, hi = 0, len(self.lines)
        while lo < hi:
            mid = (lo + hi) // 2
            if self.offsets[mid + 1] <= offset:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def _entries(self, start: int, end: int) -> list[Entry]:
        """The direct children of a block mapping (first indentation level)."""
        entries: list[Entry] = []
        indent: str | None = None
        for i in range(start + 1, end):
            line = self.lines[i]
            match = _CHILD.match(line)
            if not match:
                continue
            if indent is None:
                indent = match.group(1)
            if match.group(1) != indent:
                continue
            body = line.rstrip("\r\n")
            vstart = match.end()
            vend = _value_end(body, vstart)
            base = self.offsets[i]
            entries.append(Entry(match.group(2), i, base + vstart, base + vend, body[vstart:vend]))
        return entries

    def entry(self, block: str, key: str) -> Entry | None:
        """The last `key:` line of a top-level mapping block, or None."""
        found = [e for e in self.blocks[block].entries if e.key == key] if block in self else []
        return found[-1] if found else None

    def __contains__(self, key: str) -> bool:
        """Whether a top-level key exists."""
        return key in self.blocks

    def command_range(self) -> tuple[int, int]:
        """Text offsets of the `command: |` block content; UnsupportedRecipe for other styles."""
        block = self.blocks.get("command")
        if block is None:
            raise RecipeError(f"{self.source}: key 'command' is missing")
        head = self.lines[block.line]
        indicator = head.split(":", 1)[1].split("#", 1)[0].strip()
        if indicator in (">", ">-", ">+") and self._plain_fold(block):
            return self.offsets[block.line + 1], self.offsets[block.end]
        if indicator not in ("|", "|-", "|+"):
            raise UnsupportedRecipe(
                f"{self.source}: line {block.line + 1}: 'command' is written as {indicator!r}; "
                "spark-ops edits literal block commands (`command: |`) and folded ones (`>-`) "
                "whose lines are all equally indented, without a `\\`, `#` or blank line inside",
                hint="write the command as `command: |` with `\\` line ends",
            )
        return self.offsets[block.line + 1], self.offsets[block.end]

    def folded(self) -> bool:
        """Whether the command is a folded block (`>-`): its line ends are spaces."""
        block = self.blocks.get("command")
        if block is None:
            return False
        indicator = self.lines[block.line].split(":", 1)[1].split("#", 1)[0].strip()
        return indicator in (">", ">-", ">+")

    def _plain_fold(self, block: Block) -> bool:
        """A folded block whose lines YAML joins with one space each and bash reads as one line:
        equal indentation, no blank line between, no `\\` line end, no `#` line."""
        body = [line.rstrip("\r\n") for line in self.lines[block.line + 1 : block.end]]
        blank = next((n for n, line in enumerate(body) if not line.strip()), len(body))
        if all(not line.strip() or line.startswith("#") for line in body[blank:]):
            body = body[:blank]  # comments after the block, at column 0, are not its content
        if not body:
            return False
        indents = {len(line) - len(line.lstrip(" ")) for line in body}
        return (
            len(indents) == 1
            and all(line.strip() for line in body)
            and not any(line.rstrip().endswith("\\") for line in body)
            and not any(line.strip().startswith("#") for line in body)
            and "\t" not in "".join(body)
        )


def _value_end(body: str, start: int) -> int:
    """End of a plain or quoted scalar starting at `start` (before a ' #' comment)."""
    if start >= len(body):
        return start
    quote = body[start]
    if quote in "'\"":
        i = start + 1
        while i < len(body):
            if quote == '"' and body[i] == "\\":
                i += 2
                continue
            if body[i] == quote:
                if quote == "'" and body[i + 1 : i + 2] == "'":
                    i += 2
                    continue
                return i + 1
            i += 1
        return len(body)
    comment = re.search(r"[ \t]#", body[start:])
    end = start + comment.start() if comment else len(body)
    return len(body[:end].rstrip())


@dataclass
class Token:
    """One shell word of the command: its unquoted value and raw span in the text."""

    value: str
    raw: str
    start: int
    end: int


@dataclass
class Scan:
    """The first shell command of a text: its words, and the offset where it ends."""

    tokens: list[Token]
    end: int
    rest_start: int | None  # offset of a further command, when one follows

    def second_command(self, line_of: Callable[[int], int], where: str = "line") -> str:
        """Why bash runs a second command: the line that ends the first (its line end escaped by
        no `\\`) and the line the next starts at; `line_of`: 1-based line of an offset."""
        assert self.rest_start is not None
        return (
            f"bash ends the command at {where} {line_of(self.end)}, whose line end no `\\` "
            "escapes (a `\\` inside a `#` comment escapes nothing; a blank line has none), and "
            f"{where} {line_of(self.rest_start)} starts a second shell command"
        )


#: What to do about a second command inside `command` (the hint of its refusals).
SECOND_COMMAND_HINT = (
    "end every line of the command but its last with `\\` outside any comment; put comments "
    "after the command's last line"
)


def scan_shell(
    text: str,
    start: int = 0,
    end: int | None = None,
    *,
    loose: bool = False,
    folded: bool = False,
) -> Scan:
    """Split text[start:end] into words as bash would: quotes, `\\` newline, `#` comments.

    `loose`: a `\\` followed by blanks before the line end continues the line too (sparkrun
    repairs those before bash reads the command); `folded`: a line end is a space (`>-`)."""
    stop = len(text) if end is None else end
    tokens: list[Token] = []
    i = start
    cur: list[str] | None = None
    tok_start = 0

    def close(at: int) -> None:
        """Finish the current word."""
        nonlocal cur
        if cur is not None:
            tokens.append(Token("".join(cur), text[tok_start:at], tok_start, at))
            cur = None

    while i < stop:
        ch = text[i]
        blanks = _blank_run(text, i + 1, stop) if loose and ch == "\\" else 0
        if ch == "\\" and text.startswith(("\n", "\r\n"), i + 1 + blanks, stop):
            close(i)
            i += 1 + blanks + (1 if text[i + 1 + blanks] == "\n" else 2)
        elif ch in " \t\r" or (ch == "\n" and folded):
            close(i)
            i += 1
        elif ch == "\n":
            close(i)
            if tokens:
                return Scan(tokens, i, _next_command(text, i + 1, stop))
            i += 1
        elif ch == "#" and cur is None:
            while i < stop and text[i] != "\n":
                i += 1
        else:
            _refuse_operator(text, i, stop)
            if cur is None:
                cur, tok_start = [], i
            if ch == "'":
                close_at = text.find("'", i + 1, stop)
                if close_at < 0:
                    raise RecipeError(f"unterminated single quote at: {text[i : i + 40]!r}")
                cur.append(text[i + 1 : close_at])
                i = close_at + 1
            elif ch == '"':
                i = _double_quoted(text, i + 1, stop, cur)
            elif ch == "\\" and i + 1 < stop:
                cur.append(text[i + 1])
                i += 2
            else:
                cur.append(ch)
                i += 1
    close(stop)
    return Scan(tokens, stop, None)


#: A line that starts `vllm serve` (after `exec`, VAR=value words, or a path to vllm).
_SERVE_LINE = re.compile(
    r"^[ \t]*(?:exec[ \t]+)?(?:[A-Za-z_]\w*=\S*[ \t]+)*(?:\S*/)?vllm[ \t]+serve\b"
)
#: How a line before the serve line must end: a finished command (`;`, `&&`, optional `\\`).
_PRELUDE_END = re.compile(r"(?:;|&&)[ \t]*(?:\\)?[ \t]*$")


def prelude_end(text: str, start: int = 0, end: int | None = None) -> int:
    """Where the one `vllm serve` command of text[start:end] starts, when the lines before it
    are fixed commands that each end in `;` or `&&` (`export A=1;`, `cd /x &&`); else `start`.

    Only a command with exactly one `vllm serve` line qualifies; the lines before it are run
    as written, and the serve command is the one spark-ops reads and edits."""
    stop = len(text) if end is None else end
    lines = split_lines(text[start:stop])
    serving = [n for n, line in enumerate(lines) if _SERVE_LINE.match(line)]
    if len(serving) != 1 or serving[0] == 0:
        return start
    before = [line.rstrip("\r\n") for line in lines[: serving[0]]]
    body = [line for line in before if line.strip() and not line.strip().startswith("#")]
    if not body or "vllm serve" in "".join(before) or not all(_PRELUDE_END.search(b) for b in body):
        return start
    return start + sum(len(line) for line in lines[: serving[0]])


def _blank_run(text: str, i: int, stop: int) -> int:
    """How many spaces and tabs start at text[i]."""
    n = 0
    while i + n < stop and text[i + n] in " \t":
        n += 1
    return n


# Outside quotes, these make bash run something other than one plain command line: a second
# command (; & |), a redirection (< >), a subshell or command substitution (( ) ` $( ). Preflight
# checks the words spark-ops parses; a recipe whose command bash would read differently is refused.
_OPERATORS = ";&|<>()`"


def _refuse_operator(text: str, i: int, stop: int) -> None:
    """RecipeError when text[i] starts an operator or a command substitution bash would run."""
    ch = text[i]
    if ch in _OPERATORS or (ch == "$" and text.startswith("(", i + 1, stop)):
        line = text.count("\n", 0, i) + 1
        shown = "$(" if ch == "$" else ch
        raise UnsupportedRecipe(
            f"command line {line}: unquoted {shown!r} at {text[max(0, i - 20) : i + 20]!r}: "
            "bash would run more than the one command line spark-ops checks",
            hint="quote the value ('a;b'), or remove the operator: spark-ops runs no shell "
            "pipelines, substitutions or chained commands",
        )


def _double_quoted(text: str, i: int, stop: int, out: list[str]) -> int:
    """Consume a double-quoted string body from i; return the offset after the closing quote."""
    while i < stop:
        ch = text[i]
        if ch == '"':
            return i + 1
        if ch == "`" or (ch == "$" and text.startswith("(", i + 1, stop)):
            _refuse_operator(text, i, stop)
        if ch == "\\" and i + 1 < stop and text[i + 1] in '"\\$`\n':
            if text[i + 1] != "\n":
                out.append(text[i + 1])
            i += 2
            continue
        out.append(ch)
        i += 1
    raise RecipeError(f"unterminated double quote in command near {text[i - 40 : i]!r}")


def _next_command(text: str, i: int, stop: int) -> int | None:
    """Offset of the next non-blank, non-comment content after a command ends, if any."""
    while i < stop:
        line_end = text.find("\n", i, stop)
        line_end = stop if line_end < 0 else line_end
        stripped = text[i:line_end].strip()
        if stripped and not stripped.startswith("#"):
            return i + (len(text[i:line_end]) - len(text[i:line_end].lstrip()))
        i = line_end + 1
    return None
