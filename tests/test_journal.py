"""The run journal read back: unfinished runs and the stamps a dead run left (fixtures/journal)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from spark_ops.watchdog.identify import HistEntry
from spark_ops.workflows.converge import left_by, unchecked_restart
from spark_ops.workflows.journal import runs_of, unfinished_runs

T = 1_796_000_000.0
CASES: list[dict[str, Any]] = yaml.safe_load(
    (Path(__file__).parent / "fixtures" / "journal" / "cases.yaml").read_text("utf-8")
)


def _shift(entry: dict[str, Any]) -> dict[str, Any]:
    """An audit entry with its time offsets made head-clock times."""
    out = dict(entry)
    steps = out.get("steps")
    if isinstance(steps, list):
        out["steps"] = [
            {
                k: (T + v if k in ("window_from", "window_to", "stamp") and isinstance(v, int)
                    else [str(int(T) + int(x)) for x in v] if k == "known" else v)
                for k, v in s.items()
            }
            if isinstance(s, dict)
            else s
            for s in steps
        ]  # fmt: skip
    return out


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_journal_case(case: dict[str, Any]) -> None:
    """Unfinished runs, the stamps left, and the notes, as the case says."""
    runs = runs_of([_shift(e) for e in case["audit"]])
    dead = unfinished_runs(runs)
    assert [r.run for r in dead] == case["unfinished"], case["why"]
    entries = [HistEntry(T + s, str(int(T) + s)) for s in case["history"]]
    marks = {T + k: {**v, "stamp": T + k} for k, v in case["marks"].items()}
    left: list[float] = []
    notes: list[str] = []
    for r in dead:
        stamps, said = left_by(r, entries, marks)
        left += [e.stamp - T for e in stamps if e.stamp - T not in left]
        notes += said
    assert left == case["left"], case["why"]
    assert len(notes) == case["notes"], (case["why"], notes)
    if "summary" in case:  # what status and doctor show of the dead run (one, here)
        said = dead[0].summary().to_json()
        assert {k: said[k] for k in case["summary"]} == case["summary"], case["why"]
    if "checks_owed" in case:
        owed = unchecked_restart(runs)
        assert (owed.run if owed is not None else None) == case["checks_owed"], case["why"]
