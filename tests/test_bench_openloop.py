"""Open-loop load (`bench --request-rate`) and the gate's measure(): data-driven cases for the
schedule, the SLO and a level's figures (fixtures/bench/openloop_cases.yaml), then runs against
the simulated vLLM engine (one per module, loopback) through the API, the CLI and serve's reader.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from spark_ops.bench.client import RequestRecord, StreamClient
from spark_ops.bench.gate import Endpoint, LoadPoint, measure, prove
from spark_ops.bench.load import Bodies, discover_model, send_at
from spark_ops.bench.openloop import RateConfig, RateResult, arrival_times, run_rates
from spark_ops.bench.ratelevel import RateLevel, Slo, summarize_rate_level
from spark_ops.bench.ratereport import render_rate_text
from spark_ops.bench.report import load_result, load_saved
from spark_ops.bench.sweep import SweepResult
from spark_ops.bench.workload import ENDPOINTS
from spark_ops.cli.bench import cli
from spark_ops.errors import BenchError

HERE = Path(__file__).parent
CASES: dict[str, Any] = yaml.safe_load(
    (HERE / "fixtures" / "bench" / "openloop_cases.yaml").read_text(encoding="utf-8")
)
SIM_CONFIG = HERE / "fixtures" / "bench" / "sim.yaml"
OLD_SWEEP = HERE / "fixtures" / "serve" / "sweep-cap5.json"


def cases(kind: str) -> list[Any]:
    """The cases of one kind, with their names as test ids."""
    return [pytest.param(c, id=c["name"]) for c in CASES[kind]]


@pytest.mark.parametrize("case", cases("schedule"))
def test_schedule(case: dict[str, Any]) -> None:
    """A seeded schedule's arrival times, pinned; the same seed gives the same times again."""
    args = (case["requests"], float(case["rate"]), case["arrivals"], case["seed"])
    got = arrival_times(*args)
    assert got == pytest.approx(case["expect"], abs=1e-6)
    assert arrival_times(*args) == got
    assert all(b >= a for a, b in itertools.pairwise(got))


def test_poisson_gaps_average_one_over_the_rate() -> None:
    """Over many seeded arrivals the mean gap is 1/rate (a fixed seed: the same every run)."""
    times = arrival_times(20_000, 4.0, "poisson", 11)
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert sum(gaps) / len(gaps) == pytest.approx(0.25, rel=0.03)
    assert arrival_times(50, 4.0, "poisson", 11) != arrival_times(50, 4.0, "poisson", 12)


@pytest.mark.parametrize("case", cases("schedule_refused"))
def test_schedule_refused(case: dict[str, Any]) -> None:
    """A schedule that cannot be made is a BenchError naming why."""
    with pytest.raises(BenchError, match=case["match"]):
        arrival_times(case["requests"], float(case["rate"]), case["arrivals"], 0)


@pytest.mark.parametrize("case", cases("slo"))
def test_slo_classification(case: dict[str, Any]) -> None:
    """Whether one request with the given latencies meets every SLO given."""
    slo = Slo(*case["slo"])
    assert slo.met(case["ok"], case["ttft"], case["tpot"]) is case["expect"]


def _records(spec: list[Any]) -> list[RequestRecord]:
    """Records from [start, first token, end, tokens] or {error} (one chunk per token)."""
    out = []
    for i, item in enumerate(spec):
        if isinstance(item, dict):
            out.append(RequestRecord(index=i, start=0.0, end=0.1, error=item["error"]))
            continue
        start, first, end, tokens = item
        step = (end - first) / (tokens - 1)
        chunks = [first + k * step for k in range(tokens)]
        out.append(RequestRecord(index=i, start=start, end=end, chunk_times=chunks,
                                 usage_tokens=tokens, done=True))  # fmt: skip
    return out


@pytest.mark.parametrize("case", cases("level"))
def test_level_figures(case: dict[str, Any]) -> None:
    """A level's figures from given records: counts, rates, goodput <= throughput."""
    level = summarize_rate_level(
        _records(case["records"]), t0=0.0, rate=2.0, arrivals="poisson", seed=0,
        max_concurrency=None, slo=Slo(*case["slo"]),
    )  # fmt: skip
    got = level.to_dict()
    for key, want in case["expect"].items():
        if isinstance(want, float):
            assert got[key] == pytest.approx(want, rel=1e-6), key
        else:
            assert got[key] == want, key
    assert level.request_goodput <= level.request_throughput
    assert level.output_goodput <= level.output_throughput
    assert level.good_requests <= level.completed
    assert RateLevel.from_dict(json.loads(json.dumps(got))) == level


# ---- against the simulated engine --------------------------------------------------------


@pytest.fixture(scope="module")
def sim_url() -> Iterator[str]:
    """The sim engine (cap 6, 10x faster than emulated) on 127.0.0.1 port 0; its base URL."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPARK_SIM_")}
    env["SPARK_SIM_CONFIG"] = str(SIM_CONFIG)
    proc = subprocess.Popen(
        [sys.executable, "-m", "spark_ops.sim.engine", "serve", "models/glm-5.3-flash",
         "--host", "127.0.0.1", "--port", "0", "--max-num-seqs", "6", "--enforce-eager"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    url, seen = None, []
    for line in proc.stdout:
        seen.append(line)
        if m := re.search(r"Starting vLLM server on (http://\S+)", line):
            url = m.group(1).rstrip("/")
        if "Application startup complete" in line and url:
            break
    if url is None:
        proc.kill()
        pytest.fail("sim engine did not start:\n" + "".join(seen))
    drain = threading.Thread(target=lambda: [None for _ in proc.stdout or ()], daemon=True)
    drain.start()
    try:
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.mark.timeout(120)
def test_open_loop_sweep_against_sim(sim_url: str, tmp_path: Path) -> None:
    """Each rate sends exactly its requests; goodput never exceeds throughput; the saved file
    reads back, is refused by name by the concurrency reader, and leaves old sweeps readable."""
    config = RateConfig(base_url=sim_url, rates=[4.0, 20.0], requests=10, output_tokens=20,
                        seed=5, knobs={"max_num_seqs": 6})  # fmt: skip
    result = asyncio.run(run_rates(config))
    assert [lv.request_rate for lv in result.levels] == [4.0, 20.0]
    for lv in result.levels:
        assert lv.requests == 10 and lv.completed + lv.failed == 10 and lv.failed == 0
        assert lv.total_output_tokens == 20 * lv.completed
        assert lv.request_goodput <= lv.request_throughput
        assert lv.output_goodput <= lv.output_throughput
        assert lv.p95_ttft_ms is not None and lv.median_ttft_ms is not None
        assert lv.median_ttft_ms <= lv.p95_ttft_ms
        assert lv.seed == 5 and lv.slo_ttft_ms == 2000.0 and lv.slo_tpot_ms == 100.0
    saved = tmp_path / "rate.json"
    saved.write_text(json.dumps(result.to_dict()))
    back = load_saved(saved)
    assert isinstance(back, RateResult) and back.to_dict() == result.to_dict()
    with pytest.raises(BenchError, match="open-loop result"):
        load_result(saved)
    with pytest.raises(BenchError, match="not a spark-ops bench result"):  # an older reader
        SweepResult.from_dict(result.to_dict(), source="rate.json")
    assert isinstance(load_saved(OLD_SWEEP), SweepResult)
    text = render_rate_text(result, width=160)
    assert "offered" in text and "goodput" in text and "TTFT ≤ 2000 ms" in text


@pytest.mark.timeout(120)
def test_max_concurrency_caps_in_flight(sim_url: str) -> None:
    """With a cap of 2 at a rate far above what 2 streams serve, every request still goes out
    (late: its send lag says so), never more than 2 at once; without the cap they overlap."""

    async def run(cap: int | None) -> tuple[list[RequestRecord], list[float]]:
        """Eight constant arrivals at 200/s, 10 tokens each, through send_at."""
        async with StreamClient(sim_url) as client:
            model = await discover_model(client)
            bodies = Bodies.build(model, api="chat", output_tokens=10, prompts_path=None)
            times = arrival_times(8, 200.0, "constant", 0)
            records, lags, _ = await send_at(client, ENDPOINTS["chat"], bodies, times, cap)
        return records, lags

    def most_in_flight(records: list[RequestRecord]) -> int:
        """The most requests in flight at any start."""
        return max(sum(1 for o in records if o.start <= r.start < o.end) for r in records)

    capped, lags = asyncio.run(run(2))
    assert [r.index for r in capped] == list(range(8)) and all(r.ok for r in capped)
    assert most_in_flight(capped) <= 2
    assert max(lags) > 0  # held back by the cap
    free, _ = asyncio.run(run(None))
    assert all(r.ok for r in free) and most_in_flight(free) > 2


@pytest.mark.timeout(120)
def test_cli_open_loop_json_csv_and_serve_page(sim_url: str, tmp_path: Path) -> None:
    """`bench --request-rate 5,10 --json -o -- csv`: the levels as JSON; serve's sweeps page
    shows the saved file beside an old sweep, neither breaking the other."""
    from spark_ops.serve.sweeps import load_sweep
    from spark_ops.serve.sweepspage import sweeps_page

    out = tmp_path / "results" / "rate.json"
    out.parent.mkdir()
    res = CliRunner().invoke(cli, [
        "--url", sim_url, "--request-rate", "5,10", "--requests", "6", "--output-tokens", "10",
        "--arrivals", "constant", "--slo-ttft-ms", "0", "--json", "-o", str(out),
        "--csv", str(tmp_path / "rate.csv"),
    ])  # fmt: skip
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["schema"] == "spark-ops.bench-rate/1" and data["mode"] == "open-loop"
    assert [lv["request_rate"] for lv in data["levels"]] == [5.0, 10.0]
    assert all(lv["requests"] == 6 and lv["slo_ttft_ms"] is None for lv in data["levels"])
    assert json.loads(out.read_text())["levels"] == data["levels"]
    assert (tmp_path / "rate.csv").read_text().count("\n") == 3
    rows = [load_sweep(out), load_sweep(OLD_SWEEP)]
    assert "openloop" in rows[0] and "error" not in rows[0]
    assert "result" in rows[1] and "error" not in rows[1]
    page = sweeps_page({"dir": str(out.parent), "runs": rows})
    assert "rate.json" in page and "goodput req/s" in page
    assert "sweep-cap5.json (measured)" in page


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (["--request-rate", "2", "--concurrency", "4"], "--concurrency is for closed-loop"),
        (["--request-rate", "2", "--what-if-cap", "4"], "--what-if-cap is for closed-loop"),
        (["--requests", "4"], "--requests is for open-loop"),
        (["--max-concurrency", "4"], "--max-concurrency is for open-loop"),
        (["--request-rate", "0"], "expected comma-separated rates"),
        (["--request-rate", "two"], "expected comma-separated rates"),
        (["--request-rate", "2", "--resume", "x.json"], "--resume is for closed-loop"),
        (["--request-rate", "2", "--url", "x", "--slo-tpot-ms", "-1"], "ms >= 0"),
    ],
)
def test_cli_usage_errors(args: list[str], match: str) -> None:
    """Options of the other loop, a bad rate or SLO: a usage error before any request."""
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 2, res.output
    assert match in res.output


@pytest.mark.timeout(120)
def test_measure_and_prove_against_sim(sim_url: str) -> None:
    """measure() at a concurrency and at a rate sends exactly the point's requests; a point
    proved against itself passes or fails on the figures alone, and a measurement with errors
    fails the default gate."""
    closed = LoadPoint(concurrency=3, requests=6, output_tokens=10)
    opened = LoadPoint(request_rate=20.0, requests=6, output_tokens=10, seed=1)
    a = asyncio.run(measure(sim_url, closed))
    b = asyncio.run(measure(Endpoint(sim_url), opened))
    for m, point in ((a, closed), (b, opened)):
        assert m.requests == 6 and m.errors == 0 and m.point == point
        assert m.tok_s is not None and m.tok_s > 0
        assert m.ttft_p95_ms is not None and m.tpot_p95_ms is not None
        assert m.goodput_tok_s is not None and m.goodput_tok_s <= m.tok_s
    same = prove(a, a)
    assert same.ok and all(c.change == 0 for c in same.checks)
    assert not prove(a, b).ok and "different loads" in prove(a, b).problems[0]
    with pytest.raises(BenchError, match="cannot reach"):
        asyncio.run(measure("http://127.0.0.1:9", closed))


@pytest.mark.timeout(120)
def test_a_load_that_only_fails_fails_the_gate(sim_url: str) -> None:
    """Every request refused (a model the server does not serve): the measurement counts the
    errors and has no tok/s or latency, and the gate fails each of those metrics with a reason."""
    point = LoadPoint(concurrency=2, requests=4, output_tokens=10)
    good = asyncio.run(measure(sim_url, point))
    bad = asyncio.run(measure(Endpoint(sim_url, model="models/not-served"), point))
    assert bad.requests == 4 and bad.errors == 4
    assert bad.tok_s is None and bad.ttft_p95_ms is None and bad.tpot_p95_ms is None
    assert bad.goodput_req_s == 0.0
    verdict = prove(good, bad)
    assert not verdict.ok
    by_metric = {c.metric: c for c in verdict.checks}
    for metric in ("tok_s", "ttft_p95_ms", "tpot_p95_ms"):
        assert not by_metric[metric].ok and "after not measured" in by_metric[metric].reason
    assert not by_metric["errors"].ok and by_metric["errors"].after == 4


def test_rate_config_refused() -> None:
    """Settings out of range are named before any request."""
    for kw, match in (
        ({"rates": []}, "non-empty"),
        ({"rates": [1.0, 1.0]}, "duplicate"),
        ({"rates": [math.inf]}, "non-empty"),
        ({"rates": [1.0], "requests": 0}, "requests 0"),
        ({"rates": [1.0], "arrivals": "burst"}, "not supported"),
        ({"rates": [1.0], "slo": Slo(ttft_ms=-1)}, "SLO ttft_ms"),
    ):
        with pytest.raises(BenchError, match=match):
            RateConfig(base_url="http://127.0.0.1:1", **kw).validate()


def _saved(path: Path, rate_records: dict[float, list[Any]], knobs: dict[str, Any]) -> Path:
    """An open-loop result file of levels summarized from given records (per rate)."""
    levels = [
        summarize_rate_level(_records(spec), t0=0.0, rate=rate, arrivals="poisson", seed=0,
                             max_concurrency=None, slo=Slo())
        for rate, spec in rate_records.items()
    ]  # fmt: skip
    result = RateResult(base_url="http://127.0.0.1:1", model="m", api="chat", arrivals="poisson",
                        output_tokens=10, levels=levels, knobs=knobs)  # fmt: skip
    path.write_text(json.dumps(result.to_dict()))
    return path


def test_compare_two_open_loop_results_through_the_gate(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`bench compare` of two open-loop files: a verdict per shared rate; a rate whose tok/s
    fell past the limit fails (exit 11); a concurrency sweep beside one is refused."""
    from spark_ops.cli.main import main
    from spark_ops.errors import ExitStatus

    def run(*args: str) -> tuple[int, str, str]:
        """`spark-ops bench compare ARGS`: exit code, stdout, stderr."""
        with pytest.raises(SystemExit) as exc:
            main(["bench", "compare", *args])
        out = capsys.readouterr()
        return int(exc.value.code or 0), out.out, out.err

    fast = [[0.0, 0.1, 1.0, 10], [0.5, 0.6, 1.5, 10]]
    slow = [[0.0, 0.1, 1.0, 10], [0.5, 0.6, 2.0, 10]]  # ends later: fewer tok/s, slower TPOT
    a = _saved(tmp_path / "a.json", {1.0: fast, 2.0: fast}, {"max_num_seqs": 6})
    b = _saved(tmp_path / "b.json", {1.0: fast, 2.0: slow, 4.0: fast}, {"max_num_seqs": 64})
    code, out, _ = run(str(a), str(a))
    assert code == ExitStatus.OK and out.count("Gate: pass") == 2
    code, out, _ = run(str(a), str(b), "--json")
    assert code == ExitStatus.CHECK_FAILED
    data = json.loads(out)
    assert data["ok"] is False and data["only_after"] == [4.0] and data["only_before"] == []
    by_rate = {v["point"]["request_rate"]: v for v in data["rates"]}
    assert by_rate[1.0]["ok"] is True and by_rate[2.0]["ok"] is False
    failed = {c["metric"] for c in by_rate[2.0]["checks"] if not c["ok"]}
    assert failed == {"tok_s", "tpot_p95_ms"}
    code, out, _ = run(str(a), str(b))
    assert code == ExitStatus.CHECK_FAILED and "Gate: FAIL." in out and "only in" in out
    code, _, err = run(str(a), str(OLD_SWEEP))
    assert code == ExitStatus.USAGE
    assert "compare like with like" in err
