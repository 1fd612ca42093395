"""Which engine instance is running: the identity that makes a boot the new engine's.

An instance is told apart by what the head knows of it, per how the inventory runs the engine:

- `engine.pid_file`: the pid it names and that process's start time (/proc/PID/stat field 22,
  in clock ticks since the kernel booted: a reused pid has another start time), and the
  processes of its tree and group (children keep the group after the API server dies, and are
  remembered while it lives: the leftovers);
- `log: {kind: docker}`: the container's Id and State.StartedAt (`docker restart` keeps the Id
  and changes StartedAt; `docker rm` + `run` changes both), its State.Pid;
- `log: {kind: journalctl}` (a systemd unit): the unit's InvocationID, new for every start;
- always, when the API answers: `process_start_time_seconds` on /metrics (the API server's start
  time, Unix seconds; prometheus_client computes it from the kernel's boot time, which it reads
  in whole seconds, so it may read up to one second early, never late).

The engine read once where it runs is engine.identity; a worker's ranks judged against it,
engine.ranks.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

from spark_ops.inventory import Cluster
from spark_ops.remote import ClusterSession
from spark_ops.remote.programs.engine import DOCKER_FMT, DOCKER_IDENTITY, PID_PROBE, UNIT_IDENTITY

START_SLACK_S = 1.5  # process_start_time_seconds reads up to 1 s early (whole-second btime)
# A command line that runs vLLM's server: `vllm serve`, `python -m vllm.entrypoints…`, the sim's.
ENGINE_COMMAND = re.compile(r"vllm serve|vllm\.entrypoints|sim\.engine serve")


@dataclass(frozen=True)
class Proc:
    """One process on the head: pid, parent, group, state, start (Unix s), name."""

    pid: int
    ppid: int
    pgid: int
    state: str
    started_at: float
    name: str
    args: str = ""  # its command line (cut), as ps shows it

    def label(self) -> str:
        """`1234 (VLLM::EngineCore)`."""
        return f"{self.pid} ({self.name})"


def runs_engine(args: str) -> bool:
    """True when a command line (as ps shows it) is vLLM's server itself: `vllm serve …`, or a
    Python interpreter running it (`python …/vllm serve`, `python -m vllm.entrypoints…`, the
    sim's engine). A process that merely carries the words (`grep "vllm serve"`, `sh -c '…'`,
    `tail`) is not: its program is neither vllm nor Python."""
    words = args.split()
    if not words:
        return False
    program = words[0].rsplit("/", 1)[-1]
    if program == "vllm":
        return len(words) > 1 and words[1] == "serve"
    return program.startswith("python") and bool(ENGINE_COMMAND.search(" ".join(words[1:])))


def engine_process(procs: tuple[Proc, ...] | list[Proc], root: int | None) -> Proc | None:
    """The engine's own process in the tree of `root` (the pid a pid file names): the deepest
    process there whose command line runs vLLM's server (a wrapper shell `sh -c 'vllm serve …'`
    is its parent; vLLM's titled children `VLLM::EngineCore` are not it); None when none does.

    Verify (whose log lines are the engine's), identity (the engine's start) and leftovers (which
    process is the engine) all name the engine by this one rule.
    """
    if root is None:
        return None
    parent = {p.pid: p.ppid for p in procs}

    def depth(pid: int) -> int | None:
        """Steps from root down to pid; None when pid is not in root's tree."""
        steps = 0
        while pid != root:
            if pid not in parent or steps > len(parent):
                return None
            pid, steps = parent[pid], steps + 1
        return steps

    best: tuple[int, int, Proc] | None = None
    for p in procs:
        if p.name.startswith("VLLM::") or not runs_engine(p.args):
            continue
        d = depth(p.pid)
        if d is not None and (best is None or (d, -p.pid) > best[:2]):
            best = (d, -p.pid, p)
    return best[2] if best else None


@dataclass(frozen=True)
class EngineInstance:
    """One engine instance: what identifies it, whether it runs, and the processes it holds."""

    source: str  # pid_file | docker | systemd
    key: str  # equal keys: the same instance
    alive: bool
    pid: int | None = None
    started_at: float | None = None  # Unix seconds, head clock
    pgid: int | None = None
    members: tuple[Proc, ...] = field(default_factory=tuple)  # live processes of its tree / group
    engine: Proc | None = None  # the engine's own process in the pid's tree (engine_process)

    @property
    def engine_pid(self) -> int | None:
        """The pid of the engine's own process (its log lines carry it): a wrapper's child, or
        the pid itself."""
        return self.engine.pid if self.engine is not None else self.pid

    @property
    def engine_started_at(self) -> float | None:
        """When the engine's own process started (head clock; whole seconds for a child)."""
        if self.engine is not None and self.engine.pid != self.pid:
            return self.engine.started_at
        return self.started_at

    def label(self) -> str:
        """How the operator sees this instance named (and the engine process under a wrapper)."""
        if self.source == "docker":
            return f"container {self.key.split('@')[0][:12]}"
        if self.source == "systemd":
            return f"unit invocation {self.key[:12]}"
        if self.engine is not None and self.engine.pid != self.pid:
            return f"pid {self.pid}, engine pid {self.engine.pid} under it"
        return f"pid {self.pid}"

    def to_dict(self) -> dict[str, Any]:
        """Serialize for reports."""
        return {
            "source": self.source,
            "key": self.key,
            "alive": self.alive,
            "pid": self.pid,
            "started_at": self.started_at,
            "members": [p.label() for p in self.members],
            "engine_pid": self.engine_pid,
            "engine": self.engine.label() if self.engine is not None else None,
        }


def _full_name(comm: str, args: str) -> str:
    """The process name: comm (cut at 15 characters by the kernel), made whole from its command
    line when that holds it (vLLM titles its processes `VLLM::EngineCore`, `VLLM::Worker_TP0`)."""
    for word in args.split():
        if len(comm) >= 15 and word.startswith(comm):
            return word[:60]
    return comm


def parse_pid_probe(text: str, previous: EngineInstance | None) -> EngineInstance | None:
    """Build the instance the pid file names from PID_PROBE's output (None: no pid in it)."""
    now = btime = 0.0
    hz = 100.0
    pid: int | None = None
    start: float | None = None
    pgid: int | None = None
    procs: list[Proc] = []
    ticks: dict[int, int] = {}
    for line in text.splitlines():
        tag, _, rest = line.partition(" ")
        if tag == "T":
            parts = rest.split()
            if len(parts) >= 3:  # a `date` without %N (`123.N`): the node's clock unreadable
                now, btime, hz = _number(parts[0]), _number(parts[1]), _number(parts[2])
                hz = hz if math.isfinite(hz) and hz > 0 else 100.0
        elif tag == "K":
            parts = rest.split()
            if len(parts) == 2 and parts[0].isdigit() and parts[1].isdigit():
                ticks[int(parts[0])] = int(parts[1])
        elif tag == "F":
            pid = int(rest) if rest.strip().isdigit() else None
        elif tag == "S":
            fields = rest[rest.rfind(")") + 2 :].split()
            if len(fields) > 19 and fields[0] not in ("Z", "X"):
                pgid = int(fields[2])
                start = round(btime + int(fields[19]) / hz, 2)
        elif tag == "P":
            parts = rest.split(None, 6)
            if len(parts) >= 6 and not parts[3].startswith(("Z", "X")):
                n, pp, g = int(parts[0]), int(parts[1]), int(parts[2])
                if n in ticks and btime > 0:  # its start in ticks: exact, on the node's clock
                    started = round(btime + ticks[n] / hz, 2)
                else:  # its age as ps counted it, from the "T" line's moment
                    started = round(now - _number(parts[4]), 0)
                args = parts[6] if len(parts) > 6 else ""
                name = _full_name(parts[5], args)
                procs.append(Proc(n, pp, g, parts[3], started, name, args[:300]))
    if pid is None:
        return None
    alive = start is not None
    same = previous is not None and previous.pid == pid
    if alive:
        key = f"{pid}@{start}"
    else:
        key = previous.key if same and previous is not None else f"{pid}@gone"
        start = previous.started_at if same and previous is not None else None
        pgid = previous.pgid if same and previous is not None else None
        if pgid is None and any(p.pgid == pid for p in procs):
            pgid = pid  # a dead leader's group, still holding its children
    engine = engine_process(procs, pid) if alive else None
    return EngineInstance("pid_file", key, alive, pid, start, pgid, tuple(procs), engine)


def _number(text: str) -> float:
    """A number a node printed; NaN when it is none (a start time then reads as unreadable)."""
    try:
        return float(text)
    except ValueError:
        return math.nan


def probe_now(text: str) -> float | None:
    """The node's clock at the read ("T" line of PID_PROBE or ENGINE_PROCS), when readable."""
    for line in text.splitlines():
        tag, _, rest = line.partition(" ")
        if tag == "T" and rest.split():
            now = _number(rest.split()[0])
            return now if math.isfinite(now) else None
    return None


def _json_values(text: str) -> list[Any]:
    """The JSON values of one line, separated by blanks (a string value may hold blanks)."""
    decoder = json.JSONDecoder()
    out: list[Any] = []
    i, text = 0, text.strip()
    while i < len(text):
        value, i = decoder.raw_decode(text, i)
        out.append(value)
        while i < len(text) and text[i].isspace():
            i += 1
    return out


def _parse_docker(text: str) -> EngineInstance | None:
    """Build the container's instance from `docker inspect -f DOCKER_FMT` output.

    A container created and not yet started (`docker run` between create and start, for as long
    as a busy daemon takes) is not an instance yet: None, as if nothing ran, never "exited". One
    that could not start (status created, with the daemon's error) is a dead instance.
    """
    try:
        values = _json_values(text)
    except ValueError:
        return None
    if len(values) != 6:
        return None
    cid, started, running, pid, status, error = values
    if status == "created" and not error:
        return None
    if not isinstance(pid, int):
        return None
    return EngineInstance(
        "docker", f"{cid}@{started}", bool(running), pid or None, _iso_time(str(started))
    )


def _iso_time(text: str) -> float | None:
    """Docker's RFC 3339 time with nanoseconds as Unix seconds."""
    import datetime as dt

    if not text or text.startswith("0001-"):
        return None
    head, _, frac = text.rstrip("Z").partition(".")
    try:
        base = dt.datetime.fromisoformat(head).replace(tzinfo=dt.timezone.utc)
    except ValueError:
        return None
    return base.timestamp() + (float("0." + frac[:9]) if frac.isdigit() else 0.0)


def _parse_systemd(text: str) -> EngineInstance | None:
    """Build the unit's instance from `systemctl show -p MainPID,InvocationID,ActiveState`."""
    values = dict(line.partition("=")[::2] for line in text.splitlines() if "=" in line)
    inv = values.get("InvocationID", "")
    if not inv:
        return None
    pid = int(values.get("MainPID", "0") or 0) or None
    return EngineInstance("systemd", inv, values.get("ActiveState") == "active" and bool(pid), pid)


def identity_source(cluster: Cluster) -> str | None:
    """Which identity the inventory allows: pid_file, docker, systemd, or None."""
    eng = cluster.engine
    if eng.log_kind == "docker":
        return "docker"
    if eng.pid_file:
        return "pid_file"
    if eng.log_kind == "journalctl":
        return "systemd"
    return None


async def current_instance(
    session: ClusterSession, cluster: Cluster, previous: EngineInstance | None = None
) -> EngineInstance | None:
    """The engine instance the head runs now (None: nothing names one, or no identity source).

    `previous` (an instance seen earlier) lets a dead leader's processes and group still be
    searched, so that its survivors are found.
    """
    eng = cluster.engine
    head = cluster.head.name
    source = identity_source(cluster)
    if source == "docker":
        text = await session.call(head, DOCKER_IDENTITY, DOCKER_FMT, eng.log_target)
        return _parse_docker(text) if text is not None else None
    if source == "systemd":
        res = await session.call(head, UNIT_IDENTITY, eng.log_target)
        return _parse_systemd(res.stdout)
    if source == "pid_file":
        assert eng.pid_file is not None
        extra = []
        if previous is not None:
            keep = ",".join(str(p.pid) for p in previous.members)
            lead = str(previous.pgid) if previous.pgid == previous.pid else ""
            extra = [keep, lead]
        res = await session.call(head, PID_PROBE, eng.pid_file, *extra)
        return parse_pid_probe(res.stdout, previous)
    return None


def is_new(
    instance: EngineInstance | None, old: EngineInstance | None, restart_at: float
) -> bool | None:
    """True when the instance is not the outgoing one; None when it cannot be told."""
    if instance is None:
        return None
    if old is not None:
        if instance.source == "pid_file" and instance.pid == old.pid and not instance.alive:
            return False  # the pid file still names the outgoing engine, now gone
        return instance.key != old.key
    if instance.started_at is not None:
        return instance.started_at >= restart_at - START_SLACK_S
    return None


def started_after(start_time: float | None, restart_at: float, old_start: float | None) -> bool:
    """Whether an API server with this process_start_time_seconds is the new engine."""
    if start_time is None:
        return False
    if old_start is not None and abs(start_time - old_start) < 0.05:
        return False
    return start_time >= restart_at - START_SLACK_S


def survivors(instance: EngineInstance) -> list[Proc]:
    """Processes of a dead engine instance still running (its tree and group)."""
    if instance.alive:
        return []
    return [p for p in instance.members if p.pid != instance.pid]


def stop_hint(procs: list[Proc]) -> str:
    """The command that stops leftover processes (their groups when they share one)."""
    groups = sorted({p.pgid for p in procs})
    if len(groups) <= 2:
        return "kill -TERM -- " + " ".join(f"-{g}" for g in groups)
    return "kill -TERM " + " ".join(str(p.pid) for p in procs)
