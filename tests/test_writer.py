"""The all-or-nothing writer meeting another writer, a full disk, an immutable copy, and one
machine named twice (issue 20, items 5, 6 and 10), on real embedded SSH nodes.

Two nodes serve the whole module from a background event loop; each test writes in its own
directory. A full disk is a real 64 KiB tmpfs mounted on that directory, an immutable copy a
real `chattr +i` (both need root: the tests skip without it).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import asyncssh
import pytest
import yaml
from embedded import start_nodes

from spark_ops.errors import ExitStatus, InventoryError, RemoteError
from spark_ops.inventory import Cluster, parse_inventory
from spark_ops.remote import ClusterSession, FileWrite, WriteOutcome, sha256

OLD, NEW, THEIRS = "max_num_seqs: 24\n", "max_num_seqs: 40\n", "max_num_seqs: 32  # mine\n"
Hook = Callable[[FileWrite, WriteOutcome], None]


class Pair:
    """Two running embedded nodes, their inventory, and each node's home."""

    def __init__(self, root: Path, cluster: Cluster) -> None:
        """Keep the nodes' root directory and their cluster."""
        self.root = root
        self.cluster = cluster

    def home(self, node: str) -> Path:
        """A node's home directory (what `~` is there)."""
        return self.root / node

    def recipe(self, node: str, case: str) -> Path:
        """The copy a case writes on a node: ~/<case>/r.yaml."""
        return self.home(node) / case / "r.yaml"

    def seed(self, case: str, text: str = OLD) -> list[FileWrite]:
        """Give both nodes the old copy; the two writes that change it to NEW."""
        for node in ("node1", "node2"):
            self.recipe(node, case).parent.mkdir(exist_ok=True)
            self.recipe(node, case).write_text(text)
        return [FileWrite(n, f"~/{case}/r.yaml", NEW, sha256(text)) for n in ("node1", "node2")]

    def left(self, node: str, case: str) -> list[str]:
        """Files beside the copy (staged files, backups); a test's own filler excepted."""
        names = os.listdir(self.recipe(node, case).parent)
        return sorted(n for n in names if n not in ("r.yaml", "filler", "lost+found"))


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    """Two embedded nodes served from a background event loop for the whole module."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    root = tmp_path_factory.mktemp("writer")
    nodes, c = asyncio.run_coroutine_threadsafe(start_nodes(root, 2), loop).result(30)
    yield Pair(root, c)
    for n in nodes:
        asyncio.run_coroutine_threadsafe(n.stop(), loop).result(30)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)


def write(
    c: Cluster,
    writes: list[FileWrite],
    before_commit: Hook | None = None,
    after_commit: Hook | None = None,
) -> Any:
    """Run write_atomic over SSH; before_commit(write, staged) runs just before each commit,
    after_commit(write, staged) just after each one that renamed."""

    async def go() -> list[WriteOutcome]:
        """Connect, hook the commit, write."""
        async with ClusterSession(c) as s:
            await s.connect()
            real = s.commit

            async def commit(w: FileWrite, staged: WriteOutcome) -> WriteOutcome:
                """The real commit, after the test's hook."""
                if before_commit is not None:
                    before_commit(w, staged)
                out = await real(w, staged)
                if after_commit is not None:
                    after_commit(w, staged)
                return out

            s.commit = commit  # type: ignore[method-assign]
            return await s.write_atomic(writes)

    return asyncio.run(go())


def need_root() -> None:
    """Skip unless root (mount, chattr)."""
    if os.geteuid() != 0:
        pytest.skip("a real full disk and an immutable file need root")


@contextlib.contextmanager
def full_disk(directory: Path, free: int) -> Iterator[None]:
    """A 64 KiB tmpfs on directory (its files copied in), filled until `free` bytes are left."""
    need_root()
    saved = {p.name: p.read_bytes() for p in directory.iterdir()}
    res = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(directory)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {res.stderr.strip()}")
    try:
        for name, data in saved.items():
            (directory / name).write_bytes(data)
        st = os.statvfs(directory)
        (directory / "filler").write_bytes(b"x" * (st.f_bavail * st.f_frsize - free))
        st = os.statvfs(directory)
        assert st.f_bavail * st.f_frsize == free, "the disk is as full as the case says"
        yield
    finally:
        subprocess.run(["chattr", "-R", "-i", str(directory)], capture_output=True, check=False)
        subprocess.run(["umount", "-l", str(directory)], check=True)
        for name, data in saved.items():
            (directory / name).write_bytes(data)


@contextlib.contextmanager
def immutable(path: Path) -> Iterator[None]:
    """`chattr +i` on path for the block."""
    need_root()
    subprocess.run(["chattr", "+i", str(path)], check=True)
    try:
        yield
    finally:
        subprocess.run(["chattr", "-i", str(path)], check=True)


# ----------------------------------------------------------- a colleague writes during the write


@pytest.mark.parametrize(
    ("node", "how"), [("node2", "in place"), ("node1", "by rename"), ("node2", "by rename")]
)
def test_colleague_edit_between_stage_and_commit_is_kept(pair: Pair, node: str, how: str) -> None:
    """A colleague changes one node's copy after staging, before its rename: the digest is
    checked again right before the rename, the whole write stops, node1 (renamed already when
    node2 is the one changed) is put back; their text stays, no staged file or backup is left,
    and the error names the node, the path and both digests."""
    case = f"cas-{node}-{how.replace(' ', '-')}"
    writes = pair.seed(case)

    def colleague(w: FileWrite, staged: WriteOutcome) -> None:
        """Their edit, as an editor makes it, on `node` only."""
        if w.host != node:
            return
        path = pair.recipe(node, case)
        if how == "in place":
            path.write_text(THEIRS)
        else:
            (path.parent / "r.yaml.swp").write_text(THEIRS)
            os.replace(path.parent / "r.yaml.swp", path)

    with pytest.raises(RemoteError) as err:
        write(pair.cluster, writes, colleague)
    other = "node1" if node == "node2" else "node2"
    assert pair.recipe(node, case).read_text() == THEIRS, "the colleague's edit is kept"
    assert pair.recipe(other, case).read_text() == OLD, "the other copy is put back"
    assert pair.left("node1", case) == [] and pair.left("node2", case) == []
    message = err.value.message
    assert message.startswith(f"{node}: ~/{case}/r.yaml changed while spark-ops was writing it")
    assert "someone else" in message and "nothing written on any node" in message
    assert f"expected {sha256(OLD)[:12]}, found {sha256(THEIRS)[:12]}" in message
    assert "run the command again" in (err.value.hint or "")
    assert getattr(err.value, "written", None) == []


# ------------------------------------------------------------ a full disk, an immutable copy


def test_full_disk_and_immutable_copy_refused_before_any_rename(pair: Pair) -> None:
    """The reported case: node1's disk has room for the staged file and not a byte more,
    node2's copy is immutable. node2's copy is found unreplaceable while staging, before any
    rename: both copies keep the old text, and no staged file or backup is left anywhere."""
    case = "full-immutable"
    writes = pair.seed(case)
    with full_disk(pair.recipe("node1", case).parent, free=4096):
        with immutable(pair.recipe("node2", case)), pytest.raises(RemoteError) as err:
            write(pair.cluster, writes)
        assert pair.recipe("node1", case).read_text() == OLD
        assert pair.left("node1", case) == [], "no staged file (0 bytes or not), no backup"
    assert pair.recipe("node2", case).read_text() == OLD
    assert pair.left("node2", case) == []
    assert err.value.message.startswith(f"node2: ~/{case}/r.yaml: cannot be written: ")
    assert "immutable or append-only" in err.value.message
    assert "nothing written on any node" in err.value.message


def test_undo_on_a_full_disk_needs_no_space(pair: Pair) -> None:
    """node1's disk is full after its rename and node2's rename fails: node1 is put back by
    renaming its backup (the old file itself) over the copy, which needs no space."""
    case = "full-undo"
    writes = pair.seed(case)

    def lose_staged(w: FileWrite, staged: WriteOutcome) -> None:
        """node2's staged file disappears before its rename: that rename fails."""
        if w.host == "node2":
            assert staged.staged
            os.unlink(staged.staged)

    with full_disk(pair.recipe("node1", case).parent, free=4096):
        with pytest.raises(RemoteError, match=r"^node2: .*rename over") as err:
            write(pair.cluster, writes, lose_staged)
        assert pair.recipe("node1", case).read_text() == OLD, "put back on the full disk"
        assert pair.left("node1", case) == []
    assert pair.recipe("node2", case).read_text() == OLD and pair.left("node2", case) == []
    assert getattr(err.value, "written", []) == []


def test_renames_run_concurrently_and_one_refused_puts_the_others_back(pair: Pair) -> None:
    """Once every node has staged, the renames start together (both begin before either ends);
    node2's is refused (its staged file gone), node1's lands and is put back from its backup,
    exactly as when they ran one by one: both copies old, no staged file or backup left."""
    case = "concurrent-undo"
    writes = pair.seed(case)
    events: list[str] = []

    def begin(w: FileWrite, staged: WriteOutcome) -> None:
        """Note the start; node2 loses its staged file."""
        events.append(f"begin {w.host}")
        if w.host == "node2":
            assert staged.staged
            os.unlink(staged.staged)

    def end(w: FileWrite, staged: WriteOutcome) -> None:
        """Note a rename that landed."""
        events.append(f"end {w.host}")

    with pytest.raises(RemoteError, match=r"^node2: .*rename over") as err:
        write(pair.cluster, writes, begin, end)
    assert events[:2] == ["begin node1", "begin node2"] and events[2:] == ["end node1"]
    for node in ("node1", "node2"):
        assert pair.recipe(node, case).read_text() == OLD, f"{node} holds its old content"
        assert pair.left(node, case) == [], f"{node}: no staged file or backup left"
    assert getattr(err.value, "written", []) == []


def test_staging_on_a_full_disk_leaves_no_file(pair: Pair) -> None:
    """No byte free on node1: its staging fails naming the node, the path and the full disk;
    the half-made (0-byte) staged file is removed, node2's staged file too."""
    case = "full-stage"
    writes = pair.seed(case)
    with full_disk(pair.recipe("node1", case).parent, free=0):
        with pytest.raises(RemoteError) as err:
            write(pair.cluster, writes)
        assert pair.left("node1", case) == [], "no 0-byte staged file"
        assert pair.recipe("node1", case).read_text() == OLD
    assert pair.recipe("node2", case).read_text() == OLD and pair.left("node2", case) == []
    assert err.value.message.startswith(f"node1: ~/{case}/r.yaml: cannot be written: ")
    assert "No space left on device" in err.value.message
    assert "nothing written on any node" in err.value.message


def test_undo_that_fails_names_every_copy(pair: Pair) -> None:
    """node2's rename fails and node1's copy, renamed already, cannot be put back (made
    immutable meanwhile): the error says what each copy holds and where the old content is,
    carries the copies left written (`written`, for the audit), and no staged file is left."""
    case = "undo-fails"
    writes = pair.seed(case)

    def lose_staged(w: FileWrite, staged: WriteOutcome) -> None:
        """Before node2's rename: its staged file lost."""
        if w.host == "node2":
            assert staged.staged
            os.unlink(staged.staged)

    def pin_new(w: FileWrite, staged: WriteOutcome) -> None:
        """After node1's rename (the renames run concurrently): its new copy made immutable."""
        if w.host == "node1":
            subprocess.run(["chattr", "+i", str(pair.recipe("node1", case))], check=True)

    need_root()
    try:
        with pytest.raises(RemoteError) as err:
            write(pair.cluster, writes, lose_staged, pin_new)
    finally:
        subprocess.run(["chattr", "-i", str(pair.recipe("node1", case))], check=True)
    assert pair.recipe("node1", case).read_text() == NEW
    assert pair.recipe("node2", case).read_text() == OLD
    message = err.value.message
    assert message.startswith("node1: the write failed (node2: ")
    assert "could not be undone on every node" in message
    assert f"node1:~/{case}/r.yaml holds the NEW content (putting it back failed" in message
    assert f"node2:~/{case}/r.yaml holds its old content" in message
    [backup] = pair.left("node1", case)
    assert f"its old content is in {pair.recipe('node1', case).parent / backup}" in message
    assert (pair.recipe("node1", case).parent / backup).read_text() == OLD
    assert pair.left("node2", case) == [], "no staged file"
    assert getattr(err.value, "written", None) == [f"node1:~/{case}/r.yaml"]
    assert getattr(err.value, "states", {})[f"node2:~/{case}/r.yaml"] == "its old content"
    assert err.value.to_dict()["written"] == [f"node1:~/{case}/r.yaml"], "shown by --json"


# ------------------------------------------------------------ one machine twice in the inventory


def twice(pair: Pair) -> Path:
    """The nodes' inventory with node2 reaching node1 under another name (`localhost`, node1's
    port): not the same endpoint as written, so only the host key tells them apart."""
    data = yaml.safe_load((pair.root / "inventory.yaml").read_text())
    nodes = data["clusters"]["t"]["nodes"]
    nodes["node2"]["port"] = nodes["node1"]["port"]
    nodes["node2"]["host"] = "localhost"
    path = pair.root / "twice.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_one_machine_twice_is_refused_before_anything_is_read(pair: Pair) -> None:
    """node2 answering with node1's host key (and boot id) is refused at connect, naming both
    nodes, their address and the key's fingerprint; nothing runs on either."""
    inventory = twice(pair)
    cluster = parse_inventory(inventory.read_text(), str(inventory)).cluster()
    key = asyncssh.read_private_key(str(pair.root / "host1")).get_fingerprint("sha256")

    async def go() -> None:
        """Connect only."""
        async with ClusterSession(cluster) as s:
            await s.connect()

    with pytest.raises(InventoryError) as err:
        asyncio.run(go())
    port = cluster.node("node1").port
    message = err.value.message
    assert message.startswith(f"{inventory}: nodes node1 (127.0.0.1:{port}) and node2 (localhost")
    assert f"are one machine: both answer with SSH host key {key}" in message
    assert "correct node2's host/port" in (err.value.hint or "")


@pytest.mark.parametrize("command", [["apply", "--max-num-seqs", "64", "--yes"], ["status"]])
def test_one_machine_twice_cli(pair: Pair, command: list[str]) -> None:
    """apply and status refuse the inventory with exit 3 (inventory invalid) and the message."""
    case = "cli-twice"
    pair.seed(case)
    env = dict(os.environ, SPARK_OPS_INVENTORY=str(twice(pair)))
    env.pop("SPARK_OPS_CLUSTER", None)
    env.pop("SPARK_OPS_FLEET", None)
    before = {n: sorted(os.listdir(pair.home(n))) for n in ("node1", "node2")}
    res = subprocess.run(
        [sys.executable, "-m", "spark_ops.cli.main", *command],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert res.returncode == ExitStatus.INVENTORY, res.stderr[-2000:]
    assert "nodes node1" in res.stderr and "are one machine" in res.stderr, res.stderr[-2000:]
    assert {n: sorted(os.listdir(pair.home(n))) for n in ("node1", "node2")} == before
