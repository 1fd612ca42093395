"""A worker's ranks against the running engine: stray, ambiguous (never guessed) or unreadable,
on the head's clock (cases: tests/fixtures/ranks/)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from spark_ops.engine.identity import Clock, on_head_clock
from spark_ops.engine.instance import Proc
from spark_ops.engine.ranks import ambiguous_hint, ambiguous_words, rank_verdict, stray_ranks
from spark_ops.errors import SparkOpsError

HERE = Path(__file__).parent / "fixtures" / "ranks"
VERDICTS = yaml.safe_load((HERE / "verdict.yaml").read_text("utf-8"))
CLOCKS = yaml.safe_load((HERE / "clock.yaml").read_text("utf-8"))
ENGINE = 10_000.0


def _time(value: Any) -> float | None:
    """A case's time: seconds after the engine's start, or "nan"/"inf" as written."""
    if value is None:
        return None
    if isinstance(value, str):
        return float(value)
    return ENGINE + float(value)


@pytest.mark.parametrize("case", VERDICTS, ids=[c["id"] for c in VERDICTS])
def test_rank_verdict(case: dict[str, Any]) -> None:
    """Each worker's ranks give the case's verdict, whatever the order they are listed in."""
    procs = [
        Proc(pid, 1, pid, "S", _time(t) or 0.0, "python", args) for pid, t, args in case["ranks"]
    ]
    start, args = _time(case["engine"]), case.get("engine_args", "")
    for order in (procs, procs[::-1]):
        verdict = rank_verdict(order, start, args)
        if "unreadable" in case:
            assert verdict.unreadable is not None and not verdict.stray and not verdict.ambiguous
            assert re.search(case["unreadable"], verdict.unreadable)
            with pytest.raises(SparkOpsError):
                stray_ranks(order, start, args)
            continue
        assert verdict.unreadable is None
        assert sorted(p.pid for p in verdict.stray) == sorted(case["stray"])
        assert sorted(p.pid for p in verdict.ambiguous) == sorted(case.get("ambiguous", []))
        assert stray_ranks(order, start, args) == verdict.stray


def test_ambiguous_ranks_are_named_with_their_start_and_stop() -> None:
    """Every candidate's pid and start time, and the command that stops each."""
    procs = [
        Proc(21, 1, 20, "S", ENGINE + 5, "python"),
        Proc(22, 1, 22, "S", ENGINE + 200, "python"),
    ]
    words, hint = ambiguous_words("node3", procs), ambiguous_hint("node3", procs)
    assert "node3 runs 2 ranks that could each be the running engine's" in words
    assert "21 (python) since " in words and "22 (python) since " in words
    assert "`kill -TERM -- -20` (21)" in hint and "`kill -TERM -- -22` (22)" in hint
    assert "ps -o pid,lstart,args -p 21,22" in hint


@pytest.mark.parametrize("case", CLOCKS, ids=[c["id"] for c in CLOCKS])
def test_a_workers_start_on_the_heads_clock(case: dict[str, Any]) -> None:
    """Shifted by the clocks' difference only when the reads can tell it."""
    head = Clock(*case["head"]) if case["head"] else None
    worker = Clock(*case["worker"]) if case["worker"] else None
    rank = Proc(21, 1, 21, "S", case["start"], "python")
    (moved,) = on_head_clock([rank], worker, head)
    assert moved.started_at == pytest.approx(case["moved"])
    if abs(case["moved"] - ENGINE) < 120:
        assert rank_verdict([moved], ENGINE).stray == []


@pytest.mark.parametrize("stamp", ["$(/bin/date +%s).N", "nan", "garbage"])
def test_a_node_whose_date_prints_no_nanoseconds(stamp: str, tmp_path: Path) -> None:
    """ENGINE_PROCS run by a real shell on a node whose `date` prints no %N (busybox without
    nanoseconds, macOS: `1733412345.N`) or no number: each process's start still comes exact
    from /proc (ticks since boot), the node's clock reads as unknown (no shift), nothing raises
    (it raised ValueError in every plan and doctor before)."""
    import os
    import subprocess
    import sys

    from spark_ops.engine.instance import parse_pid_probe, probe_now
    from spark_ops.remote.programs.engine import ENGINE_PROCS_SH

    shim = tmp_path / "bin"
    shim.mkdir()
    (shim / "date").write_text(f'#!/bin/sh\necho "{stamp}"\n')
    (shim / "date").chmod(0o755)
    rank = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(120)", "sim.engine serve", "--headless"]
    )
    try:
        env = dict(os.environ, PATH=f"{shim}:{os.environ['PATH']}")
        out = subprocess.run(
            ["sh", "-c", ENGINE_PROCS_SH], env=env, capture_output=True, text=True, check=True
        ).stdout
        assert probe_now(out) is None
        seen = parse_pid_probe("F 0\n" + out, None)
        assert seen is not None
        (mine,) = [p for p in seen.members if p.pid == rank.pid]
        stat = Path(f"/proc/{rank.pid}/stat").read_text().rsplit(")", 1)[1].split()
        btime = next(
            int(line.split()[1])
            for line in Path("/proc/stat").read_text().splitlines()
            if line.startswith("btime ")
        )
        assert mine.started_at == round(btime + int(stat[19]) / os.sysconf("SC_CLK_TCK"), 2)
        assert rank_verdict([mine], mine.started_at).unreadable is None
    finally:
        rank.kill()
        rank.wait()


READINGS = yaml.safe_load((HERE / "reading.yaml").read_text("utf-8"))


@pytest.mark.parametrize("case", READINGS, ids=[c["id"] for c in READINGS])
def test_one_reading_one_program_per_node(case: dict[str, Any]) -> None:
    """The plan's gate reads the engine once, one program per node at the same time, and both
    its checks (the head's leftovers, the workers' ranks) judge that one reading."""
    import asyncio

    from spark_ops.engine.identity import read_engine
    from spark_ops.inventory import parse_inventory
    from spark_ops.remote import ClusterSession
    from spark_ops.remote.connector import Result

    text = (
        "clusters:\n  c:\n    nodes: {head: {host: h, role: head}, node2: {host: n2, role: worker},"
        " node3: {host: n3, role: worker}}\n    recipe: {path: ~/r.yaml}\n"
        "    watchdog: {restart_command: x, history_file: h}\n"
        f"    engine: {{pid_file: ~/engine.pid, executor: {case['executor']}"
        + (", log: {kind: docker, container: vllm}" if case.get("log") == "docker" else "")
        + "}\n"
    )
    cluster = parse_inventory(text, "t").cluster()
    outputs = {"head": case["head"], **case["workers"]}
    calls: dict[str, list[str]] = {}

    class Session:
        """Answers each node's program with the case's output; records what each node ran."""

        gather = ClusterSession.gather

        async def call(self, host: str, program: Any, *args: Any) -> Any:
            """The case's output for the node."""
            calls.setdefault(host, []).append(program.name)
            out = outputs[host]
            out = out[program.name] if isinstance(out, dict) else out
            return program.parse(Result(host, program.name, 0, out, "", 0.0))

    reading = asyncio.run(read_engine(Session(), cluster))  # type: ignore[arg-type]
    assert {h: sorted(c) for h, c in calls.items()} == case["programs"]
    ranks = reading.rank_leftovers()
    assert {n: [p.pid for p in procs] for n, procs in ranks.stray().items()} == case["stray"]
    _, own, others = reading.leftovers()
    assert [p.pid for p in own] == case["leftovers"]
    assert [p.pid for p in others] == case.get("others", [])
