"""Talking to a running engine: its HTTP API and /metrics, and the identity of an engine instance
(pid and start time, container, unit invocation) so that a boot is the new engine's."""

from __future__ import annotations

from typing import TYPE_CHECKING

from spark_ops import lazy_exports

if TYPE_CHECKING:  # the names are imported on first use (a command imports what it runs)
    from spark_ops.engine.api import EngineAPI, EngineSnapshot
    from spark_ops.engine.metrics import (
        MetricSample,
        kv_pool_tokens,
        metric_labels,
        metric_sums,
        parse_metrics,
    )

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "spark_ops.engine.api": ("EngineAPI", "EngineSnapshot"),
        "spark_ops.engine.metrics": (
            "MetricSample",
            "kv_pool_tokens",
            "metric_labels",
            "metric_sums",
            "parse_metrics",
        ),
    },
)


__all__ = [
    "EngineAPI",
    "EngineSnapshot",
    "MetricSample",
    "kv_pool_tokens",
    "metric_labels",
    "metric_sums",
    "parse_metrics",
]
