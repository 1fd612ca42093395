"""The red team of 2026-12-05, round 7: which loop watchdog is this cluster's when the engine's
URL or the loop's probe URL is written otherwise than `http://host:port` (watchdog.loop
split_loops and pick_loop, doctor.loop and init's discover.probe) (docs/reliability.md, round 7)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from spark_ops.discover.probe import Discovery
from spark_ops.doctor import loop as doctor_loop
from spark_ops.doctor.loop import LoopChecks
from spark_ops.watchdog.loop import LoopFacts

HISTORY = "/home/op/.local/state/stamps"


def _loop(probe: str | None, pid: int = 100, history: str = HISTORY) -> LoopFacts:
    """A loop watchdog whose probe is `probe` (None: not read)."""
    return LoopFacts(f"/w{pid}.sh", pid=pid, history_file=history, probe_url=probe)


async def _doctor(api_url: str, loops: list[LoopFacts], monkeypatch: pytest.MonkeyPatch) -> Any:
    """doctor's loop checks on a head running `loops`, the engine at `api_url`: its rows."""
    rows: list[tuple[Any, ...]] = []

    async def found(session: Any, head: str) -> list[LoopFacts]:
        return loops

    async def nothing(*args: Any) -> None:
        return None

    monkeypatch.setattr(doctor_loop, "find_loop_watchdogs", found)
    monkeypatch.setattr(doctor_loop, "volatile_history", nothing)
    checks = object.__new__(LoopChecks)
    wd = SimpleNamespace(
        loops_only=True, history_file=HISTORY, restarts_missing_engine=True, history_locked=True,
        max_restarts=None, window_s=0, pause_file=None, lock_path="/l",
    )  # fmt: skip
    checks.cluster = SimpleNamespace(engine=SimpleNamespace(api_url=api_url), watchdog=wd)
    checks.report = SimpleNamespace(add=lambda *row: rows.append(row))
    checks.head = "head"
    checks.session = None
    checks.up = lambda host: True  # type: ignore[method-assign]
    await checks.check_loop_watchdog()
    return [r for r in rows if r[0] == "watchdog-loop"]


DOCTOR = [
    # the inventory's engine URL, the loop's probe URL, doctor's verdict on the loop
    pytest.param("http://127.0.0.1:8000", "http://localhost:8000/health", "ok", id="localhost"),
    pytest.param("http://head:80", "http://127.0.0.1/health", "ok", id="no-port-in-probe"),
    pytest.param("http://head", "http://127.0.0.1:80/health", "ok", id="default-port-engine"),
    pytest.param("https://head", "https://127.0.0.1:443/h", "ok", id="default-port-https"),
    pytest.param("http://[::1]", "http://[::1]:80/health", "ok", id="ipv6-default-port"),
    pytest.param("http://[::1]:8000", "http://[::1]:8000/health", "ok", id="ipv6"),
    pytest.param("http://head:08000", "http://127.0.0.1:8000/h", "ok", id="leading-zero"),
    pytest.param("http://head:8000", "http://h:notaport/health", "ok", id="probe-unparsable"),
    pytest.param("http://head:8000", "http://h:${PORT}/health", "ok", id="probe-variable"),
    pytest.param("http://head:8000", None, "ok", id="probe-not-read"),
    pytest.param("http://head:8000", "http://127.0.0.1:8001/health", "warn", id="another-port"),
]


@pytest.mark.parametrize(("api_url", "probe", "verdict"), DOCTOR)
async def test_doctor_finds_this_clusters_only_loop(
    monkeypatch: pytest.MonkeyPatch, api_url: str, probe: str | None, verdict: str
) -> None:
    """The head's only loop, its stamps the inventory's: doctor says it runs as described (main:
    an engine URL without a port, or `[::1]` without one, read as port `//head` or `1]`, so the
    cluster's own loop was "another engine's", or said to probe another port)."""
    rows = await _doctor(api_url, [_loop(probe)], monkeypatch)
    assert [r[2] for r in rows] == [verdict], rows


async def test_doctor_two_loops_one_ours_by_port_one_without(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two loops, neither writing the inventory's stamps: the one probing the engine's port is
    ours, the other (no port in its probe) is named as a second loop."""
    ours, unsaid = _loop("http://h:8000/h", 1, "/a"), _loop("http://h/h", 2, "/b")
    monkeypatch.setattr(doctor_loop, "several_loops", lambda loops, chosen: f"chose {chosen.pid}")
    rows = await _doctor("http://head:8000", [unsaid, ours], monkeypatch)
    assert rows and "/w1.sh (pid 1)" in rows[0][3], rows


@pytest.mark.parametrize(
    ("url", "port"),
    [
        ("http://127.0.0.1:8000", "8000"),
        ("http://head", "80"),
        ("https://head/", "443"),
        ("http://[::1]", "80"),
        ("http://[::1]:9000", "9000"),
        ("http://h:notaport", None),
        ("http://h:99999", None),
        ("http://", None),
    ],
)
def test_url_port(url: str, port: str | None) -> None:
    """The port an engine URL reaches, or None when it cannot be told."""
    from spark_ops.watchdog.loop import url_port

    assert url_port(url) == port


def _discovery(args: dict[str, Any] | None) -> Discovery:
    """init's discovery with the recipe's arguments `args` read (None: no recipe read)."""
    d = object.__new__(Discovery)
    d.values = {} if args is None else {"recipe.args": args}
    d.findings = []
    d.head = "head"
    return d


INIT = [
    # the recipe's args read (None: no recipe found), the loop's probe, adopted
    pytest.param(None, "http://127.0.0.1:8001/health", True, id="recipe-not-read"),
    pytest.param({"--port": "8001"}, "http://127.0.0.1:8001/health", True, id="port-8001"),
    pytest.param({}, "http://127.0.0.1:8000/health", True, id="vllm-default-port"),
    pytest.param({}, "http://127.0.0.1:8001/health", False, id="another-engine"),
    pytest.param({"--port": "8001"}, "http://[::1]:8001/health", True, id="ipv6-probe"),
]


@pytest.mark.parametrize(("args", "probe", "adopted"), INIT)
async def test_init_adopts_this_clusters_only_loop(
    args: dict[str, Any] | None, probe: str, adopted: bool
) -> None:
    """init with one loop on the head: adopted unless its probe names another port than the
    recipe's (main: with no recipe read, the port was taken as 8000, and the cluster's own loop
    on 8001 was "another engine's watchdog": init wrote no loop watchdog)."""
    d = _discovery(args)
    took = await d._loop_watchdog([_loop(probe, history="")])
    assert took == adopted, d.findings
    assert (d.values.get("watchdog.kind") == "loop") == adopted
