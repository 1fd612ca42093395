"""Restart policies read as watchdogs: systemd units and Docker restart policies, from the text the
head prints (tests/fixtures/watchdog_policy/cases.yaml), and from the real Docker of the ground."""

from __future__ import annotations

import os
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
