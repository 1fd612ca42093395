"""history.py under contention: a concurrent appender, SIGKILL mid-prune, lock timeouts."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from spark_ops.watchdog import history

HISTORY_PY = Path(history.__file__)

APPENDER = """
import importlib.util, os, sys
spec = importlib.util.spec_from_file_location("h", sys.argv[1])
h = importlib.util.module_from_spec(spec); sys.modules["h"] = h; spec.loader.exec_module(h)
path, stop = sys.argv[2], sys.argv[3]
n = 0
while not os.path.exists(stop):
    n += 1
    h.append(path, stamp=n, lock_timeout=60, write_journal=False)
print(n)
"""


def chosen(stamp: int | float) -> bool:
    """The stamps the pruner removes."""
    return int(stamp) % 3 == 0


@pytest.mark.slow
def test_prune_while_appending(tmp_path: Path) -> None:
    """1,000+ prune rounds against a process appending through the lock as fast as it can."""
    path = str(tmp_path / "history")
    stop = tmp_path / "stop"
    appender = subprocess.Popen(
        [sys.executable, "-c", APPENDER, str(HISTORY_PY), path, str(stop)],
        stdout=subprocess.PIPE,
        text=True,
    )
    rounds = 0
    removed_total = 0
    try:
        while rounds < 1000:
            hist = history.read_history(path)
            assert hist.malformed == [], f"round {rounds}: torn or bad lines {hist.malformed}"
            stamps = hist.stamps()
            assert stamps == sorted(stamps), f"round {rounds}: order broken"
            pick = [s for s in stamps if chosen(s)]
            if not pick:
                time.sleep(0.001)
                continue
            rounds += 1
            out = history.prune(
                path, stamps=pick, lock_timeout=60, write_journal=False, keep_backups=2
            )
            assert out["not_found"] == []
            assert sorted(r["stamp"] for r in out["removed"]) == sorted(pick)
            removed_total += len(pick)
    finally:
        stop.touch()
        out_text, _ = appender.communicate(timeout=60)
    appended = int(out_text)
    assert appender.returncode == 0
    final = history.read_history(path)
    rest = [s for s in final.stamps() if chosen(s)]
    if rest:
        history.prune(path, stamps=rest, write_journal=False)
        removed_total += len(rest)
    final = history.read_history(path)
    assert final.malformed == []
    assert final.stamps() == [s for s in range(1, appended + 1) if not chosen(s)]
    assert removed_total == appended // 3
    assert appended > 100, "the appender really ran alongside"


def _child_loop(path: str, stamp: int) -> None:
    """In a forked child: prune and re-append the same last stamp forever."""
    try:
        while True:
            history.prune(path, stamps=[stamp], write_journal=False, keep_backups=2)
            history.append(path, stamp=stamp, write_journal=False)
    finally:
        os._exit(1)


def _cycle_seconds(path: str, stamp: int) -> float:
    """How long one prune + append of the last stamp takes here (slow disks fsync slowly)."""
    spans = []
    for _ in range(3):
        began = time.perf_counter()
        history.prune(path, stamps=[stamp], write_journal=False, keep_backups=2)
        history.append(path, stamp=stamp, write_journal=False)
        spans.append(time.perf_counter() - began)
    return sorted(spans)[1]


@pytest.mark.slow
def test_sigkill_never_tears(tmp_path: Path) -> None:
    """SIGKILL at random points, 200+ rounds: the file is always exactly the old or new version."""
    path = str(tmp_path / "history")
    last = 1_764_500_000
    lines = [str(1_764_000_000 + 7 * i) for i in range(5_000)] + ["garbage kept", str(last)]
    old = "".join(line + "\n" for line in lines).encode()
    new = "".join(line + "\n" for line in lines[:-1]).encode()
    Path(path).write_bytes(old)
    # Kills land anywhere within a few prune/append cycles. The cycle measured here can be far
    # shorter than in the kill loop (CI disks fsync at very uneven speeds), so while the kills keep
    # landing on one side only, the window doubles every 25 rounds.
    window = max(0.1, 4 * _cycle_seconds(path, last))
    assert Path(path).read_bytes() == old
    rng = random.Random(1234)
    seen = {"old": 0, "new": 0}
    rnd = 0
    give_up = time.monotonic() + 600  # a one-sided run fails in minutes, not after 1000 rounds

    def one_sided() -> bool:
        """True while every kill so far left the same version."""
        return not (seen["old"] and seen["new"])

    while rnd < 200 or (one_sided() and rnd < 1000 and time.monotonic() < give_up):
        if rnd and rnd % 25 == 0 and one_sided():
            window = min(2 * window, 8.0)
        pid = os.fork()
        if pid == 0:
            _child_loop(path, last)
        time.sleep(rng.uniform(0, window))
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        data = Path(path).read_bytes()
        assert data in (old, new), f"round {rnd}: torn file of {len(data)} bytes"
        seen["old" if data == old else "new"] += 1
        rnd += 1
    assert seen["old"] and seen["new"], f"kills should land on both sides: {seen} ({window=:.3f}s)"
    # The next writer removes temp files a killed writer left behind.
    history.prune(path, stamps=[last], write_journal=False, keep_backups=2)
    assert not list(tmp_path.glob(".history.tmp.*"))


def test_lock_timeout_exit_3(tmp_path: Path) -> None:
    """While someone holds the lock, prune waits, then exits 3 naming the lock."""
    (tmp_path / "h").write_text("1\n2\n")
    lock = tmp_path / "external.lock"
    with history.locked(str(lock)):
        proc = subprocess.run(
            [
                sys.executable,
                "-",
                "prune",
                "--history",
                "h",
                "--stamp",
                "1",
                "--lock",
                str(lock),
                "--lock-timeout",
                "0.3",
            ],
            input=HISTORY_PY.read_bytes(),
            cwd=tmp_path,
            capture_output=True,
            timeout=60,
        )
    assert proc.returncode == 3
    out = json.loads(proc.stdout)
    assert out["error"] == "lock_timeout" and out["lock"] == str(lock)
    assert str(lock) in out["message"] and str(lock) in proc.stderr.decode()
    assert (tmp_path / "h").read_text() == "1\n2\n"


def test_lock_timeout_in_process_main_and_thread(tmp_path: Path) -> None:
    """The in-process API times out too, both on the main thread (alarm) and in a thread (poll)."""
    path = str(tmp_path / "h")
    Path(path).write_text("1\n")
    errors: list[BaseException] = []

    def in_thread() -> None:
        """Try to append from a worker thread."""
        try:
            history.append(path, stamp=2, lock_timeout=0.2)
        except BaseException as exc:
            errors.append(exc)

    with history.locked(history.default_lock(path)):
        with pytest.raises(history.LockTimeout, match=r"h\.lock"):
            history.prune(path, stamps=[1], lock_timeout=0.2)
        t = threading.Thread(target=in_thread)
        t.start()
        t.join(10)
    assert len(errors) == 1 and isinstance(errors[0], history.LockTimeout)
    assert Path(path).read_text() == "1\n"


def test_waits_for_lock_then_succeeds(tmp_path: Path) -> None:
    """A prune that waits for a lock released in time goes through."""
    path = str(tmp_path / "h")
    Path(path).write_text("1\n2\n")
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl,sys,time; f=open(sys.argv[1],'w'); fcntl.flock(f, fcntl.LOCK_EX);"
            "print('held', flush=True); time.sleep(0.5)",
            history.default_lock(path),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    out = history.prune(path, stamps=[2], lock_timeout=30)
    holder.wait(10)
    assert out["kept"] == 1 and Path(path).read_text() == "1\n"
