"""The sparkrun-shaped embedded cluster: a sparkrun v2 recipe and the real sparkrun's cluster files
on the head; `spark-ops apply --max-num-seqs 64` operates it end to end (real SSH, the reference
watchdog restarting the simulated engine from the sparkrun recipe), and the real sparkrun CLI on
the head renders the edited recipe's serve command with 64 (`sparkrun run --dry-run`).

What is not real here, and why (docs/test-ground.md): the restart of the apply test is the
reference watchdog's recipe action, because `sparkrun run` cannot yet bring a 4-node Ray job up on
the embedded nodes. The second test shows how far it gets: with a simulated GB10 `nvidia-smi` on
each node (the one simulated part), the real `sparkrun run` probes and places on all four nodes
and runs its Ray head container on the real Docker daemon, which exits (the image has no Ray).
"""

from __future__ import annotations

import json
import os
import re
import resource
import shutil
from pathlib import Path

import pytest
import yaml
from conftest import Sim

from tests.ground import GroundUnavailable
from tests.ground.docker import IMAGE, LABEL, REPO, docker, docker_unavailable_reason, ensure_image
from tests.ground.sparkrun_venv import run_sparkrun, sparkrun_bin
from tests.test_e2e_apply import spark_ops, stamps

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


def test_apply_64_on_the_sparkrun_shaped_cluster(sim: Sim, cli_env: dict[str, str]) -> None:
    """6 → 64: one line of the sparkrun recipe, restart, 64 served, planned stamp pruned."""
    recipe = sparkrun_shaped(sim)
    before_recipe = recipe.read_text()
    before_stamps = stamps(sim)
    assert len(before_stamps) == 1, "the embedded cluster starts with one earlier restart"
    shown = spark_ops(cli_env, "recipe", "show", str(recipe), "--json")
    assert json.loads(shown.stdout)["max_num_seqs"] == 6, shown.stderr

    res = spark_ops(cli_env, "apply", "--max-num-seqs", "64", "--yes", "--json")
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout)
    assert out["ok"] is True
    changed = [
        (a, b)
        for a, b in zip(before_recipe.splitlines(), recipe.read_text().splitlines(), strict=True)
        if a != b
    ]
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


def launchable(sim: Sim, recipe: Path) -> dict[str, object]:
    """Make the sparkrun-shaped cluster one that `sparkrun run` places and launches on: a GB10
    `nvidia-smi` on every node (the simulated GPU tool), and in sparkrun's cluster file the
    executor and distribution keys this ground needs (docs/test-ground.md says why each)."""
    from spark_ops.sim.nvidia_smi import install

    for node in (sim.root / "nodes").iterdir():
        install(node / "bin")
    cluster_file = sim.head / ".config" / "sparkrun" / "clusters" / "lab.yaml"
    cluster = yaml.safe_load(cluster_file.read_text())
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    cluster["executor_config"] = {
        "accelerator_vendor": "cpu",  # no --gpus: this dockerd has no NVIDIA runtime
        "ulimit": [f"nofile={nofile}:{nofile}"],  # sparkrun's memlock=-1 is refused here
        "volumes": ["/usr:/usr:ro", f"{REPO}:{REPO}:ro"],
    }
    cluster["distribution"] = {"model": {"enabled": False}}  # no weights: the engine is simulated
    cluster_file.write_text(yaml.safe_dump(cluster, sort_keys=False))
    return cluster


@pytest.mark.docker
def test_sparkrun_run_places_on_the_simulated_gb10s_and_starts_its_head_container(
    sim: Sim,
) -> None:
    """The real `sparkrun run` probes the four nodes (GB10 each), passes its offline checks and
    runs its Ray head container `sparkrun_<intent>_<token>_head` on the real Docker daemon; the
    launch stops there: the image has no Ray (`ray start --head` exits), which sparkrun reports
    as its head not running. See docs/test-ground.md for what is left."""
    reason = docker_unavailable_reason()
    if reason:
        pytest.skip(reason)
    ensure_image()
    recipe = sparkrun_shaped(sim)
    launchable(sim, recipe)
    label = f"{LABEL}={os.getpid()}"
    try:
        run = run_sparkrun(
            [
                "run", str(recipe), "--cluster", "lab", "--offline", "--no-auto-detect",
                "--no-follow", "--image", IMAGE, "--label", label,
            ],
            sim.head,
            isolate=False,  # it must reach the embedded nodes (loopback): its own switches only
        )  # fmt: skip
        out = run.stdout + run.stderr
        assert "Platform:  DGX Spark (NVIDIA GB10" in out, out[-3000:]
        rows = re.findall(r"^\s+(?:head|worker)\s+(node\d)\s+gb10\s", out, re.M)
        assert rows == ["node1", "node2", "node3", "node4"], out[-3000:]
        assert "Offline: every image and model is present" in out, out[-3000:]
        assert "Step 3/5: Launching Ray head" in out, out[-3000:]
        head = re.search(r"Workload (sparkrun_[0-9a-f]+_[0-9a-f]+_head) is not running", out)
        assert head is not None, out[-3000:]
        assert run.returncode != 0
    finally:
        ids = docker("ps", "-aq", "--filter", f"label={label}", check=False).split()
        for cid in ids:
            docker("rm", "-f", cid, check=False)
        shutil.rmtree(sim.head / ".cache" / "sparkrun", ignore_errors=True)
