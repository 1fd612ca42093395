"""Calibrate the sim engine against the ops note: burst sweeps at --max-num-seqs 64 and 6.

Starts `python -m spark_ops.sim.engine serve` as a subprocess on 127.0.0.1 port 0 with the shipped
config sped up by --time-scale, sends all C requests at once (300 output tokens, ignore_eos) with a
minimal aiohttp streaming client, and prints per C: the measured aggregate tok/s divided by the
time scale (i.e. in emulated seconds), the step model's prediction, the note's figure and the ratio.

    python benchmarks/sim_calibration.py [--time-scale 10] [--big 768] [--caps 64,6] [--tokens 300]

--big N adds a burst of N streams with the cap at N, to check that the engine (not the model) is
not the bottleneck: the measured/model ratio should stay near 1.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from spark_ops.sim.engine_config import load_config  # noqa: E402
from spark_ops.sim.engine_model import StepModel  # noqa: E402

NOTE = {1: 69, 6: 111, 16: 164, 32: 243, 64: 280}
SWEEP = [1, 6, 16, 32, 64]
_BACKGROUND: set[asyncio.Future[None]] = set()


async def start_engine(config: Path, cap: int) -> tuple[asyncio.subprocess.Process, str]:
    """Start the sim engine and return it with its base URL once it serves."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPARK_SIM_")}
    env["SPARK_SIM_CONFIG"] = str(config)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "spark_ops.sim.engine", "serve", "models/glm-5.3-flash",
        "--host", "127.0.0.1", "--port", "0", "--max-num-seqs", str(cap),
        "--kv-cache-memory-bytes", "60G", "--enforce-eager",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL, env=env, cwd=REPO,
    )  # fmt: skip
    assert proc.stdout is not None
    while line := (await asyncio.wait_for(proc.stdout.readline(), 60)).decode():
        if m := re.search(r"Starting vLLM server on (http://\S+)", line):
            _BACKGROUND.add(asyncio.ensure_future(_drain(proc.stdout)))
            return proc, m.group(1)
    raise SystemExit("the sim engine exited before serving")


async def _drain(stream: asyncio.StreamReader) -> None:
    """Keep reading the engine's stdout so it never blocks on a full pipe."""
    while await stream.read(65536):
        pass


async def one_stream(
    session: aiohttp.ClientSession, url: str, i: int, tokens: int, marks: list[float]
) -> int:
    """Send one streaming completion; return its token count (appends its first-token time)."""
    body = {
        "prompt": f"Task {i}: implement a small function in language {i % 6}.",
        "max_tokens": tokens, "ignore_eos": True, "temperature": 0, "stream": True,
        "stream_options": {"include_usage": True},
    }  # fmt: skip
    got = 0
    async with session.post(url + "/v1/completions", json=body) as resp:
        resp.raise_for_status()
        async for raw in resp.content:
            if raw.startswith(b"data: {"):
                got += bool(json.loads(raw[6:])["choices"])
                if got == 1:
                    marks.append(time.perf_counter())
    return got


async def burst(url: str, concurrency: int, tokens: int) -> tuple[float, int, float]:
    """Send `concurrency` requests at once; return wall s, tokens, and s after all had a token."""
    conn = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=None, sock_read=120)
    async with aiohttp.ClientSession(connector=conn, timeout=timeout) as session:
        marks: list[float] = []
        start = time.perf_counter()
        counts = await asyncio.gather(
            *(one_stream(session, url, i, tokens, marks) for i in range(concurrency))
        )
        end = time.perf_counter()
        return end - start, sum(counts), end - max(marks)


def predicted(model: StepModel, concurrency: int, cap: int, tokens: int) -> float:
    """Aggregate tok/s the step model predicts for an equal-length burst under a cap."""
    total, left = 0.0, concurrency
    while left > 0:
        batch = min(cap, left)
        total += tokens * model.decode_time(batch) + model.prefill_time(batch * 12)
        left -= batch
    return concurrency * tokens / total


async def sweep(config: Path, scale: float, cap: int, points: list[int], tokens: int) -> None:
    """Run one sweep against a fresh engine with the given cap and print its rows."""
    model = StepModel.from_config(load_config(config))
    proc, url = await start_engine(config, cap)
    try:
        for c in points:
            wall, got, steady_s = await burst(url, c, tokens)
            measured = got / wall / scale
            pred = predicted(model, c, cap, tokens)
            note = NOTE.get(c) if cap == 64 else None
            ratio = f"{measured / note:6.2f}" if note else "     -"
            note_s = f"{note:6d}" if note else "     -"
            print(
                f"{cap:>4} {c:>5} {wall:>8.2f} {measured:>10.1f} {pred:>8.1f} {note_s} {ratio}"
                f" {measured / pred:>9.2f}",
                flush=True,
            )
            if c == cap and c > 64:
                # once every stream has its first token, the batch is full: compare with C / t(C)
                steady = c * (tokens - 1) / steady_s / scale
                ideal = model.throughput(c)
                print(
                    f"     steady full batch: {steady:.1f} tok/s vs model {ideal:.1f} "
                    f"({steady / ideal:.2f}): arrival spread {wall - steady_s:.2f} s wall"
                )
    finally:
        proc.terminate()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(proc.wait(), 10)


async def main() -> None:
    """Parse options, write the sped-up config, run the sweeps."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--time-scale", type=float, default=10.0)
    ap.add_argument("--tokens", type=int, default=300)
    ap.add_argument("--big", type=int, default=0, help="also burst N streams with the cap at N")
    ap.add_argument("--caps", default="64,6", help="caps to sweep (comma list; empty: none)")
    opts = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "engine.yaml"
        base = REPO / "recipes" / "sim" / "engine.yaml"
        config.write_text(yaml.safe_dump({"base": str(base), "time_scale": opts.time_scale}))
        print(f"time_scale {opts.time_scale}: tok/s below are measured / time_scale")
        print(" cap     C   wall_s  tok/s_sim  model_t   note  ratio  sim/model")
        for cap in [int(c) for c in opts.caps.split(",") if c]:
            await sweep(config, opts.time_scale, cap, SWEEP, opts.tokens)
        if opts.big:
            await sweep(config, opts.time_scale, opts.big, [opts.big], opts.tokens)


if __name__ == "__main__":
    asyncio.run(main())
