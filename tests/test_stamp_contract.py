"""The stamp contract's pure rules, from data: the restart command's placeholders (one pass, one
quoted word each, run through a real bash) and which history entry a forced restart wrote."""

from __future__ import annotations

import dataclasses
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from embedded import start_nodes

from spark_ops.errors import AmbiguousStamp, WatchdogError
from spark_ops.remote import ClusterSession
from spark_ops.watchdog import history
from spark_ops.watchdog.contract import Trigger, WatchdogContract, fill_restart_command
from spark_ops.watchdog.history import parse_history
from spark_ops.watchdog.identify import HistEntry, identify, record_kind

FIXTURES = Path(__file__).parent / "fixtures" / "stamps"
COMMANDS = yaml.safe_load((FIXTURES / "restart_command.yaml").read_text(encoding="utf-8"))
IDENTIFY = yaml.safe_load((FIXTURES / "identify.yaml").read_text(encoding="utf-8"))
WINDOW = yaml.safe_load(
    (FIXTURES.parent / "watchdog" / "identify_window.yaml").read_text(encoding="utf-8")
)


@pytest.mark.parametrize("case", COMMANDS, ids=[c["name"] for c in COMMANDS])
def test_restart_command(case: dict[str, Any], tmp_path: Path) -> None:
    """bash receives each value as one word, whatever it holds; nothing in a value runs."""
    reason = case.get("reason", "")
    if "reason_bytes" in case:  # what Python makes of invalid UTF-8 on the command line
        reason = case["reason_bytes"].encode("latin-1").decode("utf-8", "surrogateescape")
    values = {"reason": reason, "by": case["by"]}
    if "error" in case:
        with pytest.raises(WatchdogError, match=case["error"].replace("{", r"\{")):
            fill_restart_command(case["template"], values)
        return
    line = fill_restart_command(case["template"], values)
    assert line.startswith("wd ")
    probe = "printf '%s\\0' " + line[3:]
    res = subprocess.run(
        ["bash", "-c", probe], cwd=tmp_path, capture_output=True, check=True,
        env={**os.environ, "HOME": str(tmp_path)},
    )  # fmt: skip
    words = res.stdout.decode().split("\0")[:-1]
    expected = [w.replace("@HOME@", str(tmp_path)) for w in case["words"]]
    assert words == expected
    assert not list(tmp_path.iterdir()), "a value ran as a command"


def _entries(lines: list[str]) -> list[HistEntry]:
    """Parse history lines with the parser sent to the head."""
    hist = parse_history("".join(f"{x}\n" for x in lines).encode(), fmt="auto")
    return [
        HistEntry(float(e.stamp), hist.lines[e.line - 1].decode(), e.record) for e in hist.entries
    ]


@pytest.mark.parametrize("case", IDENTIFY, ids=[c["name"] for c in IDENTIFY])
def test_identify(case: dict[str, Any]) -> None:
    """The planned entry, none (with what to run), or every racing candidate named."""
    kwargs = {
        "window": tuple(case["window"]),
        "reported": case.get("reported"),
        "reports_stamp": case["reports_stamp"],
        "printed": case.get("printed", ()),
        "journal": case.get("journal", ()),
    }
    before, after = _entries(case["before"]), _entries(case["after"])
    if "ambiguous" in case:
        with pytest.raises(AmbiguousStamp) as info:
            identify(before, after, **kwargs)  # type: ignore[arg-type]
        assert "none pruned" in info.value.message
        hint = info.value.hint or ""
        for needle in case["ambiguous"]:
            assert needle in hint
            hint = hint.replace(needle, "", 1)
        return
    got = identify(before, after, **kwargs)  # type: ignore[arg-type]
    if case.get("none"):
        assert got.entry is None
    elif "raws" in case:  # several planned-looking entries: every one identified
        assert [e.raw for e in got.entries] == case["raws"]
    else:
        assert [e.raw for e in got.entries] == [case["raw"]]
    if "how" in case:
        assert got.how == case["how"]
    if "note" in case:
        assert any(case["note"] in n for n in got.notes), got.notes


@pytest.mark.parametrize("case", WINDOW, ids=[c["name"] for c in WINDOW])
async def test_contract_identify_window(case: dict[str, Any], tmp_path: Path) -> None:
    """The head-clock window of a real restart's identification: stamps just inside are taken,
    just outside (either side) named with the command that removes them, never taken."""
    nodes, cluster = await start_nodes(tmp_path, 1)
    wd = dataclasses.replace(cluster.watchdog, reports_stamp=case.get("reports_stamp", False))
    history = nodes[0].spec.home / "h"
    try:
        async with ClusterSession(dataclasses.replace(cluster, watchdog=wd)) as session:
            await session.connect()
            contract = WatchdogContract(session)
            history.write_text("".join(f"{x}\n" for x in case["before"]))
            before = await contract.entries()
            history.write_text("".join(f"{x}\n" for x in case["after"]))
            t = case["trigger"]
            trigger = Trigger(t["before"], t["after"], t.get("stamp"), "")
            if "ambiguous" in case:
                with pytest.raises(AmbiguousStamp) as info:
                    await contract.identify(trigger, before, until=case.get("until"))
                hint = info.value.hint or ""
                assert all(needle in hint for needle in case["ambiguous"]), hint
                return
            got = await contract.identify(trigger, before, until=case.get("until"))
    finally:
        for n in nodes:
            await n.stop()
    assert (got.entry.raw if got.entry else None) == (None if case.get("none") else case["raw"])
    assert [e.raw for e in got.outside] == case.get("outside", [])
    if "how" in case:
        assert got.how == case["how"]
    if "note" in case:
        assert any(case["note"] in n for n in got.notes), got.notes


def test_budget_flags_stamps_a_bash_watchdog_may_not_count(tmp_path: Path) -> None:
    """A stamp with spaces or a CR is counted here and flagged (a bash `read` keeps the CR)."""
    from spark_ops.watchdog.history import budget

    path = tmp_path / "h"
    path.write_bytes(b"1000\n  2000\n3000\r\n4000\n")
    out = budget(str(path), allowed=2, window=10_000, now=5000)
    assert out["used"] == 4
    assert [(f["line"], f["why"]) for f in out["flagged"]] == [
        (2, "spaces around the number"),
        (3, "a carriage return"),
    ]


@pytest.mark.slow
def test_hostile_reason_and_user_run_nothing_on_the_head(sim: Any, cli_env: dict[str, str]) -> None:
    """issue 13.1, end to end: LOGNAME `o'$(touch PWNED)'` and --reason `maint {by}` through the
    reference watchdog's `--reason {reason} --by {by}`: nothing runs, the reason arrives as
    written, and `--by` names the real account (the account database, never $LOGNAME)."""
    import json
    import pwd

    from ground.cluster import run_cli

    env = dict(cli_env, LOGNAME="o'$(touch PWNED)'", USER="o'$(touch PWNED)'")
    res = run_cli(env, "restart", "--reason", "maint {by} `touch PWNED`", "--yes", "--no-drain")
    assert res.returncode == 0, res.stderr[-2000:]
    assert not list(sim.root.rglob("PWNED")), "a value ran as a command on the head"
    journal = sim.history.parent / "restarts.journal.jsonl"
    forced = [json.loads(x) for x in journal.read_text().splitlines() if '"forced": true' in x]
    assert forced[-1]["reason"] == "maint {by} `touch PWNED`"
    assert forced[-1]["by"] == f"spark-ops:{pwd.getpwuid(os.getuid()).pw_name}"


@pytest.mark.slow
def test_budget_prune_by_exact_line(sim: Any, cli_env: dict[str, str]) -> None:
    """`budget prune --raw LINE` (the command shown for a record told apart by its fields)
    removes that one line and nothing else; a journal grown past a MiB (nothing rotates it), with
    a line that is not UTF-8, is read from its end and blocks nothing."""
    import json

    from ground.cluster import run_cli

    journal = sim.history.parent / "restarts.journal.jsonl"
    old = b"".join(
        b'{"action": "restart", "stamp": %d, "reason": "old %s"}\n' % (1600000000 + i, b"x" * 120)
        for i in range(9000)
    )
    huge = b'{"action": "restart", "stamp": 1' + b"0" * 400 + b"}\n"  # no float holds it
    journal.write_bytes(old + b'{"reason": "\xff\xfe"}\n' + huge + journal.read_bytes())
    assert journal.stat().st_size > 1 << 20
    res = run_cli(cli_env, "budget", "--json")
    assert res.returncode == 0, res.stderr[-2000:]
    before = sim.history.read_text().splitlines()
    with sim.history.open("a") as fh:
        fh.write("1700000000\n")
    res = run_cli(cli_env, "budget", "prune", "--raw", "1700000000", "--yes", "--json")
    assert res.returncode == 0, res.stderr[-2000:]
    assert json.loads(res.stdout)["removed_stamps"] == [1700000000.0]
    assert sim.history.read_text().splitlines() == before


RECORD_KINDS = yaml.safe_load((FIXTURES / "record_kind.yaml").read_text(encoding="utf-8"))


@pytest.mark.parametrize("case", RECORD_KINDS, ids=[c["name"] for c in RECORD_KINDS])
def test_one_rule_for_a_record_of_a_restart(case: dict[str, Any]) -> None:
    """An entry's own record and the journal's record of its stamp are told by the same rule."""
    record = case["record"]
    assert record_kind(record, "spark-ops") == case["kind"]
    assert HistEntry(9001.0, "9001", record).kind("spark-ops") == case["kind"]
    # the head's history.py (stdlib only, its own copy of the rule) agrees
    assert history.is_planned(record or {}, "spark-ops") is (case["kind"] == "planned")
    # as the journal's record of a plain stamp: the same kind decides identify
    if case["kind"] is not None and record.get("action", "restart") == "restart":
        got = identify(
            _entries(["1000"]), _entries(["1000", "9001"]), window=(9000, 9003),
            reported=None, reports_stamp=False, journal=[dict(record, stamp=9001)],
        )  # fmt: skip
        assert [e.raw for e in got.entries] == (["9001"] if case["kind"] == "planned" else [])
