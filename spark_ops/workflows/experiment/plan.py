"""The experiment's plan: each configuration, whether it takes a restart, the restore, and each
sweep's levels against the watchdog's probe (no I/O)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from spark_ops.inventory import WatchdogSettings
from spark_ops.workflows.experiment.state import ExperimentState, label, normalize
from spark_ops.workflows.probe_load import LoadPlan, ProbeWouldTrip, cap_of, plan_load, refusal_of


def knobs_of(knobs: dict[str, Any], axes: list[str]) -> tuple[Any, ...]:
    """The normalized values of the given axes (of a configuration or of current_knobs())."""
    return tuple(normalize(axis, knobs.get(axis)) for axis in axes)


@dataclass
class ExperimentPlan:
    """What the run will do: configurations (done or to do), restarts, restore."""

    cluster: str
    state_path: str
    configurations: list[dict[str, Any]]
    start: dict[str, Any]
    current: dict[str, Any]
    restore: bool
    restarts: int
    resumed: bool
    sweep: dict[str, Any]
    predicted: list[dict[str, Any]] = field(default_factory=list)  # label, from (no restart)
    restarts_if_all_measured: int = 0
    confirm: bool = False
    # each configuration to measure: its sweep's levels against the watchdog's probe
    load: list[tuple[str, LoadPlan]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """Serialize for --json."""
        data = asdict(self)
        data["load"] = [{"configuration": name, **plan.to_dict()} for name, plan in self.load]
        return data

    def load_refusal(self) -> ProbeWouldTrip | None:
        """The levels refused before anything is changed (no pause file, and a level that starves
        the watchdog's probe whatever the sweep measures), or None."""
        return refusal_of(self.load, before="anything was changed (no restart, no request)")


def plan_experiment(
    state: ExperimentState, current_knobs: dict[str, Any], state_path: Path, resumed: bool,
    *, watchdog: WatchdogSettings | None = None, unleased: bool = False,
) -> ExperimentPlan:  # fmt: skip
    """Lay out the run: each configuration, whether it needs a restart, the restore at the end,
    and (given the inventory's `watchdog`) each sweep's levels against the watchdog's probe."""
    axes = list(state.spec.axes)
    position = knobs_of(current_knobs, axes)
    rows: list[dict[str, Any]] = []
    restarts = 0
    for config in state.spec.measured():
        done = label(config) in state.results
        restart = not done and knobs_of(config, axes) != position
        if not done:
            restarts += restart
            position = knobs_of(config, axes)
        rows.append({"label": label(config), "knobs": config, "done": done, "restart": restart})
    start = {a: state.start_knobs.get(a) for a in axes}
    if state.spec.restore and position != knobs_of(state.start_knobs, axes):
        restarts += 1
    full, pos = 0, knobs_of(current_knobs, axes)
    for config in state.spec.every_configuration():
        full += knobs_of(config, axes) != pos
        pos = knobs_of(config, axes)
    if state.spec.restore and pos != knobs_of(state.start_knobs, axes):
        full += 1
    predicted = [
        {"label": name, "from": label(base)} for name, base in state.spec.predicted().items()
    ]
    load: list[tuple[str, LoadPlan]] = []
    levels = list(state.spec.sweep.get("levels") or [])
    for row in [r for r in rows if not r["done"] and watchdog is not None]:
        assert watchdog is not None
        knob = row["knobs"].get("max_num_seqs", current_knobs.get("max_num_seqs"))
        plan = plan_load(
            levels, cap_of({"max_num_seqs": knob}), watchdog.probe, watchdog.pause_file,
            unleased=unleased,
        )  # fmt: skip
        load.append((row["label"], plan))
    return ExperimentPlan(
        cluster=state.spec.cluster,
        state_path=str(state_path),
        configurations=rows,
        start=start,
        current={a: current_knobs.get(a) for a in axes},
        restore=state.spec.restore,
        restarts=restarts,
        resumed=resumed,
        sweep=state.spec.sweep,
        predicted=predicted,
        restarts_if_all_measured=full,
        confirm=state.spec.confirm,
        load=load,
    )
