"""`spark-ops experiment`: apply each configuration, sweep it, compare them, restore the start.

One Operation (one cluster lock) covers the whole run. Progress is kept in a local state file,
written atomically after each configuration, so that an interrupted experiment can be resumed
without redoing finished configurations. The comparison across configurations and its reading
(`read_experiment`) are pure functions of the sweep results.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from spark_ops.bench.sweep import SweepResult
from spark_ops.errors import ExitStatus, SparkOpsError, VerifyError
from spark_ops.log import get_logger

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

    def reading(self) -> ExperimentReading:
        """The comparison across the finished configurations."""
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


@dataclass
class Hooks:
    """Callbacks the CLI gives to show progress (each optional)."""

    on_config: Hook | None = None  # (index, total, label, restart: bool)
    on_step: Hook | None = None
    on_event: Hook | None = None
    on_level: Hook | None = None
    on_note: Hook | None = None

    def note(self, text: str) -> None:
        """Pass a one-line note on."""
        if self.on_note is not None:
            self.on_note(text)


@dataclass
class ApplySettings:
    """How each configuration is applied (same meaning as apply's options)."""

    drain: bool = True
    drain_timeout_s: float = 120.0
    deadline_s: float | None = None
    force: bool = False


async def current_knobs(op: Any) -> dict[str, Any]:
    """The recipe's knob values on the head; kv_cache_memory as written (e.g. '60G')."""
    from spark_ops.recipe import knob_values, render_recipe
    from spark_ops.workflows import _jsonable

    texts = await op.read_recipes()
    text = texts.get(op.cluster.head.name, next(iter(texts.values())))
    knobs = _jsonable(knob_values(text, source=op.cluster.recipe.path))
    kv = render_recipe(text, source=op.cluster.recipe.path).args().get("--kv-cache-memory-bytes")
    return {**knobs, "kv_cache_memory": kv if isinstance(kv, str) else None}


async def _stamps(op: Any) -> tuple[int, list[float]]:
    """Used restarts and the stamps in the window, as the head sees them."""
    view = await op.watchdog.budget()
    return view.used, sorted(float(s["stamp"]) for s in view.stamps)


async def _apply(
    op: Any, changes: list[Any], settings: ApplySettings, hooks: Hooks, reason: str
) -> dict[str, Any]:
    """Plan and execute one apply; a failed boot or check raises; returns what it did."""
    from spark_ops.workflows import ApplyOptions, execute, plan_apply

    opts = ApplyOptions(
        changes=changes, force=settings.force, drain=settings.drain,
        drain_timeout_s=settings.drain_timeout_s, deadline_s=settings.deadline_s, reason=reason,
    )  # fmt: skip
    plan = await plan_apply(op, opts)
    if not plan.changes:
        return {"restarted": False, "knobs": plan.facts.get("knobs_after")}
    outcome = await execute(op, plan, opts, on_step=hooks.on_step, on_event=hooks.on_event)
    bad = [c for c in outcome.checks if not c["ok"]]
    if bad:
        raise VerifyError(
            f"after the restart, check {bad[0]['name']} on {bad[0]['host']} failed: "
            f"{bad[0]['detail']}",
            hint="the engine does not run the configuration asked for; fix it, then --resume",
        )
    return {
        "restarted": True,
        "knobs": plan.facts.get("knobs_after"),
        "stamp": outcome.stamp,
        "pruned": outcome.pruned,
        "boot_s": (outcome.boot or {}).get("total_s"),
    }


async def _run_config(
    op: Any, state: ExperimentState, config: dict[str, Any], settings: ApplySettings,
    hooks: Hooks, secrets: dict[str, Any],
) -> dict[str, Any]:  # fmt: skip
    """Apply one configuration, sweep it, check the budget is as before."""
    from spark_ops.bench.sweep import SweepConfig, run_sweep

    used_before, before = await _stamps(op)
    reason = f"{REASON}: {label(config)})"
    applied = await _apply(op, changes_for(config), settings, hooks, reason)
    sweep_opts = {k: v for k, v in state.spec.sweep.items() if k != "prompts_path"}
    prompts = state.spec.sweep.get("prompts_path")
    cfg = SweepConfig(
        base_url=await op.api_url(), knobs=applied["knobs"],
        prompts_path=Path(prompts) if prompts else None, **sweep_opts, **secrets,
    )  # fmt: skip
    result = await run_sweep(cfg, on_level=hooks.on_level)
    used_after, after = await _stamps(op)
    new = sorted(set(after) - set(before))
    if new:
        hooks.note(f"new restart stamp(s) {new} appeared during {label(config)} (not ours: kept)")
    return {
        "label": label(config),
        "knobs": config,
        "apply": applied,
        "budget": {"used_before": used_before, "used_after": used_after, "new_stamps": new},
        "budget_as_before": not new,
        "sweep": result.to_dict(),
        "finished_at": _now(),
    }


@dataclass
class ExperimentOutcome:
    """How the run ended: the state (results, restore), the reading, the budget at both ends."""

    state: ExperimentState
    reading: ExperimentReading
    budget_before: dict[str, Any]
    budget_after: dict[str, Any] | None
    interrupted: bool = False
    failure: SparkOpsError | None = None

    @property
    def ok(self) -> bool:
        """True when every configuration was measured and the restore (if asked) worked."""
        restored = self.state.restore is None or self.state.restore.get("ok", False)
        return self.state.status == "finished" and restored

    def to_dict(self) -> dict[str, Any]:
        """Serialize for --json."""
        return {
            "ok": self.ok,
            "status": self.state.status,
            "interrupted": self.interrupted,
            "error": self.failure.to_dict() if self.failure else None,
            "budget_before": self.budget_before,
            "budget_after": self.budget_after,
            "state": self.state.to_dict(),
            "reading": self.reading.to_dict(),
        }


async def run_experiment(
    op: Any, state: ExperimentState, path: Path, *, settings: ApplySettings | None = None,
    hooks: Hooks | None = None, secrets: dict[str, Any] | None = None,
) -> ExperimentOutcome:  # fmt: skip
    """Run every unfinished configuration, then restore (also after a failure or Ctrl-C)."""
    settings = settings or ApplySettings()
    hooks = hooks or Hooks()
    log = get_logger(cluster=state.spec.cluster, op="experiment")
    if state.in_progress:
        hooks.note(f"the previous run was killed while applying {state.in_progress}")
    # under the lock no other experiment runs: a stamp of ours in the window is a leftover of a
    # killed run (every restart of ours is pruned by apply, or at the end of an interrupted run)
    await _prune_leftovers(op, [], hooks)
    used, stamps = await _stamps(op)
    budget_before: dict[str, Any] = {"used": used, "stamps": stamps}
    state.status, state.error, state.restore = "running", None, None
    state.save(path)
    failure: SparkOpsError | None = None
    interrupted = False
    configs = state.spec.configurations()
    try:
        for i, config in enumerate(configs, 1):
            name = label(config)
            if name in state.results:
                hooks.note(f"{name}: measured in an earlier run; skipped")
                continue
            if hooks.on_config is not None:
                hooks.on_config(i, len(configs), name)
            state.in_progress = name
            state.save(path)
            state.results[name] = await _run_config(
                op, state, config, settings, hooks, secrets or {}
            )
            state.in_progress = None
            state.save(path)
            log.info("experiment_config_done", config=name)
        state.status = "finished"
    except (asyncio.CancelledError, KeyboardInterrupt):
        task = asyncio.current_task()
        if task is not None:
            task.uncancel()
        interrupted = True
        state.status = "interrupted"
        state.error = {"error": "Interrupted", "message": "interrupted by the operator"}
    except Exception as exc:  # any failure still ends in the restore
        failure = (
            exc if isinstance(exc, SparkOpsError) else SparkOpsError(f"{type(exc).__name__}: {exc}")
        )
        state.status = "failed"
        state.error = failure.to_dict()
    state.save(path)
    if state.spec.restore:
        state.restore = await _restore(op, state, settings, hooks)
        state.save(path)
    budget_after: dict[str, Any] | None
    try:
        await _prune_leftovers(op, budget_before["stamps"], hooks)
        state.in_progress = None  # handled: only a killed run leaves it set
        state.save(path)
        used, stamps = await _stamps(op)
        budget_after = {"used": used, "stamps": stamps}
    except SparkOpsError:
        budget_after = None
    return ExperimentOutcome(
        state, state.reading(), budget_before, budget_after, interrupted, failure
    )


async def _prune_leftovers(op: Any, keep: list[float], hooks: Hooks) -> list[float]:
    """Prune stamps of our own restarts that an interruption left (before their own prune)."""
    view = await op.watchdog.budget()
    ours = [
        float(s["stamp"])
        for s in view.stamps
        if float(s["stamp"]) not in keep and str(s.get("reason", "")).startswith(REASON)
    ]
    if not ours:
        return []
    result = await op.watchdog.prune(stamps=ours, reason=f"{REASON}: left by an interruption)")
    removed = [float(x) for x in result["removed_stamps"]]
    hooks.note(f"pruned {removed}: restart stamp(s) of this experiment left by an interruption")
    return removed


async def _restore(
    op: Any, state: ExperimentState, settings: ApplySettings, hooks: Hooks
) -> dict[str, Any]:
    """Put the starting knob values back (one more planned restart when they differ)."""
    start = {a: state.start_knobs.get(a) for a in state.spec.axes}
    hooks.note(f"restoring the starting configuration: {label(start)} (Ctrl-C again abandons it)")
    try:
        done = await _apply(op, changes_for(start), settings, hooks, f"{REASON}: restore)")
    except (asyncio.CancelledError, KeyboardInterrupt):
        return {"ok": False, "knobs": start, "error": "interrupted during the restore"}
    except Exception as exc:  # reported, never raised: the run's own outcome comes first
        return {"ok": False, "knobs": start, "error": getattr(exc, "message", str(exc))}
    return {
        "ok": True,
        "knobs": start,
        "restarted": done["restarted"],
        "pruned": done.get("pruned"),
    }


# ---- the reading: pure functions of the configurations' sweep results ----

CLEAR_MARGIN = 1.05  # the best configuration at a level must beat the next by 5% to be called best
BOTTLENECK_RATIO = 1.2  # a higher cap giving 20% more aggregate makes the lower cap the limit


@dataclass
class ExperimentReading:
    """Comparison per level (ratios to the first), per-configuration readings, the text."""

    configs: list[dict[str, Any]]
    levels: list[dict[str, Any]]
    bottleneck: dict[str, Any] | None
    recommended: str | None
    slo_tok_s: float | None
    lines: list[str]

    def to_dict(self) -> dict[str, Any]:
        """Serialize for --json."""
        return dict(self.__dict__)


def _users(n: int) -> str:
    """'1 concurrent request' / '64 concurrent requests'."""
    return f"{n} concurrent request{'s' if n != 1 else ''}"


def _config_reading(name: str, r: SweepResult) -> dict[str, Any]:
    """One configuration's knee, SLO concurrency and cap, from its sweep's reading."""
    cap = r.reading.cap
    knob = (r.knobs or {}).get("max_num_seqs")
    return {
        "label": name,
        "max_num_seqs": int(knob) if isinstance(knob, int | str) and str(knob).isdigit() else None,
        "knee": r.reading.knee,
        "knee_gain": r.reading.knee_gain,
        "slo_max_concurrency": r.reading.slo_max_concurrency,
        "slo_text": r.reading.slo_text,
        "metrics": r.metrics_available,
        "cap": cap.to_dict(),
        "cap_is_knob": bool(cap.detected and cap.matches_knob),
        "aggregate": {lv.max_concurrency: lv.output_throughput for lv in r.levels},
        "per_user": {lv.max_concurrency: lv.per_user_tok_s for lv in r.levels},
    }


def _level_rows(configs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per level: each configuration's figures, ratios to the first one, and the best."""
    levels = sorted({c for cfg in configs for c in cfg["aggregate"]})
    rows = []
    for c in levels:
        first = configs[0]
        cells = []
        for cfg in configs:
            agg, user = cfg["aggregate"].get(c), cfg["per_user"].get(c)
            a0, u0 = first["aggregate"].get(c), first["per_user"].get(c)
            cells.append({
                "label": cfg["label"], "aggregate": agg, "per_user": user,
                "ratio_aggregate": agg / a0 if agg is not None and a0 else None,
                "ratio_per_user": user / u0 if user is not None and u0 else None,
            })  # fmt: skip
        ranked = sorted(
            (x for x in cells if x["aggregate"] is not None), key=lambda x: -x["aggregate"]
        )
        clear = len(ranked) == 1 or (
            len(ranked) > 1 and ranked[0]["aggregate"] >= CLEAR_MARGIN * ranked[1]["aggregate"]
        )
        best = ranked[0]["label"] if ranked else None
        rows.append({"concurrency": c, "cells": cells, "best": best, "clear": clear})
    return rows


def _bottleneck(configs: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The first capped configuration that a higher max_num_seqs clearly beat at the top level."""
    for low in configs:
        if not low["cap_is_knob"]:
            continue
        best: dict[str, Any] | None = None
        for high in configs:
            if (high["max_num_seqs"] or 0) <= (low["max_num_seqs"] or 0):
                continue
            common = set(low["aggregate"]) & set(high["aggregate"])
            if not common:
                continue
            top = max(common)
            before, after = low["aggregate"][top], high["aggregate"][top]
            ratio = after / before if before else None
            if ratio is not None and (best is None or ratio > best["ratio"]):
                best = {
                    "capped": low["label"], "knob": low["max_num_seqs"], "higher": high["label"],
                    "level": top, "before": before, "after": after, "ratio": ratio,
                    "cap": low["cap"],
                }  # fmt: skip
        if best is not None:
            best["is_bottleneck"] = best["ratio"] >= BOTTLENECK_RATIO
            return best
    return None


def _level_lines(rows: list[dict[str, Any]], first: str) -> list[str]:
    """Which configuration is best at each level, in words."""
    lines = []
    for row in rows:
        if row["best"] is None:
            continue
        cell = next(x for x in row["cells"] if x["label"] == row["best"])
        at = f"At {_users(row['concurrency'])}"
        if not row["clear"]:
            lines.append(
                f"{at}: no clear difference (all within {CLEAR_MARGIN - 1:.0%} of "
                f"{cell['aggregate']:.0f} tok/s)."
            )
            continue
        ratio = cell["ratio_aggregate"]
        vs = f", {ratio:.2f}x {first}" if row["best"] != first and ratio else ""
        lines.append(f"{at}: {row['best']} is best, {cell['aggregate']:.0f} tok/s aggregate{vs}.")
    return lines


def _cap_line(cfg: dict[str, Any]) -> str:
    """Whether max_num_seqs capped one configuration, in words."""
    cap, name = cfg["cap"], cfg["label"]
    if not cfg["metrics"]:
        return f"{name}: cap unknown (the engine's /metrics was not readable)."
    if cfg["cap_is_knob"]:
        return (
            f"{name}: the cap was reached — running requests stayed at {cap['plateau']} while "
            f"others waited ({cap['at_plateau']} of {cap['waiting_samples']} samples)."
        )
    if cap["detected"]:
        return (
            f"{name}: running requests plateaued at {cap['plateau']} while others waited, below "
            f"max_num_seqs={cfg['max_num_seqs']}: another limit (KV cache?) holds them back."
        )
    return f"{name}: the cap was not reached (no requests waited behind a full batch)."


def _bottleneck_line(neck: dict[str, Any]) -> str:
    """The verdict on a capped configuration against a higher cap."""
    at = f"{_users(neck['level'])} ({neck['before']:.0f} → {neck['after']:.0f} tok/s)"
    if neck["is_bottleneck"]:
        return (
            f"The cap of {neck['knob']} was the bottleneck: with {neck['capped']} the engine ran "
            f"{neck['cap']['plateau']} requests at a time while the rest waited, and "
            f"{neck['higher']} gave {neck['ratio']:.1f}x the aggregate throughput at {at}."
        )
    return (
        f"The cap of {neck['knob']} was reached, but {neck['higher']} gained only "
        f"{neck['ratio']:.2f}x at {at}: the cap is not what limits throughput here."
    )


def _recommendation(rec: dict[str, Any], top: int, n: int, slo: float | None) -> str:
    """The configuration to keep, the concurrency for the per-user SLO, and the knee."""
    text = f"Recommendation: {rec['label']}"
    text += f" (highest aggregate at {_users(top)})." if n > 1 else "."
    if slo is not None and rec["slo_max_concurrency"] is not None:
        text += (
            f" For interactive use keep ≤{rec['slo_max_concurrency']} concurrent users to give "
            f"each ≥{slo:g} tok/s."
        )
    elif slo is not None:
        text += f" No level measured gives ≥{slo:g} tok/s per user with it."
    levels = sorted(rec["aggregate"])
    if rec["knee"] is not None and levels.index(rec["knee"]) > 0:
        prev = levels[levels.index(rec["knee"]) - 1]
        text += (
            f" The aggregate flattens at {rec['knee']} (under {rec['knee_gain']:.0%} more than at "
            f"{prev}): batch work gains little beyond {prev} concurrent requests."
        )
    elif len(levels) > 1:
        gain = rec["aggregate"][levels[-1]] / rec["aggregate"][levels[-2]] - 1
        text += (
            f" The aggregate still grew {gain:+.0%} from {levels[-2]} to {levels[-1]}: batch work "
            f"can go to {levels[-1]} concurrent requests (no saturation knee measured)."
        )
    return text


def read_experiment(
    results: list[tuple[str, SweepResult]], *, slo_tok_s: float | None = None
) -> ExperimentReading:
    """The verdict first (bottleneck, recommendation), then the best per level and each cap."""
    configs = [_config_reading(name, r) for name, r in results]
    if not configs:
        return ExperimentReading([], [], None, None, slo_tok_s, ["No configuration was measured."])
    rows = _level_rows(configs)
    top = rows[-1]["concurrency"]
    measured = [c for c in configs if c["aggregate"].get(top) is not None] or configs
    rec = max(measured, key=lambda c: c["aggregate"].get(top) or 0.0)
    neck = _bottleneck(configs)
    lines = [_bottleneck_line(neck)] if neck is not None else []
    lines.append(_recommendation(rec, top, len(configs), slo_tok_s))
    if len(configs) > 1:
        lines += _level_lines(rows, configs[0]["label"])
    lines += [_cap_line(cfg) for cfg in configs]
    return ExperimentReading(configs, rows, neck, rec["label"], slo_tok_s, lines)
