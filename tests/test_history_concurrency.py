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

from spark_ops.headlib.atomic import STALE_TMP_S
from spark_ops.headlib.flock import locked
from spark_ops.watchdog import history
from spark_ops.watchdog.contract import history_source

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
    # The next writer removes the staged files the killed writers left, once they are old
    # enough to be provably a dead writer's (their pids are in their names, and gone).
    for staged in tmp_path.glob(".history.tmp.*"):
        os.utime(staged, (time.time() - 2 * STALE_TMP_S,) * 2)
    history.prune(path, stamps=[last], write_journal=False, keep_backups=2)
    assert not list(tmp_path.glob(".history.tmp.*"))


def test_lock_timeout_exit_3(tmp_path: Path) -> None:
    """While someone holds the lock, prune waits, then exits 3 naming the lock."""
    (tmp_path / "h").write_text("1\n2\n")
    lock = tmp_path / "external.lock"
    with locked(str(lock)):
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
            input=history_source().encode(),
            cwd=tmp_path,
            capture_output=True,
            timeout=60,
        )
    assert proc.returncode == 3
    out = json.loads(proc.stdout)
    assert out["error"] == "lock_timeout" and out["lock"] == str(lock)
    assert str(lock) in out["message"] and str(lock) in proc.stderr.decode()
    assert [h["pid"] for h in out["holders"]] == [os.getpid()], "the holder is named"
    assert f"pid {os.getpid()}" in out["message"]
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

    with locked(history.default_lock(path)):
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


# The watchdog's way (tests/fixtures/watchdog_matrix/wd.sh `stamp`): flock on <its history>.lock,
# one `>>` line. It appends a counter instead of `date +%s` so that every lost line is counted.
WATCHDOG_APPENDS = r"""
i=0
while [ ! -e "$2" ]; do
  i=$((i + 1))
  ( flock -w 10 9 || exit 1; echo "$i" >> "$1" ) 9>>"$1.lock" || exit 1
done
echo "$i"
"""


def watchdog_lines(target: Path) -> int:
    """How many of the watchdog's own lines (not our markers) the history holds now."""
    return sum(1 for x in target.read_text().splitlines() if x.isdigit() and int(x) < 10**12)


def race_through_link(
    tmp_path: Path, appends: int, rounds_wanted: int
) -> tuple[int, int, list[str]]:
    """The watchdog appends beside the target while spark-ops appends and prunes a marker through
    a symlink, until the watchdog has appended `appends` lines and we have pruned `rounds_wanted`
    times (a count, not a duration: a busy machine only makes it take longer); returns (watchdog
    appends, prune rounds, the final history's lines)."""
    real = tmp_path / "real"
    real.mkdir()
    target = real / "restarts"
    target.write_text("")
    link = tmp_path / "restarts"
    link.symlink_to(target)
    stop = tmp_path / "stop"
    dog = subprocess.Popen(
        ["bash", "-c", WATCHDOG_APPENDS, "wd", str(target), str(stop)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    rounds, marker = 0, 10**12
    deadline = time.monotonic() + 600  # generous: only a wedged loop reaches it
    try:
        while rounds < rounds_wanted or watchdog_lines(target) < appends:
            assert time.monotonic() < deadline, (
                f"no progress: {rounds} prunes, {watchdog_lines(target)} watchdog appends"
            )
            rounds += 1
            history.append(str(link), stamp=marker + rounds, write_journal=False)
            out = history.prune(
                str(link), stamps=[marker + rounds], write_journal=False, keep_backups=1
            )
            assert out["not_found"] == [], f"round {rounds}: our own marker vanished"
            time.sleep(0.002)  # flock has no fairness: let the waiting watchdog win sometimes
    finally:
        stop.touch()
        printed, _ = dog.communicate(timeout=60)
    assert dog.returncode == 0 and link.is_symlink()
    return int(printed), rounds, target.read_text().splitlines()


def test_prunes_through_a_symlink_lose_no_watchdog_append(tmp_path: Path) -> None:
    """Issue 20 #7: a history reached through a symlink is locked beside the link and beside the
    target (where the watchdog locks it): none of the watchdog's appends made while spark-ops
    appends and prunes through the link is lost, and no marker of ours is left."""
    link = str(tmp_path / "restarts")
    appended, rounds, lines = race_through_link(tmp_path, appends=21, rounds_wanted=20)
    print(f"reached: {appended} watchdog appends, {rounds} prunes")
    lost = sorted(set(range(1, appended + 1)) - {int(x) for x in lines if int(x) < 10**12})
    assert lost == [], f"{len(lost)} of {appended} watchdog appends lost in {rounds} prunes"
    assert lines == [str(i) for i in range(1, appended + 1)], "exactly the watchdog's lines"
    assert appended > 20 and rounds >= 20, "both loops really ran"
    locks = history.history_locks(link)
    assert sorted(locks) == sorted([link + ".lock", str(tmp_path / "real" / "restarts.lock")])
    assert history.history_locks(link, "/run/wd.lock") == ["/run/wd.lock"], "the watchdog's own"
    plain = str(tmp_path / "real" / "restarts")
    assert history.history_locks(plain) == [plain + ".lock"], "no link: the one lock beside it"


def test_only_a_dead_writers_old_staged_file_is_removed(tmp_path: Path) -> None:
    """Issue 20 #7: the prune removes a staged file only when it is provably a dead writer's own
    (atomic_write's name with the writer's pid, that pid gone, untouched for STALE_TMP_S); a live
    writer's, a recent one or another program's temp file is left where it is."""
    path = tmp_path / "h"
    path.write_text("1\n2\n")
    dead = subprocess.Popen(["true"])  # a pid that no longer runs
    dead.wait()
    alive = subprocess.Popen(["sleep", "60"])
    old = time.time() - 2 * STALE_TMP_S
    files = {
        "dead and old": (f".h.tmp.{dead.pid}.abcd1234", old),
        "dead but recent": (f".h.tmp.{dead.pid}.efgh5678", time.time()),
        "old but its writer runs": (f".h.tmp.{alive.pid}.ijkl9012", old),
        "another program's": (".h.tmp.x8Jq2_zz", old),
        "another shape": (f".h.tmp.{dead.pid}.abcd1234.part", old),
    }
    try:
        for name, when in files.values():
            (tmp_path / name).write_text("a writer's staged content\n")
            os.utime(tmp_path / name, (when, when))
        history.prune(str(path), stamps=[1], write_journal=False)
    finally:
        alive.kill()
        alive.wait()
    left = {why for why, (name, _) in files.items() if (tmp_path / name).exists()}
    assert left == set(files) - {"dead and old"}
    assert path.read_text() == "2\n"
