"""vLLM-style log lines for the simulated engine, written and flushed one line at a time."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterable
from typing import TextIO

# Fake pids of the sub-processes a real vLLM spawns, as offsets from our own pid.
_PID_OFFSETS = {"APIServer": 0, "EngineCore": 1, "Worker": 2}


class VllmLog:
    """Writes lines in vLLM's format: `(APIServer pid=N) INFO 11-29 23:18:04 [file.py:NN] msg`."""

    def __init__(self, out: TextIO | None = None, err: TextIO | None = None) -> None:
        """Log vLLM lines to out (stdout) and raw/traceback lines to err (stderr)."""
        self.out = out or sys.stdout
        self.err = err or sys.stderr
        self.pid = os.getpid()

    def line(self, proc: str, level: str, where: str, message: str) -> None:
        """Write one vLLM-formatted line and flush it."""
        stamp = time.strftime("%m-%d %H:%M:%S")
        pid = self.pid + _PID_OFFSETS.get(proc, 3)
        self.out.write(f"({proc} pid={pid}) {level} {stamp} [{where}] {message}\n")
        self.out.flush()

    def info(self, proc: str, where: str, message: str) -> None:
        """Write an INFO line."""
        self.line(proc, "INFO", where, message)

    def warning(self, proc: str, where: str, message: str) -> None:
        """Write a WARNING line."""
        self.line(proc, "WARNING", where, message)

    def error(self, proc: str, where: str, message: str) -> None:
        """Write an ERROR line."""
        self.line(proc, "ERROR", where, message)

    def raw(self, text: str, *, stderr: bool = False) -> None:
        """Write unformatted lines (uvicorn, tracebacks, NCCL) and flush."""
        stream = self.err if stderr else self.out
        stream.write(text if text.endswith("\n") else text + "\n")
        stream.flush()

    def traceback(
        self, proc: str, where: str, frames: Iterable[tuple[str, int, str, str]], exc: str
    ) -> None:
        """Write a Python traceback as ERROR lines of one process (as vLLM's loggers do)."""
        self.error(proc, where, "Traceback (most recent call last):")
        for path, lineno, func, code in frames:
            self.error(proc, where, f'  File "{path}", line {lineno}, in {func}')
            self.error(proc, where, f"    {code}")
        self.error(proc, where, exc)


_SITE = "/usr/local/lib/python3.12/dist-packages/vllm"

# Frames of the tracebacks printed on a failed start (paths and lines are illustrative).
WORKER_FRAMES = [
    (
        f"{_SITE}/v1/executor/multiproc_executor.py",
        920,
        "worker_main",
        "worker = WorkerProc(*args, **kwargs)",
    ),
    (f"{_SITE}/v1/executor/multiproc_executor.py", 687, "__init__", "self.worker.load_model()"),
    (f"{_SITE}/v1/worker/gpu_worker.py", 594, "load_model", "self.model_runner.load_model()"),
    (
        f"{_SITE}/model_executor/model_loader/__init__.py",
        141,
        "get_model",
        "return loader.load_model(",
    ),
]
KV_FRAMES = [
    (f"{_SITE}/v1/engine/core.py", 144, "__init__", "self._initialize_kv_caches(vllm_config)"),
    (
        f"{_SITE}/v1/worker/gpu_worker.py",
        402,
        "initialize_from_config",
        "self.model_runner.initialize_kv_cache(kv_cache_config)",
    ),
    (
        f"{_SITE}/v1/worker/gpu_model_runner.py",
        5120,
        "initialize_kv_cache",
        "kv_caches = self.initialize_kv_cache_tensors(kv_cache_config)",
    ),
]
CORE_FRAMES = [
    (
        f"{_SITE}/v1/engine/core.py",
        1482,
        "run_engine_core",
        "engine_core = EngineCoreProc(*args, engine_index=dp_rank, **kwargs)",
    ),
    (
        f"{_SITE}/v1/engine/core.py",
        144,
        "__init__",
        "self.model_executor = executor_class(vllm_config)",
    ),
    (f"{_SITE}/v1/executor/abstract.py", 126, "__init__", "self._init_executor()"),
]
API_FRAMES = [
    (f"{_SITE}/entrypoints/cli/main.py", 120, "main", "args.dispatch_function(args)"),
    (f"{_SITE}/entrypoints/cli/serve.py", 156, "cmd", "uvloop.run(run_server(args))"),
    (f"{_SITE}/v1/engine/utils.py", 1351, "launch_core_engines", "wait_for_engine_startup("),
    (f"{_SITE}/v1/engine/utils.py", 1431, "wait_for_engine_startup", "raise RuntimeError("),
]
ENGINE_FAILED = (
    "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}"
)


def stderr_traceback(log: VllmLog, frames: Iterable[tuple[str, int, str, str]], exc: str) -> None:
    """Write a plain Python traceback on stderr (the API server's final error)."""
    lines = ["Traceback (most recent call last):"]
    for path, lineno, func, code in frames:
        lines += [f'  File "{path}", line {lineno}, in {func}', f"    {code}"]
    lines.append(exc)
    log.raw("\n".join(lines), stderr=True)


def engine_core_failed(
    log: VllmLog, inner_frames: list[tuple[str, int, str, str]], root: str
) -> None:
    """Write the EngineCore failure block, then the API server's final RuntimeError."""
    log.error("EngineCore", "core.py:1510", "EngineCore failed to start.")
    log.traceback("EngineCore", "core.py:1510", CORE_FRAMES + inner_frames, root)
    log.raw("Process EngineCore:", stderr=True)
    stderr_traceback(log, CORE_FRAMES + inner_frames, root)
    stderr_traceback(log, API_FRAMES, ENGINE_FAILED)
