"""Boot phases of the simulated engine: Ray placement group, weights, KV cache, graphs; faults."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time
from dataclasses import dataclass
from typing import Any

from spark_ops.sim.engine_args import ServeArgs
from spark_ops.sim.engine_config import (
    SimConfigError,
    active_fault,
    cfg_float,
    cfg_get,
    scaled,
    version_tuple,
)
from spark_ops.sim.engine_log import (
    KV_FRAMES,
    WORKER_FRAMES,
    VllmLog,
    engine_core_failed,
    stderr_traceback,
)
from spark_ops.sim.ranks import RankGroup

_BANNER = [
    "",
    "       █     █     █▄   ▄█",
    " ▄▄ ▄█ █     █     █ ▀▄▀ █  version {version}",
    "  █▄█▀ █     █     █     █  model   {model}",
    "   ▀▀  ▀▀▀▀▀ ▀▀▀▀▀ ▀     ▀",
    "",
]


ROUTES_LOG = [
    ("/load", "GET"), ("/version", "GET"),
    ("/health", "GET"), ("/metrics", "GET"), ("/v1/models", "GET"),
    ("/v1/chat/completions", "POST"), ("/v1/completions", "POST"),
]  # fmt: skip


class BootFailed(Exception):
    """The boot failed after its lines were printed; carries the process exit code."""

    def __init__(self, code: int = 1) -> None:
        """Keep the exit code."""
        super().__init__(f"boot failed (exit {code})")
        self.code = code


@dataclass
class Worker:
    """A Ray worker node endpoint from $SPARK_SIM_RAY_WORKERS."""

    name: str
    host: str
    port: int

    @property
    def addr(self) -> str:
        """Return host:port."""
        return f"{self.host}:{self.port}"


def parse_workers(text: str | None) -> list[Worker]:
    """Parse `name=host:port,name=host:port` (empty or unset: a single-node engine)."""
    workers = []
    for item in (text or "").split(","):
        item = item.strip()
        if not item:
            continue
        name, sep, addr = item.partition("=")
        host, colon, port = addr.rpartition(":")
        if not sep or not colon or not port.isdigit():
            raise SimConfigError(
                f"SPARK_SIM_RAY_WORKERS: bad entry {item!r}; "
                "expected name=host:port[,name=host:port]"
            )
        workers.append(Worker(name.strip(), host.strip(), int(port)))
    return workers


async def probe(worker: Worker, timeout: float) -> bool:
    """Return whether the worker accepts a TCP connection within timeout."""
    try:
        _, writer = await asyncio.wait_for(
            asyncio.open_connection(worker.host, worker.port), timeout
        )
    except (OSError, asyncio.TimeoutError):
        return False
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return True


@dataclass
class BootResult:
    """What the boot established: KV pool and effective limits."""

    sock: socket.socket
    host: str
    port: int
    max_model_len: int
    kv_cache_memory_bytes: int
    kv_tokens: int


class Booter:
    """Runs the boot phases in order, printing vLLM's lines, and injects the configured faults."""

    def __init__(self, cfg: dict[str, Any], args: ServeArgs, log: VllmLog) -> None:
        """Remember config, arguments and the log writer."""
        self.cfg, self.args, self.log = cfg, args, log
        self.fault = active_fault(cfg)
        self.workers = parse_workers(os.environ.get("SPARK_SIM_RAY_WORKERS"))
        self.ranks: RankGroup | None = None  # rank 0 of an engine run as ranks (sim/ranks.py)

    def close_ranks(self) -> None:
        """Drop the worker ranks' connections (they then end, as when rank 0 goes)."""
        if self.ranks is not None:
            self.ranks.close()

    async def _phase(self, key: str) -> float:
        """Sleep for a boot phase's (scaled) duration; return the seconds it took."""
        start = time.monotonic()
        await asyncio.sleep(scaled(self.cfg, f"boot.{key}"))
        return time.monotonic() - start

    def _bind(self) -> tuple[socket.socket, str, int]:
        """Reserve the API port early (bound, not listening: connections are refused until up)."""
        host = self.args.host or str(cfg_get(self.cfg, "server.bind_host_when_unset"))
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, self.args.port))
        except OSError as exc:
            sock.close()
            stderr_traceback(self.log, [], f"OSError: [Errno {exc.errno}] {exc.strerror}")
            raise BootFailed(1) from exc
        return sock, host, sock.getsockname()[1]

    async def run(self) -> BootResult:
        """Run every phase; raise BootFailed after printing a failure."""
        log, a, cfg = self.log, self.args, self.cfg
        version = str(cfg_get(cfg, "vllm_version"))
        for line in _BANNER:
            log.info("APIServer", "api_utils.py:347", line.format(version=version, model=a.model))
        log.info("APIServer", "api_utils.py:286", f"non-default args: {a.non_default!r}")
        self._env_warnings(version)
        log.info(
            "APIServer",
            "model.py:733",
            f"Resolved architecture: {cfg_get(cfg, 'model.architecture')}",
        )
        max_len = int(a.max_model_len or cfg_get(cfg, "model.max_model_len"))
        log.info("APIServer", "model.py:2152", f"Using max model len {max_len}")
        if a.enforce_eager:
            log.warning(
                "APIServer",
                "vllm.py:1703",
                "Enforce eager set, disabling torch.compile and CUDAGraphs. This is equivalent to "
                "setting -cc.mode=none -cc.cudagraph_mode=none",
            )
        sock, host, port = self._bind()
        try:
            await self._phase("api_init_s")
            return await self._engine(sock, host, port, max_len)
        except BaseException:
            sock.close()
            raise

    async def _engine(self, sock: socket.socket, host: str, port: int, max_len: int) -> BootResult:
        """Engine-core phases: executor, weights, profile, KV cache, graphs."""
        log, a, cfg = self.log, self.args, self.cfg
        tp = a.tensor_parallel_size
        log.info(
            "EngineCore",
            "core.py:133",
            f"Initializing a V1 LLM engine (v{cfg_get(cfg, 'vllm_version')}) with config: "
            f"model={a.model!r}, tokenizer={a.model!r}, trust_remote_code={a.trust_remote_code}, "
            f"dtype=torch.{cfg_get(cfg, 'model.dtype')}, max_seq_len={max_len}, "
            f"tensor_parallel_size={tp}, enforce_eager={a.enforce_eager}, "
            f"kv_cache_dtype={a.kv_cache_dtype}, served_model_name={a.served_name}",
        )
        await self._phase("engine_core_start_s")
        if self.workers and a.non_default.get("distributed_executor_backend") != "mp":
            await self._ray()  # vLLM forms no placement group for ranks without Ray
        nnodes = int(a.extras.get("nnodes") or 1)
        if nnodes > 1 and int(a.extras.get("node_rank") or 0) == 0:
            self.ranks = RankGroup(cfg, nnodes, log)
            await self.ranks.gather(
                str(a.extras.get("master_addr") or "127.0.0.1"),
                int(a.extras.get("master_port") or 29501),
            )
        w = "Worker"
        log.info(w, "gpu_model_runner.py:3420", f"Starting to load model {a.model}...")
        moe = a.non_default.get("moe_backend")
        if moe in [str(b) for b in cfg.get("refused_moe_backends") or []]:
            self._fail_worker(
                str(cfg_get(cfg, "refused_moe_backend_message")).replace(
                    "{BACKEND}", str(moe).upper()
                )
            )
        if moe:
            log.info(w, "fused_moe.py:1012", f"Using {moe} MoE backend")
        took = await self._phase("weights_s")
        if self.fault == "exit_during_weights":
            self._fail_worker(str(cfg_get(cfg, "faults.exit_during_weights.root_cause")))
        log.info(w, "default_loader.py:501", f"Loading weights took {took:.2f} seconds")
        gib = cfg_float(cfg, "model.weights_gib_per_gpu")
        log.info(
            w,
            "gpu_model_runner.py:3512",
            f"Model loading took {gib:.4f} GiB memory and {took + 0.3:.6f} seconds",
        )
        if self.ranks is not None:
            await self.ranks.all_loaded()
        await self._maybe_hang("weights")
        start = time.monotonic()
        await self._phase("profile_s")
        if self.fault == "nccl_timeout":
            self._fail_nccl()
        kv_bytes = a.kv_cache_memory_bytes
        if kv_bytes is None:
            total = cfg_float(cfg, "memory.gpu_total_bytes")
            kv_bytes = int(total * a.gpu_memory_utilization - gib * 2**30)
        log.info(w, "gpu_worker.py:412", f"Available KV cache memory: {kv_bytes / 2**30:.2f} GiB")
        await self._phase("kv_alloc_s")
        if self.fault == "kv_alloc_fail" or kv_bytes <= 0:
            self._fail_kv()
        kv_tokens = int(kv_bytes / cfg_float(cfg, "memory.kv_bytes_per_token"))
        conc = kv_tokens / (max_len * cfg_float(cfg, "memory.tokens_per_request_factor"))
        log.info(
            "EngineCore",
            "kv_cache_utils.py:2327",
            f"GPU KV cache size: {kv_tokens:,} tokens, Maximum concurrency for {max_len:,} tokens "
            f"per request: {conc:.2f}x",
        )
        if kv_tokens < max_len:
            self._fail_max_len(max_len, kv_bytes, kv_tokens)
        await self._maybe_hang("kv")
        if not a.enforce_eager:
            took = await self._phase("graph_capture_s")
            log.info(
                w,
                "gpu_model_runner.py:4870",
                f"Graph capturing finished in {max(1, round(took))} secs, took 0.54 GiB",
            )
        log.info(
            "EngineCore",
            "core.py:402",
            "init engine (profile, create kv cache, warmup model) took "
            f"{time.monotonic() - start:.2f} s",
        )
        await self._maybe_hang("init")
        await self._phase("api_start_s")
        return BootResult(sock, host, port, max_len, kv_bytes, kv_tokens)

    def _env_warnings(self, version: str) -> None:
        """Warn about old MoE environment variables the emulated version deprecates or ignores."""
        current = version_tuple(version)
        for name, spec in (self.cfg.get("moe_env_vars") or {}).items():
            if name not in os.environ:
                continue
            if current >= version_tuple(str(spec["removed"])):
                msg = f"Unknown vLLM environment variable detected: {name} (ignored)"
                self.log.warning("APIServer", "envs.py:1762", msg)
            elif current >= version_tuple(str(spec["deprecated"])):
                msg = f"{name} is deprecated, removed in v{spec['removed']}; use --moe-backend"
                self.log.warning("APIServer", "envs.py:1748", msg)

    async def _maybe_hang(self, phase: str) -> None:
        """With the never_ready fault, hang forever (silently) after the configured phase."""
        if (
            self.fault == "never_ready"
            and str(cfg_get(self.cfg, "faults.never_ready.after_phase")) == phase
        ):
            await asyncio.Event().wait()

    def _fail_worker(self, root: str) -> None:
        """Print a worker start failure (like the refused MoE backend) and fail the boot."""
        where = "multiproc_executor.py:953"
        self.log.error("Worker", where, "WorkerProc failed to start.")
        self.log.traceback("Worker", where, WORKER_FRAMES, root)
        self.log.info(
            "EngineCore",
            "multiproc_executor.py:479",
            "[shutdown] Executor: waiting for worker exit count=1",
        )
        exc = (
            "Exception: WorkerProc initialization failed due to an exception in a background "
            "process. See stack trace for root cause."
        )
        engine_core_failed(self.log, [], exc)
        raise BootFailed(1)

    def _fail_kv(self) -> None:
        """Print an out-of-memory failure during KV cache allocation and fail the boot."""
        root = str(cfg_get(self.cfg, "faults.kv_alloc_fail.root_cause"))
        engine_core_failed(self.log, KV_FRAMES, root)
        raise BootFailed(1)

    def _fail_max_len(self, max_len: int, kv_bytes: int, kv_tokens: int) -> None:
        """Refuse a max_model_len that does not fit in the KV pool, as vLLM does at init."""
        per_token = cfg_float(self.cfg, "memory.kv_bytes_per_token")
        root = (
            f"ValueError: To serve at least one request with the models's max seq len "
            f"({max_len}), ({max_len * per_token / 2**30:.2f} GiB KV cache is needed, which is "
            f"larger than the available KV cache memory ({kv_bytes / 2**30:.2f} GiB). Based on "
            f"the available memory, the estimated maximum model length is {kv_tokens}. Try "
            "increasing `gpu_memory_utilization` or decreasing `max_model_len` when initializing "
            "the engine."
        )
        engine_core_failed(self.log, KV_FRAMES, root)
        raise BootFailed(1)

    def _fail_nccl(self) -> None:
        """Print NCCL watchdog timeout lines and fail the boot."""
        stamp = time.strftime("%m%d %H:%M:%S.000000000")
        for line in cfg_get(self.cfg, "faults.nccl_timeout.lines"):
            self.log.raw(str(line).replace("{stamp}", stamp), stderr=True)
        engine_core_failed(self.log, [], str(cfg_get(self.cfg, "faults.nccl_timeout.root_cause")))
        raise BootFailed(1)

    async def _ray(self) -> None:
        """Form the placement group: every worker must accept a TCP connection."""
        cfg, log = self.cfg, self.log
        head = str(cfg_get(cfg, "ray.head_address"))
        log.info(
            "EngineCore",
            "worker.py:1942",
            f"Connecting to existing Ray cluster at address: {head}...",
        )
        log.info("EngineCore", "worker.py:2117", "Connected to Ray cluster.")
        tp = self.args.tensor_parallel_size
        specs = [{"GPU": 1.0, f"node:{head.rsplit(':', 1)[0]}": 0.001}] + [{"GPU": 1.0}] * (tp - 1)
        timeout = scaled(cfg, "ray.connect_timeout_s")
        retry = scaled(cfg, "ray.retry_interval_s")
        give_up = scaled(cfg, "ray.placement_give_up_s")
        interval = scaled(cfg, "ray.placement_log_interval_s")
        backoff = cfg_float(cfg, "ray.placement_log_backoff")
        max_interval = scaled(cfg, "ray.placement_log_max_interval_s")
        scale = cfg_float(cfg, "time_scale")
        start = time.monotonic()
        next_log = start + interval
        while True:
            oks = await asyncio.gather(*(probe(w, timeout) for w in self.workers))
            if all(oks):
                break
            now = time.monotonic()
            if now - start >= give_up:
                log.error("EngineCore", "core.py:1510", "EngineCore failed to start.")
                msg = (
                    "ValueError: Cannot provide a placement group of "
                    f"placement_group_specs={specs} "
                    f"within {int(give_up * scale)} seconds. See `ray status` and `ray list nodes` "
                    "to make sure the cluster has enough resources."
                )
                engine_core_failed(log, [], msg)
                raise BootFailed(1)
            if now >= next_log:
                log.info(
                    "EngineCore",
                    "ray_utils.py:316",
                    "Waiting for creating a placement group of specs for "
                    f"{int((now - start) * scale)} seconds. specs={specs}. Check `ray status` and "
                    "`ray list nodes` to see if you have enough resources, and make sure the IP "
                    "addresses used by ray cluster are the same as VLLM_HOST_IP environment "
                    "variable specified in each node if you are running on a multi-node.",
                )
                interval = min(interval * backoff, max_interval)
                next_log = now + interval
            await asyncio.sleep(retry)
        for w in self.workers:
            log.info(
                "EngineCore",
                "ray_executor.py:281",
                f"Ray worker {w.name} at {w.addr} joined the placement group",
            )
