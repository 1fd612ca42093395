"""A boot log read line by line: phases reached, engine instances, fatal evidence (stdlib only)."""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass
from typing import Any

from spark_ops.readiness.phases import (
    FatalKind,
    LineInfo,
    Phase,
    classify_line,
    split_prefix,
    telling,
)

_SHUTDOWN_RE = re.compile(
    r"\[shutdown\]|shutdown triggered|Shutting down|Waiting for application shutdown"
)
# An engine told to stop (by a watchdog, docker stop, Ctrl-C): what it prints after this line is
# its teardown, never a boot failure. vLLM 0.32: the EngineCore's "trigger received signal=SIGTERM",
# the API server's "shutdown triggered", and the `KeyboardInterrupt: terminated` of a SIGTERM
# during start-up. (A failing boot prints its cause first and "[shutdown] Executor: …" after.)
_STOP_RE = re.compile(
    r"received signal=SIG\w+|shutdown triggered|^KeyboardInterrupt(?::|$)|Received signal SIG"
)
# The first lines of an engine's start: the banner's version line and the effective args; a
# worker rank run headless (vLLM 0.32's `vllm serve … --headless`, engine.executor: mp) prints
# neither: its first line of its own is `Launching vLLM (v0.32.0) headless multiproc executor, …`.
_START_RE = re.compile(
    r"\u2588\s+version \d|non-default args:|vLLM API server version \d"
    r"|Launching vLLM \(v\d[^)]*\) headless"
)
# STARTING is long on a real vLLM (imports, the API server's config, the EngineCore and its
# workers spawned): its steps, in order, each from the first line that shows it.
STARTING_STEPS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("api-config", re.compile(r"non-default args:|\u2588\s+version \d")),
    ("engine-core", re.compile(r"Initializing a V1 LLM engine|^EngineCore\b")),
    ("workers", re.compile(r"^(?:\w*Worker\w*|RayWorker\w*)\b|world_size=\d")),
)
_PROC_PID_RE = re.compile(r"^(?P<name>[\w:.-]+)\s+pid=(?P<pid>\d+)")


@dataclass
class Fatal:
    """A fatal line and the evidence before it."""

    kind: FatalKind
    line: str
    index: int  # line number (0-based) in the boot log
    context: list[str]
    phase: Phase

    def to_dict(self) -> dict[str, Any]:
        """Serialize."""
        return {
            "kind": self.kind.value,
            "line": self.line,
            "index": self.index,
            "context": self.context,
            "phase": self.phase.value,
        }


class BootTracker:
    """Stateful reading of a boot log: phase progression, tracebacks, fatal evidence."""

    def __init__(
        self,
        *,
        context_lines: int = 12,
        keep_lines: int = 400,
        after_restart: bool = False,
        old_pids: set[int] | None = None,
    ) -> None:
        """Start in STARTING with no lines seen.

        after_restart: the lines follow a restart (read from the restart's log offset): until an
        engine's first start-up line, they are the outgoing engine's. old_pids: process ids of
        the outgoing engine; its lines never count, wherever they fall.
        """
        self.phase: Phase = Phase.STARTING
        self.lines_seen = 0
        self.context_lines = context_lines
        self.recent: deque[str] = deque(maxlen=keep_lines)
        self.non_default_args: dict[str, Any] = {}
        self.kv_cache_tokens: int | None = None
        self.kv_cache_blocks: int | None = None
        self.vllm_version: str | None = None
        self.api_url: str | None = None
        self.workers_expected: int | None = None
        self.worker_ips: set[str] = set()
        self.placement_wait_s: int | None = None
        self.metrics: dict[str, float] = {}
        self.fatals: list[Fatal] = []
        self._traceback_level: str | bool | None = False  # False: not inside a traceback
        self._traceback_benign = False
        self._last_message = ""
        self.ignored: list[str] = []  # fatal-looking lines of an outgoing or stopping engine
        # Segments: the lines of one engine instance, from its first start-up line on.
        self.old_pids: set[int] = set(old_pids or ())
        self.new_pid: int | None = None  # the new engine's API server pid, once known
        self.segments = 0
        self.segment_pid: int | None = None  # the API server pid of the current segment
        self.segment_stopped = False  # the current segment's engine was told to stop
        self.awaiting_start = after_restart
        self.outgoing_lines = 0  # lines attributed to an outgoing engine
        self.step = "imports"  # where STARTING is (see STARTING_STEPS)

    @property
    def old_engine(self) -> bool:
        """True while the lines read are an outgoing engine's (before this boot's first line)."""
        return self.awaiting_start or self.segment_stopped

    def claim(self, pid: int) -> None:
        """The new engine's API server is `pid`: a segment of another API server is outgoing."""
        self.new_pid = pid
        self.old_pids.discard(pid)
        if self.segment_pid is not None and self.segment_pid != pid:
            self.old_pids.add(self.segment_pid)
            self._outgoing_segment()

    def _outgoing_segment(self) -> None:
        """The current segment turned out to be an outgoing engine's: forget what it said."""
        self.ignored.extend(f.line for f in self.fatals)
        self.fatals = []
        self._new_engine()
        self.non_default_args = {}
        self.vllm_version = None
        self.segment_pid = None
        self.awaiting_start = True

    def _segment(self, info: LineInfo, pid: int | None, api: bool) -> bool:
        """Track engine instances; True when the line is an outgoing engine's."""
        if pid is not None and pid in self.old_pids:
            return True
        if _START_RE.search(info.message) and (
            self.awaiting_start
            or self.segment_stopped
            or self.phase.rank > Phase.STARTING.rank
            or (api and self.segment_pid is not None and pid != self.segment_pid)
        ):
            if self.segments and self.segment_pid is not None and pid != self.segment_pid:
                self.old_pids.add(self.segment_pid)
            self.ignored.extend(f.line for f in self.fatals)
            self.fatals = []
            self._new_engine()
            self.segments += 1
            self.awaiting_start = False
            self.segment_stopped = False
            self.segment_pid = pid if api else None
        elif api and self.segment_pid is None and not self.awaiting_start:
            self.segment_pid = pid
        if self.awaiting_start:
            return True
        return (
            self.new_pid is not None
            and self.segment_pid is not None
            and self.segment_pid != self.new_pid
        )

    def feed(self, line: str) -> tuple[LineInfo, Phase | None, Fatal | None]:
        """Take one line; return its classification, the phase newly reached and a new fatal."""
        line = line.rstrip("\r\n")
        index = self.lines_seen
        self.lines_seen += 1
        self.recent.append(line)
        info = classify_line(line)
        _, _, proc = split_prefix(line)
        m = _PROC_PID_RE.match(proc or "")
        pid = int(m.group("pid")) if m else None
        if self._segment(info, pid, bool(m and m.group("name").startswith("APIServer"))):
            self.outgoing_lines += 1
            if info.fatal is not None or info.exception:
                self.ignored.append(line)
            return LineInfo(info.message, info.level), None, None
        data = info.data

        if "non_default_args" in data:
            self.non_default_args = data["non_default_args"]
        if "kv_cache_tokens" in data:
            self.kv_cache_tokens = data["kv_cache_tokens"]
        if "kv_cache_blocks" in data:
            self.kv_cache_blocks = data["kv_cache_blocks"]
        if "vllm_version" in data and self.vllm_version is None:
            self.vllm_version = data["vllm_version"]
        if "api_url" in data:
            self.api_url = data["api_url"]
        if "workers_expected" in data:
            self.workers_expected = data["workers_expected"]
        if "placement_wait_s" in data:
            self.placement_wait_s = data["placement_wait_s"]
        if "worker_ip" in data:
            self.worker_ips.add(data["worker_ip"])
        if "worker_joined" in data:
            self.worker_ips.add(data["worker_joined"])
        for key in (
            "weights_load_s",
            "model_load_s",
            "model_memory_gib",
            "graph_capture_s",
            "kv_cache_memory_gib",
            "init_engine_s",
        ):
            if key in data:
                self.metrics[key] = data[key]

        if _STOP_RE.search(info.message):
            self.segment_stopped = True
        elif (
            _SHUTDOWN_RE.search(info.message)
            and self.phase is Phase.STARTING
            and not self.non_default_args
        ):
            self.segment_stopped = True  # a teardown that began before this log's first line

        if self.phase is Phase.STARTING:
            ranks = [name for name, _ in STARTING_STEPS]
            at = ranks.index(self.step) if self.step in ranks else -1
            for i, (name, pattern) in enumerate(STARTING_STEPS):
                if i > at and (pattern.search(info.message) or pattern.search(proc or "")):
                    self.step, at = name, i
        new_phase: Phase | None = None
        if info.phase is not None and info.phase.rank > self.phase.rank:
            self.phase = info.phase
            new_phase = info.phase

        fatal_kind = info.fatal
        if info.traceback_start:
            self._traceback_level = info.level
            # A traceback logged at INFO/WARNING, or a request handler's traceback, is not a boot
            # failure on its own.
            self._traceback_benign = info.level in ("DEBUG", "INFO", "WARNING", "WARN") or (
                "Exception in ASGI application" in self._last_message
            )
        elif info.exception and self._traceback_level is not False:
            if not self._traceback_benign and fatal_kind is None:
                fatal_kind = FatalKind.TRACEBACK
            self._traceback_level = False
        self._last_message = info.message

        if fatal_kind is not None and self.segment_stopped:
            self.ignored.append(line)
            fatal_kind = None

        fatal: Fatal | None = None
        if fatal_kind is not None:
            before = telling(list(self.recent))[-(self.context_lines + 1) :]
            fatal = Fatal(fatal_kind, line, index, before, self.phase)
            self.fatals.append(fatal)
        return info, new_phase, fatal

    def _new_engine(self) -> None:
        """A new engine starts after lines of the one before it (still booting at the restart)."""
        self.phase = Phase.STARTING
        self.step = "imports"
        self.kv_cache_tokens = None
        self.kv_cache_blocks = None
        self.api_url = None
        self.workers_expected = None
        self.placement_wait_s = None
        self.worker_ips = set()
        self.metrics = {}

    def best_fatal(self) -> Fatal | None:
        """The line that best explains the failure: first specific cause, else first summary."""
        for f in self.fatals:
            if f.kind.specific:
                return f
        return self.fatals[0] if self.fatals else None

    def last_lines(self, n: int = 20) -> list[str]:
        """The last n lines seen that tell something (banner art left out)."""
        return telling(list(self.recent))[-n:]

    def summary(self) -> dict[str, Any]:
        """What the lines so far say: phase, KV pool, effective args, the fatal line if any."""
        best = self.best_fatal()
        return {
            "phase": self.phase.value,
            "lines_seen": self.lines_seen,
            "kv_cache_tokens": self.kv_cache_tokens,
            "non_default_args": dict(self.non_default_args),
            "vllm_version": self.vllm_version,
            "api_url": self.api_url,
            "metrics": dict(self.metrics),
            "workers_joined": sorted(self.worker_ips),
            "workers_expected": self.workers_expected,
            "fatal": best.to_dict() if best else None,
        }


def summarize_boot_log(text: str) -> dict[str, Any]:
    """Read a whole boot log (e.g. `docker logs` output) and summarize it, without waiting."""
    tracker = BootTracker()
    for line in text.splitlines():
        tracker.feed(line)
    return tracker.summary()
