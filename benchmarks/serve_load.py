"""How `spark-ops serve` holds under load and abuse: many clients, slow clients, huge headers.

Starts the real `spark-ops serve` on 127.0.0.1 (an inventory whose head does not answer: the
routes timed here read no cluster) and, bounded in count and time, loopback only:

1. many clients: C concurrent clients each make R authorized requests to /api/boot;
2. slow clients: S connections send half a request head and stop; how many the server closes at
   once (over its connection limit), how long until every one is closed (the head deadline), and
   when a real request is answered again;
3. huge headers: H requests with a 9 KB Authorization header: every answer a 4xx, and how many
   bytes serve's stderr grew (no traceback, no token).

    python benchmarks/serve_load.py [--clients 100 --requests 20 --slow 400 --huge 200]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import secrets
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

DEADLINE_S = 120.0  # no phase runs longer


def start(tmp: Path) -> tuple[subprocess.Popen[str], str, str, Path]:
    """`spark-ops serve` on a free loopback port: its process, URL, token and stderr file."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead_port = s.getsockname()[1]
    inv = tmp / "inventory.yaml"
    inv.write_text(
        "clusters:\n  c:\n    ssh: {connect_timeout: 2}\n    nodes:\n"
        f"      node1: {{host: 127.0.0.1, port: {dead_port}, role: head}}\n"
        "    recipe: {path: /r.yaml}\n    watchdog: {restart_command: 'true', history_file: /h}\n"
    )
    token = secrets.token_urlsafe(24)
    token_file = tmp / "token"
    token_file.write_text(token + "\n")
    token_file.chmod(0o600)
    err = tmp / "stderr"
    env = dict(os.environ, SPARK_OPS_INVENTORY=str(inv), HOME=str(tmp / "home"))
    proc = subprocess.Popen(
        [sys.executable, "-m", "spark_ops.cli.main", "serve", "--port", "0", "--json",
         "--token-file", str(token_file)],
        env=env, stdout=subprocess.PIPE, stderr=err.open("w"), text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    return proc, json.loads(proc.stdout.readline())["url"], token, err


async def many(url: str, token: str, clients: int, requests: int) -> str:
    """Phase 1: latencies and rate of authorized requests from concurrent clients."""
    times: list[float] = []
    codes: dict[int, int] = {}
    conn = aiohttp.TCPConnector(limit=clients)
    async with aiohttp.ClientSession(connector=conn) as http:

        async def client() -> None:
            """One client's requests, one after another."""
            for _ in range(requests):
                t = time.perf_counter()
                async with http.get(
                    url + "/api/boot", headers={"Authorization": f"Bearer {token}"}
                ) as r:
                    await r.read()
                    codes[r.status] = codes.get(r.status, 0) + 1
                times.append(time.perf_counter() - t)

        t0 = time.perf_counter()
        await asyncio.wait_for(asyncio.gather(*(client() for _ in range(clients))), DEADLINE_S)
        wall = time.perf_counter() - t0
    q = statistics.quantiles(times, n=100)
    return (
        f"many clients: {clients} x {requests} requests in {wall:.1f} s = "
        f"{len(times) / wall:.0f} req/s; latency p50 {q[49] * 1000:.0f} ms, p99 "
        f"{q[98] * 1000:.0f} ms; answers {codes}"
    )


async def slow(url: str, token: str, count: int) -> str:
    """Phase 2: half-sent request heads; when they are closed, when real requests pass again."""
    host, _, port = url.removeprefix("http://").partition(":")
    conns = []
    t0 = time.perf_counter()
    for _ in range(count):
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(b"GET / HTTP/1.1\r\nHost: a\r\nX-Slow: ")
        conns.append((reader, writer))
    closed_at: list[float] = []

    async def watch(reader: asyncio.StreamReader) -> None:
        """Wait for the server to close this connection."""
        with contextlib.suppress(ConnectionResetError):
            await reader.read()
        closed_at.append(time.perf_counter() - t0)

    watchers = [asyncio.create_task(watch(r)) for r, _ in conns]
    await asyncio.sleep(0.5)
    at_once = len(closed_at)
    await asyncio.wait_for(asyncio.gather(*watchers), DEADLINE_S)
    for _, w in conns:
        w.close()
    async with aiohttp.ClientSession() as http:
        t = time.perf_counter()
        async with http.get(url + "/api/boot", headers={"Authorization": f"Bearer {token}"}) as r:
            status = r.status
        after = time.perf_counter() - t
    return (
        f"slow clients: {count} half-sent heads; {at_once} closed at once (over the limit), all "
        f"closed after {max(closed_at):.1f} s; then a real request: HTTP {status} in "
        f"{after * 1000:.0f} ms"
    )


async def huge(url: str, token: str, count: int, err: Path) -> str:
    """Phase 3: oversized Authorization headers; the answers and serve's stderr growth."""
    host, _, port = url.removeprefix("http://").partition(":")
    before = err.stat().st_size
    codes: dict[bytes, int] = {}
    for _ in range(count):
        reader, writer = await asyncio.open_connection(host, int(port))
        head = f"GET / HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer {token}{'x' * 9000}\r\n\r\n"
        writer.write(head.encode())
        line = await asyncio.wait_for(reader.readline(), DEADLINE_S)
        code = line.split(b" ")[1] if line.count(b" ") >= 1 else b"?"
        codes[code] = codes.get(code, 0) + 1
        writer.close()
    grown = err.stat().st_size - before
    text = err.read_text(errors="replace")
    leak = "token found" if token in text else "no token"
    trace = "tracebacks" if "Traceback" in text else "no traceback"
    return (
        f"huge headers: {count} requests, answers {codes}; stderr +{grown} bytes, {leak}, {trace}"
    )


async def run(args: argparse.Namespace) -> None:
    """The three phases against one server."""
    with tempfile.TemporaryDirectory(prefix="spo-serve-load-") as d:
        proc, url, token, err = start(Path(d))
        try:
            print(await many(url, token, args.clients, args.requests))
            print(await slow(url, token, args.slow))
            print(await huge(url, token, args.huge, err))
        finally:
            t = time.perf_counter()
            proc.terminate()
            proc.wait(timeout=DEADLINE_S)
            print(f"SIGTERM: serve stopped in {time.perf_counter() - t:.2f} s")


def main() -> None:
    """Parse the bounds and run."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=100)
    ap.add_argument("--requests", type=int, default=20)
    ap.add_argument("--slow", type=int, default=400)
    ap.add_argument("--huge", type=int, default=200)
    args = ap.parse_args()
    for name in ("clients", "requests", "slow", "huge"):
        if not 1 <= getattr(args, name) <= 2000:
            ap.error(f"--{name} must be 1..2000")
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
