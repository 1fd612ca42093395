"""The experiment's specification and resumable state file (no I/O beyond that file)."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from spark_ops.bench.confirm import Confirmation, confirm
from spark_ops.bench.sweep import SweepResult
from spark_ops.bench.whatif import predicted_sweep, whatif_of
from spark_ops.errors import BenchError, ExitStatus, RecipeError, SparkOpsError
from spark_ops.files import read_regular, remove_file, sha256_of, write_file
from spark_ops.recipe import Change, changes_from_options, parse_kv_cache_memory
from spark_ops.workflows.experiment.reading import ExperimentReading, read_experiment

SCHEMA = "spark-ops.experiment/1"
MAX_STATE_BYTES = 64 * 1024 * 1024  # a state file holds every sweep: generous, never unbounded
REASON = "planned restart (spark-ops experiment"  # every restart of ours is journalled with this
AXES = ("max_num_seqs", "moe_backend", "kv_cache_memory", "enforce_eager")

Hook = Callable[..., Any]


class ExperimentError(SparkOpsError):
    """The experiment cannot start or go on (state file, configurations, restore)."""

    exit_status = ExitStatus.CONFLICT


class ExperimentUsageError(ExperimentError):
    """The configurations asked for make no sense (no knob, a repeated value)."""

    exit_status = ExitStatus.USAGE


def default_state_path(cluster: str) -> Path:
    """~/.local/state/spark-ops/experiment-<cluster>.json."""
    return Path.home() / ".local" / "state" / "spark-ops" / f"experiment-{cluster}.json"


def now_iso() -> str:
    """UTC time as ISO 8601."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def normalize(axis: str, value: Any) -> Any:
    """A knob value in the form knob_values() reports it (bytes for kv, bool for eager)."""
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


def changes_for(config: dict[str, Any]) -> list[Change]:
    """Validated recipe changes that set a configuration's knobs."""
    return changes_from_options(**{k: v for k, v in config.items()})


@dataclass
class ExperimentSpec:
    """What to compare (axes, cartesian product) and how to sweep each configuration."""

    cluster: str
    axes: dict[str, list[Any]]
    sweep: dict[str, Any]
    restore: bool = True
    what_if_caps: list[int] = field(default_factory=list)  # lower caps predicted, never measured
    measure_all: bool = False  # restart for every max_num_seqs value (no prediction)
    confirm: bool = False  # restart to measure a predicted winner

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

    def predicted(self) -> dict[str, dict[str, Any]]:
        """Configurations read from a sweep at a higher cap: label -> the measured one's knobs.

        For each combination of the other knobs only the highest max_num_seqs is measured; the
        lower values (unless --measure-all) and every --what-if-cap below it are read from its
        sweep without a restart. A predicted configuration is its base with its own cap.
        """
        if "max_num_seqs" not in self.axes:
            return {}
        asked = {int(v) for v in self.axes["max_num_seqs"]}
        top = max(asked)
        lower = sorted(
            ({c for c in asked if not self.measure_all} | set(self.what_if_caps)) - {top}
        )
        out: dict[str, dict[str, Any]] = {}
        for base in self.configurations():
            if int(base["max_num_seqs"]) == top:
                for cap in (c for c in lower if c < top):
                    out[label({**base, "max_num_seqs": cap})] = base
        return out

    def every_configuration(self) -> list[dict[str, Any]]:
        """Measured and predicted configurations: grouped by the other knobs, caps ascending."""
        groups: dict[str, list[dict[str, Any]]] = {}
        extra = [{**base, "max_num_seqs": _cap_of(name)} for name, base in self.predicted().items()]
        for config in [*self.configurations(), *extra]:
            row = groups.setdefault(label({**config, "max_num_seqs": None}), [])
            if label(config) not in {label(c) for c in row}:
                row.append(config)
        return [c for row in groups.values() for c in sorted(row, key=_cap)]

    def measured(self) -> list[dict[str, Any]]:
        """The configurations that take a restart and a sweep, in the order given."""
        skip = set(self.predicted())
        return [c for c in self.configurations() if label(c) not in skip]

    def to_dict(self) -> dict[str, Any]:
        """Serialize for the state file."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ExperimentSpec:
        """Rebuild from to_dict() output."""
        return cls(
            data["cluster"], dict(data["axes"]), dict(data["sweep"]), bool(data["restore"]),
            [int(c) for c in data.get("what_if_caps", [])], bool(data.get("measure_all", False)),
            bool(data.get("confirm", False)),
        )  # fmt: skip


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
    started_at: str = field(default_factory=now_iso)
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
        """Write atomically with spark-ops' one local writer (temp file, fsyncs, rename)."""
        self.updated_at = now_iso()
        text = json.dumps(self.to_dict(), indent=2, ensure_ascii=False) + "\n"
        write_file(path, text, error=ExperimentError, make_parents=True)

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
        """The finished configurations' sweeps, in plan order (measured ones only)."""
        out = []
        names = [label(c) for c in self.spec.configurations()]
        names += [n for n in self.spec.predicted() if n not in names]
        for name in names:
            run = self.results.get(name)
            if run is not None:
                out.append((name, SweepResult.from_dict(run["sweep"], source=name)))
        return out

    def all_results(self) -> list[tuple[str, SweepResult]]:
        """Measured sweeps and the predicted ones (from their measured base), in plan order."""
        measured = dict(self.sweep_results())
        predicted = self.spec.predicted()
        out = []
        for config in self.spec.every_configuration():
            name = label(config)
            if name in measured:
                out.append((name, measured[name]))
            elif name in predicted and label(predicted[name]) in measured:
                base_name = label(predicted[name])
                out.append((name, predicted_sweep(measured[base_name], _cap(config), base_name)))
        return out

    def confirmations(self) -> list[tuple[str, Confirmation]]:
        """Each predicted configuration measured after all (--confirm) against its prediction.

        Paired with the name of the sweep it was predicted from (a what-if that cannot be read
        from that sweep gives no confirmation).
        """
        measured = dict(self.sweep_results())
        predicted = self.spec.predicted()
        out = []
        for config in self.spec.every_configuration():
            name = label(config)
            base_knobs = predicted.get(name)
            if base_knobs is None or name not in measured or label(base_knobs) not in measured:
                continue
            base = label(base_knobs)
            try:
                curve = whatif_of(measured[base], [_cap(config)]).caps[0]
            except BenchError:
                continue
            out.append((base, confirm(curve, measured[name].levels)))
        return out

    def reading(self) -> ExperimentReading:
        """The comparison across measured and predicted configurations."""
        return read_experiment(
            self.all_results(),
            slo_tok_s=self.spec.sweep.get("slo_tok_s"),
            confirm=self.spec.confirm,
            partial=self.partial(),
        )

    def partial(self) -> str | None:
        """Why the measured part is not whole (a configuration not measured, a level whose every
        request failed, a restart by the watchdog during a sweep), or None."""
        missing = [label(c) for c in self.spec.measured() if label(c) not in self.results]
        if missing:
            return f"not measured: {', '.join(missing)}"
        lost = []
        for name, r in self.results.items():
            levels = (r.get("sweep") or {}).get("levels") or []
            empty = [lv.get("max_concurrency") for lv in levels if not lv.get("completed")]
            if empty:
                at = ", ".join(map(str, empty))
                lost.append(f"{name}: every request failed at concurrency {at}")
            elif r.get("budget_as_before") is False:
                lost.append(f"{name}: the watchdog restarted the engine during its sweep")
        return "; ".join(lost) or None

    def downtime_s(self) -> float:
        """Seconds of boots this experiment spent (every restart, the restore's included)."""
        boots = [r.get("apply", {}).get("boot_s") for r in self.results.values()]
        boots.append((self.restore or {}).get("boot_s"))
        return float(sum(b for b in boots if isinstance(b, int | float)))

    def restarts_done(self) -> int:
        """Restarts this experiment made (configurations that restarted, and the restore)."""
        n = sum(1 for r in self.results.values() if r.get("apply", {}).get("restarted"))
        return n + int(bool((self.restore or {}).get("restarted")))


def _cap_of(name: str) -> int:
    """The max_num_seqs in a configuration's label."""
    return int(name.split("max_num_seqs=", 1)[1].split(",", 1)[0])


def _cap(config: dict[str, Any]) -> int:
    """A configuration's max_num_seqs (0 when it has none), for ordering."""
    value = config.get("max_num_seqs")
    return int(value) if value is not None else 0


@dataclass(frozen=True)
class Recorded:
    """An experiment state file as `experiment --discard` found it: what it holds, its digest."""

    path: Path
    state: ExperimentState
    sha256: str

    def describe(self) -> str:
        """The experiment in words: cluster, what it compares, its status, how far it got."""
        st = self.state
        axes = "; ".join(
            f"{axis} {', '.join(str(v) for v in values)}" for axis, values in st.spec.axes.items()
        )
        return (
            f"the experiment on cluster {st.spec.cluster} comparing {axes} ({st.status}, "
            f"{len(st.results)}/{len(st.spec.measured())} configurations measured, started "
            f"{st.started_at})"
        )

    def to_dict(self) -> dict[str, Any]:
        """Serialize for --json."""
        st = self.state
        return {
            "path": str(self.path), "cluster": st.spec.cluster, "axes": st.spec.axes,
            "status": st.status, "measured": len(st.results),
            "configurations": len(st.spec.measured()), "started_at": st.started_at,
        }  # fmt: skip


def recorded_state(path: Path, cluster: str) -> Recorded | None:
    """The experiment state at `path` when it is spark-ops' own for `cluster` (None: no file);
    a link, a FIFO, a file that is not an experiment state, or another cluster's, is refused."""
    try:
        raw = read_regular(path, limit=MAX_STATE_BYTES, follow=False)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ExperimentError(
            f"{path}: not a regular file ({exc.strerror or exc}): not spark-ops' experiment state",
            hint="remove it yourself if it is yours to remove; spark-ops removes only its own file",
        ) from exc
    if len(raw) > MAX_STATE_BYTES:
        raise ExperimentError(f"{path}: larger than {MAX_STATE_BYTES} bytes: not a state file")
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise ExperimentError(
            f"{path}: not JSON, so not spark-ops' experiment state: {exc}",
            hint="remove it yourself if it is yours to remove; spark-ops removes only its own file",
        ) from exc
    state = ExperimentState.from_dict(data, source=str(path))
    if state.spec.cluster != cluster:
        raise ExperimentError(
            f"{path}: the experiment state of cluster {state.spec.cluster!r}, not {cluster!r}: "
            "not removed",
            hint="discard it for its own cluster: "
            f"spark-ops -c {state.spec.cluster} experiment --discard --state {path}",
        )
    return Recorded(Path(path), state, sha256_of(raw))


def discard_state(found: Recorded) -> None:
    """Remove the experiment state file found (only if it still holds what was read)."""
    remove_file(
        found.path, expect_sha256=found.sha256, limit=MAX_STATE_BYTES, error=ExperimentError
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
            f"{len(old.results)}/{len(old.spec.measured())} configurations done) is recorded",
            hint="continue it with --resume, discard it with --discard (removes this state "
            "file only: its measurements are lost), or choose another file with --state",
        )
    spec.validate()
    missing = [a for a in spec.axes if current_knobs.get(a) is None]
    if spec.restore and missing:
        raise RecipeError(
            f"the recipe does not set {', '.join(missing)}: its starting value cannot be restored",
            hint="set it in the recipe first (spark-ops apply), or pass --no-restore",
        )
    return ExperimentState(spec, dict(current_knobs)), False
