"""The lower-cap what-if (spark_ops.bench.whatif) on data: fixtures/bench/whatif_cases.yaml."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from spark_ops.bench.confirm import confirm, distrust_others
from spark_ops.bench.stats import LevelResult, SpeedCheck
from spark_ops.bench.whatif import WhatIf, predict_caps
from spark_ops.errors import BenchError

CASES: list[dict[str, Any]] = yaml.safe_load(
    (Path(__file__).parent / "fixtures" / "bench" / "whatif_cases.yaml").read_text(encoding="utf-8")
)


def level(row: list[Any], prompt_tokens: int | None) -> LevelResult:
    """A LevelResult from one fixture row (the figures the what-if reads; the rest empty)."""
    c, wall, done, out, user, ttft, preempted = row
    names = LevelResult.__dataclass_fields__
    data: dict[str, Any] = dict.fromkeys(names)
    data.update(
        max_concurrency=c, repeats=1, duration=wall, completed=done, failed=0,
        total_input_tokens=None if prompt_tokens is None else prompt_tokens * done,
        total_output_tokens=out, output_throughput=out / wall, output_throughput_min=out / wall,
        output_throughput_max=out / wall, output_throughput_stdev=0.0,
        request_throughput=done / wall, per_user_tok_s=user, mean_ttft_ms=ttft,
        usage_reported=True, client_cpu_s=0.0, preemptions=preempted, errors={}, samples=[],
        runs=[],
    )  # fmt: skip
    return LevelResult(**data)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c["name"])
def test_whatif(case: dict[str, Any]) -> None:
    """Each case's predicted curve, SLO load and trust, or its error."""
    levels = [level(r, case.get("prompt_tokens")) for r in case["levels"]]
    for lv in levels:
        lo, hi, repeats = case.get("spread", {}).get(lv.max_concurrency, [None, None, 1])
        if repeats > 1:
            lv.output_throughput_min, lv.output_throughput_max, lv.repeats = lo, hi, repeats

    check = SpeedCheck(*case["speed_check"]) if "speed_check" in case else None

    def run() -> Any:
        return predict_caps(
            levels, case["caps"], mode=case["mode"], running_cap=case["running_cap"],
            slo_tok_s=case.get("slo_tok_s"), kv_tokens=case.get("kv_tokens"), speed_check=check,
        )  # fmt: skip

    if "error" in case:
        with pytest.raises(BenchError, match=case["error"]):
            run()
        return
    result = run()
    for cap, points in case.get("expect", {}).items():
        curve = result.cap(cap)
        assert curve is not None
        for c, (agg, user, ttft, source) in points.items():
            p = curve.point(c)
            assert p is not None, (cap, c)
            assert p.source == source, (cap, c)
            assert p.aggregate_tok_s == pytest.approx(agg, rel=5e-3), (cap, c)
            assert p.per_user_tok_s == pytest.approx(user, rel=5e-3), (cap, c)
            assert p.ttft_ms == (None if ttft is None else pytest.approx(ttft, rel=5e-3))
            assert p.queued == max(0, c - cap)
    for cap, keep in case.get("slo_max", {}).items():
        assert result.cap(cap).slo_max_concurrency == keep, cap  # type: ignore[union-attr]
    untrusted = case.get("untrusted", {})
    for curve in result.caps:
        bad = [p.concurrency for p in curve.points if not p.trusted]
        assert bad == untrusted.get(curve.cap, []), curve.cap
        if bad:
            assert any(f"cap {curve.cap}: not to be trusted" in w for w in result.warnings)
    assert result.assumptions and result.lines
    for line in case.get("lines", []):
        assert line in "\n".join(result.lines), result.lines
    for line in case.get("warnings", []):
        assert any(line in w for w in result.warnings), (line, result.warnings)
    if "confirm" in case:
        check_confirmation(case["confirm"], result, case.get("prompt_tokens"))


def check_confirmation(spec: dict[str, Any], result: WhatIf, prompt_tokens: int | None) -> None:
    """A cap measured after all: where its prediction missed, what the other caps become."""
    curve = result.cap(spec["cap"])
    assert curve is not None
    done = confirm(curve, [level(r, prompt_tokens) for r in spec["measured"]])
    assert [lv.concurrency for lv in done.missed] == spec["missed"]
    distrust_others(result, done)
    for other in result.caps:
        if other.cap != spec["cap"]:
            bad = [p.concurrency for p in other.points if not p.trusted]
            assert bad == spec["untrusted"].get(other.cap, []), other.cap
            if bad and "why" in spec:
                assert all(spec["why"] in (p.why_not or "") for p in other.points), other.cap
    for line in spec["lines"]:
        assert line in "\n".join(done.lines()), done.lines()
    assert done.to_dict()["missed"] == spec["missed"]
