"""Calibrate the sim engine against the ops note: burst sweeps at --max-num-seqs 64 and 6.

Starts `python -m spark_ops.sim.engine serve` as a subprocess on 127.0.0.1 port 0 with the shipped
config sped up by --time-scale, sends all C requests at once (300 output tokens, ignore_eos) with a
minimal aiohttp streaming client, and prints per C: the measured aggregate and per-user tok/s
(output tokens / end-to-end time, averaged over requests) in emulated seconds (measured / time
scale), the engine core's own scheduling replayed on a virtual clock (`virtual_burst`), the note's
figures and the ratios measured / note.

    python benchmarks/sim_calibration.py [--time-scale 10] [--big 768] [--caps 64,6] [--tokens 300]
    python benchmarks/sim_calibration.py --fit     # refit the scheduler parameters (virtual clock)

--big N adds a burst of N streams with the cap at N, to check that the engine (not the model) is
not the bottleneck: the measured/model ratio should stay near 1.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from sim_engine import sim_engine  # noqa: E402

from spark_ops.bench.workload import load_prompts  # noqa: E402
from spark_ops.sim.engine_config import load_config  # noqa: E402
from spark_ops.sim.engine_model import StepModel, virtual_burst  # noqa: E402

NOTE = {1: 69, 6: 111, 16: 164, 32: 243, 64: 280}
NOTE_USER = {1: 69.0, 6: 21.0, 16: 12.2, 32: 9.4, 64: 7.2}
# The bench's own prompts, sent as chat (the sim counts 67.5 tokens of text + 8 of template).
PROMPTS = [p.text for p in load_prompts(None)]
PROMPT_TOKENS = 75
SWEEP = [1, 6, 16, 32, 64]


async def one_stream(
    session: aiohttp.ClientSession, url: str, i: int, tokens: int, marks: list[float]
) -> tuple[int, float]:
    """Send one streaming completion; return its token count and end-to-end seconds."""
    body = {
        "messages": [{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}],
        "max_tokens": tokens, "ignore_eos": True, "temperature": 0, "stream": True,
        "stream_options": {"include_usage": True},
    }  # fmt: skip
    got = 0
    start = time.perf_counter()
    async with session.post(url + "/v1/chat/completions", json=body) as resp:
        resp.raise_for_status()
        async for raw in resp.content:
            if raw.startswith(b"data: {"):
                got += bool(json.loads(raw[6:])["choices"])
                if got == 1:
                    marks.append(time.perf_counter())
    return got, time.perf_counter() - start


async def burst(url: str, concurrency: int, tokens: int) -> tuple[float, int, float, float]:
    """Send `concurrency` requests at once: wall s, tokens, s after all had a token, per-user."""
    conn = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=None, sock_read=120)
    async with aiohttp.ClientSession(connector=conn, timeout=timeout) as session:
        marks: list[float] = []
        start = time.perf_counter()
        counts = await asyncio.gather(
            *(one_stream(session, url, i, tokens, marks) for i in range(concurrency))
        )
        end = time.perf_counter()
        per_user = sum(n / s for n, s in counts if s > 0) / len(counts)
        return end - start, sum(n for n, _ in counts), end - max(marks), per_user


def predicted(
    cfg: dict[str, object], concurrency: int, cap: int, tokens: int
) -> tuple[float, float]:
    """Aggregate and per-user tok/s of the engine core's scheduling on a virtual clock."""
    times = virtual_burst(
        cfg, concurrency=concurrency, cap=cap, output_tokens=tokens, prompt_tokens=PROMPT_TOKENS
    )
    wall = max(t.end_s for t in times)
    return concurrency * tokens / wall, sum(tokens / t.end_s for t in times) / len(times)


async def sweep(config: Path, scale: float, cap: int, points: list[int], tokens: int) -> None:
    """Run one sweep against a fresh engine with the given cap and print its rows."""
    cfg = load_config(config)
    model = StepModel.from_config(cfg)
    async with sim_engine(cap, config) as url:
        for c in points:
            wall, got, steady_s, per_user = await burst(url, c, tokens)
            measured, user = got / wall / scale, per_user / scale
            pred, pred_user = predicted(cfg, c, cap, tokens)
            note = NOTE.get(c) if cap == 64 and tokens == 300 else None
            note_u = NOTE_USER.get(c) if note else None
            ratio = f"{measured / note:6.3f}" if note else "     -"
            ratio_u = f"{user / note_u:6.3f}" if note_u else "     -"
            note_s = f"{note:4d}/{note_u:<4}" if note else "        - "
            print(
                f"{cap:>4} {c:>5} {wall:>7.2f} {measured:>7.1f}/{user:<5.1f} "
                f"{pred:>6.1f}/{pred_user:<5.1f} {note_s} {ratio} {ratio_u}"
                f" {measured / pred:>6.3f} {user / pred_user:>6.3f}",
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


async def main() -> None:
    """Parse options, write the sped-up config, run the sweeps."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--time-scale", type=float, default=10.0)
    ap.add_argument("--tokens", type=int, default=300)
    ap.add_argument("--big", type=int, default=0, help="also burst N streams with the cap at N")
    ap.add_argument("--caps", default="64,6", help="caps to sweep (comma list; empty: none)")
    ap.add_argument("--fit", action="store_true", help="refit the scheduler parameters and stop")
    opts = ap.parse_args()
    if opts.fit:
        fit(load_config(REPO / "recipes" / "sim" / "engine.yaml"))
        return
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "engine.yaml"
        base = REPO / "recipes" / "sim" / "engine.yaml"
        config.write_text(yaml.safe_dump({"base": str(base), "time_scale": opts.time_scale}))
        print(f"time_scale {opts.time_scale}: tok/s below are measured / time_scale")
        print(
            " cap     C  wall_s  agg/user_sim  virtual_clock  note       agg/n  user/n"
            "  sim/virtual(agg user)"
        )
        for cap in [int(c) for c in opts.caps.split(",") if c]:
            await sweep(config, opts.time_scale, cap, SWEEP, opts.tokens)
        if opts.big:
            await sweep(config, opts.time_scale, opts.big, [opts.big], opts.tokens)


FIT_KEYS = (
    "t0_s", "te_s", "q", "c_s", "prefill_fixed_s", "frontend_per_prompt_token_s",
    "frontend_per_running_s",
)  # fmt: skip


def _fit_loss(cfg: dict[str, object], values: list[float]) -> float:
    """Worst |log(model / note)| over the ten figures, plus a tenth of their mean."""
    import math

    if min(values) < 0 or values[2] >= 1:
        return 1e9
    sched = {**cfg["scheduler"], **dict(zip(FIT_KEYS, values, strict=True))}  # type: ignore[dict-item]
    trial = {**cfg, "scheduler": sched}
    errs = []
    for c in SWEEP:
        agg, user = predicted(trial, c, 64, 300)
        errs += [abs(math.log(agg / NOTE[c])), abs(math.log(user / NOTE_USER[c]))]
    return max(errs) + 0.1 * sum(errs) / len(errs)


def fit(cfg: dict[str, object]) -> None:
    """Nelder-Mead from the shipped values; print the parameters and the fitted table."""
    x = [float(cfg["scheduler"][k]) for k in FIT_KEYS]  # type: ignore[index]
    n = len(x)
    pts = [x] + [[v * (1.2 if j == i else 1.0) for j, v in enumerate(x)] for i in range(n)]
    vals = [_fit_loss(cfg, p) for p in pts]
    for _ in range(600):
        order = sorted(range(n + 1), key=vals.__getitem__)
        pts, vals = [pts[i] for i in order], [vals[i] for i in order]
        cen = [sum(p[j] for p in pts[:-1]) / n for j in range(n)]
        for k in (1.0, 2.0, -0.5):  # reflect, expand, contract
            trial = [cen[j] + k * (cen[j] - pts[-1][j]) for j in range(n)]
            val = _fit_loss(cfg, trial)
            if val < vals[-1]:
                pts[-1], vals[-1] = trial, val
                break
        else:
            pts = [pts[0]] + [
                [(a + b) / 2 for a, b in zip(pts[0], p, strict=True)] for p in pts[1:]
            ]
            vals = [vals[0]] + [_fit_loss(cfg, p) for p in pts[1:]]
    best = pts[min(range(n + 1), key=vals.__getitem__)]
    print("loss", min(vals))
    for k, v in zip(FIT_KEYS, best, strict=True):
        print(f"  {k}: {v:.5f}")


if __name__ == "__main__":
    asyncio.run(main())
