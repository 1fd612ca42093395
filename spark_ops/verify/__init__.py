"""Post-boot verification: pure parsers of node output, and checks that return data.

Parsers (`spark_ops.verify.parse`) read text that the caller fetched (over SSH or from fixtures).
Checks (`spark_ops.verify.checks`) turn parsed data into `Check` records; nothing here raises for a
failed check.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from spark_ops import lazy_exports

if TYPE_CHECKING:  # the names are imported on first use (a command imports what it runs)
    from spark_ops.verify.checks import (
        Check,
        check_effective_args,
        check_kv_pool,
        check_mem_available,
        check_no_new_xid,
        check_no_stale_gpu_processes,
        check_rank_args,
        check_rank_leftovers,
        check_ray_nodes,
    )
    from spark_ops.verify.parse import (
        XID_NAMES,
        ComputeApp,
        ParseError,
        RayNode,
        RayStatus,
        XidEvent,
        missing_nodes,
        parse_cache_config_info,
        parse_compute_apps,
        parse_kv_cache_tokens,
        parse_meminfo,
        parse_non_default_args,
        parse_ray_nodes,
        parse_ray_status,
        parse_xid_lines,
    )

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "spark_ops.verify.checks": (
            "Check",
            "check_effective_args",
            "check_kv_pool",
            "check_mem_available",
            "check_no_new_xid",
            "check_no_stale_gpu_processes",
            "check_rank_args",
            "check_rank_leftovers",
            "check_ray_nodes",
        ),
        "spark_ops.verify.parse": (
            "XID_NAMES",
            "ComputeApp",
            "ParseError",
            "RayNode",
            "RayStatus",
            "XidEvent",
            "missing_nodes",
            "parse_cache_config_info",
            "parse_compute_apps",
            "parse_kv_cache_tokens",
            "parse_meminfo",
            "parse_non_default_args",
            "parse_ray_nodes",
            "parse_ray_status",
            "parse_xid_lines",
        ),
    },
)


__all__ = [
    "XID_NAMES",
    "Check",
    "ComputeApp",
    "ParseError",
    "RayNode",
    "RayStatus",
    "XidEvent",
    "check_effective_args",
    "check_kv_pool",
    "check_mem_available",
    "check_no_new_xid",
    "check_no_stale_gpu_processes",
    "check_rank_args",
    "check_rank_leftovers",
    "check_ray_nodes",
    "missing_nodes",
    "parse_cache_config_info",
    "parse_compute_apps",
    "parse_kv_cache_tokens",
    "parse_meminfo",
    "parse_non_default_args",
    "parse_ray_nodes",
    "parse_ray_status",
    "parse_xid_lines",
]
