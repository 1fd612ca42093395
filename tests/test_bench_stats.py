"""Data-driven tests of spark_ops.bench.stats on synthetic timelines (fixtures/bench)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from spark_ops.bench import stats
from spark_ops.bench.client import RequestRecord
from spark_ops.bench.report import render_text
from spark_ops.bench.sweep import SweepResult

CASES: dict[str, Any] = yaml.safe_load(
    (Path(__file__).parent / "fixtures" / "bench" / "stats_cases.yaml").read_text(encoding="utf-8")
)


def cases(kind: str) -> list[Any]:
    """The cases of one kind, with their names as test ids."""
    return [pytest.param(c, id=c["name"]) for c in CASES[kind]]


@pytest.mark.parametrize("case", cases("percentile"))
def test_percentile(case: dict[str, Any]) -> None:
    """Linear-interpolated percentiles."""
    got = stats.percentile(case["values"], case["q"])
    assert got == (None if case["expect"] is None else pytest.approx(case["expect"]))


def test_percentile_rejects_out_of_range_q() -> None:
    """q outside 0..100 is an error, not a silent clamp."""
    with pytest.raises(ValueError, match=r"outside 0\.\.100"):
        stats.percentile([1.0], 101)


@pytest.mark.parametrize("case", cases("steady_window"))
def test_steady_window(case: dict[str, Any]) -> None:
    """Longest interval with at least `threshold` requests in flight."""
    kwargs = {}
    if "gap_tolerance_s" in case:
        kwargs["gap_tolerance_s"] = case["gap_tolerance_s"]
    got = stats.steady_window([tuple(i) for i in case["intervals"]], case["threshold"], **kwargs)
    assert got == (None if case["expect"] is None else tuple(case["expect"]))


@pytest.mark.parametrize("case", cases("steady_threshold"))
def test_steady_threshold(case: dict[str, Any]) -> None:
    """ceil(fraction x C)."""
    assert stats.steady_threshold(case["concurrency"], case["fraction"]) == case["expect"]


@pytest.mark.parametrize("case", cases("knee"))
def test_knee(case: dict[str, Any]) -> None:
    """First level that gains under the threshold."""
    points = [tuple(p) for p in case["points"]]
    assert stats.knee(points, case.get("min_gain", stats.DEFAULT_KNEE_GAIN)) == case["expect"]


@pytest.mark.parametrize("case", cases("slo"))
def test_slo(case: dict[str, Any]) -> None:
    """Highest concurrency meeting the per-user SLO."""
    points = [tuple(p) for p in case["points"]]
    assert stats.slo_max_concurrency(points, case["slo"]) == case["expect"]


@pytest.mark.parametrize("case", cases("tail"))
def test_tail(case: dict[str, Any]) -> None:
    """The tail: how far per-user x C overstates the wall-clock aggregate."""
    got = stats.tail_fraction(case["per_user"], case["concurrency"], case["aggregate"])
    if case["expect_pct"] is None:
        assert got is None
    else:
        assert got is not None and round(100 * got) == case["expect_pct"]


@pytest.mark.parametrize("case", cases("cap"))
def test_cap(case: dict[str, Any]) -> None:
    """A running plateau while requests wait is a cap."""
    got = stats.detect_cap([tuple(s) for s in case["samples"]], knob=case.get("knob"))
    exp = case["expect"]
    assert got.detected is exp["detected"]
    assert got.plateau == exp["plateau"]
    if "matches_knob" in exp:
        assert got.matches_knob is exp["matches_knob"]


def build_record(i: int, spec: dict[str, Any]) -> RequestRecord:
    """A RequestRecord from a synthetic stream: start, ttft, inter-chunk gap, chunks, tokens."""
    rec = RequestRecord(index=i, start=spec["start"])
    if "error" in spec:
        rec.error = spec["error"]
        rec.end = spec["start"] + 0.001
        return rec
    chunks = spec.get("chunks", spec["tokens"])
    first = spec["start"] + spec["ttft"]
    rec.chunk_times = [first + k * spec["itl"] for k in range(chunks)]
    rec.end = rec.chunk_times[-1]
    rec.done = True
    if spec.get("usage", True):
        rec.usage_tokens = spec["tokens"]
    return rec


@pytest.mark.parametrize("case", cases("run"))
def test_summarize_run(case: dict[str, Any]) -> None:
    """Per-run figures from a synthetic timeline, then the level summary."""
    records = [build_record(i, r) for i, r in enumerate(case["requests"])]
    run = stats.summarize_run(
        records,
        concurrency=case["concurrency"],
        wall_s=case["wall_s"],
        steady_fraction=case["fraction"],
    )
    level = stats.summarize_level([run])
    exp = case["expect"]
    direct = {"completed", "failed", "output_tokens", "usage_reported", "errors"}
    for key in direct & set(exp):
        assert getattr(run, key) == exp[key], key
    for key in ("aggregate_tok_s", "per_user_tok_s", "steady_window_s", "steady_tok_s"):
        if key in exp:
            assert getattr(run, key) == pytest.approx(exp[key]), key
    mapping = {
        "ttft_p50_ms": level.median_ttft_ms,
        "itl_p50_ms": level.median_itl_ms,
        "itl_p99_ms": level.p99_itl_ms,
        "e2e_p50_ms": level.median_e2el_ms,
        "tail_pct": level.tail_pct,
    }
    for key, value in mapping.items():
        if key in exp:
            assert value == pytest.approx(exp[key]), key


def note_levels() -> list[stats.LevelResult]:
    """The note's five levels as LevelResults (one run each)."""
    note = CASES["note"]
    out = []
    for lv in note["levels"]:
        run = stats.RunStats(
            concurrency=lv["c"],
            wall_s=lv["wall"],
            completed=lv["c"],
            failed=0,
            output_tokens=lv["c"] * note["output_tokens"],
            input_tokens=None,
            aggregate_tok_s=lv["aggregate"],
            per_user_tok_s=lv["per_user"],
            steady_window_s=None,
            steady_tok_s=None,
            engine_tok_s=None,
            usage_reported=True,
        )
        out.append(stats.summarize_level([run]))
    return out


def test_note_reading_slo_tail_and_table() -> None:
    """The note's figures: SLO 12 tok/s gives '≤16'; tails 14% (C=6) and 65% (C=64)."""
    exp = CASES["note"]["expect"]
    levels = note_levels()
    reading = stats.read_levels(levels, slo_tok_s=CASES["note"]["slo"])
    assert reading.slo_max_concurrency == exp["slo_max_concurrency"]
    assert reading.slo_text == exp["slo_text"]
    by_c = {lv.max_concurrency: lv for lv in levels}
    assert by_c[6].tail_pct is not None and round(by_c[6].tail_pct) == exp["tail_c6"]
    assert by_c[64].tail_pct is not None and round(by_c[64].tail_pct) == exp["tail_c64"]
    result = SweepResult(
        base_url="http://node1:8000",
        model="glm-5.3-flash",
        api="chat",
        mode="burst",
        output_tokens=300,
        levels=levels,
        reading=reading,
        knobs={"max_num_seqs": 64},
    )
    text = render_text(result)
    assert "max_num_seqs=64" in text
    assert "concurrency ≤16 keeps it" in text
    assert re.search(r"│ +280 │", text) and re.search(r"│ +7\.2 │", text)
    again = SweepResult.from_dict(result.to_dict())
    assert again.reading.slo_text == "≤16"
    assert [lv.output_throughput for lv in again.levels] == [69, 111, 164, 243, 280]


def test_level_summary_spread_over_repeats() -> None:
    """Repeats: mean, min, max and stdev of the aggregate."""
    runs = []
    for agg in (100.0, 110.0, 120.0):
        runs.append(
            stats.RunStats(
                concurrency=8,
                wall_s=10.0,
                completed=8,
                failed=0,
                output_tokens=int(agg * 10),
                input_tokens=None,
                aggregate_tok_s=agg,
                per_user_tok_s=agg / 8,
                steady_window_s=None,
                steady_tok_s=None,
                engine_tok_s=None,
                usage_reported=True,
            )
        )
    level = stats.summarize_level(runs)
    assert level.output_throughput == pytest.approx(110.0)
    assert (level.output_throughput_min, level.output_throughput_max) == (100.0, 120.0)
    assert level.output_throughput_stdev == pytest.approx(10.0)
    assert level.total_output_tokens == 3300
    assert level.repeats == 3
