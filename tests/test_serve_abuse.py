"""serve under abuse (issue 34): a saved sweep naming 2**70 users, half-sent requests by the
hundred, request lines and headers over 8 KB carrying the token, a rotated and a removed token
file, SIGTERM. The real `spark-ops serve` runs on 127.0.0.1 against an inventory whose head does
not answer (none of these needs the cluster)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from spark_ops.bench.stats import MAX_LEVEL, MAX_LEVELS
from spark_ops.serve.app import MAX_CONNECTIONS
from spark_ops.serve.source import CACHE_S
from spark_ops.serve.sweeps import MAX_RESULTS

FIXTURES = Path(__file__).parent / "fixtures" / "serve"
DEADLINE_S = 120.0  # a generous bound for anything awaited below on a loaded machine


class Server:
    """A running `spark-ops serve`: its URL, token file, token and process."""

    def __init__(self, url: str, token_file: Path, token: str, proc: subprocess.Popen[str]):
        """Keep what the tests need."""
        self.url, self.token_file, self.token, self.proc = url, token_file, token, proc

    def auth(self, token: str | None = None) -> dict[str, str]:
        """The Authorization header for a token (this server's by default)."""
        return {"Authorization": f"Bearer {token or self.token}"}


def _free_port() -> int:
    """A loopback port nobody listens on (the head's SSH port: nothing answers)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def _serve(tmp_path: Path, results: Path) -> Iterator[Server]:
    """The real `spark-ops serve` on 127.0.0.1 with --results, against a head nobody answers;
    killed at the end if it still runs."""
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(
        "clusters:\n  c:\n    ssh: {connect_timeout: 2}\n    nodes:\n"
        f"      node1: {{host: 127.0.0.1, port: {_free_port()}, role: head}}\n"
        "    recipe: {path: /r.yaml}\n"
        "    watchdog: {restart_command: 'true', history_file: /h}\n"
    )
    token = secrets.token_urlsafe(24)
    token_file = tmp_path / "token"
    token_file.write_text(token + "\n")
    token_file.chmod(0o600)
    env = dict(os.environ, SPARK_OPS_INVENTORY=str(inventory), HOME=str(tmp_path / "home"))
    env.pop("SPARK_OPS_CLUSTER", None)
    proc = subprocess.Popen(  # --log-json: its log lines on stderr, as an operator asks for them
        [sys.executable, "-m", "spark_ops.cli.main", "--log-json", "serve", "--port", "0", "--json",
         "--token-file", str(token_file), "--results", str(results)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line, proc.stderr.read() if proc.stderr else ""
        yield Server(json.loads(line)["url"], token_file, token, proc)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=60)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    """`spark-ops serve` with a saved sweep of max_concurrency 2**70 in --results."""
    results = tmp_path / "results"
    results.mkdir()
    sweep = json.loads((FIXTURES / "sweep-cap5.json").read_text())
    shutil.copy(FIXTURES / "sweep-cap5.json", results / "good.json")
    sweep["levels"][0]["max_concurrency"] = 2**70
    (results / "huge.json").write_text(json.dumps(sweep))
    knobs = json.loads((FIXTURES / "sweep-cap5.json").read_text())
    knobs["knobs"] = {"max_num_seqs": 2**70}
    (results / "huge-cap.json").write_text(json.dumps(knobs))
    odd = json.loads((FIXTURES / "sweep-cap5.json").read_text())
    odd["model"] = "\ud800"  # a lone surrogate, as JSON lets a file say it
    (results / os.fsdecode(b"\xff-name.json")).write_text(json.dumps(odd))  # not UTF-8
    with _serve(tmp_path, results) as running:
        yield running


def _stderr(server: Server) -> str:
    """Everything the server wrote on stderr, once it stopped (SIGTERM first)."""
    if server.proc.poll() is None:
        server.proc.send_signal(signal.SIGTERM)
        server.proc.wait(timeout=DEADLINE_S)
    assert server.proc.stderr is not None
    return server.proc.stderr.read()


async def test_huge_saved_sweep_is_one_error_and_sigterm_stops(server: Server) -> None:
    """A saved sweep of 2**70 users (a level, or the cap) is an error on its own row; a file
    name that is not UTF-8 and a lone surrogate in a file are shown (U+FFFD); the page and the
    other endpoints keep answering; SIGTERM then stops serve."""
    async with aiohttp.ClientSession() as http:
        for _ in range(8):  # more than the thread pool had when one such file took it whole
            async with http.get(server.url + "/api/sweeps", headers=server.auth()) as r:
                assert r.status == 200
                runs = {run["file"]: run for run in (await r.json())["runs"]}
        assert "max_concurrency must be an integer" in runs["huge.json"]["error"]
        assert "max_num_seqs" in runs["huge-cap.json"]["whatif_error"]
        assert "whatif" in runs["good.json"]
        assert runs["\ufffd-name.json"]["result"]["model"] == "\ufffd"  # shown, not a 500
        for path in ("/api/boot", "/sweeps"):
            async with http.get(server.url + path, headers=server.auth()) as r:
                assert r.status == 200
    server.proc.send_signal(signal.SIGTERM)
    assert server.proc.wait(timeout=DEADLINE_S) is not None


async def test_oversized_request_never_logs_the_token(server: Server) -> None:
    """A request line or a header over 8 KB is refused, and neither the token nor a traceback
    reaches serve's stderr."""
    host, _, port = server.url.removeprefix("http://").partition(":")
    pad = "x" * 9000
    for raw in (
        f"GET /?token={server.token}&pad={pad} HTTP/1.1\r\nHost: a\r\n\r\n",
        f"GET / HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer {server.token}{pad}\r\n\r\n",
        f"GET / HTTP/1.1\r\nHost: a\r\nCookie: spark_ops_session={server.token}{pad}\r\n\r\n",
    ):
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(raw.encode())
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(200), DEADLINE_S)
        assert answer.startswith((b"HTTP/1.1 4", b"HTTP/1.0 4")), answer
        writer.close()
    err = _stderr(server)
    assert server.token not in err
    assert "Traceback" not in err


async def test_half_sent_requests_are_closed_and_counted(server: Server) -> None:
    """More half-sent requests than the connection limit: those over it are closed at once, the
    rest when their head is late; then a real request is answered."""
    host, _, port = server.url.removeprefix("http://").partition(":")
    conns = []
    for _ in range(MAX_CONNECTIONS + 40):
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(b"GET / HTTP/1.1\r\nHost: a\r\nX-Slow: ")
        conns.append((reader, writer))
    closed = 0
    for reader, writer in conns:  # every one ends: by the limit or by the head deadline
        with contextlib.suppress(ConnectionResetError):  # closed by an abort
            assert await asyncio.wait_for(reader.read(), DEADLINE_S) == b""
        writer.close()
        closed += 1
    assert closed == len(conns)
    async with (
        aiohttp.ClientSession() as http,
        http.get(server.url + "/api/boot", headers=server.auth()) as r,
    ):
        assert r.status == 200
    assert "Traceback" not in _stderr(server)


async def test_token_rotation_and_removal(server: Server) -> None:
    """A new token written to the file is in force (the old one refused); with the file removed
    nobody gets in, and serve says so."""
    new = secrets.token_urlsafe(24)
    tmp = server.token_file.with_suffix(".new")
    tmp.write_text(new + "\n")
    tmp.chmod(0o600)
    tmp.replace(server.token_file)
    async with aiohttp.ClientSession() as http:
        end = time.monotonic() + DEADLINE_S
        while True:
            async with http.get(server.url + "/api/boot", headers=server.auth(new)) as r:
                if r.status == 200:
                    break
            assert time.monotonic() < end, "the new token never came into force"
            await asyncio.sleep(0.2)
        async with http.get(server.url + "/api/boot", headers=server.auth()) as r:
            assert r.status == 401  # the old token
        server.token_file.unlink()
        while True:
            async with http.get(server.url + "/api/boot", headers=server.auth(new)) as r:
                if r.status == 401:
                    break
            assert time.monotonic() < end, "the removed token file still let requests in"
            await asyncio.sleep(0.2)
    err = _stderr(server)
    assert "was removed: every request is refused" in err
    assert new not in err and server.token not in err


def _max_sweep() -> str:
    """A saved sweep at the maxima serve allows: 1,000 levels of 50,000..99,950 users and a cap
    of 100,000, whose what-if (cap 50,000) is pure-Python work of seconds to minutes."""
    sweep = json.loads((FIXTURES / "sweep-cap5.json").read_text())
    level = sweep["levels"][0]
    sweep["levels"] = [{**level, "max_concurrency": 50_000 + 50 * i} for i in range(MAX_LEVELS)]
    sweep["knobs"]["max_num_seqs"] = MAX_LEVEL
    return json.dumps(sweep)


def _readers(pid: int) -> list[int]:
    """The sweep-reading children of a process that are alive (not zombies)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            stat = (entry / "stat").read_text()
            state, ppid = stat.rsplit(")", 1)[1].split()[:2]
            cmdline = (entry / "cmdline").read_bytes()
            if int(ppid) == pid and state != "Z" and b"spark_ops.serve.sweeps" in cmdline:
                found.append(int(entry.name))
    return found


async def test_sweeps_at_the_maxima_are_bounded_and_sigterm_stops_serve(tmp_path: Path) -> None:
    """A --results of 20 sweeps at the allowed maxima and /sweeps asked by many at once: one
    reading child at a time, every answer a page of rows (each a sweep or why not) or the 503 of
    the handler's deadline, /api/status answers meanwhile; SIGTERM while a read is under way stops
    serve, its reading child with it."""
    results = tmp_path / "results"
    results.mkdir()
    text = _max_sweep()
    for i in range(MAX_RESULTS):
        (results / f"max-{i:02}.json").write_text(text)
    with _serve(tmp_path, results) as server:
        pid = server.proc.pid
        most = 0
        done = asyncio.Event()

        async def watch() -> None:
            """Count serve's reading children until the requests are answered."""
            nonlocal most
            while not done.is_set():
                most = max(most, len(_readers(pid)))
                await asyncio.sleep(0.05)

        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=DEADLINE_S)) as http:

            async def ask(path: str) -> tuple[int, Any]:
                """One authorized GET: its status and body."""
                async with http.get(server.url + path, headers=server.auth()) as r:
                    body = await (r.json() if path.startswith("/api/") and r.status == 200
                                  else r.text())  # fmt: skip
                    return r.status, body

            watcher = asyncio.create_task(watch())
            asked = [asyncio.create_task(ask(p)) for p in ["/api/sweeps", "/sweeps"] * 6]
            status, doc = await ask("/api/status")
            assert status == 200 and isinstance(doc, dict)
            answers = await asyncio.gather(*asked)
            done.set()
            await watcher
            assert most <= 1, f"{most} sweep readers at once"
            for status, body in answers:
                assert status in (200, 503), status
                if status == 200 and isinstance(body, dict):
                    assert len(body["runs"]) == MAX_RESULTS
                    assert all("result" in run or "error" in run for run in body["runs"])
            for i in range(MAX_RESULTS):  # new files: the next read reads them all again
                os.utime(results / f"max-{i:02}.json", ns=(i, time.time_ns() + 10**9 * (i + 1)))
            await asyncio.sleep(CACHE_S)  # past the shared answer's few seconds
            pending = asyncio.create_task(ask("/api/sweeps"))
            end = time.monotonic() + DEADLINE_S
            while not (children := _readers(pid)):
                assert time.monotonic() < end, "no sweep read started"
                assert not pending.done(), pending.result()
                await asyncio.sleep(0.05)
            server.proc.send_signal(signal.SIGTERM)
            assert server.proc.wait(timeout=DEADLINE_S) is not None
            assert not _readers(pid) and all(_gone(c) for c in children)
            with contextlib.suppress(aiohttp.ClientError):
                await pending
        assert "Traceback" not in _stderr(server)


def _gone(pid: int) -> bool:
    """True when no live sweep reader has this pid (reaped, a zombie, or the pid taken since)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z" or b"spark_ops.serve.sweeps" not in cmdline
