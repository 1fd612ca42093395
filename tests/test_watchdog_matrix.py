"""The watchdog behaviour matrix: an operator's own bash watchdog of the stamp contract, one
behaviour per cell (tests/fixtures/watchdog_matrix/cells.yaml), on the embedded cluster and on
OpenSSH. Every cell must end in a true verdict: the new engine serves with the planned args, the
history is exactly as before (the planned stamp removed), and what the watchdog did meanwhile
(gave-up) is reported. Also: the engine's API server killed mid-boot, its survivors named.

SPARK_OPS_FAULT_RECORD=FILE appends one JSON line per cell (docs/reliability.md's matrix).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import REPO, start_sim
from ground.cluster import SparkGround, make_spark_ground, run_cli, write_as
from ground.sshd import SshdCluster
from test_faults import record, run_and_act, run_until_step, sim_serving

from spark_ops.errors import ExitStatus

pytestmark = pytest.mark.slow

HERE = REPO / "tests" / "fixtures" / "watchdog_matrix"
CELLS = yaml.safe_load((HERE / "cells.yaml").read_text(encoding="utf-8"))
WD = (HERE / "wd.sh").read_text(encoding="utf-8")

RUN_RECIPE_SIM = """#!@PYTHON@
\"\"\"run-recipe RECIPE: render a recipe and start its command detached (pid file, log).\"\"\"
import os
import subprocess
import sys

from spark_ops.recipe import render_recipe

path = sys.argv[1]
with open(path, encoding="utf-8") as fh:
    rendered = render_recipe(fh.read(), source=path)
with open(os.path.expanduser("~/engine.log"), "ab") as log:
    proc = subprocess.Popen(
        rendered.argv, env=dict(os.environ, **rendered.env), stdin=subprocess.DEVNULL,
        stdout=log, stderr=log, start_new_session=True, cwd=os.path.dirname(path),
    )
pid_file = "@PIDFILE@"
with open(pid_file + ".tmp", "w", encoding="utf-8") as fh:
    fh.write(f"{proc.pid}\\n")
os.replace(pid_file + ".tmp", pid_file)
"""


@dataclass
class Ground:
    """One ground with the bash watchdog installed: where its files are, how to run the CLI."""

    kind: str
    env: dict[str, str]
    home: Path
    pid_file: Path
    write: Callable[[Path, str, int], Any]

    @property
    def history(self) -> Path:
        """The bash watchdog's history."""
        return self.home / ".wd" / "restart_history"

    def lines(self) -> list[str]:
        """The history's lines, verbatim."""
        return self.history.read_text().splitlines()

    container: str = ""
    port: int = 0

    def engine_pid(self) -> int:
        """The pid the pid file names (a container: its id's first 12 hex digits as a number)."""
        if self.container:
            from ground.docker import docker

            return int(docker("inspect", "-f", "{{.Id}}", self.container).strip()[:12], 16)
        return int(self.pid_file.read_text().split()[0])


def _inventory(text: str, reports_stamp: bool) -> str:
    """The ground's inventory with the bash watchdog as its watchdog (no journal)."""
    data = yaml.safe_load(text)
    cluster = next(iter(data["clusters"].values()))
    cluster["watchdog"] = {
        "restart_command": "wd --restart-now --force",
        "reports_stamp": reports_stamp,
        "history_file": "~/.wd/restart_history",
        "history_format": "stamps",
        "pause_file": "~/.wd/pause",
        "gave_up_file": "~/.wd/gave-up",
        "python": cluster["watchdog"].get("python", "python3"),
        "budget": {"max_restarts": 2, "window_s": 21600},
    }
    return yaml.safe_dump(data, sort_keys=False)


def _install(g: Ground, pid_file: str, port: int, recipe: str, behaviour: dict[str, Any]) -> None:
    """Put wd on the head's PATH, its behaviour and a history with earlier entries."""
    script = WD.replace("@PIDFILE@", pid_file).replace("@RECIPE@", recipe)
    script = script.replace("@ENGINE@", "pidfile").replace("@NAME@", "").replace("@RUN_ARGS@", "")
    g.write(g.home / "bin" / "wd", script.replace("@PORT@", str(port)), 0o755)
    g.write(
        g.home / ".wd" / "behaviour", "".join(f"{k}={v}\n" for k, v in behaviour.items()), 0o644
    )
    now = int(time.time())
    g.write(g.history, f"{now - 30000}\n{now - 7200}\n", 0o644)


@contextlib.contextmanager
def sim_ground(tmp: Path, cell: dict[str, Any], **sim: Any) -> Iterator[Ground]:
    """The embedded cluster with the bash watchdog (the reference daemon paused)."""
    from spark_ops.sim.control import down

    s = start_sim(tmp / "sim", **sim)
    try:
        sim_serving(s)
        state = s.head / ".local" / "state" / "spark-watchdog"
        (state / "pause").write_text("matrix: the bash watchdog is in charge\n")

        def write(path: Path, text: str, mode: int) -> None:
            """Write a file on the head."""
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            path.chmod(mode)

        pid_file = state / "engine.pid"
        g = Ground("sim", {}, s.head, pid_file, write)
        run_recipe = RUN_RECIPE_SIM.replace("@PYTHON@", sys.executable)
        write(s.head / "bin" / "run-recipe", run_recipe.replace("@PIDFILE@", str(pid_file)), 0o755)
        _install(g, str(pid_file), s.state["engine_port"], str(s.recipe), cell["behaviour"])
        inv = tmp / "inventory.yaml"
        inv.write_text(_inventory(s.inventory.read_text(), cell["reports_stamp"]))
        g.env = dict(os.environ, SPARK_OPS_INVENTORY=str(inv))
        g.env.pop("SPARK_OPS_CLUSTER", None)
        yield g
    finally:
        down(s.root)


@contextlib.contextmanager
def openssh_ground(cluster: SshdCluster, tmp: Path, cell: dict[str, Any]) -> Iterator[Ground]:
    """The OpenSSH ground with the bash watchdog (its own run-recipe launcher)."""
    sg: SparkGround = make_spark_ground(cluster, tmp / "spark")
    head = sg.head

    def write(path: Path, text: str, mode: int) -> None:
        """Write a file owned by the head's user."""
        write_as(head, path, text, mode)

    pid_file = head.home / ".watchdog" / "engine.pid"
    g = Ground("openssh", {}, head.home, pid_file, write)
    _install(g, str(pid_file), sg.engine_port, str(sg.recipe), cell["behaviour"])
    inv = tmp / "inventory-wd.yaml"
    inv.write_text(_inventory(sg.inventory.read_text(), cell["reports_stamp"]))
    g.env = dict(sg.env(), SPARK_OPS_INVENTORY=str(inv))
    yield g


RECIPE_ARGV = """#!@PYTHON@
\"\"\"recipe-argv RECIPE: the recipe's command line, NUL-separated (for `docker run`).\"\"\"
import sys

from spark_ops.recipe import render_recipe

with open(sys.argv[1], encoding="utf-8") as fh:
    rendered = render_recipe(fh.read(), source=sys.argv[1])
sys.stdout.write("".join(a + "\\0" for a in rendered.argv))
"""


@contextlib.contextmanager
def sim_docker_ground(tmp: Path, cell: dict[str, Any]) -> Iterator[Ground]:
    """The embedded cluster with its engine in a real Docker container (--network host), run by
    the operator's bash watchdog; log `{kind: docker}`, no pid file."""
    import shlex

    from ground.docker import LABEL, docker, ensure_image, host_mounts, sweep_stale

    sweep_stale()
    image = ensure_image()
    name = f"spark-ops-wd-engine-{os.getpid()}"
    with sim_ground(tmp, cell) as g:
        sim_root = g.home.parents[1]
        old_pid = g.engine_pid()  # the engine the sim started: its environment, then it goes
        environ = Path(f"/proc/{old_pid}/environ").read_bytes().split(b"\0")
        env = dict(x.decode().split("=", 1) for x in environ if b"=" in x)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(old_pid, signal.SIGTERM)
        for _ in range(300):  # its port is the container's (--network host): let it go first
            try:
                if Path(f"/proc/{old_pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                    break
            except OSError:
                break
            time.sleep(0.1)
        g.write(g.home / "bin" / "recipe-argv",
                RECIPE_ARGV.replace("@PYTHON@", sys.executable), 0o755)  # fmt: skip
        run = [*host_mounts(REPO, sim_root), "--label", f"{LABEL}={os.getpid()}"]
        for key in ("SPARK_SIM_CONFIG", "SPARK_SIM_RAY_WORKERS"):
            run += ["-e", f"{key}={env[key]}"]
        run += ["-e", f"PATH={g.home / 'bin'}:/usr/bin:/bin", "-e", "HOME=/tmp", image]
        recipe = sim_root / "nodes" / "node1" / "recipes" / "glm-5.3-flash-sim.yaml"
        script = WD.replace("@ENGINE@", "docker").replace("@NAME@", name).replace("@PIDFILE@", "")
        port = int(json.loads((sim_root / "state.json").read_text())["engine_port"])
        script = script.replace("@RECIPE@", str(recipe)).replace("@PORT@", str(port))
        g.write(g.home / "bin" / "wd", script.replace("@RUN_ARGS@", shlex.join(run)), 0o755)
        inv = yaml.safe_load(Path(g.env["SPARK_OPS_INVENTORY"]).read_text())
        engine = next(iter(inv["clusters"].values()))["engine"]
        engine["log"] = {"kind": "docker", "container": name}
        engine.pop("pid_file", None)
        Path(g.env["SPARK_OPS_INVENTORY"]).write_text(yaml.safe_dump(inv, sort_keys=False))
        import subprocess

        subprocess.run(["bash", str(g.home / "bin" / "wd"), "--start"], check=True,
                       env={**env, "HOME": str(g.home)}, cwd=g.home, timeout=120)  # fmt: skip
        g.container, g.port = name, port
        try:
            yield g
        finally:
            docker("rm", "-f", name, check=False, timeout=60)


def _params() -> list[Any]:
    """One test per cell and ground."""
    out = []
    for cell in CELLS:
        for ground in cell["grounds"]:
            marks = [pytest.mark.openssh] if ground == "openssh" else []
            marks += [pytest.mark.docker] if ground == "sim-docker" else []
            out.append(pytest.param(cell, ground, id=f"{ground}-{cell['cell']}", marks=marks))
    return out


def sim_serving_at(g: Ground, timeout: float = 90) -> None:
    """Wait until the ground's engine answers /v1/models."""
    import urllib.error
    import urllib.request

    if not g.port:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        url = f"http://127.0.0.1:{g.port}/v1/models"
        with (
            contextlib.suppress(urllib.error.URLError, OSError),
            urllib.request.urlopen(url, timeout=2) as r,
        ):
            if r.status == 200:
                return
        time.sleep(0.3)
    logs = ""
    if g.container:
        from ground.docker import Container

        logs = Container(name=g.container, id=g.container).logs()[-4000:]
    raise AssertionError(f"the engine did not serve on port {g.port} in {timeout} s\n{logs}")


@pytest.mark.parametrize(("cell", "ground"), _params())
def test_watchdog_cell(
    cell: dict[str, Any], ground: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """apply through the operator's watchdog: the new engine's verdict, the history as before."""
    if ground == "sim":
        cm = sim_ground(tmp_path, cell)
    elif ground == "sim-docker":
        from ground.docker import docker_unavailable_reason

        if reason := docker_unavailable_reason():
            pytest.skip(reason)
        cm = sim_docker_ground(tmp_path, cell)
    else:
        cm = openssh_ground(request.getfixturevalue("openssh_cluster"), tmp_path, cell)
    with cm as g:
        sim_serving_at(g)
        before, old_pid = g.lines(), g.engine_pid()
        started = time.monotonic()
        res = run_cli(
            g.env, "apply", "--max-num-seqs", "64", "--yes", "--json", "--no-drain",
            "--deadline", "150",
        )  # fmt: skip
        took = time.monotonic() - started
        out: dict[str, Any] = {}
        with contextlib.suppress(ValueError):
            out = json.loads(res.stdout)
        after = g.lines()
        record(
            f"matrix-{cell['cell']}", g.kind, cell["cell"], exit=res.returncode,
            message=(out.get("error") or {}).get("message", "ok") if res.returncode else "ok",
            seconds=round(took, 1), boot_s=(out.get("boot") or {}).get("total_s"),
            history_before=len(before), history_after=len(after), lost=0,
            kept="history as before (planned stamp removed)" if after == before else "CHANGED",
        )  # fmt: skip
        assert res.returncode == 0, res.stderr[-3000:]
        assert out["boot"]["non_default_args"]["max_num_seqs"] == 64, "the NEW engine's args"
        assert all(c["ok"] for c in out["checks"]), out["checks"]
        assert g.engine_pid() != old_pid, "a new engine serves"
        assert len(out["pruned"]) == 1 and after == before, (before, after, out["pruned"])
        if cell.get("warning"):
            assert any(cell["warning"] in w for w in out["warnings"]), out["warnings"]


@pytest.mark.parametrize("ground", ["sim", pytest.param("openssh", marks=pytest.mark.openssh)])
def test_api_server_killed_mid_boot_names_survivors(
    ground: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """SIGKILL of the new engine's API server while weights load: exit 7, its children named."""
    cell = {"behaviour": {"MODE": "sync"}, "reports_stamp": False}
    if ground == "sim":
        cm = sim_ground(tmp_path, cell, boot_scale=4.0)
    else:
        cm = openssh_ground(request.getfixturevalue("openssh_cluster"), tmp_path, cell)
    with cm as g:
        cfg = g.home / "engine.yaml" if ground == "openssh" else g.home.parents[1] / "engine.yaml"
        g.write(cfg, cfg.read_text() + "spawn_children: true\n", 0o644)
        before = g.lines()

        def kill() -> None:
            """SIGKILL the API server only (not its group)."""
            os.kill(g.engine_pid(), signal.SIGKILL)

        code, _, err, acted, took = run_and_act(
            g.env,
            ["restart", "--yes", "--json", "--no-drain", "--deadline", "120"],
            lambda d: d.get("event") == "boot-phase" and d.get("phase") == "WEIGHTS_LOADING",
            kill,
        )
        assert acted, err[-2000:]
        at: dict[str, float] = {}
        for line in err.splitlines():
            with contextlib.suppress(ValueError, AttributeError):
                d = json.loads(line)
                ev = d.get("event")
                if ev == "boot-fatal" or (ev == "boot-phase" and d["phase"] == "WEIGHTS_LOADING"):
                    at.setdefault(ev, float(d["elapsed_s"]))
        named_after = at.get("boot-fatal", 0.0) - at.get("boot-phase", 0.0)
        message = next(
            (json.loads(x)["message"] for x in err.splitlines() if '"error"' in x and x[0] == "{"),
            err[-500:],
        )
        status = json.loads(run_cli(g.env, "status", "--json").stdout)["engine"]
        doctor = run_cli(g.env, "doctor", "--json")
        pgid = g.engine_pid()
        stamps = g.lines()
        # issue 35 #4: the plan refuses a restart doctor's failing check says would fail, before
        # anything is written, naming the node, the pids and the command that frees them
        refused = run_cli(g.env, "restart", "--yes", "--json", "--no-drain")
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)  # the survivors, once named
        assert refused.returncode == ExitStatus.CHECK_FAILED, refused.stderr[-2000:]
        error = json.loads(refused.stderr.strip().splitlines()[-1])
        assert error["error"] == "BootWouldFail", error
        assert "the restart would fail" in error["message"] and "node1" in error["message"]
        for p in status["leftovers"]:
            assert f"pid {p['pid']} ({p['name']})" in error["message"], error
        assert f"spark-ops exec --nodes node1 -- kill -TERM -- -{pgid}" in error["hint"], error
        assert g.lines() == stamps, "nothing restarted: no stamp written"
        assert status["effective"] is None, "a dead engine's args are not effective"
        assert [p["name"] for p in status["leftovers"]] == ["VLLM::EngineCore", "VLLM::Worker_TP0"]
        assert status["leftovers_fix"] == f"kill -TERM -- -{pgid}", status
        left = [c for c in json.loads(doctor.stdout)["checks"] if c["name"] == "engine-leftovers"]
        assert left and left[0]["status"] == "fail" and "VLLM::EngineCore" in left[0]["detail"]
        record(f"api-server-killed-{ground}", g.kind, "the API server SIGKILLed mid-boot",
               exit=code, message=message[:300], seconds=round(took, 1), lost=0,
               named_after_kill_s=round(named_after, 1),
               kept="survivors named; planned stamp pruned")  # fmt: skip
        assert code == ExitStatus.BOOT_FAILED, err[-3000:]
        assert "still running:" in message and "VLLM::EngineCore" in message, message
        errors = [x for x in err.splitlines() if x.startswith('{"error"')]
        hint = json.loads(errors[-1]).get("hint", "") if errors else err[-2000:]
        assert "kill -TERM --" in hint, (hint, json.loads(errors[-1])["message"])
        assert g.lines() == before, "the planned stamp pruned"


def test_prune_planned_without_a_journal(tmp_path: Path) -> None:
    """A watchdog that keeps no journal: spark-ops records the stamp it forced, so after a SIGKILL
    during the boot `budget prune --planned` removes exactly that stamp."""
    cell = {"behaviour": {"MODE": "sync"}, "reports_stamp": False}
    with sim_ground(tmp_path, cell) as g:
        before = g.lines()
        args = ["apply", "--max-num-seqs", "64", "--yes", "--json", "--no-drain"]
        code, err, killed = run_until_step(g.env, args, "boot")
        assert killed and code == -signal.SIGKILL, err[-2000:]
        assert len(g.lines()) == len(before) + 1, "the planned stamp is left by the kill"
        res = run_cli(g.env, "budget", "prune", "--planned", "--yes", "--json")
        assert res.returncode == 0, res.stderr[-2000:]
        assert g.lines() == before, "exactly the planned stamp removed"
        removed = json.loads(res.stdout).get("removed_stamps")
        record("prune-planned-no-journal", "sim", "spark-ops SIGKILLed in the boot, no journal",
               exit=0, message=f"prune --planned removed {removed}", lost=0,
               kept="earlier stamps")  # fmt: skip


def _recipe_dir(g: Ground) -> dict[str, str]:
    """Every file beside the recipe (backups, staged files) with its content."""
    recipe = next(g.home.glob("recipes/*.yaml"))
    return {p.name: p.read_text() for p in sorted(recipe.parent.iterdir())}


APPLY_64 = ("apply", "--max-num-seqs", "64")
FAILED_TRIGGERS = [
    ("typo", APPLY_64, "wdd --restart-now --force", {"MODE": "sync"}, "no restart began",
     "the recipe write was undone"),
    ("fails-after-the-stop", APPLY_64, "wd --restart-now --force", {"MODE": "fail-after-stop"},
     "a restart may have begun", "spark-ops rollback"),
    # a plain restart wrote nothing: the hint names the engine, not new recipe values (F6)
    ("restart-fails-after-the-stop", ("restart",), "wd --restart-now --force",
     {"MODE": "fail-after-stop"}, "a restart may have begun", "the engine may be down"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("case", "argv", "command", "behaviour", "said", "told"), FAILED_TRIGGERS,
    ids=[c[0] for c in FAILED_TRIGGERS],
)  # fmt: skip
def test_failed_trigger(
    case: str,
    argv: tuple[str, ...],
    command: str,
    behaviour: dict[str, Any],
    said: str,
    told: str,
    tmp_path: Path,
) -> None:
    """The restart command fails: with no restart begun, nothing is left changed (exit 12);
    when one may have begun, the operator is told what may differ (the recipe and the engine
    after an apply, the engine after a restart)."""
    cell = {"behaviour": behaviour, "reports_stamp": False}
    with sim_ground(tmp_path, cell) as g:
        inv = Path(g.env["SPARK_OPS_INVENTORY"])
        inv.write_text(inv.read_text().replace("wd --restart-now --force", command))
        before, files, pid = g.lines(), _recipe_dir(g), g.engine_pid()
        res = run_cli(g.env, *argv, "--yes", "--json", "--no-drain")
        errors = [json.loads(x) for x in res.stderr.splitlines() if x.startswith('{"error"')]
        record(f"failed-trigger-{case}", "sim", f"restart command {case}", exit=res.returncode,
               message=errors[-1]["message"] if errors else res.stderr[-300:], lost=0,
               kept="recipe, its directory, history, engine" if case == "typo"
               else "history; the operator told what differs")  # fmt: skip
        assert res.returncode == ExitStatus.REMOTE, res.stderr[-3000:]
        assert errors and said in errors[-1]["message"], errors
        assert told in errors[-1]["message"] + errors[-1].get("hint", ""), errors
        steps = [json.loads(x)["step"] for x in res.stderr.splitlines() if x.startswith('{"step"')]
        assert [s["status"] for s in steps if s["name"] == "restart"][-1] == "failed"
        assert g.lines() == before
        if case == "typo":
            assert _recipe_dir(g) == files, "the recipe and its directory exactly as before"
            assert g.engine_pid() == pid


@pytest.mark.realvllm
@pytest.mark.timeout(1200)
def test_real_vllm_slow_stop_and_killed_api_server(tmp_path: Path) -> None:
    """The real CPU build behind the operator's slow-stop watchdog: the verdict is the new
    engine's (args 64) though the old one answers for 6 s; then its API server SIGKILLed while
    the model loads: the real EngineCore and worker it leaves are named."""
    from ground.vllm import OWNER_ENV, VENV, tiny_llama_recipe, vllm_unavailable_reason

    if reason := vllm_unavailable_reason():
        pytest.skip(reason)
    cell = {"behaviour": {"MODE": "slow-stop", "SLOW_S": 6}, "reports_stamp": False}
    with sim_ground(tmp_path, cell) as g:
        shim = g.home / "bin" / "vllm"
        shim.write_text(
            "#!/bin/sh\nunset VLLM_CPU_KVCACHE_SPACE SPARK_SIM_CONFIG SPARK_SIM_RAY_WORKERS\n"
            f'exec {VENV}/shim/vllm "$@"\n'
        )
        recipe = next(g.home.glob("recipes/*.yaml"))
        port = int(json.loads((g.home.parents[1] / "state.json").read_text())["engine_port"])
        recipe.write_text(
            tiny_llama_recipe(
                writer="tests/test_watchdog_matrix.py",
                models=VENV / "models",
                port=port,
                env={OWNER_ENV: str(os.getpid())},
                max_num_seqs=6,
                kv_cache="1G",
            )
        )
        g.port = port
        import subprocess

        env = {**os.environ, "HOME": str(g.home), "PATH": f"{g.home / 'bin'}:{os.environ['PATH']}"}
        g.write(g.home / ".wd" / "behaviour", "MODE=sync\n", 0o644)
        first = subprocess.run(["bash", str(g.home / "bin" / "wd"), "--restart-now", "--force"],
                               env=env, capture_output=True, text=True, timeout=120)  # fmt: skip
        assert first.returncode == 0, first.stderr
        sim_serving_at(g, timeout=400)  # the outgoing engine: a real vLLM, serving
        g.write(g.home / ".wd" / "behaviour", "MODE=slow-stop\nSLOW_S=6\n", 0o644)
        before, old_pid = g.lines(), g.engine_pid()
        started = time.monotonic()
        # the set-up's own forced restart and the seeded stamp spend the budget (2/2): the gate
        # would refuse (exit 16); this test is about the slow stop, so it says --over-budget
        res = run_cli(g.env, "apply", "--max-num-seqs", "64", "--yes", "--json", "--no-drain",
                      "--deadline", "400", "--over-budget", timeout=600)  # fmt: skip
        out = json.loads(res.stdout) if res.stdout.startswith("{") else {}
        record("matrix-real-vllm-slow-stop", "sim+real vLLM", "slow stop, real vLLM 0.32",
               exit=res.returncode, seconds=round(time.monotonic() - started, 1),
               boot_s=(out.get("boot") or {}).get("total_s"), lost=0,
               message="ok" if res.returncode == 0 else res.stderr[-300:],
               kept="history as before" if g.lines() == before else "CHANGED")  # fmt: skip
        assert res.returncode == 0, res.stderr[-3000:]
        assert out["boot"]["non_default_args"]["max_num_seqs"] == 64
        assert g.engine_pid() != old_pid and g.lines() == before

        g.write(g.home / ".wd" / "behaviour", "MODE=sync\n", 0o644)
        code, _, err, acted, took = run_and_act(
            g.env,
            ["restart", "--yes", "--json", "--no-drain", "--deadline", "400", "--over-budget"],
            lambda d: d.get("event") == "boot-phase" and d.get("phase") == "WEIGHTS_LOADING",
            lambda: os.kill(g.engine_pid(), signal.SIGKILL),
        )
        pgid = g.engine_pid()
        errors = [json.loads(x) for x in err.splitlines() if x.startswith('{"error"')]
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
        message = errors[-1]["message"] if errors else err[-500:]
        record("api-server-killed-real-vllm", "sim+real vLLM", "real API server SIGKILLed",
               exit=code, message=message[:300], seconds=round(took, 1), lost=0,
               kept="survivors named")  # fmt: skip
        assert acted and code == ExitStatus.BOOT_FAILED, err[-3000:]
        assert "still running:" in message and "VLLM::EngineCore" in message, message
