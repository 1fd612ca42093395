"""End-to-end sweeps against a real local streaming server (fixtures/bench/stream_server.py)."""

from __future__ import annotations

import csv
import importlib.util
import json
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from spark_ops.bench import measures, report
from spark_ops.bench.sweep import SweepConfig, SweepResult, run_sweep
from spark_ops.errors import BenchError

_spec = importlib.util.spec_from_file_location(
    "bench_stream_server", Path(__file__).parent / "fixtures" / "bench" / "stream_server.py"
)
assert _spec is not None and _spec.loader is not None
server = importlib.util.module_from_spec(_spec)
sys.modules["bench_stream_server"] = server
_spec.loader.exec_module(server)

Serve = Callable[..., Any]


@pytest.fixture
async def serve() -> AsyncIterator[Serve]:
    """Start FakeEngine servers on port 0; all are stopped after the test."""
    runners = []

    async def start(**kwargs: Any) -> tuple[Any, str]:
        """Start one server with the given FakeEngine settings."""
        engine = server.FakeEngine(**kwargs)
        runner, url = await server.start(engine)
        runners.append(runner)
        return engine, url

    yield start
    for runner in runners:
        await runner.cleanup()


def config(url: str, **kwargs: Any) -> SweepConfig:
    """A short sweep config for tests."""
    base: dict[str, Any] = dict(
        base_url=url, levels=[1, 4], output_tokens=12, repeats=1, sample_interval_s=0.05
    )
    base.update(kwargs)
    return SweepConfig(**base)


async def test_burst_sweep_counts_caps_and_writes(serve: Serve, tmp_path: Path) -> None:
    """Burst sweep: usage token counts, an injected failure, the cap, JSON/CSV/PNG/compare."""
    # Server request numbers: C=1 x 2 repeats -> 1, 2; C=4 -> 3..10; C=8 -> 11..26. Request 2
    # fails: it lowers C=1's aggregate, not the 4 -> 8 step that the knee is read from.
    engine, url = await serve(max_num_seqs=4, step_s=0.03, fail_http={2})
    seen: list[int] = []
    result = await run_sweep(
        config(
            url,
            levels=[1, 4, 8],
            output_tokens=10,
            repeats=2,
            slo_tok_s=5,
            knobs={"max_num_seqs": 4},
            recheck=4,
        ),
        on_level=lambda lv: seen.append(lv.max_concurrency),
    )
    assert seen == [1, 4, 8]  # the speed check (C=4 once more, at the end) is not a level
    check = result.speed_check
    assert check is not None and check.concurrency == 4
    assert check.swept_tok_s == result.levels[1].output_throughput  # the level's own figure
    assert result.model == "tiny-test"  # discovered from /v1/models
    by_c = {lv.max_concurrency: lv for lv in result.levels}
    assert [lv.completed for lv in result.levels] == [1, 8, 16]
    assert by_c[1].failed == 1
    assert by_c[1].errors == {
        "HTTP 500: " + json.dumps({"object": "error", "message": "injected"}): 1
    }
    for lv in result.levels:
        assert lv.usage_reported
        assert lv.total_output_tokens == 10 * lv.completed
        assert lv.total_input_tokens == 25 * lv.completed
        assert lv.engine_output_throughput is not None
    # the server generated exactly what the client counted (the levels and the speed check)
    assert engine.generated == sum(lv.total_output_tokens for lv in result.levels) + 4 * 10
    # what was sent: unique prompts within a level, the note's sampling settings
    bodies = engine.bodies
    assert len(bodies) == 2 + 8 + 16 + 4
    c8 = [b["messages"][0]["content"] for b in bodies[-20:-4]]
    assert len(set(c8)) == 16
    for b in bodies:
        assert b["max_tokens"] == 10 and b["temperature"] == 0 and b["ignore_eos"] is True
        assert b["stream"] is True and b["stream_options"] == {"include_usage": True}
    # max_num_seqs=4: at C=8 half the requests wait; running plateaus at 4
    assert result.reading.cap.detected and result.reading.cap.plateau == 4
    assert result.reading.cap.matches_knob is True
    assert by_c[8].max_waiting is not None and by_c[8].max_waiting >= 1
    # the capped level runs in two waves: the engine never streams more than 4 at once, and in
    # C=8 (requests 11..18) some request starts only after another of its level has ended (its
    # first token waits a wave), while in C=4 (3..6) none does. An order of events, no speed.
    assert engine.peak_running == 4 and engine.peak_waiting >= 1
    starts = engine.ended_at_start

    def waited(numbers: range) -> list[int]:
        """The requests of a level that started after another of that level had ended."""
        first = min(starts[n] for n in numbers)
        return [n for n in numbers if starts[n] > first]

    assert len(waited(range(11, 19))) >= 1 and waited(range(3, 7)) == [], starts
    # the knee and the SLO are read from the run's own figures by the rules that
    # tests/fixtures/bench/stats_cases.yaml holds: what a loaded machine measured is a speed,
    # so it is the reading of those figures that is checked, not their values
    agg = [(lv.max_concurrency, lv.output_throughput) for lv in result.levels]
    users = [(lv.max_concurrency, lv.per_user_tok_s or 0.0) for lv in result.levels]
    assert result.reading.knee == measures.knee(agg, result.reading.knee_gain)
    assert result.reading.slo_max_concurrency == measures.slo_max_concurrency(users, 5)

    paths = {k: tmp_path / f"r.{k}" for k in ("json", "csv", "png")}
    report.write_json(result, paths["json"])
    report.write_csv(result, paths["csv"])
    from spark_ops.bench.plot import plot_sweep

    plot_sweep(result, paths["png"])
    assert paths["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    data = json.loads(paths["json"].read_text())
    for key in (
        "duration",
        "completed",
        "total_output_tokens",
        "output_throughput",
        "mean_ttft_ms",
        "median_ttft_ms",
        "p99_ttft_ms",
        "mean_itl_ms",
        "p99_itl_ms",
        "mean_e2el_ms",
        "max_concurrency",
    ):
        assert key in data["levels"][0], key
    again = report.load_result(paths["json"])
    assert again.to_dict() == result.to_dict()
    rows = list(csv.DictReader(paths["csv"].open()))
    assert [r["max_concurrency"] for r in rows] == ["1", "4", "8"]
    assert rows[0]["failed"] == "1" and "HTTP 500" in rows[0]["errors"]

    text = report.render_text(result)
    assert "max_num_seqs=4 is the cap" in text
    knee = result.reading.knee  # the run's own reading (above): its line names it
    assert knee is None or f"Saturation knee: concurrency {knee}" in text


async def test_compare_before_after(serve: Serve) -> None:
    """compare on two real runs: levels in both are compared, the others listed."""
    _, slow = await serve(max_num_seqs=2, step_s=0.01)
    _, fast = await serve(step_s=0.01)
    before = await run_sweep(config(slow, levels=[1, 4], knobs={"max_num_seqs": 2}))
    after = await run_sweep(config(fast, levels=[4, 8], knobs={"max_num_seqs": 64}))
    cmp = report.compare(before, after, names=("before.json", "after.json"))
    assert [r.max_concurrency for r in cmp.rows] == [4]
    ratio = cmp.rows[0].ratio["output_throughput"]
    assert ratio == after.levels[0].output_throughput / before.levels[1].output_throughput
    assert cmp.only_before == [1] and cmp.only_after == [8]
    text = report.render_compare_text(cmp)
    assert "before.json → after.json" in text and f"×{ratio:.2f}" in text
    assert "knobs: max_num_seqs=2 → max_num_seqs=64" in text  # key=value, not a Python dict


def test_compare_ratios_and_marks() -> None:
    """Ratios are after/before; higher throughput and lower latency are marked better."""
    from spark_ops.bench import stats

    def result(agg: float, ttft_ms: float) -> SweepResult:
        """A one-level result with the given aggregate and TTFT p99."""
        run = stats.RunStats(
            8, 10.0, 8, 0, int(agg * 10), None, agg, agg / 8, None, None, None, True
        )
        level = stats.summarize_level([run])
        level.p99_ttft_ms = ttft_ms
        return SweepResult(
            "http://x", "m", "chat", "burst", 300, [level], stats.read_levels([level])
        )

    cmp = report.compare(result(100.0, 200.0), result(250.0, 400.0))
    row = cmp.rows[0]
    assert row.ratio["output_throughput"] == pytest.approx(2.5)
    assert row.ratio["p99_ttft_ms"] == pytest.approx(2.0)
    text = report.render_compare_text(cmp)
    assert "100 → 250" in text and "×2.50 better" in text
    assert "200 → 400" in text and "×2.00 worse" in text
    assert cmp.to_dict()["levels"][0]["ratio"]["output_throughput"] == pytest.approx(2.5)


def _wide_result(knobs: dict[str, Any]) -> SweepResult:
    """A five-level result with every figure of the sweep table filled in."""
    from spark_ops.bench import stats

    levels = []
    for c in (1, 6, 16, 32, 64):
        run = stats.RunStats(c, 12.5, c, 0, 300 * c, None, 24.0 * c, 20.0, None, None, None, True)
        lv = stats.summarize_level([run, run])
        lv.steady_output_throughput, lv.engine_output_throughput = 23.0 * c, 25.0 * c
        lv.tail_pct, lv.median_ttft_ms, lv.p99_ttft_ms = 12.0, 1234.0, 56789.0
        levels.append(lv)
    return SweepResult(
        "http://x", "Qwen/Qwen3-30B-A3B-FP8", "chat", "burst", 300, levels,
        stats.read_levels(levels), knobs=knobs,
    )  # fmt: skip


@pytest.mark.parametrize("width", [80, 120, 160])
def test_tables_fit_the_terminal(width: int) -> None:
    """The sweep and compare tables fit 80, 120 and 160 columns; what was left out is said."""
    before = _wide_result({"max_num_seqs": 6, "moe_backend": "marlin"})
    after = _wide_result({"max_num_seqs": 64, "moe_backend": "marlin"})
    sweep_text = report.render_text(before, width=width)
    cmp = report.compare(before, after, names=("runs/before-cap-6.json", "runs/after-64.json"))
    compare_text = report.render_compare_text(cmp, width=width)
    for text in (sweep_text, compare_text):
        too_wide = [line for line in text.splitlines() if len(line) > width]
        assert not too_wide, "\n".join(too_wide)
    sweep_text, compare_text = (" ".join(t.split()) for t in (sweep_text, compare_text))
    assert "(max_num_seqs=6, moe_backend=marlin)" in sweep_text  # knobs as key=value
    if width == 80:
        assert "left out to fit 80 columns: engine tok/s" in sweep_text
        assert "aggregate" in sweep_text and "per user" in sweep_text  # the figures that matter
        assert "left out to fit 80 columns: mean E2E ms" in compare_text
    if width == 160:
        assert "left out" not in sweep_text + compare_text


async def test_no_usage_chunk_counts_chunks_and_warns(serve: Serve) -> None:
    """A server without usage: tokens counted from content chunks, flagged, warned."""
    _, url = await serve(usage=False)
    result = await run_sweep(config(url, levels=[2], cpu_warn_fraction=0.0))
    level = result.levels[0]
    assert level.total_output_tokens == 24 and not level.usage_reported
    assert any("no usage chunk" in w for w in result.warnings)
    # the client's own CPU is recorded; with a 0% threshold it is always warned about
    assert level.client_cpu_s > 0
    assert any("client used" in w and "of a core" in w for w in result.warnings)


async def test_completions_api_and_midstream_error(serve: Serve) -> None:
    """/v1/completions with a prompt; an error event mid-stream is an error, not a success."""
    engine, url = await serve(fail_midstream={2})
    result = await run_sweep(config(url, levels=[3], api="completions", model="tiny-test"))
    level = result.levels[0]
    assert level.completed == 2 and level.failed == 1
    assert level.errors == {"stream error: injected mid-stream": 1}
    assert all("prompt" in b and "messages" not in b for b in engine.bodies)
    assert level.total_output_tokens == 24


async def test_sustained_keeps_concurrency_for_the_duration(serve: Serve) -> None:
    """sustained: C requests kept in flight until the duration passes. Three rounds per stream
    is a count, not a speed: on a loaded machine the duration doubles until they are reached
    (idle, the first 0.6 s does ~10 rounds per stream), under a generous deadline."""
    engine, url = await serve(step_s=0.005)
    duration, give_up = 0.6, time.monotonic() + 600
    while True:
        before, began = engine.requests, time.monotonic()
        engine.peak_running = 0
        result = await run_sweep(config(url, levels=[3], mode="sustained", duration_s=duration))
        level = result.levels[0]
        # an order of events on one clock: requests were still streaming when the duration
        # (counted from before the run began) had passed, and never more than C at once
        assert engine.last_done >= began + duration
        assert engine.peak_running == 3
        assert level.steady_window_s is not None and 0 < level.steady_window_s <= level.duration
        assert engine.requests - before == level.completed
        if level.completed >= 3 * 3 or time.monotonic() > give_up:
            break
        duration *= 2
    assert level.completed >= 3 * 3, f"{level.completed} requests in {duration} s"
    print(f"reached: {level.completed} requests in a {duration:g} s run")


async def test_poisson_is_seeded(serve: Serve) -> None:
    """poisson: the same seed gives the same number of arrivals; a different seed need not."""
    _, url = await serve(step_s=0.002)
    counts = []
    for seed in (7, 7):
        cfg = config(url, levels=[8], mode="poisson", rate=40.0, duration_s=0.5, seed=seed)
        counts.append((await run_sweep(cfg)).levels[0].completed)
    assert counts[0] == counts[1] > 5


async def test_warmup_excluded_from_figures(serve: Serve) -> None:
    """Warm-up requests are sent but not counted."""
    engine, url = await serve()
    result = await run_sweep(config(url, levels=[2], warmup=3))
    assert engine.requests == 5 and result.levels[0].completed == 2


async def test_wrong_model_warmup_fails_clearly(serve: Serve) -> None:
    """Every warm-up request refused: BenchError with the server's message."""
    _, url = await serve()
    with pytest.raises(BenchError, match="does not exist"):
        await run_sweep(config(url, model="nope", warmup=1))
    # without warm-up the sweep runs, counts the refusals and says so
    result = await run_sweep(config(url, model="nope", levels=[2]))
    assert result.levels[0].failed == 2 and result.levels[0].completed == 0
    assert any("every request failed (HTTP 404" in w for w in result.warnings)


async def test_unreachable_server_is_a_bench_error() -> None:
    """Nothing listening: a clear BenchError with a hint."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(BenchError, match=f"cannot reach http://127.0.0.1:{port}") as info:
        await run_sweep(config(f"http://127.0.0.1:{port}"))
    assert info.value.hint and "server up" in info.value.hint


def test_config_validation_names_the_setting() -> None:
    """Bad settings are refused with their name and value."""
    with pytest.raises(BenchError, match="mode 'poisson' needs a rate"):
        SweepConfig(base_url="http://x", mode="poisson").validate()
    with pytest.raises(BenchError, match=r"levels \[1, 1\] contain a duplicate"):
        SweepConfig(base_url="http://x", levels=[1, 1]).validate()
    with pytest.raises(BenchError, match="must start with http"):
        SweepConfig(base_url="node1:8000").validate()
    with pytest.raises(BenchError, match=r"recheck 6 is not one of the levels \[1, 4\]"):
        SweepConfig(base_url="http://x", levels=[1, 4], recheck=6).validate()
    masked = SweepConfig(base_url="http://x", api_key="secret").to_dict()
    assert masked["api_key"] == "***"


def test_from_dict_rejects_other_json() -> None:
    """A JSON that is not a sweep result is named as such."""
    with pytest.raises(BenchError, match=r"a\.json: not a spark-ops bench result"):
        SweepResult.from_dict({"levels": []}, source="a.json")


@pytest.mark.parametrize(
    "title",
    [
        "/opt/models/some-organisation/GLM-5.3-Flash-FP8-dynamic-experimental-long-name (burst, "
        "max_num_seqs=64, max_num_batched_tokens=8192, gpu_memory_utilization=0.92, "
        "moe_backend=marlin)",
        "x" * 300,  # one word, no space to wrap at
        "short",
    ],
    ids=["long-knobs", "one-long-word", "short"],
)
async def test_plot_title_fits_inside_the_figure(serve: Serve, tmp_path: Path, title: str) -> None:
    """A long title is wrapped (or shrunk) so that none of it is cut off at either edge."""
    from spark_ops.bench.plot import load_pyplot, sweep_figure

    _, url = await serve(max_num_seqs=4, step_s=0.005)
    result = await run_sweep(config(url))
    plt = load_pyplot()
    fig = sweep_figure(result, title=title)
    try:
        fig.savefig(tmp_path / "t.png", format="png")
        renderer = fig.canvas.get_renderer()
        box, frame = fig.axes[0].title.get_window_extent(renderer), fig.bbox
        assert frame.x0 <= box.x0 and box.x1 <= frame.x1, (box, frame)
        assert frame.y0 <= box.y0 and box.y1 <= frame.y1, (box, frame)
        shown = fig.axes[0].get_title()
        assert shown.replace("\n", "").replace(" ", "") == title.replace(" ", "")
        assert (tmp_path / "t.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    finally:
        plt.close(fig)


def test_title_and_compare_give_kv_memory_in_gib() -> None:
    """Where a person reads the knobs (the sweep table's title, the compare's knobs line), the KV
    cache memory is 60 GiB, not 64424509440; the JSON keeps the bytes."""
    before = _wide_result({"max_num_seqs": 64, "kv_cache_memory_bytes": 64424509440})
    after = _wide_result({"max_num_seqs": 64, "kv_cache_memory_bytes": 1610612736})
    text = " ".join(report.render_text(before, width=160).split())
    assert "(max_num_seqs=64, kv_cache_memory_bytes=60 GiB)" in text, text
    assert "64424509440" not in text
    cmp = report.compare(before, after)
    compare = " ".join(report.render_compare_text(cmp, width=160).split())
    assert "kv_cache_memory_bytes=60 GiB" in compare and "kv_cache_memory_bytes=1.5 GiB" in compare
    assert before.to_dict()["knobs"]["kv_cache_memory_bytes"] == 64424509440
