"""Boot phases and failures read from vLLM engine log lines (stdlib only, no I/O)."""

from __future__ import annotations

import ast
import enum
import re
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from spark_ops.readiness.args_literal import parse_args_literal


class Phase(str, enum.Enum):
    """Milestones of a vLLM boot, in the order they are normally reached."""

    STARTING = "STARTING"
    RAY_WORKERS = "RAY_WORKERS"
    WEIGHTS_LOADING = "WEIGHTS_LOADING"
    WEIGHTS_DONE = "WEIGHTS_DONE"
    KV_CACHE = "KV_CACHE"
    GRAPH_CAPTURE = "GRAPH_CAPTURE"
    API_UP = "API_UP"
    READY = "READY"

    @property
    def rank(self) -> int:
        """Position of the phase in the normal boot order."""
        return PHASE_ORDER.index(self)


PHASE_ORDER: tuple[Phase, ...] = tuple(Phase)


class FatalKind(str, enum.Enum):
    """Why a boot is known to be dead."""

    EXIT = "EXIT"  # the engine process ended (line source ended or exit marker)
    ENGINE_INIT = "ENGINE_INIT"  # vLLM's own "failed to start" summary lines
    ENGINE_DEAD = "ENGINE_DEAD"  # EngineDeadError
    TRACEBACK = "TRACEBACK"  # an uncaught traceback ending in an exception line
    NCCL = "NCCL"
    OOM = "OOM"
    RAY_WORKER = "RAY_WORKER"  # a Ray actor / worker died
    PLACEMENT = "PLACEMENT"  # placement group never formed (vLLM gave up, or our stall limit)

    @property
    def specific(self) -> bool:
        """True when a line of this kind names the cause (better evidence than a summary line)."""
        return self not in (FatalKind.ENGINE_INIT, FatalKind.EXIT)


FATAL_HINTS: dict[FatalKind, str] = {
    FatalKind.EXIT: "the engine process exited; read the lines above, then the container log",
    FatalKind.ENGINE_INIT: "the root cause is in the lines before vLLM's summary line",
    FatalKind.ENGINE_DEAD: "the engine core died; look for the first traceback in the log",
    FatalKind.TRACEBACK: "the exception line names the cause (often a flag the build rejects)",
    FatalKind.NCCL: (
        "check NCCL_SOCKET_IFNAME / NCCL_IB_HCA / VLLM_HOST_IP on every node and the RoCE links; "
        "the system NCCL fixed start-up hangs for many"
    ),
    FatalKind.OOM: (
        "free the memory (a process of an earlier boot may still hold it: nvidia-smi "
        "--query-compute-apps) or lower --kv-cache-memory-bytes / --gpu-memory-utilization"
    ),
    FatalKind.RAY_WORKER: "a Ray worker died: check `ray status` and that node's container",
    FatalKind.PLACEMENT: (
        "a Ray worker is missing: check `ray status` on the head and start Ray on the missing node"
    ),
}

# Ray colours the "(RayWorkerProc pid=N, ip=A)" prefixes it forwards, also in a file or docker log:
# `\x1b[36m(RayWorkerProc pid=10242, ip=198.18.0.2)\x1b[0m …` (real, vLLM 0.32 over Ray 2.60).
ANSI_RE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# Leading decorations of a vLLM line: an optional docker/ISO timestamp, an optional
# "(ProcName pid=N[, ip=A])" prefix, an optional "LEVEL MM-DD HH:MM:SS [file.py:N]" header,
# or uvicorn's "LEVEL:     " form.
_PREFIX_RE = re.compile(
    r"^(?:\d{4}-\d\d-\d\dT[\d:.]+(?:Z|[+-]\d\d:?\d\d)?\s+)?"
    r"(?:\((?P<proc>[^)]*)\)\s+)?"
    r"(?:(?P<level>DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL)"
    r"(?:\s+\d\d-\d\d\s+\d\d:\d\d:\d\d(?:\.\d+)?\s+\[[^\]]*\]\s?|:\s+))?"
)
_WORKER_JOINED_RE = re.compile(
    r"Ray worker (?P<name>\S+) at (?P<addr>\S+) joined the placement group"
)
_WORKER_IP_RE = re.compile(
    r"^\((?:(?:RayWorkerWrapper|RayWorkerProc|\w*Worker\w*)\s+)?pid=\d+,\s*ip=([^)\s,]+)"
)
_EXCEPTION_RE = re.compile(
    r"^(?:[A-Za-z_][\w]*\.)*(?:[A-Z]\w*(?:Error|Exception|Exit|Interrupt|Failure)|Exception)"
    r"(?::\s|:$|$)"
)
_TRACEBACK_RE = re.compile(r"Traceback \(most recent call last\):")
_EXIT_RE = re.compile(r"^\[spark-ops\] engine exited(?: with status (?P<status>-?\d+))?")

_NON_DEFAULT_RE = re.compile(r"non-default args:\s*(?P<args>\{.*)$")
_VERSION_RE = re.compile(
    r"(?:vLLM API server version |\u2588\s+version |LLM engine \(v|Launching vLLM \(v)"
    r"(?P<version>\d+\.\d+\.\d+[\w.+-]*)"
)
_PG_WAIT_RE = re.compile(
    r"Waiting for creating a placement group of specs for (?P<secs>\d+) seconds"
    r"(?:\.\s*specs=(?P<specs>\[.*?\])(?:\.|\s|$))?"
)
_PG_GAVE_UP_RE = re.compile(r"Cannot provide a placement group")
KV_CACHE_SIZE_RE = re.compile(  # also used by spark_ops.verify
    r"\b(?:GPU|CPU|XPU|TPU)?\s*KV cache size:\s*(?P<tokens>[\d,]+)\s+tokens"
)
_KV_MEMORY_RE = re.compile(r"Available KV cache memory:\s*(?P<gib>[\d.]+)\s*GiB")
_KV_BLOCKS_RE = re.compile(r"# (?:GPU|CUDA|cuda|gpu) blocks:\s*(?P<blocks>\d+)")
_WEIGHTS_TOOK_RE = re.compile(r"Loading weights took (?P<secs>[\d.]+) seconds")
_MODEL_LOADING_RE = re.compile(
    r"Model loading took (?P<gib>[\d.]+) GiB(?: memory)?(?: and (?P<secs>[\d.]+) seconds)?"
)
_GRAPH_DONE_RE = re.compile(r"Graph capturing finished in (?P<secs>[\d.]+) secs?")
_INIT_ENGINE_RE = re.compile(
    r"init engine \(profile, create kv cache, warmup model\) took (?P<secs>[\d.]+)"
)
_SHUTDOWN_RE = re.compile(
    r"\[shutdown\]|shutdown triggered|Shutting down|Waiting for application shutdown"
)
_SERVER_RE = re.compile(r"Starting vLLM (?:API )?server(?: \d+)? on (?P<url>https?://\S+)")
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

# (phase, pattern) for lines that only mark a phase and carry no data of their own.
_PHASE_MARKERS: tuple[tuple[Phase, re.Pattern[str]], ...] = (
    (Phase.STARTING, re.compile(r"Initializing a V1 LLM engine|vLLM API server version")),
    (
        Phase.RAY_WORKERS,
        re.compile(
            r"Connecting to existing Ray cluster|Connected to Ray cluster\."
            r"|Started a local Ray instance|No current placement group found"
            r"|Creating a new placement group"
        ),
    ),
    (
        Phase.WEIGHTS_LOADING,
        re.compile(r"Starting to load model|Loading safetensors checkpoint shards|Loading weights"),
    ),
    (
        Phase.GRAPH_CAPTURE,
        re.compile(
            r"Capturing CUDA graphs|Capturing cudagraphs|CUDA graph capturing|Graph capturing"
        ),
    ),
    (Phase.API_UP, re.compile(r"Application startup complete\.")),
)

# Fatal patterns searched anywhere in the line (their text names the cause).
_FATAL_PATTERNS: tuple[tuple[FatalKind, re.Pattern[str]], ...] = (
    (
        FatalKind.OOM,
        re.compile(
            r"CUDA out of memory|OutOfMemoryError|No available memory for the cache blocks"
            r"|is less than desired GPU memory utilization"
            r"|larger than the available KV cache memory"
            r"|CUDA error: out of memory|cudaErrorMemoryAllocation|Cannot allocate memory"
        ),
    ),
    (
        FatalKind.NCCL,
        re.compile(
            r"NCCL error|nccl(?:Internal|System|UnhandledCuda|Remote|InvalidUsage)Error"
            r"|Watchdog caught collective operation timeout|collective operation timeout"
            r"|NCCL communicator was aborted|DistBackendError|NCCL timeout"
        ),
    ),
    (
        FatalKind.RAY_WORKER,
        re.compile(
            r"ActorDiedError|The actor died unexpectedly|A worker died or was killed"
            r"|RayActorError|Raylet is terminated|NodeDiedError"
            r"|Ray\w*Worker\w* rank=\[?\d+\]? died unexpectedly"
        ),
    ),
    (FatalKind.PLACEMENT, _PG_GAVE_UP_RE),
    (FatalKind.ENGINE_DEAD, re.compile(r"EngineDeadError")),
    (
        FatalKind.ENGINE_INIT,
        re.compile(
            r"Engine core initialization failed|EngineCore failed to start"
            r"|WorkerProc failed to start|Engine process failed to start"
        ),
    ),
)


@dataclass(frozen=True)
class LineInfo:
    """What one log line says, judged on its own."""

    message: str  # the line without its timestamp / process / level prefix
    level: str | None = None
    phase: Phase | None = None
    fatal: FatalKind | None = None
    exception: bool = False  # looks like the last line of a traceback ("XError: ...")
    traceback_start: bool = False
    data: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """Serialize (for fixtures and --json)."""
        return {
            "message": self.message,
            "level": self.level,
            "phase": self.phase.value if self.phase else None,
            "fatal": self.fatal.value if self.fatal else None,
            "exception": self.exception,
            "traceback_start": self.traceback_start,
            "data": self.data,
        }


def split_prefix(line: str) -> tuple[str, str | None, str | None]:
    """Split a log line into (message, level, process prefix); ANSI colour codes are dropped."""
    line = ANSI_RE.sub("", line.rstrip("\r\n"))
    m = _PREFIX_RE.match(line)
    if not m:
        return line, None, None
    level = m.group("level")
    return line[m.end() :], (level.upper() if level else None), m.group("proc")


def _number(text: str) -> int:
    """Parse '2,596,374' as 2596374."""
    return int(text.replace(",", ""))


def _placement_specs(text: str | None) -> int | None:
    """Count the bundles of a placement-group specs list (one per GPU worker)."""
    if not text:
        return None
    try:
        specs = ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return text.count("{") or None
    return len(specs) if isinstance(specs, list) else None


def classify_line(line: str) -> LineInfo:
    """Classify one engine log line on its own: phase milestone, fatal kind, captured data."""
    message, level, proc = split_prefix(line)
    data: dict[str, Any] = {}
    phase: Phase | None = None

    exit_m = _EXIT_RE.match(line.strip())
    if exit_m:
        status = exit_m.group("status")
        data["exit_status"] = int(status) if status is not None else None
        return LineInfo(message, level, None, FatalKind.EXIT, data=data)

    if proc:
        ip = _WORKER_IP_RE.match(ANSI_RE.sub("", line))
        if ip:
            data["worker_ip"] = ip.group(1)

    if m := _WORKER_JOINED_RE.search(message):
        data["worker_joined"] = m.group("name")
    if m := _NON_DEFAULT_RE.search(message):
        phase = Phase.STARTING
        data["non_default_args"] = parse_args_literal(m.group("args"))
    elif m := _PG_WAIT_RE.search(message):
        phase = Phase.RAY_WORKERS
        data["placement_wait_s"] = int(m.group("secs"))
        bundles = _placement_specs(m.group("specs"))
        if bundles is not None:
            data["workers_expected"] = bundles
    elif m := KV_CACHE_SIZE_RE.search(message):
        phase = Phase.KV_CACHE
        data["kv_cache_tokens"] = _number(m.group("tokens"))
    elif m := _KV_BLOCKS_RE.search(message):
        phase = Phase.KV_CACHE
        data["kv_cache_blocks"] = int(m.group("blocks"))
    elif m := _WEIGHTS_TOOK_RE.search(message):
        phase = Phase.WEIGHTS_DONE
        data["weights_load_s"] = float(m.group("secs"))
    elif m := _MODEL_LOADING_RE.search(message):
        phase = Phase.WEIGHTS_DONE
        data["model_memory_gib"] = float(m.group("gib"))
        if m.group("secs"):
            data["model_load_s"] = float(m.group("secs"))
    elif m := _GRAPH_DONE_RE.search(message):
        phase = Phase.GRAPH_CAPTURE
        data["graph_capture_s"] = float(m.group("secs"))
    elif m := _SERVER_RE.search(message):
        phase = Phase.API_UP
        data["api_url"] = m.group("url").rstrip(".,")
    elif m := _KV_MEMORY_RE.search(message):
        data["kv_cache_memory_gib"] = float(m.group("gib"))
    elif m := _INIT_ENGINE_RE.search(message):
        data["init_engine_s"] = float(m.group("secs"))
    else:
        for marker_phase, pattern in _PHASE_MARKERS:
            if pattern.search(message):
                phase = marker_phase
                break
    if (v := _VERSION_RE.search(message)) is not None:
        data["vllm_version"] = v.group("version")

    fatal: FatalKind | None = None
    for kind, pattern in _FATAL_PATTERNS:
        if pattern.search(message):
            fatal = kind
            break
    # A warning that merely mentions a fatal-looking phrase is not a failure.
    if level in ("DEBUG", "INFO", "WARNING", "WARN"):
        fatal = None

    exception = bool(_EXCEPTION_RE.match(message))
    traceback_start = bool(_TRACEBACK_RE.search(message))
    return LineInfo(message, level, phase, fatal, exception, traceback_start, data)


def is_art(line: str) -> bool:
    """True for a line drawn, not written: vLLM's start banner (block and box characters)."""
    return any("\u2500" <= ch <= "\u259f" for ch in line)


def telling(lines: list[str]) -> list[str]:
    """The lines that can show why a boot failed: every line but banner art."""
    return [line for line in lines if not is_art(line)]


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
        ):
            if key in data:
                self.metrics[key] = data[key]
        if "init_engine_s" in data:
            self.metrics["init_engine_s"] = data["init_engine_s"]

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
