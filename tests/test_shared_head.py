"""A shared head (issue 34): only the operators' accounts write the lock, its owner record and the
audit log; another account can neither block nor forge, and a record is trusted only as the
system attributes it.

The head programs (remote/programs/lock.py) run here as real sh under real Unix accounts: the test
process (root) is one operator, `operator2` (in the operators' group) another, and `intruder` an
account outside it, made with useradd for this session. What they print goes through the same
Python the CLI uses (lock.parse_holder, lock.unsafe_error, audit.parse_lines, journal.runs_of).
"""

from __future__ import annotations

import contextlib
import grp
import json
import os
import pwd
import secrets
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from spark_ops import audit
from spark_ops.lock import cluster_key, describe_holder, parse_holder, unsafe_error
from spark_ops.remote.programs.lock import AUDIT_APPEND, AUDIT_READ, HOLD, LOCK_PROBE
from spark_ops.workflows.journal import runs_of, unfinished_runs

TIMEOUT = 60  # seconds any one program may take on a loaded machine


@dataclass(frozen=True)
class Accounts:
    """The accounts of the test: the operators' group, a second operator and an intruder."""

    group: str
    gid: int
    operator1: str
    operator2: str
    intruder: str


def _run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    """Run a set-up command, raising on failure."""
    return subprocess.run(argv, capture_output=True, text=True, check=True, timeout=TIMEOUT)


@pytest.fixture(scope="session")
def accounts() -> Iterator[Accounts]:
    """Two Unix accounts and a group, made for this session and removed after it."""
    if os.geteuid() != 0 or not all(shutil.which(t) for t in ("useradd", "groupadd", "setpriv")):
        pytest.skip("needs root, useradd, groupadd and setpriv (the test ground has them)")
    tag = secrets.token_hex(3)
    group, intruder = f"spo-ops-{tag}", f"spo-x-{tag}"
    op1, op2 = f"spo-op1-{tag}", f"spo-op2-{tag}"
    _run(["groupadd", group])
    try:
        for op in (op1, op2):
            _run(["useradd", "-M", "-d", "/nonexistent", "-s", "/bin/sh", "-G", group, "-U", op])
        _run(["useradd", "-M", "-d", "/nonexistent", "-s", "/bin/sh", "-U", intruder])
        yield Accounts(group, grp.getgrnam(group).gr_gid, op1, op2, intruder)
    finally:
        for user in (op1, op2, intruder):
            subprocess.run(["userdel", user], capture_output=True, check=False)
        subprocess.run(["groupdel", group], capture_output=True, check=False)


def as_user(user: str | None, argv: list[str]) -> list[str]:
    """argv run as `user` (its own groups), or as this process when None."""
    if user is None:
        return argv
    pw = pwd.getpwnam(user)
    return ["setpriv", f"--reuid={pw.pw_uid}", f"--regid={pw.pw_gid}", "--init-groups", *argv]


def run_as(user: str | None, argv: list[str], stdin: str = "") -> subprocess.CompletedProcess[str]:
    """Run argv as user, to its end."""
    return subprocess.run(
        as_user(user, argv), input=stdin, capture_output=True, text=True, timeout=TIMEOUT,
        check=False, cwd="/",
    )  # fmt: skip


@contextlib.contextmanager
def holding(user: str | None, lock_dir: str, history: str, record: str) -> Iterator[list[str]]:
    """HOLD run as user: its first line (and owner record when busy); the lock held inside."""
    proc = subprocess.Popen(
        as_user(user, HOLD.argv(lock_dir, history, record)), stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd="/",
    )  # fmt: skip
    assert proc.stdout is not None and proc.stdin is not None
    try:
        first = proc.stdout.readline().rstrip("\n")
        lines = [first]
        if not first.startswith("LOCKED"):
            proc.stdin.close()
            lines += proc.stdout.read().splitlines()
            proc.wait(timeout=TIMEOUT)
        yield lines
    finally:
        if proc.poll() is None:
            proc.stdin.close()
            proc.wait(timeout=TIMEOUT)
        proc.stdout.close()
        assert proc.stderr is not None
        proc.stderr.close()


@pytest.fixture
def shared(accounts: Accounts) -> Iterator[tuple[str, str]]:
    """A lock/state dir as the one-time set-up makes it (2770, the operators' group) and a
    watchdog history path; both removed after the test."""
    base = Path(f"/var/tmp/spark-ops-test-{secrets.token_hex(4)}")
    base.mkdir(mode=0o755)
    state = base / "state"
    state.mkdir()
    os.chown(state, 0, accounts.gid)
    state.chmod(0o2770)
    try:
        yield str(state), str(base / "restarts")
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_missing_dir_is_made_2770_and_files_0660(tmp_path: Path) -> None:
    """A missing state dir is made 2770 (the account's own group), its files 0660: nothing on the
    head is writable by every account any more (was 1777 and 0666); the owner record 0640."""
    state = tmp_path / "made" / "state"
    with holding(None, str(state), str(tmp_path / "h"), "{}") as lines:
        assert lines[0].startswith("LOCKED"), lines
    assert oct(state.stat().st_mode & 0o7777) == "0o2770"
    for f in state.iterdir():  # the owner record is the holder's own file: the group reads it
        assert f.stat().st_mode & 0o777 == (0o640 if f.name.endswith(".owner") else 0o660), f
    entry = json.dumps(audit.make_entry("apply", outcome="ok"))
    res = run_as(None, AUDIT_APPEND.argv(str(state), str(tmp_path / "h")), entry + "\n")
    assert res.returncode == 0, res.stderr
    for f in state.iterdir():
        assert f.stat().st_mode & 0o777 == (0o640 if f.name.endswith(".owner") else 0o660), f


def test_intruder_can_neither_block_nor_forge(accounts: Accounts, shared: tuple[str, str]) -> None:
    """An account outside the operators' group cannot take or fake the lock, write an owner
    record or append to the audit; the operators' lock and audit work on as before."""
    state, history = shared
    with holding(accounts.operator1, state, history, '{"user": "root"}') as lines:
        assert lines[0].startswith("LOCKED"), lines
    key = cluster_key(os.path.realpath(history))
    lock = f"{state}/cluster-{key}.lock"
    # the intruder's own spark-ops refuses the directory (it is not its group's)
    with holding(accounts.intruder, state, history, '{"user": "bob"}') as lines:
        err = unsafe_error("node1", lines[0])
        assert err is not None, lines
        assert state in err.message
    forged = '{"when": 1, "account": "root", "uid": 0, "who": "bob@vm", "run": "r1"}'
    for attempt in (
        f'printf \'%s\\n\' \'{{"user": "bob", "pid": 4242}}\' > {lock}.owner',
        f"exec 9<{lock} && flock -n 9 && sleep 1",
        f"printf '%s\\n' '{forged}' >> {state}/cluster-{key}.audit.jsonl",
        f": > {state}/cluster-{key}.audit.jsonl",
        f"mv {lock} {lock}.x",
    ):
        res = run_as(accounts.intruder, ["sh", "-c", attempt])
        assert res.returncode != 0, attempt
    # nothing it tried shows: the lock is free, the owner record empty, no audit file
    res = run_as(accounts.operator1, LOCK_PROBE.argv(state, history))
    assert res.stdout.startswith("free"), res.stdout
    assert Path(f"{lock}.owner").read_text() == ""
    assert not Path(f"{state}/cluster-{key}.audit.jsonl").exists()


def test_holder_is_the_account_the_system_names(
    accounts: Accounts, shared: tuple[str, str]
) -> None:
    """A second operator holds the lock with an owner record claiming to be someone else: the
    refusal names the account that owns the owner record's file, not the claim."""
    state, history = shared
    claim = json.dumps({"user": "alice", "host": "ops1", "pid": 1, "operation": "apply",
                        "account": "root"})  # fmt: skip
    with holding(accounts.operator2, state, history, claim) as lines:
        assert lines[0].startswith("LOCKED"), lines
        with holding(accounts.operator1, state, history, "{}") as busy:
            assert busy[0].startswith("BUSY"), busy
            holder = parse_holder(busy[1:])
        probe = run_as(accounts.operator1, LOCK_PROBE.argv(state, history))
    assert holder["account"] == accounts.operator2
    assert f"account {accounts.operator2} on the head" in describe_holder(holder)
    assert parse_holder(probe.stdout.splitlines()[1:])["account"] == accounts.operator2


def test_world_writable_state_is_refused(accounts: Accounts, tmp_path: Path) -> None:
    """Today's layout (dir 1777, files 0666) with an intruder's forged owner record and audit
    line: every operator program refuses it, naming the directory and the fix."""
    base = Path(f"/var/tmp/spark-ops-test-{secrets.token_hex(4)}")
    base.mkdir(mode=0o1777)
    base.chmod(0o1777)
    history = str(tmp_path / "restarts")
    try:
        forged = json.dumps({"user": "bob", "host": "vm", "pid": 4242, "operation": "apply"})
        key = cluster_key(os.path.realpath(history))
        script = (
            f"umask 0; printf '%s\\n' '{forged}' > {base}/cluster-{key}.lock.owner && "
            f": > {base}/cluster-{key}.lock"
        )
        assert run_as(accounts.intruder, ["sh", "-c", script]).returncode == 0
        for argv in (
            HOLD.argv(str(base), history, "{}"),
            LOCK_PROBE.argv(str(base), history),
            AUDIT_APPEND.argv(str(base), history),
            AUDIT_READ.argv(str(base), history, 10),
        ):
            res = run_as(None, argv, "{}\n")
            assert res.returncode == 77, (argv[3:], res.stdout, res.stderr)
            line = next(x for x in res.stdout.splitlines() if x.startswith("UNSAFE"))
            err = unsafe_error("node1", line)
            assert err is not None
            assert str(base) in err.message and "every account" in err.message
            assert err.hint is not None and f"chmod 2770 {base}" in err.hint
        # a safe dir holding one world-writable file: that file is named
        base.chmod(0o2770)
        res = run_as(None, LOCK_PROBE.argv(str(base), history))
        assert res.returncode == 77 and f"file {base}/cluster-{key}.lock\t" in res.stdout
        err = unsafe_error("node1", res.stdout.splitlines()[-1])
        assert err is not None and err.hint is not None and "chmod 0660" in err.hint
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_forged_records_are_marked_and_never_settled(tmp_path: Path) -> None:
    """Records the head's program appended carry its account; a line written by hand (no account,
    a claimed one, or a second "account" key) is unattributed: log marks it, and an unfinished run
    it describes is never settled (no prune, no restart)."""
    state, history = str(tmp_path / "state"), str(tmp_path / "restarts")
    entry = audit.make_entry("apply", outcome="ok")
    entry["account"] = "alice"  # an entry cannot set its own account
    res = run_as(None, AUDIT_APPEND.argv(state, history), json.dumps(entry) + "\n")
    assert res.returncode == 0, res.stderr
    key = cluster_key(os.path.realpath(history))
    intent = {
        "who": "bob@vm", "run": "r-forged", "phase": "intent", "pid": 1,
        "what": {"operation": "restart", "args": {}},
        "steps": [{"name": "trigger", "status": "started", "from": 1.0, "to": 2.0}],
    }  # fmt: skip
    with open(f"{state}/cluster-{key}.audit.jsonl", "a", encoding="utf-8") as f:
        f.write(json.dumps({"when": 5.0, **intent}) + "\n")
    good = run_as(None, AUDIT_APPEND.argv(state, history), json.dumps(intent) + "\n")
    assert good.returncode == 0, good.stderr
    res = run_as(None, AUDIT_READ.argv(state, history, 20))
    entries = audit.parse_lines(res.stdout.partition("\n")[2])
    assert [bool(e.get("unattributed")) for e in entries] == [True, True, False]
    assert entries[0]["account"] == "alice"  # what the entry claimed: marked, not trusted
    assert entries[2]["account"] == pwd.getpwuid(os.getuid()).pw_name
    assert entries[2]["uid"] == os.getuid()
    runs = runs_of(entries)
    assert [r.run for r in runs] == ["r-forged"]
    assert runs[0].intent["when"] == entries[2]["when"]  # the head's own record, not the forgery
    only_forged = [e for e in entries if e.get("unattributed")]
    assert runs_of(only_forged) == [] and unfinished_runs(runs_of(only_forged)) == []


async def test_log_and_serve_mark_an_unattributed_line(sim: Any, cli_env: dict[str, str]) -> None:
    """On the embedded cluster: a line appended to the head's audit file by hand (no account the
    head's program wrote) is marked unattributed by `spark-ops log` (text and JSON) and on serve's
    history page; the record spark-ops wrote beside it is not."""
    from spark_ops.inventory import load_inventory
    from spark_ops.remote import ClusterSession
    from spark_ops.serve.pages import history_page
    from spark_ops.serve.source import Source

    cluster = load_inventory(sim.inventory).cluster()

    def spark_ops(*args: str) -> str:
        """The real CLI against the embedded cluster; its stdout (exit 0 asserted)."""
        res = subprocess.run(
            [sys.executable, "-m", "spark_ops.cli.main", *args],
            env=cli_env, capture_output=True, text=True, timeout=TIMEOUT * 4,
        )  # fmt: skip
        assert res.returncode == 0, res.stderr
        return res.stdout

    mark = secrets.token_hex(4)
    spark_ops("exec", "--changes-recipe", "--nodes", "node1", "--", "true", mark)  # attributed
    async with ClusterSession(cluster) as session:
        await session.connect([cluster.head.name])
        res = await session.call(
            cluster.head.name, AUDIT_READ, cluster.state_dir, cluster.watchdog.history_file, 1
        )
    forged = {"when": 9.0, "who": f"mallory-{mark}@vm", "outcome": "ok", "nodes": ["node1"],
              "what": {"operation": "rollback", "args": {}}}  # fmt: skip
    with open(res.stdout.partition("\n")[0], "a", encoding="utf-8") as f:
        f.write(json.dumps(forged) + "\n")
    text = spark_ops("log", "-n", "200").splitlines()
    said = [line for line in text if f"mallory-{mark}" in line]
    assert len(said) == 1 and said[0].startswith("(unattributed: not written by spark-ops on the")
    ours = [line for line in text if mark in line and "exec command=" in line]
    assert len(ours) == 1 and "unattributed" not in ours[0]
    entries = json.loads(spark_ops("log", "--json", "-n", "200"))
    flags = {e.get("who"): bool(e.get("unattributed")) for e in entries if mark in json.dumps(e)}
    assert flags[f"mallory-{mark}@vm"] is True and list(flags.values()).count(False) == 1
    audit_read = await Source(cluster).audit.get()  # serve's own reading
    shown = [e for e in audit_read["entries"] if mark in json.dumps(e)]
    assert len(shown) == 2
    page = history_page({}, {"entries": shown})
    assert f"mallory-{mark}" in page and "unattributed" in page
    attributed_only = history_page({}, {"entries": [e for e in shown if audit.is_attributed(e)]})
    assert "unattributed" not in attributed_only and mark in attributed_only
