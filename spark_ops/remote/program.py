"""A remote program as data: sh text, typed arguments, one place that quotes, a parser, a deadline.

Every sh program spark-ops runs on a node is a `RemoteProgram` (the programs themselves live in
remote/shell.py and remote/programs/). Its arguments reach the program as the positional parameters
($1, $2 …) of `sh -c TEXT sh ARGS…`, never spliced into its text, each quoted here and nowhere
else: a PATH argument's leading `~/` becomes "$HOME"/ on the node, anything else is one literal
word. An argument the node cannot receive intact (not UTF-8, a NUL, the wrong type) is refused
before anything runs, naming the program and the argument.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Generic, TypeVar

from spark_ops.errors import InputError, excerpt
from spark_ops.remote.quoting import quote_path, quote_word
from spark_ops.remote.transport import Result

T = TypeVar("T")


def check_text(what: str, value: str, *, max_bytes: int | None) -> str:
    """Refuse text that cannot reach a node intact: not UTF-8-encodable, a NUL, or too large.

    The error names `what` and shows only an excerpt of the value, never the value whole.
    """
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError as exc:
        bad = value[exc.start]
        byte = f"byte 0x{ord(bad) - 0xDC00:02x}" if "\udc80" <= bad <= "\udcff" else repr(bad)
        raise InputError(
            f"{what}: not UTF-8 text ({byte} at character {exc.start}) in "
            f"{excerpt(value)}; nothing was sent or written",
            hint="give the value as UTF-8 text",
        ) from None
    if "\x00" in value:
        raise InputError(
            f"{what}: holds a NUL character (at {value.index(chr(0))}) in {excerpt(value)}; "
            "nothing was sent or written"
        )
    if max_bytes is not None and size > max_bytes:
        raise InputError(
            f"{what}: {size:,} bytes, more than the {max_bytes:,} allowed; nothing was written"
        )
    return value


class Kind(Enum):
    """What an argument is, which says how it is checked and quoted."""

    TEXT = "text"  # any UTF-8 text without NUL, passed literally (newlines, quotes, `$(…)` too)
    PATH = "path"  # a remote path: as TEXT, but a leading `~` or `~/` is the node's $HOME
    INT = "int"  # an int (never a bool), passed as its decimal digits


@dataclass(frozen=True)
class Param:
    """One argument of a program: its name (for errors), its kind, whether it may be left out."""

    name: str
    kind: Kind = Kind.TEXT
    optional: bool = False  # only trailing parameters may be optional
    many: bool = False  # the last parameter only: any number of arguments, none included


def text(name: str, *, optional: bool = False, many: bool = False) -> Param:
    """A TEXT parameter (`many`: the last one, taking any number of arguments)."""
    return Param(name, Kind.TEXT, optional, many)


def path(name: str, *, optional: bool = False, many: bool = False) -> Param:
    """A PATH parameter (a leading `~/` is the node's home; `many`: the last, any number)."""
    return Param(name, Kind.PATH, optional, many)


def integer(name: str) -> Param:
    """An INT parameter."""
    return Param(name, Kind.INT)


def result(res: Result) -> Result:
    """The parser that gives the caller the Result itself (exit code, stdout, stderr)."""
    return res


def checked(res: Result) -> Result:
    """The parser that raises CommandError unless the program exited 0."""
    return res.check()


def stdout_if_ok(res: Result) -> str | None:
    """The parser that gives stdout when the program exited 0, else None."""
    return res.stdout if res.ok else None


def succeeded(res: Result) -> bool:
    """The parser that answers whether the program exited 0."""
    return res.ok


@dataclass(frozen=True)
class RemoteProgram(Generic[T]):
    """One sh program run on a node: its text (a constant), its typed parameters, the parser of
    what it printed, its deadline (None: the inventory's command_timeout)."""

    name: str
    text: str
    params: tuple[Param, ...]
    parse: Callable[[Result], T]
    deadline: float | None = None

    def __post_init__(self) -> None:
        """Refuse an optional parameter before a required one, or `many` but on the last one."""
        seen_optional = False
        for n, p in enumerate(self.params):
            if seen_optional and not p.optional:
                raise ValueError(f"{self.name}: required parameter {p.name} after an optional one")
            if p.many and n != len(self.params) - 1:
                raise ValueError(f"{self.name}: parameter {p.name} takes many but is not last")
            seen_optional = seen_optional or p.optional

    def _pairs(self, args: tuple[str | int, ...]) -> list[tuple[Param, str | int]]:
        """Each argument beside its parameter; a wrong number of arguments is refused."""
        need = sum(1 for p in self.params if not p.optional and not p.many)
        many = bool(self.params) and self.params[-1].many
        if len(args) < need or (len(args) > len(self.params) and not many):
            most = "…" if many else str(len(self.params))
            raise TypeError(f"{self.name} takes {need}..{most} arguments, got {len(args)}")
        params = list(self.params)
        if len(args) > len(params):  # the rest of a parameter taking many
            params += [params[-1]] * (len(args) - len(params))
        return list(zip(params, args, strict=False))

    def words(self, *args: str | int) -> list[str]:
        """Each argument checked against its parameter and quoted: one shell word each."""
        return [_quote(self.name, p, a) for p, a in self._pairs(args)]

    def line(self, *args: str | int) -> str:
        """The command line: `sh -c TEXT sh ARGS…`, every argument checked and quoted."""
        return f"sh -c {quote_word(self.text)} sh " + " ".join(self.words(*args))

    def argv(self, *args: str | int) -> list[str]:
        """`sh -c TEXT sh ARGS…` as an argument list, every argument checked (not yet quoted:
        for wrapping in `env …` or `docker exec …`, then quote_args). A PATH's `~` stays as is."""
        out = ["sh", "-c", self.text, "sh"]
        for p, a in self._pairs(args):
            _quote(self.name, p, a)
            out.append(str(a))
        return out


def _quote(program: str, param: Param, value: str | int) -> str:
    """Check one argument against its parameter and quote it (the one place that does)."""
    what = f"{program}: argument {param.name}"
    if param.kind is Kind.INT:
        if isinstance(value, bool) or not isinstance(value, int):
            raise InputError(f"{what}: {value!r} is not an integer")
        return str(value)
    if not isinstance(value, str):
        raise InputError(f"{what}: {value!r} is not text")
    check_text(what, value, max_bytes=None)
    if param.kind is Kind.PATH:
        return quote_path(value)
    return quote_word(value)


def sh_program(program: str, *args: str) -> str:
    """`sh -c PROGRAM sh ARGS…` for untyped arguments, each a PATH (`~/` expands on the node).

    For tests and one-off probes; the package's own programs are RemoteProgram constants.
    """
    params = tuple(path(f"${i + 1}") for i in range(len(args)))
    return RemoteProgram("sh program", program, params, result).line(*args)
