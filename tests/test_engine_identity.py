"""Engine-instance identity from what the head prints (pid file + /proc, docker inspect,
systemctl show), and the boot history's key: data-driven (tests/fixtures/engine/)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from spark_ops.engine.instance import (
    EngineInstance,
    _parse_docker,
    _parse_systemd,
    is_new,
    parse_pid_probe,
    started_after,
)
from spark_ops.inventory import parse_inventory
from spark_ops.readiness import history_key

CASES = yaml.safe_load(
    (Path(__file__).parent / "fixtures" / "engine" / "identity.yaml").read_text(encoding="utf-8")
)
PARSERS = {"pid_file": lambda t: parse_pid_probe(t, None), "docker": _parse_docker,
           "systemd": _parse_systemd}  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_identity(case: dict[str, Any]) -> None:
    """Each head output gives the instance the case names."""
    inst = PARSERS[case["source"]](case["output"])
    if case.get("none"):
        assert inst is None
        return
    assert inst is not None and inst.alive is case["alive"]
    if "key" in case:
        assert inst.key == case["key"]
    if "pgid" in case:
        assert inst.pgid == case["pgid"]
    if "members" in case:
        assert [p.label() for p in inst.members] == case["members"]
    if "engine" in case:  # the one rule verify, identity and leftovers use (engine_process)
        assert (inst.engine.pid if inst.engine else None) == case["engine"]
        assert inst.engine_pid == (case["engine"] or inst.pid)
        assert inst.label() == case["label"]
    if "engine_started_at" in case:
        assert inst.engine_started_at == case["engine_started_at"]


def test_new_instance_rules() -> None:
    """The pid file still naming the outgoing (now dead) engine is not a new engine; another key
    is; with no outgoing instance, the start time decides."""
    old = EngineInstance("pid_file", "10@5.0", True, 10, 5.0)
    assert is_new(EngineInstance("pid_file", "10@gone", False, 10), old, 100.0) is False
    assert is_new(EngineInstance("pid_file", "11@101.0", True, 11, 101.0), old, 100.0) is True
    assert is_new(EngineInstance("pid_file", "11@101.0", True, 11, 101.0), None, 100.0) is True
    # a live engine on a reused pid is the new one: its start time differs from the old one's
    assert is_new(EngineInstance("pid_file", "10@101.0", True, 10, 101.0), old, 100.0) is True
    assert is_new(EngineInstance("pid_file", "9@50.0", True, 9, 50.0), None, 100.0) is False
    # process_start_time_seconds may read up to 1 s early (whole-second boot time)
    assert started_after(99.4, 100.0, None) and not started_after(97.0, 100.0, None)
    assert not started_after(101.0, 100.0, 101.0), "the same API server as before the restart"


def _cluster(name: str, head: str, recipe: str) -> Any:
    """A one-node cluster."""
    text = (
        f"clusters:\n  {name}:\n    nodes: {{n1: {{host: {head}, role: head}}}}\n"
        f"    recipe: {{path: {recipe}}}\n    watchdog: {{restart_command: x, history_file: h}}\n"
    )
    return parse_inventory(text, "t").cluster()


def test_boot_history_keyed_by_cluster_identity() -> None:
    """The same head and recipe under two names share a history; same name, other head not."""
    a = history_key(_cluster("prod", "head-a.example", "~/r.yaml"))
    assert a == history_key(_cluster("spark", "head-a.example", "~/r.yaml"))
    assert a != history_key(_cluster("prod", "head-b.example", "~/r.yaml"))
    assert a != history_key(_cluster("prod", "head-a.example", "~/other.yaml"))
