"""`spark-ops experiment`: apply each configuration, sweep it, compare them, restore the start.

run.py drives the experiment over one Operation, state.py holds its spec and resumable state file,
plan.py its plan, reading.py turns the sweep results into a comparison and a recommendation
(pure functions).
"""

from __future__ import annotations

from spark_ops.workflows.experiment.plan import plan_experiment
from spark_ops.workflows.experiment.reading import ExperimentReading, read_experiment
from spark_ops.workflows.experiment.run import (
    ApplySettings,
    ExperimentOutcome,
    Hooks,
    current_knobs,
    run_experiment,
)
from spark_ops.workflows.experiment.state import (
    ExperimentError,
    ExperimentSpec,
    ExperimentState,
    Recorded,
    default_state_path,
    discard_state,
    label,
    recorded_state,
    start_state,
)

__all__ = [
    "ApplySettings",
    "ExperimentError",
    "ExperimentOutcome",
    "ExperimentReading",
    "ExperimentSpec",
    "ExperimentState",
    "Hooks",
    "Recorded",
    "current_knobs",
    "default_state_path",
    "discard_state",
    "label",
    "plan_experiment",
    "read_experiment",
    "recorded_state",
    "run_experiment",
    "start_state",
]
