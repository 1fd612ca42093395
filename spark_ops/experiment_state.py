"""The experiment's specification, plan and resumable state file (no I/O beyond that file)."""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from spark_ops.bench.sweep import SweepResult
from spark_ops.errors import ExitStatus, SparkOpsError

SCHEMA = "spark-ops.experiment/1"
REASON = "planned restart (spark-ops experiment"  # every restart of ours is journalled with this
AXES = ("max_num_seqs", "moe_backend", "kv_cache_memory", "enforce_eager")

Hook = Callable[..., Any]


class ExperimentError(SparkOpsError):
    """The experiment cannot start or go on (state file, configurations, restore)."""


class ExperimentUsageError(ExperimentError):
    """The configurations asked for make no sense (no knob, a repeated value)."""

    exit_status = ExitStatus.USAGE


def default_state_path(cluster: str) -> Path:
    """~/.local/state/spark-ops/experiment-<cluster>.json."""
    return Path.home() / ".local" / "state" / "spark-ops" / f"experiment-{cluster}.json"


def _now() -> str:
    """UTC time as ISO 8601."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def normalize(axis: str, value: Any) -> Any:
    """A knob value in the form knob_values() reports it (bytes for kv, bool for eager)."""
    from spark_ops.recipe import parse_kv_cache_memory

    if value is None:
        return None
    if axis == "max_num_seqs":
        return int(value)
    if axis == "kv_cache_memory":
        return parse_kv_cache_memory(str(value))
    if axis == "enforce_eager":
        return bool(value)
    return str(value)


def label(config: dict[str, Any]) -> str:
    """A configuration's name: 'max_num_seqs=64, moe_backend=cutlass'."""
    return ", ".join(f"{k}={v}" for k, v in config.items())


def changes_for(config: dict[str, Any]) -> list[Any]:
    """Validated recipe changes that set a configuration's knobs."""
    from spark_ops.recipe import changes_from_options

    return changes_from_options(**{k: v for k, v in config.items()})


@dataclass
class ExperimentSpec:
    """What to compare (axes, cartesian product) and how to sweep each configuration."""

    cluster: str
    axes: dict[str, list[Any]]
    sweep: dict[str, Any]
    restore: bool = True

    def validate(self) -> None:
        """Raise ExperimentError naming the first bad axis or value."""
        if not self.axes:
            raise ExperimentUsageError(
                "nothing to compare: give at least one knob with values, e.g. --max-num-seqs 6,64"
            )
        for axis, values in self.axes.items():
            if axis not in AXES:
                raise ExperimentUsageError(f"unknown knob {axis!r}; allowed: {', '.join(AXES)}")
            if not values:
                raise ExperimentUsageError(f"--{axis.replace('_', '-')}: no value given")
            for value in values:
                changes_for({axis: value})  # KnobError names the option and the value
            seen = [normalize(axis, v) for v in values]
            if len(set(seen)) != len(seen):
                raise ExperimentUsageError(
                    f"--{axis.replace('_', '-')} {','.join(map(str, values))}: a value is repeated"
                )

    def configurations(self) -> list[dict[str, Any]]:
        """The cartesian product of the axes' values, in the order given."""
        names = list(self.axes)
        return [
            dict(zip(names, combo, strict=True)) for combo in itertools.product(*self.axes.values())
        ]

    def to_dict(self) -> dict[str, Any]:
        """Serialize for the state file."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ExperimentSpec:
        """Rebuild from to_dict() output."""
        return cls(data["cluster"], dict(data["axes"]), dict(data["sweep"]), bool(data["restore"]))


@dataclass
class ExperimentState:
    """The local record of an experiment: its spec, starting knobs and finished configurations."""

    spec: ExperimentSpec
    start_knobs: dict[str, Any]
    results: dict[str, dict[str, Any]] = field(default_factory=dict)
    status: str = "running"  # running | interrupted | failed | finished
    in_progress: str | None = None
    restore: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    started_at: str = field(default_factory=_now)
    updated_at: str = ""

    def to_dict(self) -> dict[str, Any]:
        """Serialize for the state file (with the plan's labels and a `finished` flag)."""
        configurations = [label(c) for c in self.spec.configurations()]
        data = {"schema": SCHEMA, "configurations": configurations, **asdict(self)}
        return {**data, "finished": self.status == "finished"}

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, source: str) -> ExperimentState:
        """Rebuild from to_dict() output; ExperimentError naming source when it is not one."""
        if not isinstance(data, dict) or data.get("schema") != SCHEMA:
            raise ExperimentError(f"{source}: not a spark-ops experiment state (schema {SCHEMA!r})")
        try:
            kw = {f.name: data[f.name] for f in fields(cls) if f.name in data}
            return cls(**{**kw, "spec": ExperimentSpec.from_dict(data["spec"])})
        except (KeyError, TypeError, ValueError) as exc:
            raise ExperimentError(
                f"{source}: experiment state has a bad or missing key: {exc}"
            ) from exc

    def save(self, path: Path) -> None:
        """Write atomically: a temp file beside it, fsynced, renamed over it."""
        self.updated_at = _now()
        path = Path(path)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(tmp, "w", encoding="utf-8") as fh:
                json.dump(self.to_dict(), fh, indent=2, ensure_ascii=False)
                fh.write("\n")
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)
        except OSError as exc:
            raise ExperimentError(f"{path}: cannot write the experiment state: {exc}") from exc

    @classmethod
    def load(cls, path: Path) -> ExperimentState | None:
        """Read the state file, or None when there is none."""
        try:
            text = Path(path).read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise ExperimentError(f"{path}: cannot read the experiment state: {exc}") from exc
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise ExperimentError(f"{path}: experiment state is not JSON: {exc}") from exc
        return cls.from_dict(data, source=str(path))

    def sweep_results(self) -> list[tuple[str, SweepResult]]:
        """The finished configurations' sweeps, in plan order."""
        out = []
        for config in self.spec.configurations():
            run = self.results.get(label(config))
            if run is not None:
                out.append(
                    (label(config), SweepResult.from_dict(run["sweep"], source=label(config)))
                )
        return out

    def reading(self) -> Any:
        """The comparison across the finished configurations (an ExperimentReading)."""
        from spark_ops.experiment_reading import read_experiment

        return read_experiment(self.sweep_results(), slo_tok_s=self.spec.sweep.get("slo_tok_s"))


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

    def to_dict(self) -> dict[str, Any]:
        """Serialize for --json."""
        return asdict(self)


def plan_experiment(
    state: ExperimentState, current_knobs: dict[str, Any], state_path: Path, resumed: bool
) -> ExperimentPlan:
    """Lay out the run: each configuration, whether it needs a restart, the restore at the end."""
    axes = list(state.spec.axes)
    position = knobs_of(current_knobs, axes)
    rows: list[dict[str, Any]] = []
    restarts = 0
    for config in state.spec.configurations():
        done = label(config) in state.results
        restart = not done and knobs_of(config, axes) != position
        if not done:
            restarts += restart
            position = knobs_of(config, axes)
        rows.append({"label": label(config), "knobs": config, "done": done, "restart": restart})
    start = {a: state.start_knobs.get(a) for a in axes}
    if state.spec.restore and position != knobs_of(state.start_knobs, axes):
        restarts += 1
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
    )


def start_state(
    spec: ExperimentSpec, current_knobs: dict[str, Any], path: Path, *, resume: bool
) -> tuple[ExperimentState, bool]:
    """A new state, or the one to resume; refuses to overwrite an unfinished experiment."""
    old = ExperimentState.load(path)
    if resume:
        if old is None:
            raise ExperimentError(
                f"{path}: no experiment state to resume", hint="run without --resume"
            )
        if old.spec.cluster != spec.cluster:
            raise ExperimentError(
                f"{path}: the experiment was on cluster {old.spec.cluster!r}, not {spec.cluster!r}"
            )
        if spec.axes and spec.axes != old.spec.axes:
            raise ExperimentError(
                f"{path}: the experiment compares {old.spec.axes}, not {spec.axes}",
                hint="resume without knob options, or start a new experiment with --state FILE",
            )
        if old.status == "finished":
            raise ExperimentError(f"{path}: this experiment is finished; nothing to resume")
        old.spec.restore = spec.restore  # --no-restore applies to this run
        return old, True
    if old is not None and old.status != "finished":
        raise ExperimentError(
            f"{path}: an unfinished experiment ({old.status}, "
            f"{len(old.results)}/{len(old.spec.configurations())} configurations done) is recorded",
            hint="continue it with --resume, or choose another file with --state",
        )
    spec.validate()
    missing = [a for a in spec.axes if current_knobs.get(a) is None]
    if spec.restore and missing:
        raise ExperimentError(
            f"the recipe does not set {', '.join(missing)}: its starting value cannot be restored",
            hint="set it in the recipe first (spark-ops apply), or pass --no-restore",
        )
    return ExperimentState(spec, dict(current_knobs)), False
