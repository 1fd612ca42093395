"""The simulated engine for benchmark scripts: `vllm serve` of spark_ops.sim on loopback.

Used by sim_calibration.py and whatif_validation.py (run from this folder, so a plain import finds
it).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import sys
from collections.abc import AsyncIterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
READY = re.compile(r"Starting vLLM server on (http://\S+)")


@contextlib.asynccontextmanager
async def sim_engine(cap: int, config: Path, boot_s: float = 60.0) -> AsyncIterator[str]:
    """The sim engine at --max-num-seqs cap with this config; yields its base URL, then stops it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPARK_SIM_")}
    env["SPARK_SIM_CONFIG"] = str(config)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "spark_ops.sim.engine", "serve", "models/glm-5.3-flash",
        "--host", "127.0.0.1", "--port", "0", "--max-num-seqs", str(cap),
        "--kv-cache-memory-bytes", "60G", "--enforce-eager",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL, env=env, cwd=REPO,
    )  # fmt: skip
    assert proc.stdout is not None
    drain: asyncio.Future[None] | None = None
    try:
        url = None
        while line := (await asyncio.wait_for(proc.stdout.readline(), boot_s)).decode():
            if m := READY.search(line):
                url = m.group(1)
                break
        if url is None:
            raise SystemExit("the sim engine exited before serving")
        drain = asyncio.ensure_future(_drain(proc.stdout))
        yield url
    finally:
        if proc.returncode is None:
            proc.terminate()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(proc.wait(), 10)
        if drain is not None:
            drain.cancel()


async def _drain(stream: asyncio.StreamReader) -> None:
    """Keep reading the engine's stdout so it never blocks on a full pipe."""
    while await stream.read(65536):
        pass
