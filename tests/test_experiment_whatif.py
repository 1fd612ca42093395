"""The note's question answered with one restart: lower caps read from the sweep at cap 64.

On the embedded cluster (time_scale 5: tok/s are 5x the emulated figures), `experiment
--max-num-seqs 6,64 --what-if-cap 16,32` restarts once (6 -> 64) and predicts 6, 16 and 32 from
that sweep; `--max-num-seqs 6,16,32,64 --measure-all` restarts three times. Both must reach the
same recommendation and the same per-user SLO load. Behaviour only: no speed is asserted here
(predicted-vs-measured errors are in benchmarks/whatif_validation.py and docs/experiments.md).
The SLO (10.5 tok/s) sits between the sim's 12.1 at C=16 and 9.4 at C=32, away from both; the
watchdog probes every 30 s: its completion probe waits behind a burst queued at a low cap, and
three timeouts 5 s apart would restart the engine mid-sweep.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import start_sim

TIME_SCALE = 5.0
COMMON = [
    "--concurrency", "1,6,16,32,64", "--output-tokens", "300", "--repeats", "1",
    "--slo-tok-s", str(10.5 * TIME_SCALE), "--no-restore", "--yes",
]  # fmt: skip


def run_experiment(tmp_path: Path, name: str, *args: str) -> tuple[str, dict[str, Any]]:
    """Start a fresh cluster (cap 6), run one experiment on it; its stdout and JSON report."""
    from spark_ops.sim.control import down

    s = start_sim(tmp_path / name, time_scale=TIME_SCALE, watchdog_interval_s=30.0)
    try:
        env = dict(os.environ, SPARK_OPS_INVENTORY=str(s.inventory))
        history = s.history.read_bytes()
        report = tmp_path / f"{name}.json"
        res = subprocess.run(
            [sys.executable, "-m", "spark_ops.cli.main", "experiment", *args, *COMMON,
             "--state", str(tmp_path / f"{name}-state.json"), "-o", str(report)],
            env=env, capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        (tmp_path / f"{name}.out").write_text(res.stdout)
        assert res.returncode == 0, res.stderr[-3000:]
        assert s.history.read_bytes() == history, "every planned stamp was pruned"
        return res.stdout, json.loads(report.read_text())
    finally:
        down(s.root)


def _slo_of(data: dict[str, Any], name: str) -> int | None:
    """The SLO concurrency the reading gives a configuration."""
    cfg = next(c for c in data["reading"]["configs"] if c["label"] == name)
    return cfg["slo_max_concurrency"]  # type: ignore[no-any-return]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_one_restart_answers_what_three_do(tmp_path: Path) -> None:
    """6 -> 64 and a what-if for 6, 16, 32: the recommendation of the full experiment, 1 boot."""
    few_out, few = run_experiment(
        tmp_path, "few", "--max-num-seqs", "6,64", "--what-if-cap", "16,32"
    )
    full_out, full = run_experiment(
        tmp_path, "full", "--max-num-seqs", "6,16,32,64", "--measure-all"
    )
    # the plan says what it will cost before asking, beside what measuring everything costs
    assert "expected downtime: 1 boot(s)" in few_out
    assert "(measuring every configuration: 3 boots" in few_out
    assert "max_num_seqs=6: predicted from the sweep at max_num_seqs=64 (no restart)" in few_out
    assert "expected downtime: 3 boot(s)" in full_out
    # the same answer
    assert few["reading"]["recommended"] == full["reading"]["recommended"] == "max_num_seqs=64"
    assert _slo_of(few, "max_num_seqs=64") == _slo_of(full, "max_num_seqs=64") == 16
    for name in ("max_num_seqs=6", "max_num_seqs=16", "max_num_seqs=32"):
        assert any(c["label"] == name for c in few["reading"]["configs"]), name
    # the recommendation's words (the knee sentence after it quotes measured growth: not compared)
    rec = [
        next(x for x in d["reading"]["lines"] if x.startswith("Recommendation:")).split(" The ")[0]
        for d in (few, full)
    ]
    assert rec[0] == rec[1], rec
    assert "keep ≤16 concurrent users" in rec[0]
    # the downtime it spent: one boot against three
    assert few["downtime"]["restarts"] == 1 and full["downtime"]["restarts"] == 3
    assert few["downtime"]["predicted"] == ["max_num_seqs=16", "max_num_seqs=32", "max_num_seqs=6"]
    assert full["downtime"]["predicted"] == []
    assert "Downtime spent: 1 boot(s)" in few_out and "Downtime spent: 3 boot(s)" in full_out
    # the what-if table and its assumptions are in the report
    assert "What-if for lower caps, read from this sweep (running cap 64)" in few_out
    assert "The prediction assumes: prefill and decode share the batch" in few_out
    assert list(few["state"]["results"]) == ["max_num_seqs=64"]
