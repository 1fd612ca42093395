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
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import time
from collections.abc import Awaitable
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from spark_ops.errors import SparkOpsError
from spark_ops.inventory import Cluster
from spark_ops.remote import ClusterSession
from spark_ops.remote.programs.engine import (
    DOCKER_FMT,
    DOCKER_IDENTITY,
    ENGINE_PROCS,
    HEAD_ENGINE,
    HEAD_ENGINE_MARK,
    PID_PROBE,
    UNIT_IDENTITY,
)

RANK_SLACK_S = 120.0  # a launcher starts the ranks of one engine within this of each other
RANK_LAG_S = 300.0  # ... and a loaded head's launcher reaches a worker's rank this late at most
START_SLACK_S = 1.5  # process_start_time_seconds reads up to 1 s early (whole-second btime)
# A command line that runs vLLM's server: `vllm serve`, `python -m vllm.entrypoints…`, the sim's.
ENGINE_COMMAND = re.compile(r"vllm serve|vllm\.entrypoints|sim\.engine serve")
T = TypeVar("T")


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


def _parse_pid_probe(text: str, previous: EngineInstance | None) -> EngineInstance | None:
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


def _probe_now(text: str) -> float | None:
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
        return _parse_pid_probe(res.stdout, previous)
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


@dataclass(frozen=True)
class Clock:
    """A node's clock against this machine's: offset (node − here, s) as read, and the round trip
    of that read (the offset is known to within it)."""

    offset: float
    round_trip: float


ProcsRead = tuple[list[Proc], Clock | None]  # a node's engine processes, its clock


def on_head_clock(procs: list[Proc], worker: Clock | None, head: Clock | None) -> list[Proc]:
    """A worker's processes with their start times moved onto the head's clock (the engine's
    start is read there): shifted by the two clocks' difference when it exceeds what the reads
    can tell (their round trips, and one second of whole-second starts); as read otherwise."""
    if worker is None or head is None:
        return procs
    skew = worker.offset - head.offset
    if abs(skew) <= (worker.round_trip + head.round_trip) / 2 + 1.0:
        return procs
    return [replace(p, started_at=round(p.started_at - skew, 2)) for p in procs]


def unreadable_starts(procs: list[Proc], *starts: float | None) -> str | None:
    """Why start times cannot be compared (a NaN or infinite one: a node's clock or process table
    read wrong); None when every one is a number."""
    bad = [p for p in procs if not math.isfinite(p.started_at)]
    if any(t is not None and not math.isfinite(t) for t in starts):
        return "the head engine's start time is unreadable (not a finite number)"
    if bad:
        named = ", ".join(f"{p.label()} ({p.started_at})" for p in bad)
        return f"start time unreadable (not a finite number): {named}"
    return None


def old_ranks(procs: list[Proc], since: float) -> list[Proc]:
    """The engine processes that started before `since` (a restart): the old engine's ranks."""
    return [p for p in procs if p.started_at < since - START_SLACK_S]


# flags a worker's rank and rank 0 give differently by design
_RANK_OWN_FLAGS = frozenset(
    {"node-rank", "headless", "data-parallel-rank", "data-parallel-start-rank", "port", "host"}
)


def _flags(args: str) -> dict[str, str]:
    """A command line's `--flag value` and `--flag=value` (a flag alone: ""); a line cut at 300
    characters (Proc.args) loses its last flag, whose value may be cut."""
    words = args.split()
    out: dict[str, tuple[str, int]] = {}
    for i, word in enumerate(words):
        if not word.startswith("--") or len(word) == 2:
            continue
        name, eq, value = word[2:].partition("=")
        last = i
        if not eq and i + 1 < len(words) and not words[i + 1].startswith("--"):
            value, last = words[i + 1], i + 1
        out[name.replace("_", "-")] = (value, last)
    cut = len(args) >= 300
    return {k: v for k, (v, last) in out.items() if not (cut and last >= len(words) - 1)}


def contradicts(engine_args: str, rank_args: str) -> bool:
    """True when a rank's command line gives another value than the engine's to a flag both
    show (`--max-num-seqs 6` beside the engine's 64, another `--master-port`): it is not a rank
    of that engine. Flags ranks give apart (`--node-rank`, `--headless`) are not compared."""
    mine, theirs = _flags(engine_args), _flags(rank_args)
    return any(theirs[k] != v for k, v in mine.items() if k in theirs and k not in _RANK_OWN_FLAGS)


@dataclass(frozen=True)
class RankVerdict:
    """One worker's ranks against the running engine: the stray ones; the ones that could each
    be the engine's own (two or more: spark-ops does not guess); or why it cannot be told."""

    stray: list[Proc]
    ambiguous: list[Proc] = field(default_factory=list)
    unreadable: str | None = None


def rank_verdict(
    procs: list[Proc], engine_start: float | None, engine_args: str = ""
) -> RankVerdict:
    """Which of a worker's ranks (their top processes) are not the running engine's.

    Every rank is stray when the head's engine is not running (`engine_start` None). Else by
    time, all on the head's clock (worker_ranks): one started more than RANK_SLACK_S before the
    engine is an earlier engine's; one started within RANK_LAG_S after it may be its own (a
    launcher reaches the workers one after another, a loaded head's late), and one started past
    that beside such a one is stray (by hand); with none in that window, a lone later rank is the
    engine's. Where two or more are left (an earlier engine's rank restarted close before, one
    started by hand close after: time alone cannot tell), the command line decides when it
    positively can: a rank giving another value than the engine's (`engine_args`) to a flag both
    show is not its (stray, as long as one candidate agrees), and if exactly one agrees that one
    is the engine's (preferred to any time rule). Otherwise the candidates left are ambiguous:
    none is named the engine's and none stray. A start time that is no finite number (NaN,
    infinity) makes the node unreadable."""
    pids = {p.pid for p in procs}
    tops = sorted((p for p in procs if p.ppid not in pids), key=lambda p: (p.started_at, p.pid))
    why = unreadable_starts(tops, engine_start)
    if why is not None:
        return RankVerdict([], [], why)
    if engine_start is None or not tops:
        return RankVerdict(tops)
    old = [p for p in tops if p.started_at < engine_start - RANK_SLACK_S]
    window = [p for p in tops if p not in old and p.started_at <= engine_start + RANK_LAG_S]
    later = [p for p in tops if p not in old and p not in window]
    candidates = window or later
    stray = old + (later if window else [])
    if len(candidates) > 1 and engine_args:
        agree = [p for p in candidates if not contradicts(engine_args, p.args)]
        if agree:
            stray += [p for p in candidates if p not in agree]
            candidates = agree
    stray.sort(key=lambda p: (p.started_at, p.pid))
    if len(candidates) > 1:
        return RankVerdict(stray, candidates)
    return RankVerdict(stray)


def stray_ranks(procs: list[Proc], engine_start: float | None, engine_args: str = "") -> list[Proc]:
    """A worker's ranks not part of the running engine (rank_verdict's stray ones: ranks it
    finds ambiguous are not in it). SparkOpsError when a start time is unreadable."""
    verdict = rank_verdict(procs, engine_start, engine_args)
    if verdict.unreadable is not None:
        raise SparkOpsError(verdict.unreadable)
    return verdict.stray


@dataclass
class RankLeftovers:
    """The worker ranks of an engine run as ranks that are not the running engine's."""

    engine_running: bool  # False: every rank is an earlier engine's, and a restart may stop it
    nodes: dict[str, list[Proc] | str]  # per worker its stray ranks, or why it was not read
    ambiguous: dict[str, list[Proc]] = field(default_factory=dict)  # ranks none told apart

    def stray(self) -> dict[str, list[Proc]]:
        """The workers that run a stray rank, with those ranks."""
        return {n: p for n, p in self.nodes.items() if p and not isinstance(p, str)}


def _procs_read(text: str, before: float, after: float) -> tuple[list[Proc], Clock | None]:
    """A node's engine processes (ENGINE_PROCS's output) and its clock against this machine's,
    from the same read (made between `before` and `after`, this machine's clock)."""
    seen = _parse_pid_probe("F 0\n" + text, None)
    now = _probe_now(text)
    clock = Clock(now - (before + after) / 2, after - before) if now is not None else None
    return sorted(seen.members if seen is not None else (), key=lambda p: p.pid), clock


async def _read_procs(session: ClusterSession, node: str) -> tuple[list[Proc], Clock | None]:
    """A node's engine processes and its clock against this machine's, in the same read."""
    before = time.time()
    res = await session.call(node, ENGINE_PROCS)
    return _procs_read(res.stdout, before, time.time())


async def _kept(read: Awaitable[T]) -> T | SparkOpsError:
    """A read's value, or the error that stopped it."""
    try:
        return await read
    except SparkOpsError as exc:
        return exc


async def _read_head(
    session: ClusterSession, cluster: Cluster
) -> tuple[EngineInstance | SparkOpsError | None, ProcsRead | SparkOpsError]:
    """The head's engine instance, and its engine processes with its clock: one program when a
    pid file names the engine (HEAD_ENGINE), else its identity and processes read side by side."""
    head, pid_file = cluster.head.name, cluster.engine.pid_file
    if identity_source(cluster) != "pid_file" or pid_file is None:
        return await asyncio.gather(
            _kept(current_instance(session, cluster)), _kept(_read_procs(session, head))
        )
    before = time.time()
    try:
        res = await session.call(head, HEAD_ENGINE, pid_file)
    except SparkOpsError as exc:
        return exc, exc
    probe, _, procs = res.stdout.partition(f"\n{HEAD_ENGINE_MARK}\n")
    return _parse_pid_probe(probe, None), _procs_read(procs, before, time.time())


@dataclass(frozen=True)
class EngineReading:
    """The engine read once where it runs (read_engine): the head's instance, the head's engine
    processes with its clock, and for an engine run as ranks each worker's engine processes on
    the head's clock (or why that worker could not be read). A read that failed is kept as its
    error, raised by the judgement that needs it."""

    instance: EngineInstance | SparkOpsError | None
    head: ProcsRead | SparkOpsError
    workers: dict[str, list[Proc] | str]
    ranks: bool  # an engine run as ranks (engine.executor mp): the workers were read

    def engine(self) -> EngineInstance | None:
        """The head's engine instance (None: nothing names one); SparkOpsError when unread."""
        if isinstance(self.instance, SparkOpsError):
            raise self.instance
        return self.instance

    def leftovers(self) -> tuple[EngineInstance | None, list[Proc], list[Proc]]:
        """The engine instance the head runs; the processes a dead instance left (its tree and
        group: a killed API server's EngineCore and workers); other engine processes outside it
        (an earlier engine that never stopped, or one this account cannot tell is not the
        cluster's). SparkOpsError when the head's instance or processes could not be read."""
        instance = self.engine()
        if isinstance(self.head, SparkOpsError):
            raise self.head
        own = survivors(instance) if instance is not None else []
        mine = {p.pid for p in (instance.members if instance is not None else ())} | {
            p.pid for p in own
        }
        if instance is not None and instance.pid:
            mine.add(instance.pid)
        others = [p for p in self.head[0] if p.pid not in mine]
        return instance, sorted(own, key=lambda p: p.pid), sorted(others, key=lambda p: p.pid)

    def rank_leftovers(self) -> RankLeftovers:
        """An engine run as ranks: per worker, the ranks left from an old engine (each still
        holds the node's memory), the ranks that could each be the engine's (ambiguous), or why
        that worker could not be read; none for the Ray shape. SparkOpsError when the head's
        engine cannot be read (no rank can be told from it)."""
        if not self.ranks:
            return RankLeftovers(True, {})
        instance = self.engine()
        running = instance is not None and instance.alive
        start = instance.engine_started_at if running and instance is not None else None
        args = instance.engine.args if running and instance and instance.engine else ""
        found: dict[str, list[Proc] | str] = {}
        ambiguous: dict[str, list[Proc]] = {}
        for node, procs in self.workers.items():
            if isinstance(procs, str):
                found[node] = procs
                continue
            verdict = rank_verdict(procs, start, args)
            found[node] = verdict.unreadable if verdict.unreadable is not None else verdict.stray
            if verdict.ambiguous:
                ambiguous[node] = verdict.ambiguous
        return RankLeftovers(start is not None, found, ambiguous)


async def read_engine(
    session: ClusterSession, cluster: Cluster, *, ranks: bool = True
) -> EngineReading:
    """Read the engine once, every node at the same time, one program per node: the head's
    instance and engine processes; with `ranks` and an engine run as ranks, each worker's engine
    processes (its rank and what that rank started), their start times moved onto the head's
    clock (each worker's clock measured against the head's in the same read as its process
    table). The plan's gate, doctor's engine-leftovers, verify's rank-leftovers and status judge
    such a reading."""
    ranks = ranks and cluster.engine.executor == "mp"
    names = [n.name for n in cluster.workers] if ranks else []
    (instance, head), reads = await asyncio.gather(
        _read_head(session, cluster), session.gather(names, lambda n: _read_procs(session, n))
    )
    clock = None if isinstance(head, SparkOpsError) else head[1]  # unknown: starts as read
    workers = {
        n: r.message if isinstance(r, SparkOpsError) else on_head_clock(r[0], r[1], clock)
        for n, r in reads.items()
    }
    return EngineReading(instance, head, workers, ranks)


def _since(procs: list[Proc]) -> str:
    """`812 (python) since 10:01:02, …` (head's clock)."""
    return ", ".join(
        f"{p.label()} since {time.strftime('%H:%M:%S', time.localtime(p.started_at))}"
        for p in procs
    )


def rank_words(node: str, procs: list[Proc]) -> str:
    """`node3 runs a rank of an earlier engine: 812 (python) since 10:01:02`."""
    return f"{node} runs a rank of an earlier engine: {_since(procs)}"


def ambiguous_words(node: str, procs: list[Proc]) -> str:
    """The words for ranks that could each be the running engine's (rank_verdict)."""
    return (
        f"{node} runs {len(procs)} ranks that could each be the running engine's (started within "
        f"{RANK_SLACK_S:.0f} s before it or {RANK_LAG_S:.0f} s after, their command lines not "
        f"telling them apart): {_since(procs)}; spark-ops does not guess which, and each but the "
        "engine's holds its share of the node's memory"
    )


def ambiguous_hint(node: str, procs: list[Proc]) -> str:
    """The commands that stop each candidate (the operator stops the one that is not the
    engine's)."""
    pids = ",".join(str(p.pid) for p in procs)
    stops = " or ".join(f"`{stop_hint([p])}` ({p.pid})" for p in procs)
    return (
        f"on {node}, see which is the engine's (`ps -o pid,lstart,args -p {pids}`), then stop "
        f"every other: {stops}"
    )


def rank_warning(node: str, procs: list[Proc]) -> str:
    """The plan's and doctor's words for a rank the dead engine left (a restart may stop it)."""
    return (
        f"{rank_words(node, procs)}; the head's engine is not running, so the restart's launcher "
        f"may stop it, else it holds the node's memory into the boot: {stop_hint(procs)}"
    )
