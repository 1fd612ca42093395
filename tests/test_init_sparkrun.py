"""`spark-ops init --from-sparkrun` on cluster files written by the real `sparkrun cluster create`.

sparkrun (0.4.2, its own venv) writes ~/.config/sparkrun/clusters/<name>.yaml and .default in a
temp HOME; config.yaml carries the SSH key, port and known_hosts as sparkrun users set them;
the job file is the one `sparkrun run` leaves in ~/.cache/sparkrun/jobs/. init then connects to
the embedded head, finds the reference watchdog there (or not) and writes the inventory.
"""

from __future__ import annotations

import getpass
import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from ground import GroundUnavailable
from ground.sparkrun_venv import run_sparkrun, sparkrun_bin
from test_init import spark_ops

from refwatchdog.actions import sparkrun_argv
from spark_ops.errors import InventoryError
from spark_ops.inventory import load_inventory
from spark_ops.watchdog.config import WatchdogConfigError, parse_config

FIXTURES = Path(__file__).parent / "fixtures"
sys.path.insert(0, str(FIXTURES / "doctor"))
from minicluster import MiniCluster  # noqa: E402

RECIPE = FIXTURES / "sparkrun" / "nocommand_knob_set" / "recipe.yaml"


@pytest.fixture(scope="module")
def solo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MiniCluster]:
    """A one-node embedded cluster (no engine needed: init only looks)."""
    m = MiniCluster(tmp_path_factory.mktemp("init-sparkrun") / "sim", nodes=1).start(engine=False)
    try:
        yield m
    finally:
        m.stop()


def sparkrun_home(tmp_path: Path, mini: MiniCluster, *, default: bool = True) -> Path:
    """A HOME with a cluster made by the real sparkrun, SSH config and a job on it."""
    try:
        sparkrun_bin()
    except GroundUnavailable as exc:
        pytest.skip(str(exc))
    home = tmp_path / "operator"
    args = ["cluster", "create", "lab", "-H", "127.0.0.1", "-u", getpass.getuser()]
    made = run_sparkrun([*args, "-d", "embedded head", *(["--default"] if default else [])], home)
    assert made.returncode == 0, made.stdout + made.stderr
    cluster = yaml.safe_load((home / ".config/sparkrun/clusters/lab.yaml").read_text())
    assert cluster["hosts"] == ["127.0.0.1"] and cluster["user"] == getpass.getuser()
    keys = mini.root / "keys"
    (home / ".config/sparkrun/config.yaml").write_text(
        yaml.safe_dump(
            {
                "ssh": {
                    "key": str(keys / "client_ed25519"),
                    "options": [
                        "-p",
                        str(mini.ports["node1"]),
                        "-o",
                        f"UserKnownHostsFile={keys / 'known_hosts'}",
                        "-o",
                        "ServerAliveInterval=30",
                    ],
                }
            }
        )
    )
    recipe = mini.head / "recipes" / "tiny-sparkrun.yaml"
    shutil.copy(RECIPE, recipe)
    jobs = home / ".cache" / "sparkrun" / "jobs"
    jobs.mkdir(parents=True)
    job = {
        "cluster_id": "sparkrun_0123456789ab_cdef",
        "cluster": "lab",
        "recipe": str(recipe),
        "model": "org/tiny-moe",
        "runtime": "vllm-distributed",
        "hosts": ["127.0.0.1"],
        "port": 8000,
        "tensor_parallel": 1,
        "started_at": time.time(),
    }
    (jobs / "0123456789ab.yaml").write_text(yaml.safe_dump(job))
    return home


def test_init_from_sparkrun_writes_a_working_inventory(solo: MiniCluster, tmp_path: Path) -> None:
    """Nodes, user, key, port, known_hosts, recipe from sparkrun; watchdog found on the head."""
    home = sparkrun_home(tmp_path, solo)
    out = tmp_path / "inv.yaml"
    res = spark_ops("init", "--from-sparkrun", "--sparkrun-home", str(home), "-o", str(out))
    assert res.returncode == 0, res.stdout + res.stderr
    assert "sparkrun's default" in res.stdout and "ServerAliveInterval=30" in res.stdout
    cluster = load_inventory(out).cluster()
    assert cluster.name == "lab" and cluster.tensor_parallel == 1
    assert [(n.host, n.port) for n in cluster.nodes] == [("127.0.0.1", solo.ports["node1"])]
    assert cluster.ssh.user == getpass.getuser()
    assert cluster.ssh.identity == (str(solo.root / "keys" / "client_ed25519"),)
    assert cluster.ssh.known_hosts == str(solo.root / "keys" / "known_hosts")
    assert cluster.recipe.path == str(solo.head / "recipes" / "tiny-sparkrun.yaml")
    assert cluster.engine.log_kind == "command" and "sparkrun_" in cluster.engine.log_target
    assert cluster.engine.api_url == "http://127.0.0.1:8000"
    assert cluster.watchdog.restart_command.startswith("spark-watchdog ")


def test_init_without_a_watchdog_uses_sparkrun_s_restart(solo: MiniCluster, tmp_path: Path) -> None:
    """No reference watchdog config on the head: restart is `sparkrun run … --no-follow`."""
    home = sparkrun_home(tmp_path, solo, default=False)
    config = solo.head / ".config" / "spark-watchdog.yaml"
    config.rename(config.with_name("aside.yaml"))
    try:
        out = tmp_path / "inv.yaml"
        res = spark_ops(
            "init", "--from-sparkrun", "lab", "--sparkrun-home", str(home), "-o", str(out)
        )
    finally:
        config.with_name("aside.yaml").rename(config)
    assert res.returncode == 0, res.stdout + res.stderr
    text = out.read_text()
    recipe = solo.head / "recipes" / "tiny-sparkrun.yaml"
    assert f'restart_command: "sparkrun run {recipe} --cluster lab --no-follow"' in text
    # the reference watchdog's history is still on the head (its config was only moved aside)
    assert 'history_file: "~/.local/state/spark-watchdog/restarts"' in text


def test_init_from_sparkrun_names_what_is_wrong(tmp_path: Path) -> None:
    """An unknown cluster or no default: InventoryError naming the file."""
    from spark_ops.discover.sparkrun import read_sparkrun

    (tmp_path / ".config" / "sparkrun" / "clusters").mkdir(parents=True)
    with pytest.raises(InventoryError, match=r"clusters/nope\.yaml does not exist"):
        read_sparkrun("nope", tmp_path)
    with pytest.raises(InventoryError, match="no default cluster"):
        read_sparkrun(None, tmp_path)
    with pytest.raises(InventoryError, match="not a sparkrun cluster name"):
        read_sparkrun("../x", tmp_path)


def test_sparkrun_restart_action_config(tmp_path: Path) -> None:
    """action.kind sparkrun: recipe and cluster required; argv is sparkrun's own stop and run."""
    cfg = parse_config(
        {
            "paths": {"dir": str(tmp_path)},
            "action": {
                "kind": "sparkrun",
                "recipe": "/r/q.yaml",
                "cluster": "lab",
                "sparkrun": "/opt/spark-ops-sparkrun/bin/sparkrun",
                "run_options": ["--image", "local/vllm:tiny", "--offline"],
            },
        }
    )
    assert sparkrun_argv(cfg.action, "stop") == [
        "/opt/spark-ops-sparkrun/bin/sparkrun", "stop", "/r/q.yaml", "--cluster", "lab",
    ]  # fmt: skip
    assert sparkrun_argv(cfg.action, "run")[-5:] == [
        "lab", "--no-follow", "--image", "local/vllm:tiny", "--offline",
    ]  # fmt: skip
    with pytest.raises(WatchdogConfigError, match=r"action\.cluster is required"):
        parse_config({"action": {"kind": "sparkrun", "recipe": "/r/q.yaml"}})
    with pytest.raises(WatchdogConfigError, match="run_options"):
        parse_config(
            {"action": {"kind": "sparkrun", "recipe": "x", "cluster": "c", "run_options": "-x"}}
        )


def test_sparkrun_action_runs_the_real_cli_and_reports_its_refusal(tmp_path: Path) -> None:
    """The watchdog's sparkrun action runs the real `sparkrun stop` then `run --no-follow`.

    Here no host can take the job (the cluster's hosts are unreachable loopback addresses, in a
    network namespace of their own): stop's failure is recorded and ignored, run's failure is the
    action's error, and sparkrun's own words are in the engine log.
    """
    from ground.sparkrun_venv import VENV, no_network_prefix, offline_env, prepare_home

    from refwatchdog.actions import restart_engine

    try:
        sparkrun_bin()
    except GroundUnavailable as exc:
        pytest.skip(str(exc))
    home = prepare_home(tmp_path / "operator")
    made = run_sparkrun(["cluster", "create", "lab", "-H", "127.0.0.2"], home)
    assert made.returncode == 0, made.stdout + made.stderr
    recipe = tmp_path / "recipe.yaml"
    shutil.copy(RECIPE, recipe)
    cfg = parse_config(
        {
            "paths": {"dir": str(tmp_path / "state")},
            "action": {
                "kind": "sparkrun",
                "recipe": str(recipe),
                "cluster": "lab",
                "sparkrun": [*no_network_prefix(), str(VENV / "bin" / "sparkrun")],
                "run_options": ["--offline", "--no-auto-detect", "--no-sync-tuning"],
                "timeout": 120,
                "stop_timeout": 30,
            },
        }
    )
    env = offline_env(home)
    with pytest.MonkeyPatch.context() as mp:
        for key, value in env.items():
            mp.setenv(key, value)
        result = restart_engine(cfg.action, cfg.paths)
    assert result.kind == "sparkrun" and result.ok is False
    assert len(result.steps) == 1 and result.steps[0]["argv"][-4:] == [
        "stop", str(recipe), "--cluster", "lab",
    ]  # fmt: skip
    assert result.steps[0]["result"].startswith("ignored: "), result.steps
    assert f" run {recipe} --cluster lab --no-follow --offline" in (result.error or "")
    assert "exited 1" in (result.error or ""), result.error
    log = Path(cfg.paths.engine_log).read_text()
    assert "sparkrun" in log and "127.0.0.2" in log, log[-2000:]


@pytest.mark.parametrize(
    "options, port, identity, known, ignored",
    [
        (["-p", "2222"], 2222, (), None, []),
        (["-p2222", "-o", "ServerAliveInterval=30"], 2222, (), None, ["-o ServerAliveInterval=30"]),
        (["-o", "Port=2201", "-oUserKnownHostsFile=/k/known"], 2201, (), "/k/known", []),
        (["-o", "Port 2202", "-i", "/k/id", "-F", "/k/cfg"], 2202, ("/k/id",), None, ["-F /k/cfg"]),
        ("-p 2203 -A", 2203, (), None, ["-A"]),
    ],
)
def test_sparkrun_ssh_options(
    tmp_path: Path, options: object, port: int, identity: tuple, known: str | None, ignored: list
) -> None:
    """Port, key and known_hosts are taken from sparkrun's ssh options; the rest is listed."""
    from spark_ops.discover.sparkrun import SparkrunSetup, _ssh_options

    setup = SparkrunSetup("lab", [])
    _ssh_options(setup, options, tmp_path / "config.yaml")
    assert (setup.port, setup.identity, setup.known_hosts) == (port, identity, known)
    assert setup.ignored_options == ignored
    with pytest.raises(InventoryError, match="ssh port '0x' is not a port number"):
        _ssh_options(SparkrunSetup("lab", []), ["-p", "0x"], tmp_path / "config.yaml")
