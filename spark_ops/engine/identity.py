"""The engine read once where it runs: the head's instance and engine processes, and for an
engine run as ranks each worker's engine processes, their start times on the head's clock.

The plan's gate, doctor's engine-leftovers, verify's rank-leftovers and status judge one such
reading (EngineReading); a failed read is kept as its error, raised by the judgement that needs it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from dataclasses import dataclass, replace
from typing import TypeVar

from spark_ops.engine.instance import (
    EngineInstance,
    Proc,
    current_instance,
    identity_source,
    parse_pid_probe,
    probe_now,
    survivors,
)
from spark_ops.engine.ranks import RankLeftovers, rank_verdict
from spark_ops.errors import SparkOpsError
from spark_ops.inventory import Cluster
from spark_ops.remote import ClusterSession
from spark_ops.remote.programs.engine import ENGINE_PROCS, HEAD_ENGINE, HEAD_ENGINE_MARK

T = TypeVar("T")


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


def _procs_read(text: str, before: float, after: float) -> tuple[list[Proc], Clock | None]:
    """A node's engine processes (ENGINE_PROCS's output) and its clock against this machine's,
    from the same read (made between `before` and `after`, this machine's clock)."""
    seen = parse_pid_probe("F 0\n" + text, None)
    now = probe_now(text)
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
    return parse_pid_probe(probe, None), _procs_read(procs, before, time.time())


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
