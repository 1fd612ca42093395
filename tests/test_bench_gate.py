"""The gate's arithmetic (spark_ops.bench.gate.prove), data-driven from fixtures/bench."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import yaml

from spark_ops.bench.gate import (
    LoadPoint,
    Measurement,
    Thresholds,
    Verdict,
    prove,
    render_verdict,
)
from spark_ops.errors import BenchError

CASES: dict[str, Any] = yaml.safe_load(
    (Path(__file__).parent / "fixtures" / "bench" / "gate_cases.yaml").read_text(encoding="utf-8")
)
METRICS = ("tok_s", "ttft_p95_ms", "tpot_p95_ms", "errors")


def _verdict(case: dict[str, Any]) -> Verdict:
    """prove() on a case's before, after and thresholds."""
    thresholds = Thresholds(**case["thresholds"]) if "thresholds" in case else None
    return prove(
        Measurement.from_dict(case["before"]), Measurement.from_dict(case["after"]), thresholds
    )


@pytest.mark.parametrize("case", [pytest.param(c, id=c["name"]) for c in CASES["prove"]])
def test_prove(case: dict[str, Any]) -> None:
    """Each metric's check: ok, change and the reason a figure could not be compared."""
    verdict = _verdict(case)
    expect = case["expect"]
    assert verdict.ok is expect["ok"], verdict.lines()
    by_metric = {c.metric: c for c in verdict.checks}
    assert list(by_metric) == list(METRICS)
    for metric in METRICS:
        want = expect.get(metric)
        if want is None:
            continue
        check = by_metric[metric]
        assert check.ok is want["ok"], check
        if "change" in want:
            assert check.change == (
                None if want["change"] is None else pytest.approx(want["change"])
            )
        if "reason" in want:
            assert want["reason"] in check.reason
    if "problem" in expect:
        assert any(expect["problem"] in p for p in verdict.problems)
    for check in verdict.checks:  # a check that failed on a figure says why; a pass has no reason
        if check.change is None and not (check.metric == "errors" and check.before is None):
            assert not check.ok and check.reason, check


@pytest.mark.parametrize("case", [pytest.param(c, id=c["name"]) for c in CASES["prove"]])
def test_verdict_renders_and_serializes(case: dict[str, Any]) -> None:
    """Every verdict is strict JSON (NaN as null) and a table naming each metric and limit."""
    verdict = _verdict(case)
    data = json.loads(json.dumps(verdict.to_dict(), allow_nan=False))
    assert data["ok"] is verdict.ok
    assert [c["metric"] for c in data["checks"]] == list(METRICS)
    assert data["thresholds"] == verdict.thresholds.to_dict()
    back = Verdict.from_dict(data)
    assert back.ok is verdict.ok and back.to_dict() == data
    text = render_verdict(verdict, width=120)
    for label in ("aggregate tok/s", "TTFT p95 ms", "TPOT p95 ms", "errors"):
        assert label in text
    assert ("Gate: pass" in text) is verdict.ok
    assert text.count("FAIL") >= len(verdict.failed)
    for check in verdict.failed:
        assert check.label in text


def test_defaults_are_the_documented_ones() -> None:
    """The defaults docs/user-guide.md states: 5% drop, 20% and 10% rise, no error."""
    t = Thresholds()
    assert (t.max_tok_s_drop_pct, t.max_ttft_p95_rise_pct, t.max_tpot_p95_rise_pct,
            t.max_errors) == (5.0, 20.0, 10.0, 0)  # fmt: skip
    doc = (Path(__file__).parents[1] / "docs" / "user-guide.md").read_text(encoding="utf-8")
    for said in (
        "change ≥ −5% (`max_tok_s_drop_pct`)",
        "change ≤ +20% (`max_ttft_p95_rise_pct`)",
        "change ≤ +10% (`max_tpot_p95_rise_pct`)",
        "after ≤ 0 (`max_errors`)",
    ):
        assert said in doc


def test_measurement_round_trips_and_drops_nan() -> None:
    """to_dict/from_dict keep a measurement; NaN is written as null (not measured)."""
    point = LoadPoint(request_rate=2.0, requests=16, output_tokens=40, seed=3)
    m = Measurement(tok_s=12.5, ttft_p95_ms=math.nan, tpot_p95_ms=9.0, errors=0, requests=16,
                    goodput_req_s=1.5, goodput_tok_s=10.0, point=point)  # fmt: skip
    data = json.loads(json.dumps(m.to_dict(), allow_nan=False))
    assert data["ttft_p95_ms"] is None
    back = Measurement.from_dict(data)
    assert back.point == point and back.tok_s == 12.5 and back.ttft_p95_ms is None


@pytest.mark.parametrize(
    ("point", "match"),
    [
        (LoadPoint(), "exactly one"),
        (LoadPoint(concurrency=4, request_rate=1.0), "exactly one"),
        (LoadPoint(concurrency=0), "concurrency 0"),
        (LoadPoint(request_rate=math.nan), "request_rate"),
        (LoadPoint(concurrency=4, requests=0), "requests >= 1"),
    ],
)
def test_load_point_refused(point: LoadPoint, match: str) -> None:
    """A load point that is not exactly one load in range is a BenchError."""
    with pytest.raises(BenchError, match=match):
        point.validate()


@pytest.mark.parametrize(
    ("given", "match"),
    [
        ({"max_tok_s_drop_pct": -1}, "max_tok_s_drop_pct"),
        ({"max_ttft_p95_rise_pct": math.nan}, "max_ttft_p95_rise_pct"),
        ({"max_tpot_p95_rise_pct": "10%"}, "max_tpot_p95_rise_pct"),
        ({"max_errors": 0.5}, "max_errors"),
        ({"max_errors": True}, "max_errors"),
    ],
)
def test_thresholds_refused(given: dict[str, Any], match: str) -> None:
    """A limit that is not a number >= 0 is a BenchError, in from_dict and in prove()."""
    with pytest.raises(BenchError, match=match):
        Thresholds.from_dict(given)
    m = Measurement(tok_s=1.0, ttft_p95_ms=1.0, tpot_p95_ms=1.0, errors=0)
    with pytest.raises(BenchError, match=match):
        prove(m, m, Thresholds(**given))
