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
from spark_ops.serve.guard import MAX_CONNECTIONS
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
    env.pop("SPARK_OPS_FLEET", None)
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


# --- red team 2026-12-05 (serve dashboard): each finding as a test ---------------------------

STATUS = {
    "cluster": "c", "time": 1.0e9, "verdict": {"state": "serving", "reasons": []},
    "nodes": [{"name": "node1", "role": "head", "address": "a", "reachable": True,
               "latency_ms": 1.0}],
    "engine": {"up": True, "running": 1, "waiting": 0},
    "budget": {"used": 4, "allowed": 2, "remaining": 0, "window_s": 3600.0, "now": 1.0e9,
               "next_free_at": 1.0e9 + 60, "gave_up": False, "paused": False, "stamps": []},
    "runs": {"lock_held": False, "unfinished": []},
}  # fmt: skip


def _cluster(tmp_path: Path) -> Any:
    """A one-node cluster whose head nobody answers (the readings are replaced by the tests)."""
    from spark_ops.inventory import load_inventory

    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(
        "clusters:\n  c:\n    ssh: {connect_timeout: 2}\n    nodes:\n"
        f"      node1: {{host: 127.0.0.1, port: {_free_port()}, role: head}}\n"
        "    recipe: {path: /r.yaml}\n"
        "    watchdog: {restart_command: 'true', history_file: /h}\n"
    )
    return load_inventory(inventory).cluster(None)


@contextlib.asynccontextmanager
async def _app(tmp_path: Path, token: str = "tok-" + "x" * 30) -> Any:
    """serve's application in this process (aiohttp's test client), its status read replaced by
    STATUS; yields (client, source)."""
    from aiohttp.test_utils import TestClient, TestServer

    from spark_ops.serve.app import SOURCE, make_app

    app = make_app(_cluster(tmp_path), token, ttl=0.0)
    src = app[SOURCE]

    async def status() -> dict[str, Any]:
        """The fixed status document."""
        return json.loads(json.dumps(STATUS))

    async def audit() -> dict[str, Any]:
        """No audit entry."""
        return {"entries": []}

    src.status.read, src.audit.read = status, audit
    async with TestClient(TestServer(app)) as client:
        client.session.headers["Authorization"] = f"Bearer {token}"
        yield client, src


def _strict_json(text: str) -> Any:
    """JSON as a strict parser reads it: NaN and Infinity refused."""

    def refuse(name: str) -> Any:
        """A constant JSON does not have."""
        raise ValueError(f"not JSON: {name}")

    return json.loads(text, parse_constant=refuse)


def test_finding1_a_5000_digit_rank_is_no_error() -> None:
    """`--node-rank <5000 digits>` in a process's args: the node's facts are read (the rank said
    unreadable), never Python's 4300-digit error."""
    from spark_ops.serve.nodes import parse_facts

    text = f"MEM 100 50\nENGINE 42 python3 -m vllm serve m --node-rank {'9' * 5000}\n"
    facts = parse_facts(text, head=False)
    assert facts["ranks"] == ["rank unreadable, pid 42"]
    assert facts["mem_available"] == 50 * 1024


async def test_finding1_an_unexpected_reading_error_is_shown_not_a_500(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Node facts whose reading raises anything (ValueError here), and a page renderer that
    raises: /, /metrics and /api/nodes answer 200 and say what failed."""
    import spark_ops.serve.app as app_module
    import spark_ops.serve.source as source_module

    async def broken(cluster: Any) -> dict[str, Any]:
        """As int() over 4300 digits raised."""
        raise ValueError("Exceeds the limit (4300 digits) for integer string conversion")

    monkeypatch.setattr(source_module, "read_facts", broken)
    async with _app(tmp_path) as (client, _src):
        for path in ("/", "/metrics", "/api/nodes"):
            r = await client.get(path)
            assert r.status == 200, (path, await r.text())
        r = await client.get("/api/nodes")
        assert "node facts unreadable (ValueError)" in (await r.json())["error"]
        assert "node facts unreadable (ValueError)" in await (await client.get("/")).text()

        def boom(*args: Any, **kwargs: Any) -> str:
            """A renderer that fails."""
            raise OverflowError("cannot convert float infinity to integer")

        monkeypatch.setattr(app_module, "cluster_page", boom)
        r = await client.get("/")
        assert r.status == 200 and "could not be made (OverflowError)" in await r.text()


def test_finding2_a_huge_engine_reading_is_dropped_and_marked() -> None:
    """1.7e308, NaN, inf and a negative count never enter the ring; the sample says which were
    dropped; the charts and the page draw with a huge value anyway."""
    from spark_ops.serve.charts import nice_ticks, tick_text, time_series
    from spark_ops.serve.load import LoadRing
    from spark_ops.serve.pages import cluster_page

    ring = LoadRing()
    ring.add(1000.0, 1.7e308, float("nan"), float("inf"))
    ring.add(1010.0, -1.0, 2.0, 10.0)
    first, second = ring.view()["samples"]
    assert first["running"] is None and first["waiting"] is None
    assert first["dropped"] == ["running", "waiting", "tokens"]
    assert second["running"] is None and second["waiting"] == 2.0
    assert all(tick_text(t) for t in nice_ticks(1.7e308))
    svg = time_series([("x", [(1000.0, 1.7e308), (1010.0, 1.0)])], now=1010.0, span_s=3600,
                      ident="c")  # fmt: skip
    assert "inf" not in svg and "nan" not in svg.lower()
    html = cluster_page(STATUS, None, load=ring.view(), now=1010.0)
    assert 'id="load"' in html


def test_finding2_a_sweep_of_1_7e308_draws() -> None:
    """A saved sweep with output_throughput 1.7e308: the sweeps page draws (clamped)."""
    from spark_ops.serve.pages import sweeps_page

    sweep = json.loads((FIXTURES / "sweep-cap5.json").read_text())
    for level in sweep["levels"]:
        level["output_throughput"] = 1.7e308
    page = sweeps_page({"dir": "/r", "runs": [{"file": "a.json", "result": sweep}]})
    assert "<svg" in page and "inf" not in page.lower().replace("info", "")


async def test_finding2_the_live_stream_survives_a_drawing_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A drawing error in /events/cluster sends an error section, and the stream goes on to the
    next (good) sections."""
    import spark_ops.serve.app as app_module

    real = app_module.cluster_sections
    calls = {"n": 0}

    def once_broken(*args: Any, **kwargs: Any) -> str:
        """The first drawing fails, the next ones are real."""
        calls["n"] += 1
        if calls["n"] == 1:
            raise OverflowError("cannot convert float infinity to integer")
        return real(*args, **kwargs)

    monkeypatch.setattr(app_module, "cluster_sections", once_broken)
    monkeypatch.setattr(app_module, "LIVE_S", 0.05)
    async with _app(tmp_path) as (client, _src):
        r = await client.get("/events/cluster")
        seen: list[str] = []
        while len(seen) < 2:
            line = (await asyncio.wait_for(r.content.readline(), DEADLINE_S)).decode()
            if line.startswith("data: "):
                seen.append(json.loads(line[6:])["html"])
        assert "could not be drawn (OverflowError)" in seen[0]
        assert 'id="verdict"' in seen[1]
        r.close()


def _facts_run(shell: str, tmp_path: Path, nvidia_smi: str | None) -> str:
    """node.FACTS run by `shell` with a fake ps (25 lines of a process whose environ cannot be
    read, then our own engine, a real process) and a fake nvidia-smi; its stdout."""
    from spark_ops.remote.programs.node import FACTS

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    ours = subprocess.Popen(["sleep", "300"], env={"HOME": str(home), "PATH": os.environ["PATH"]})
    try:
        ps = bin_dir / "ps"
        lines = "".join(f"echo '9999999 python3 -m vllm serve m --node-rank {i}'\n"
                        for i in range(25))  # fmt: skip
        ps.write_text(
            f'#!/bin/sh\necho "$*" > {tmp_path}/ps-args\n{lines}'
            f"echo '{ours.pid} python3 -m vllm serve m --node-rank 3'\n"
        )
        ps.chmod(0o755)
        if nvidia_smi is not None:
            smi = bin_dir / "nvidia-smi"
            smi.write_text(f"#!/bin/sh\n{nvidia_smi}\n")
            smi.chmod(0o755)
        env = {"PATH": f"{bin_dir}:/usr/local/bin:/usr/bin:/bin", "HOME": str(home)}
        done = subprocess.run([shell, "-c", FACTS.line()], env=env, capture_output=True,
                              text=True, timeout=DEADLINE_S, check=False)  # fmt: skip
        return done.stdout
    finally:
        ours.kill()
        ours.wait()


@pytest.mark.parametrize("shell", [s for s in ("bash", "dash") if shutil.which(s)])
def test_finding3_only_this_accounts_engines_and_ours_never_pushed_off(
    shell: str, tmp_path: Path
) -> None:
    """ps is asked for this account's processes only; a process whose environ cannot be read is
    left out, so 25 of them cannot push our own rank off the 20-line list."""
    out = _facts_run(shell, tmp_path, None)
    engines = [line for line in out.splitlines() if line.startswith("ENGINE ")]
    assert len(engines) == 1 and engines[0].endswith("--node-rank 3"), out
    assert f"-u {os.getuid()}" in (tmp_path / "ps-args").read_text()


@pytest.mark.parametrize("shell", [s for s in ("bash", "dash") if shutil.which(s)])
def test_finding4_a_hung_nvidia_smi_still_gives_memory_and_rank(shell: str, tmp_path: Path) -> None:
    """nvidia-smi that never answers: the program still prints MEM and our ENGINE, and says the
    GPU answered nothing (its `timeout`), well inside the program's deadline."""
    if not shutil.which("timeout"):
        pytest.skip("no timeout(1) here")
    out = _facts_run(shell, tmp_path, "exec sleep 600")
    assert out.startswith("MEM "), out
    assert "GPU_ERROR" in out and any(line.endswith("--node-rank 3") for line in out.splitlines())


async def test_finding4_pages_never_wait_on_a_node_reading() -> None:
    """Once a node reading is kept, a page gets it (with its time) while a new reading hangs."""
    from spark_ops.serve.source import Cached

    hang = asyncio.Event()
    reads = {"n": 0}

    async def read() -> dict[str, Any]:
        """The first read answers, the next ones hang."""
        reads["n"] += 1
        if reads["n"] > 1:
            await hang.wait()
        return {"time": 1.0, "n": reads["n"]}

    cached = Cached(read, 0.0, background=True, missing=lambda: {"error": "not read yet"})
    assert await cached.get() == {"time": 1.0, "n": 1}
    for _ in range(3):  # each one answered with the kept reading; one background read at a time
        assert await cached.get() == {"time": 1.0, "n": 1}
        await asyncio.sleep(0)  # the background read runs (and hangs)
    assert reads["n"] == 2 and cached.task is not None and not cached.task.done()
    hang.set()
    await cached.task
    assert (await cached.get())["n"] == 2
    await cached.close()


def test_finding4_a_nodes_error_is_one_short_line() -> None:
    """A node error naming the whole shell program is shown as its first line, bounded."""
    from spark_ops.remote.programs.node import FACTS_SH
    from spark_ops.serve.nodes import MAX_ERROR_CHARS, short_error

    said = short_error("node facts: no answer within 10 s: " + FACTS_SH * 3)
    assert "\n" not in said and len(said) <= MAX_ERROR_CHARS


def test_finding5_log_lines_and_subscriber_queues_are_bounded() -> None:
    """1000 lines of 1 MB to a subscriber that never reads: each line cut to MAX_LINE, what waits
    for it bounded by QUEUE_BYTES, then it is dropped (its queue ends with None)."""
    from spark_ops.serve.boot import MAX_LINE, QUEUE_BYTES, BootWatch, cap_line

    watch = BootWatch.__new__(BootWatch)
    BootWatch.__init__(watch, _cluster_stub())
    queue = watch.subscribe()
    for _ in range(1000):
        watch._tail_line(cap_line("x" * 1_000_000))
        assert watch.subscribers.get(queue, 0) <= QUEUE_BYTES
    assert queue not in watch.subscribers and watch.dropped == 1
    assert queue.qsize() == 1 and queue.get_nowait() == (0, None)
    assert all(len(line) <= MAX_LINE + 64 for line in watch.tail)
    assert "truncated" in watch.tail[-1]


def _cluster_stub() -> Any:
    """A cluster as BootWatch's constructor reads it (its name only)."""

    class Stub:
        """Only the name."""

        name = "c"

    return Stub()


def test_finding5_the_boot_page_is_bounded_with_huge_lines() -> None:
    """The boot page with the tail of 40 lines of 100 MB each (cut as the watch cuts them)."""
    from spark_ops.serve.boot import BootState, cap_line
    from spark_ops.serve.pages import boot_page

    line = cap_line("y" * 100_000_000)
    page = boot_page({"live": BootState().snapshot(), "tail": [line] * 40, "watched_here": [],
                      "recorded": [], "usual_s": {}})  # fmt: skip
    assert len(page.encode()) < 1_000_000


@pytest.mark.parametrize("path", ["/events/cluster", "/events"])
async def test_finding6_an_open_stream_ends_with_its_token(server: Server, path: str) -> None:
    """An open stream ends once the token file is moved away (new requests get 401 too)."""
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=DEADLINE_S)) as http,
        http.get(server.url + path, headers=server.auth()) as r,
    ):
        assert r.status == 200
        assert (await r.content.readline()).startswith(b"event: ")
        server.token_file.rename(server.token_file.with_suffix(".moved"))
        while await r.content.readline():  # the stream ends (the session's deadline bounds it)
            pass
        async with http.get(server.url + "/api/boot", headers=server.auth()) as again:
            assert again.status == 401


def test_finding7_next_free_help_says_what_the_value_is() -> None:
    """4 stamps against an allowance of 2: the value is budget's next_free_at, and the help says
    enough stamps must leave the window (not the oldest one)."""
    from spark_ops.serve.metrics import NEXT_FREE_HELP, next_free

    assert next_free(STATUS["budget"]) == STATUS["budget"]["next_free_at"]
    assert "enough counted stamps have left the window" in NEXT_FREE_HELP
    assert "oldest" not in NEXT_FREE_HELP


def test_finding8_stale_values_are_said_stale_and_not_exported() -> None:
    """The engine down with a last sample of 1 running: the page says stale, /metrics has no
    engine_requests_running; a node that stopped: its old facts said stale, not exported."""
    from spark_ops.serve.metrics import render_metrics
    from spark_ops.serve.pages import cluster_sections

    now = time.time()
    load = {"span_s": 3600.0, "interval_s": 10.0, "last_ok": now - 5, "error": None,
            "samples": [{"at": now - 5, "running": 1.0, "waiting": 0.0, "tok_s": 3.0}]}  # fmt: skip
    down = {**STATUS, "engine": {"up": False}, "time": now}
    down["nodes"] = [{**STATUS["nodes"][0], "reachable": False, "error": "no answer"}]
    hardware = {"time": now - 1, "nodes": {"node1": {"mem_available": 2**33, "ranks": ["rank 0"],
                                                      "gpu": None}}}  # fmt: skip
    html = cluster_sections(down, None, load=load, hardware=hardware, now=now)
    assert "now: 1.0 running" not in html and "stale (the engine is down now)" in html
    assert "stale (the node does not answer now)" in html
    idle = {"idle": True}
    text = render_metrics(down, {"active": False, "phase": None, **idle}, None, hardware=hardware,
                          load=load).decode()  # fmt: skip
    assert "engine_requests_running" not in text
    assert 'spark_ops_node_mem_available_bytes{cluster="default",node="node1"}' not in text
    old = {**load, "samples": [{**load["samples"][0], "at": now - 3000}]}
    up = {**STATUS, "time": now}
    html = cluster_sections(up, None, load=old, now=now)
    assert "now: 1.0 running" not in html and "stale (no answer since)" in html
    text = render_metrics(up, {"active": False, "phase": None}, None, load=old).decode()
    assert "spark_ops_engine_requests_running" not in text


def test_finding9_a_bad_boots_json_is_read_and_drawn(tmp_path: Path) -> None:
    """boots.json with a duration as text or a list, NaN, 1e400 and a negative: those are left
    out of the records and the ETA, and the boot page draws the rest."""
    from spark_ops.readiness import BootHistory
    from spark_ops.serve.boot import BootState
    from spark_ops.serve.pages import boot_page

    path = tmp_path / "boots.json"
    path.write_text(
        '{"version": 1, "clusters": {"c": [{"at": 1, "total_s": 1e400, "durations": {}},'
        ' {"at": 2, "total_s": 30, "durations": {"starting": "ten", "loading": [1],'
        ' "compiling": NaN, "warming": 1e400, "api": -3, "ready": 4}}]}}'
    )
    history = BootHistory(path)
    recs = history.records("c")
    assert len(recs) == 1 and recs[0]["durations"] == {"ready": 4.0}
    assert history.estimate("c") == {"ready": 4.0}
    odd = {"live": BootState().snapshot(), "tail": [], "watched_here": [],
           "recorded": [{"at": 2, "total_s": "x", "durations": {"a": "ten", "b": float("nan")}}],
           "usual_s": {"STARTING": float("inf"), "WEIGHTS_LOADING": "x", "READY": 4.0}}  # fmt: skip
    page = boot_page(odd)
    assert "~4 s" in page and "a —" in page


async def test_finding10_json_endpoints_never_write_nan(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Node facts and load holding NaN and Infinity: /api/nodes and /api/load are strict JSON
    (those values null)."""
    import spark_ops.serve.source as source_module

    async def facts(cluster: Any) -> dict[str, Any]:
        """Facts with values JSON has no word for."""
        gpu = {"util_pct": float("nan"), "power_w": float("inf")}
        return {"time": time.time(), "nodes": {"node1": {"gpu": gpu, "ranks": []}}}

    monkeypatch.setattr(source_module, "read_facts", facts)
    async with _app(tmp_path) as (client, src):
        src.load.ring.samples.append({"at": 1.0, "running": float("nan"), "waiting": None,
                                      "tok_s": float("-inf")})  # fmt: skip
        nodes = _strict_json(await (await client.get("/api/nodes")).text())
        assert nodes["nodes"]["node1"]["gpu"]["util_pct"] is None
        load = _strict_json(await (await client.get("/api/load")).text())
        assert load["samples"][-1]["running"] is None


def test_finding11_the_timeline_draws_the_newest_500_stamps() -> None:
    """50,002 stamps in the window: the newest 500 drawn, the rest said, the page bounded."""
    from spark_ops.serve.charts import MAX_STAMPS
    from spark_ops.serve.pages import cluster_page

    now = 1.0e9
    stamps = [{"stamp": now - 3000 + i * 0.05, "by": "w", "reason": "r"} for i in range(50_002)]
    status = {**STATUS, "budget": {**STATUS["budget"], "stamps": stamps, "used": 50_002}}
    html = cluster_page(status, None, now=now)
    assert html.count("class=stamp") == MAX_STAMPS == 500
    assert "49502 more not drawn" in html
    assert len(html.encode()) < 200_000


async def test_finding12_an_oversized_engine_metrics_answer_is_refused() -> None:
    """The engine's /metrics larger than the bound: refused once the bound is read, said why;
    one within it is read."""
    from aiohttp import web
    from aiohttp.test_utils import TestServer

    from spark_ops.engine.api import EngineAPI
    from spark_ops.serve.load import MAX_METRICS_BYTES

    assert MAX_METRICS_BYTES == 8 * 1024 * 1024
    body = {"n": 1000}

    async def metrics(request: web.Request) -> web.StreamResponse:
        """A /metrics answer of body['n'] bytes of comment."""
        return web.Response(text="#" * (body["n"] - 1) + "\n")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    async with TestServer(app) as srv, EngineAPI(str(srv.make_url(""))) as api:
        assert await api.metrics(max_bytes=4096) is not None
        body["n"] = 1_000_000
        assert await api.metrics(max_bytes=4096) is None
        assert "larger than 4096 bytes" in api.last_error
