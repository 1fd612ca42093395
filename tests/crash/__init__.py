"""The crash-consistency harness: interrupt spark-ops at a point, run it again, check."""
