"""Tests of the sim vLLM engine: step model, flags, boot lines, API, scheduler, Ray, faults."""

from __future__ import annotations

import ast
import asyncio
import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from spark_ops.sim.engine_config import load_config
from spark_ops.sim.engine_model import EngineCore, Request, virtual_burst

FIXTURES = Path(__file__).parent / "fixtures" / "sim"
REPO = Path(__file__).resolve().parents[1]
ENGINE = [sys.executable, "-m", "spark_ops.sim.engine", "serve"]

pytestmark = pytest.mark.timeout(60)


# -- math and parsing (no processes) ---------------------------------------------------------------
def _note() -> dict[str, Any]:
    """Load the ops note's burst table."""
    return yaml.safe_load((FIXTURES / "ops_note_burst.yaml").read_text())


def _burst(concurrency: int, cap: int) -> tuple[float, float]:
    """Aggregate and per-user tok/s of an all-at-once burst on the engine core's virtual clock."""
    note = _note()
    cfg = load_config(REPO / "recipes" / "sim" / "engine.yaml")
    tokens = note["output_tokens"]
    times = virtual_burst(
        cfg, concurrency=concurrency, cap=cap, output_tokens=tokens,
        prompt_tokens=note["prompt_tokens"],
    )  # fmt: skip
    wall = max(t.end_s for t in times)
    return concurrency * tokens / wall, sum(tokens / t.end_s for t in times) / concurrency


def test_engine_tells_the_ops_note_within_5_percent() -> None:
    """At cap 64, aggregate and per-user tok/s within 5% of each of the note's five rows."""
    note = _note()
    for point in note["points"]:
        agg, user = _burst(point["concurrency"], note["cap"])
        assert abs(agg / point["tok_s"] - 1) <= 0.05, (point, agg)
        assert abs(user / point["per_user"] - 1) <= 0.05, (point, user)


def test_cap_of_six_plateaus() -> None:
    """With --max-num-seqs 6, bursts above 6 stay on the plateau of C=6 while the rest wait."""
    base, prev = _burst(6, 6)
    within = _note()["cap6_plateau_within"]
    for concurrency in (16, 32, 64):
        agg, user = _burst(concurrency, 6)
        assert abs(agg / base - 1) <= within, (concurrency, agg)
        assert user < prev, (concurrency, user)  # each wave waits for the one before
        prev = user


async def test_engine_core_caps_batch_and_serves_fifo() -> None:
    """In-process: never more than max_num_seqs running; requests start in arrival order."""
    cfg = load_config(FIXTURES / "fast.yaml")
    cfg["time_scale"] = 1e4
    core = EngineCore(cfg, max_num_seqs=3, max_num_batched_tokens=8192, kv_tokens=10**6)
    loop_task = asyncio.ensure_future(core.run())
    reqs = [Request(prompt_tokens=5, max_tokens=4 + (i % 2)) for i in range(8)]
    for req in reqs:
        core.submit(req)
    peak = 0
    while not all(r.done for r in reqs):
        peak = max(peak, len(core.running))
        await asyncio.sleep(0)
    core.stop()
    await loop_task
    assert peak == 3
    starts = [r.first_token_at for r in reqs]
    assert starts == sorted(starts)  # type: ignore[type-var]
    assert [r.finish_reason for r in reqs] == ["length"] * 8
    assert core.stats.generation_tokens == sum(r.max_tokens for r in reqs)
    assert core.stats.success["length"] == 8


def test_config_base_merge_and_missing_file(tmp_path: Path) -> None:
    """A `base:` file is deep-merged under the overlay; a missing file names its path."""
    cfg = load_config(FIXTURES / "fast.yaml")
    assert cfg["boot"]["weights_s"] == 0.05
    assert cfg["scheduler"]["te_s"] == 0.08357  # from the base
    from spark_ops.sim.engine_config import SimConfigError

    with pytest.raises(SimConfigError, match=r"nope\.yaml"):
        load_config(tmp_path / "nope.yaml")


# -- helpers for real subprocesses -----------------------------------------------------------------
def _write_config(tmp_path: Path, **overrides: Any) -> Path:
    """Write a config = tests' fast overlay + overrides; return its path."""
    data = {"base": str(FIXTURES / "fast.yaml"), **overrides}
    path = tmp_path / "engine.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


class Proc:
    """A running sim engine subprocess whose stdout/stderr lines are collected live."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        """Start collecting both streams."""
        self.proc = proc
        self.out: list[str] = []
        self.err: list[str] = []
        self._changed = asyncio.Event()
        assert proc.stdout and proc.stderr
        self._tasks = [
            asyncio.ensure_future(self._pump(proc.stdout, self.out)),
            asyncio.ensure_future(self._pump(proc.stderr, self.err)),
        ]

    async def _pump(self, stream: asyncio.StreamReader, into: list[str]) -> None:
        """Append lines as they arrive."""
        while line := await stream.readline():
            into.append(line.decode().rstrip("\n"))
            self._changed.set()
        self._changed.set()

    async def wait_line(self, pattern: str, timeout: float = 15.0) -> re.Match[str]:
        """Wait until a stdout/stderr line matches; fail with the output so far."""
        rx = re.compile(pattern)
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        while True:
            for line in self.out + self.err:
                if m := rx.search(line):
                    return m
            left = end - loop.time()
            if left <= 0 or (
                self.proc.returncode is not None and all(t.done() for t in self._tasks)
            ):
                raise AssertionError(
                    f"no line matching {pattern!r}:\n" + "\n".join(self.out + self.err)
                )
            self._changed.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._changed.wait(), min(left, 0.5))

    async def wait_exit(self, timeout: float = 15.0) -> int:
        """Wait for the process to exit and its output to drain; return the exit code."""
        code = await asyncio.wait_for(self.proc.wait(), timeout)
        await asyncio.wait_for(asyncio.gather(*self._tasks), 5)
        return code

    async def url(self) -> str:
        """Return the API base URL from the `Starting vLLM server on` line."""
        m = await self.wait_line(r"Starting vLLM server on (http://\S+)")
        return m.group(1)

    def kill(self) -> None:
        """Kill the process if it still runs."""
        if self.proc.returncode is None:
            self.proc.kill()


@contextlib.asynccontextmanager
async def engine(
    tmp_path: Path, *flags: str, env: dict[str, str] | None = None, **overrides: Any
) -> AsyncIterator[Proc]:
    """Run the sim engine on 127.0.0.1 port 0 with the fast config (+ overrides)."""
    cfg = _write_config(tmp_path, **overrides)
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("SPARK_SIM_")}
    full_env.update({"SPARK_SIM_CONFIG": str(cfg), **(env or {})})
    proc = await asyncio.create_subprocess_exec(
        *ENGINE,
        "models/glm-5.3-flash",
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        *flags,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=full_env,
    )
    p = Proc(proc)
    try:
        yield p
    finally:
        p.kill()
        with contextlib.suppress(Exception):
            await p.wait_exit(5)


async def _stream(
    session: aiohttp.ClientSession, url: str, body: dict[str, Any]
) -> tuple[list[dict[str, Any]], bool]:
    """POST a streaming request; return the parsed chunks and whether [DONE] arrived."""
    chunks: list[dict[str, Any]] = []
    done = False
    async with session.post(url, json={**body, "stream": True}) as resp:
        assert resp.status == 200, await resp.text()
        async for raw in resp.content:
            line = raw.decode().strip()
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                done = True
            else:
                chunks.append(json.loads(line[6:]))
    return chunks, done


def _metric(text: str, name: str) -> float:
    """Return the value of a metric sample by name prefix."""
    for line in text.splitlines():
        if line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not in /metrics")


# -- argument parsing through the real entry point -------------------------------------------------
def _run_cli(tmp_path: Path, *args: str, **overrides: Any) -> subprocess.CompletedProcess[str]:
    """Run the entry point synchronously (for argument errors, which exit before booting)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPARK_SIM_")}
    env["SPARK_SIM_CONFIG"] = str(_write_config(tmp_path, **overrides))
    return subprocess.run(
        [*ENGINE, *args], capture_output=True, text=True, env=env, timeout=30, check=False
    )


def test_unknown_moe_backend_refused_at_parsing(tmp_path: Path) -> None:
    """An unknown --moe-backend exits 2 with argparse's usage and invalid-choice error."""
    res = _run_cli(tmp_path, "m", "--moe-backend", "warp_speed")
    assert res.returncode == 2
    assert res.stderr.startswith("usage: vllm serve")
    assert "error: argument --moe-backend: invalid choice: 'warp_speed'" in res.stderr
    assert "'marlin'" in res.stderr and "b12x'" not in res.stderr.replace("flashinfer_b12x'", "")


def test_moe_backend_flag_unknown_before_0_18(tmp_path: Path) -> None:
    """Before vLLM 0.18 --moe-backend does not exist: the choices follow the emulated version."""
    res = _run_cli(tmp_path, "m", "--moe-backend", "marlin", vllm_version="0.17.1")
    assert res.returncode == 2
    assert "error: unrecognized arguments: --moe-backend marlin" in res.stderr
    res = _run_cli(tmp_path, "m", "--moe-backend=b12x")
    assert res.returncode == 2 and "invalid choice: 'b12x'" in res.stderr
    res = _run_cli(
        tmp_path, "m", "--moe-backend=b12x", vllm_version="0.33.0", fault="kv_alloc_fail"
    )
    assert res.returncode == 1 and "invalid choice" not in res.stderr
    assert "'moe_backend': 'b12x'" in res.stdout


@pytest.mark.parametrize(
    ("version", "evidence"),
    [
        ("0.32.0", "VLLM_MXFP4_USE_MARLIN is deprecated"),
        ("0.33.0", "Unknown vLLM environment variable detected: VLLM_MXFP4_USE_MARLIN"),
        ("0.21.0", None),
    ],
)
def test_old_moe_env_vars_warned_by_version(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, version: str, evidence: str | None
) -> None:
    """The pre-0.18 MoE env vars: deprecated in 0.22+, unknown (ignored) from 0.33."""
    monkeypatch.setenv("VLLM_MXFP4_USE_MARLIN", "1")
    res = _run_cli(tmp_path, "m", vllm_version=version, fault="kv_alloc_fail")
    assert res.returncode == 1
    warnings = [ln for ln in res.stdout.splitlines() if "VLLM_MXFP4_USE_MARLIN" in ln]
    if evidence is None:
        assert warnings == []
    else:
        assert len(warnings) == 1 and evidence in warnings[0] and " WARNING " in warnings[0]


def test_missing_sim_config_named(tmp_path: Path) -> None:
    """--sim-config pointing nowhere fails with exit 1 naming the file."""
    res = _run_cli(tmp_path, "m", "--sim-config", str(tmp_path / "absent.yaml"))
    assert res.returncode == 1 and "absent.yaml: cannot read sim config" in res.stderr


def test_port_in_use_fails(tmp_path: Path) -> None:
    """A port already taken fails the start with exit 1 and the OSError."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        res = _run_cli(tmp_path, "m", "--host", "127.0.0.1", "--port", port, "-O3")
    assert res.returncode == 1 and "Address already in use" in res.stderr
    assert "'optimization_level': 3" in res.stdout  # vLLM reads -O3 as --optimization-level 3


def test_bad_kv_cache_memory_bytes_rejected(tmp_path: Path) -> None:
    """`60GB` is refused at argument parsing (exit 2), naming the flag."""
    res = _run_cli(tmp_path, "m", "--kv-cache-memory-bytes", "60GB")
    assert res.returncode == 2
    assert "argument --kv-cache-memory-bytes: invalid value '60GB'" in res.stderr


# -- boot and API ----------------------------------------------------------------------------------
async def test_boot_lines_in_order_and_api(tmp_path: Path) -> None:
    """Boot lines appear in order; /health, /version, /v1/models and completions work."""
    flags = ["--max-num-seqs", "64", "--kv-cache-memory", "60G", "--served-model-name", "glm"]
    flags += ["--tensor-parallel-size", "1", "--dtype", "bfloat16", "--enable-chunked-prefill"]
    async with engine(tmp_path, *flags) as p:
        url = await p.url()
        await p.wait_line(r"Application startup complete\.")
        order = [
            r"non-default args: ",
            r"Loading weights took [\d.]+ seconds",
            r"Model loading took [\d.]+ GiB memory and [\d.]+ seconds",
            r"GPU KV cache size: 2,596,374 tokens, Maximum concurrency for 131,072 tokens per "
            r"request: 9\.42x",
            r"Graph capturing finished in \d+ secs",
            r"init engine \(profile, create kv cache, warmup model\) took [\d.]+ s",
            r"Starting vLLM server on http://127\.0\.0\.1:\d+",
            r"Route: /health, Methods: GET",
        ]
        idx = [next(i for i, ln in enumerate(p.out) if re.search(rx, ln)) for rx in order]
        assert idx == sorted(idx), idx
        assert all(
            re.match(
                r"\((APIServer|EngineCore|Worker) pid=\d+\) (INFO|WARNING) \d\d-\d\d ", p.out[i]
            )
            for i in idx
        )
        nda = ast.literal_eval(p.out[idx[0]].split("non-default args: ", 1)[1])
        assert nda["max_num_seqs"] == 64 and nda["kv_cache_memory_bytes"] == 64424509440
        assert nda["served_model_name"] == ["glm"] and nda["dtype"] == "bfloat16"
        assert nda["enable_chunked_prefill"] is True and "tensor_parallel_size" not in nda
        async with aiohttp.ClientSession() as s:
            async with s.get(url + "/health") as r:
                assert r.status == 200 and await r.read() == b""
            async with s.get(url + "/version") as r:
                assert await r.json() == {"version": "0.32.0"}
            async with s.get(url + "/v1/models") as r:
                assert [m["id"] for m in (await r.json())["data"]] == ["glm"]
            body = {"model": "glm", "prompt": "write a parser", "max_tokens": 7}
            chunks, done = await _stream(
                s, url + "/v1/completions", {**body, "stream_options": {"include_usage": True}}
            )
            assert done
            assert [c["choices"][0]["text"] != "" for c in chunks[:-1]] == [True] * 7
            assert chunks[-2]["choices"][0]["finish_reason"] == "length"
            assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 7
            chat = {
                "model": "glm",
                "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 3,
            }
            async with s.post(url + "/v1/chat/completions", json=chat) as r:
                data = await r.json()
                assert data["usage"]["completion_tokens"] == 3
                assert len(data["choices"][0]["message"]["content"].split()) == 3
            async with s.post(url + "/v1/completions", json={**body, "model": "other"}) as r:
                assert r.status == 404 and "other" in (await r.json())["error"]["message"]
            async with s.get(url + "/metrics") as r:
                text = await r.text()
        assert _metric(text, "vllm:generation_tokens_total") == 10
        assert 'kv_cache_memory_bytes="64424509440"' in text and 'num_gpu_blocks="40568"' in text
        assert 'vllm:time_to_first_token_seconds_count{engine="0",model_name="glm"} 2.0' in text
        p.proc.send_signal(signal.SIGTERM)
        assert await p.wait_exit() == 0
        assert any("Application shutdown complete." in ln for ln in p.err)


async def test_burst_twice_the_cap_waits(tmp_path: Path) -> None:
    """Under a burst of 2x max_num_seqs, running plateaus at the cap and waiting > 0."""
    async with engine(tmp_path, "--max-num-seqs", "4", "--enforce-eager") as p:
        url = await p.url()
        assert not any("Graph capturing" in ln for ln in p.out)
        async with aiohttp.ClientSession() as s:
            body = {"prompt": "x" * 40, "max_tokens": 60, "ignore_eos": True}
            jobs = [
                asyncio.ensure_future(_stream(s, url + "/v1/completions", body)) for _ in range(8)
            ]
            seen: list[tuple[float, float]] = []
            for _ in range(60):
                async with s.get(url + "/metrics") as r:
                    text = await r.text()
                seen.append(
                    (
                        _metric(text, "vllm:num_requests_running"),
                        _metric(text, "vllm:num_requests_waiting"),
                    )
                )
                if seen[-1] == (4.0, 4.0):
                    break
                await asyncio.sleep(0.02)
            assert (4.0, 4.0) in seen, seen
            assert max(r for r, _ in seen) <= 4
            results = await asyncio.gather(*jobs)
            assert all(done and len(chunks) == 60 for chunks, done in results)
            async with s.get(url + "/metrics") as r:
                text = await r.text()
        assert 'finished_reason="length",model_name' in text
        assert _metric(text, "vllm:num_requests_running") == 0
        assert _metric(text, "vllm:generation_tokens_total") == 480
        await p.wait_line(
            r"Engine 000: Avg prompt throughput: [\d.]+ tokens/s, .*Running: \d+ reqs"
        )


async def test_small_kv_cache_preempts_and_completes(tmp_path: Path) -> None:
    """A KV pool of 10 blocks under 4 growing sequences: preemptions happen, all still finish."""
    kv = str(int(640 * 24813.26) + 1)  # 640 tokens = 10 blocks of 64
    async with engine(tmp_path, "--kv-cache-memory-bytes", kv, "--max-model-len", "512") as p:
        url = await p.url()
        await p.wait_line(r"GPU KV cache size: 640 tokens")
        async with aiohttp.ClientSession() as s:
            body = {"prompt": "y" * 40, "max_tokens": 150, "ignore_eos": True}
            jobs = [_stream(s, url + "/v1/completions", body) for _ in range(4)]
            results = await asyncio.gather(*jobs)
            assert all(done and len(chunks) == 150 for chunks, done in results)
            async with s.get(url + "/metrics") as r:
                text = await r.text()
        assert _metric(text, "vllm:num_preemptions_total") > 0
        assert _metric(text, "vllm:generation_tokens_total") == 600


async def test_max_model_len_larger_than_kv_pool_fails(tmp_path: Path) -> None:
    """A KV pool smaller than max_model_len fails the boot like vLLM (exit 1)."""
    async with engine(tmp_path, "--kv-cache-memory-bytes", "16M") as p:
        assert await p.wait_exit() == 1
        assert any("estimated maximum model length is 676" in ln for ln in p.out)


# -- Ray workers -----------------------------------------------------------------------------------
async def _listener() -> tuple[asyncio.AbstractServer, int, list[asyncio.StreamWriter]]:
    """Start a plain TCP listener (a Ray worker node) on a free loopback port."""
    peers: list[asyncio.StreamWriter] = []

    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Keep the connection until the peer closes."""
        peers.append(writer)
        await reader.read()

    server = await asyncio.start_server(hold, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1], peers


def _free_port() -> int:
    """Return a loopback port nobody listens on (yet)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_missing_ray_worker_stalls_then_joins(tmp_path: Path) -> None:
    """A worker that does not accept repeats the placement-group line; the boot resumes on join."""
    up, up_port, _ = await _listener()
    held = socket.socket()  # bound, not listening: connections refused, and no one else takes it
    held.bind(("127.0.0.1", 0))
    late_port = held.getsockname()[1]
    env = {"SPARK_SIM_RAY_WORKERS": f"node2=127.0.0.1:{up_port},node3=127.0.0.1:{late_port}"}
    async with engine(
        tmp_path, "--tensor-parallel-size", "3", "--distributed-executor-backend", "ray", env=env
    ) as p:
        await p.wait_line(r"Waiting for creating a placement group of specs for \d+ seconds")
        give_up = time.monotonic() + 120  # the line repeats: wait for two, not for a time
        while len(waits := [ln for ln in p.out if "Waiting for creating a placement" in ln]) < 2:
            assert time.monotonic() < give_up, f"the wait line never repeated: {p.out[-5:]}"
            await asyncio.sleep(0.05)
        assert not any("Loading weights" in ln for ln in p.out)
        print(f"reached: {len(waits)} placement-group wait lines")
        assert "{'GPU': 1.0}" in waits[0]
        late = await asyncio.start_server(lambda r, w: None, sock=held)  # the worker joins
        await p.url()
        late.close()
    up.close()


async def test_missing_ray_worker_gives_up(tmp_path: Path) -> None:
    """After the give-up time the boot fails like vLLM (no placement group) and exits 1."""
    env = {"SPARK_SIM_RAY_WORKERS": f"node2=127.0.0.1:{_free_port()}"}
    async with engine(tmp_path, env=env, ray={"placement_give_up_s": 0.6}) as p:
        assert await p.wait_exit() == 1
        assert any("Cannot provide a placement group" in ln for ln in p.out + p.err)
        assert "Engine core initialization failed. See root cause above." in "\n".join(p.err)


async def test_lost_worker_wedges_engine_health_stays_200(tmp_path: Path) -> None:
    """A worker lost while serving: tokens stop (client times out) while /health stays 200."""
    server, port, peers = await _listener()
    env = {"SPARK_SIM_RAY_WORKERS": f"node2=127.0.0.1:{port}"}
    async with engine(tmp_path, env=env) as p:
        url = await p.url()
        async with aiohttp.ClientSession() as s:
            _, done = await _stream(s, url + "/v1/completions", {"prompt": "a", "max_tokens": 3})
            assert done
            server.close()
            for peer in peers:
                peer.close()
            await p.wait_line(r"node2 .* is unreachable")
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(
                    _stream(s, url + "/v1/completions", {"prompt": "a", "max_tokens": 3}), 1.0
                )
            async with s.get(url + "/health") as r:
                assert r.status == 200
            async with s.get(url + "/metrics") as r:
                text = await r.text()
            stuck = _metric(text, "vllm:num_requests_running")
            assert stuck + _metric(text, "vllm:num_requests_waiting") == 1


# -- faults ----------------------------------------------------------------------------------------
FAULT_CASES = [
    ("exit_during_weights", [], {}, "Error in safetensors shard"),
    ("kv_alloc_fail", [], {}, "torch.OutOfMemoryError: CUDA out of memory"),
    ("nccl_timeout", [], {}, "Watchdog caught collective operation timeout"),
    (
        None,
        ["--moe-backend", "triton"],
        {"refused_moe_backends": ["triton"]},
        "MoE backend TRITON does not support",
    ),
]


@pytest.mark.parametrize(
    ("fault", "flags", "overrides", "evidence"), FAULT_CASES, ids=lambda v: str(v)[:20]
)
async def test_fault_exits_nonzero_with_its_lines(
    tmp_path: Path, fault: str | None, flags: list[str], overrides: dict[str, Any], evidence: str
) -> None:
    """Each start fault prints its root cause and vLLM's final error, then exits 1."""
    env = {"SPARK_SIM_FAULT": fault} if fault else {}
    async with engine(tmp_path, *flags, env=env, **overrides) as p:
        assert await p.wait_exit() == 1
        text = "\n".join(p.out + p.err)
        assert evidence in text
        assert "RuntimeError: Engine core initialization failed. See root cause above." in text
        assert "Starting vLLM server" not in text


async def test_never_ready_lives_without_api(tmp_path: Path) -> None:
    """never_ready: the process stays alive, the API never comes up."""
    async with engine(tmp_path, env={"SPARK_SIM_FAULT": "never_ready"}) as p:
        await p.wait_line(r"Loading weights took")
        await asyncio.sleep(0.8)
        assert p.proc.returncode is None
        assert not any("Starting vLLM server" in ln or "KV cache size" in ln for ln in p.out)
        p.proc.send_signal(signal.SIGTERM)
        assert await p.wait_exit() == 0


async def test_dead_engine_health_503(tmp_path: Path) -> None:
    """dead_while_serving: /health turns 503 once the engine core is dead, then exit 1."""
    async with engine(tmp_path, fault="dead_while_serving") as p:
        url = await p.url()
        await p.wait_line(r"died unexpectedly")
        async with aiohttp.ClientSession() as s, s.get(url + "/health") as r:
            assert r.status == 503
        assert await p.wait_exit() == 1


# -- shutdown --------------------------------------------------------------------------------------
async def test_sigterm_drains_in_flight_then_exits_0(tmp_path: Path) -> None:
    """SIGTERM with --shutdown-timeout drains in-flight streams ([DONE] arrives), then exit 0."""
    async with engine(tmp_path, "--shutdown-timeout", "20") as p:
        url = await p.url()
        async with aiohttp.ClientSession() as s:
            body = {"prompt": "a", "max_tokens": 40, "ignore_eos": True}
            job = asyncio.ensure_future(_stream(s, url + "/v1/completions", body))
            await asyncio.sleep(0.2)
            p.proc.send_signal(signal.SIGTERM)
            chunks, done = await job
        assert done and len(chunks) == 40
        assert await p.wait_exit() == 0
        await p.wait_line(r"draining in-flight requests count=1 timeout=20s")


async def test_sigterm_without_timeout_stops_now(tmp_path: Path) -> None:
    """SIGTERM with the default --shutdown-timeout 0 aborts streams and exits 0 promptly."""
    async with engine(tmp_path) as p:
        url = await p.url()
        async with aiohttp.ClientSession() as s:
            body = {"prompt": "a", "max_tokens": 5000, "ignore_eos": True}
            job = asyncio.ensure_future(_stream(s, url + "/v1/completions", body))
            await asyncio.sleep(0.2)
            p.proc.send_signal(signal.SIGTERM)
            assert await p.wait_exit(5) == 0
            with contextlib.suppress(aiohttp.ClientError):
                chunks, _ = await job
                assert len(chunks) < 5000
        await p.wait_line(r"mode=abort timeout=0s")


async def test_pause_holds_new_work_and_drain_reports_it(tmp_path: Path) -> None:
    """In dev mode /pause stops new work; EngineAPI.drain uses it and waits for in-flight ones."""
    from spark_ops.engine import EngineAPI

    async with engine(tmp_path, "--max-num-seqs", "4", env={"VLLM_SERVER_DEV_MODE": "1"}) as p:
        url = await p.url()
        body = {"model": "models/glm-5.3-flash", "prompt": "x", "max_tokens": 300}
        body["ignore_eos"] = True
        async with aiohttp.ClientSession() as http:
            busy = [
                asyncio.ensure_future(http.post(url + "/v1/completions", json=body))
                for _ in range(3)
            ]
            await asyncio.sleep(0.3)
            async with EngineAPI(url) as api:
                report = await api.drain(timeout=30, poll=0.1)
                assert report["paused"] is True and report["drained"] is True
                assert report["running_at_start"] >= 1
                late = asyncio.ensure_future(http.post(url + "/v1/completions", json=body))
                await asyncio.sleep(0.5)
                assert not late.done(), "a request sent while paused must wait"
                assert await api.resume() is True
                (await asyncio.wait_for(late, 30)).release()
            for t in busy:
                (await t).release()


async def test_no_pause_outside_dev_mode(tmp_path: Path) -> None:
    """Without VLLM_SERVER_DEV_MODE there is no /pause: drain says so and only waits."""
    from spark_ops.engine import EngineAPI

    async with engine(tmp_path) as p, EngineAPI(await p.url()) as api:
        report = await api.drain(timeout=5, poll=0.1)
    assert report["paused"] is False and report["drained"] is True
