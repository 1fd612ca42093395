"""`bench --request-rate` against the embedded cluster (no --url): the open loop reaches the
inventory's engine through the tunnel and runs each rate under the closed loop's load guard.
Without --max-concurrency its requests in flight are unbounded, so at cap 6 every rate counts as
at or above the cap: the plan says so before any request, each rate runs under a lease of the
`bench-load` run (journalled, ended after: no pause file left), and the table is printed. One
two-node cluster for the module, its reference watchdog probing every 2 s with a 3 s timeout."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from conftest import Sim, start_sim
from test_lease_bench import audit_of, cli

pytestmark = pytest.mark.slow

PAUSE = ".local/state/spark-watchdog/pause"
RATES = ["bench", "--request-rate", "10,20", "--requests", "8", "--output-tokens", "8"]


@pytest.fixture(scope="module")
def probing(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sim]:
    """Two nodes, cap 6, the reference watchdog probing every 2 s with a 3 s timeout."""
    from spark_ops.sim.control import down, wait_serving

    s = start_sim(
        tmp_path_factory.mktemp("lease-bench-rate") / "sim", nodes=2, time_scale=10.0,
        watchdog_interval_s=2.0, watchdog_probe_timeout_s=3.0,
    )  # fmt: skip
    try:
        wait_serving(s.state)
        yield s
    finally:
        down(s.root)


def test_an_open_loop_against_the_cluster_is_leased_per_rate(probing: Sim) -> None:
    """The plan first (unbounded: counted at the cap, C=8 leased), then each rate under its own
    lease, each taken and ended as step records of the bench-load run; no pause file after, the
    budget as before, and the open loop's table on stdout."""
    sim = probing
    history = sim.history.read_bytes()
    res = cli(sim.inventory, *RATES)
    err = res.stderr
    assert res.returncode == 0, err[-3000:]
    said = " ".join(err.split())
    planned = said.index(
        "open loop at 10, 20 req/s without --max-concurrency: its requests in flight are "
        "unbounded, counted as at or above max_num_seqs 6, each rate as C=8"
    )
    assert "C=8: leased (concurrency 8 at max_num_seqs 6:" in said, said[-3000:]
    leased = said.index("note: concurrency 8: watchdog paused until")
    assert planned < leased, "the plan is shown before the load"
    assert said.count("note: concurrency 8: watchdog paused until") == 2, "a lease per rate"
    assert not (sim.head / PAUSE).exists(), "the leases were ended"
    assert sim.history.read_bytes() == history, "the budget is exactly as before"
    assert "offered" in res.stdout and "goodput" in res.stdout, res.stdout[-3000:]
    records = audit_of(sim, "bench-load")
    steps = [s for e in records if e.get("phase") == "step" for s in e["steps"]]
    lease = [(s["step"], s["status"]) for s in steps if s["step"] in ("lease", "release")]
    assert lease == [("lease", "taking"), ("lease", "done"), ("release", "done")] * 2, steps
    assert all(s["level"] == 8 for s in steps if s["step"] in ("lease", "release"))
    intent = next(e for e in records if e.get("phase") == "intent")
    assert intent["detail"]["load"]["levels"][0]["action"] == "lease"
    assert next(e for e in records if e.get("phase") == "end")["outcome"] == "ok"
