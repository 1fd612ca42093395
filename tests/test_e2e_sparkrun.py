"""The sparkrun-shaped embedded cluster: a sparkrun v2 recipe and the real sparkrun's cluster files
on the head, operated by `spark-ops apply --max-num-seqs 64` end to end.

- `test_apply_64_on_the_sparkrun_shaped_cluster` (no Docker): the reference watchdog restarts the
  simulated engine from the sparkrun recipe (its `recipe` action, spark-ops' sparkrun renderer),
  and the real `sparkrun run --dry-run` on the head renders the edited serve command with 64.
- `test_apply_64_through_the_real_sparkrun_run` (`docker`): the watchdog's `sparkrun` action —
  the real `sparkrun stop` / `sparkrun run --no-follow` — probes the four simulated GB10s over
  SSH, places one rank on each and starts its Ray head and worker containers on each node's own
  real dockerd; the simulated `ray` and engine run in those containers.

What is simulated, and why, is in docs/test-ground.md ("The real sparkrun").
"""

from __future__ import annotations

import json
import os
import re
import resource
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import Sim
from ground import GroundUnavailable
from ground.docker import IMAGE, LABEL, REPO
from ground.dockerd import NodeDaemons
from ground.sparkrun_venv import offline_env, run_sparkrun, sparkrun_bin
from test_e2e_apply import spark_ops, stamps

from spark_ops.discover.sparkrun import HEAD_LOG_COMMAND
from spark_ops.sim.cluster import SimError
from spark_ops.sim.control import restart_watchdog, wait_serving

pytestmark = pytest.mark.slow

RECIPE = Path(__file__).parent / "fixtures" / "sparkrun" / "glm-5.3-flash-sparkrun.yaml"


def sparkrun_shaped(sim: Sim) -> Path:
    """Put a sparkrun recipe and sparkrun's cluster files on the head; point spark-ops at them."""
    try:
        sparkrun_bin()
    except GroundUnavailable as exc:
        pytest.skip(str(exc))
    port = yaml.safe_load(sim.recipe.read_text())["defaults"]["port"]
    recipe = sim.head / "recipes" / "glm-5.3-flash-sparkrun.yaml"
    recipe.write_text(RECIPE.read_text().replace("port: 8000", f"port: {port}"))
    made = run_sparkrun(
        ["cluster", "create", "lab", "-H", "node1,node2,node3,node4", "--default"], sim.head
    )
    assert made.returncode == 0, made.stdout + made.stderr
    # sparkrun reaches hosts with OpenSSH: name the embedded nodes in an ssh_config it is given
    nodes = yaml.safe_load(sim.inventory.read_text())["clusters"]["sim"]["nodes"]
    keys = sim.root / "keys"
    ssh_config = sim.head / ".ssh" / "sparkrun_config"
    ssh_config.parent.mkdir(exist_ok=True)
    ssh_config.write_text(
        "".join(
            f"Host {name}\n  HostName 127.0.0.1\n  Port {spec['port']}\n"
            for name, spec in nodes.items()
        )
        + f"Host *\n  IdentityFile {keys / 'client_ed25519'}\n  IdentitiesOnly yes\n"
        + f"  UserKnownHostsFile {keys / 'known_hosts'}\n  StrictHostKeyChecking yes\n"
    )
    (sim.head / ".config" / "sparkrun" / "config.yaml").write_text(
        yaml.safe_dump({"ssh": {"options": ["-F", str(ssh_config)]}})
    )
    wd = sim.head / ".config" / "spark-watchdog.yaml"
    wd.write_text(wd.read_text().replace(str(sim.recipe), str(recipe)))
    inv = sim.inventory.read_text()
    sim.inventory.write_text(inv.replace(sim.recipe.name, recipe.name))
    return recipe


def apply_64(
    cli_env: dict[str, str], recipe: Path, before: str
) -> tuple[dict[str, Any], list[tuple[str, str]]]:
    """`spark-ops apply --max-num-seqs 64`, which must succeed: its report and the recipe's
    changed (before, after) line pairs."""
    res = spark_ops(cli_env, "apply", "--max-num-seqs", "64", "--yes", "--json")
    assert res.returncode == 0, (res.stdout + res.stderr)[-6000:]
    out = json.loads(res.stdout)
    assert out["ok"] is True
    lines = zip(before.splitlines(), recipe.read_text().splitlines(), strict=True)
    return out, [(a, b) for a, b in lines if a != b]


def test_apply_64_on_the_sparkrun_shaped_cluster(sim: Sim, cli_env: dict[str, str]) -> None:
    """6 → 64: one line of the sparkrun recipe, restart, 64 served, planned stamp pruned."""
    recipe = sparkrun_shaped(sim)
    before_recipe = recipe.read_text()
    before_stamps = stamps(sim)
    assert len(before_stamps) == 1, "the embedded cluster starts with one earlier restart"
    shown = spark_ops(cli_env, "recipe", "show", str(recipe), "--json")
    assert json.loads(shown.stdout)["max_num_seqs"] == 6, shown.stderr

    out, changed = apply_64(cli_env, recipe, before_recipe)
    assert changed == [
        (
            "  max_num_seqs: 6          # interactive default; raise for batch work",
            "  max_num_seqs: 64          # interactive default; raise for batch work",
        )
    ]
    assert out["stamp"] is not None and out["pruned"] == [out["stamp"]]
    assert stamps(sim) == before_stamps, "the planned stamp is gone and the earlier one remains"
    assert out["boot"]["non_default_args"]["max_num_seqs"] == 64
    assert "'max_num_seqs': 64" in (sim.head / "engine.log").read_text()

    dry = run_sparkrun(
        ["run", str(recipe), "--cluster", "lab", "--dry-run", "--offline", "--no-auto-detect"],
        sim.head,
        isolate=False,  # it must reach the embedded nodes (loopback): its own switches only
    )
    assert dry.returncode == 0, dry.stdout + dry.stderr
    served = dry.stdout[dry.stdout.index("Serve command:") :]
    assert len(re.findall(r"--max-num-seqs 64\b", served)) == 1, served
    assert "--max-num-seqs 6 " not in served
    shutil.rmtree(sim.head / ".cache" / "sparkrun", ignore_errors=True)


def launchable(sim: Sim, recipe: Path, daemons: NodeDaemons) -> None:
    """Make the sparkrun-shaped cluster one that `sparkrun run` launches on, each part through
    sparkrun's own options (docs/test-ground.md says why each is needed):

    - every node: a GB10 `nvidia-smi` (the simulated GPU tool), its own dockerd (`DOCKER_HOST`)
      and `SPARKRUN_MGMT_IFACE=lo` (sparkrun's management interface: loopback, 127.0.0.1) in
      its SSH environment;
    - sparkrun's cluster file: `executor_config` (no `--gpus`, a `nofile` limit this machine
      allows, read-only mounts of /usr and of the containers' `ray`/`vllm` and a copy of
      spark_ops) and no
      model distribution (the engine is simulated: no weights);
    - the recipe's `env`: the simulated `ray`/`vllm` first on PATH, that copy on PYTHONPATH
      (Debian's /usr/bin/python3 runs them), the simulated engine's config.
    """
    from spark_ops.sim.nvidia_smi import install
    from spark_ops.sim.ray import install as install_ray

    for node in (sim.root / "nodes").iterdir():
        install(node / "bin")
        env = {**daemons.environment(node.name), "SPARKRUN_MGMT_IFACE": "lo"}
        (node / ".ssh").mkdir(exist_ok=True)
        (node / ".ssh" / "environment").write_text("".join(f"{k}={v}\n" for k, v in env.items()))
    container = sim.root / "container"
    install_ray(container / "bin")
    # sparkrun refuses to bind-mount anything under /root: the containers get a copy of the
    # package (and of the venv's libraries when the venv lives there) beside their tools
    skip = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(REPO / "spark_ops", container / "src" / "spark_ops", ignore=skip)
    config = (sim.root / "engine.yaml").read_text()  # its `base:` is the package's own asset
    config = config.replace(str(REPO / "spark_ops"), str(container / "src" / "spark_ops"))
    (container / "engine.yaml").write_text(config)
    site = Path(sysconfig.get_paths()["purelib"])  # the engine's aiohttp, PyYAML (same 3.x)
    if site.resolve().is_relative_to("/root"):
        shutil.copytree(site, container / "site", ignore=skip, symlinks=True)
        site = container / "site"
    cluster_file = sim.head / ".config" / "sparkrun" / "clusters" / "lab.yaml"
    cluster = yaml.safe_load(cluster_file.read_text())
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    cluster["executor_config"] = {
        "accelerator_vendor": "cpu",  # no --gpus: these dockerds have no NVIDIA runtime
        "ulimit": [f"nofile={nofile}:{nofile}"],  # sparkrun's memlock=-1 is refused here
        "volumes": [
            "/usr:/usr:ro",
            f"{container}:{container}:ro",
            f"{site}:{site}:ro",
        ],
    }
    cluster["distribution"] = {"model": {"enabled": False}}  # no weights: the engine is simulated
    cluster_file.write_text(yaml.safe_dump(cluster, sort_keys=False))
    env = {
        "PATH": f"{container / 'bin'}:/usr/bin:/bin",
        "PYTHONPATH": f"{container / 'src'}:{site}",
        "PYTHONDONTWRITEBYTECODE": "1",
        "SPARK_SIM_CONFIG": str(container / "engine.yaml"),
        # Ray's --node-ip-address in sparkrun's `ray start` is the container's $NODE_IP, which
        # sparkrun sets only from a detected InfiniBand fabric; the embedded nodes have none
        "NODE_IP": "127.0.0.1",
    }
    text = recipe.read_text()
    lines = "".join(f"  {k}: {json.dumps(v)}\n" for k, v in env.items())
    recipe.write_text(text.replace("\nenv:\n", f"\nenv:\n{lines}", 1))


def sparkrun_action(sim: Sim, recipe: Path, label: str) -> None:
    """The head's watchdog restarts with sparkrun's own `stop` / `run --no-follow`, offline."""
    cfg = sim.head / ".config" / "spark-watchdog.yaml"
    data = yaml.safe_load(cfg.read_text())
    env = offline_env(sim.head)
    data["action"] = {
        "kind": "sparkrun",
        "recipe": str(recipe),
        "cluster": "lab",
        "sparkrun": ["env", *(f"{k}={v}" for k, v in env.items()), str(sparkrun_bin())],
        "run_options": ["--offline", "--no-auto-detect", "--image", IMAGE, "--label", label],
        "stop_timeout": 10,
        "timeout": 240,
    }
    cfg.write_text(yaml.safe_dump(data, sort_keys=False))
    inv = sim.inventory.read_text()
    inv = inv.replace(
        "log: {kind: file, path: ~/engine.log}",
        f"log: {{kind: command, command: {json.dumps(HEAD_LOG_COMMAND)}}}",
    )
    sim.inventory.write_text(
        "".join(line for line in inv.splitlines(True) if "pid_file:" not in line)
    )


def sparkrun_containers(daemons: NodeDaemons) -> dict[str, list[tuple[str, str]]]:
    """Each node's running `sparkrun_*` containers on its own daemon: (name, id)."""
    out: dict[str, list[tuple[str, str]]] = {}
    for name in daemons.names:
        rows = daemons.docker(name, "ps", "--filter", "name=^sparkrun_", "--format",
                              "{{.Names}} {{.ID}}")  # fmt: skip
        out[name] = [(r.split()[0], r.split()[1]) for r in rows.splitlines() if r.strip()]
    return out


def launch_report(sim: Sim, daemons: NodeDaemons) -> str:
    """What a launch that did not serve left: the action's log, each node's containers, the
    head container's serve log."""
    parts = [(sim.head / "engine.log").read_text(errors="replace")[-4000:]]
    for node in daemons.names:
        parts.append(f"--- {node}: " + daemons.docker(node, "ps", "-a", check=False))
        for cid in daemons.docker(node, "ps", "-aq", check=False).split():
            parts.append(daemons.docker(node, "logs", "--tail", "30", cid, check=False))
            if node == "node1":
                parts.append(daemons.docker(node, "exec", cid, "cat", "/tmp/sparkrun_serve.log",
                                            check=False)[-3000:])  # fmt: skip
    return "\n".join(parts)


@pytest.mark.docker
def test_apply_64_through_the_real_sparkrun_run(
    sim: Sim, cli_env: dict[str, str], node_daemons: NodeDaemons
) -> None:
    """6 → 64 through the reference watchdog's `sparkrun` action: the real `sparkrun stop` and
    `sparkrun run --no-follow` relaunch the Ray head and worker containers on the four nodes'
    daemons, the simulated engine in the head container serves with 4 ranks, the planned stamp
    is pruned and the earlier one kept."""
    debian = subprocess.run(
        ["/usr/bin/python3", "-c", "import sys; print(sys.version_info[:2])"],
        capture_output=True, text=True, check=False,
    ).stdout.strip()  # fmt: skip
    if debian != str(sys.version_info[:2]):
        mine = sys.version_info[:2]
        pytest.skip(f"/usr/bin/python3 is {debian or 'missing'}, this Python {mine}: the"
                    " containers' Python cannot use this one's site-packages")  # fmt: skip
    recipe = sparkrun_shaped(sim)
    launchable(sim, recipe, node_daemons)
    label = f"{LABEL}={os.getpid()}"
    sparkrun_action(sim, recipe, label)
    try:
        restart_watchdog(sim.root)  # the engine now comes up by the real `sparkrun run`
        try:
            wait_serving(sim.state, timeout=120)
        except SimError as exc:
            raise AssertionError(f"{exc}\n{launch_report(sim, node_daemons)}") from exc
        launched = (sim.head / "engine.log").read_text()  # the action's output: sparkrun's
        assert "Platform:  DGX Spark (NVIDIA GB10" in launched, launched[-3000:]
        rows = re.findall(r"^\s+(?:head|worker)\s+(node\d)\s+gb10\s", launched, re.M)
        assert rows == ["node1", "node2", "node3", "node4"], launched[-3000:]
        assert "Offline: every image and model is present" in launched
        before = sparkrun_containers(node_daemons)
        assert [len(v) for v in before.values()] == [1, 1, 1, 1], before
        ((head_name, _),) = before["node1"]
        assert re.fullmatch(r"sparkrun_[0-9a-f]+_[0-9a-f]+_head", head_name), head_name
        for node in ("node2", "node3", "node4"):
            assert before[node][0][0] == head_name.replace("_head", "_worker"), before
        before_recipe = recipe.read_text()
        before_stamps = stamps(sim)

        out, changed = apply_64(cli_env, recipe, before_recipe)
        assert len(changed) == 1 and "max_num_seqs: 64 " in changed[0][1], changed
        assert out["stamp"] is not None and out["pruned"] == [out["stamp"]]
        assert stamps(sim) == before_stamps, "the planned stamp is gone and the earlier one remains"
        assert out["boot"]["non_default_args"]["max_num_seqs"] == 64

        after = sparkrun_containers(node_daemons)
        assert [len(v) for v in after.values()] == [1, 1, 1, 1], after
        for node in node_daemons.names:
            assert after[node][0][1] != before[node][0][1], f"{node}: not relaunched"
        ((new_head, _),) = after["node1"]
        log = node_daemons.docker("node1", "exec", new_head, "cat", "/tmp/sparkrun_serve.log")
        assert "'max_num_seqs': 64" in log, log[-3000:]
        assert len(re.findall(r"Ray worker \S+ at \S+ joined the placement group", log)) == 3, log
        assert (sim.head / "engine.log").read_text().count("Step 5/5: Executing serve command") == 2
    finally:
        (sim.head / ".local" / "state" / "spark-watchdog" / "pause").touch()
        for node in node_daemons.names:
            ids = node_daemons.docker(node, "ps", "-aq", check=False).split()
            if ids:
                node_daemons.docker(node, "rm", "-f", *ids, check=False)
        shutil.rmtree(sim.head / ".cache" / "sparkrun", ignore_errors=True)
