"""The red team of 2026-12-05, round 6: an operator's file that is not a regular file (a FIFO no
program writes to, one whose writer never ends, a terminal, /dev/zero, a directory, a symlink
loop), invalid UTF-8, an empty file: every reader of operator input (the inventory, the fleet
file, a local recipe) ends in an error naming the file, never a wait without end
(docs/reliability.md, "The red team of 2026-12-05, round 6")."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from spark_ops import yamlsafe
from spark_ops.errors import SparkOpsError
from spark_ops.fleet import load_fleet
from spark_ops.inventory.load import load_inventory
from spark_ops.recipe.files import read_recipe

READERS: dict[str, Callable[[Path], object]] = {
    "inventory": load_inventory,
    "fleet": load_fleet,
    "recipe": read_recipe,
}


def _outcome(reader: Callable[[Path], object], path: Path, wait_s: float = 5.0) -> str:
    """The reader's error message for path, run in a thread; 'BLOCKED' when it has not ended
    within wait_s (a writer is then opened on the FIFO so that the thread ends)."""
    out: list[str] = []

    def run() -> None:
        """Read, keeping the error's message."""
        try:
            reader(path)
            out.append("READ")
        except SparkOpsError as exc:
            out.append(exc.message)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(wait_s)
    if t.is_alive():
        if path.is_fifo():
            os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))  # let the blocked open end
        t.join(wait_s)
        return "BLOCKED"
    return out[0]


@pytest.fixture()
def fifo(tmp_path: Path) -> Path:
    """A named pipe no program writes to."""
    p = tmp_path / "inventory.yaml"
    os.mkfifo(p)
    return p


@pytest.mark.parametrize("kind", sorted(READERS))
def test_a_fifo_nobody_writes_to_is_refused_at_once(kind: str, fifo: Path) -> None:
    """open() of such a FIFO waited for a writer for ever: now refused naming it."""
    message = _outcome(READERS[kind], fifo)
    assert message != "BLOCKED"
    assert str(fifo) in message and "named pipe" in message, message


@pytest.fixture()
def silent_writer(fifo: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The FIFO held open by a writer that never writes nor ends (the wait shortened)."""
    monkeypatch.setattr(yamlsafe, "PIPE_WAIT_S", 0.5)
    fd = os.open(fifo, os.O_RDWR)  # a writer, at once (Linux opens a FIFO read-write)
    try:
        yield fifo
    finally:
        os.close(fd)


@pytest.mark.parametrize("kind", sorted(READERS))
def test_a_pipe_that_never_ends_is_refused_after_the_wait(kind: str, silent_writer: Path) -> None:
    """A writer that holds the pipe and writes nothing: refused naming it, after PIPE_WAIT_S."""
    message = _outcome(READERS[kind], silent_writer)
    assert str(silent_writer) in message and "did not end" in message, message


def test_a_pipe_written_at_once_is_read(fifo: Path) -> None:
    """`--inventory <(…)`: a pipe whose writer wrote and ended is read as the file would be."""
    keep = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # holds the written bytes once it ends
    try:
        w = os.open(fifo, os.O_WRONLY)
        os.write(w, b"model: org/tiny\n")
        os.close(w)
        assert _outcome(read_recipe, fifo) == "READ"
    finally:
        os.close(keep)


CASES = [
    ("a directory", "dir", "Is a directory"),
    ("a symlink loop", "loop", "Too many levels of symbolic links"),
    ("invalid UTF-8", "bad", "not UTF-8"),
    ("/dev/zero", "/dev/zero", "more than the"),
]


def _make(name: str, tmp_path: Path) -> Path:
    """The file a case names, made under tmp_path (a device path is taken as it is)."""
    if name.startswith("/"):
        return Path(name)
    p = tmp_path / name
    if name == "dir":
        p.mkdir()
    elif name == "loop":
        (tmp_path / "loop2").symlink_to(p)
        p.symlink_to(tmp_path / "loop2")
    else:
        p.write_bytes(b"clusters:\n  \xff\xfe: 1\n")
    return p


@pytest.mark.parametrize("kind", sorted(READERS))
@pytest.mark.parametrize(("case", "name", "said"), CASES, ids=[c[0] for c in CASES])
def test_every_reader_names_the_file_it_cannot_take(
    kind: str, case: str, name: str, said: str, tmp_path: Path
) -> None:
    """Each case is one error naming the file and what is wrong with it."""
    path = _make(name, tmp_path)
    message = _outcome(READERS[kind], path)
    assert str(path) in message and said in message, (case, message)
