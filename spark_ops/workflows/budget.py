"""The restart budget as the head sees it, and pruning chosen stamps (audited)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from spark_ops import audit
from spark_ops.errors import (
    SparkOpsError,
)
from spark_ops.watchdog.contract import BudgetView
from spark_ops.workflows.operation import Operation


async def budget_view(op: Operation) -> BudgetView:
    """The budget as the head sees it."""
    return await op.watchdog.budget()


async def budget_prune(
    op: Operation,
    *,
    stamps: Sequence[float] = (),
    raws: Sequence[str] = (),
    since: float | None = None,
    until: float | None = None,
    planned: bool = False,
    dry_run: bool = False,
) -> dict[str, Any]:
    """Remove chosen stamps (by value, time range, or the journal's planned entries)."""
    if not stamps and not raws and since is None and not planned:
        raise SparkOpsError("choose what to prune: --stamp S, --raw LINE, --since T or --planned")
    result = await op.watchdog.prune(
        stamps=list(stamps), raws=list(raws), since=since, until=until, planned=planned,
        dry_run=dry_run, reason="operator prune",
    )  # fmt: skip
    if not dry_run and result.get("removed_stamps"):
        args = {
            "stamps": list(stamps), "raws": list(raws), "since": since, "until": until,
            "planned": planned,
        }  # fmt: skip
        detail = {"removed": result["removed_stamps"], "backup": result.get("backup")}
        entry = audit.make_entry("budget prune", args=args, outcome="ok", detail=detail)
        await op.record_audit(entry)
    return result
