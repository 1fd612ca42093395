"""Red team F5: ending a lease races an operator who pauses the watchdog at that moment. A hook
before each command LEASE_END runs replaces the pause file (a rename over it, a write by name, a
symlink) or signals the program; then a real writer replacing it in a loop. An operator's pause is
never removed, and nothing is left under a private name."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import time
from pathlib import Path

import pytest

from spark_ops.remote.programs.watchdog import LEASE_END, LEASE_TAKE
from spark_ops.remote.shell import sha256
from spark_ops.watchdog.lease import lease_body

SHELLS = [s for s in ("bash", "dash") if shutil.which(s)]
# every command the program runs: the operator acts just before it
HOOKS = ("mktemp", "mv", "sha256sum", "head", "ln", "rm", "sync")
OPERATOR = "bob: do not restart, disk swap in progress\n"

SHIM = """#!/bin/sh
if [ -n "$HOOK_DIR" ] && mkdir "$HOOK_DIR/fired" 2>/dev/null; then
  case $HOOK_DO in
    rename) n=$HOOK_DIR/op.new; printf '%s' "$OPERATOR" > "$n" && {real_mv} -f -- "$n" "$PAUSE" ;;
    write) printf '%s' "$OPERATOR" > "$PAUSE" ;;
    link) {real_rm} -f -- "$PAUSE"; {real_ln} -s -- "$HOOK_DIR/op.target" "$PAUSE" ;;
    term) kill -TERM "$MAIN"; kill -HUP "$MAIN" ;;
  esac
fi
exec {real} "$@"
"""


def _shims(tmp: Path, at: str) -> Path:
    """A bin directory whose `at` command acts once (as HOOK_DO says), then runs the real one."""
    bindir = tmp / f"bin-{at}"
    bindir.mkdir()
    reals = {n: shutil.which(n) for n in ("mv", "rm", "ln", at)}
    assert all(reals.values()), reals
    text = SHIM.format(
        real=reals[at], real_mv=reals["mv"], real_rm=reals["rm"], real_ln=reals["ln"]
    )
    (bindir / at).write_text(text)
    (bindir / at).chmod(0o755)
    return bindir


def _take(pause: Path) -> str:
    """Take a lease at `pause` (the real program); the digest of what it made."""
    body = lease_body(holder="spark-ops:t", run="r1", why="test")
    res = subprocess.run(
        ["sh", "-c", LEASE_TAKE.line(str(pause), 60)],
        input=body, capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    return sha256(res.stdout)


def _end(
    shell: str, pause: Path, sha: str, env: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    """LEASE_END on `shell`, its own pid in $MAIN (for the hook's signals)."""
    argv = LEASE_END.argv(str(pause), sha)
    wrap = ["sh", "-c", 'MAIN=$$ exec "$@"', "sh", shell, *argv[1:]]
    return subprocess.run(wrap, capture_output=True, text=True, timeout=30, env=env)


def _left(d: Path) -> list[str]:
    """Files a run left under a private name."""
    return [p.name for p in d.iterdir() if p.name.startswith(".spark-ops.")]


@pytest.mark.parametrize("shell", SHELLS)
@pytest.mark.parametrize("at", HOOKS)
@pytest.mark.parametrize("how", ["rename", "write", "link"])
def test_an_operators_pause_made_at_any_moment_is_never_removed(
    shell: str, at: str, how: str, tmp_path: Path
) -> None:
    """Before any command of the end: the operator's pause is there after it, as it was made."""
    d = tmp_path / "state"
    d.mkdir()
    pause = d / "pause"
    sha = _take(pause)
    (tmp_path / "op.target").write_text("a link's target\n")
    env = dict(os.environ, PATH=f"{_shims(tmp_path, at)}:{os.environ['PATH']}")
    env.update(HOOK_DIR=str(tmp_path), HOOK_DO=how, OPERATOR=OPERATOR, PAUSE=str(pause))
    res = _end(shell, pause, sha, env)
    fired = (tmp_path / "fired").exists()
    assert res.returncode in (0, 45), res.stderr
    if fired:  # the operator acted: their pause is there, whole
        if how == "link":
            assert pause.is_symlink() and pause.read_text() == "a link's target\n"
        else:
            assert not pause.is_symlink() and pause.read_text() == OPERATOR
    else:  # the command was not run: ours was removed, nothing else happened
        assert res.returncode == 0 and not pause.exists()
    assert _left(d) == [], res.stderr


@pytest.mark.parametrize("shell", SHELLS)
@pytest.mark.parametrize("at", HOOKS)
def test_a_signal_at_any_moment_never_strands_a_pause(shell: str, at: str, tmp_path: Path) -> None:
    """SIGTERM and SIGHUP during the end (an SSH session dropped): it runs to its end."""
    d = tmp_path / "state"
    d.mkdir()
    pause = d / "pause"
    pause.write_text(OPERATOR)  # an operator's pause where ours was
    env = dict(os.environ, PATH=f"{_shims(tmp_path, at)}:{os.environ['PATH']}")
    env.update(HOOK_DIR=str(tmp_path), HOOK_DO="term")
    res = _end(shell, pause, "0" * 64, env)
    assert res.returncode == 45, res.stderr
    assert pause.read_text() == OPERATOR and _left(d) == []
    ours = d / "ours"
    sha = _take(ours)
    if (tmp_path / "fired").exists():
        (tmp_path / "fired").rmdir()
    assert _end(shell, ours, sha, env).returncode == 0 and not ours.exists() and _left(d) == []


@pytest.mark.parametrize("shell", SHELLS)
def test_a_third_pause_made_before_the_link_back_keeps_both(shell: str, tmp_path: Path) -> None:
    """An operator's pause moved aside (not ours), and another made at its name before it is
    linked back: the new one stays, the moved one is kept under the private name stderr names
    (link(2) never clobbers)."""
    d = tmp_path / "state"
    d.mkdir()
    pause = d / "pause"
    pause.write_text("alice: first\n")
    env = dict(os.environ, PATH=f"{_shims(tmp_path, 'ln')}:{os.environ['PATH']}")
    env.update(HOOK_DIR=str(tmp_path), HOOK_DO="rename", OPERATOR=OPERATOR, PAUSE=str(pause))
    res = _end(shell, pause, "0" * 64, env)
    assert res.returncode == 45 and res.stdout == "alice: first\n"
    assert pause.read_text() == OPERATOR
    (kept,) = _left(d)
    assert (d / kept).read_text() == "alice: first\n" and f"kept as {d / kept}" in res.stderr


def test_not_a_regular_file_is_left_as_it_is(tmp_path: Path) -> None:
    """A directory, a FIFO, a symlink at the name: exit 45, untouched, nothing moved aside."""
    for kind in ("dir", "fifo", "link"):
        d = tmp_path / kind
        d.mkdir()
        p = d / "pause"
        if kind == "dir":
            p.mkdir()
        elif kind == "fifo":
            os.mkfifo(p)
        else:
            p.symlink_to(tmp_path / "nowhere")
        res = _end("sh", p, "0" * 64, dict(os.environ))
        assert res.returncode == 45 and "not a regular file" in res.stderr
        mode = p.lstat().st_mode
        assert {"dir": stat.S_ISDIR, "fifo": stat.S_ISFIFO, "link": stat.S_ISLNK}[kind](mode)
        assert _left(d) == []


def test_a_writer_replacing_the_pause_in_a_loop(tmp_path: Path) -> None:
    """A real writer renames an operator's pause over ours at a moment that moves across the
    end's run, until the end has been seen both before and after it many times: after each
    round the operator's pause is there."""
    d = tmp_path / "state"
    d.mkdir()
    pause = d / "pause"
    writer = (
        'i=0; while [ "$i" -lt "$1" ]; do i=$((i + 1)); done; '
        'printf %s "$2" > "$3.new" && mv -f -- "$3.new" "$3"'
    )
    seen = {0: 0, 45: 0}
    delay, deadline = 0, time.monotonic() + 240
    while min(seen.values()) < 20 and time.monotonic() < deadline:
        sha = _take(pause)
        w = subprocess.Popen(["sh", "-c", writer, "sh", str(delay), OPERATOR, str(pause)])
        res = _end("sh", pause, sha, dict(os.environ))
        assert w.wait(timeout=30) == 0
        assert res.returncode in seen, res.stderr
        seen[res.returncode] += 1
        assert pause.read_text() == OPERATOR, (delay, res)
        assert _left(d) == [] and not (d / "pause.new").exists()
        pause.unlink()
        # move the writer later while the end wins, earlier while the writer wins
        delay = delay + 25 if res.returncode == 45 else max(0, delay - 20)
    assert min(seen.values()) >= 20, seen
