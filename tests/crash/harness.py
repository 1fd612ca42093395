"""A crash-consistency harness: spark-ops as a black box, killed at a point, run again, checked.

A case is (command, kill point, signal, target). The command runs as a subprocess with `--json`
(its stderr prints one JSON line per step transition; `experiment` and `budget prune` print text
lines and log events, read the same way: see `boundary_of`; a load level's lease is its note,
`lease-C64:done`). At the kill point — the k-th time a
boundary is printed, plus an optional delay that lands inside the step — the harness sends the
signal to the tool itself, or SIGKILLs the restart command the watchdog runs on the head (found
under the embedded head's processes by its command line, by pid). Then it runs the same command
again with --yes and checks what the operator relies on:

  (a) every recipe copy is the old or the new text, whole, and all copies agree;
  (b) after the re-run the engine runs what the recipe says (`spark-ops status --json`);
  (c) the history holds exactly the watchdog's own entries (read from its journal), the planned
      ones excepted: nothing lost, nothing left;
  (d) every run that changed something (recipe written, restart triggered, stamp pruned) has an
      audit record (`spark-ops log --json`; distinct `run` ids when records carry one);
  (e) every lock file under the state directories is free (`flock`, whatever its name or key);
  (f) the watchdog's lease: a pause spark-ops made and the kill left lapses by itself (a bounded
      expiry), the re-run leaves none of spark-ops' (its settle step ends the dead run's), and an
      operator's pause found before the case is there, as it was;

and that the operator's own `<recipe>.bak.known-good` is untouched and no staged file is left.
Each case gives one JSON-able record. The cluster is shared by cases: `repair()` puts it back
(the watchdog's own tool for the history, the embedded cluster's control for the engine).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from spark_ops.watchdog import history as wd_history
from spark_ops.watchdog.lease import MAX_LEASE_S, parse_lease

PLANNED_BY = wd_history.DEFAULT_PLANNED_BY
KNOWN_GOOD = ".bak.known-good"  # an operator's own file beside each recipe copy
CAP_LINE = re.compile(r"^(\s*max_num_seqs:)\s*(\d+)(\s*(#.*)?)$")
SIGNALS = {"KILL": signal.SIGKILL, "INT": signal.SIGINT, "TERM": signal.SIGTERM}
RUN_TIMEOUT_S = 240.0  # a run that has not ended by then is SIGKILLed and recorded as hung
AFTER_SIGNAL_S = 60.0  # SIGINT/SIGTERM: the tool's time to end before it is SIGKILLed
LOCK_WAIT_S = 8.0  # the head frees a dead client's lock when it sees the channel close

# `… description` lines of the text progress (experiment) name their step by its description
_DESCRIPTIONS = {
    "write the recipe": "write",
    "force a restart": "restart",
    "follow the boot": "boot",
    "remove exactly the stamp": "prune",
    "check effective args": "verify",
    "report the restart budget": "budget",
}


# ---------------------------------------------------------------- boundaries the tool prints


def boundary_of(line: str) -> str | None:
    """The boundary a line of the tool's stderr marks (`write:running`, `lock:done` …), if any."""
    text = line.rstrip("\n")
    if text.startswith("{"):
        try:
            data = json.loads(text)
        except ValueError:
            return None
        if not isinstance(data, dict):
            return None
        step = data.get("step")
        if isinstance(step, dict) and step.get("name") and step.get("status"):
            return f"{step['name']}:{step['status']}"
        if data.get("event") == "lock taken":
            return "lock:done"
        return None
    if text.startswith("… "):
        for prefix, name in _DESCRIPTIONS.items():
            if text[2:].startswith(prefix):
                return f"{name}:running"
        return f"{text[2:].split(' ', 1)[0]}:running"
    m = re.match(r"^([✓✗]) ([a-z-]+) \(", text)
    if m:
        return f"{m.group(2)}:{'done' if m.group(1) == '✓' else 'failed'}"
    if re.match(r"^\[\d+/\d+\] ", text):
        return "config:running"
    m = re.match(r"^  C=(\d+): ", text)
    if m:
        return f"bench-C{m.group(1)}:done"
    if text.startswith("note: restoring"):
        return "restore:running"
    m = re.match(r"^note: concurrency (\d+): watchdog paused", text)
    if m:  # a load level's lease taken (the level's requests follow)
        return f"lease-C{m.group(1)}:done"
    return None


def human_lines(text: str, limit: int = 6000) -> str:
    """What the operator saw: stderr without the boot's JSON event lines, its tail kept."""
    keep = [
        li
        for li in text.splitlines()
        if not (li.startswith('{"event": "boot-') or li.startswith('{"step"'))
    ]
    out = "\n".join(keep)
    return out[-limit:]


@dataclass(frozen=True)
class KillPoint:
    """Where to interrupt: the `occurrence`-th `boundary` (or the start), then `delay` seconds."""

    boundary: str  # `write:running` …; "start": when the process has started
    occurrence: int = 1
    delay: float = 0.0
    signal: str = "KILL"  # KILL, INT, TERM (to the tool); ignored for target restart-command
    target: str = "tool"  # tool | restart-command | staged (the tool SIGKILLs itself once every
    # node staged its write, before any rename: the boundary is then ignored)

    @property
    def label(self) -> str:
        """A short name for tables and test ids."""
        at = self.boundary if self.occurrence == 1 else f"{self.boundary}#{self.occurrence}"
        if self.delay:
            at += f"+{self.delay:.2f}s"
        if self.target == "staged":
            return "SIGKILL@staged"
        who = "restart-cmd" if self.target == "restart-command" else f"SIG{self.signal}"
        return f"{who}@{at}"


@dataclass
class Interrupted:
    """How the interrupted run went."""

    code: int | None
    stderr: str
    stdout: str
    fired: bool  # the signal was sent (the kill point was reached)
    killed_pid: int | None = None  # restart-command target: the pid killed
    escalated: bool = False  # SIGINT/SIGTERM not obeyed within AFTER_SIGNAL_S: SIGKILLed
    hung: bool = False
    boundaries: list[str] = field(default_factory=list)


def pids_running(word: str, root: Path) -> list[int]:
    """Pids of the processes whose command line holds the word `word` and names a path under
    `root` (one embedded cluster's), by /proc."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        words = [a.decode("utf-8", "replace") for a in argv]
        if word in words and any(str(root) in w for w in words):
            found.append(int(entry.name))
    return found


def _restart_command_pids(root: Path) -> list[int]:
    """Pids of the watchdog's `--restart-now` processes of this embedded cluster."""
    return pids_running("--restart-now", root)


# `python -c` in place of `-m spark_ops.cli.main` for target "staged": the writer's first rename
# SIGKILLs the tool instead (every node staged, none renamed: the staged files stay on the nodes)
KILL_AFTER_STAGING = """
import os, signal
import spark_ops.remote.writes as writes
async def commit(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGKILL)
writes.commit = commit
from spark_ops.cli.main import main
main()
"""


def run_interrupted(
    env: dict[str, str], args: list[str], point: KillPoint | None, root: Path
) -> Interrupted:
    """Run `spark-ops ARGS`; at `point` signal the tool or SIGKILL the restart command."""
    out_path = root / f"stdout.{os.getpid()}.{threading.get_ident()}"
    staged = point is not None and point.target == "staged"
    entry = ["-c", KILL_AFTER_STAGING] if staged else ["-m", "spark_ops.cli.main"]
    with open(out_path, "wb") as out:
        proc = subprocess.Popen(  # --log-json: the log events that mark boundaries (lock taken)
            [sys.executable, *entry, "--log-json", *args],
            env=env, stdout=out, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
            text=True, errors="replace", start_new_session=True,
        )  # fmt: skip
    assert proc.stderr is not None
    res = Interrupted(code=None, stderr="", stdout="", fired=False)
    seen: Counter[str] = Counter()
    lines: list[str] = []
    started = time.monotonic()

    def fire() -> None:
        """Send the signal (to the tool), or SIGKILL the restart command once it shows."""
        if point is None or point.target == "staged":
            return
        if point.target == "restart-command":
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline and proc.poll() is None:
                pids = _restart_command_pids(root)
                if pids:
                    time.sleep(point.delay)
                    for pid in _restart_command_pids(root):
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(pid, signal.SIGKILL)
                            res.killed_pid = pid
                    res.fired = res.killed_pid is not None
                    return
                time.sleep(0.02)
            return
        if proc.poll() is None:
            proc.send_signal(SIGNALS[point.signal])
            res.fired = True
            if point.signal != "KILL":
                threading.Timer(AFTER_SIGNAL_S, escalate).start()

    def escalate() -> None:
        """SIGKILL a tool that did not end after SIGINT/SIGTERM."""
        if proc.poll() is None:
            res.escalated = True
            proc.kill()

    def hang() -> None:
        """SIGKILL a run that went on past RUN_TIMEOUT_S."""
        if proc.poll() is None:
            res.hung = True
            proc.kill()

    def schedule() -> None:
        """Fire now, or after the point's delay (in a thread: the pipe keeps being read)."""
        delay = point.delay if point and point.target == "tool" else 0.0
        if delay <= 0 and not (point and point.target == "restart-command"):
            fire()
        else:
            threading.Timer(delay, fire).start()

    guard = threading.Timer(RUN_TIMEOUT_S, hang)
    guard.daemon = True
    guard.start()
    if point is not None and point.boundary == "start":
        schedule()
    for line in proc.stderr:
        lines.append(line)
        b = boundary_of(line)
        if b is None:
            continue
        seen[b] += 1
        res.boundaries.append(b)
        if point is not None and b == point.boundary and seen[b] == point.occurrence:
            schedule()
    res.code = proc.wait()
    guard.cancel()
    if staged:
        res.fired = res.code == -signal.SIGKILL
    res.stderr = "".join(lines)
    res.stdout = out_path.read_text(errors="replace")
    out_path.unlink()
    _ = started
    return res


# ---------------------------------------------------------------- the cluster the cases share


def cap_of(text: str) -> int | None:
    """The recipe's max_num_seqs (its defaults), or None when it does not parse."""
    try:
        data = yaml.safe_load(text)
        return int(data["defaults"]["max_num_seqs"])
    except (yaml.YAMLError, TypeError, KeyError, ValueError):
        return None


def whole(text: str, old: str, caps: Iterable[int], others: Iterable[str] = ()) -> bool:
    """True when text is `old`, one of `others`, or `old` with only its cap line set to a cap."""
    if text == old or text in set(others):
        return True
    a, b = text.splitlines(), old.splitlines()
    if len(a) != len(b) or text.endswith("\n") != old.endswith("\n"):
        return False
    for x, y in zip(a, b, strict=True):
        if x != y and not (CAP_LINE.match(x) and CAP_LINE.match(y)):
            return False
    return cap_of(text) in set(caps)


def _flock_free(path: Path) -> bool:
    """Whether an exclusive flock on path can be taken right now (then released)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def _lock_holders() -> dict[int, list[int]]:
    """Inode -> pids holding a lock on it, from /proc/locks."""
    holders: dict[int, list[int]] = {}
    with contextlib.suppress(OSError):
        for line in Path("/proc/locks").read_text().splitlines():
            parts = line.split()
            with contextlib.suppress(IndexError, ValueError):
                i = 1 if parts[1] != "->" else 2
                pid, dev = int(parts[i + 3]), parts[i + 4]
                holders.setdefault(int(dev.rsplit(":", 1)[1]), []).append(pid)
    return holders


def _cmdline(pid: int) -> str:
    """A process's command line, words joined by spaces ('' when it is gone)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    except OSError:
        return ""


def _watchdog_loop(cmdline: str) -> bool:
    """The watchdog daemon's own loop (it holds its state lock while it runs), not an action."""
    return "refwatchdog.daemon" in cmdline and "--restart-now" not in cmdline


class CrashCluster:
    """One embedded cluster for many cases: recipe on several nodes, private state dir, HOME."""

    def __init__(self, root: Path, *, nodes: int = 2, recipe_nodes: int = 2) -> None:
        """Start the embedded cluster in root and write the harness's two inventories."""
        from spark_ops.sim.cluster import SimOptions
        from spark_ops.sim.control import up, wait_serving

        self.root = root.resolve()
        opts = SimOptions(nodes=nodes, time_scale=20.0, boot_scale=0.25, executor="ray")
        self.state = up(self.root / "sim", opts)
        wait_serving(self.state)
        self.sim_root = self.root / "sim"
        self.head = self.sim_root / "nodes" / "node1"
        self.names = [f"node{i}" for i in range(1, nodes + 1)]
        self.recipe_nodes = self.names[:recipe_nodes]
        inv = yaml.safe_load(Path(self.state["inventory"]).read_text())
        ((name, cluster),) = inv["clusters"].items()
        self.rel_recipe = cluster["recipe"]["path"].removeprefix("~/")
        cluster["recipe"]["nodes"] = self.recipe_nodes
        cluster["state_dir"] = str(self.root / "state")
        (self.root / "state").mkdir(exist_ok=True)
        self.inventory = self.root / "inventory.yaml"
        self.inventory.write_text(yaml.safe_dump(inv, sort_keys=False))
        # a second inventory naming the same head, recipe and watchdog, its own state dir
        second = json.loads(json.dumps(inv))
        second["clusters"] = {f"{name}-b": second["clusters"].pop(name)}
        second["clusters"][f"{name}-b"]["state_dir"] = str(self.root / "state-b")
        (self.root / "state-b").mkdir(exist_ok=True)
        self.inventory_b = self.root / "inventory-b.yaml"
        self.inventory_b.write_text(yaml.safe_dump(second, sort_keys=False))
        self.home = self.root / "operator-home"
        self.home.mkdir(exist_ok=True)
        head_text = self.recipe_copies[0].read_text()
        for p in self.recipe_copies:
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(head_text)
            Path(f"{p}{KNOWN_GOOD}").write_text(head_text.replace("#", "# known good:", 1))
        self.baseline_history = self.history.read_bytes()
        self.last_audit: list[dict[str, Any]] | None = None  # the audit as the last case left it

    # -- paths
    @property
    def recipe_copies(self) -> list[Path]:
        """Every node's copy of the recipe (the inventory's recipe.nodes), head first."""
        return [self.sim_root / "nodes" / n / self.rel_recipe for n in self.recipe_nodes]

    @property
    def history(self) -> Path:
        """The watchdog's restart history on the head."""
        return self.head / ".local" / "state" / "spark-watchdog" / "restarts"

    @property
    def journal(self) -> Path:
        """The reference watchdog's journal beside the history."""
        return Path(wd_history.default_journal(str(self.history)))

    def lock_dirs(self) -> list[Path]:
        """Where lock files of spark-ops and the watchdog live (any name, any key)."""
        dirs = [self.root / "state", self.root / "state-b", self.history.parent]
        return [*dirs, *{p.parent for p in self.recipe_copies}]

    def env(self, second: bool = False) -> dict[str, str]:
        """The CLI's environment: this cluster's inventory, a private HOME."""
        env = dict(os.environ)
        env["SPARK_OPS_INVENTORY"] = str(self.inventory_b if second else self.inventory)
        env.pop("SPARK_OPS_CLUSTER", None)
        env.pop("SPARK_OPS_FLEET", None)
        env["HOME"] = str(self.home)
        env["COLUMNS"] = "120"
        return env

    def close(self) -> None:
        """Stop the embedded cluster."""
        from spark_ops.sim.control import down

        down(self.sim_root)

    # -- the watchdog's probe, for a case that needs a short one
    @property
    def watchdog_config(self) -> Path:
        """The reference watchdog's config on the head."""
        return self.head / ".config" / "spark-watchdog.yaml"

    def probe_timeout(self) -> float:
        """The probe timeout the watchdog's config holds now."""
        m = re.search(r"^  timeout: ([0-9.]+)$", self.watchdog_config.read_text(), re.M)
        assert m is not None, "the embedded watchdog's config names its probe timeout"
        return float(m.group(1))

    def set_probe_timeout(self, seconds: float) -> None:
        """The watchdog's probe timeout, in its config and in both inventories alike, the
        watchdog (and its engine) restarted to read it; the engine serving again."""
        from spark_ops.sim.control import restart_watchdog, wait_serving

        text = self.watchdog_config.read_text()
        self.watchdog_config.write_text(
            re.sub(r"^  timeout: [0-9.]+$", f"  timeout: {seconds:g}", text, count=1, flags=re.M)
        )
        for inv in (self.inventory, self.inventory_b):
            data = yaml.safe_load(inv.read_text())
            for cluster in data["clusters"].values():
                cluster["watchdog"]["probe"]["timeout_s"] = seconds
            inv.write_text(yaml.safe_dump(data, sort_keys=False))
        restart_watchdog(self.sim_root)
        wait_serving(self.state)

    # -- the watchdog's own tool
    def history_tool(self, *args: str) -> dict[str, Any]:
        """Run the watchdog's history tool (spark_ops/watchdog/history.py) on the head's history."""
        res = subprocess.run(
            [sys.executable, "-m", "spark_ops.watchdog.history", args[0],
             "--history", str(self.history), *args[1:]],
            capture_output=True, text=True, check=False, timeout=60,
        )  # fmt: skip
        out: dict[str, Any] = json.loads(res.stdout or "{}")
        return out

    def watchdog_append(self, reason: str = "probe failed 3 times") -> int:
        """An automatic restart stamp, appended as the watchdog does (not forced, by watchdog)."""
        return int(self.history_tool("append", "--reason", reason, "--by", "watchdog")["stamp"])

    def planned_append(self, op: str = "apply") -> int:
        """A planned stamp as a dead run leaves it: forced, by spark-ops, never pruned."""
        r = self.history_tool(
            "append", "--forced", "--reason", f"planned restart (spark-ops {op})",
            "--by", f"{PLANNED_BY}:harness",
        )  # fmt: skip
        return int(r["stamp"])

    def colleague_edit(self, node: int = 1, value: int | None = None) -> None:
        """A colleague edits one node's copy in place: the cap set to value (a comment kept)."""
        p = self.recipe_copies[min(node, len(self.recipe_copies) - 1)]
        text = p.read_text()
        v = value if value is not None else (cap_of(text) or 6) + 1
        lines = [
            CAP_LINE.sub(lambda m: f"{m.group(1)} {v}{m.group(3)}", li) for li in text.split("\n")
        ]
        p.write_text("\n".join(lines))

    # -- snapshot and the checks
    def snapshot(self) -> dict[str, Any]:
        """Recipe copies, history lines, journal length, dot-files, operator files, backups."""
        dirs = {p.parent for p in self.recipe_copies} | {self.history.parent}
        return {
            "recipes": [
                p.read_bytes().decode("utf-8", "surrogateescape") for p in self.recipe_copies
            ],
            "history": self.history.read_bytes().decode("utf-8", "surrogateescape").splitlines(),
            "journal_n": len(wd_history.read_journal(str(self.journal))[0]),
            "pause": self.pause_text(),
            "dotfiles": sorted(str(f) for d in dirs for f in d.iterdir() if f.name.startswith(".")),
            "known_good": {
                str(p): Path(f"{p}{KNOWN_GOOD}").read_bytes().hex() for p in self.recipe_copies
            },
            "backups": {
                str(b): b.read_text(errors="replace")
                for p in self.recipe_copies
                for b in p.parent.glob(p.name + ".bak.*")
                if not b.name.endswith(KNOWN_GOOD)
            },
        }

    @property
    def pause(self) -> Path:
        """The watchdog's pause file on the head (the inventory's watchdog.pause_file)."""
        return self.history.parent / "pause"

    def pause_text(self) -> str | None:
        """What the pause file holds now (None: no file)."""
        try:
            return self.pause.read_bytes().decode("utf-8", "surrogateescape")
        except FileNotFoundError:
            return None

    def journal_since(self, n: int) -> list[dict[str, Any]]:
        """Journal records appended after the first n."""
        return wd_history.read_journal(str(self.journal))[0][n:]

    def planned_ever(self) -> Counter[str]:
        """Stamps the journal marks planned (forced by spark-ops, or marked), as history lines."""
        recs = wd_history.read_journal(str(self.journal))[0]
        # the planned rule is the watchdog history's own (the one prune --planned applies)
        return Counter(str(int(r["stamp"])) for r in recs if wd_history.is_planned(r, PLANNED_BY))

    def locks_held(self) -> list[str]:
        """Lock files still held after LOCK_WAIT_S (polled: the watchdog takes some briefly),
        each with its holders; the watchdog loop's own state lock is not counted."""
        deadline = time.monotonic() + LOCK_WAIT_S
        while True:
            held = []
            holders = _lock_holders()
            for d in self.lock_dirs():
                for f in sorted(d.glob("*.lock")) if d.is_dir() else []:
                    if _flock_free(f):
                        continue
                    with contextlib.suppress(OSError):
                        pids = holders.get(f.stat().st_ino, [])
                        who = [_cmdline(p) for p in pids]
                        if who and all(_watchdog_loop(w) for w in who):
                            continue
                        named = [f"{p}: {w[:160]}" for p, w in zip(pids, who, strict=True)]
                        held.append(f"{f} (held by {'; '.join(named) or '?'})")
            if not held or time.monotonic() > deadline:
                return held
            time.sleep(0.2)

    def audit(self, second: bool = False) -> list[dict[str, Any]]:
        """The audit records `spark-ops log --json` shows (empty when it cannot be read)."""
        res = subprocess.run(
            [sys.executable, "-m", "spark_ops.cli.main", "log", "--json", "--limit", "1000"],
            env=self.env(second), capture_output=True, text=True, check=False, timeout=120,
        )  # fmt: skip
        with contextlib.suppress(ValueError):
            data = json.loads(res.stdout)
            if isinstance(data, list):
                return data
            if isinstance(data, dict):
                return list(data.get("entries") or data.get("records") or [])
        return []

    def engine(self, wait_s: float = 20.0) -> dict[str, Any]:
        """`spark-ops status --json`'s engine (waiting up to wait_s while it is not up)."""
        deadline = time.monotonic() + wait_s
        while True:
            res = subprocess.run(
                [sys.executable, "-m", "spark_ops.cli.main", "status", "--json"],
                env=self.env(), capture_output=True, text=True, check=False, timeout=120,
            )  # fmt: skip
            eng: dict[str, Any] = {}
            with contextlib.suppress(ValueError, AttributeError):
                eng = json.loads(res.stdout).get("engine") or {}
            if eng.get("up") or time.monotonic() > deadline:
                return eng
            time.sleep(0.5)

    # -- putting the cluster back for the next case
    def repair(self, engine: dict[str, Any] | None = None) -> list[str]:
        """Undo what a case left (history, copies, engine, markers); return what was repaired."""
        from spark_ops.sim.control import restart_watchdog

        done = []
        head = self.recipe_copies[0].read_bytes()
        for p in self.recipe_copies[1:]:
            if p.read_bytes() != head:
                p.write_bytes(head)
                done.append(f"copy {p.parent.parent.name} set to the head's")
        base = Counter(self.baseline_history.decode().splitlines())
        now = Counter(self.history.read_text().splitlines())
        extra = now - base
        if extra:
            args = [a for s in extra for a in ("--stamp", s)]
            self.history_tool("prune", *args, "--by", "harness-reset", "--reason", "reset")
            done.append(f"history: removed {sorted(extra.elements())}")
        kept = [
            *(self.home / ".local" / "state" / "spark-ops").glob("experiment-*.json"),
            *self.root.glob("experiment-*.json"),
        ]
        for left in kept:
            left.unlink()  # an unfinished experiment a killed case left: the next case starts anew
            done.append(f"removed {left.name}")
        for marker in ("gave-up", "pause"):
            f = self.history.parent / marker
            if f.exists():
                f.unlink()
                done.append(f"removed {marker}")
        eng = engine if engine is not None else self.engine(wait_s=5)
        want = cap_of(head.decode())
        have = (eng.get("effective") or {}).get("max_num_seqs") if eng.get("up") else None
        if have != want or "removed gave-up" in done:
            restart_watchdog(self.sim_root)
            from spark_ops.sim.control import wait_serving

            wait_serving(self.state)
            done.append(f"engine restarted from the recipe (it ran {have}, recipe {want})")
        return done


# ---------------------------------------------------------------- commands


@dataclass
class Command:
    """A command of the sweep: how to arrange the cluster for it and what it may write."""

    name: str
    arrange: Callable[[CrashCluster], tuple[list[str], dict[str, Any]]]
    changes_recipe: bool = True


def _apply(c: CrashCluster) -> tuple[list[str], dict[str, Any]]:
    """apply the other of 6 and 64 than the recipe holds."""
    old = cap_of(c.recipe_copies[0].read_text()) or 6
    target = 6 if old == 64 else 64
    args = ["apply", "--max-num-seqs", str(target), "--yes", "--json", "--no-drain"]
    return args, {"caps": [old, target], "target": target}


def _restart(c: CrashCluster) -> tuple[list[str], dict[str, Any]]:
    """restart: the recipe must not change."""
    return ["restart", "--yes", "--json", "--no-drain"], {"caps": []}


def _rollback(c: CrashCluster) -> tuple[list[str], dict[str, Any]]:
    """rollback after a completed apply (so there is a backup to roll back to)."""
    args, _ = _apply(c)
    res = subprocess.run(
        [sys.executable, "-m", "spark_ops.cli.main", *args],
        env=c.env(), capture_output=True, text=True, check=False, timeout=240,
    )  # fmt: skip
    c.last_audit = None  # that apply wrote its own record
    if res.returncode != 0:
        raise RuntimeError(
            f"arranging rollback: apply exited {res.returncode}: {res.stderr[-800:]}"
        )
    return ["rollback", "--yes", "--json", "--no-drain"], {"caps": [6, 64]}


def _prune_planned(c: CrashCluster) -> tuple[list[str], dict[str, Any]]:
    """budget prune --planned after a dead run's planned stamp."""
    stamp = c.planned_append()
    return ["budget", "prune", "--planned", "--yes", "--json"], {"caps": [], "stamp": stamp}


def _prune_stamp(c: CrashCluster) -> tuple[list[str], dict[str, Any]]:
    """budget prune --stamp S of a dead run's planned stamp."""
    stamp = c.planned_append()
    args = ["budget", "prune", "--stamp", str(stamp), "--yes", "--json"]
    return args, {"caps": [], "stamp": stamp}


def _experiment(c: CrashCluster) -> tuple[list[str], dict[str, Any]]:
    """experiment 6,64 with the tiniest bench (one level, 4 tokens), measuring both."""
    args = [
        "experiment", "--max-num-seqs", "6,64", "--yes", "--concurrency", "1",
        "--output-tokens", "4", "--measure-all", "--no-drain",
        "--json", str(c.root / "experiment.json"),
    ]  # fmt: skip
    return args, {"caps": [6, 64, cap_of(c.recipe_copies[0].read_text()) or 6]}


def _experiment_leased_level(c: CrashCluster) -> tuple[list[str], dict[str, Any]]:
    """experiment at cap 6, levels 1,64: level 64 queues the probe 10 rounds (at the short probe
    timeout the case sets) and runs under a lease of the experiment-load run; the kill lands
    inside it (boundary `lease-C64:done`, the note of its lease)."""
    args = [
        "experiment", "--max-num-seqs", "6", "--concurrency", "1,64", "--output-tokens", "128",
        "--yes", "--no-drain", "--state", str(c.root / "experiment-lease.json"),
    ]  # fmt: skip
    return args, {"caps": [6, cap_of(c.recipe_copies[0].read_text()) or 6]}


COMMANDS: dict[str, Command] = {
    "apply": Command("apply", _apply),
    "restart": Command("restart", _restart, changes_recipe=False),
    "rollback": Command("rollback", _rollback),
    "prune-planned": Command("prune-planned", _prune_planned, changes_recipe=False),
    "prune-stamp": Command("prune-stamp", _prune_stamp, changes_recipe=False),
    "experiment": Command("experiment", _experiment),
    "experiment-leased-level": Command("experiment-leased-level", _experiment_leased_level),
}

# the boundaries each command prints on a clean run (tests/crash: checked by the reference run)
STEPS = ["write", "lease", "restart", "boot", "prune", "verify", "budget", "release"]
_EXPERIMENT_CONFIG = ["config:running", *(f"{s}:{st}" for s in STEPS for st in ("running", "done"))]
BOUNDARIES: dict[str, list[tuple[str, int]]] = {
    "apply": [(f"{s}:{st}", 1) for s in STEPS for st in ("running", "done")],
    "rollback": [(f"{s}:{st}", 1) for s in STEPS for st in ("running", "done")],
    "restart": [(f"{s}:{st}", 1) for s in STEPS[1:] for st in ("running", "done")],
    "prune-planned": [("start", 1), ("lock:done", 1)],
    "prune-stamp": [("start", 1), ("lock:done", 1)],
    "experiment": [
        *((b, k) for k in (1, 2) for b in _EXPERIMENT_CONFIG),
        ("bench-C1:done", 1),
        ("bench-C1:done", 2),
        ("restore:running", 1),
    ],
    "experiment-leased-level": [("lease-C64:done", 1)],
}


# ---------------------------------------------------------------- one case


@dataclass
class CaseResult:
    """One case's record: what ran, how it ended, what each check found."""

    command: str
    point: str
    signal: str
    target: str
    argv: list[str]
    fired: bool
    killed_exit: int | None
    rerun_exit: int | None
    escalated: bool
    checks: dict[str, bool]
    problems: list[str]
    state: dict[str, Any]
    killed_lines: str
    rerun_lines: str
    repaired: list[str]
    seconds: float

    @property
    def ok(self) -> bool:
        """Every check held."""
        return all(self.checks.values())

    def record(self) -> dict[str, Any]:
        """The JSON line of this case."""
        return {**asdict(self), "ok": self.ok}


def changes(c: CrashCluster, a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """What a run between snapshots a and b changed: recipe written, restart triggered, pruned."""
    what = []
    if a["recipes"] != b["recipes"]:
        what.append("recipe written")
    recs = c.journal_since(a["journal_n"])[: b["journal_n"] - a["journal_n"]]
    if any(wd_history.is_planned(r, PLANNED_BY) for r in recs):
        what.append("restart triggered")
    if any(
        r.get("action") == "prune" and str(r.get("by", "")).startswith(PLANNED_BY) for r in recs
    ):
        what.append("stamp pruned")
    return what


def _lasting(paths: list[str], settle_s: float = 3.0) -> list[str]:
    """The staged files still there after settle_s: a live writer's (the watchdog rewriting its
    state file as the snapshot was taken) is renamed away within moments; a leftover stays."""
    end = time.monotonic() + settle_s
    while paths and time.monotonic() < end:
        time.sleep(0.2)
        paths = [p for p in paths if os.path.lexists(p)]
    return paths


def run_case(c: CrashCluster, command: str, point: KillPoint) -> CaseResult:
    """Arrange, run interrupted at point, re-run with --yes, check (a)–(e), repair."""
    started = time.monotonic()
    cmd = COMMANDS[command]
    args, expect = cmd.arrange(c)
    before = c.snapshot()
    audit_before = c.last_audit if c.last_audit is not None else c.audit()
    killed = run_interrupted(c.env(), args, point, c.root)
    mid = c.snapshot()
    held_mid = c.locks_held()
    rerun = run_interrupted(c.env(), args, None, c.root)
    if rerun.code != 0 and "--resume" in rerun.stderr and command.startswith("experiment"):
        # the tool's own hint for an unfinished experiment: continue it (recorded as followed)
        rerun = run_interrupted(c.env(), [*args, "--resume"], None, c.root)
        rerun.stderr = "(followed the hint: --resume)\n" + rerun.stderr
    after = c.snapshot()
    problems: list[str] = []
    checks: dict[str, bool] = {}

    # (a) every copy old or new, whole; all copies agree — after the kill and after the re-run
    others = list(before["backups"].values()) if command == "rollback" else []
    torn = []
    for when, snap in (("killed", mid), ("rerun", after)):
        for i, text in enumerate(snap["recipes"]):
            if not whole(text, before["recipes"][i], expect["caps"], others):
                torn.append(f"{when}: {c.recipe_nodes[i]} holds neither the old nor the new text")
        if len(set(snap["recipes"])) > 1:
            caps = [cap_of(t) for t in snap["recipes"]]
            torn.append(
                f"{when}: the copies disagree (caps {dict(zip(c.recipe_nodes, caps, strict=True))})"
            )
    checks["a_recipe_whole_and_agreeing"] = not torn
    problems += torn
    if command == "apply" and rerun.code == 0 and cap_of(after["recipes"][0]) != expect["target"]:
        problems.append(f"rerun exit 0 but the recipe's cap is {cap_of(after['recipes'][0])}")
        checks["a_recipe_whole_and_agreeing"] = False

    # (b) after the re-run the engine runs what the recipe says
    eng = c.engine()
    want = cap_of(after["recipes"][0])
    have = (eng.get("effective") or {}).get("max_num_seqs") if eng.get("up") else None
    checks["b_engine_runs_recipe"] = have == want
    if have != want:
        problems.append(
            f"engine runs max_num_seqs={have} (up: {eng.get('up')}), the recipe says {want}"
        )

    # (c) history = before's entries minus planned ones + the watchdog's automatic entries
    planned = c.planned_ever()
    new = c.journal_since(before["journal_n"])
    automatic = Counter(
        str(int(r["stamp"]))
        for r in new
        if r.get("action", "restart") in ("restart", "append")
        and not wd_history.is_planned(r, PLANNED_BY)
        and isinstance(r.get("stamp"), (int, float))
    )
    kept = Counter(li for li in before["history"] if li.strip() not in planned)
    expected = kept + automatic
    actual = Counter(after["history"])
    lost, left = expected - actual, actual - expected
    checks["c_history_exact"] = not lost and not left
    if lost:
        problems.append(f"history lost {sorted(lost.elements())}")
    if left:
        problems.append(f"history left {sorted(left.elements())} (planned: {sorted(planned)})")

    # (d) every run that changed something has an audit record
    killed_changed, rerun_changed = changes(c, before, mid), changes(c, mid, after)
    audit_after = c.audit()
    c.last_audit = audit_after
    # new = not among the records seen before the case (by their head-clock time and run id);
    # never by count: the log shows its last 1,000 entries, and a long sweep writes more
    seen = {
        (r.get("when"), r.get("run"), r.get("phase")) for r in audit_before if isinstance(r, dict)
    }
    new_records = [
        r for r in audit_after
        if isinstance(r, dict) and (r.get("when"), r.get("run"), r.get("phase")) not in seen
    ]  # fmt: skip
    runs = {r.get("run") for r in new_records if isinstance(r, dict) and r.get("run")}
    have_records = len(runs) if runs else len(new_records)
    need = int(bool(killed_changed)) + int(bool(rerun_changed))
    checks["d_audit_complete"] = have_records >= need
    if have_records < need:
        problems.append(
            f"audit: {have_records} new record(s) for {need} changing run(s) "
            f"(killed run: {killed_changed or 'nothing'}; re-run: {rerun_changed or 'nothing'})"
        )

    # (e) the lock is free (after the kill, and after the re-run)
    held = c.locks_held()
    checks["e_lock_free"] = not held and not held_mid
    if held or held_mid:
        problems.append(f"locks held: after the kill {held_mid}, after the re-run {held}")

    # the operator's own file untouched; no staged file left
    touched = [p for p, h in after["known_good"].items() if h != before["known_good"].get(p)]
    checks["operator_file_untouched"] = not touched
    if touched:
        problems.append(f"operator's file touched beside {touched}")
    strays = sorted(set(after["dotfiles"]) - set(before["dotfiles"]))
    strays = _lasting([s for s in strays if ".spark-ops." in s or ".tmp." in s])
    checks["no_staged_left"] = not strays
    if strays:
        problems.append(f"staged files left: {strays}")
    checks["rerun_ok"] = rerun.code == 0
    if rerun.code != 0:
        problems.append(f"the re-run exited {rerun.code}")
    # (f) the lease: a pause spark-ops made after the kill lapses by itself (an expiry within
    # MAX_LEASE_S of its taking); after the re-run none of spark-ops' is left (its settle step
    # ended the dead run's); an operator's pause found before is there as it was
    left_lease = []
    for when, snap in (("killed", mid), ("rerun", after)):
        lease = parse_lease(snap["pause"]) if snap["pause"] is not None else None
        if lease is None:
            continue
        bounded = lease.taken is not None and lease.expires - lease.taken <= MAX_LEASE_S
        if when == "rerun" or not bounded:
            left_lease.append(f"{when}: the pause file holds {snap['pause'][:200]!r}")
    if before["pause"] is not None and after["pause"] != before["pause"]:
        left_lease.append(f"the operator's pause {before['pause']!r} became {after['pause']!r}")
    checks["f_lease_ended"] = not left_lease
    problems += left_lease
    checks["kill_point_reached"] = killed.fired
    if not killed.fired:
        problems.append(f"the kill point was never reached (boundaries: {killed.boundaries})")

    state = {
        "pause_after_kill": mid["pause"],
        "pause_after_rerun": after["pause"],
        "caps_after_kill": [cap_of(t) for t in mid["recipes"]],
        "caps_after_rerun": [cap_of(t) for t in after["recipes"]],
        "engine_args_max_num_seqs": have,
        "history_before": before["history"],
        "history_after": after["history"],
        "killed_changed": killed_changed,
        "rerun_changed": rerun_changed,
        "audit_new": [
            {k: r.get(k) for k in ("run", "outcome") if k in r}
            | {"op": (r.get("what") or {}).get("operation")}
            for r in new_records
        ],
        "boundaries_seen": killed.boundaries,
        "restart_command_pid_killed": killed.killed_pid,
    }
    repaired = c.repair(eng)
    return CaseResult(
        command=command, point=point.label, signal=point.signal, target=point.target,
        argv=args, fired=killed.fired, killed_exit=killed.code, rerun_exit=rerun.code,
        escalated=killed.escalated, checks=checks, problems=problems, state=state,
        killed_lines=human_lines(killed.stderr), rerun_lines=human_lines(rerun.stderr, 3000),
        repaired=repaired, seconds=round(time.monotonic() - started, 1),
    )  # fmt: skip


# ---------------------------------------------------------------- kill point plans


def boundary_points(command: str, signal_name: str = "KILL") -> list[KillPoint]:
    """Every step boundary of a command, the signal sent at once."""
    return [KillPoint(b, k, signal=signal_name) for b, k in BOUNDARIES[command]]


def random_points(
    command: str, n: int, seed: int, signal_name: str = "KILL", max_delay: float = 1.5
) -> list[KillPoint]:
    """n points inside steps: a boundary, then a fixed-seed delay."""
    rng = random.Random(f"{seed}:{command}:{signal_name}")
    pool = BOUNDARIES[command]
    points = []
    for _ in range(n):
        b, k = rng.choice(pool)
        # inside the step: only the boot (and an experiment's sweep) lasts seconds; a delay past
        # a short step's end would land after the run ended and reach nothing
        longest = max_delay if b.split(":")[0] in ("boot", "sweep", "bench") else 0.3
        delay = round(rng.uniform(0.05, min(max_delay, longest)), 2)
        points.append(KillPoint(b, k, delay=delay, signal=signal_name))
    return points


def restart_command_points(n: int, seed: int) -> list[KillPoint]:
    """The restart command SIGKILLed once it shows on the head, after a fixed-seed delay."""
    rng = random.Random(f"{seed}:restart-command")
    return [
        KillPoint(
            "restart:running", delay=round(rng.uniform(0.0, 0.6), 2), target="restart-command"
        )
        for _ in range(n)
    ]


def write_record(path: str | os.PathLike[str] | None, result: CaseResult) -> None:
    """Append the case's JSON line to path (when given)."""
    if not path:
        return
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(result.record()) + "\n")


def cleanup(root: Path) -> None:
    """Remove a harness root (after close())."""
    shutil.rmtree(root, ignore_errors=True)
