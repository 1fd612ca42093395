"""Data files shipped with spark-ops (prompts, the embedded cluster's assets)."""
