"""spark_ops.readiness on real vLLM-over-Ray boot logs (runner of tests/fixtures/readiness/ray/)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from spark_ops.readiness import BootTracker, Phase, split_prefix

FIXTURES = Path(__file__).parent / "fixtures" / "readiness" / "ray"
LOGS = yaml.safe_load((FIXTURES / "logs.yaml").read_text(encoding="utf-8"))


@pytest.mark.parametrize("case", LOGS, ids=[c["log"] for c in LOGS])
def test_real_ray_log(case: dict[str, Any]) -> None:
    """Each recorded log reaches the listed phases, names its workers and its cause."""
    tracker = BootTracker()
    reached = [Phase.STARTING]
    for line in (FIXTURES / case["log"]).read_text(encoding="utf-8").splitlines():
        _, phase, _ = tracker.feed(line)
        if phase is not None:
            reached.append(phase)
    assert [p.value for p in reached] == case["phases"]
    assert sorted(tracker.worker_ips) == case["workers_joined"]
    for key in ("workers_expected", "placement_wait_s", "kv_cache_tokens"):
        if key in case:
            assert getattr(tracker, key) == case[key], key
    for key, value in (case.get("non_default_args") or {}).items():
        assert tracker.non_default_args[key] == value, key
    best = tracker.best_fatal()
    if case["fatal_kind"] is None:
        assert best is None, best and best.line
        return
    assert best is not None
    assert best.kind.value == case["fatal_kind"]
    message, _, _ = split_prefix(best.line)
    assert message.startswith(case["fatal_line"]) or case["fatal_line"] in message, message
    assert "\x1b" not in message, "colour codes are dropped from what a user reads"
    assert best.phase.value == case["fatal_phase"]
    seen = [split_prefix(f.line)[0] for f in tracker.fatals]
    for needle in case.get("also_fatal", []):
        assert any(needle in m for m in seen), (needle, seen)
