"""`spark-ops experiment`: the reading on synthetic sweeps (cases in tests/fixtures/experiment/),
the plan and state file, and the whole run on the embedded cluster (real SSH, simulated vLLM).

The embedded cluster runs with time_scale 10 (decode 10x faster), so tok/s figures are 10x the
note's: the SLO is passed multiplied by 10 and the assertions compare ratios.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import start_sim

from spark_ops.bench import stats
from spark_ops.bench.sweep import SweepResult
from spark_ops.bench.whatif import predicted_sweep
from spark_ops.cli.experiment_report import render_report
from spark_ops.errors import ExitStatus, RecipeError
from spark_ops.workflows.experiment import (
    ExperimentError,
    ExperimentSpec,
    ExperimentState,
    label,
    plan_experiment,
    read_experiment,
    start_state,
)

CASES: dict[str, Any] = yaml.safe_load(
    (Path(__file__).parent / "fixtures" / "experiment" / "reading_cases.yaml").read_text("utf-8")
)
TIME_SCALE = 10.0


def level(c: int, agg: float, user: float, samples: list[list[float]]) -> stats.LevelResult:
    """A level summary with the figures the reading uses; the rest empty."""
    names = [f.name for f in stats.LevelResult.__dataclass_fields__.values()]
    kw: dict[str, Any] = dict.fromkeys(names)
    kw.update(
        max_concurrency=c, repeats=1, duration=1.0, completed=c, failed=0,
        total_output_tokens=300 * c, output_throughput=agg, output_throughput_min=agg,
        output_throughput_max=agg, output_throughput_stdev=0.0, request_throughput=1.0,
        per_user_tok_s=user, usage_reported=True, client_cpu_s=0.0, errors={},
        samples=[[0.0, r, w] for r, w in samples], runs=[],
    )  # fmt: skip
    return stats.LevelResult(**kw)


def sweep(cfg: dict[str, Any], slo: float) -> SweepResult:
    """A synthetic sweep; its reading comes from the bench's own read_levels."""
    samples = cfg.get("samples", [])
    levels = [level(c, a, u, samples if i == len(cfg["levels"]) - 1 else []) for i, (c, a, u) in
              enumerate(cfg["levels"])]  # fmt: skip
    reading = stats.read_levels(levels, slo_tok_s=slo, max_num_seqs=cfg["max_num_seqs"])
    return SweepResult(
        base_url="http://x", model="m", api="chat", mode="burst", output_tokens=300,
        levels=levels, reading=reading, knobs={"max_num_seqs": cfg["max_num_seqs"]},
        metrics_available=True,
    )  # fmt: skip


@pytest.mark.parametrize("name", list(CASES))
def test_reading_cases(name: str) -> None:
    """Best per level, bottleneck, recommendation and the sentences an operator reads."""
    case = CASES[name]
    results: list[tuple[str, SweepResult]] = []
    for c in case["configs"]:  # a config with `predict_from` is read from that measured sweep
        base = dict(results).get(c.get("predict_from", ""))
        made = sweep(c, case["slo_tok_s"]) if base is None else predicted_sweep(
            base, c["max_num_seqs"], c["predict_from"])  # fmt: skip
        results.append((c["label"], made))
    reading = read_experiment(
        results, slo_tok_s=case["slo_tok_s"], confirm=case.get("confirm", False)
    )
    exp = case["expect"]
    best = {row["concurrency"]: row["best"] if row["clear"] else None for row in reading.levels}
    assert best == exp["best"]
    if exp["bottleneck"] is None:
        assert reading.bottleneck is None
    else:
        assert reading.bottleneck is not None
        assert reading.bottleneck["is_bottleneck"] is exp["bottleneck"]
    if "bottleneck_ratio" in exp:
        lo, hi = exp["bottleneck_ratio"]
        assert reading.bottleneck is not None
        assert lo <= reading.bottleneck["ratio"] <= hi
    assert reading.recommended == exp["recommended"]
    text = "\n".join(reading.lines)
    for line in exp.get("lines", []):
        assert line in text, f"{line!r} not in:\n{text}"
    for line in exp.get("not_lines", []):
        assert line not in text
    json.dumps(reading.to_dict())  # the reading is JSON-ready data


def test_plan_state_and_refusals(tmp_path: Path) -> None:
    """Cartesian product, restarts counted from the recipe, atomic state, refusals named."""
    axes = {"max_num_seqs": [6, 64], "moe_backend": ["marlin", "cutlass"]}
    fewest = ExperimentSpec("sim", axes, {"levels": [1, 6]}, what_if_caps=[16])
    assert fewest.predicted() == {
        "max_num_seqs=6, moe_backend=marlin": {"max_num_seqs": 64, "moe_backend": "marlin"},
        "max_num_seqs=16, moe_backend=marlin": {"max_num_seqs": 64, "moe_backend": "marlin"},
        "max_num_seqs=6, moe_backend=cutlass": {"max_num_seqs": 64, "moe_backend": "cutlass"},
        "max_num_seqs=16, moe_backend=cutlass": {"max_num_seqs": 64, "moe_backend": "cutlass"},
    }
    assert [label(c) for c in fewest.measured()] == [
        "max_num_seqs=64, moe_backend=marlin", "max_num_seqs=64, moe_backend=cutlass"
    ]  # fmt: skip
    spec = ExperimentSpec("sim", axes, {"levels": [1]}, measure_all=True)
    assert [label(c) for c in spec.configurations()] == [
        "max_num_seqs=6, moe_backend=marlin", "max_num_seqs=6, moe_backend=cutlass",
        "max_num_seqs=64, moe_backend=marlin", "max_num_seqs=64, moe_backend=cutlass",
    ]  # fmt: skip
    knobs = {
        "max_num_seqs": 6,
        "moe_backend": "marlin",
        "kv_cache_memory_bytes": 1,
        "enforce_eager": True,
    }
    path = tmp_path / "exp.json"
    state, resumed = start_state(spec, knobs, path, resume=False)
    plan = plan_experiment(state, knobs, path, resumed)
    # the first configuration is what runs: 3 restarts, then one to restore 6/marlin
    assert [r["restart"] for r in plan.configurations] == [False, True, True, True]
    assert plan.restarts == 4 and plan.restarts_if_all_measured == 4 and not plan.predicted
    few = plan_experiment(ExperimentState(fewest, dict(knobs)), knobs, path, False)
    assert [r["restart"] for r in few.configurations] == [True, True]
    # measuring all six (6, 16 and 64 with each backend) and the restore: 6 restarts
    assert few.restarts == 3 and few.restarts_if_all_measured == 6
    assert len(few.predicted) == 4
    state.results["max_num_seqs=6, moe_backend=marlin"] = {"sweep": {}}
    state.save(path)
    assert not list(tmp_path.glob(".*tmp")), "the temp file was renamed over the state"
    with pytest.raises(ExperimentError, match=r"unfinished experiment \(running, 1/4") as exc:
        start_state(spec, knobs, path, resume=False)
    assert exc.value.hint is not None and "--resume" in exc.value.hint
    again, resumed = start_state(ExperimentSpec("sim", {}, {}), knobs, path, resume=True)
    assert resumed and list(again.results) == ["max_num_seqs=6, moe_backend=marlin"]
    assert plan_experiment(again, knobs, path, True).configurations[0]["done"] is True
    bad = ExperimentSpec("sim", {"max_num_seqs": [6, 6]}, {})
    with pytest.raises(ExperimentError, match="--max-num-seqs 6,6: a value is repeated"):
        start_state(bad, knobs, tmp_path / "other.json", resume=False)
    with pytest.raises(
        RecipeError, match="does not set max_num_seqs: its starting value cannot be restored"
    ):
        start_state(
            ExperimentSpec("sim", {"max_num_seqs": [8]}, {}), {}, tmp_path / "n.json", resume=False
        )
    (tmp_path / "junk.json").write_text("{}")
    with pytest.raises(ExperimentError, match=r"junk\.json: not a spark-ops experiment state"):
        ExperimentState.load(tmp_path / "junk.json")


class FakeWatchdog:
    """The budget and prune of a watchdog whose history holds given (stamp, reason) pairs."""

    def __init__(self, stamps: list[tuple[float, str]]) -> None:
        """Start with these stamps."""
        self.stamps = list(stamps)
        self.pruned: list[float] = []

    async def budget(self) -> Any:
        """Used and the stamps with their journal reasons."""
        views = [{"stamp": s, "reason": r} for s, r in self.stamps]
        return type("View", (), {"used": len(self.stamps), "stamps": views})()

    async def prune(self, *, stamps: list[float], reason: str) -> dict[str, Any]:
        """Remove the stamps given."""
        self.pruned += stamps
        self.stamps = [(s, r) for s, r in self.stamps if s not in stamps]
        return {"removed_stamps": stamps}


async def test_failure_ends_in_restore_and_leftovers_are_pruned(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A boot failing at 64: state 'failed', 6 kept, start restored, a killed run's stamp pruned."""
    import spark_ops.workflows.experiment.run as experiment
    from spark_ops.errors import BootError

    applied: list[dict[str, Any]] = []

    async def run_config(op: Any, state: Any, config: dict[str, Any], *rest: Any) -> Any:
        """6 measures; 64 fails to boot."""
        if config["max_num_seqs"] == 64:
            raise BootError("engine exited during KV_CACHE", phase="KV_CACHE")
        cfg = CASES["note_cap_6_vs_64"]["configs"][0]
        return {"sweep": sweep(cfg, 12).to_dict(), "budget_as_before": True}

    async def apply(op: Any, changes: list[Any], *rest: Any) -> dict[str, Any]:
        """Record the restore's changes."""
        applied.append({c.name: c.value for c in changes})
        return {"restarted": True, "pruned": [300.0]}

    monkeypatch.setattr(experiment, "_run_config", run_config)
    monkeypatch.setattr(experiment, "_apply", apply)
    killed = "planned restart (spark-ops experiment: max_num_seqs=64)"
    op = type(
        "Op", (), {"watchdog": FakeWatchdog([(100.0, "watchdog: engine down"), (200.0, killed)])}
    )()
    spec = ExperimentSpec("sim", {"max_num_seqs": [6, 64]}, {"slo_tok_s": 12}, measure_all=True)
    state = ExperimentState(spec, {"max_num_seqs": 6}, in_progress="max_num_seqs=64")
    path = tmp_path / "exp.json"
    notes: list[str] = []
    outcome = await experiment.run_experiment(
        op, state, path, hooks=experiment.Hooks(on_note=notes.append)
    )
    assert isinstance(outcome.failure, BootError) and not outcome.ok
    saved = json.loads(path.read_text())
    assert saved["status"] == "failed" and list(saved["results"]) == ["max_num_seqs=6"]
    assert saved["error"]["message"] == "engine exited during KV_CACHE"
    assert saved["restore"]["ok"] is True and applied == [{"max_num_seqs": 6}]
    assert saved["in_progress"] is None
    assert op.watchdog.pruned == [200.0], "only the killed run's stamp of ours is pruned"
    assert any("killed while applying max_num_seqs=64" in n for n in notes)
    assert outcome.budget_before == {"used": 1, "stamps": [100.0]} == outcome.budget_after


async def test_a_restore_that_fails_says_what_runs_now_and_what_to_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 30 #3: 64 fails to boot, and so does the restore to 6. The ending names the recipe's
    values and the engine's now (its log's last start, it does not answer) and gives the exact
    apply to run; the restore's failure, said by its ✗ step line, is not said again."""
    import spark_ops.workflows.experiment.run as experiment
    from spark_ops.cli.common import SAID
    from spark_ops.errors import BootError, RemoteError

    said = "engine boot failed during KV_CACHE: CUDA out of memory"

    async def run_config(op: Any, state: Any, config: dict[str, Any], *rest: Any) -> Any:
        """6 measures; 64 fails to boot (the recipe and the engine are left on 64)."""
        if config["max_num_seqs"] == 64:
            raise BootError("engine exited during KV_CACHE", phase="KV_CACHE")
        cfg = CASES["note_cap_6_vs_64"]["configs"][0]
        budget = {"used_before": 1, "used_after": 1, "new_stamps": []}
        return {
            "sweep": sweep(cfg, 12).to_dict(), "budget_as_before": True, "budget": budget,
            "knobs": config, "label": label(config),
        }  # fmt: skip

    async def apply(op: Any, changes: list[Any], *rest: Any) -> dict[str, Any]:
        """The restore's boot fails too (its ✗ line says so)."""
        SAID[said] = "boot"
        raise BootError(said, phase="KV_CACHE")

    async def knobs(op: Any) -> dict[str, Any]:
        """The recipe holds what the failed configuration wrote."""
        return {"max_num_seqs": 64, "kv_cache_memory": None}

    async def args(session: Any) -> dict[str, Any]:
        """The engine's log: last started with 64."""
        return {"max_num_seqs": 64, "port": 8000}

    class Op:
        """The parts of an Operation the restore's report reads (the tunnel fails: no answer)."""

        watchdog = FakeWatchdog([(100.0, "watchdog: engine down")])
        session = None

        async def api_url(self) -> str:
            """No tunnel to the engine."""
            raise RemoteError("node1", "connection refused")

    monkeypatch.setattr(experiment, "_run_config", run_config)
    monkeypatch.setattr(experiment, "_apply", apply)
    monkeypatch.setattr(experiment, "current_knobs", knobs)
    monkeypatch.setattr(experiment, "effective_args", args)
    spec = ExperimentSpec("sim", {"max_num_seqs": [6, 64]}, {"slo_tok_s": 12}, measure_all=True)
    state = ExperimentState(spec, {"max_num_seqs": 6})
    outcome = await experiment.run_experiment(Op(), state, tmp_path / "exp.json")  # type: ignore[arg-type]
    restore = outcome.state.restore
    assert restore is not None and restore["ok"] is False
    assert restore["recipe_now"] == {"max_num_seqs": 64}
    assert restore["engine_now"] == {"up": False, "knobs": {"max_num_seqs": 64}}
    assert restore["command"] == "spark-ops apply --max-num-seqs 6"
    text = " ".join(render_report(outcome).split())
    SAID.pop(said, None)
    assert (
        "RESTORE FAILED (the ✗ boot line above): the starting configuration max_num_seqs=6 is not "
        "back. The recipe holds max_num_seqs=64; the engine does not answer (last started with "
        "max_num_seqs=64). Put the start back with `spark-ops apply --max-num-seqs 6`." in text
    ), text
    assert said not in text, "the ✗ boot line said it: not again"
    assert text.count("spark-ops apply --max-num-seqs 6") == 1
    shown = json.loads(json.dumps(outcome.to_dict()))["state"]["restore"]
    assert shown["engine_now"]["up"] is False and shown["command"] == restore["command"]


CLI_CASES: dict[str, Any] = yaml.safe_load(
    (Path(__file__).parent / "fixtures" / "experiment" / "cli_cases.yaml").read_text("utf-8")
)


@pytest.mark.parametrize("name", list(CLI_CASES))
def test_bad_values_are_refused_before_connecting(name: str, tmp_path: Path) -> None:
    """No inventory needed: a bad value stops the command with the option and value named."""
    case = CLI_CASES[name]
    env = dict(os.environ, SPARK_OPS_INVENTORY=str(tmp_path / "missing.yaml"))
    res = cli(env, "experiment", *case["args"], "--yes")
    assert res.returncode == case["status"], res.stderr
    assert case["stderr"] in res.stderr


DISCARD: list[dict[str, Any]] = yaml.safe_load(
    (Path(__file__).parent / "fixtures" / "experiment" / "discard_cases.yaml").read_text("utf-8")
)
ONE_NODE = (
    "clusters:\n  t:\n    nodes:\n      node1: {host: 127.0.0.1, role: head}\n"
    "    recipe: {path: ~/r.yaml}\n    watchdog: {restart_command: x, history_file: ~/h}\n"
)


def _state(path: Path, cluster: str, status: str) -> None:
    """An experiment state of `cluster` comparing 6 and 64, one configuration measured."""
    state = ExperimentState(ExperimentSpec(cluster, {"max_num_seqs": [6, 64]}, {}), {})
    state.results["max_num_seqs=6"] = {"sweep": {}}
    state.status = status
    state.save(path)


@pytest.mark.parametrize("case", DISCARD, ids=[c["name"] for c in DISCARD])
def test_discard_removes_only_its_own_state(case: dict[str, Any], tmp_path: Path) -> None:
    """`experiment --discard` removes this cluster's state file and says what it removed; a
    link, a FIFO, another file or another cluster's state is kept, with the reason."""
    inventory = tmp_path / "inv.yaml"
    inventory.write_text(ONE_NODE)
    path = tmp_path / "exp.json"
    file = case["file"]
    if isinstance(file, dict) and "state" in file:
        _state(path, file["state"]["cluster"], file["state"]["status"])
    elif isinstance(file, dict) and "json" in file:
        path.write_text(file["json"])
    elif isinstance(file, dict) and "link" in file:
        _state(tmp_path / "elsewhere.json", file["link"]["cluster"], file["link"]["status"])
        path.symlink_to(tmp_path / "elsewhere.json")
    elif file == "fifo":
        os.mkfifo(path)
    env = dict(os.environ, SPARK_OPS_INVENTORY=str(inventory))
    env.pop("SPARK_OPS_CLUSTER", None)
    env.pop("SPARK_OPS_FLEET", None)
    res = cli(env, "experiment", "--discard", "--state", str(path), "--yes")
    assert res.returncode == case["status"], res.stdout + res.stderr
    for words in case.get("stdout", []):
        assert words in res.stdout, res.stdout
    for words in case.get("stderr", []):
        assert words in " ".join(res.stderr.split()), res.stderr
    assert (not os.path.lexists(path)) == case["removed"]
    if isinstance(file, dict) and "link" in file:
        assert (tmp_path / "elsewhere.json").exists(), "the link's target is never touched"


def test_an_unfinished_experiment_names_discard(tmp_path: Path) -> None:
    """The refusal of a new experiment over an unfinished one names the way out, --discard;
    after it the new experiment starts."""
    path = tmp_path / "exp.json"
    _state(path, "t", "interrupted")
    spec = ExperimentSpec("t", {"max_num_seqs": [8, 16]}, {})
    with pytest.raises(ExperimentError, match="unfinished experiment") as exc:
        start_state(spec, {"max_num_seqs": 6}, path, resume=False)
    assert exc.value.hint is not None and "--discard" in exc.value.hint
    from spark_ops.workflows.experiment import discard_state, recorded_state

    found = recorded_state(path, "t")
    assert found is not None
    discard_state(found)
    state, resumed = start_state(spec, {"max_num_seqs": 6}, path, resume=False)
    assert not resumed and state.spec.axes == {"max_num_seqs": [8, 16]}


def test_plan_eta_from_this_clusters_boot_history(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The experiment's plan takes its boot ETA from this cluster's boot history (the key apply
    records under, readiness.history_key; 83b2a9d), never from another cluster's or from a
    failed boot; with no boot of this cluster known it names no figure."""
    from spark_ops.cli.experiment_report import Progress, echo_plan
    from spark_ops.readiness import BootHistory

    monkeypatch.setenv("HOME", str(tmp_path))
    sweep = {"levels": [1, 6], "mode": "closed", "output_tokens": 60, "repeats": 1, "slo_tok_s": 9}
    spec = ExperimentSpec("sim", {"max_num_seqs": [6, 64]}, sweep)
    state, _ = start_state(spec, {"max_num_seqs": 6}, tmp_path / "exp.json", resume=False)
    plan = plan_experiment(state, {"max_num_seqs": 6}, tmp_path / "exp.json", False)
    key = "ops@127.0.0.1:2222:~/recipe.yaml"
    history = BootHistory()
    history.record("sim", {"total_s": 500.0, "durations": {"STARTING": 500.0}})  # by name: not it
    history.record(key, {"total_s": 42.0, "durations": {"STARTING": 40.0, "API_UP": 2.0}})
    history.record_failed(key, at=1.0, total_s=900.0, phase="KV_CACHE", error="failed")
    echo_plan(plan, 0, key)
    out = capsys.readouterr().out
    assert "each a full boot, ~42 s by the boots watched from here" in out, out
    assert "x ~42 s" in out and "500" not in out and "900" not in out, out
    assert Progress("sim", 3, False, key).history == key  # the boot view's ETA, the same key
    echo_plan(plan, 0, "ops@10.0.0.9:22:~/other.yaml")
    out = capsys.readouterr().out
    assert "by the boots watched from here" not in out, out


# The watchdog probes with a real completion, which waits behind a burst queued at cap 6 (64 x 300
# tokens: 16 s here); at its default 5 s interval three timeouts restart the engine mid-sweep. The
# slow tests below probe every 30 s (docs/experiments.md, "Limits").
ARGS = [
    "experiment", "--max-num-seqs", "6,64", "--concurrency", "1,6,16,64", "--output-tokens", "300",
    "--slo-tok-s", str(9 * TIME_SCALE), "--measure-all", "--yes",
]  # fmt: skip


def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """Run the real CLI in a subprocess."""
    return subprocess.run(
        [sys.executable, "-m", "spark_ops.cli.main", *args],
        env=env, capture_output=True, text=True, timeout=240,
    )  # fmt: skip


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_experiment_6_vs_64_tells_the_notes_story(tmp_path: Path) -> None:
    """The cap-6 run plateaus, 64 gives ~3x at the top level, budget and recipe as before."""
    from spark_ops.sim.control import down

    s = start_sim(tmp_path / "sim", time_scale=TIME_SCALE, watchdog_interval_s=30.0)
    try:
        env = dict(os.environ, SPARK_OPS_INVENTORY=str(s.inventory))
        history, recipe = s.history.read_bytes(), s.recipe.read_bytes()
        state, report = tmp_path / "exp.json", tmp_path / "report.json"
        res = cli(env, *ARGS, "--state", str(state), "-o", str(report))
        assert res.returncode == 0, res.stderr[-3000:]
        out = res.stdout
        assert "restarts: 2 planned" in out
        assert "The cap of 6 was the bottleneck" in out
        assert "max_num_seqs=6: the cap was reached — running requests stayed at 6" in out
        assert "keep ≤16 concurrent users" in out
        assert "Starting configuration restored: max_num_seqs=6" in out
        data = json.loads(report.read_text())
        neck = data["reading"]["bottleneck"]
        # the ratio itself (about 3x here when the machine is quiet) is a speed, measured in
        # benchmarks/sim_calibration.py; the test asserts the verdict it leads to
        assert neck["level"] == 64 and neck["is_bottleneck"], neck
        caps = {c["label"]: c["cap"] for c in data["reading"]["configs"]}
        assert caps["max_num_seqs=6"]["plateau"] == 6 and not caps["max_num_seqs=64"]["detected"]
        assert data["state"]["finished"] is True and data["state"]["restore"]["ok"] is True
        assert all(r["budget_as_before"] for r in data["state"]["results"].values())
        assert s.history.read_bytes() == history, "every planned stamp was pruned"
        assert s.recipe.read_bytes() == recipe, "the recipe is back as it was"
    finally:
        down(s.root)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_interrupted_experiment_restores_and_resumes(tmp_path: Path) -> None:
    """Ctrl-C at the second configuration's restart: restored, its stamp pruned; --resume
    measures only the second configuration."""
    from spark_ops.sim.control import down

    s = start_sim(tmp_path / "sim", time_scale=TIME_SCALE, watchdog_interval_s=30.0)
    try:
        env = dict(os.environ, SPARK_OPS_INVENTORY=str(s.inventory))
        history = s.history.read_bytes()
        state = tmp_path / "exp.json"
        proc = subprocess.Popen(
            [sys.executable, "-m", "spark_ops.cli.main", *ARGS, "--state", str(state)],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:  # the run holds the lock
            if state.exists() and json.loads(state.read_text()).get("status") == "running":
                break
            time.sleep(0.05)
        # red team: `status` during the whole experiment says an experiment is under way (who,
        # since when, which step) with its own exit code, not "restarting" (exit 15)
        seen = cli(env, "status", "--json")
        assert seen.returncode == ExitStatus.EXPERIMENTING, seen.stderr[-2000:]
        said = json.loads(seen.stdout)["verdict"]
        assert said["state"] == "experimenting", said
        assert "an experiment is under way: " in said["reasons"][0], said
        assert " UTC (" in said["reasons"][0] and "; step: " in said["reasons"][0], said
        while time.monotonic() < deadline and proc.poll() is None:
            if state.exists() and json.loads(state.read_text()).get("results"):
                break
            time.sleep(0.05)
        while time.monotonic() < deadline and proc.poll() is None:  # until the restart's stamp
            if s.history.read_bytes() != history:
                break
            time.sleep(0.02)
        proc.send_signal(signal.SIGINT)  # before that restart's own prune, as often as not
        out, err = proc.communicate(timeout=180)
        assert proc.returncode == ExitStatus.ABORTED, err[-3000:]
        saved = json.loads(state.read_text())
        assert saved["status"] == "interrupted" and list(saved["results"]) == ["max_num_seqs=6"]
        assert saved["restore"]["ok"] is True
        assert "Experiment interrupted after 1/2 configurations; --resume continues it." in out
        assert "Partial reading: 1 of 2 configurations measured." in out
        assert "max_num_seqs: 6 " in s.recipe.read_text()
        first = saved["results"]["max_num_seqs=6"]["finished_at"]

        res = cli(env, "experiment", "--resume", "--state", str(state), "--yes")
        assert res.returncode == 0, res.stderr[-3000:]
        assert "1. max_num_seqs=6: measured earlier: skipped" in res.stdout
        done = json.loads(state.read_text())
        assert done["finished"] is True and list(done["results"]) == [
            "max_num_seqs=6",
            "max_num_seqs=64",
        ]
        assert done["results"]["max_num_seqs=6"]["finished_at"] == first, "not redone"
        assert "The cap of 6 was the bottleneck" in res.stdout
        assert s.history.read_bytes() == history
        assert "max_num_seqs: 6 " in s.recipe.read_text()
    finally:
        down(s.root)


async def test_confirm_measures_a_predicted_winner(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--confirm: 32 is predicted to beat the measured 64 at the top level, so it is measured."""
    import spark_ops.workflows.experiment.run as experiment

    swept: list[int] = []
    curves = {
        64: [(1, 69.0, 69.0), (32, 240.0, 9.0), (64, 96.0, 3.0)],  # collapses at 64 (preemption?)
        32: [(1, 69.0, 69.0), (32, 240.0, 9.0), (64, 245.0, 4.5)],
    }

    async def run_config(op: Any, state: Any, config: dict[str, Any], *rest: Any) -> Any:
        """Record the cap swept; return its synthetic sweep."""
        cap = int(config["max_num_seqs"])
        swept.append(cap)
        data = sweep({"levels": curves[cap], "max_num_seqs": cap}, 12).to_dict()
        budget = {"used_before": 0, "used_after": 0, "new_stamps": []}
        return {"sweep": data, "budget": budget, "budget_as_before": True, "knobs": config}

    monkeypatch.setattr(experiment, "_run_config", run_config)
    op = type("Op", (), {"watchdog": FakeWatchdog([])})()
    spec = ExperimentSpec(
        "sim", {"max_num_seqs": [32, 64]}, {"slo_tok_s": 12}, restore=False, confirm=True
    )
    state = ExperimentState(spec, {"max_num_seqs": 64})
    notes: list[str] = []
    outcome = await experiment.run_experiment(
        op, state, tmp_path / "exp.json", hooks=experiment.Hooks(on_note=notes.append)
    )
    assert outcome.ok and swept == [64, 32]
    assert state.results["max_num_seqs=32"]["confirmed"] is True
    assert any(
        "--confirm: restarting with the predicted winner max_num_seqs=32" in n for n in notes
    )
    assert outcome.reading.recommended == "max_num_seqs=32"
    cfg = next(c for c in outcome.reading.configs if c["label"] == "max_num_seqs=32")
    assert cfg["predicted_from"] is None, "the measurement replaced the prediction"
    # the prediction is kept beside the measurement: how far it was off, per level
    ((base, check),) = state.confirmations()
    assert base == "max_num_seqs=64" and check.cap == 32
    assert [lv.concurrency for lv in check.levels] == [1, 32, 64]
    assert check.levels[0].aggregate == pytest.approx(0.0)  # C <= cap: the same level
    assert outcome.to_dict()["confirmations"][0]["predicted_from"] == base
    assert "Confirmation of cap 32 (predicted, then measured)" in render_report(outcome)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_budget_spent_midway_says_what_changed(tmp_path: Path) -> None:
    """Red team: a restart stamp from elsewhere spends the budget while the first configuration
    is measured; the second configuration's restart and the restore are refused (exit 16). The
    run says what it changed (8 applied, not put back), when the next slot frees and the ways on
    with --over-budget; never "nothing was changed", never a bare apply the gate would refuse."""
    from spark_ops.sim.control import down

    s = start_sim(tmp_path / "sim", time_scale=TIME_SCALE, watchdog_interval_s=30.0)
    try:
        env = dict(os.environ, SPARK_OPS_INVENTORY=str(s.inventory))
        history = s.history.read_bytes()
        state = tmp_path / "exp.json"
        args = ["experiment", "--max-num-seqs", "8,10", "--measure-all", "--concurrency", "1,6",
                "--output-tokens", "300", "--yes", "--state", str(state)]  # fmt: skip
        proc = subprocess.Popen(
            [sys.executable, "-m", "spark_ops.cli.main", *args],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        deadline, restarted = time.monotonic() + 120, False
        while time.monotonic() < deadline and proc.poll() is None:  # 8's restart, then its prune
            now = s.history.read_bytes()
            restarted = restarted or now != history
            if restarted and now == history:
                break
            time.sleep(0.02)
        with s.history.open("a") as fh:  # an automatic restart meanwhile: 2/2 used
            fh.write(f"{int(time.time())}\n")
        out, err = proc.communicate(timeout=180)
        said = f"{out[-3000:]}\n{err[-3000:]}"
        assert proc.returncode == ExitStatus.OVER_BUDGET, said
        final = err[err.rindex("error: ") :]
        assert "nothing was changed" not in final, said
        assert "This run applied max_num_seqs=8" in final, said
        assert "the starting configuration (max_num_seqs=6) was not put back" in final, said
        assert re.search(r"next slot frees in \d+ h( \d+ min)? \(at \d\d:\d\d UTC\)", final), said
        assert "--resume --over-budget" in final, said
        ending = " ".join(out.split())
        assert "`spark-ops apply --max-num-seqs 6` once a slot frees, or now with" in ending, said
        assert "max_num_seqs: 8 " in s.recipe.read_text()
        saved = json.loads(state.read_text())
        assert saved["restore"]["refused"] is True and saved["error"]["error"] == "OverBudget"
        assert saved["restore"]["command"] == "spark-ops apply --max-num-seqs 6", saved["restore"]
    finally:
        down(s.root)
