"""The one YAML loader for files an operator (or a colleague) hands spark-ops.

PyYAML's safe loader shares an aliased node, but anything that walks the result (validation,
`repr` in an error) expands it: nine levels of `[*a, *a, …]` are gigabytes. Here an alias count
past a small limit, or a text past a size limit, is refused at once, naming the file and line.

A key written twice in one mapping (a node named twice: PyYAML keeps the last, silently) is
refused too, naming the file, both lines and the key. A merge (`<<: *defaults`) is not a
duplicate: the keys written beside it override the merged ones, as YAML says. Recipes pass
`same_value_ok`: a community recipe repeats `container: vllm-node` word for word, which loses
nothing. They also pass `scalar_last_wins`: public recipes repeat an `env` variable or `container`
with another value (5 of the 317 of tests/fixtures/recipes/wild), and their launchers (sparkrun,
run-recipe.py: PyYAML's safe_load) use the last one, so a recipe is read as they read it; a
repeated mapping or list (`defaults:` twice) is still refused, as is every repeat elsewhere.
"""

from __future__ import annotations

import errno
import os
import re
import select
import stat
import time
from typing import Any

from spark_ops.errors import SparkOpsError, excerpt

MAX_ALIASES = 64  # real inventories and recipes use a handful (`<<: *defaults`)
MAX_YAML_BYTES = 1 << 20  # 1 MiB: a recipe or an inventory is a few kilobytes
MAX_DEPTH = 128  # nested collections: real files nest a handful; libyaml's composer recurses in C
# the collections and scalars a value holds once every alias is written out: a 1 MiB file holds
# fewer than this; past it a few aliases of aliases (`[*a, *a]` 32 deep) build a value whose walk
# (validation, an error's excerpt, json.dumps) never ends
MAX_EXPANDED_NODES = 1 << 18
PIPE_WAIT_S = 10.0  # a pipe (`--inventory <(sops -d …)`) is written at once, or never


def read_capped(
    path: os.PathLike[str] | str, *, error: type[SparkOpsError], max_bytes: int = MAX_YAML_BYTES
) -> bytes:
    """A file an operator names, read whole but never past `max_bytes` (/dev/zero, a FIFO that
    never ends): `error` naming it beyond, before any is parsed; OSError as reading raises it.

    Opened without blocking: open() of a FIFO no program writes to waits for a writer for ever
    (and a terminal's read for a line); what is not a regular file is read under PIPE_WAIT_S."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        size = st.st_size
        if stat.S_ISDIR(st.st_mode):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
        if stat.S_ISREG(st.st_mode) and size > max_bytes:
            raise error(
                f"{path}: {size:,} bytes, more than the {max_bytes:,} spark-ops reads; refused "
                "before parsing",
                hint="check that the path names the right file",
            )
        if stat.S_ISREG(st.st_mode):
            with open(fd, "rb", closefd=False) as f:
                raw = f.read(max_bytes + 1)
        else:
            raw = _read_stream(fd, path, error, max_bytes + 1)
    finally:
        os.close(fd)
    if len(raw) > max_bytes:
        raise error(
            f"{path}: more than the {max_bytes:,} bytes spark-ops reads (not a regular file, "
            "or one growing); refused before parsing",
            hint="check that the path names the right file",
        )
    return raw


def _read_stream(
    fd: int, path: os.PathLike[str] | str, error: type[SparkOpsError], limit: int
) -> bytes:
    """Up to `limit` bytes of a FIFO, pipe or device opened non-blocking, to its end; `error`
    naming it when nothing writes to it, or it does not end within PIPE_WAIT_S."""
    chunks: list[bytes] = []
    got = 0
    deadline = time.monotonic() + PIPE_WAIT_S
    while got < limit:
        try:
            chunk = os.read(fd, min(1 << 16, limit - got))
        except BlockingIOError:  # nothing yet: wait for it, never past the deadline
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise error(
                    f"{path}: not a regular file, and it did not end within {PIPE_WAIT_S:g} s; "
                    "refused before parsing",
                    hint="name the file itself, not a pipe, a terminal or a device",
                ) from None
            continue
        if not chunk:
            break
        chunks.append(chunk)
        got += len(chunk)
    if not got and stat.S_ISFIFO(os.fstat(fd).st_mode):
        raise error(
            f"{path}: a named pipe (FIFO) with nothing written to it (no program writes to it); "
            "refused before parsing",
            hint="name the file itself, not a pipe",
        )
    return b"".join(chunks)


def read_text_capped(path: os.PathLike[str] | str, *, error: type[SparkOpsError], what: str) -> str:
    """An operator's file (`what`: "inventory", "the fleet file") as UTF-8 text, read capped
    (read_capped); `error` naming the file when it cannot be read, is too large or is not UTF-8."""
    try:
        raw = read_capped(path, error=error)
    except OSError as exc:
        raise error(f"{path}: cannot read {what}: {exc.strerror or exc}") from exc
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(
            f"{path}: not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start})",
            hint=f"re-save {what} as UTF-8",
        ) from None


def load_yaml(
    text: str,
    *,
    source: str,
    error: type[SparkOpsError],
    max_aliases: int = MAX_ALIASES,
    max_bytes: int = MAX_YAML_BYTES,
    same_value_ok: bool = False,
    scalar_last_wins: bool = False,
) -> Any:
    """Parse YAML text safely; `error` naming `source` for bad YAML, a key written twice, too many
    aliases or bytes."""
    import yaml

    size = len(text.encode("utf-8", "surrogatepass"))
    if size > max_bytes:
        raise error(
            f"{source}: {size:,} bytes, more than the {max_bytes:,} spark-ops reads; refused "
            "before parsing",
            hint="check that the path names the right file",
        )

    loader = _unique_key_loader(yaml, same_value_ok, scalar_last_wins)
    try:
        # only when the text could hold too many: walk the events and count the real ones (each
        # level of nesting starts at one _NESTING_START, so fewer cannot nest deeper)
        if (
            len(_ALIAS_LIKE.findall(text)) > max_aliases
            or len(_NESTING_START.findall(text)) > MAX_DEPTH
        ):
            _check_events(yaml, loader, text, source, error, max_aliases)
        if not _ALIAS_LIKE.search(text):
            return yaml.load(text, Loader=loader)
        # aliases: what they build is measured on the composed nodes (shared, never expanded)
        # before any value is constructed
        parser = loader(text)
        try:
            node = parser.get_single_node()
            if node is not None:
                _check_graph(node, source, error)
            return parser.construct_document(node) if node is not None else None
        finally:
            parser.dispose()
    except DuplicateKey as dup:
        raise error(
            f"{source}: line {dup.line}: key {excerpt(dup.key)} is written twice in one mapping "
            f"(first on line {dup.first}); YAML would silently keep only the last",
            hint="remove or rename one of them",
        ) from None
    except yaml.YAMLError as exc:
        if "maximum nesting depth" in str(exc):  # PyYAML >= 6.0.4's scanner, ahead of our count
            raise _too_deep(source, error, getattr(exc, "problem_mark", None)) from None
        raise error(f"{source}: not valid YAML: {exc}") from exc


def _check_graph(root: Any, source: str, error: type[SparkOpsError]) -> None:
    """Refuse composed nodes whose value, aliases followed, nests past MAX_DEPTH, holds more than
    MAX_EXPANDED_NODES nodes written out, or holds itself (`&a [*a]`): one pass over the shared
    nodes, iterative (no Python recursion), each node measured once."""
    depth: dict[int, int] = {}
    size: dict[int, int] = {}
    on_path: set[int] = set()
    stack: list[tuple[Any, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        key = id(node)
        children = _children(node)
        if done:
            on_path.discard(key)
            depth[key] = 1 + max((depth[id(c)] for c in children), default=0)
            size[key] = 1 + sum(size[id(c)] for c in children)
            if depth[key] > MAX_DEPTH:
                raise _too_deep(source, error, node.start_mark)
            if size[key] > MAX_EXPANDED_NODES:
                raise error(
                    f"{source}: line {node.start_mark.line + 1}: its aliases (*name) build more "
                    f"than {MAX_EXPANDED_NODES:,} values once written out; refused (an alias bomb "
                    "expands to gigabytes)",
                    hint="write the values out, or use fewer anchors",
                )
            continue
        if key in depth:
            continue
        if not children:
            depth[key], size[key] = 0, 1
            continue
        on_path.add(key)
        stack.append((node, True))
        for child in children:
            if id(child) in on_path:
                raise error(
                    f"{source}: line {child.start_mark.line + 1}: an alias (*name) inside the "
                    "collection its anchor (&name) names: a value that holds itself; refused",
                    hint="write the values out instead of the alias",
                )
            if id(child) not in depth:
                stack.append((child, False))


def _children(node: Any) -> list[Any]:
    """The nodes a composed node holds (a mapping's keys and values); none for a scalar."""
    value = node.value
    if isinstance(value, str):
        return []
    out: list[Any] = []
    for item in value:
        if isinstance(item, tuple):
            out.extend(item)
        else:
            out.append(item)
    return out


def _too_deep(source: str, error: type[SparkOpsError], mark: Any) -> SparkOpsError:
    """The refusal of a file nested past MAX_DEPTH, at its line when known."""
    where = f"line {mark.line + 1}: " if mark is not None else ""
    return error(
        f"{source}: {where}lists or mappings nested more than {MAX_DEPTH} levels deep; refused",
        hint="check that the path names the right file",
    )


class DuplicateKey(Exception):
    """A mapping holds the same key twice (line numbers are 1-based)."""

    def __init__(self, key: object, line: int, first: int) -> None:
        """Keep the key, the line of its repeat and of its first occurrence."""
        super().__init__(f"line {line}: duplicate key {key!r} (first on line {first})")
        self.key = key
        self.line = line
        self.first = first


_LOADERS: dict[tuple[int, bool, bool], Any] = {}


def same_node(a: Any, b: Any) -> bool:
    """True when two YAML nodes hold the same tagged text (an alias is its anchor's node)."""
    if a is b:
        return True
    if type(a) is not type(b) or a.tag != b.tag:
        return False
    if isinstance(a.value, str):
        return bool(a.value == b.value)
    if len(a.value) != len(b.value):
        return False
    if a.value and isinstance(a.value[0], tuple):  # a mapping's (key, value) pairs
        return all(
            same_node(ka, kb) and same_node(va, vb)
            for (ka, va), (kb, vb) in zip(a.value, b.value, strict=True)
        )
    return all(same_node(x, y) for x, y in zip(a.value, b.value, strict=True))


def _unique_key_loader(yaml: Any, same_value_ok: bool, scalar_last_wins: bool) -> Any:
    """The safe loader (libyaml's when present: ~10x the pure parser) refusing duplicate keys."""
    cached = _LOADERS.get((id(yaml), same_value_ok, scalar_last_wins))
    if cached is not None:
        return cached
    base = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    merge_tag = "tag:yaml.org,2002:merge"

    class UniqueKeyLoader(base):  # type: ignore[misc, valid-type]
        """Safe loading; a mapping's key written twice raises DuplicateKey."""

        def construct_mapping(self, node: Any, deep: bool = False) -> Any:
            """Check the keys written in this mapping (merged ones aside), then build it."""
            seen: dict[Any, tuple[int, Any]] = {}
            merges: list[int] = []
            for key_node, value_node in node.value:
                if key_node.tag == merge_tag:  # two `<<:` in one mapping: the last wins silently
                    merges.append(key_node.start_mark.line + 1)
                    if len(merges) > 1:
                        raise DuplicateKey("<<", merges[1], merges[0])
                    continue
                if not isinstance(key_node, yaml.ScalarNode):
                    continue
                key = self.construct_object(key_node)
                line = key_node.start_mark.line + 1
                try:
                    if key in seen:
                        first, earlier = seen[key]
                        scalars = isinstance(earlier, yaml.ScalarNode) and isinstance(
                            value_node, yaml.ScalarNode
                        )
                        if not (
                            (same_value_ok and same_node(earlier, value_node))
                            or (scalar_last_wins and scalars)
                        ):
                            raise DuplicateKey(key, line, first)
                    seen[key] = (line, value_node)
                except TypeError:  # an unhashable key: PyYAML refuses it itself
                    continue
            return super().construct_mapping(node, deep=deep)

    _LOADERS[(id(yaml), same_value_ok, scalar_last_wins)] = UniqueKeyLoader
    return UniqueKeyLoader


_ALIAS_LIKE = re.compile(r"\*[^\s,\[\]{}]")


# What starts a level of nesting: a flow sequence or mapping, a key's colon (a flow pair's too),
# an explicit key, a block entry (`-` then a space or the end: `--flag` is none)
_NESTING_START = re.compile(r"[\[{:?]|-(?=\s|\Z)")


def _check_events(
    yaml: Any, loader: Any, text: str, source: str, error: type[SparkOpsError], limit: int
) -> None:
    """Walk the parse events (libyaml's parser keeps its own stack; no value is built) and refuse
    the alias past the limit, or a collection nested past MAX_DEPTH (composing one 200,000 levels
    deep overflows the C stack: the process dies of SIGSEGV)."""
    seen = depth = 0
    for event in yaml.parse(text, Loader=loader):
        if isinstance(event, yaml.AliasEvent):
            seen += 1
            if seen > limit:
                raise error(
                    f"{source}: line {event.start_mark.line + 1}: more than {limit} YAML "
                    "aliases (*name); refused (an alias bomb expands to gigabytes)",
                    hint="write the values out, or use fewer anchors",
                )
        elif isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > MAX_DEPTH:
                raise _too_deep(source, error, event.start_mark)
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1
