"""Readiness detection lag and apply's own overhead on the embedded cluster; prints a table.

    python benchmarks/apply_overhead.py [--rounds 5]

For each round, `apply` alternates --max-num-seqs between two values. A separate poller asks the
engine for a 1-token completion every 20 ms once the restart command returned, and records when it
first succeeds.

- detection lag: when spark-ops reported READY minus when the poller first got an answer;
- engine boot: the poller's first answer minus the start of the restart step;
- apply overhead: apply's whole wall time minus the engine boot (connect, lock, plan, write, drain,
  trigger, prune, verify, budget: everything spark-ops adds to the boot itself).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from spark_ops.inventory import load_inventory  # noqa: E402
from spark_ops.log import configure  # noqa: E402
from spark_ops.recipe import changes_from_options  # noqa: E402
from spark_ops.sim.cluster import SimOptions  # noqa: E402
from spark_ops.sim.control import down, up  # noqa: E402
from spark_ops.workflows import ApplyOptions, Operation, plan_apply  # noqa: E402
from spark_ops.workflows.execute import execute  # noqa: E402


async def poll_first_answer(url: str, stop: asyncio.Event, start: asyncio.Event) -> float | None:
    """Poll a 1-token completion every 20 ms once the new engine runs; time of the first answer."""
    import aiohttp

    body = {"model": "glm-5.3-flash", "prompt": "x", "max_tokens": 1}
    await start.wait()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as http:
        while not stop.is_set():
            try:
                async with http.post(url + "/v1/completions", json=body) as r:
                    if r.status == 200 and (await r.json()).get("choices"):
                        return time.time()
            except Exception:
                pass
            await asyncio.sleep(0.02)
    return None


async def one_round(inventory: str, engine_url: str, seqs: int) -> dict[str, float]:
    """One apply with a poller beside it."""
    cluster = load_inventory(inventory).cluster()
    opts = ApplyOptions(changes=changes_from_options(max_num_seqs=seqs), drain=False)
    marks: dict[str, float] = {}
    restart_started = asyncio.Event()
    stop = asyncio.Event()

    def on_step(step: Any) -> None:
        """Note when the restart begins."""
        if step.name == "restart" and step.status == "running":
            marks["restart"] = time.time()
        elif step.name == "restart" and step.status == "done":
            restart_started.set()  # the old engine is stopped once the trigger returns

    def on_event(event: Any) -> None:
        """Note when spark-ops calls the engine ready."""
        if event.kind == "phase" and event.phase.value == "READY":
            marks["ready"] = time.time()

    poller = asyncio.ensure_future(poll_first_answer(engine_url, stop, restart_started))
    t0 = time.time()
    async with Operation.open(cluster, "apply") as op:
        plan = await plan_apply(op, opts)
        outcome = await execute(op, plan, opts, on_step=on_step, on_event=on_event)
    total = time.time() - t0
    stop.set()
    first = await poller
    assert outcome.ok and first is not None
    boot = first - marks["restart"]
    return {"lag": marks["ready"] - first, "boot": boot, "total": total, "overhead": total - boot}


def main() -> None:
    """Run the rounds and print the table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    configure(-1)
    root = Path(tempfile.mkdtemp(prefix="apply-overhead-")) / "sim"
    state = up(root, SimOptions(time_scale=1.0, boot_scale=1.0))
    url = f"http://127.0.0.1:{state['engine_port']}"
    rows = []
    try:
        time.sleep(8)
        for i in range(args.rounds):
            rows.append(asyncio.run(one_round(state["inventory"], url, 64 if i % 2 == 0 else 32)))
    finally:
        down(root)
    med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
    worst = {k: max(r[k] for r in rows) for k in rows[0]}
    print(f"apply on the embedded 4-node cluster, {len(rows)} rounds")
    print(f"{'measure':<40}{'median':>10}{'worst':>10}{'target':>10}")
    for key, label, target in (
        ("lag", "readiness detection lag (s)", "< 1"),
        ("boot", "engine boot, restart -> first answer (s)", ""),
        ("total", "apply wall time (s)", ""),
        ("overhead", "apply overhead beyond the boot (s)", "< 3"),
    ):
        print(f"{label:<40}{med[key]:>10.2f}{worst[key]:>10.2f}{target:>10}")


if __name__ == "__main__":
    main()
