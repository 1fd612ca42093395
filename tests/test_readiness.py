"""Tests of spark_ops.readiness: line cases, real boot logs, wait_for_boot against a real server."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from collections.abc import AsyncIterator, Iterable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from aiohttp import web
from hypothesis import given, settings
from hypothesis import strategies as st

from spark_ops.errors import BootError, BootTimeout, ExitStatus
from spark_ops.readiness import (
    BootEvent,
    BootHistory,
    BootReport,
    BootTracker,
    FatalKind,
    Phase,
    classify_line,
    estimate,
    eta_seconds,
    exit_line,
    expected_phases,
    parse_args_literal,
    record,
    summarize_boot_log,
    wait_for_boot,
)

FIXTURES = Path(__file__).parent / "fixtures" / "readiness"
CASES = yaml.safe_load((FIXTURES / "cases.yaml").read_text(encoding="utf-8"))


def _log(name: str) -> list[str]:
    """Lines of a recorded boot log."""
    return (FIXTURES / name).read_text(encoding="utf-8").splitlines()


# ---- data-driven line classification ---------------------------------------------------------


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_case(case: dict[str, Any]) -> None:
    """Each case of cases.yaml classifies as written."""
    if "line" in case:
        info = classify_line(case["line"])
        if "phase" in case:
            assert (info.phase.value if info.phase else None) == case["phase"]
        if "fatal" in case:
            assert (info.fatal.value if info.fatal else None) == case["fatal"]
        if "exception" in case:
            assert info.exception is case["exception"]
        for key, value in (case.get("data") or {}).items():
            assert info.data.get(key) == value, key
        return
    tracker = BootTracker()
    for line in case["lines"]:
        tracker.feed(line)
    if "phase" in case:
        assert tracker.phase.value == case["phase"]
    if "kv_cache_tokens" in case:
        assert tracker.kv_cache_tokens == case["kv_cache_tokens"]
    best = tracker.best_fatal()
    if case.get("best_fatal") is None:
        assert best is None, best and best.line
    else:
        assert best is not None
        assert best.line.endswith(case["best_fatal"])
        assert best.kind.value == case["best_kind"]
        assert best.context[-1] == best.line


# ---- real recorded logs ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "tokens", "max_num_seqs"),
    [("serve-startup.log", 2_097_152, 6), ("serve-startup-moe.log", 524_288, 64)],
)
def test_real_startup_log_phases(name: str, tokens: int, max_num_seqs: int) -> None:
    """The CPU build's real boots pass the phases in order and report the KV pool."""
    tracker = BootTracker()
    reached = [Phase.STARTING]
    for line in _log(name):
        _, phase, fatal = tracker.feed(line)
        assert fatal is None, line
        if phase is not None:
            reached.append(phase)
    assert reached == [
        Phase.STARTING,
        Phase.WEIGHTS_LOADING,
        Phase.WEIGHTS_DONE,
        Phase.KV_CACHE,
        Phase.API_UP,
    ]
    assert tracker.kv_cache_tokens == tokens
    assert tracker.non_default_args["max_num_seqs"] == max_num_seqs
    assert tracker.non_default_args["enforce_eager"] is True
    assert tracker.vllm_version == "0.32.0"
    assert tracker.api_url == "http://127.0.0.1:18011"
    # eager boots have no graph capture to wait for, and no Ray here
    assert expected_phases(tracker.non_default_args) == [
        Phase.STARTING,
        Phase.WEIGHTS_LOADING,
        Phase.WEIGHTS_DONE,
        Phase.KV_CACHE,
        Phase.API_UP,
        Phase.READY,
    ]


def test_expected_phases_with_ray_and_graphs() -> None:
    """A Ray TP boot without --enforce-eager expects the Ray and graph-capture phases."""
    phases = expected_phases({"distributed_executor_backend": "ray"})
    assert Phase.RAY_WORKERS in phases and Phase.GRAPH_CAPTURE in phases
    assert Phase.GRAPH_CAPTURE not in expected_phases({}, expect_graph_capture=False)


def test_triton_refusal_names_root_cause() -> None:
    """The refused MoE backend: the ValueError is the evidence, not vLLM's summary lines."""
    tracker = BootTracker()
    for line in _log("serve-fail-moe-backend-triton.log"):
        tracker.feed(line)
    best = tracker.best_fatal()
    assert best is not None
    assert best.kind is FatalKind.TRACEBACK
    assert "Unquantized MoE backend TRITON does not support" in best.line
    assert best.phase is Phase.WEIGHTS_LOADING
    assert tracker.non_default_args["moe_backend"] == "triton"
    assert len(best.context) > 1 and best.context[-1] == best.line


# ---- wait_for_boot against a real local server -----------------------------------------------


class EngineStub:
    """A local aiohttp server that answers completions only from a known moment on."""

    def __init__(self, answer_after_s: float | None) -> None:
        """Answer 503 until `answer_after_s` after start (never when None)."""
        self.answer_after_s = answer_after_s
        self.opened = False  # set by a test: answer from now on, whatever the time
        self.first_answer_at: float | None = None
        self.completions = 0
        self.answered = 0
        self.health_calls = 0
        self.runner: web.AppRunner | None = None
        self.url = ""
        self.t0 = 0.0

    def _serving(self) -> bool:
        """True once the engine is 'up' (opened by the test, or its time has come)."""
        if self.opened:
            return True
        return self.answer_after_s is not None and time.monotonic() - self.t0 >= self.answer_after_s

    async def _health(self, request: web.Request) -> web.Response:
        """/health: 200 once serving."""
        self.health_calls += 1
        return web.Response(status=200 if self._serving() else 503)

    async def _completion(self, request: web.Request) -> web.Response:
        """/v1/completions: a real-looking answer once serving."""
        body = await request.json()
        self.completions += 1
        if not self._serving():
            return web.Response(status=503, text="engine starting")
        self.answered += 1
        if self.first_answer_at is None:
            self.first_answer_at = time.monotonic()
        return web.json_response(
            {
                "id": "cmpl-1",
                "object": "text_completion",
                "model": body.get("model", "tiny"),
                "choices": [{"index": 0, "text": " ok", "finish_reason": "length"}],
                "usage": {"prompt_tokens": 2, "completion_tokens": 1, "total_tokens": 3},
            }
        )

    async def start(self) -> None:
        """Listen on 127.0.0.1, port 0."""
        app = web.Application()
        app.router.add_get("/health", self._health)
        app.router.add_post("/v1/completions", self._completion)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"
        self.t0 = time.monotonic()

    async def stop(self) -> None:
        """Shut the server down."""
        if self.runner is not None:
            await self.runner.cleanup()


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    """One client session per test."""
    async with aiohttp.ClientSession() as session:
        yield session


def _probes(stub: EngineStub, http: aiohttp.ClientSession) -> tuple[Any, Any]:
    """(probe, health) callables against the stub, as the CLI would build them."""

    async def probe() -> bool:
        """A one-token completion."""
        async with http.post(
            f"{stub.url}/v1/completions",
            json={"model": "tiny", "prompt": "hi", "max_tokens": 1},
            timeout=aiohttp.ClientTimeout(total=2),
        ) as resp:
            if resp.status != 200:
                return False
            data = await resp.json()
            return bool(data.get("choices"))

    async def health() -> bool:
        """GET /health."""
        async with http.get(f"{stub.url}/health", timeout=aiohttp.ClientTimeout(total=2)) as resp:
            return resp.status == 200

    return probe, health


async def _feed(
    lines: Iterable[str],
    *,
    delay: float = 0.0,
    then_hang: bool = True,
    marks: dict[str, float] | None = None,
    mark_when: str | None = None,
) -> AsyncIterator[str]:
    """Yield lines with a delay; optionally record when a line containing `mark_when` was sent."""
    for line in lines:
        if delay:
            await asyncio.sleep(delay)
        if marks is not None and mark_when and mark_when in line and "fatal" not in marks:
            marks["fatal"] = time.monotonic()
        yield line
    if then_hang:
        await asyncio.sleep(3600)


def _boot_lines(name: str) -> list[str]:
    """The lines of a recorded log up to (not including) the first served request."""
    out = []
    for line in _log(name):
        if '"GET /health' in line or '"POST /v1/' in line:
            break
        out.append(line)
    return out


class ManualClock:
    """The boot's clock, moved only by the test: a deadline is reached when the test says so."""

    def __init__(self) -> None:
        """Start at 0."""
        self.now = 0.0

    def __call__(self) -> float:
        """The current (test) time."""
        return self.now


async def _until(cond: Any, what: str, limit_s: float = 60.0) -> None:
    """Wait (real time, a deadline rather than a speed) until cond() holds."""
    deadline = time.monotonic() + limit_s
    while not cond():
        assert time.monotonic() < deadline, f"never happened: {what}"
        await asyncio.sleep(0.01)


async def _raises_before(task: asyncio.Task[Any], limit_s: float = 60.0) -> BaseException:
    """The exception the boot wait ends with (real-time deadline only against a hang)."""
    done, _ = await asyncio.wait({task}, timeout=limit_s)
    if not done:
        task.cancel()
        pytest.fail("the boot wait did not end although its condition was met")
    exc = task.exception()
    assert exc is not None, "the boot wait returned instead of raising"
    return exc


async def _clocked_feed(
    lines: Iterable[str], clock: ManualClock, at: dict[str, float]
) -> AsyncIterator[str]:
    """Yield lines, moving the boot's clock to at[text] before a line containing text; hang."""
    for line in lines:
        for text, now in at.items():
            if text in line:
                clock.now = now
        yield line
        await asyncio.sleep(0)
    await asyncio.sleep(3600)


async def test_ready_at_the_first_answer(http: aiohttp.ClientSession) -> None:
    """READY is reported on the engine's first answered completion: no probe after it. The boot's
    clock is the test's: the log says API_UP at 2 s, the engine refuses until the test opens it
    at 3.5 s; the report's times are exactly those (an order of events, no speed)."""
    stub = EngineStub(answer_after_s=None)
    await stub.start()
    clock = ManualClock()
    events: list[BootEvent] = []
    refused_at_api_up: list[int] = []

    def seen(event: BootEvent) -> None:
        """Keep the event; note how many health calls were refused when API_UP was reached."""
        events.append(event)
        if event.kind == "phase" and event.phase.value == "API_UP":
            refused_at_api_up.append(stub.health_calls)

    try:
        probe, health = _probes(stub, http)
        task = asyncio.create_task(
            wait_for_boot(
                _clocked_feed(
                    _boot_lines("serve-startup.log"), clock, {"Starting vLLM server on": 2.0}
                ),
                probe=probe,
                health=health,
                deadline_s=20,
                on_event=seen,
                probe_interval_s=0.05,
                clock=clock,
            )
        )
        await _until(
            lambda: refused_at_api_up and stub.health_calls > refused_at_api_up[0],
            "the engine was asked after API_UP and refused",
        )
        assert not task.done() and stub.answered == 0
        clock.now = 3.5
        stub.opened = True
        report = await asyncio.wait_for(task, 60)
        answered_when_returned = stub.answered
    finally:
        await stub.stop()
    assert stub.first_answer_at is not None
    assert answered_when_returned == stub.answered == 1, "returned on the first answer"
    assert report.last_phase == "READY"
    assert report.kv_cache_tokens == 2_097_152
    assert report.non_default_args["max_num_seqs"] == 6
    assert report.total_s == 3.5, "READY is the moment of the first answer"
    assert list(report.phase_times) == [
        "STARTING",
        "WEIGHTS_LOADING",
        "WEIGHTS_DONE",
        "KV_CACHE",
        "API_UP",
        "READY",
    ]
    times = report.phase_times
    assert times["API_UP"] == 2.0 and times["READY"] == 3.5, times
    assert report.durations["API_UP"] == 1.5  # the engine answered after its log said so
    assert "GRAPH_CAPTURE" in report.skipped and "RAY_WORKERS" in report.skipped
    assert report.lines_seen == len(_boot_lines("serve-startup.log"))
    phases = [e.phase.value for e in events if e.kind == "phase"]
    assert phases[0] == "STARTING" and phases[-1] == "READY"
    assert sum(1 for e in events if e.kind == "line") == report.lines_seen
    json.dumps([e.to_dict() for e in events])  # events serialize
    json.dumps(report.to_dict())


async def test_probe_without_api_up_line(http: aiohttp.ClientSession) -> None:
    """A log that stops early (no API_UP line) still ends in READY when the engine answers."""
    stub = EngineStub(answer_after_s=0.3)
    await stub.start()
    try:
        probe, _ = _probes(stub, http)
        lines = _boot_lines("serve-startup.log")[:40]
        report = await wait_for_boot(_feed(lines), probe=probe, deadline_s=10, probe_interval_s=0.1)
    finally:
        await stub.stop()
    assert report.last_phase == "READY"
    assert "API_UP" not in report.phase_times


async def test_health_gates_the_completion_probe(http: aiohttp.ClientSession) -> None:
    """While /health fails no completion is sent; the deadline then names the phase. Two health
    calls is a count, not a speed: on a loaded machine the boot's deadline doubles until they
    happened (idle, 0.8 s makes ~7), under a generous deadline of the test's own."""
    deadline_s, give_up = 0.8, time.monotonic() + 600
    while True:
        stub = EngineStub(answer_after_s=None)
        await stub.start()
        try:
            probe, health = _probes(stub, http)
            with pytest.raises(BootTimeout) as info:
                await wait_for_boot(
                    _feed(_boot_lines("serve-startup.log")[:47]),
                    probe=probe,
                    health=health,
                    deadline_s=deadline_s,
                    probe_interval_s=0.1,
                )
        finally:
            await stub.stop()
        if stub.health_calls >= 2 or time.monotonic() > give_up:
            break
        deadline_s *= 2
    assert stub.health_calls >= 2
    print(f"reached: {stub.health_calls} health calls by a {deadline_s:g} s deadline")
    assert stub.completions == 0
    assert info.value.phase == "WEIGHTS_DONE"
    assert "last phase WEIGHTS_DONE" in info.value.message
    assert info.value.lines and info.value.lines[-1] == _boot_lines("serve-startup.log")[46]


async def test_fatal_line_raises_after_the_grace(http: aiohttp.ClientSession) -> None:
    """The refused backend fails the wait once the fatal line's grace has passed on the boot's
    clock, which never comes near the deadline; the cause is shown."""
    stub = EngineStub(answer_after_s=None)
    await stub.start()
    clock = ManualClock()
    marks: dict[str, float] = {}
    events: list[BootEvent] = []
    try:
        probe, _ = _probes(stub, http)
        task = asyncio.create_task(
            wait_for_boot(
                _feed(
                    _log("serve-fail-moe-backend-triton.log"),
                    marks=marks,
                    mark_when="WorkerProc failed to start",
                ),
                probe=probe,
                deadline_s=30,
                on_event=events.append,
                probe_interval_s=0.2,
                fatal_grace_s=0.5,
                clock=clock,
            )
        )
        await _until(lambda: any(e.kind == "line" for e in events[-1:]) and "fatal" in marks,
                     "the fatal line was read")  # fmt: skip
        await asyncio.sleep(0.3)
        assert not task.done(), "raised before the grace passed on the boot's clock"
        clock.now = 0.6  # past the 0.5 s grace, far from the 30 s deadline
        err = await _raises_before(task)
    finally:
        await stub.stop()
    assert isinstance(err, BootError)
    assert not isinstance(err, BootTimeout)
    assert "Unquantized MoE backend TRITON does not support" in err.message
    assert err.phase == "WEIGHTS_LOADING"
    assert any("ValueError: Unquantized MoE backend TRITON" in line for line in err.lines)
    assert len(err.lines) > 1
    assert err.hint
    assert err.to_dict()["lines"] == err.lines
    assert events[-1].kind == "fatal"


async def test_fatal_line_without_source_end_uses_grace() -> None:
    """A fatal line on a source that stays open still raises after the short grace."""
    lines = [
        "(EngineCore_DP0 pid=903) INFO 09-04 11:10:41 [kv_cache_utils.py:1291] GPU KV cache size: "
        "2,596,374 tokens, Maximum concurrency for 131,072 tokens per request: 19.81x",
        "[rank1]:[E904 11:20:01.123456789 ProcessGroupNCCL.cpp:632] [Rank 1] Watchdog caught "
        "collective operation timeout: WorkNCCL(SeqNum=1, OpType=ALLREDUCE) ran for 600008 ms",
    ]

    async def never() -> bool:
        """The engine never answers."""
        return False

    clock = ManualClock()
    events: list[BootEvent] = []
    task = asyncio.create_task(
        wait_for_boot(_feed(lines), probe=never, deadline_s=30, fatal_grace_s=0.3, clock=clock,
                      on_event=events.append)
    )  # fmt: skip
    await _until(lambda: sum(e.kind == "line" for e in events) == 2, "both lines read")
    clock.now = 0.4  # the grace has passed; the 30 s deadline is far
    err = await _raises_before(task)
    assert isinstance(err, BootError) and not isinstance(err, BootTimeout)
    assert "NCCL" in err.message
    assert err.phase == "KV_CACHE"
    assert "Watchdog caught collective operation timeout" in err.lines[-1]


async def test_source_end_is_an_exit() -> None:
    """The log source ending before READY means the engine exited: fail at once."""

    async def never() -> bool:
        """The engine never answers."""
        return False

    lines = [*_boot_lines("serve-startup.log")[:50], exit_line(137)]
    with pytest.raises(BootError) as info:
        await wait_for_boot(_feed(lines, then_hang=False), probe=never, deadline_s=30)
    assert "exited" in info.value.message
    with pytest.raises(BootError) as info2:
        await wait_for_boot(_feed(lines[:50], then_hang=False), probe=never, deadline_s=30)
    assert "log ended" in info2.value.message
    assert info2.value.lines[-1] == lines[49]


async def test_source_end_not_fatal_when_told() -> None:
    """With source_end_fatal=False an ended log is waited past until the deadline."""

    async def never() -> bool:
        """The engine never answers."""
        return False

    with pytest.raises(BootTimeout):
        await wait_for_boot(
            _feed(["INFO:     Application startup complete."], then_hang=False),
            probe=never,
            deadline_s=0.5,
            source_end_fatal=False,
        )


async def test_never_ready_times_out_at_deadline() -> None:
    """A boot that never answers raises BootTimeout at the deadline with the last phase."""
    calls = 0

    async def refused() -> bool:
        """Connection refused, as before the API is up."""
        nonlocal calls
        calls += 1
        raise aiohttp.ClientConnectionError("Cannot connect to host 127.0.0.1:9")

    lines = _boot_lines("serve-startup.log")[:55]
    clock = ManualClock()
    task = asyncio.create_task(
        wait_for_boot(
            _feed(lines), probe=refused, deadline_s=0.8, probe_interval_s=0.1, clock=clock
        )
    )
    await _until(lambda: calls >= 2, "the engine probed twice")
    clock.now = 0.79
    await asyncio.sleep(0.3)
    assert not task.done(), "gave up before the deadline"
    clock.now = 0.8
    err = await _raises_before(task)
    assert isinstance(err, BootTimeout)
    assert err.phase == "KV_CACHE"
    assert "Cannot connect" in err.message
    assert err.lines[-1] == lines[-1]


async def test_missing_worker_past_stall_names_node() -> None:
    """A worker missing past the stall limit fails the boot, naming the node."""
    pg = (
        "(APIServer pid=1) INFO 09-04 10:58:40 [ray_utils.py:334] Waiting for creating a "
        "placement group of specs for 10 seconds. specs=[{'node:10.10.0.1': 0.001, 'GPU': 1.0}, "
        "{'GPU': 1.0}, {'GPU': 1.0}, {'GPU': 1.0}]. Check `ray status` and `ray list nodes`."
    )

    async def never() -> bool:
        """The engine never answers."""
        return False

    async def missing() -> list[str]:
        """node3 never joined Ray."""
        return ["node3"]

    clock = ManualClock()
    task = asyncio.create_task(
        wait_for_boot(
            _feed([pg]),
            probe=never,
            deadline_s=30,
            missing_workers=missing,
            worker_stall_s=0.5,
            worker_poll_s=0.1,
            clock=clock,
        )
    )
    # the line says the group has waited 10 s already, past the 0.5 s limit: the boot's clock
    # never moves, so this cannot be the deadline
    err = await _raises_before(task)
    assert clock.now == 0.0
    assert isinstance(err, BootError) and not isinstance(err, BootTimeout)
    assert "node3" in err.message
    assert err.lines == [pg]


async def test_placement_group_stall_without_names() -> None:
    """Without a way to name the node, a placement group waiting past the limit still fails."""
    pg = (
        "(APIServer pid=1) INFO 09-04 11:03:40 [ray_utils.py:334] Waiting for creating a "
        "placement group of specs for 330 seconds. specs=[{'GPU': 1.0}, {'GPU': 1.0}]. Check."
    )

    async def never() -> bool:
        """The engine never answers."""
        return False

    with pytest.raises(BootError) as info:
        await wait_for_boot(_feed([pg]), probe=never, deadline_s=30, worker_stall_s=300)
    assert "placement group still waiting after 330 s" in info.value.message
    assert info.value.phase == "RAY_WORKERS"


async def test_workers_that_rejoin_reset_the_stall() -> None:
    """A worker missing briefly (then back) does not fail the boot."""
    seen = 0

    async def flaky() -> list[str]:
        """Missing on the first poll only."""
        nonlocal seen
        seen += 1
        return ["node2"] if seen == 1 else []

    async def later() -> bool:
        """Answers after a few polls."""
        return seen >= 5

    report = await wait_for_boot(
        _feed([]),
        probe=later,
        deadline_s=10,
        missing_workers=flaky,
        worker_stall_s=0.3,
        worker_poll_s=0.1,
        probe_interval_s=0.1,
    )
    assert report.last_phase == "READY"


async def test_an_answer_while_a_worker_is_gone_fails_the_boot() -> None:
    """The engine answers, but node3's raylet died after it was placed: BootError naming node3."""

    async def gone() -> list[str]:
        """node3 missing on every poll."""
        return ["node3 (its Ray worker is not running)"]

    async def answers() -> bool:
        """The completion answers at once (before the stall limit could pass)."""
        return True

    with pytest.raises(BootError) as info:
        await wait_for_boot(
            _feed([]),
            probe=answers,
            deadline_s=10,
            missing_workers=gone,
            worker_stall_s=300,
            worker_poll_s=0.1,
            probe_interval_s=0.1,
        )
    assert "missing: node3 (its Ray worker is not running)" in info.value.message
    assert info.value.exit_status == ExitStatus.BOOT_FAILED


async def test_bad_deadline() -> None:
    """A non-positive deadline is a caller error."""

    async def never() -> bool:
        """Never."""
        return False

    with pytest.raises(ValueError, match="deadline_s"):
        await wait_for_boot(_feed([]), probe=never, deadline_s=0)


# ---- ETA state ---------------------------------------------------------------------------------


def test_history_records_and_estimates(tmp_path: Path) -> None:
    """Earlier boots give median phase durations; the file keeps the last N per cluster."""
    path = tmp_path / "state" / "boots.json"
    history = BootHistory(path, keep=3)
    for weights in (500.0, 560.0, 540.0, 900.0):
        history.record(
            "spark4",
            {
                "started_at": 1_790_000_000.0,
                "total_s": weights + 100,
                "durations": {"STARTING": 30.0, "WEIGHTS_LOADING": weights, "API_UP": 2.0},
                "kv_cache_tokens": 2_596_374,
            },
        )
    assert len(history.records("spark4")) == 3
    est = estimate("spark4", path=path)
    assert est == {"STARTING": 30.0, "WEIGHTS_LOADING": 560.0, "API_UP": 2.0}
    assert list(est) == ["STARTING", "WEIGHTS_LOADING", "API_UP"]
    assert estimate("other", path=path) == {}
    assert history.previous("spark4")["kv_cache_tokens"] == 2_596_374  # type: ignore[index]
    data = json.loads(path.read_text())
    assert data["version"] == 1
    assert not list(path.parent.glob(".boots-*"))  # no temp file left behind


async def test_record_a_real_report(tmp_path: Path) -> None:
    """A BootReport from wait_for_boot can be recorded as is."""

    async def ok() -> bool:
        """Ready at once."""
        return True

    report = await wait_for_boot(
        _feed(_boot_lines("serve-startup.log")[:5]), probe=ok, deadline_s=5
    )
    record("c1", report, path=tmp_path / "b.json")
    assert set(estimate("c1", path=tmp_path / "b.json")) <= {p.value for p in Phase}
    last = BootHistory(tmp_path / "b.json").previous("c1")
    assert last is not None and last["kv_cache_memory_bytes"] is None  # dense log: not set


def test_history_unreadable_is_empty(tmp_path: Path) -> None:
    """A corrupt state file is only a lost cache: estimates are empty and recording repairs it."""
    path = tmp_path / "boots.json"
    path.write_text("{not json")
    history = BootHistory(path)
    assert history.estimate("x") == {}
    history.record("x", {"durations": {"STARTING": 1.0}, "total_s": 1.0})
    assert history.estimate("x") == {"STARTING": 1.0}


def test_eta_seconds() -> None:
    """ETA = rest of the current phase plus the expected later phases."""
    est = {"STARTING": 30.0, "WEIGHTS_LOADING": 500.0, "KV_CACHE": 60.0, "API_UP": 5.0}
    assert eta_seconds(est, Phase.WEIGHTS_LOADING, 100.0) == 400.0 + 60.0 + 5.0
    assert eta_seconds(est, "WEIGHTS_LOADING", 900.0) == 65.0  # overdue: not negative
    assert eta_seconds(est, Phase.KV_CACHE, 0.0, remaining=[Phase.KV_CACHE, Phase.READY]) == 60.0
    assert eta_seconds({}, Phase.STARTING, 0.0) is None
    assert eta_seconds(est, Phase.READY, 0.0) == 0.0


def _old_engine_shutdown() -> list[str]:
    """The previous engine's output from its shutdown on (real, with an EngineDeadError)."""
    lines = _log("serve-shutdown.log")
    start = next(i for i, line in enumerate(lines) if "shutdown triggered" in line)
    return lines[start:]


def test_previous_engine_shutdown_is_not_this_boots_failure() -> None:
    """A restart's log starts with the old engine's teardown errors: they do not fail the boot."""
    old = _old_engine_shutdown()
    assert any("EngineDeadError" in line for line in old)
    tracker = BootTracker()
    for line in old + _boot_lines("serve-startup-moe.log"):
        tracker.feed(line)
    assert tracker.best_fatal() is None
    assert any("EngineDeadError" in line for line in tracker.ignored)
    assert tracker.phase is Phase.API_UP
    assert tracker.kv_cache_tokens == 524_288


def test_failure_after_this_boot_started_still_counts() -> None:
    """Once this boot has started, its own failure lines count even next to shutdown lines."""
    tracker = BootTracker()
    for line in _log("serve-fail-moe-backend-triton.log"):
        tracker.feed(line)
    assert tracker.old_engine is False
    best = tracker.best_fatal()
    assert best is not None and "TRITON" in best.line


async def test_restart_log_with_old_engine_tail_reaches_ready() -> None:
    """wait_for_boot on a restart's log (old teardown, then the new boot) ends in READY."""
    fed = asyncio.Event()
    lines = _old_engine_shutdown() + _boot_lines("serve-startup-moe.log")

    async def source() -> AsyncIterator[str]:
        """The whole restart log, then silence while the engine serves."""
        async for line in _feed(lines, delay=0.0005, then_hang=False):
            yield line
        fed.set()
        await asyncio.sleep(3600)

    async def answers_once_booted() -> bool:
        """The engine answers once its boot log is out."""
        return fed.is_set()

    report = await wait_for_boot(
        source(), probe=answers_once_booted, deadline_s=20, probe_interval_s=0.1
    )
    assert report.kv_cache_tokens == 524_288
    assert report.non_default_args["max_num_seqs"] == 64
    assert report.warnings == []


# ---- properties --------------------------------------------------------------------------------

_literals = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=12),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=6,
)
_keys = st.from_regex(r"[a-z][a-z_]{0,15}", fullmatch=True)


@settings(max_examples=60, deadline=None)
@given(st.dictionaries(_keys, _literals, max_size=6))
def test_non_default_args_round_trip(args: dict[str, Any]) -> None:
    """Any dict of literals printed by vLLM parses back to itself."""
    line = f"(APIServer pid=1) INFO 09-04 10:58:02 [utils.py:253] non-default args: {args!r}"
    assert classify_line(line).data["non_default_args"] == args


@settings(max_examples=60, deadline=None)
@given(st.dictionaries(_keys, st.integers() | st.text(max_size=8), min_size=1, max_size=5))
def test_non_default_args_with_an_object_repr(args: dict[str, Any]) -> None:
    """A value that is not a literal keeps the other keys parsed and itself as text."""
    body = repr(args)[:-1] + ", 'compilation_config': CompilationConfig(level=3, mode=[1, 2])}"
    parsed = parse_args_literal(body)
    assert parsed["compilation_config"] == "CompilationConfig(level=3, mode=[1, 2])"
    for key, value in args.items():
        assert parsed[key] == value


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=200))
def test_classify_never_raises(text: str) -> None:
    """Arbitrary text classifies without an exception."""
    classify_line(text)
    BootTracker().feed(text)


# ---- against the simulated engine (a subprocess printing vLLM's lines, serving real HTTP) ------


async def _closed_port() -> int:
    """A loopback port nothing listens on."""
    server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = int(server.sockets[0].getsockname()[1])
    server.close()
    await server.wait_closed()
    return port


async def _sim_boot(
    tmp_path: Path,
    http: aiohttp.ClientSession,
    *,
    flags: list[str],
    env: dict[str, str],
    **wait_kwargs: Any,
) -> BootReport:
    """Start the sim engine, follow its output and probe the URL its log announces."""
    cfg = tmp_path / "sim.yaml"
    base = Path(__file__).parents[1] / "recipes" / "sim" / "engine.yaml"
    cfg.write_text(f"base: {base}\ntime_scale: 4.0\n")
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "spark_ops.sim.engine",
        "serve",
        "zai-org/GLM-sim",
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        *flags,
        "--sim-config",
        str(cfg),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env={**os.environ, **env},
    )
    url: dict[str, str] = {}

    async def output() -> AsyncIterator[str]:
        """The engine's stdout+stderr, then an exit line."""
        assert proc.stdout is not None
        async for raw in proc.stdout:
            yield raw.decode("utf-8", "replace")
        yield exit_line(await proc.wait())

    def on_event(event: BootEvent) -> None:
        """Learn the API URL from the log."""
        if "api_url" in event.data:
            url["base"] = event.data["api_url"]

    async def probe() -> bool:
        """A one-token completion at the announced URL."""
        if "base" not in url:
            return False
        async with http.post(
            f"{url['base']}/v1/completions",
            json={"model": "zai-org/GLM-sim", "prompt": "hi", "max_tokens": 1},
            timeout=aiohttp.ClientTimeout(total=5),
        ) as resp:
            return resp.status == 200 and bool((await resp.json()).get("choices"))

    try:
        return await wait_for_boot(
            output(), probe=probe, on_event=on_event, probe_interval_s=0.1, **wait_kwargs
        )
    finally:
        if proc.returncode is None:
            proc.terminate()
        await proc.wait()


async def test_sim_engine_boots_ready(tmp_path: Path, http: aiohttp.ClientSession) -> None:
    """A healthy simulated boot (graphs on) passes every phase and ends READY."""
    report = await _sim_boot(tmp_path, http, flags=["--max-num-seqs", "64"], env={}, deadline_s=60)
    assert report.last_phase == "READY"
    assert "GRAPH_CAPTURE" in report.phase_times
    assert report.kv_cache_tokens and report.kv_cache_tokens > 0
    assert report.non_default_args["max_num_seqs"] == 64
    assert report.metrics["kv_cache_memory_gib"] > 0


async def test_sim_engine_nccl_timeout_fails_fast(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    """The simulated NCCL watchdog timeout fails the boot with the NCCL line, not a timeout."""
    with pytest.raises(BootError) as info:
        await _sim_boot(
            tmp_path, http, flags=[], env={"SPARK_SIM_FAULT": "nccl_timeout"}, deadline_s=60
        )
    assert not isinstance(info.value, BootTimeout)
    assert "NCCL" in info.value.message
    assert any("Watchdog caught collective operation timeout" in line for line in info.value.lines)


async def test_sim_engine_missing_ray_worker_named(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    """A Ray worker that never answers fails the boot at the stall limit, naming the node."""
    port = await _closed_port()

    async def missing() -> list[str]:
        """node2 is missing while its Ray port refuses connections."""
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            return ["node2"]
        writer.close()
        return []

    with pytest.raises(BootError) as info:
        await _sim_boot(
            tmp_path,
            http,
            flags=["--tensor-parallel-size", "2", "--distributed-executor-backend", "ray"],
            env={"SPARK_SIM_RAY_WORKERS": f"node2=127.0.0.1:{port}"},
            deadline_s=60,
            missing_workers=missing,
            worker_stall_s=3.0,
            worker_poll_s=0.2,
        )
    assert not isinstance(info.value, BootTimeout)
    assert "node2" in info.value.message
    assert info.value.phase == "RAY_WORKERS"


def test_summarize_boot_log() -> None:
    """A whole log read at once: the failed boot names its phase and cause; JSON-able."""
    failed = summarize_boot_log((FIXTURES / "serve-fail-moe-backend-triton.log").read_text())
    assert failed["phase"] == "WEIGHTS_LOADING"
    assert "TRITON" in failed["fatal"]["line"] and failed["fatal"]["kind"] == "TRACEBACK"
    ok = summarize_boot_log((FIXTURES / "serve-startup.log").read_text())
    assert ok["phase"] == "API_UP" and ok["fatal"] is None and ok["kv_cache_tokens"] == 2_097_152
    json.dumps(failed)


# ---- against vLLM's real CPU build (the ground venv; skipped when absent) ------------------------


async def _real_vllm_boot(
    tmp_path: Path, http: aiohttp.ClientSession, model: str, extra: list[str]
) -> BootReport:
    """Boot the real CPU vLLM on 127.0.0.1 and wait for it through wait_for_boot."""
    import signal

    from ground.sshd import free_port
    from ground.vllm import model_path, shim_path, vllm_unavailable_reason

    reason = vllm_unavailable_reason()
    if reason:
        pytest.skip(reason)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "VLLM_CPU_KVCACHE_SPACE"}
    env.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
    proc = await asyncio.create_subprocess_exec(
        str(shim_path()),
        "serve",
        str(model_path(model)),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--served-model-name",
        "tiny",
        "--enforce-eager",
        "--kv-cache-memory-bytes",
        "1G",
        *extra,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        cwd=tmp_path,
        env=env,
        start_new_session=True,
    )

    async def output() -> AsyncIterator[str]:
        """vLLM's stdout+stderr, then an exit line."""
        assert proc.stdout is not None
        async for raw in proc.stdout:
            yield raw.decode("utf-8", "replace")
        yield exit_line(await proc.wait())

    async def probe() -> bool:
        """A one-token completion."""
        async with http.post(
            f"http://127.0.0.1:{port}/v1/completions",
            json={"model": "tiny", "prompt": "hi", "max_tokens": 1},
            timeout=aiohttp.ClientTimeout(total=10),
        ) as resp:
            return resp.status == 200 and bool((await resp.json()).get("choices"))

    async def health() -> bool:
        """GET /health."""
        async with http.get(
            f"http://127.0.0.1:{port}/health", timeout=aiohttp.ClientTimeout(total=5)
        ) as resp:
            return resp.status == 200

    try:
        return await wait_for_boot(output(), probe=probe, health=health, deadline_s=300)
    finally:
        if proc.returncode is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), 30)
            except asyncio.TimeoutError:
                os.killpg(proc.pid, signal.SIGKILL)
                await proc.wait()


@pytest.mark.realvllm
@pytest.mark.slow
async def test_real_vllm_boot_reaches_ready(tmp_path: Path, http: aiohttp.ClientSession) -> None:
    """vLLM's CPU build: the live log gives the phases and KV pool; READY on its first answer."""
    report = await _real_vllm_boot(tmp_path, http, "tiny-llama", ["--max-num-seqs", "6"])
    assert report.last_phase == "READY"
    assert report.kv_cache_tokens and report.kv_cache_tokens > 0
    assert report.non_default_args["max_num_seqs"] == 6
    assert report.non_default_args["enforce_eager"] is True
    assert {"WEIGHTS_DONE", "KV_CACHE", "API_UP", "READY"} <= set(report.phase_times)
    assert "GRAPH_CAPTURE" in report.skipped


@pytest.mark.realvllm
@pytest.mark.slow
async def test_real_vllm_refused_backend_fails_fast(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    """vLLM's CPU build refusing --moe-backend triton: BootError naming the refusal."""
    with pytest.raises(BootError) as info:
        await _real_vllm_boot(
            tmp_path, http, "tiny-moe", ["--max-num-seqs", "64", "--moe-backend", "triton"]
        )
    assert not isinstance(info.value, BootTimeout)
    assert "TRITON" in info.value.message and "does not support" in info.value.message


def test_a_new_engine_restarts_phase_tracking() -> None:
    """Lines of an engine still booting at the restart do not count for the next engine's boot."""
    tracker = BootTracker()
    for line in _boot_lines("serve-startup.log"):  # the outgoing engine got as far as API_UP
        tracker.feed(line)
    assert tracker.phase is Phase.API_UP and tracker.kv_cache_tokens == 2_097_152
    new_args = "(APIServer pid=9) INFO 11-30 02:00:00 [api_utils.py:286] non-default args: " + (
        "{'model_tag': 'm', 'max_num_seqs': 64}"
    )
    tracker.feed(new_args)
    assert tracker.phase is Phase.STARTING
    assert tracker.kv_cache_tokens is None and tracker.non_default_args["max_num_seqs"] == 64
    _, reached, _ = tracker.feed(
        "(EngineCore pid=10) INFO 11-30 02:00:03 [ray_utils.py:316] Waiting for creating a "
        "placement group of specs for 10 seconds. specs=[{'GPU': 1.0}]."
    )
    assert reached is Phase.RAY_WORKERS
