"""Replay of recorded real vLLM restarts: the outgoing engine's output (tests/fixtures/readiness/
restart/, stopped as watchdogs stop it) followed by a new engine's real boot, with the log offset
at EVERY line of the outgoing output. Zero false verdicts: no fatal of the outgoing engine is
taken for the new boot's, the new boot's args and KV pool are the new engine's, and, where the
outgoing engine's pids are known (a pid file), no phase of it is counted as progress.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from spark_ops.readiness import BootTracker, Phase, wait_for_boot

HERE = Path(__file__).parent / "fixtures" / "readiness"
OUTGOING = sorted((HERE / "restart").glob("outgoing-*.log"))
NEW_BOOTS = {"serve-startup-moe.log": (64, 524_288), "serve-startup.log": (6, 2_097_152)}
_PID = re.compile(r"^\((?:\w+)[^)]*? pid=(\d+)\)")


def _lines(path: Path) -> list[str]:
    """A log's lines."""
    return path.read_text(encoding="utf-8").splitlines()


def _boot(name: str) -> list[str]:
    """A new engine's real boot, up to its first served request."""
    out = []
    for line in _lines(HERE / name):
        if '"GET /health' in line or '"POST /v1/' in line:
            break
        out.append(line)
    return out


def _pids(lines: list[str]) -> set[int]:
    """Every pid the lines' `(Proc pid=N)` prefixes name."""
    return {int(m.group(1)) for line in lines if (m := _PID.match(line))}


def _api_pid(lines: list[str]) -> int:
    """The API server's pid."""
    return next(int(m.group(1)) for x in lines if (m := re.match(r"^\(APIServer pid=(\d+)\)", x)))


def _cases() -> list[object]:
    """(outgoing log, new boot) pairs."""
    return [
        pytest.param(o, n, id=f"{o.stem}+{n.split('.')[0]}") for o in OUTGOING for n in NEW_BOOTS
    ]


@pytest.mark.parametrize(("outgoing", "new"), _cases())
@pytest.mark.parametrize("pids_known", [True, False], ids=["pid-file", "no-pid-file"])
def test_offset_at_every_outgoing_line(outgoing: Path, new: str, pids_known: bool) -> None:
    """Whatever line of the outgoing engine the offset lands on, the verdict is the new boot's."""
    old, boot = _lines(outgoing), _boot(new)
    seqs, tokens = NEW_BOOTS[new]
    new_api = _api_pid(boot)
    for k in range(len(old) + 1):
        tracker = BootTracker(after_restart=True, old_pids=_pids(old) if pids_known else None)
        for line in old[k:]:
            _, reached, fatal = tracker.feed(line)
            assert fatal is None, f"offset {k}: the outgoing engine's {line!r} taken as fatal"
            if pids_known:
                assert reached is None, f"offset {k}: the outgoing engine's {line!r} counted"
        if not pids_known:
            tracker.claim(new_api)  # the head learns the new engine's pid (pid file or /metrics)
        for line in boot:
            _, _, fatal = tracker.feed(line)
            assert fatal is None, f"offset {k}: {line!r}"
        assert tracker.best_fatal() is None, k
        assert tracker.phase is Phase.API_UP, k
        assert tracker.non_default_args.get("max_num_seqs") == seqs, k
        assert tracker.kv_cache_tokens == tokens, k


@pytest.mark.parametrize("outgoing", OUTGOING, ids=[o.stem for o in OUTGOING])
def test_pid_claimed_late_drops_the_outgoing_segment(outgoing: Path) -> None:
    """The new pid learned only after the outgoing engine's whole output: its progress is
    forgotten and the new boot's own phases and args stand."""
    old, boot = _lines(outgoing), _boot("serve-startup-moe.log")
    tracker = BootTracker(after_restart=False)  # worst case: the offset is before everything
    for line in old:
        tracker.feed(line)
    tracker.claim(_api_pid(boot))
    reached = []
    for line in boot:
        _, phase, fatal = tracker.feed(line)
        assert fatal is None, line
        if phase is not None:
            reached.append(phase)
    assert reached[-1] is Phase.API_UP and tracker.best_fatal() is None
    assert tracker.non_default_args["max_num_seqs"] == 64


async def test_wait_for_boot_through_a_real_restart_log() -> None:
    """wait_for_boot on outgoing SIGTERM output + a new boot ends READY with the new args."""
    old, boot = _lines(HERE / "restart" / "outgoing-term-kv.log"), _boot("serve-startup-moe.log")
    fed = asyncio.Event()

    async def source() -> AsyncIterator[str]:
        """The restart's log, then silence while the engine serves."""
        for line in old + boot:
            yield line
            await asyncio.sleep(0)
        fed.set()
        await asyncio.sleep(3600)

    async def probe() -> bool:
        """The new engine answers once its boot is out."""
        return fed.is_set()

    report = await wait_for_boot(
        source(), probe=probe, deadline_s=30, probe_interval_s=0.05,
        tracker=BootTracker(after_restart=True),
    )  # fmt: skip
    assert report.non_default_args["max_num_seqs"] == 64
    assert report.kv_cache_tokens == 524_288 and report.warnings == []


def test_real_starting_is_broken_into_steps() -> None:
    """The real CPU build's long STARTING: api-config, engine-core, workers, in that order."""
    tracker = BootTracker()
    steps = [tracker.step]
    for line in _boot("serve-startup.log"):
        tracker.feed(line)
        if tracker.step != steps[-1]:
            steps.append(tracker.step)
    assert steps == ["imports", "api-config", "engine-core", "workers"]


async def test_new_instance_death_ends_the_wait_naming_survivors() -> None:
    """The head shows the new instance alive, then dead with processes left: BootError naming
    them (and the command that stops them), without waiting for the log to end."""
    from spark_ops.errors import BootError
    from spark_ops.readiness import InstanceView

    views = iter(
        [InstanceView(True, True, "pid 9", 9)]
        + [InstanceView(True, False, "pid 9", 9, ("10 (VLLM::EngineCore)",), "kill -TERM -- -9")]
        * 100
    )

    async def watch() -> InstanceView:
        """One look at the head."""
        return next(views)

    async def source() -> AsyncIterator[str]:
        """The new boot's first lines, then a log that never ends (tail -F)."""
        for line in _boot("serve-startup.log")[:20]:
            yield line
        await asyncio.sleep(3600)

    async def never() -> bool:
        """No completion ever answers."""
        return False

    with pytest.raises(BootError) as info:
        await wait_for_boot(
            source(), probe=never, deadline_s=60, instance=watch, instance_poll_s=0.05,
            source_end_fatal=False, tracker=BootTracker(after_restart=True),
        )  # fmt: skip
    assert "exited" in info.value.message and "10 (VLLM::EngineCore)" in info.value.message
    assert info.value.hint and info.value.hint.startswith("kill -TERM -- -9")
