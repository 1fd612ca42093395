"""The ops note's finding on the real engine: vLLM's CPU build at caps 6 and 64, side by side.

Starts two real `vllm serve` processes on 127.0.0.1 (the test ground's venv and tiny models, built
by `.ci/install-ground.sh`), one per cap, and sweeps them with `spark-ops bench --url … --json` in
interleaved rounds (cap 6, cap 64, cap 6, …) so that both see the same machine noise. Prints, per
concurrency level, the median and range of aggregate tok/s for each cap, the ratio of medians and
the highest `vllm:num_requests_running` seen (the cap at work).

    python benchmarks/realvllm_caps.py [--rounds 3] [--concurrency 1,6,16,32] [--model NAME]

This is a measurement, not a test: the tests assert only the behaviour (tests/test_e2e_realvllm.py).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from ground.vllm import VllmFactory, VllmServer, vllm_unavailable_reason  # noqa: E402

CAPS = (6, 64)


def bench(server: VllmServer, levels: str, tokens: int, out: Path) -> dict[int, dict[str, float]]:
    """One `spark-ops bench` sweep of server; per level its aggregate tok/s and peak running."""
    argv = [sys.executable, "-m", "spark_ops.cli.main", "bench", "--url", server.base_url]
    argv += ["--concurrency", levels, "--repeats", "1", "--output-tokens", str(tokens)]
    argv += ["-o", str(out)]
    env = dict(os.environ, PYTHONPATH=str(REPO))
    res = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=900, check=False)
    if res.returncode != 0:
        raise SystemExit(f"bench against {server.base_url} failed:\n{res.stderr[-3000:]}")
    result = json.loads(out.read_text())
    return {
        int(lv["max_concurrency"]): {
            "tok_s": float(lv["output_throughput"]),
            "running": float(lv["max_running"] or 0),
        }
        for lv in result["levels"]
    }


def main() -> None:
    """Parse arguments, run the interleaved rounds, print the table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--concurrency", default="1,6,16,32")
    ap.add_argument("--output-tokens", type=int, default=128)
    ap.add_argument("--model", default="tiny-llama-deep")
    args = ap.parse_args()
    reason = vllm_unavailable_reason()
    if reason:
        raise SystemExit(f"no real vLLM here: {reason}")
    levels = [int(x) for x in args.concurrency.split(",")]
    with tempfile.TemporaryDirectory(prefix="realvllm-caps-") as tmp:
        factory = VllmFactory(Path(tmp))
        try:
            servers = {cap: factory.start(args.model, max_num_seqs=cap) for cap in CAPS}
            runs: dict[int, dict[int, list[float]]] = {cap: {c: [] for c in levels} for cap in CAPS}
            peak: dict[int, dict[int, float]] = {cap: dict.fromkeys(levels, 0.0) for cap in CAPS}
            for r in range(args.rounds):
                for cap in CAPS if r % 2 == 0 else CAPS[::-1]:
                    out = Path(tmp) / f"bench-{cap}-{r}.json"
                    figures = bench(servers[cap], args.concurrency, args.output_tokens, out)
                    for c in levels:
                        runs[cap][c].append(figures[c]["tok_s"])
                        peak[cap][c] = max(peak[cap][c], figures[c]["running"])
        finally:
            factory.close()
    load = os.getloadavg()[0]
    print(f"\nreal vLLM CPU build, {args.model}, {args.rounds} interleaved rounds, load {load:.1f}")
    head = f"{'C':>4} | {'cap 6 tok/s (min-max)':>24} | {'cap 64 tok/s (min-max)':>24} | ratio"
    print(head + " | peak running 6 / 64")
    print("-" * (len(head) + 22))
    for c in levels:
        a, b = runs[6][c], runs[64][c]
        ma, mb = statistics.median(a), statistics.median(b)
        cell_a = f"{ma:7.0f} ({min(a):.0f}-{max(a):.0f})"
        cell_b = f"{mb:7.0f} ({min(b):.0f}-{max(b):.0f})"
        ratio = mb / ma if ma else float("nan")
        print(
            f"{c:>4} | {cell_a:>24} | {cell_b:>24} | {ratio:4.2f}x"
            f" | {peak[6][c]:.0f} / {peak[64][c]:.0f}"
        )


if __name__ == "__main__":
    main()
