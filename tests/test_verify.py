"""Tests of spark_ops.verify: data-driven parser cases on real and realistic output, and checks."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
import yaml

from spark_ops import verify
from spark_ops.verify import (
    Check,
    ComputeApp,
    ParseError,
    check_effective_args,
    check_kv_pool,
    check_mem_available,
    check_no_new_xid,
    check_no_stale_gpu_processes,
    check_ray_nodes,
    missing_nodes,
    parse_compute_apps,
    parse_meminfo,
    parse_non_default_args,
    parse_ray_nodes,
    parse_ray_status,
    parse_xid_lines,
)

FIXTURES = Path(__file__).parent / "fixtures" / "verify"
CASES = yaml.safe_load((FIXTURES / "cases.yaml").read_text(encoding="utf-8"))
GB = 1024**3


def _plain(value: Any) -> Any:
    """A parser result as plain data (to_dict on dataclasses, lists for tuples)."""
    if hasattr(value, "to_dict"):
        return _plain(value.to_dict())
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _match(actual: Any, expected: Any, where: str = "") -> None:
    """Dicts: the expected keys only; lists: element by element; else equality."""
    if isinstance(expected, dict):
        assert isinstance(actual, dict), f"{where}: {actual!r} is not a mapping"
        for key, value in expected.items():
            assert key in actual, f"{where}.{key} missing"
            _match(actual[key], value, f"{where}.{key}")
    elif isinstance(expected, list):
        assert isinstance(actual, list), f"{where}: {actual!r} is not a list"
        assert len(actual) == len(expected), f"{where}: {len(actual)} items, want {len(expected)}"
        for i, (a, e) in enumerate(zip(actual, expected, strict=True)):
            _match(a, e, f"{where}[{i}]")
    else:
        assert actual == expected, f"{where}: {actual!r} != {expected!r}"


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_parser_case(case: dict[str, Any]) -> None:
    """Each parser case of cases.yaml gives the expected data or error."""
    parser = getattr(verify, case["parser"])
    text = (FIXTURES / case["file"]).read_text(encoding="utf-8") if "file" in case else case["text"]
    kwargs = case.get("kwargs") or {}
    if "error" in case:
        with pytest.raises(ParseError) as info:
            parser(text, **kwargs)
        assert case["error"] in info.value.message
        return
    _match(_plain(parser(text, **kwargs)), case["expect"], case["parser"])


# ---- checks ----------------------------------------------------------------------------------


def _moe_args() -> dict[str, Any]:
    """Effective args of the real MoE boot."""
    return parse_non_default_args(
        (FIXTURES.parent / "readiness" / "serve-startup-moe.log").read_text(encoding="utf-8")
    )


def test_effective_args_match() -> None:
    """The real boot's args match the recipe values, including text values from YAML."""
    check = check_effective_args(
        _moe_args(),
        {"max_num_seqs": 64, "--enforce-eager": True, "kv-cache-memory-bytes": "268435456"},
        host="node1",
    )
    assert check.ok, check.detail
    assert check.host == "node1" and check.fix == ""
    assert "max_num_seqs=64" in check.detail


def test_effective_args_mismatch_names_each_key() -> None:
    """A wrong value and a missing flag are both named, with a fix."""
    check = check_effective_args(
        _moe_args(), {"max_num_seqs": 6, "moe_backend": "marlin", "enable_prefix_caching": False}
    )
    assert not check.ok
    assert "max_num_seqs: expected 6, engine has 64" in check.detail
    assert "moe_backend: expected 'marlin', not among the non-default args" in check.detail
    assert "enable_prefix_caching" not in check.detail  # False = default, not listed
    assert check.fix


def test_effective_args_give_bytes_in_gib() -> None:
    """The effective-args line a person reads says 60 GiB for --kv-cache-memory-bytes; a
    mismatch shows the bytes too (two sizes can look alike in GiB)."""
    ok = check_effective_args(
        {"max_num_seqs": 64, "kv_cache_memory_bytes": 64424509440},
        {"max_num_seqs": 64, "kv_cache_memory_bytes": 64424509440},
    )
    assert ok.ok and ok.detail == "as expected: max_num_seqs=64, kv_cache_memory_bytes=60 GiB"
    bad = check_effective_args(
        {"kv_cache_memory_bytes": 64424509440}, {"kv_cache_memory_bytes": 1610612736}
    )
    assert (
        "kv_cache_memory_bytes: expected 1.5 GiB (1610612736), engine has 60 GiB (64424509440)"
        in bad.detail
    )


def test_effective_args_bool_text() -> None:
    """'true' from a recipe equals True; 'false' does not."""
    assert check_effective_args({"enforce_eager": True}, {"enforce_eager": "true"}).ok
    assert not check_effective_args({"enforce_eager": True}, {"enforce_eager": "false"}).ok


def test_kv_pool() -> None:
    """Same pool passes; a changed pool fails unless the KV memory was changed on purpose."""
    assert check_kv_pool(2_596_374, 2_596_374).ok
    bad = check_kv_pool(1_298_187, 2_596_374, host="node1")
    assert not bad.ok and "1,298,187" in bad.detail and "2,596,374" in bad.detail and bad.fix
    assert check_kv_pool(1_298_187, 2_596_374, kv_memory_changed=True).ok
    assert check_kv_pool(2_596_374, None).ok
    gib60 = 64_424_509_440
    assert check_kv_pool(
        1_298_187, 2_596_374, kv_memory_bytes=gib60 // 2, previous_kv_memory_bytes=gib60
    ).ok
    assert not check_kv_pool(
        1_298_187, 2_596_374, kv_memory_bytes=gib60, previous_kv_memory_bytes=gib60
    ).ok
    assert not check_kv_pool(None, 2_596_374).ok


def test_mem_available_threshold() -> None:
    """The note's 26-27 GB free passes a 20 GiB floor; a starved node fails."""
    ok = check_mem_available(
        parse_meminfo((FIXTURES / "meminfo-worker.txt").read_text()), min_bytes=20 * GB, host="n2"
    )
    assert ok.ok and "26.6 GiB" in ok.detail
    low = check_mem_available(
        parse_meminfo((FIXTURES / "meminfo-low.txt").read_text()), min_bytes=20 * GB
    )
    assert not low.ok and low.fix
    assert not check_mem_available({"MemTotal": 1}, min_bytes=1).ok
    assert check_mem_available(5 * GB, min_bytes=5 * GB).ok


def test_no_new_xid() -> None:
    """Only events at or after the restart count."""
    events = parse_xid_lines((FIXTURES / "xid-journalctl.txt").read_text(), year=2026)
    restart = datetime(2026, 11, 30, 0, 30, tzinfo=timezone.utc)
    check = check_no_new_xid(events, since=restart, host="node2")
    assert not check.ok
    assert "2 Xid event(s)" in check.detail
    assert "43 (GPU stopped processing)" in check.detail and "119 (GSP RPC Timeout)" in check.detail
    assert "13 (" not in check.detail
    later = datetime(2026, 11, 30, 1, 0, tzinfo=timezone.utc)
    assert check_no_new_xid(events, since=later).ok
    assert check_no_new_xid([], since=later).ok


def test_xid_dmesg_needs_boot_time() -> None:
    """dmesg lines are dated with the node's boot time; without it they count as new."""
    events = parse_xid_lines((FIXTURES / "xid-dmesg.txt").read_text())
    boot = datetime(2026, 11, 29, 23, 0, tzinfo=timezone.utc)
    restart = boot + timedelta(seconds=2000)
    check = check_no_new_xid(events, since=restart, boot_time=boot)
    assert not check.ok and "1 Xid event(s)" in check.detail and "79" in check.detail
    undated = check_no_new_xid(events, since=restart)
    assert not undated.ok and "could not be dated" in undated.detail


def test_no_stale_gpu_processes() -> None:
    """A GPU process older than the restart is stale; unknown start times are noted."""
    apps = parse_compute_apps((FIXTURES / "compute-apps-gb10-noheader.csv").read_text())
    restart = 1_796_000_000.0
    ok = check_no_stale_gpu_processes(
        apps, {412233: restart + 30, 412871: restart + 40}, restart_at=restart
    )
    assert ok.ok and "2 GPU process(es)" in ok.detail
    stale = check_no_stale_gpu_processes(
        apps,
        {412233: restart - 600, 412871: restart + 40},
        restart_at=datetime.fromtimestamp(restart, timezone.utc),
        host="node3",
    )
    assert not stale.ok and "412233 /usr/bin/python3" in stale.detail and stale.fix
    unknown = check_no_stale_gpu_processes([ComputeApp(7, "python3", None)], {}, restart_at=restart)
    assert unknown.ok and "unknown for pid 7" in unknown.detail


def test_ray_checks_on_real_output() -> None:
    """Active node count against the TP node count; IPs name the dead node."""
    up = parse_ray_status((FIXTURES / "ray" / "status_3_nodes_up.txt").read_text())
    dead = parse_ray_status((FIXTURES / "ray" / "status_worker_dead.txt").read_text())
    down = parse_ray_status((FIXTURES / "ray" / "status_head_down.txt").read_text())
    assert check_ray_nodes(up, expected=3).ok
    assert not check_ray_nodes(dead, expected=3).ok
    assert "unreachable" in check_ray_nodes(down, expected=3).detail
    nodes = parse_ray_nodes((FIXTURES / "ray" / "list_nodes_worker_dead_json.txt").read_text())
    expected = {"node1": "127.0.0.2", "node2": "127.0.0.3", "node3": "127.0.0.4"}
    assert missing_nodes(expected, nodes) == ["node3"]
    fresh = parse_ray_nodes(
        (FIXTURES / "ray" / "list_nodes_worker_killed_not_yet_detected_json.txt").read_text()
    )
    assert missing_nodes(expected, fresh) == []


def test_check_serializes() -> None:
    """Check.to_dict carries every field; a warning is not a failure."""
    c = Check("kv-pool", "node1", "fail", "x", "y")
    assert c.to_dict() == {
        "name": "kv-pool",
        "host": "node1",
        "status": "fail",
        "ok": False,
        "detail": "x",
        "fix": "y",
    }
    assert Check("kv-pool", "node1", "warn", "x").ok


def test_one_check_type() -> None:
    """doctor and post-boot verification report in the same Check type."""
    from spark_ops.doctor import Check as DoctorCheck
    from spark_ops.doctor.report import DoctorReport

    assert DoctorCheck is Check
    report = DoctorReport("c1", "inv.yaml")
    assert type(report.add("ssh", "node1", "fail", "no answer", "start sshd")) is Check


def test_bad_memory_value_is_an_error() -> None:
    """A memory column that is neither a size nor N/A is reported, not guessed."""
    with pytest.raises(ParseError, match="not `N MiB`"):
        parse_compute_apps("123, python3, lots\n")
