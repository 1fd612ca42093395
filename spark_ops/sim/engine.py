"""Simulated vLLM engine: `python -m spark_ops.sim.engine serve MODEL [vllm serve flags]`.

Speaks vLLM's OpenAI API and /metrics, logs like vLLM, boots in (time-compressed) phases, joins
Ray workers given in $SPARK_SIM_RAY_WORKERS, and schedules with continuous batching on a step-time
model. Parameters come from the YAML at --sim-config, $SPARK_SIM_CONFIG or recipes/sim/engine.yaml.
Everything runs time_scale times faster than emulated: divide measured tok/s by time_scale.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
from typing import Any

from spark_ops.sim.engine_api import Api, ServerState, stats_logger
from spark_ops.sim.engine_args import ServeArgs, parse_serve_args
from spark_ops.sim.engine_boot import ROUTES_LOG, Booter, BootFailed, BootResult, Worker, probe
from spark_ops.sim.engine_config import (
    SimConfigError,
    active_fault,
    cfg_get,
    load_config,
    scaled,
)
from spark_ops.sim.engine_log import VllmLog
from spark_ops.sim.engine_model import EngineCore
from spark_ops.sim.ranks import launch_if_ranks, run_headless

USAGE = "usage: python -m spark_ops.sim.engine serve MODEL [vllm serve flags] [--sim-config FILE]"


class SimEngine:
    """One simulated `vllm serve` process: boot, serve, shut down on SIGTERM."""

    def __init__(self, cfg: dict[str, Any], args: ServeArgs, log: VllmLog | None = None) -> None:
        """Keep the config, parsed arguments and log writer."""
        self.cfg, self.args = cfg, args
        self.log = log or VllmLog()
        self.stop_requested = asyncio.Event()
        self.signals = 0
        self.exit_code = 0

    def _on_signal(self) -> None:
        """First SIGTERM/SIGINT: graceful shutdown; a second one: stop waiting."""
        self.signals += 1
        self.stop_requested.set()

    async def run(self) -> int:
        """Boot, serve until a signal or a fatal fault, then shut down; return the exit code."""
        children = _spawn_children() if self.cfg.get("spawn_children") else []
        try:
            return await self._run()
        finally:
            for child in children:  # a graceful end takes them along; a SIGKILL does not
                with contextlib.suppress(ProcessLookupError):
                    child.kill()
                child.wait()

    async def _run(self) -> int:
        """Boot, serve until a signal or a fatal fault, then shut down; return the exit code."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._on_signal)
        if self.args.extras.get("headless"):  # a worker rank: no API server (sim/ranks.py)
            self.log.info(
                "Worker", "api_utils.py:286", f"non-default args: {self.args.non_default!r}"
            )
            return await run_headless(self.cfg, self.args, self.log, self.stop_requested)
        booter = Booter(self.cfg, self.args, self.log)
        boot = asyncio.ensure_future(booter.run())
        stop = asyncio.ensure_future(self.stop_requested.wait())
        await asyncio.wait({boot, stop}, return_when=asyncio.FIRST_COMPLETED)
        if not boot.done():
            boot.cancel()
            with contextlib.suppress(asyncio.CancelledError, BootFailed):
                await boot
            booter.close_ranks()
            self.log.info(
                "APIServer", "launcher.py:254", "[shutdown] API server: shutdown triggered"
            )
            return 0
        stop.cancel()
        try:
            result = boot.result()
        except BootFailed as exc:
            booter.close_ranks()
            return exc.code
        try:
            return await self._serve(result, booter)
        finally:
            booter.close_ranks()

    async def _serve(self, boot: BootResult, booter: Booter) -> int:
        """Start the HTTP API on the reserved socket and the engine loop; wait for the end."""
        from aiohttp import web

        a, log = self.args, self.log
        core = EngineCore(
            self.cfg,
            max_num_seqs=a.max_num_seqs,
            max_num_batched_tokens=a.max_num_batched_tokens,
            kv_tokens=boot.kv_tokens,
        )
        st = ServerState(
            a, self.cfg, core, log, boot.max_model_len, boot.kv_cache_memory_bytes, boot.kv_tokens
        )
        app = Api(st).build()
        kwargs: dict[str, Any] = {"handle_signals": False}
        if cfg_get(self.cfg, "server.access_log"):
            kwargs["access_log_class"] = _make_access_log()
        else:
            kwargs["access_log"] = None
        runner = web.AppRunner(app, **kwargs)
        await runner.setup()
        # Listen before announcing, so a client reading the log never meets a refused connection.
        site = web.SockSite(runner, boot.sock, shutdown_timeout=0.5)
        await site.start()
        log.info("APIServer", "api_server.py:1881", "Supported tasks: ['generate']")
        log.info(
            "APIServer",
            "api_server.py:1912",
            f"Starting vLLM server on http://{boot.host}:{boot.port}",
        )
        log.info("APIServer", "launcher.py:186", "Available routes are:")
        for route, methods in ROUTES_LOG:
            log.info("APIServer", "launcher.py:195", f"Route: {route}, Methods: {methods}")
        pid = os.getpid()
        for text in (
            f"INFO:     Started server process [{pid}]",
            "INFO:     Waiting for application startup.",
            "INFO:     Application startup complete.",
        ):
            log.raw(text, stderr=True)
        fatal = asyncio.Event()
        core_task = asyncio.ensure_future(core.run())
        core_task.add_done_callback(lambda t: self._core_ended(t, st, fatal))
        tasks = [
            core_task,
            asyncio.ensure_future(
                stats_logger(st, scaled(self.cfg, "server.stats_log_interval_s"))
            ),
        ]
        tasks += [asyncio.ensure_future(self._watch_worker(core, w)) for w in booter.workers]
        if booter.ranks is not None:
            tasks.append(asyncio.ensure_future(booter.ranks.watch(core.wedge)))
        if active_fault(self.cfg) == "dead_while_serving":
            tasks.append(asyncio.ensure_future(self._die_later(st, fatal)))
        if active_fault(self.cfg) == "wedged_while_serving":
            tasks.append(asyncio.ensure_future(self._wedge_later(core)))
        stop = asyncio.ensure_future(self.stop_requested.wait())
        dead = asyncio.ensure_future(fatal.wait())
        await asyncio.wait({stop, dead}, return_when=asyncio.FIRST_COMPLETED)
        if dead.done():
            code = 1
        else:
            await self._drain(st)
            code = 0
        core.abort_all()
        core.stop()
        await asyncio.sleep(0.05)  # let handlers flush their final chunks
        for task in [*tasks, stop, dead]:
            task.cancel()
        await runner.cleanup()
        if code == 0:
            self._shutdown_tail()
        return code

    def _core_ended(
        self, task: asyncio.Future[None], st: ServerState, fatal: asyncio.Event
    ) -> None:
        """If the engine loop crashed, report it like vLLM's dead engine and end the process."""
        if task.cancelled() or task.exception() is None:
            return
        st.dead = True
        self.log.error(
            "EngineCore",
            "core.py:1120",
            f"EngineCore encountered a fatal error: {task.exception()!r}",
        )
        fatal.set()

    async def _drain(self, st: ServerState) -> None:
        """Stop accepting; wait up to --shutdown-timeout (unscaled) for in-flight requests."""
        log, timeout = self.log, int(self.args.shutdown_timeout)
        mode = "drain" if timeout > 0 else "abort"
        log.info("APIServer", "launcher.py:254", "[shutdown] API server: shutdown triggered")
        log.info(
            "APIServer",
            "launcher.py:270",
            f"[shutdown] API server: stopping engine client mode={mode} timeout={timeout}s",
        )
        log.info(
            "EngineCore", "core.py:1454", "[shutdown] EngineCore: trigger received signal=SIGTERM"
        )
        st.draining = True
        if timeout > 0 and st.core.in_flight:
            log.info(
                "EngineCore",
                "core.py:1655",
                f"[shutdown] EngineCore: draining in-flight requests count={st.core.in_flight} "
                f"timeout={timeout}s",
            )
            loop = asyncio.get_running_loop()
            end = loop.time() + timeout
            self.stop_requested.clear()
            while st.core.in_flight and loop.time() < end and self.signals < 2:
                await asyncio.sleep(0.02)
        log.info(
            "EngineCore",
            "core.py:1666",
            "[shutdown] EngineCore: request processing complete; starting resource teardown",
        )
        log.info("EngineCore", "core.py:1499", "[shutdown] EngineCore: exiting busy loop")

    def _shutdown_tail(self) -> None:
        """Print the last shutdown lines (API server and uvicorn)."""
        log = self.log
        log.info("APIServer", "core_client.py:777", "[shutdown] MPClient: complete")
        log.info(
            "APIServer",
            "launcher.py:304",
            "[shutdown] API server: shutting down FastAPI HTTP server",
        )
        for text in (
            "INFO:     Shutting down",
            "INFO:     Waiting for application shutdown.",
            "INFO:     Application shutdown complete.",
            f"INFO:     Finished server process [{os.getpid()}]",
        ):
            log.raw(text, stderr=True)

    async def _watch_worker(self, core: EngineCore, worker: Worker) -> None:
        """Poll a Ray worker; when it stops answering, wedge the engine (health stays 200)."""
        interval = scaled(self.cfg, "ray.poll_interval_s")
        timeout = scaled(self.cfg, "ray.connect_timeout_s")
        reader: asyncio.StreamReader | None = None
        writer: asyncio.StreamWriter | None = None
        with contextlib.suppress(OSError):
            reader, writer = await asyncio.open_connection(worker.host, worker.port)
        try:
            while not core.wedged:
                if reader is not None:
                    try:
                        data = await asyncio.wait_for(reader.read(4096), interval)
                        if data:
                            continue
                        lost = True  # the worker closed our connection
                    except asyncio.TimeoutError:
                        lost = not await probe(worker, timeout)
                    except OSError:
                        lost = True
                else:
                    await asyncio.sleep(interval)
                    lost = not await probe(worker, timeout)
                if lost:
                    for line in cfg_get(self.cfg, "ray.wedge_log_lines") or []:
                        self.log.raw(str(line).format(name=worker.name, addr=worker.addr))
                    core.wedge()
        finally:
            if writer is not None:
                writer.close()

    async def _wedge_later(self, core: EngineCore) -> None:
        """Fault wedged_while_serving: after a while, the first step with requests running never
        ends (a collective stuck): /health stays 200, they stay running, the counters freeze."""
        await asyncio.sleep(scaled(self.cfg, "faults.wedged_while_serving.after_s"))
        while not core.running:
            await asyncio.sleep(0.05)
        core.wedge()

    async def _die_later(self, st: ServerState, fatal: asyncio.Event) -> None:
        """Fault dead_while_serving: the engine core dies; /health turns 503; then exit 1."""
        await asyncio.sleep(scaled(self.cfg, "faults.dead_while_serving.after_s"))
        st.dead = True
        self.log.error(
            "APIServer",
            "core_client.py:596",
            "Engine core proc EngineCore died unexpectedly, shutting down client.",
        )
        self.log.error("APIServer", "async_llm.py:480", "AsyncLLM output_handler failed.")
        self.log.raw(
            "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. "
            "See stack trace (above) for the root cause.",
            stderr=True,
        )
        st.core.abort_all()
        await asyncio.sleep(scaled(self.cfg, "faults.dead_while_serving.exit_after_s"))
        fatal.set()


_CHILD = (
    "import ctypes, sys, time\n"
    "ctypes.CDLL(None).prctl(15, sys.argv[1].encode(), 0, 0, 0)\n"
    "while True: time.sleep(3600)\n"
)


def _spawn_children() -> list[subprocess.Popen[bytes]]:
    """Real child processes named like vLLM's (`spawn_children: true` in the sim config).

    They hold nothing but their names, and stay in the engine's process group: killing the API
    server alone (SIGKILL) leaves them running, as a real vLLM leaves its EngineCore and workers.
    """
    return [
        subprocess.Popen(
            [sys.executable, "-c", _CHILD, name],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for name in ("VLLM::EngineCore", "VLLM::Worker_TP0")
    ]


def _make_access_log() -> type:
    """Build the uvicorn-style access logger class (aiohttp imported lazily)."""
    from aiohttp.abc import AbstractAccessLogger

    class AccessLog(AbstractAccessLogger):
        """Write `INFO:     127.0.0.1:41354 - "GET /health HTTP/1.1" 200 OK` lines on stdout."""

        def log(self, request: Any, response: Any, time: float) -> None:
            """Log one finished request."""
            peer = request.transport.get_extra_info("peername") if request.transport else None
            who = f"{peer[0]}:{peer[1]}" if peer else "-"
            v = request.version
            sys.stdout.write(
                f'INFO:     {who} - "{request.method} {request.path_qs} HTTP/{v.major}.{v.minor}" '
                f"{response.status} {response.reason}\n"
            )
            sys.stdout.flush()

    return AccessLog


def _prescan_sim_config(argv: list[str]) -> str | None:
    """Find --sim-config before full parsing (the flag choices depend on the config)."""
    for i, tok in enumerate(argv):
        if tok == "--sim-config" and i + 1 < len(argv):
            return argv[i + 1]
        if tok.startswith("--sim-config="):
            return tok.split("=", 1)[1]
    return None


def main(argv: list[str] | None = None) -> int:
    """Entry point: `serve MODEL [flags]`; returns the process exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] != "serve":
        sys.stderr.write(USAGE + "\n")
        return 2
    try:
        cfg = load_config(_prescan_sim_config(argv[1:]))
        argv = launch_if_ranks(argv, cfg)
    except SimConfigError as exc:
        sys.stderr.write(f"error: {exc.message}\n")
        return 1
    except (OSError, ValueError, KeyError) as exc:
        sys.stderr.write(f"error: cannot start the worker ranks: {exc}\n")
        return 1
    try:
        args = parse_serve_args(cfg, argv[1:])
    except SimConfigError as exc:
        sys.stderr.write(f"error: {exc.message}\n")
        return 1
    try:
        return asyncio.run(SimEngine(cfg, args).run())
    except SimConfigError as exc:
        sys.stderr.write(f"error: {exc.message}\n")
        return 1


if __name__ == "__main__":
    sys.exit(main())
