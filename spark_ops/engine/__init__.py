"""Talking to a running engine: its HTTP API and /metrics, and the identity of an engine instance
(pid and start time, container, unit invocation) so that a boot is the new engine's."""

from __future__ import annotations

from spark_ops.engine.api import EngineAPI, EngineSnapshot
from spark_ops.engine.metrics import (
    MetricSample,
    kv_pool_tokens,
    metric_labels,
    metric_sums,
    parse_metrics,
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
