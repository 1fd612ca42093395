"""What waiting for a boot says: its events (for a progress display), the report of a boot that
served, the view of the engine instance it is told, and the phases a boot should pass through."""

from __future__ import annotations

import itertools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from spark_ops.readiness.phases import PHASE_ORDER, Phase


@dataclass(frozen=True)
class InstanceView:
    """What the head says of the engine instance running now, next to the outgoing one.

    new: it is not the outgoing instance (None: cannot tell yet); alive: it runs; log_pid: the
    pid its log lines carry (`(APIServer pid=N)`), when the head's pid is that pid; survivors:
    processes of a dead instance still running (named to the operator).
    """

    new: bool | None
    alive: bool
    label: str = ""
    log_pid: int | None = None
    survivors: tuple[str, ...] = ()
    stop_hint: str = ""


InstanceWatch = Callable[[], Awaitable["InstanceView | None"]]


@dataclass(frozen=True)
class BootEvent:
    """One thing that happened during a boot, for progress display.

    kind: "start" (a boot begins: the rollback's too), "engine" (a new engine's first line after
    another engine's: its phases start over), "step" (a step of STARTING: api-config,
    engine-core, workers), "phase" (a phase was reached; READY too), "line"
    (every log line), "workers" (Ray workers joined or missing changed), "instance" (the new
    engine instance seen, or seen dead), "tick" (about once a second), "fatal" / "timeout" (just
    before raising).
    """

    kind: str
    phase: Phase
    elapsed_s: float
    line: str | None = None
    data: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """Serialize for JSON lines."""
        out: dict[str, Any] = {
            "kind": self.kind,
            "phase": self.phase.value,
            "elapsed_s": round(self.elapsed_s, 3),
        }
        if self.line is not None:
            out["line"] = self.line
        if self.data:
            out["data"] = self.data
        return out


@dataclass
class BootReport:
    """How a successful boot went: when each phase was reached and what the engine reported."""

    started_at: float  # Unix time when waiting began
    total_s: float
    phase_times: dict[str, float]  # phase -> seconds after start when reached
    durations: dict[str, float]  # phase -> seconds spent in it (until the next phase reached)
    last_phase: str
    lines_seen: int
    kv_cache_tokens: int | None = None
    kv_cache_blocks: int | None = None
    non_default_args: dict[str, Any] = field(default_factory=dict)
    vllm_version: str | None = None
    api_url: str | None = None
    metrics: dict[str, float] = field(default_factory=dict)  # weights_load_s, graph_capture_s, ...
    skipped: list[str] = field(default_factory=list)  # phases not expected (eager, no Ray)
    warnings: list[str] = field(default_factory=list)  # fatal-looking lines of a boot that served
    # Timed from the new engine's own start (see from_engine_start): total_s then runs from it,
    # wait_s is the wait alone, restart_command_s the watchdog's restart command.
    wait_s: float | None = None
    restart_command_s: float | None = None
    engine_started_at: float | None = None  # head clock
    engine_start_from: str | None = None  # what told the engine's start (its process, the API)
    ranks: dict[str, Any] = field(default_factory=dict)  # worker node -> its rank's boot (mp)

    def from_engine_start(self, engine_started_at: float, ready_at: float, source: str) -> None:
        """Time the boot from the engine's own start (both head clock): total_s runs from it,
        the first phase (starting) begins then, wait_s keeps the wait's own figure."""
        lead = (ready_at - self.total_s) - engine_started_at  # engine start -> wait began
        self.wait_s = self.total_s
        self.total_s = max(0.0, ready_at - engine_started_at)
        self.engine_started_at = engine_started_at
        self.engine_start_from = source
        times = {k: (0.0 if k == "starting" else max(0.0, v + lead))
                 for k, v in self.phase_times.items()}  # fmt: skip
        ordered = sorted(times.items(), key=lambda kv: kv[1])
        self.phase_times = dict(ordered)
        self.durations = {a: max(0.0, tb - ta) for (a, ta), (_, tb) in itertools.pairwise(ordered)}

    def to_dict(self) -> dict[str, Any]:
        """Serialize for --json and the ETA state file."""
        return {
            "started_at": self.started_at,
            "total_s": round(self.total_s, 3),
            "phase_times": {k: round(v, 3) for k, v in self.phase_times.items()},
            "durations": {k: round(v, 3) for k, v in self.durations.items()},
            "last_phase": self.last_phase,
            "lines_seen": self.lines_seen,
            "kv_cache_tokens": self.kv_cache_tokens,
            "kv_cache_blocks": self.kv_cache_blocks,
            "non_default_args": self.non_default_args,
            "vllm_version": self.vllm_version,
            "api_url": self.api_url,
            "metrics": self.metrics,
            "skipped": self.skipped,
            "warnings": self.warnings,
            "wait_s": None if self.wait_s is None else round(self.wait_s, 3),
            "restart_command_s": (
                None if self.restart_command_s is None else round(self.restart_command_s, 3)
            ),
            "engine_started_at": self.engine_started_at,
            "engine_start_from": self.engine_start_from,
            "ranks": self.ranks,
        }


def exit_line(status: int | None = None) -> str:
    """The line a log source appends when it knows the engine process exited."""
    if status is None:
        return "[spark-ops] engine exited"
    return f"[spark-ops] engine exited with status {status}"


def expected_phases(
    non_default_args: dict[str, Any],
    *,
    expect_graph_capture: bool | None = None,
    ray_seen: bool = False,
) -> list[Phase]:
    """The phases a boot with these effective args should pass through."""
    phases = list(PHASE_ORDER)
    uses_ray = ray_seen or non_default_args.get("distributed_executor_backend") == "ray"
    if not uses_ray:
        phases.remove(Phase.RAY_WORKERS)
    graphs = expect_graph_capture
    if graphs is None:
        graphs = not bool(non_default_args.get("enforce_eager", False))
    if not graphs:
        phases.remove(Phase.GRAPH_CAPTURE)
    return phases
