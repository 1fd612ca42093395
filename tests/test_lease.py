"""Issue 30, items 1-3 without a cluster: the lease's format and the reference watchdog's reading
of it, its remote programs never writing through a link, the probe arithmetic of a load level and
its refusal, the inventory's watchdog.probe, and no recommendation from a partial reading."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from refwatchdog.daemon import Watchdog
from spark_ops.bench import stats
from spark_ops.errors import InventoryError
from spark_ops.inventory import WatchdogProbe, parse_inventory
from spark_ops.remote.programs.watchdog import LEASE_END, LEASE_TAKE
from spark_ops.remote.shell import sha256
from spark_ops.serve.pages import _budget
from spark_ops.watchdog.config import load_config
from spark_ops.watchdog.lease import (
    lease_body,
    lease_seconds,
    parse_lease,
    pause_in_force,
    pause_shown,
)
from spark_ops.workflows.experiment import read_experiment
from spark_ops.workflows.loadguard import LoadGuard
from spark_ops.workflows.probe_load import (
    ProbeWouldTrip,
    cap_of,
    plan_load,
    plan_open_loop,
    probe_wait,
)

CASES: dict[str, Any] = yaml.safe_load(
    (Path(__file__).parent / "fixtures" / "lease" / "cases.yaml").read_text("utf-8")
)
NOW = 1_800_000_000.0


@pytest.mark.parametrize("case", CASES["pause_files"], ids=lambda c: c["name"])
def test_the_watchdog_reads_a_pause_file(case: dict[str, Any], tmp_path: Path) -> None:
    """No file: not paused; a live lease or any other content: paused; a lapsed lease: not."""
    path = tmp_path / "pause"
    kind = case.get("kind", "file")
    if kind == "file":
        path.write_bytes(case["content"].encode("utf-8", "surrogateescape"))
    elif kind == "directory":
        path.mkdir()
    elif kind == "fifo":
        os.mkfifo(path)
    paused, lease = pause_in_force(str(path), NOW)
    assert paused is case["paused"]
    assert (lease is not None) is case["lease"]


def test_the_daemon_honours_a_live_lease_and_ignores_a_lapsed_one(tmp_path: Path) -> None:
    """Watchdog.paused() and --status: a lease in force pauses, one past its expiry does not."""
    config = tmp_path / "watchdog.yaml"
    action = {"kind": "command", "start": ["true"]}
    config.write_text(yaml.safe_dump({"paths": {"dir": str(tmp_path)}, "action": action}))
    dog = Watchdog(load_config(config))
    pause = Path(dog.paths.pause)
    for expires, paused in ((time.time() + 600, True), (time.time() - 1, False)):
        body = {"spark-ops-lease": 1, "holder": "spark-ops:t", "run": "r1", "expires": expires}
        pause.write_text(json.dumps(body))
        assert dog.paused() is paused
        st = dog.status()
        assert st["paused"] is paused and st["lease"]["run"] == "r1"
        assert st["state"] == ("paused" if paused else "ok")
    pause.write_text("")  # an operator's touch: paused for as long as it is there
    assert dog.paused() is True


def _sh(program: Any, *args: str | int, stdin: str = "") -> subprocess.CompletedProcess[str]:
    """Run a remote program on the local sh."""
    return subprocess.run(
        ["sh", "-c", program.line(*args)], input=stdin, capture_output=True, text=True, timeout=30
    )


def test_a_lease_is_never_written_through_a_link_nor_over_a_pause(tmp_path: Path) -> None:
    """A dangling link, a link to a file, an operator's file: left as they are (exit 46)."""
    body = lease_body(holder="spark-ops:t", run="r1", why="test")
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "target")
    res = _sh(LEASE_TAKE, str(dangling), 60, stdin=body)
    assert res.returncode == 46 and not (tmp_path / "target").exists()
    op = tmp_path / "operator"
    op.write_text("maintenance by alice\n")
    res = _sh(LEASE_TAKE, str(op), 60, stdin=body)
    assert res.returncode == 46 and res.stdout == "maintenance by alice\n"
    made = tmp_path / "pause"
    res = _sh(LEASE_TAKE, str(made), 60, stdin=body)
    assert res.returncode == 0, res.stderr
    lease = parse_lease(res.stdout)
    assert lease is not None and lease.run == "r1" and lease.taken is not None
    assert lease.expires - lease.taken == 60 and made.read_text() == res.stdout
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".spark-ops.lease")]
    # the end compares the content: an operator's file, or ours replaced meanwhile, stays
    assert _sh(LEASE_END, str(op), sha256(res.stdout)).returncode == 45 and op.exists()
    link = tmp_path / "link"
    link.symlink_to(made)
    assert _sh(LEASE_END, str(link), sha256(res.stdout)).returncode == 45 and made.exists()
    assert _sh(LEASE_END, str(made), sha256(res.stdout)).returncode == 0 and not made.exists()


def test_a_lease_is_bounded() -> None:
    """Never under a minute (it would lapse in its own step), never over six hours."""
    assert lease_seconds(1) == 60 and lease_seconds(10**9) == 6 * 3600 and lease_seconds(90.2) == 91


def _level(c: int, duration: float) -> stats.LevelResult:
    """A measured level (only what the arithmetic reads)."""
    names = [f.name for f in stats.LevelResult.__dataclass_fields__.values()]
    kw: dict[str, Any] = dict.fromkeys(names)
    agg = 300 * c / duration
    kw.update(
        max_concurrency=c, repeats=1, duration=duration, completed=c, failed=0,
        total_output_tokens=300 * c, output_throughput=agg, output_throughput_min=agg,
        output_throughput_max=agg, output_throughput_stdev=0.0, request_throughput=1.0,
        per_user_tok_s=300 / duration, usage_reported=True, client_cpu_s=0.0, errors={},
        samples=[], runs=[],
    )  # fmt: skip
    return stats.LevelResult(**kw)


@pytest.mark.parametrize("case", CASES["probe_waits"], ids=lambda c: c["name"])
def test_the_probe_wait_of_a_level(case: dict[str, Any]) -> None:
    """Requests queued ahead at the cap x their time, against the probe's timeout."""
    probe = (
        WatchdogProbe(interval_s=2.0, timeout_s=case["timeout_s"], failures=3)
        if case["timeout_s"] is not None
        else None  # the inventory has no watchdog.probe
    )
    levels = [_level(c, d) for c, d in case.get("measured", [])]
    wait = probe_wait(case["concurrency"], case["cap"], levels, case.get("engine_s"), probe)
    assert wait.trips is case["trips"], wait.arithmetic()
    assert case["says"] in wait.arithmetic()


async def test_a_level_that_trips_the_probe_is_refused_without_a_lease() -> None:
    """No way to pause the watchdog: refused with the arithmetic; --unleased-load runs it."""
    probe = WatchdogProbe(interval_s=2.0, timeout_s=10.0, failures=3)
    notes: list[str] = []
    guard = LoadGuard(None, probe, 6, 1, on_note=notes.append)
    ran = []
    with pytest.raises(ProbeWouldTrip) as err:
        async with guard.level(64, [_level(6, 1.5)]):
            ran.append(64)
    assert not ran and "= 15 s >= the watchdog's probe timeout 10 s" in err.value.message
    assert "--unleased-load" in (err.value.hint or "")
    async with guard.level(16, [_level(6, 1.5)]):  # 2 rounds x 1.5 s: a slot in time
        ran.append(16)
    guard.unleased = True
    async with guard.level(64, [_level(6, 1.5)]):
        ran.append(64)
    assert ran == [16, 64] and len(notes) == 1 and "unleased (--unleased-load)" in notes[0]
    await asyncio.sleep(0)


async def test_a_probe_the_inventory_does_not_describe_is_not_run_past_silently() -> None:
    """Issue 30 #2: no watchdog.probe, so whether a level starves the probe cannot be computed.
    Below the cap a slot stays free: it runs. At or above it the level counts as starving the
    probe: refused without a pause file, naming the key to set; --unleased-load runs it, said."""
    notes: list[str] = []
    guard = LoadGuard(None, None, 6, 1, on_note=notes.append)
    ran = []
    async with guard.level(5, []):
        ran.append(5)
    with pytest.raises(ProbeWouldTrip) as err:
        async with guard.level(64, [_level(5, 0.2)]):
            ran.append(64)
    assert ran == [5], "nothing of level 64 was sent"
    assert "against a probe timeout that is not known: counted as starving it" in err.value.message
    assert "set watchdog.probe: {interval_s, timeout_s, failures}" in (err.value.hint or "")
    guard.unleased = True
    async with guard.level(64, [_level(5, 0.2)]):
        ran.append(64)
    assert ran == [5, 64] and len(notes) == 1 and "unleased (--unleased-load)" in notes[0]


@pytest.mark.parametrize("case", CASES["load_plans"], ids=lambda c: c["name"])
def test_the_load_plan_says_each_level_before_any_request(case: dict[str, Any]) -> None:
    """bench's and experiment's plan: per level run as is, leased or refused (certain, or by
    what the sweep measures), the arithmetic shown; each shared risk said once; a level refused
    whatever the sweep measures is refused up front, with the ways on."""
    probe = WatchdogProbe(**case["probe"]) if case["probe"] else None
    plan = plan_load(
        case["levels"], case["cap"], probe, case["pause_file"],
        unleased=case.get("unleased", False), measured=case.get("measured", False),
    )  # fmt: skip
    assert [[lv.concurrency, lv.action, lv.certain] for lv in plan.levels] == case["plan"]
    lines = plan.lines()
    text = "\n".join(lines)
    for words in case.get("says", []):
        assert words in text, text
    for words in case.get("once", []):
        assert text.count(words) == 1, (words, text)
    assert [lv.concurrency for lv in plan.refused()] == case["refused"]
    refusal = plan.refusal()
    assert (refusal is not None) is bool(case["refused"])
    if refusal is not None:
        assert refusal.exit_status == 9 and "refused before any request was sent" in refusal.message
        for words in case.get("hint", []):
            assert words in (refusal.hint or ""), refusal.hint
    assert json.loads(json.dumps(plan.to_dict()))["lines"] == lines


@pytest.mark.parametrize("case", CASES["open_loop_plans"], ids=lambda c: c["name"])
def test_an_open_loops_plan_counts_each_rate_as_a_level(case: dict[str, Any]) -> None:
    """`bench --request-rate` against the cluster: each rate a level at --max-concurrency, or at
    or above the cap without it (unbounded); said first, then planned and refused as bench's
    closed loop plans and refuses a level."""
    plan = plan_open_loop(
        case["rates"], case["max_concurrency"], case["requests"], case["cap"],
        WatchdogProbe(2.0, 3.0, 3), case["pause_file"],
    )  # fmt: skip
    assert [[lv.concurrency, lv.action, lv.certain] for lv in plan.levels] == case["plan"]
    text = "\n".join(plan.lines())
    for words in case["says"]:
        assert words in text, text
    assert [lv.concurrency for lv in plan.refused()] == case["refused"]
    refusal = plan.refusal()
    assert (refusal is not None) is bool(case["refused"])
    if refusal is not None:
        assert refusal.exit_status == 9 and "refused before any request was sent" in refusal.message


def test_the_journal_records_a_bounded_plan() -> None:
    """--concurrency with a thousand levels: the load run's intent names the levels that meet the
    probe, at most 64 of them, and counts the rest (an audit line stays small)."""
    plan = plan_load(range(1, 1001), 6, WatchdogProbe(2.0, 3.0, 3), "~/pause")
    rec = json.loads(json.dumps(plan.record()))
    assert len(rec["levels"]) == 64 and rec["more"] == 995 - 64
    assert rec["levels"][0] == {
        "concurrency": 6, "action": "lease", "certain": False, "threshold_s": 3.0,
    }  # fmt: skip
    assert len(json.dumps(rec)) < 8000


@pytest.mark.parametrize(
    ("knob", "cap"), [(6, 6), ("64", 64), (0, None), ("0", None), (True, None), ("6k", None)]
)
def test_the_cap_a_sweep_reckons_with(knob: object, cap: int | None) -> None:
    """max_num_seqs as the recipe holds it; 0 (no cap vLLM runs with), a flag or text: not
    known, and the plan says so rather than dividing by it."""
    assert cap_of({"max_num_seqs": knob}) == cap
    plan = plan_load([64], cap, WatchdogProbe(2.0, 3.0, 3), None)
    assert plan.levels[0].action == ("run" if cap is None else "refuse")


@pytest.mark.parametrize("case", CASES["inventory"], ids=lambda c: c["name"])
def test_the_inventory_describes_the_probe(case: dict[str, Any]) -> None:
    """watchdog.probe: {interval_s, timeout_s, failures}, all three, each checked."""
    wd: dict[str, Any] = {"restart_command": "true", "history_file": "~/h"}
    if case["probe"] is not None:
        wd["probe"] = case["probe"]
    nodes = {"n1": {"host": "h1", "role": "head"}}
    cluster = {"nodes": nodes, "recipe": {"path": "~/r.yaml"}, "watchdog": wd}
    text = yaml.safe_dump({"clusters": {"c": cluster}})
    if "error" in case:
        with pytest.raises(InventoryError) as err:
            parse_inventory(text, "inv.yaml")
        assert case["error"] in err.value.message
        return
    probe = parse_inventory(text, "inv.yaml").clusters["c"].watchdog.probe
    assert (probe.__dict__ if probe else None) == case["parsed"]


def test_no_recommendation_from_a_partial_reading() -> None:
    """A configuration not measured (or a level lost): the reading says so, recommends nothing."""
    from spark_ops.bench.sweep import SweepResult

    r = SweepResult(
        base_url="http://x", model="m", api="chat", mode="burst", output_tokens=300,
        levels=[_level(1, 1.0), _level(6, 1.5)], reading=stats.read_levels([]), config={},
        knobs={"max_num_seqs": 6}, started_at="", finished_at="",
    )  # fmt: skip
    whole = read_experiment([("max_num_seqs=6", r)])
    partial = read_experiment([("max_num_seqs=6", r)], partial="not measured: max_num_seqs=64")
    assert whole.recommended == "max_num_seqs=6"
    assert partial.recommended is None
    assert "No recommendation: the reading is partial (not measured: max_num_seqs=64)." in (
        partial.lines
    )
    assert not any(line.startswith("Recommendation") for line in partial.lines)


@pytest.mark.parametrize("case", CASES["shown"], ids=lambda c: c["name"])
def test_the_views_show_a_lapsed_lease_as_lapsed(case: dict[str, Any]) -> None:
    """One function words the pause for status, budget and serve; a lapsed lease is not one."""
    shown = pause_shown(case["budget"])
    assert (shown[0] if shown else None) == case["shown"]
    words = shown[1] if shown else ""
    for needle in case.get("has", []):
        assert needle in words, words
    for needle in case.get("not", []):
        assert needle not in words, words
    pause = {"state": shown[0], "text": shown[1]} if shown else None
    b = {"used": 0, "allowed": 2, "window_s": 3600, "remaining": 2, **case["budget"]}
    page = _budget({**b, "pause": pause})
    assert ("PAUSED" in page) is (case["shown"] == "paused") and "<b>" not in page
    assert ("LAPSED" in page) is (case["shown"] == "lapsed")
