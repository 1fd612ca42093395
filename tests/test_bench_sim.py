"""The sweep against the simulated vLLM engine (`python -m spark_ops.sim.engine serve`).

The sim's step model is fitted to the ops note's burst table and runs 10x faster than emulated
here (tests/fixtures/bench/sim.yaml), so tok/s divided by 10 is comparable with the note.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from spark_ops.bench.sweep import SweepConfig, run_sweep

SIM_CONFIG = Path(__file__).parent / "fixtures" / "bench" / "sim.yaml"
TIME_SCALE = 10.0

pytestmark = [
    pytest.mark.timeout(90),
    pytest.mark.skipif(
        not (Path(__file__).parents[1] / "spark_ops" / "sim" / "engine.py").exists(),
        reason="the sim engine is not in this tree",
    ),
]


@contextlib.asynccontextmanager
async def sim_engine(*flags: str) -> AsyncIterator[str]:
    """Run the sim engine on 127.0.0.1 port 0; yield its base URL from the start-up line."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPARK_SIM_")}
    env["SPARK_SIM_CONFIG"] = str(SIM_CONFIG)
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "spark_ops.sim.engine",
        "serve",
        "models/glm-5.3-flash",
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        *flags,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env=env,
    )
    assert proc.stdout is not None
    seen: list[str] = []
    try:
        url = await asyncio.wait_for(_until_ready(proc.stdout, seen), 30)
        drain = asyncio.ensure_future(_drain(proc.stdout))
        yield url
        drain.cancel()
    finally:
        if proc.returncode is None:
            proc.terminate()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(proc.wait(), 10)
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def _until_ready(stream: asyncio.StreamReader, seen: list[str]) -> str:
    """Read the log up to `Application startup complete.`; return the URL it announced."""
    url = None
    while True:
        line = (await stream.readline()).decode()
        if not line:
            raise AssertionError("sim engine exited:\n" + "".join(seen))
        seen.append(line)
        if m := re.search(r"Starting vLLM server on (http://\S+)", line):
            url = m.group(1).rstrip("/")
        if "Application startup complete" in line and url:
            return url


async def _drain(stream: asyncio.StreamReader) -> None:
    """Keep reading the engine's log so that its pipe never fills."""
    while await stream.readline():
        pass


async def test_sweep_against_sim_with_cap_of_six() -> None:
    """--max-num-seqs 6: the sweep finds the cap (plateau 6 = the knob) and the knee after 6."""
    async with sim_engine("--max-num-seqs", "6", "--enforce-eager") as url:
        result = await run_sweep(
            SweepConfig(
                base_url=url,
                levels=[1, 6, 16],
                output_tokens=300,
                repeats=1,
                sample_interval_s=0.05,
                knobs={"max_num_seqs": 6},
                slo_tok_s=12 * TIME_SCALE,
            )
        )
    assert result.model == "models/glm-5.3-flash"
    assert result.metrics_available
    by_c = {lv.max_concurrency: lv for lv in result.levels}
    for lv in result.levels:
        assert lv.failed == 0 and lv.usage_reported
        assert lv.total_output_tokens == 300 * lv.max_concurrency
        # the engine's own counter agrees with the client's count (same tokens, same wall clock)
        assert lv.engine_output_throughput == pytest.approx(lv.output_throughput, rel=0.05)
    cap = result.reading.cap
    assert cap.detected and cap.plateau == 6 and cap.matches_knob is True
    assert by_c[16].max_waiting is not None and by_c[16].max_waiting >= 1
    # 6 -> 16 gains nothing under a cap of 6: that is the knee
    assert result.reading.knee == 16
    # more concurrency up to the cap does pay (the note: 69 -> 111 tok/s)
    assert by_c[6].output_throughput > by_c[1].output_throughput
    assert by_c[1].per_user_tok_s is not None and by_c[6].per_user_tok_s is not None
    assert by_c[6].per_user_tok_s < by_c[1].per_user_tok_s
