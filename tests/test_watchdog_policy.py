"""Restart policies read as watchdogs: systemd units and Docker restart policies, from the text the
head prints (tests/fixtures/watchdog_policy/cases.yaml), and from the real Docker of the ground;
on the embedded cluster, doctor's restart-policy check and the plan's crash-loop warning read the
engine's real container."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from spark_ops.watchdog.policy import (
    PolicyError,
    RestartPolicy,
    parse_docker_inspect,
    parse_systemctl_show,
    parse_unit_text,
)

CASES = yaml.safe_load(
    (Path(__file__).parent / "fixtures" / "watchdog_policy" / "cases.yaml").read_text()
)["cases"]


def read(case: dict) -> RestartPolicy:
    """Parse one case's text by its format."""
    fmt, text, unit = case["format"], case["text"], case.get("unit", "")
    if fmt == "show":
        return parse_systemctl_show(text, name=unit, source=f"systemctl show {unit}")
    if fmt == "cat":
        return parse_unit_text(text, name=unit, source=f"systemctl cat {unit}")
    return parse_docker_inspect(text, source="docker inspect")


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_policy_case(case: dict) -> None:
    """Each policy reads as the budget the case expects, or fails naming the value."""
    expect = case["expect"]
    if "error" in expect:
        with pytest.raises(PolicyError) as err:
            read(case)
        assert expect["error"] in err.value.message
        return
    policy = read(case)
    for key in ("restarts", "unlimited", "max_restarts", "window_s"):
        if key in expect:
            assert getattr(policy, key) == expect[key], (key, policy)
    if "note" in expect:
        assert expect["note"] in policy.describe(), policy.describe()
    words = policy.describe()
    if policy.unlimited:
        assert "nothing stops a crash loop" in words
    assert policy.to_dict()["text"] == words


@pytest.fixture
def ground() -> Iterator[object]:
    """The ground's real Docker (skips where that tier is absent)."""
    from ground.docker import DockerGround, docker_unavailable_reason

    reason = docker_unavailable_reason()
    if reason:
        pytest.skip(reason)
    g = DockerGround()
    try:
        yield g
    finally:
        g.close()


@pytest.mark.docker
@pytest.mark.parametrize(
    ("flag", "unlimited", "max_restarts"),
    [("no", False, None), ("always", True, None), ("unless-stopped", True, None),
     ("on-failure:3", False, 3), ("on-failure", True, None)],
)  # fmt: skip
def test_real_docker_restart_policy(
    ground: object, flag: str, unlimited: bool, max_restarts: int | None
) -> None:
    """`docker inspect` of a real container with each restart policy reads as its budget."""
    from ground.docker import docker

    name = f"spark-ops-policy-{os.getpid()}-{time.monotonic_ns() % 10**6}"
    c = ground.run(name, ["sleep", "300"], extra=["--restart", flag])  # type: ignore[attr-defined]
    policy = parse_docker_inspect(docker("inspect", c.id, timeout=30), source="docker inspect")
    assert policy.name == name
    assert policy.restarts == (flag != "no")
    assert policy.unlimited == unlimited
    assert policy.max_restarts == max_restarts


@pytest.fixture(scope="module")
def policy_sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """One embedded cluster, serving, shared by the module's restart-policy cases."""
    from conftest import start_sim

    from spark_ops.sim.control import down, wait_serving

    s = start_sim(tmp_path_factory.mktemp("policy") / "sim")
    try:
        wait_serving(s.state)
        yield s
    finally:
        down(s.root)


def _spark_ops(inventory: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The real CLI with this inventory."""
    env = dict(os.environ, SPARK_OPS_INVENTORY=str(inventory))
    env.pop("SPARK_OPS_CLUSTER", None)
    env.pop("SPARK_OPS_FLEET", None)
    return subprocess.run(
        [sys.executable, "-m", "spark_ops.cli.main", *args],
        env=env, capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip


def _policy_check(inventory: Path) -> dict:
    """doctor's restart-policy check (the one on the head)."""
    res = _spark_ops(inventory, "doctor", "--json")
    found = [c for c in json.loads(res.stdout)["checks"] if c["name"] == "restart-policy"]
    assert len(found) == 1, res.stdout + res.stderr
    return dict(found[0])


def _plan_warnings(inventory: Path) -> list[str]:
    """The warnings of a plan that restarts (nothing is changed)."""
    res = _spark_ops(inventory, "plan", "--max-num-seqs", "32", "--json")
    assert res.returncode == 0, res.stdout + res.stderr[-3000:]
    return list(json.loads(res.stdout)["plan"]["warnings"])


@pytest.mark.docker
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_doctor_and_the_plan_read_the_engines_container_policy(
    ground: object, policy_sim: object, tmp_path: Path
) -> None:
    """The engine's container (engine.log kind docker) is a real one restarting `on-failure`
    without a count: doctor's restart-policy warns that nothing stops a crash loop, with the
    `docker update` that gives it a budget, and the plan of a restart shows the warning. That
    fix run for real: doctor reads on-failure:3 as the budget (3 restarts in a row) and the plan
    warns no more."""
    from ground.docker import docker

    sim = policy_sim
    name = f"spark-ops-engine-{os.getpid()}-{time.monotonic_ns() % 10**6}"
    ground.run(name, ["sleep", "300"], extra=["--restart", "on-failure"])  # type: ignore[attr-defined]
    data = yaml.safe_load(sim.inventory.read_text())  # type: ignore[attr-defined]
    data["clusters"]["sim"]["engine"]["log"] = {"kind": "docker", "container": name}
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(yaml.safe_dump(data))

    check = _policy_check(inventory)
    assert check["status"] == "warn", check
    assert (
        f"docker {name}: restart=on-failure:0: no limit, nothing stops a crash loop"
        in (check["detail"])
    ), check
    assert check["fix"] == f"docker update --restart on-failure:3 {name}", check
    loop = [w for w in _plan_warnings(inventory) if "restart policy" in w]
    assert len(loop) == 1 and "nothing stops a crash loop" in loop[0], loop
    assert "restarts the engine again and again" in loop[0]

    docker(*check["fix"].split()[1:], timeout=30)  # the fix doctor named, on the real daemon
    check = _policy_check(inventory)
    assert check["status"] == "ok", check
    assert check["detail"] == (
        f"docker {name}: restart=on-failure:3: at most 3 restarts in a row (counted since the "
        "container was last started; a `docker restart` resets it)"
    ), check
    assert not [w for w in _plan_warnings(inventory) if "restart policy" in w]
