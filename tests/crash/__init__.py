"""The crash-consistency harness: kill spark-ops (or the restart command) at a point, re-run, check."""
