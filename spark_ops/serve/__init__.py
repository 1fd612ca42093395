"""`spark-ops serve`: the cluster on one read-only page, its numbers for Prometheus (issue 24)."""

from __future__ import annotations
