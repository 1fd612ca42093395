"""`spark-ops log` counts operations: a run's intent, steps and end are one entry, steps inside."""

from __future__ import annotations

from typing import Any

import pytest

from spark_ops.workflows.oplog import args_text, operations_of


def _run(rid: str, t: float, *, end: bool = True) -> list[dict[str, Any]]:
    """The lines one apply run writes: intent, three step records, and its end."""
    what = {"operation": "apply", "args": {"max_num_seqs": 8}}
    lines: list[dict[str, Any]] = [
        {"when": t, "who": "ana@laptop", "what": what, "run": rid, "phase": "intent",
         "command": "spark-ops apply --max-num-seqs 8"},
        {"when": t + 1, "run": rid, "phase": "step",
         "steps": [{"step": "write", "status": "done"}]},
        {"when": t + 2, "run": rid, "phase": "step",
         "steps": [{"step": "restart", "status": "running", "window_from": t + 2}]},
        {"when": t + 9, "run": rid, "phase": "step",
         "steps": [{"step": "restart", "status": "done"}]},
    ]  # fmt: skip
    if end:
        lines.append(
            {"when": t + 30, "who": "ana@laptop", "what": what, "nodes": ["node1"],
             "outcome": "ok", "run": rid, "phase": "end"}
        )  # fmt: skip
    return lines


def test_one_entry_per_operation_with_its_steps() -> None:
    """Two runs, an old one-line entry and an unreadable line: four operations, in order."""
    entries = [
        {"when": 5.0, "who": "bo@desk", "what": {"operation": "budget prune"}, "outcome": "ok"},
        *_run("r1", 10.0),
        {"malformed": "not json"},
        *_run("r2", 100.0, end=False),
    ]
    ops = operations_of(entries)
    assert [o.get("run") for o in ops] == [None, "r1", None, "r2"]
    first, done, bad, open_ = ops
    assert first["what"]["operation"] == "budget prune" and first["steps"] == []
    assert done["started"] == 10.0 and done["when"] == 40.0 and done["outcome"] == "ok"
    assert done["command"] == "spark-ops apply --max-num-seqs 8"
    assert [(s["step"], s["status"]) for s in done["steps"]] == [
        ("write", "done"),
        ("restart", "done"),
    ]
    assert done["steps"][1]["window_from"] == 12.0  # the earlier record's facts are kept
    assert "phase" not in done and "unfinished" not in done
    assert bad == {"malformed": "not json"}
    assert open_["unfinished"] is True and open_["last_step"] == "restart done"


ARGS_TEXT = [
    # what, as the log and the history page show its arguments
    ({"args": {"max_num_seqs": 64, "force": False, "sets": []}}, "max_num_seqs=64"),
    ({"args": {"boot_wait": 0, "drain": True}}, "boot_wait=0 drain=True"),
    (
        {"args": {"prove": {"point": {"concurrency": 16}, "requests": 32}}},
        'prove={"point":{"concurrency":16},"requests":32}',
    ),
    ({"args": {"sets": ["a=1", "b=2"], "reason": ""}}, 'sets=["a=1","b=2"]'),
    ({"args": "not a mapping"}, ""),
    ("not a mapping", ""),
]


@pytest.mark.parametrize(("what", "text"), ARGS_TEXT)
def test_arguments_read_as_they_were_given(what: object, text: str) -> None:
    """One rendering of an operation's arguments for `log`, the fleet's log table and serve's
    history page: a nested value (--prove's) as the JSON the audit holds (it printed Python's
    dict repr); a 0 is an argument given (`log` dropped `--boot-wait 0` as if False)."""
    assert args_text(what) == text
