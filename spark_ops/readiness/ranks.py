"""Following the worker ranks of an engine launched as ranks without Ray (engine.executor: mp).

Rank 0 on the head serves the API and logs there; every worker rank logs on its own node. The
boot is followed on every rank's log: each worker rank gets its own BootTracker (reading from the
restart on, so the outgoing rank's last lines are told apart), its phases are reported with its
node's name, its fatal line fails the boot at once naming that node and its lines (rank 0 only
hangs when a worker rank dies, as a broken NCCL ring does), and the boot is done only when every
worker rank has started anew. Rank 0's `k/N ranks joined` lines say how many have joined.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from spark_ops.errors import BootError
from spark_ops.readiness.phases import FATAL_HINTS, Phase, split_prefix
from spark_ops.readiness.tracker import BootTracker

RANKS_JOINED_RE = re.compile(r"(?P<joined>\d+)/(?P<total>\d+) ranks joined")


@dataclass
class RankLog:
    """One worker rank's log during a boot."""

    node: str
    tracker: BootTracker = field(default_factory=lambda: BootTracker(after_restart=True))
    fatal_at: float | None = None
    ended: bool = False
    first_line: str | None = None  # the new rank's first line: evidence starts there

    @property
    def started(self) -> bool:
        """True once the new rank's first start-up line was read (it is a new process)."""
        return self.tracker.segments > 0 and not self.tracker.old_engine


def ranks_joined(line: str) -> tuple[int, int] | None:
    """`(k, N)` from rank 0's `k/N ranks joined`, else None."""
    m = RANKS_JOINED_RE.search(line)
    return (int(m.group("joined")), int(m.group("total"))) if m else None


async def read_rank(
    rank: RankLog,
    lines: AsyncIterator[str],
    emit: Callable[..., None],
    clock: Callable[[], float],
    wake: Callable[[], None],
) -> None:
    """Feed one worker rank's lines to its tracker; report its start, phases and fatal line."""
    async for line in lines:
        was = rank.started
        _, new_phase, fatal = rank.tracker.feed(line)
        text = line.rstrip("\r\n")
        if rank.started and not was:
            rank.first_line = text
            emit("rank", text, node=rank.node, started=True)
        if new_phase is not None:
            emit("rank", text, node=rank.node, rank_phase=new_phase.value)
        if fatal is not None and rank.fatal_at is None:
            rank.fatal_at = clock()
            emit("rank", text, node=rank.node, fatal=fatal.kind.value)
        wake()
    rank.ended = True
    wake()


def rank_error(rank: RankLog) -> BootError | None:
    """The BootError of a worker rank's fatal line, naming its node and its lines."""
    fatal = rank.tracker.best_fatal()
    if fatal is None:
        return None
    message, _, _ = split_prefix(fatal.line)
    context = list(fatal.context)
    if rank.first_line in context:  # not the outgoing rank's last words
        context = context[context.index(rank.first_line) :]
    lines = [f"{rank.node}: {line}" for line in context]
    return BootError(
        f"worker rank on {rank.node} failed during {fatal.phase.value} "
        f"({fatal.kind.value}): {message[:300]}; rank 0 waits for it (as on a broken NCCL "
        "ring) and will not exit by itself",
        phase=fatal.phase.value,
        lines=lines,
        hint=f"read {rank.node}'s engine log; {FATAL_HINTS[fatal.kind]}",
    )


def not_started(ranks: list[RankLog]) -> list[str]:
    """Nodes whose worker rank has not started anew yet."""
    return [r.node for r in ranks if not r.started]


def rank_summary(ranks: list[RankLog]) -> dict[str, Any]:
    """Per worker rank: started anew, its last phase and its effective args (for the report)."""
    return {
        r.node: {
            "started": r.started,
            "phase": r.tracker.phase.value if r.started else Phase.STARTING.value,
            "non_default_args": dict(r.tracker.non_default_args),
        }
        for r in ranks
    }
