"""How fast is spark-ops' streaming client? (it must never be what `spark-ops bench` measures)

Starts a local streaming server in a subprocess (aiohttp; vLLM's SSE chunk format, one token per
chunk, as fast as it can) and drives it at C=768 from this one process, recording every token's
arrival time. Prints tok/s and client CPU-seconds per 1,000 tokens, for spark-ops' client and for
a naive aiohttp client (json.loads on every chunk, default connection limit of 100), side by side
with GuideLLM and AIPerf when those are installed.

    python benchmarks/bench_client.py [--concurrency 768] [--tokens 300] [--rounds 2]
    python benchmarks/bench_client.py serve --port 0      # the server alone

Target: >= 30,000 streamed tok/s from one process.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from importlib import util
from pathlib import Path
from typing import Any

TARGET_TOK_S = 30_000


# ----------------------------------------------------------------------------- server


def run_server(port: int, batch: int) -> None:
    """Serve /v1/chat/completions as fast as possible; print the port on stdout."""
    from aiohttp import web

    head = b'data: {"id":"chatcmpl-bench","object":"chat.completion.chunk","created":1764460000,'
    head += b'"model":"bench","choices":[{"index":0,"delta":{'
    role = head + b'"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}\n\n'
    tok = [
        head + f'"content":" tok{i}"'.encode() + b'},"logprobs":null,"finish_reason":null}]}\n\n'
        for i in range(64)
    ]
    done = head + b'},"logprobs":null,"finish_reason":"length"}]}\n\n'

    def usage(n: int) -> bytes:
        """The final usage chunk and [DONE]."""
        body = {
            "id": "chatcmpl-bench",
            "object": "chat.completion.chunk",
            "created": 1764460000,
            "model": "bench",
            "choices": [],
            "usage": {"prompt_tokens": 30, "total_tokens": 30 + n, "completion_tokens": n},
        }
        return b"data: " + json.dumps(body).encode() + b"\n\ndata: [DONE]\n\n"

    async def models(request: web.Request) -> web.Response:
        """One model."""
        return web.json_response({"object": "list", "data": [{"id": "bench"}]})

    async def chat(request: web.Request) -> web.StreamResponse:
        """Stream max_tokens chunks, `batch` chunks per write, yielding between writes."""
        body = await request.json()
        n = int(body.get("max_tokens", 300))
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(role)
        i = 0
        while i < n:
            k = min(batch, n - i)
            await resp.write(b"".join(tok[(i + j) % 64] for j in range(k)))
            i += k
        await resp.write(done + usage(n))
        return resp

    async def main() -> None:
        """Start on 127.0.0.1 and wait forever."""
        app = web.Application()
        app.router.add_get("/v1/models", models)
        app.router.add_post("/v1/chat/completions", chat)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", port, backlog=4096)
        await site.start()
        bound = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        print(bound, flush=True)
        await asyncio.Event().wait()

    asyncio.run(main())


def start_server(batch: int) -> tuple[subprocess.Popen[str], str]:
    """Start the server subprocess and return it with its base URL."""
    proc = subprocess.Popen(
        [sys.executable, __file__, "serve", "--port", "0", "--batch", str(batch)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    if not line.isdigit():
        proc.kill()
        raise SystemExit(f"bench server did not start (said {line!r})")
    return proc, f"http://127.0.0.1:{line}"


# ----------------------------------------------------------------------------- clients


async def spark_ops_client(url: str, c: int, tokens: int) -> tuple[int, int, int]:
    """spark-ops' StreamClient: returns (tokens by usage, token arrival times recorded, errors)."""
    from spark_ops.bench.client import StreamClient

    body = {
        "model": "bench",
        "messages": [{"role": "user", "content": "x"}],
        "max_tokens": tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    async with StreamClient(url, timeout_s=300) as client:
        recs = await asyncio.gather(
            *(client.stream("/v1/chat/completions", body, i) for i in range(c))
        )
    return (
        sum(r.output_tokens for r in recs if r.ok),
        sum(len(r.chunk_times) for r in recs),
        sum(1 for r in recs if not r.ok),
    )


async def naive_client(url: str, c: int, tokens: int) -> tuple[int, int, int]:
    """A straightforward aiohttp client: default connector, line iteration, json.loads per chunk."""
    import aiohttp

    body = {
        "model": "bench",
        "messages": [{"role": "user", "content": "x"}],
        "max_tokens": tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
    }

    async def one(session: aiohttp.ClientSession) -> tuple[int, int]:
        """One request: (usage tokens, times recorded)."""
        times: list[float] = []
        used = 0
        async with session.post(url + "/v1/chat/completions", json=body) as resp:
            async for raw in resp.content:
                line = raw.strip()
                if not line.startswith(b"data:") or line == b"data: [DONE]":
                    continue
                obj = json.loads(line[5:])
                if obj.get("usage"):
                    used = obj["usage"]["completion_tokens"]
                for ch in obj.get("choices", []):
                    if ch.get("delta", {}).get("content"):
                        times.append(time.monotonic())
        return used, len(times)

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as session:
        res = await asyncio.gather(*(one(session) for _ in range(c)), return_exceptions=True)
    ok = [r for r in res if isinstance(r, tuple)]
    return sum(u for u, _ in ok), sum(t for _, t in ok), len(res) - len(ok)


@dataclass
class Row:
    """One client run: tokens by usage, arrival times recorded, errors, wall and CPU seconds."""

    client: str
    tokens: int
    recorded: int
    errors: int
    wall_s: float
    cpu_s: float

    @property
    def tok_s(self) -> float:
        """Streamed tokens per wall-clock second."""
        return self.tokens / self.wall_s if self.wall_s else 0.0

    @property
    def cpu_per_1k(self) -> float:
        """Client CPU-seconds per 1,000 tokens."""
        return 1000 * self.cpu_s / self.tokens if self.tokens else float("nan")

    @property
    def cpu_frac(self) -> float:
        """Share of one core the client used."""
        return self.cpu_s / self.wall_s if self.wall_s else 0.0


Client = Callable[[str, int, int], Coroutine[Any, Any, tuple[int, int, int]]]


def measure(name: str, client: Client, url: str, c: int, tokens: int) -> Row:
    """Run one client once; wall, CPU and token figures."""
    cpu0, t0 = time.process_time(), time.perf_counter()
    used, recorded, errors = asyncio.run(client(url, c, tokens))
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    return Row(name, used, recorded, errors, wall, cpu)


def others() -> list[str]:
    """Which of the reference load generators are installed."""
    lines = []
    for name, module in (("GuideLLM", "guidellm"), ("AIPerf", "aiperf")):
        present = util.find_spec(module) is not None or shutil.which(module) is not None
        lines.append(
            f"{name}: installed — compare with its own run at the same concurrency"
            if present
            else f"{name}: not installed; no side-by-side figures (pip install {module} to add)"
        )
    return lines


def main() -> None:
    """Parse arguments; serve, or run the client benchmark and print the table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", nargs="?", default="bench", choices=["bench", "serve"])
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--batch", type=int, default=4, help="chunks per server write")
    ap.add_argument("--concurrency", type=int, default=768)
    ap.add_argument("--tokens", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--no-naive", action="store_true", help="skip the naive client")
    args = ap.parse_args()
    if args.mode == "serve":
        run_server(args.port, args.batch)
        return
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    proc, url = start_server(args.batch)
    rows: list[Row] = []
    try:
        clients: list[tuple[str, Client]] = [("spark-ops StreamClient", spark_ops_client)]
        if not args.no_naive:
            clients.append(("naive aiohttp (json.loads/chunk)", naive_client))
        for _ in range(args.rounds):
            for name, fn in clients:
                rows.append(measure(name, fn, url, args.concurrency, args.tokens))
    finally:
        proc.terminate()
        proc.wait(10)
    print(
        f"\nstreaming client at C={args.concurrency}, {args.tokens} tokens per request, "
        f"{os.cpu_count()} CPUs on this machine (shared), server in a subprocess\n"
    )
    head = (
        f"{'client':<34} {'tokens':>8} {'recorded':>9} {'err':>4} {'wall s':>7} "
        f"{'tok/s':>8} {'CPU s':>6} {'CPU-s/1k tok':>12} {'CPU %':>6} {'1-core cap tok/s':>16}"
    )
    print(head)
    print("-" * len(head))
    for r in rows:
        print(
            f"{r.client:<34} {r.tokens:>8} {r.recorded:>9} {r.errors:>4} {r.wall_s:>7.2f} "
            f"{r.tok_s:>8.0f} {r.cpu_s:>6.2f} {r.cpu_per_1k:>12.4f} {100 * r.cpu_frac:>5.0f}% "
            f"{1000 / r.cpu_per_1k:>16,.0f}"
        )
    best = max(r.tok_s for r in rows if r.client.startswith("spark"))
    print(
        "\n1-core cap: tokens per second the client could take at 100% of one core "
        "(1000 / CPU-s per 1k tokens);\nwhen CPU % is well under 100 the server, not the "
        "client, set the pace."
    )
    print(
        f"best spark-ops tok/s: {best:,.0f} (target {TARGET_TOK_S:,}): "
        + ("met" if best >= TARGET_TOK_S else "NOT met")
    )
    for line in others():
        print(line)


if __name__ == "__main__":
    main()
