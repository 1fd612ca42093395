"""spark-ops exec / spark_ops.fanout: per-host results on OpenSSH nodes and embedded nodes."""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, ClassVar

import pytest
from ground.cluster import bare_cluster
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spark_ops import fanout, lineedit, log
from spark_ops.errors import (
    ConnectError,
    ExitStatus,
    HostKeyError,
    InputError,
    InventoryError,
    LockError,
)
from spark_ops.inventory import Cluster, parse_inventory
from spark_ops.lock import cluster_lock
from spark_ops.remote import ClusterSession

RECIPE = "model: glm\nmax_num_seqs: 6\nkv_cache_memory: 40G\n"
ECHO_ARGV = "import sys, json; sys.stdout.write(json.dumps(sys.argv[1:]))"


def inventory_for(ground: Any, *, max_connects: int = 16) -> Cluster:
    """A spark-ops cluster for an sshd ground cluster (node1 head)."""
    return bare_cluster(ground, max_concurrent_connects=max_connects)


def put_recipe(ground: Any, text: str = RECIPE) -> None:
    """Write ~/recipe.yaml on every ground node, owned by its user."""
    for n in ground:
        p = n.home / "recipe.yaml"
        p.write_text(text)
        os.chown(p, n.uid, n.gid)


# ----------------------------------------------------------------------------- pure parts


async def test_line_edit_exactly_one_line() -> None:
    """A one-line edit rewrites the matching line only, keeping its line ending."""
    e = lineedit.LineEdit("r.yaml", r"^max_num_seqs: .*", "max_num_seqs: 64")
    new, old, line = await e.apply("h", "a: 1\r\nmax_num_seqs: 6\r\nb: 2")
    assert new == "a: 1\r\nmax_num_seqs: 64\r\nb: 2"
    assert (old, line) == ("max_num_seqs: 6", "max_num_seqs: 64")


@pytest.mark.parametrize("text", ["a: 1\n", "max_num_seqs: 1\nmax_num_seqs: 2\n"])
async def test_line_edit_refuses_zero_or_many(text: str) -> None:
    """No match or several matches: refused, naming the file and the pattern."""
    with pytest.raises(fanout.FanoutError, match=r"r\.yaml"):
        await lineedit.LineEdit("r.yaml", "^max_num_seqs", "x").apply("h", text)


async def test_line_edit_bad_regex_and_split() -> None:
    """An invalid regex and a replacement that adds a newline are refused."""
    with pytest.raises(InputError, match=r"not a valid regex"):
        lineedit.LineEdit("r", "(", "x").compiled()
    for template, why in ((r"\9", "invalid group reference 9"), (r"\g<x>", "unknown group name")):
        with pytest.raises(InputError, match=f"not a valid template .*{why}"):
            lineedit.LineEdit("r", "^(a)", template).compiled()
    with pytest.raises(fanout.FanoutError, match="split"):
        await lineedit.LineEdit("r", "^a", "a\nb").apply("h", "a\n")


async def test_line_edit_backtracking_regex_has_a_deadline() -> None:
    """A pattern that backtracks for ever (`(a+)+$` on a long line of a's ending otherwise) is
    stopped at the edit's deadline and refused, naming the file and the pattern (issue 21 #9);
    the same file with a sane pattern still edits (the child process keeps re's semantics)."""
    text = "x: " + "a" * 60 + "!\nmax_num_seqs: 6\n"
    with pytest.raises(fanout.FanoutError, match=r"r\.yaml: pattern '\(a\+\)\+\$' did not finish"):
        await lineedit.LineEdit("r.yaml", r"(a+)+$", "x").apply("h", text, deadline_s=1)
    new, _, _ = await lineedit.LineEdit("r.yaml", r"^(max_num_seqs:).*", r"\1 64").apply("h", text)
    assert new.endswith("max_num_seqs: 64\n")


@pytest.mark.parametrize(
    "brk", list(lineedit.LINE_BREAKS), ids=[hex(ord(c)) for c in lineedit.LINE_BREAKS]
)
async def test_line_edit_refuses_every_line_break(brk: str) -> None:
    """A replacement holding any character a reader takes for a line end (U+2028 and \\x85 as
    much as \\n) would write a second line through a one-line edit: refused (red team E3)."""
    with pytest.raises(fanout.FanoutError, match="split"):
        await lineedit.LineEdit("r", "^(a:).*", f"\\1 6{brk}a: 64").apply("h", "a: 1\n")


async def test_line_edit_child_imports_nothing_from_the_cwd(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`python -m` puts its cwd first on sys.path: a json.py where spark-ops was started is
    never imported by the edit's child (red team E1)."""
    marker = tmp_path / "ran"
    (tmp_path / "json.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    monkeypatch.chdir(tmp_path)
    new, _, _ = await lineedit.LineEdit("r", "^(a:).*", r"\1 2").apply("h", "a: 1\n")
    assert new == "a: 2\n" and not marker.exists()


def test_line_edit_child_ends_alone_when_spark_ops_is_gone() -> None:
    """The child arms its own alarm at the deadline: with nobody left to kill it (spark-ops
    SIGKILLed), a runaway match still ends (red team E2)."""
    payload = {"pattern": "(a+)+$", "replacement": "x", "texts": ["a" * 60 + "!"], "deadline_s": 1}
    proc = subprocess.run(
        [sys.executable, "-m", "spark_ops.linesub"], input=json.dumps(payload),
        capture_output=True, text=True, timeout=60, cwd=lineedit.PACKAGE_HOME,
    )  # fmt: skip
    assert proc.returncode == -signal.SIGALRM


def test_build_command_quotes_and_shell() -> None:
    """Arguments are quoted one by one; --shell passes one string as is."""
    assert fanout.build_command(["echo", "a b", "$(x)"]) == "echo 'a b' '$(x)'"
    assert fanout.build_command(["ls | wc -l"], shell=True) == "ls | wc -l"
    with pytest.raises(InventoryError):
        fanout.build_command([])
    with pytest.raises(InventoryError):
        fanout.build_command(["a", "b"], shell=True)


def test_report_exit_status_order() -> None:
    """Unreachable wins over timeout, which wins over a failed command."""
    rep = fanout.FanoutReport(
        "c",
        "x",
        [
            fanout.HostResult("a", fanout.EXIT, 3),
            fanout.HostResult("b", fanout.TIMEOUT),
            fanout.HostResult("c", fanout.OK, 0),
        ],
        0.1,
    )
    assert rep.exit_status() == ExitStatus.TIMEOUT
    rep.hosts.append(fanout.HostResult("d", fanout.UNREACHABLE))
    assert rep.exit_status() == ExitStatus.UNREACHABLE
    assert rep.to_dict()["failed"] == ["a", "b", "d"]


class FlakyConnector:
    """A fake connector whose first connects are dropped like an sshd past MaxStartups."""

    attempts: ClassVar[dict[str, int]] = {}

    def __init__(self, node: Any, ssh: Any) -> None:
        """Remember the node."""
        self.node = node

    async def connect(self) -> None:
        """Fail with a reset (node2: twice; node3: refused for good), then succeed."""
        n = self.attempts[self.node.name] = self.attempts.get(self.node.name, 0) + 1
        if self.node.name == "node3":
            raise ConnectError("node3", "cannot connect to 127.0.0.1:1: Connection refused")
        if self.node.name == "node2" and n <= 2:
            raise ConnectError("node2", "cannot connect to 127.0.0.1:2: Connection reset by peer")

    async def run(self, command: str, *, input: str | None = None, timeout: float) -> Any:
        """Answer every command with exit 0."""
        from spark_ops.remote import Result

        return Result(self.node.name, command, 0, "ok\n", "", 0.0)

    async def close(self) -> None:
        """Nothing to close."""

    def host_key(self) -> None:
        """No host key (as the Connector base class says for a transport without one)."""


FLAKY_INVENTORY = (
    "clusters:\n  t:\n    nodes:\n      node1: {host: h1, role: head}\n      node2: {host: h2}\n"
    "      node3: {host: h3}\n    recipe: {path: r}\n"
    "    watchdog: {restart_command: x, history_file: y}\n"
)


async def test_dropped_connects_are_retried_refused_are_not() -> None:
    """A reset before login is retried (within the cap); a refused connection is not."""
    from spark_ops.remote import ClusterSession, transient

    cluster = parse_inventory(FLAKY_INVENTORY, "t.yaml").cluster()
    FlakyConnector.attempts.clear()
    session = ClusterSession(cluster, connector_factory=FlakyConnector)  # type: ignore[arg-type]
    results = await fanout.exec_on(session, "true", ["node1", "node2", "node3"])
    assert [r.kind for r in results] == [fanout.OK, fanout.OK, fanout.UNREACHABLE]
    assert FlakyConnector.attempts == {"node1": 1, "node2": 3, "node3": 1}
    assert transient(ConnectError("n", "disconnected while connecting: Connection lost"))
    assert not transient(HostKeyError("n", "Connection lost"))


async def test_retries_are_logged_per_host() -> None:
    """Each retry (tenacity's) is logged once with the host bound and the error that caused it;
    a refused connect is not retried, so it logs no retry."""
    import structlog

    from spark_ops.remote import ClusterSession

    cluster = parse_inventory(FLAKY_INVENTORY, "t.yaml").cluster()
    FlakyConnector.attempts.clear()
    session = ClusterSession(cluster, connector_factory=FlakyConnector)  # type: ignore[arg-type]
    # an in-process CLI run earlier on this worker may have left the level at warnings: info here,
    # and structlog configured before capture_logs swaps its processors in (not after, over them)
    saved = dict(log._state)
    log.configure(0)
    log._structlog()
    try:
        with structlog.testing.capture_logs() as logs:
            await session.connect(required=False)
    finally:
        log._state.update(saved, ready=False)
    retries = [e for e in logs if e["event"] == "connection dropped: retrying"]
    assert [(e["host"], e["attempt"]) for e in retries] == [("node2", 1), ("node2", 2)]
    assert all("Connection reset by peer" in e["error"] for e in retries)
    assert set(session.connectors) == {"node1", "node2"} and set(session.errors) == {"node3"}


# ----------------------------------------------------------------------------- OpenSSH nodes


@pytest.mark.openssh
async def test_exec_per_host_and_one_failing(openssh_cluster: Any) -> None:
    """Each host answers with its own output; one host's exit code is reported, others succeed."""
    cluster = inventory_for(openssh_cluster)
    bad = openssh_cluster["node2"].user
    script = f'echo "$USER"; [ "$USER" != {bad} ] || {{ echo boom >&2; exit 3; }}'
    rep = await fanout.run_command(cluster, ["sh", "-c", script])
    assert [h.host for h in rep.hosts] == ["node1", "node2", "node3", "node4"]
    for node in openssh_cluster:
        assert rep.result(node.name).stdout.strip() == node.user
    n2 = rep.result("node2")
    assert (n2.kind, n2.exit_code, n2.stderr.strip()) == (fanout.EXIT, 3, "boom")
    assert [h.host for h in rep.failed] == ["node2"]
    assert rep.exit_status() == ExitStatus.REMOTE
    assert json.loads(json.dumps(rep.to_dict()))["hosts"][1]["exit_code"] == 3


@pytest.mark.openssh
async def test_exec_selected_nodes_unreachable_and_timeout(openssh_cluster: Any) -> None:
    """--nodes limits the hosts; a stopped node is unreachable; a slow command hits its timeout."""
    cluster = inventory_for(openssh_cluster)
    rep = await fanout.run_command(cluster, ["true"], nodes=["node3", "node1"])
    assert [h.host for h in rep.hosts] == ["node3", "node1"] and rep.ok
    with pytest.raises(InventoryError, match="node9"):
        await fanout.run_command(cluster, ["true"], nodes=["node9"])
    openssh_cluster.stop("node4")
    script = '[ "$USER" = {u} ] && exec sleep 30; true'.format(u=openssh_cluster["node2"].user)
    rep = await fanout.run_command(cluster, ["sh", "-c", script], timeout=1.0)
    kinds = {h.host: h.kind for h in rep.hosts}
    assert kinds == {
        "node1": fanout.OK,
        "node2": fanout.TIMEOUT,
        "node3": fanout.OK,
        "node4": fanout.UNREACHABLE,
    }
    assert "node4" in (rep.result("node4").error or "")
    assert rep.exit_status() == ExitStatus.UNREACHABLE


@pytest.mark.openssh
def test_hostile_arguments_arrive_exactly(openssh_cluster: Any) -> None:
    """Quotes, $(), backticks, newlines, ; and globs in arguments reach remote argv unchanged."""
    from spark_ops.remote import ClusterSession

    cluster = inventory_for(openssh_cluster)
    loop = asyncio.new_event_loop()
    session = ClusterSession(cluster)
    loop.run_until_complete(session.connect(["node1"]))
    hostile = st.sampled_from(
        [
            "'",
            '"',
            "$(touch /tmp/pwned)",
            "`id`",
            "\n",
            ";",
            "&&",
            "|",
            "*",
            "~",
            "$HOME",
            "\\",
            " ",
            "-n",
            "--",
            "'\"'\"'",
            "\t",
            "#",
            "!",
            "{a,b}",
            "> x",
            "é☃",
        ]
    )
    text = st.text(st.characters(codec="utf-8", exclude_characters="\x00"))
    argument = st.lists(st.one_of(hostile, text), max_size=4).map("".join)

    @settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
    @given(st.lists(argument, max_size=5))
    def check(args: list[str]) -> None:
        """The remote python sees exactly args."""
        results = loop.run_until_complete(
            fanout.exec_on(
                session,
                fanout.build_command(["python3", "-c", ECHO_ARGV, *args]),
                ["node1"],
                timeout=20,
            )
        )
        assert results[0].ok, results[0]
        assert json.loads(results[0].stdout) == args

    try:
        check()
    finally:
        loop.run_until_complete(session.close())
        loop.close()
    assert not Path("/tmp/pwned").exists()


@pytest.mark.openssh
async def test_edit_all_or_nothing(openssh_cluster: Any) -> None:
    """The edit lands everywhere with backups; when one node cannot take it, no node is written."""
    cluster = inventory_for(openssh_cluster)
    put_recipe(openssh_cluster)
    edit = lineedit.LineEdit("~/recipe.yaml", r"^max_num_seqs: .*", "max_num_seqs: 64")
    rep = await lineedit.edit_line(cluster, edit)
    assert rep.ok, rep.to_dict()
    for n in openssh_cluster:
        assert (n.home / "recipe.yaml").read_text() == RECIPE.replace(": 6", ": 64")
        h = rep.result(n.name)
        assert h.extra["written"] and h.extra["backup"].startswith(str(n.home))
        assert Path(h.extra["backup"]).read_text() == RECIPE
    assert "no restart, so no watchdog lease" in rep.note  # it restarts nothing
    again = await lineedit.edit_line(cluster, edit)
    assert again.ok and {h.kind for h in again.hosts} == {fanout.UNCHANGED} and not again.note

    broken = openssh_cluster["node3"].home / "recipe.yaml"
    broken.write_text("model: glm\n")
    edit2 = lineedit.LineEdit("~/recipe.yaml", r"^max_num_seqs: .*", "max_num_seqs: 32")
    rep2 = await lineedit.edit_line(cluster, edit2)
    assert not rep2.ok and rep2.exit_status() == ExitStatus.REMOTE
    assert "no line" in (rep2.result("node3").error or "")
    assert "another node" in (rep2.result("node1").error or "")
    for n in openssh_cluster:
        text = (n.home / "recipe.yaml").read_text()
        assert "32" not in text
        assert not [p for p in n.home.iterdir() if ".spark-ops." in p.name]  # staged files removed

    # one node's copy immutable: refused while staging, before any node renames; none changed
    broken.write_text(RECIPE.replace(": 6", ": 64"))
    before = {n.name: sorted(p.name for p in n.home.iterdir()) for n in openssh_cluster}
    subprocess.run(["chattr", "+i", str(broken)], check=True)
    try:
        rep3 = await lineedit.edit_line(cluster, edit2)
    finally:
        subprocess.run(["chattr", "-i", str(broken)], check=True)
    assert not rep3.ok and "immutable or append-only" in (rep3.result("node3").error or "")
    assert "another node" in (rep3.result("node1").error or "")
    for n in openssh_cluster:
        assert (n.home / "recipe.yaml").read_text() == RECIPE.replace(": 6", ": 64"), n.name
        assert sorted(p.name for p in n.home.iterdir()) == before[n.name], "no backup left"


@pytest.mark.openssh
async def test_edit_substitutes_once_per_distinct_text(
    openssh_cluster: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nodes holding the same text share one substitution: one child for the run, given each
    distinct text once; a pattern that backtracks for ever is refused on every node at the
    child's deadline, and nothing is written."""
    cluster = inventory_for(openssh_cluster)
    put_recipe(openssh_cluster)
    other = RECIPE.replace("model: glm", "model: other")
    odd = openssh_cluster["node3"].home / "recipe.yaml"
    odd.write_text(other)
    calls: list[list[str]] = []
    real = lineedit.LineEdit.substitute

    async def spy(self: lineedit.LineEdit, texts: Any, **kw: Any) -> Any:
        """The real substitution, its texts noted."""
        calls.append(list(texts))
        return await real(self, texts, **kw)

    monkeypatch.setattr(lineedit.LineEdit, "substitute", spy)
    edit = lineedit.LineEdit("~/recipe.yaml", r"^max_num_seqs: .*", "max_num_seqs: 48")
    rep = await lineedit.edit_line(cluster, edit)
    assert rep.ok, rep.to_dict()
    assert calls == [[RECIPE, other]], "one child, each distinct text once"
    assert odd.read_text() == other.replace(": 6", ": 48")
    for n in openssh_cluster:
        assert "max_num_seqs: 48\n" in (n.home / "recipe.yaml").read_text()

    calls.clear()
    put_recipe(openssh_cluster, "x: " + "a" * 60 + "!\nmax_num_seqs: 6\n")
    runaway = lineedit.LineEdit("~/recipe.yaml", r"(a+)+$", "x")
    rep2 = await lineedit.edit_line(cluster, runaway)
    assert len(calls) == 1 and len(calls[0]) == 1
    assert {h.kind for h in rep2.hosts} == {fanout.ERROR}
    for h in rep2.hosts:
        assert "did not finish matching within 5 s" in (h.error or ""), h
    for n in openssh_cluster:
        assert (n.home / "recipe.yaml").read_text().endswith("max_num_seqs: 6\n"), "not written"


@pytest.mark.openssh
async def test_edit_refused_by_the_lock_leaves_no_child(
    openssh_cluster: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The substitution child is spawned before the lock is asked for: when another operator
    holds the lock the edit is refused, nothing is read or written, and the child is gone."""
    cluster = inventory_for(openssh_cluster)
    put_recipe(openssh_cluster)
    children: list[asyncio.subprocess.Process] = []
    real = lineedit.LineEdit.spawn

    async def spy(self: lineedit.LineEdit) -> asyncio.subprocess.Process:
        """The real spawn, its process kept."""
        children.append(await real(self))
        return children[-1]

    monkeypatch.setattr(lineedit.LineEdit, "spawn", spy)
    edit = lineedit.LineEdit("~/recipe.yaml", r"^max_num_seqs: .*", "max_num_seqs: 64")
    async with ClusterSession(cluster) as other:
        await other.connect([cluster.head.name])
        async with cluster_lock(other, "apply --max-num-seqs 32"):
            with pytest.raises(LockError, match="apply --max-num-seqs 32"):
                await lineedit.edit_line(cluster, edit)
    assert len(children) == 1 and children[0].returncode is not None, "the child was ended"
    for n in openssh_cluster:
        assert (n.home / "recipe.yaml").read_text() == RECIPE, n.name
        assert not [q for q in n.home.iterdir() if ".spark-ops." in q.name or ".bak." in q.name]


@pytest.mark.openssh
def test_cli_exec_exit_code_and_json(openssh_cluster: Any, tmp_path: Path) -> None:
    """`spark-ops exec --json` prints per-host data and exits 12 when a host's command failed."""
    inv = tmp_path / "inv.yaml"
    nodes = "".join(
        f"      {n.name}: {{host: {n.host}, port: {n.port}, user: {n.user}"
        + (", role: head" if i == 0 else "")
        + "}\n"
        for i, n in enumerate(openssh_cluster)
    )
    inv.write_text(
        "clusters:\n  t:\n    ssh:\n"
        f"      known_hosts: {openssh_cluster.known_hosts}\n"
        f"      identity: {openssh_cluster.client_key}\n      agent: false\n"
        "    nodes:\n" + nodes + "    recipe: {path: ~/recipe.yaml}\n"
        "    watchdog: {restart_command: 'true', history_file: ~/restarts}\n"
    )
    script = '[ "$USER" != {u} ] || exit 5'.format(u=openssh_cluster["node4"].user)
    argv = [sys.executable, "-m", "spark_ops.cli.main", "-q", "-i", str(inv), "exec", "--json",
            "--", "sh", "-c", script]  # fmt: skip
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == int(ExitStatus.REMOTE), proc.stderr
    data = json.loads(proc.stdout)
    assert data["failed"] == ["node4"] and data["hosts"][3]["exit_code"] == 5
    argv2 = [*argv[:7], "--nodes", "node1,node2", "--", "true"]
    ok = subprocess.run(argv2, capture_output=True, text=True, timeout=120, check=False)
    assert ok.returncode == 0, ok.stderr
    assert ok.stderr == "", ok.stderr  # -q: all hosts ok is nothing to say (only warnings, errors)
    loud = subprocess.run([a for a in argv2 if a != "-q"], capture_output=True, text=True,
                          timeout=120, check=False)  # fmt: skip
    assert loud.returncode == 0 and "2/2 ok" in loud.stderr, loud.stderr


# ----------------------------------------------------------------------------- embedded cluster


async def test_exec_on_embedded_nodes(sim: Any) -> None:
    """The fan-out works on the embedded asyncssh nodes: one result per node, a failure kept."""
    from spark_ops.inventory import load_inventory

    cluster = load_inventory(sim.inventory).cluster()
    rep = await fanout.run_command(
        cluster, ["sh", "-c", 'printf "%s" "$1"; exit "$2"', "sh", "a b", "0"]
    )
    names = [n.name for n in cluster.nodes]
    assert [h.host for h in rep.hosts] == names and rep.ok
    assert {h.stdout for h in rep.hosts} == {"a b"}
    rep2 = await fanout.run_command(cluster, ["sh", "-c", "exit 7"], nodes=[names[1]], timeout=10)
    assert rep2.hosts[0].exit_code == 7 and rep2.exit_status() == ExitStatus.REMOTE


async def test_exec_edit_and_changes_recipe_are_operations(
    sim: Any, cli_env: dict[str, str]
) -> None:
    """`exec --edit` and `exec --changes-recipe` are operations (issue 34): while another run
    holds the cluster lock they are refused with the lock's exit code, nothing written and
    nothing recorded; run, each leaves exactly one audit record, whose outcome `spark-ops log`
    shows (text and JSON)."""
    from spark_ops.inventory import load_inventory
    from spark_ops.lock import cluster_lock
    from spark_ops.remote import ClusterSession

    cluster = load_inventory(sim.inventory).cluster()
    mark = secrets.token_hex(4)  # names this test's records among the cluster's others
    runs = {
        "exec --edit": ["exec", "--nodes", "node1", "--edit", cluster.recipe.path,
                        "--sub", r"^( *max_num_seqs:) *6\b", rf"\g<1> 7  # {mark}"],
        "exec": ["exec", "--changes-recipe", "--nodes", "node1", "--", "true", mark],
    }  # fmt: skip

    async def spark_ops(*args: str) -> tuple[int, str, str]:
        """The real CLI against the embedded cluster: exit code, stdout, stderr."""
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "spark_ops.cli.main", *args, env=cli_env,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip
        out, err = await proc.communicate()
        assert proc.returncode is not None
        return proc.returncode, out.decode(), err.decode()

    recipe = sim.recipe.read_text()
    async with ClusterSession(cluster) as session:
        await session.connect([cluster.head.name])
        async with cluster_lock(session, "apply --max-num-seqs 64"):  # another run's
            for args in runs.values():
                code, _, err = await spark_ops(*args)
                assert code == ExitStatus.LOCKED, err
                assert "locked by" in err and "apply --max-num-seqs 64" in err
    assert sim.recipe.read_text() == recipe  # nothing written while refused
    for args in runs.values():
        code, _, err = await spark_ops(*args)
        assert code == 0, err
    assert f"max_num_seqs: 7  # {mark}" in sim.recipe.read_text()
    code, out, err = await spark_ops("log", "--json", "-n", "200")
    assert code == 0, err
    for operation in runs:
        mine = [
            e for e in json.loads(out)
            if (e.get("what") or {}).get("operation") == operation and mark in json.dumps(e)
        ]  # fmt: skip
        assert len(mine) == 1, mine
        assert mine[0]["outcome"] == "ok" and mine[0]["nodes"] == ["node1"]
    code, out, err = await spark_ops("log", "-n", "200")
    assert code == 0, err
    lines = out.splitlines()
    for shown in ("  exec --edit path=", "  exec command="):  # the operation, its arguments
        at = [i for i, line in enumerate(lines) if shown in line and mark in line]
        assert len(at) == 1, out
        assert "nodes: node1  outcome: ok" in lines[at[0] + 1]


@pytest.mark.parametrize(
    "args",
    [
        ["exec"],
        ["exec", "--sub", "a", "b", "--", "true"],
        ["exec", "--edit", "~/r.yaml"],
        ["exec", "--edit", "~/r.yaml", "--sub", "a", "b", "--", "true"],
    ],
)
def test_cli_usage_errors_before_inventory(args: list[str]) -> None:
    """Bad combinations are usage errors (exit 2), reported before any inventory is read."""
    from click.testing import CliRunner

    from spark_ops.cli.main import cli

    result = CliRunner().invoke(cli, ["-i", "/nonexistent/inventory.yaml", *args])
    assert result.exit_code == 2, result.output


@pytest.mark.parametrize(
    ("path", "kinds", "has"),
    [
        ("r", [fanout.OK, fanout.OK], ["no restart, so no watchdog lease", "old values"]),
        ("r", [fanout.OK, fanout.UNCHANGED], ["spark-ops restart", "unverified"]),
        ("r", [fanout.UNCHANGED, fanout.UNCHANGED], []),
        ("r", [fanout.EXIT, fanout.UNREACHABLE], []),
        ("~/other.conf", [fanout.OK], ["no restart, so no watchdog lease", "only writes the file"]),
    ],
)
def test_an_edit_says_why_it_takes_no_lease(path: str, kinds: list[str], has: list[str]) -> None:
    """exec --edit restarts nothing (no lease); for the recipe, when its values reach the engine;
    nothing said when no file changed."""
    cluster = parse_inventory(FLAKY_INVENTORY, "t.yaml").cluster()
    results = [fanout.HostResult(f"node{i}", k, 0) for i, k in enumerate(kinds, 1)]
    note = lineedit.edit_note(cluster, path, results)
    assert bool(note) is bool(has)
    for needle in has:
        assert needle in note, note
