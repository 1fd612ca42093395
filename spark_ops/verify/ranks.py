"""Per-rank evidence of an engine run as ranks without Ray, gathered from the workers."""

from __future__ import annotations

from spark_ops.engine.identity import old_ranks, worker_ranks
from spark_ops.inventory import Cluster
from spark_ops.remote import ClusterSession
from spark_ops.verify.checks import Check, check_rank_leftovers


async def rank_leftover_checks(
    session: ClusterSession, cluster: Cluster, since: float | None
) -> list[Check]:
    """One `rank-leftovers` check per worker: no engine process older than the restart."""
    if since is None:
        return []
    checks = []
    for node, procs in (await worker_ranks(session, cluster)).items():
        if isinstance(procs, str):
            checks.append(Check("rank-leftovers", node, "warn", f"not checked: {procs}"))
        else:
            checks.append(check_rank_leftovers(old_ranks(procs, since), since, host=node))
    return checks
