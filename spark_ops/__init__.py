"""spark-ops: operate a vLLM serving cluster of DGX Spark nodes safely."""

from __future__ import annotations

__version__ = "0.1.0"
