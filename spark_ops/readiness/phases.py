"""One vLLM engine log line judged on its own: its boot phase, failure and data (stdlib only)."""

from __future__ import annotations

import ast
import enum
import re
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
_SERVER_RE = re.compile(r"Starting vLLM (?:API )?server(?: \d+)? on (?P<url>https?://\S+)")

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
