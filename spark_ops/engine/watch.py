"""Following which engine instance runs after a restart: the head's view and the API's own.

Built once before the restart command runs (the outgoing instance and its API server's start
time are taken then), polled during the boot. Used by the boot's probe (a completion counts only
from the new engine) and by readiness (the new engine's pid claims its log lines; its death ends
the wait with the processes it left named).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from spark_ops.engine.api import EngineAPI
from spark_ops.engine.instance import (
    EngineInstance,
    current_instance,
    identity_source,
    is_new,
    started_after,
    survivors,
)
from spark_ops.errors import SparkOpsError
from spark_ops.inventory import Cluster
from spark_ops.readiness.report import InstanceView
from spark_ops.remote import ClusterSession
from spark_ops.remote.programs.engine import LOG_SIZE
from spark_ops.remote.shell import engine_log_follow


class OutgoingEngineAnswered(Exception):
    """The engine that answered the probe is the outgoing one (slow stop, asynchronous restart)."""


class EngineWatch:
    """The outgoing engine instance, and which one runs now."""

    def __init__(
        self,
        session: ClusterSession,
        cluster: Cluster,
        *,
        old: EngineInstance | None,
        old_api_start: float | None,
        restart_at: float,
    ) -> None:
        """Remember the outgoing instance (None when nothing ran) and when the restart began."""
        self.session = session
        self.cluster = cluster
        self.old = old
        self.old_api_start = old_api_start
        self.restart_at = restart_at
        self.source = identity_source(cluster)
        self.seen: EngineInstance | None = None  # the new instance, once seen
        self.latest: InstanceView | None = None
        # an engine run as ranks (engine.executor: mp): each worker rank's log size before the
        # restart (a file log), so that its lines are followed from the restart on
        self.rank_offsets: dict[str, int | None] = {}

    @classmethod
    async def before_restart(
        cls, session: ClusterSession, cluster: Cluster, api: EngineAPI | None, restart_at: float
    ) -> EngineWatch:
        """Take the outgoing instance's identity (head and API) just before the restart."""
        try:
            old = await current_instance(session, cluster)
        except SparkOpsError:
            old = None
        start = await api.start_time() if api is not None else None
        watch = cls(session, cluster, old=old, old_api_start=start, restart_at=restart_at)
        if cluster.engine.executor == "mp":
            watch.rank_offsets = await _rank_offsets(session, cluster)
        return watch

    def rank_logs(self) -> dict[str, AsyncIterator[str]] | None:
        """Each worker rank's log, from the restart on (None: not an engine run as ranks)."""
        eng = self.cluster.engine
        if eng.executor != "mp":
            return None
        logs: dict[str, AsyncIterator[str]] = {}
        for node in self.cluster.workers:
            if eng.log_kind == "file":
                cmd = engine_log_follow(eng, from_offset=self.rank_offsets.get(node.name))
            elif eng.log_kind in ("docker", "journalctl"):
                cmd = engine_log_follow(eng, from_time=f"@{int(self.restart_at) - 1}")
            else:
                cmd = engine_log_follow(eng)
            logs[node.name] = self.session.stream_lines(node.name, cmd)
        return logs

    async def current(self) -> EngineInstance | None:
        """The instance the head runs now (the new one's processes still searched once seen)."""
        return await current_instance(self.session, self.cluster, self.seen)

    async def poll(self) -> InstanceView | None:
        """One look at the head: is the instance running the new one, alive, what did it leave."""
        if self.source is None:
            return None
        inst = await self.current()
        new = is_new(inst, self.old, self.restart_at)
        if inst is None:
            return None
        if new:
            self.seen = inst
        left = tuple(p.label() for p in survivors(inst)) if new else ()
        hint = ""
        if left and inst.pgid:
            hint = f"stop what it left: kill -TERM -- -{inst.pgid}"
        elif left:
            hint = "stop what it left: kill -TERM " + " ".join(label.split()[0] for label in left)
        self.latest = InstanceView(
            new=new,
            alive=inst.alive,
            label=inst.label(),
            log_pid=inst.engine_pid if self.source == "pid_file" else None,
            survivors=left,
            stop_hint=hint,
        )
        return self.latest

    async def engine_start(self, api: EngineAPI | None) -> tuple[float | None, str]:
        """When the new engine itself started (head clock) and what says so: its process (the
        engine under a wrapper, the container's start), else its API server's start time."""
        inst = self.seen
        if self.source is not None:
            with contextlib.suppress(SparkOpsError):
                inst = await self.current() or inst
        if inst is not None and is_new(inst, self.old, self.restart_at):
            started = inst.engine_started_at
            if started is not None:
                return started, inst.label()
        start = await api.start_time() if api is not None else None
        if start is not None and started_after(start, self.restart_at, self.old_api_start):
            return start, "its API server's process_start_time_seconds"
        return None, "no start time of the new engine known"

    async def check_answer(self, api: EngineAPI) -> None:
        """Raise OutgoingEngineAnswered unless the API that answers is the new engine's."""
        start = await api.start_time()
        if start is not None:
            if not started_after(start, self.restart_at, self.old_api_start):
                raise OutgoingEngineAnswered(
                    f"the outgoing engine answered (its API server started at {start:.0f}, "
                    f"before the restart at {self.restart_at:.0f})"
                )
            return
        if self.source is not None and not (self.latest and self.latest.new and self.latest.alive):
            raise OutgoingEngineAnswered(
                "an engine answered, but the head shows no new engine instance yet"
            )


async def _rank_offsets(session: ClusterSession, cluster: Cluster) -> dict[str, int | None]:
    """Each worker's engine log size now (None: unknown or not a file: read from the start)."""
    if cluster.engine.log_kind != "file":
        return {}
    names = [n.name for n in cluster.workers]
    found: dict[str, int | None] = {}
    for name in names:
        try:
            res = await session.call(name, LOG_SIZE, cluster.engine.log_target)
            found[name] = int(res.stdout.strip() or 0)
        except (SparkOpsError, ValueError):
            found[name] = None
    return found
