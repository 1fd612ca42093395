"""`budget prune` executes the plan it showed: cases from tests/fixtures/budget/prune.yaml run
against a real SSH node and the real history.py, the history changed between preview and prune;
then the real CLI, with a stamp appended while it waits for the operator's confirmation."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import click
import pytest
import yaml
from embedded import start_nodes

from spark_ops.cli.budget import StampType
from spark_ops.inventory import Cluster
from spark_ops.sim.node import SimNode
from spark_ops.workflows.budget import PruneSelection, execute_prune, plan_prune
from spark_ops.workflows.operation import Operation

CASES = yaml.safe_load(
    (Path(__file__).parent / "fixtures" / "budget" / "prune.yaml").read_text(encoding="utf-8")
)


@pytest.fixture
async def head(tmp_path: Path) -> AsyncIterator[tuple[SimNode, Cluster]]:
    """One embedded node, the head, whose history is ~/h."""
    nodes, c = await start_nodes(tmp_path, 1)
    try:
        yield nodes[0], c
    finally:
        await nodes[0].stop()


def _write(path: Path, lines: list[str]) -> None:
    """Write lines, each ending in a newline."""
    path.write_text("".join(f"{x}\n" for x in lines), encoding="utf-8")


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
async def test_prune_case(case: dict[str, Any], head: tuple[SimNode, Cluster]) -> None:
    """Preview, change the history, execute: exactly the previewed lines go."""
    node, cluster = head
    hist, journal = node.spec.home / "h", node.spec.home / "h.journal.jsonl"
    _write(hist, case["history"])
    if "journal" in case:
        _write(journal, case["journal"])
    sel = case["select"]
    selection = PruneSelection(
        tuple(sel.get("stamps", ())), (), sel.get("since"), None, sel.get("planned", False)
    )
    async with Operation.open(cluster, "budget prune", nodes=[cluster.head.name]) as op:
        plan = await plan_prune(op, selection)
        assert [e.raw for e in plan.chosen] == case["remove"]
        assert plan.not_found == case.get("not_found", [])
        if "warns" in case:
            assert len(plan.warnings) == len(case["warns"]), plan.warnings
            for words, warning in zip(case["warns"], plan.warnings, strict=True):
                assert words in warning, plan.warnings
        between = case.get("between", {})
        lines = hist.read_text().splitlines()
        lines = [x for x in lines if x not in between.get("drop", [])] + between.get("append", [])
        _write(hist, lines)
        if "journal" in between:
            with journal.open("a") as fh:
                fh.writelines(f"{x}\n" for x in between["journal"])
        report = await execute_prune(op, plan)
    assert report.removed_stamps == case["removed"]
    assert report.appended_kept == case.get("appended_kept", [])
    assert report.vanished == case.get("vanished", [])
    assert hist.read_text().splitlines() == case["after"]
    backups = [p for p in node.spec.home.iterdir() if p.name.startswith("h.") and "bak" in p.name]
    assert bool(backups) == bool(case["removed"]), "a backup exactly when something was removed"
    assert report.budget is not None and report.budget.history_file == "~/h"
    assert not list(node.spec.home.rglob("PWNED")), "a value ran as a command on the head"


@pytest.fixture
def served_head(tmp_path: Path) -> Iterator[tuple[SimNode, Path]]:
    """One embedded node served from a background loop, for the CLI in a subprocess."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    nodes, _ = asyncio.run_coroutine_threadsafe(start_nodes(tmp_path, 1), loop).result(30)
    try:
        yield nodes[0], tmp_path / "inventory.yaml"
    finally:
        asyncio.run_coroutine_threadsafe(nodes[0].stop(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)


def _prune_cli(inventory: Path, *args: str) -> subprocess.Popen[bytes]:
    """The real CLI, its stdin a pipe for the confirmation."""
    env = dict(os.environ, SPARK_OPS_INVENTORY=str(inventory))
    env.pop("SPARK_OPS_CLUSTER", None)
    env.pop("SPARK_OPS_FLEET", None)
    return subprocess.Popen(
        [sys.executable, "-m", "spark_ops.cli.main", "budget", "prune", *args],
        env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip


def _read_until(proc: subprocess.Popen[bytes], needle: bytes) -> bytes:
    """Read the CLI's stderr until needle (the confirmation prompt) shows."""
    assert proc.stderr is not None
    seen = b""
    while needle not in seen:
        chunk = os.read(proc.stderr.fileno(), 4096)
        assert chunk, f"the CLI ended before asking: {seen.decode(errors='replace')}"
        seen += chunk
    return seen


def test_cli_keeps_a_stamp_appended_while_it_asks(served_head: tuple[SimNode, Path]) -> None:
    """`budget prune --since` shows two lines, asks; the watchdog appends a third; `y`: the two
    shown are removed, the third is kept and the output says so."""
    node, inventory = served_head
    hist = node.spec.home / "h"
    _write(hist, ["1764400000", "1764410000"])
    proc = _prune_cli(inventory, "--since", "1764390000")
    try:
        _read_until(proc, b"Remove these 2?")
        with hist.open("a") as fh:
            fh.write("1764420000\n")
        out, err = proc.communicate(b"y\n", timeout=120)
    finally:
        proc.kill() if proc.poll() is None else None
    assert proc.returncode == 0, err.decode(errors="replace")
    text = out.decode()
    assert "Would remove 2 line(s)" in text and "1764420000" not in text.split("Removed")[0]
    assert "1764420000 appeared after the preview and was kept (not confirmed)" in text
    assert hist.read_text().splitlines() == ["1764420000"]


def test_cli_dry_run_json_prints_the_plan(served_head: tuple[SimNode, Path]) -> None:
    """`--dry-run --json`: the plan's exact lines, nothing changed."""
    node, inventory = served_head
    hist = node.spec.home / "h"
    _write(hist, ["1764400000", "1764410000"])
    proc = _prune_cli(inventory, "--stamp", "1764410000", "--dry-run", "--json")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err.decode(errors="replace")
    doc = json.loads(out)
    assert doc["dry_run"] is True
    assert doc["plan"]["remove"] == [{"stamp": 1764410000.0, "raw": "1764410000"}]
    assert doc["budget"]["history_file"] == "~/h"
    assert hist.read_text().splitlines() == ["1764400000", "1764410000"]


def test_cli_not_confirmed_removes_nothing(served_head: tuple[SimNode, Path]) -> None:
    """Answering no: exit 'aborted', the history as it was."""
    node, inventory = served_head
    hist = node.spec.home / "h"
    _write(hist, ["1764400000"])
    proc = _prune_cli(inventory, "--stamp", "1764400000")
    _, err = proc.communicate(b"n\n", timeout=120)
    assert proc.returncode != 0 and b"nothing was removed" in err
    assert hist.read_text().splitlines() == ["1764400000"]


def test_cli_nothing_to_prune_says_so(served_head: tuple[SimNode, Path]) -> None:
    """`--planned` with no planned stamp: "Nothing to remove", never "Would remove 0 line(s)"."""
    node, inventory = served_head
    hist = node.spec.home / "h"
    _write(hist, ["1764400000"])
    proc = _prune_cli(inventory, "--planned")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err.decode(errors="replace")
    text = out.decode()
    assert "Nothing to remove: ~/h holds no stamp of a planned restart." in text, text
    assert "Would remove" not in text and "Remove these" not in err.decode()
    assert hist.read_text().splitlines() == ["1764400000"]


@pytest.mark.parametrize(
    ("given", "taken"),
    [
        ("1796150875", 1796150875.0),
        ("1796150875.5", 1796150875.5),
        ("1764470000.25", 1764470000.25),
    ],
)
def test_stamp_option_takes_exact_stamps(given: str, taken: float) -> None:
    """--stamp takes a stamp whose decimal text a float holds exactly."""
    assert StampType().convert(given, None, None) == taken


def test_stamp_option_refuses_digits_a_float_drops() -> None:
    """--stamp 1796150875.0000001 is refused (as a float it is 1796150875.0, another line)."""
    with pytest.raises(click.BadParameter, match=r"more digits than a stamp holds exactly"):
        StampType().convert("1796150875.0000001", None, None)
