"""Workflows: apply, planned restart, rollback, budget prune: each builds a Plan, then runs it.

Nothing here knows about click. The CLI opens an Operation (connections + cluster lock), asks for a
plan, shows it, confirms, then calls execute() with reporters for steps and boot events.
"""

from __future__ import annotations

from spark_ops.workflows.budget import budget_view, execute_prune, plan_prune
from spark_ops.workflows.execute import audit_entry, execute
from spark_ops.workflows.operation import (
    ApplyOptions,
    Operation,
    Outcome,
    engine_endpoint,
    jsonable,
)
from spark_ops.workflows.plans import list_backups, plan_apply, plan_restart, plan_rollback

__all__ = [
    "ApplyOptions",
    "Operation",
    "Outcome",
    "audit_entry",
    "budget_view",
    "engine_endpoint",
    "execute",
    "execute_prune",
    "jsonable",
    "list_backups",
    "plan_apply",
    "plan_prune",
    "plan_restart",
    "plan_rollback",
]
