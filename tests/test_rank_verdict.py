"""A worker's ranks against the running engine: stray, ambiguous (never guessed) or unreadable,
on the head's clock (cases: tests/fixtures/ranks/)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from spark_ops.engine.identity import (
    Clock,
    Proc,
    ambiguous_hint,
    ambiguous_words,
    on_head_clock,
    rank_verdict,
    stray_ranks,
)
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
