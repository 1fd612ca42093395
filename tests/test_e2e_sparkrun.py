"""The sparkrun-shaped embedded cluster: a sparkrun v2 recipe and the real sparkrun's cluster files
on the head; `spark-ops apply --max-num-seqs 64` operates it end to end (real SSH, the reference
watchdog restarting the simulated engine from the sparkrun recipe), and the real sparkrun CLI on
the head renders the edited recipe's serve command with 64 (`sparkrun run --dry-run`).

What is not real here, and why (docs/test-ground.md): sparkrun's scheduler places ranks only on
accelerators its hardware probe detects, and the embedded nodes have none, so `sparkrun run`
itself cannot launch containers on them; the restart is the reference watchdog's recipe action.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import yaml
from conftest import Sim

from tests.ground import GroundUnavailable
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
