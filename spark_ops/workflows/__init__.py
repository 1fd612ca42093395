"""Workflows: apply, planned restart, rollback, budget prune: each builds a Plan, then runs it.

Nothing here knows about click. The CLI opens an Operation (connections + cluster lock), asks for a
plan, shows it, confirms, then calls execute() with reporters for steps and boot events.

The package imports its modules on first use of a name (a command imports what it runs);
`execute` is imported from spark_ops.workflows.execute itself (the name is its module's too).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from spark_ops import lazy_exports

if TYPE_CHECKING:  # the names are imported on first use (a command imports what it runs)
    from spark_ops.workflows.budget import budget_view, execute_prune, plan_prune
    from spark_ops.workflows.execute import audit_entry
    from spark_ops.workflows.operation import (
        ApplyOptions,
        Operation,
        Outcome,
        engine_endpoint,
        jsonable,
    )
    from spark_ops.workflows.plans import list_backups, plan_apply, plan_restart, plan_rollback

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "spark_ops.workflows.budget": ("budget_view", "execute_prune", "plan_prune"),
        "spark_ops.workflows.execute": ("audit_entry",),
        "spark_ops.workflows.operation": (
            "ApplyOptions",
            "Operation",
            "Outcome",
            "engine_endpoint",
            "jsonable",
        ),
        "spark_ops.workflows.plans": (
            "list_backups",
            "plan_apply",
            "plan_restart",
            "plan_rollback",
        ),
    },
)


__all__ = [
    "ApplyOptions",
    "Operation",
    "Outcome",
    "audit_entry",
    "budget_view",
    "engine_endpoint",
    "execute_prune",
    "jsonable",
    "list_backups",
    "plan_apply",
    "plan_prune",
    "plan_restart",
    "plan_rollback",
]
