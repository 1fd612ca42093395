"""What does reading vLLM's /metrics cost, per page, with spark-ops' one parser?

The bench scraper reads the page every 0.5 s on the same event loop that timestamps streamed
tokens, so a slow parse would shift TTFT/ITL. Times, on the real idle page of vLLM's CPU build
(tests/fixtures/bench/metrics-idle.txt) and on it repeated 8 times (a page with several engines'
histograms): the whole page through prometheus_client's parser (`parse_metrics`), the four
figures bench wants (`metric_sums(text, WANTED)`: only their lines reach the parser), and the KV
pool (`kv_pool_tokens`). Medians of interleaved rounds.

    python benchmarks/metrics_parse.py [--rounds 30]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common as c

from spark_ops.bench.metrics import WANTED
from spark_ops.engine.metrics import kv_pool_tokens, metric_sums, parse_metrics

PAGE = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "bench" / "metrics-idle.txt"


def main() -> None:
    """Print one table: milliseconds per page for each way of reading it."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=30)
    args = ap.parse_args()
    idle = PAGE.read_text()
    pages = {"idle page (1 engine)": idle, "8x the page": idle * 8}
    ways: dict[str, Callable[[str], object]] = {
        "parse_metrics (whole page)": parse_metrics,
        "metric_sums(WANTED)": lambda t: metric_sums(t, WANTED),
        "kv_pool_tokens": kv_pool_tokens,
    }
    times: dict[tuple[str, str], list[float]] = {(p, w): [] for p in pages for w in ways}
    for _ in range(args.rounds):
        for pname, text in pages.items():
            for wname, fn in ways.items():
                start = time.perf_counter()
                fn(text)
                times[(pname, wname)].append(time.perf_counter() - start)
    rows = [
        [pname, f"{len(text.splitlines()):,}"]
        + [f"{statistics.median(times[(pname, w)]) * 1000:.2f}" for w in ways]
        for pname, text in pages.items()
    ]
    print(c.table("ms per /metrics page (median)", ["page", "lines", *ways], rows))


if __name__ == "__main__":
    main()
