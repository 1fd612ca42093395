"""A worker's ranks against the running engine: which are stray, which ambiguous, and the words
the plan, doctor and verify give them.

An engine run as ranks (engine.executor mp) starts one rank per worker; a rank that is not the
running engine's (an earlier engine's, one started by hand) holds its share of the node's memory.
Every start time compared here is on the head's clock (engine.identity moves them there).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

from spark_ops.engine.instance import START_SLACK_S, Proc, stop_hint
from spark_ops.errors import SparkOpsError

RANK_SLACK_S = 120.0  # a launcher starts the ranks of one engine within this of each other
RANK_LAG_S = 300.0  # ... and a loaded head's launcher reaches a worker's rank this late at most


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
