"""The plan's typed facts read back what was saved: each saved plan, outcome and journal record
(tests/fixtures/plan/: captured from the embedded cluster before the facts were typed, and the
shapes it does not reach) loads through from_json and gives back exactly the same JSON."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from spark_ops.errors import OverBudget
from spark_ops.workflows.facts import BudgetGate, UnreadableBudget, gate_from_json
from spark_ops.workflows.journal import runs_of
from spark_ops.workflows.plan import OperationKind, Plan, PlanFacts

FIXTURES = Path(__file__).parent / "fixtures" / "plan"
SAVED: dict[str, dict[str, Any]] = json.loads((FIXTURES / "saved.json").read_text("utf-8"))
AUDIT = [json.loads(x) for x in (FIXTURES / "audit.jsonl").read_text("utf-8").splitlines()]
SHAPES = yaml.safe_load((FIXTURES / "facts.yaml").read_text("utf-8"))
PLAN_FACTS = {f.name for f in dataclasses.fields(PlanFacts)}


def plan_facts(doc: dict[str, Any]) -> dict[str, Any]:
    """The facts a plan was made on, of a saved --json (a run's own facts are kept beside)."""
    return {k: v for k, v in doc["plan"]["facts"].items() if k in PLAN_FACTS}


@pytest.mark.parametrize("name", list(SAVED))
def test_a_saved_plan_reads_back_the_same(name: str) -> None:
    """A saved plan's facts, and the budget a refusal names, round-trip unchanged."""
    doc = SAVED[name]
    facts = plan_facts(doc)
    assert PlanFacts.from_json(facts).to_json() == facts
    if "refused" in doc:
        budget = doc["refused"]["budget"]
        assert gate_from_json(budget).to_json() == budget
        assert OverBudget("spent", budget=gate_from_json(budget)).to_dict()["budget"] == budget
    assert (
        Plan(doc["plan"]["operation"], doc["plan"]["cluster"]).operation.value
        == (doc["plan"]["operation"])
    )


@pytest.mark.parametrize("case", SHAPES, ids=[c["name"] for c in SHAPES])
def test_every_shape_of_a_fact_reads_back_the_same(case: dict[str, Any]) -> None:
    """Facts --json holds that the captured runs do not reach round-trip unchanged too."""
    assert PlanFacts.from_json(case["facts"]).to_json() == case["facts"]


def test_the_journal_reads_back_the_same() -> None:
    """Each intent's budget, and each run's summary, round-trip unchanged."""
    intents = [e for e in AUDIT if e.get("phase") == "intent"]
    budgets = [e["detail"]["budget"] for e in intents if e.get("detail", {}).get("budget")]
    assert budgets, "the captured journal holds the budgets its restarts met"
    for budget in budgets:
        assert gate_from_json(budget).to_json() == budget
    runs = runs_of(AUDIT)
    assert runs
    for run in runs:
        summary = run.summary()
        assert type(summary).from_json(summary.to_json()).to_json() == summary.to_json()
    assert {r.operation for r in runs} <= set(OperationKind)


def test_a_gate_is_read_by_its_kind() -> None:
    """An `error` makes the gate unreadable; a name no gate has is refused, as a fact's is."""
    assert isinstance(gate_from_json({"error": "x", "over_budget_given": False}), UnreadableBudget)
    assert isinstance(gate_from_json({"used": 1, "allowed": 2, "spent": False}), BudgetGate)
    with pytest.raises(TypeError):
        gate_from_json({"used": 1, "slots": 2})
    with pytest.raises(TypeError):
        PlanFacts.from_json({"budgets": {}})


def test_a_plan_holds_only_a_planned_operation() -> None:
    """A run journalled apart from any plan (budget prune, an experiment's load) is no plan."""
    with pytest.raises(ValueError):
        Plan(OperationKind.BUDGET_PRUNE, "sim")
    assert [k.value for k in OperationKind if k.planned] == ["apply", "restart", "rollback"]
