"""The remote layer against real SSH servers (embedded asyncssh nodes, keys made at run time)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from embedded import start_nodes
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spark_ops.errors import CommandTimeout, ConnectError, HostKeyError, InputError, RemoteError
from spark_ops.inventory import Cluster, parse_inventory
from spark_ops.remote import ClusterSession, FileWrite, WriteOutcome, quote_args, sha256
from spark_ops.sim.node import SimNode


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[tuple[list[SimNode], Cluster]]:
    """Three running embedded nodes."""
    nodes, c = await start_nodes(tmp_path)
    try:
        yield nodes, c
    finally:
        for n in nodes:
            await n.stop()


async def test_run_everywhere_and_per_host_errors(cluster: tuple[list[SimNode], Cluster]) -> None:
    """Each node runs in its own file tree; a failing host is reported, the others still answer."""
    nodes, c = cluster
    async with ClusterSession(c) as s:
        await s.connect()
        res = await s.run_all('echo "$HOME"; [ "$SPARK_SIM_NODE" != node2 ]', check=True)
    assert res["node1"].stdout.strip() == str(nodes[0].spec.home)  # type: ignore[union-attr]
    assert isinstance(res["node2"], RemoteError) and "exit 1" in res["node2"].message
    assert res["node3"].ok  # type: ignore[union-attr]


async def test_timeout_is_enforced(cluster: tuple[list[SimNode], Cluster]) -> None:
    """A command past its timeout raises CommandTimeout naming the host."""
    _, c = cluster
    async with ClusterSession(c) as s:
        await s.connect(["node1"])
        with pytest.raises(CommandTimeout, match="node1"):
            await s.run("node1", "sleep 10", timeout=0.5)


async def test_atomic_write_with_backup_and_retention(
    cluster: tuple[list[SimNode], Cluster],
) -> None:
    """Writes land whole, keep a timestamped backup, and keep only the last N backups."""
    nodes, c = cluster
    target = nodes[0].spec.home / "r.yaml"
    target.write_text("v0\n")
    os.chmod(target, 0o640)
    async with ClusterSession(c) as s:
        await s.connect()
        old = "v0\n"
        for i in range(1, 5):
            new = f"v{i}\n"
            [out] = await s.write_atomic([FileWrite("node1", "~/r.yaml", new, sha256(old), 2)])
            assert out.backup and Path(out.backup).read_text() == old
            old = new
    assert target.read_text() == "v4\n"
    assert oct(target.stat().st_mode & 0o777) == "0o640", "the file's mode is kept"
    backups = sorted(p.name for p in target.parent.glob("r.yaml.bak.*"))
    assert len(backups) == 2, backups
    assert not list(target.parent.glob(".r.yaml.spark-ops.*")), "no temp file left"


async def test_write_refused_on_one_node_changes_no_node(
    cluster: tuple[list[SimNode], Cluster],
) -> None:
    """Staging fails on node3 (its directory is missing): node1 and node2 keep their content."""
    nodes, c = cluster
    for n in nodes[:2]:
        (n.spec.home / "etc").mkdir()
        (n.spec.home / "etc" / "r.yaml").write_text("old\n")
    writes = [FileWrite(n.spec.name, "~/etc/r.yaml", "new\n", sha256("old\n")) for n in nodes[:2]]
    writes.append(FileWrite("node3", "~/etc/r.yaml", "new\n"))
    async with ClusterSession(c) as s:
        await s.connect()
        with pytest.raises(RemoteError, match="node3"):
            await s.write_atomic(writes)
    for n in nodes[:2]:
        assert (n.spec.home / "etc" / "r.yaml").read_text() == "old\n"
        assert sorted(p.name for p in (n.spec.home / "etc").iterdir()) == ["r.yaml"]


async def test_write_refused_when_file_changed_since_read(
    cluster: tuple[list[SimNode], Cluster],
) -> None:
    """The digest the plan was built on no longer matches: nothing is written."""
    nodes, c = cluster
    target = nodes[0].spec.home / "r.yaml"
    target.write_text("edited by someone else\n")
    async with ClusterSession(c) as s:
        await s.connect(["node1"])
        with pytest.raises(RemoteError, match="changed since it was read"):
            await s.write_atomic([FileWrite("node1", "~/r.yaml", "mine\n", sha256("planned\n"))])
    assert target.read_text() == "edited by someone else\n"


async def test_unknown_host_key_and_missing_node(
    cluster: tuple[list[SimNode], Cluster], tmp_path: Path
) -> None:
    """A node whose key is not in known_hosts is refused; a stopped node is named."""
    nodes, c = cluster
    (tmp_path / "known_hosts").write_text("")
    async with ClusterSession(c) as s:
        with pytest.raises(HostKeyError, match="node1"):
            await s.connect(["node1"])
    await nodes[2].stop()
    bad = parse_inventory(
        yaml.safe_dump(
            {
                "clusters": {
                    "t": {
                        "ssh": {"agent": False, "connect_timeout": 3, "config": "/dev/null"},
                        "nodes": {
                            "node3": {
                                "host": "127.0.0.1",
                                "port": nodes[2].spec.port,
                                "role": "head",
                            }
                        },
                        "recipe": {"path": "/r"},
                        "watchdog": {"restart_command": "true", "history_file": "/h"},
                    }
                }
            }
        ),
        "t",
    ).cluster()
    async with ClusterSession(bad) as s:
        with pytest.raises(ConnectError, match="node3"):
            await s.connect()


async def test_known_hosts_parsed_once_per_content(
    cluster: tuple[list[SimNode], Cluster], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every connection shares one parse of known_hosts; an edit to the file is seen at once."""
    from asyncssh.known_hosts import SSHKnownHosts

    from spark_ops.remote import connector

    _, c = cluster
    loads: list[int] = []
    real_load = SSHKnownHosts.load

    def counting_load(self: SSHKnownHosts, data: str) -> None:
        """Count the parses of known_hosts content."""
        loads.append(len(data))
        real_load(self, data)

    monkeypatch.setattr(SSHKnownHosts, "load", counting_load)
    connector._parse_known_hosts.cache_clear()
    async with ClusterSession(c) as s:
        await s.connect()
        assert len(loads) == 1, f"3 connections, {len(loads)} parses of known_hosts"
    kh = Path(os.path.expanduser(c.ssh.known_hosts or ""))
    kh.write_text("# every key removed\n")
    async with ClusterSession(c) as s:
        with pytest.raises(HostKeyError, match="node1"):
            await s.connect(["node1"])
    assert len(loads) == 2


async def test_tunnel_reaches_a_loopback_service(cluster: tuple[list[SimNode], Cluster]) -> None:
    """A local port forwarded through the head reaches a service listening on the head."""
    _, c = cluster

    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Answer one line."""
        writer.write(b"pong:" + await reader.readline())
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(echo, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with ClusterSession(c) as s:
        await s.connect(["node1"])
        local = await s.tunnel("node1", "127.0.0.1", port)
        reader, writer = await asyncio.open_connection("127.0.0.1", local)
        writer.write(b"ping\n")
        assert await reader.readline() == b"pong:ping\n"
        writer.close()
    server.close()


HOSTILE = st.text(
    alphabet=st.sampled_from(list("ab '\"$();`\\\n\t|&*?~#!<>{}-=")), min_size=1, max_size=24
)


@pytest.fixture(scope="module")
def one_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[SimNode, Cluster]]:
    """One embedded node served from a background event loop for the whole module."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    root = tmp_path_factory.mktemp("one-node")
    nodes, c = asyncio.run_coroutine_threadsafe(start_nodes(root, 1), loop).result(30)
    yield nodes[0], c
    asyncio.run_coroutine_threadsafe(nodes[0].stop(), loop).result(30)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(name=HOSTILE, content=st.text(max_size=200) | st.sampled_from(["a\udcffb", "\x00", "{x}"]))
def test_hostile_paths_and_content_round_trip(
    one_node: tuple[SimNode, Cluster], name: str, content: str
) -> None:
    """Quotes, $(), newlines and ; in a file name and its content reach the node exactly.

    Content that is not UTF-8 text (a lone surrogate, as from an undecodable argv byte) or holds
    a NUL is refused before anything is sent, naming the file: the node is left as it was.
    """
    node, c = one_node
    fname = name.replace("/", "_").lstrip("-") or "x"
    if fname in (".", ".."):
        fname = "dot"

    async def go() -> None:
        """Write, read back and echo through a real SSH node."""
        async with ClusterSession(c) as s:
            await s.connect()
            if "\x00" in content or "\udcff" in content:
                with pytest.raises(InputError, match="nothing was sent or written") as err:
                    await s.write_atomic([FileWrite("node1", f"~/{fname}", content)])
                assert fname in err.value.message
                return
            await s.write_atomic([FileWrite("node1", f"~/{fname}", content)])
            assert (node.spec.home / fname).read_bytes().decode() == content
            assert await s.read_file("node1", f"~/{fname}") == content
            res = await s.run("node1", "printf '%s' " + quote_args([name]))
            assert res.stdout == name

    asyncio.run(go())


def test_help_imports_no_ssh_or_http_library() -> None:
    """`spark-ops --help` must not import asyncssh, aiohttp or yaml."""
    code = (
        "import sys\n"
        "from spark_ops.cli.main import main\n"
        "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
        "heavy = [m for m in ('asyncssh', 'aiohttp', 'yaml', 'rich') if m in sys.modules]\n"
        "print('HEAVY=' + ','.join(heavy))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().endswith("HEAVY="), out.stdout[-300:]


async def test_rename_failing_on_one_node_puts_the_others_back(
    cluster: tuple[list[SimNode], Cluster],
) -> None:
    """node2's rename fails after node1's: node1 gets its old recipe back; no temp file is left."""
    nodes, c = cluster
    for n in nodes:
        (n.spec.home / "r.yaml").write_text("old\n")
    writes = [FileWrite(n.spec.name, "~/r.yaml", "new\n", sha256("old\n")) for n in nodes]
    async with ClusterSession(c) as s:
        await s.connect()
        real_commit = s.commit

        async def commit(w: FileWrite, staged: WriteOutcome) -> WriteOutcome:
            """Lose node2's staged file just before its rename."""
            if w.host == "node2":
                assert staged.staged
                Path(staged.staged).unlink()
            return await real_commit(w, staged)

        s.commit = commit  # type: ignore[method-assign]
        with pytest.raises(RemoteError, match=r"node2.*rename over ~/r\.yaml"):
            await s.write_atomic(writes)
    for n in nodes:
        assert (n.spec.home / "r.yaml").read_text() == "old\n", n.spec.name
        leftovers = [p.name for p in n.spec.home.iterdir() if p.name not in ("r.yaml", "bin")]
        assert leftovers == [], (n.spec.name, leftovers)


LIBOQS_PROBE = """
import ctypes.util, json, sys
calls = []
stock = ctypes.util.find_library
def spy(name):
    calls.append(name)
    return stock(name)
ctypes.util.find_library = spy
if sys.argv[1] == "spark-ops":
    from spark_ops.remote.connector import load_asyncssh
    load_asyncssh()
else:
    import asyncssh
import asyncssh.crypto.pq as pq
import asyncssh.crypto.umac as umac
print(json.dumps({"lib": pq._oqs_lib, "nettle": umac._nettle_lib, "mlkem": pq.mlkem_available,
                  "restored": ctypes.util.find_library is spy, "calls": calls}))
"""


def _probe(how: str, env: dict[str, str]) -> dict[str, Any]:
    """Import asyncssh the stock way or through load_asyncssh; what it found and asked."""
    out = subprocess.run(
        [sys.executable, "-c", LIBOQS_PROBE, how], capture_output=True, text=True, env=env
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return dict(json.loads(out.stdout))


def test_asyncssh_import_finds_what_the_stock_probe_finds() -> None:
    """load_asyncssh asks the linker cache for liboqs/nettle: the stock probe's answer, faster."""
    env = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "LIBRARY_PATH")}
    stock, ours = _probe("stock", env), _probe("spark-ops", env)
    found = ("lib", "nettle", "mlkem")
    assert [ours[k] for k in found] == [stock[k] for k in found]
    assert ours["restored"], "ctypes.util.find_library is put back after the import"
    assert ours["calls"] == [], "asyncssh's probes did not go through the slow search"
    assert {"oqs", "nettle"} <= set(stock["calls"]), "the stock import probes (else: no test)"
    # a library path outside the cache: the stock search runs, as asyncssh alone would do it
    custom = _probe("spark-ops", dict(env, LD_LIBRARY_PATH="/opt/oqs/lib"))
    assert {"oqs", "nettle"} <= set(custom["calls"])


async def test_symlink_written_through_foreign_backups_kept(
    cluster: tuple[list[SimNode], Cluster],
) -> None:
    """A symlinked file: the target changes, the link stays, the backup is a copy, not a link;
    rotation removes only backups spark-ops named, never the operator's own `.bak.known-good`."""
    nodes, c = cluster
    home = nodes[0].spec.home
    (home / "recipes").mkdir()
    real = home / "recipes" / "v2.yaml"
    real.write_text("v0\n")
    link = home / "active.yaml"
    link.symlink_to(real)
    mine = home / "active.yaml.bak.2025-11-30-known-good"
    mine.write_text("operator's own\n")
    async with ClusterSession(c) as s:
        await s.connect(["node1"])
        old = "v0\n"
        for i in range(1, 8):
            new = f"v{i}\n"
            [out] = await s.write_atomic([FileWrite("node1", "~/active.yaml", new, sha256(old), 2)])
            assert out.backup and not Path(out.backup).is_symlink()
            assert Path(out.backup).read_text() == old, "the backup holds the old content"
            old = new
        assert len(await s.backups("node1", "~/active.yaml")) == 2
    assert link.is_symlink() and os.readlink(link) == str(real), "the link is kept"
    assert real.read_text() == "v7\n"
    assert mine.read_text() == "operator's own\n", "the operator's backup is never rotated"
    assert not list(home.glob(".active.yaml.spark-ops.*")) and not list(
        real.parent.glob(".v2.yaml.spark-ops.*")
    )


async def test_stale_staged_file_cleaned_unreadable_refused(
    cluster: tuple[list[SimNode], Cluster],
) -> None:
    """A staged file a SIGKILLed run left is removed by the next write (after 10 min); a
    non-UTF-8 file and a huge one are refused naming the file, before anything is read."""
    nodes, c = cluster
    home = nodes[0].spec.home
    (home / "r.yaml").write_text("a\n")
    stale = home / ".r.yaml.spark-ops.AbC123"
    stale.write_text("half")
    os.utime(stale, (1, 1))
    fresh = home / ".r.yaml.spark-ops.XyZ789"  # another run's, being written now: kept
    fresh.write_text("in use")
    (home / "bad.yaml").write_bytes(b"key: bad\xffbyte\n")
    (home / "big.yaml").write_bytes(b"#" * (2 << 20))
    async with ClusterSession(c) as s:
        await s.connect(["node1"])
        await s.write_atomic([FileWrite("node1", "~/r.yaml", "b\n", sha256("a\n"))])
        with pytest.raises(RemoteError, match=r"bad.yaml: not UTF-8 text \(byte 0xff at offset 8"):
            await s.read_file("node1", "~/bad.yaml")
        with pytest.raises(RemoteError, match=r"big.yaml: 2097152 bytes, more than the 1,048,576"):
            await s.read_file("node1", "~/big.yaml")
        res = await s.run("node1", "cat ~/bad.yaml")
        assert res.stdout == "key: bad\ufffdbyte\n", "other output: U+FFFD per bad byte"
    assert not stale.exists() and fresh.exists()


RECORDING_SYNC = """#!/bin/sh
# sync as found first on the node's PATH: records each call, then runs the real one
for a in "$@"; do
  [ "$a" = -- ] && continue
  if [ -f "$a" ]; then kind=file; sum=$(sha256sum < "$a" | cut -c1-64); else kind=dir; sum=-; fi
  printf '%s\\t%s\\t%s\\t%s\\n' "$a" "$kind" "$sum" "$(sha256sum < @TARGET@ | cut -c1-64)" >> @LOG@
done
[ "$#" -gt 0 ] || printf 'all\\t-\\t-\\t-\\n' >> @LOG@
exec @REAL@ "$@"
"""

# dd as found first on the node's PATH: runs the real one, then records the file it wrote ("file"
# when it fsynced it: conv=fsync) in the sync log's form; the stage writes and syncs in one dd
RECORDING_DD = """#!/bin/sh
of=; kind=unsynced
for a in "$@"; do
  case $a in of=*) of=${a#of=} ;; conv=*fsync*) kind=file ;; esac
done
@REAL@ "$@" || exit
[ -n "$of" ] || exit 0
sum=$(sha256sum < "$of" | cut -c1-64)
printf '%s\\t%s\\t%s\\t%s\\n' "$of" "$kind" "$sum" "$(sha256sum < @TARGET@ | cut -c1-64)" >> @LOG@
"""


async def test_staged_file_is_synced_before_the_rename(
    cluster: tuple[list[SimNode], Cluster],
) -> None:
    """The staged file is fsynced whole, under its temp name, while the target still holds the
    old content; the directory is synced after the rename (a `sync` and a `dd` on the node's PATH
    record every call: the stage writes and fsyncs in one `dd conv=fsync`)."""
    nodes, c = cluster
    home = nodes[0].spec.home
    target, log = home / "r.yaml", home / "sync.log"
    target.write_text("old\n")
    real = next(p for p in ("/usr/bin/sync", "/bin/sync") if Path(p).exists())
    program = RECORDING_SYNC.replace("@TARGET@", str(target)).replace("@LOG@", str(log))
    (home / "bin" / "sync").write_text(program.replace("@REAL@", real))
    (home / "bin" / "sync").chmod(0o755)
    real_dd = next(p for p in ("/usr/bin/dd", "/bin/dd") if Path(p).exists())
    program = RECORDING_DD.replace("@TARGET@", str(target)).replace("@LOG@", str(log))
    (home / "bin" / "dd").write_text(program.replace("@REAL@", real_dd))
    (home / "bin" / "dd").chmod(0o755)
    async with ClusterSession(c) as s:
        await s.connect(["node1"])
        await s.write_atomic([FileWrite("node1", "~/r.yaml", "new\n", sha256("old\n"))])
    assert target.read_text() == "new\n"
    calls = [line.split("\t") for line in log.read_text().splitlines()]
    staged = [
        i
        for i, (path, _, _, in_target) in enumerate(calls)
        if in_target == sha256("old\n")
        and (Path(path).name.startswith(".r.yaml.") or path == "all")
    ]
    assert staged, f"nothing was synced before the rename: {calls}"
    path, kind, content, _ = calls[staged[0]]
    if path != "all":  # a sync of the whole system would do too
        assert kind == "file" and content == sha256("new\n"), "synced whole, under its temp name"
        assert not Path(path).exists(), "the synced file is the one renamed into place"
    after = calls[staged[-1] + 1 :]
    assert any(p in (str(home), "all") and t == sha256("new\n") for p, _, _, t in after), (
        f"the directory is synced after the rename: {calls}"
    )
