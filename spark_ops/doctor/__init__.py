"""`doctor`: every precondition of `apply`, checked without changing anything, with a fix for each
failure.

Checks are data (`Check`). A `fail` is something that would make `apply` fail (or leave the cluster
unsafe to restart); a `warn` is worth knowing but does not stop `apply` (the watchdog paused, a
malformed history line). Nothing here writes on a node: writability is probed with `test -w` and a
non-blocking `flock` on a descriptor opened read-only. As root, `test -w` is true for a mode-0444
file because root may write it; it is false for an immutable (`chattr +i`) file or a read-only
mount, which is what really stops a write.
"""

from __future__ import annotations

from spark_ops.doctor.engine import EngineChecks
from spark_ops.doctor.last import keep_report, read_last
from spark_ops.doctor.loop import LoopChecks
from spark_ops.doctor.nodes import NodeChecks
from spark_ops.doctor.report import Checker, DoctorReport
from spark_ops.doctor.watchdog import WatchdogChecks, command_program
from spark_ops.inventory import Cluster
from spark_ops.remote import ClusterSession
from spark_ops.verify.checks import STATUSES, Check

__all__ = [
    "STATUSES",
    "Check",
    "Checker",
    "Doctor",
    "DoctorReport",
    "command_program",
    "read_last",
    "run_doctor",
]


class Doctor(NodeChecks, EngineChecks, WatchdogChecks, LoopChecks):
    """Runs every check against a connected session and fills a DoctorReport."""


async def run_doctor(
    cluster: Cluster, *, session: ClusterSession | None = None, keep: bool = True
) -> DoctorReport:
    """Run every check on a cluster and return the report (never raises for a failed check); keep
    it as the cluster's last doctor result on this machine (doctor.last) unless keep is False."""
    report = DoctorReport(cluster.name, cluster.source)
    own = session is None
    sess = session or ClusterSession(cluster)
    try:
        await sess.connect(required=False)
        doc = Doctor(sess, report)
        doc.check_ssh()
        if doc.up(doc.head):
            await doc.check_tools()
            await doc.check_state_dir()
            await doc.check_cluster_lock()
        await doc.check_sudo()
        await doc.check_ray_workers()
        await doc.check_recipe()
        await doc.check_watchdog()
        await doc.check_probe()
        await doc.check_loop_watchdog()
        await doc.check_budget()
        await doc.check_engine_log()
        await doc.check_engine()
        await doc.check_engine_leftovers()
        await doc.check_restart_policy()
    finally:
        if own:
            await sess.close()
    if keep:
        keep_report(report)
    return report
