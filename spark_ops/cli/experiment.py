"""`spark-ops experiment`: apply each configuration, sweep, compare, restore (its options; the
plan, progress and report it shows are in experiment_report.py)."""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from spark_ops.cli.bench import DEFAULT_CONCURRENCY, parse_caps, parse_levels, report_width
from spark_ops.cli.common import (
    SAID,
    confirm,
    echo_gate,
    emit_json,
    load_cluster,
    quiet,
    run_async,
)
from spark_ops.cli.experiment_report import Progress, echo_plan, render_report

if TYPE_CHECKING:  # the CLI imports its workflow when a command runs (start-up time)
    from spark_ops.inventory import Cluster
    from spark_ops.workflows.facts import Gate

AXIS_OPTIONS = ("max_num_seqs", "moe_backend", "kv_cache_memory")


def _values(text: str | None, option: str) -> list[Any] | None:
    """'6,64' into ['6', '64'] (None when the option was not given)."""
    if text is None:
        return None
    values = [v.strip() for v in text.split(",") if v.strip()]
    if not values:
        raise click.BadParameter(
            f"{text!r}: give one or more values, comma-separated", param_hint=option
        )
    return values


def _axes(kw: dict[str, Any]) -> dict[str, list[Any]]:
    """The knobs to vary, in the order max-num-seqs, moe-backend, kv-cache-memory, enforce-eager."""
    axes: dict[str, list[Any]] = {}
    for name in AXIS_OPTIONS:
        values = _values(kw[name], "--" + name.replace("_", "-"))
        if values is not None:
            axes[name] = [int(v) if name == "max_num_seqs" and v.isdigit() else v for v in values]
    if kw["enforce_eager"] is not None:
        axes["enforce_eager"] = [kw["enforce_eager"]]
    return axes


def _sweep_settings(kw: dict[str, Any], caps: list[int], what_if: list[int]) -> dict[str, Any]:
    """The bench settings every configuration is swept with (stored in the state file).

    Every lower cap asked about is a level too: its prediction reads the sweep's level there;
    the lowest is run again at the sweep's end (the speed check the predictions rest on).
    """
    from spark_ops.bench.whatif import levels_with_caps, recheck_level

    levels = levels_with_caps(parse_levels(kw["concurrency"]), caps)
    return {
        "model": kw["model"], "api": kw["api"], "levels": levels,
        "output_tokens": kw["output_tokens"], "mode": kw["mode"], "duration_s": kw["duration"],
        "rate": kw["rate"], "repeats": kw["repeats"], "warmup": kw["warmup"],
        "slo_tok_s": kw["slo_tok_s"], "timeout_s": kw["timeout"], "seed": kw["seed"],
        "prompts_path": str(kw["prompts_path"]) if kw["prompts_path"] else None,
        "recheck": recheck_level(what_if),
    }  # fmt: skip


def _discard(cluster: Cluster, path: Path, kw: dict[str, Any]) -> int:
    """`experiment --discard`: remove this cluster's experiment state file, and only that (a live
    experiment's, which holds the cluster lock, is refused); say what was removed."""
    from spark_ops.errors import Aborted
    from spark_ops.lock import lock_state, locked_error
    from spark_ops.workflows import Operation
    from spark_ops.workflows.experiment import discard_state, recorded_state

    found = recorded_state(path, cluster.name)
    if found is None:
        if kw["as_json"]:
            emit_json({"removed": None, "path": str(path)})
        elif not quiet():
            click.echo(f"No experiment state at {path}: nothing removed.")
        return 0
    if found.state.status == "running":  # a live experiment writes it; a killed one left it

        async def live() -> None:
            """Refuse while an experiment holds the cluster lock (it may be writing the file)."""
            async with Operation.open(
                cluster, "experiment", lock=False, nodes=[cluster.head.name]
            ) as op:
                held, holder, where = await lock_state(op.session)
                if held and holder.get("operation") == "experiment":
                    raise locked_error(cluster, holder, where)

        run_async(live())
    what = found.describe()
    if not kw["yes"] and not click.confirm(
        f"Remove {path}: {what}? Its measurements are lost.", default=False, err=True
    ):
        raise Aborted("not confirmed; nothing was removed")
    discard_state(found)
    if kw["as_json"]:
        emit_json({"removed": found.to_dict(), "path": str(path)})
    elif not quiet():
        click.echo(f"Removed {path}: {what}. A new experiment can start.")
    return 0


@click.command("experiment")
@click.option("--max-num-seqs", help="Values to compare, comma-separated (e.g. 6,64).")
@click.option(
    "--moe-backend", help="MoE backends to compare, comma-separated (e.g. marlin,cutlass)."
)
@click.option(
    "--kv-cache-memory", help="KV cache sizes to compare, comma-separated (e.g. 60G,40G)."
)
@click.option(
    "--enforce-eager/--no-enforce-eager", default=None, help="Set in every configuration."
)
@click.option(
    "--what-if-cap",
    "what_if_cap",
    help="Lower max-num-seqs values to predict from the sweep at the highest (no restart).",
)
@click.option(
    "--measure-all",
    is_flag=True,
    help="Restart and sweep every --max-num-seqs value (no prediction of the lower ones).",
)
@click.option(
    "--confirm", is_flag=True, help="Restart to measure the recommendation when it was predicted."
)
@click.option("--concurrency", default=DEFAULT_CONCURRENCY, show_default=True, help="Levels.")
@click.option("--output-tokens", type=click.IntRange(min=1), default=300, show_default=True)
@click.option("--repeats", type=click.IntRange(min=1), default=1, show_default=True)
@click.option(
    "--mode",
    type=click.Choice(["burst", "sustained", "poisson"]),
    default="burst",
    show_default=True,
)
@click.option(
    "--duration", type=float, default=60.0, show_default=True, help="s (sustained, poisson)."
)
@click.option("--rate", type=float, help="Poisson arrivals per second.")
@click.option("--warmup", type=click.IntRange(min=0), default=0, show_default=True)
@click.option(
    "--slo-tok-s", type=float, default=12.0, show_default=True, help="Per-user tok/s to keep."
)
@click.option("--timeout", type=float, default=600.0, show_default=True, help="Per request, s.")
@click.option("--model", help="Model name (default: the first one /v1/models lists).")
@click.option(
    "--api", type=click.Choice(["chat", "completions"]), default="chat", show_default=True
)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option(
    "--prompts", "prompts_path", type=click.Path(dir_okay=False, exists=True, path_type=Path)
)
@click.option("--api-key", envvar="SPARK_OPS_API_KEY", help="Bearer token (not stored).")
@click.option(
    "--no-drain", is_flag=True, help="Do not wait for in-flight requests before a restart."
)
@click.option("--deadline", type=float, help="Boot deadline in seconds (inventory's by default).")
@click.option("--force", is_flag=True, help="Overwrite recipe copies that differ.")
@click.option(
    "--over-budget",
    is_flag=True,
    help="Restart even when the watchdog's restart budget has no slot left.",
)
@click.option(
    "--unleased-load",
    is_flag=True,
    help="Run a level that would starve the watchdog's probe even when no lease can pause it.",
)
@click.option("--no-restore", is_flag=True, help="Leave the last configuration in place.")
@click.option("--resume", is_flag=True, help="Continue the experiment recorded in the state file.")
@click.option(
    "--discard",
    is_flag=True,
    help="Remove the experiment state recorded for this cluster (spark-ops' own state file only; "
    "its measurements are lost) so that a new experiment can start.",
)
@click.option(
    "--state",
    "state_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="State file (default ~/.local/state/spark-ops/experiment-<cluster>.json).",
)
@click.option("--json", "as_json", is_flag=True, help="The outcome as JSON on stdout (no report).")
@click.option(
    "-o",
    "--output",
    "json_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write the outcome as JSON to this file.",
)
@click.option("--dry-run", is_flag=True, help="Show the plan and stop.")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@click.pass_context
def cli(ctx: click.Context, **kw: Any) -> int:
    """Apply each configuration, sweep it, compare them, then restore the starting one."""
    from spark_ops.errors import Aborted, ExitStatus
    from spark_ops.lock import refuse_if_locked
    from spark_ops.workflows import Operation
    from spark_ops.workflows.experiment import (
        ApplySettings,
        ExperimentSpec,
        Hooks,
        current_knobs,
        default_state_path,
        plan_experiment,
        run_experiment,
        start_state,
    )
    from spark_ops.workflows.gate import facts_differences, gate_refusal, read_gate, refuse_changes

    axes = _axes(kw)
    if kw["discard"]:
        if axes or kw["resume"]:
            raise click.UsageError("--discard takes no knob values and no --resume")
        cluster = load_cluster(ctx)
        return _discard(cluster, kw["state_path"] or default_state_path(cluster.name), kw)
    if not axes and not kw["resume"]:
        raise click.UsageError("nothing to compare: give values, e.g. --max-num-seqs 6,64")
    what_if = parse_caps(kw["what_if_cap"])
    seqs = [int(v) for v in axes.get("max_num_seqs", []) if isinstance(v, int)]
    if what_if and not seqs:
        raise click.BadParameter(
            "a what-if reads lower caps from a sweep at a higher one: give --max-num-seqs too",
            param_hint="--what-if-cap",
        )
    if what_if and max(what_if) >= max(seqs):
        raise click.BadParameter(
            f"{max(what_if)} is not below the highest --max-num-seqs ({max(seqs)}): raising the "
            "cap takes a restart, give it in --max-num-seqs",
            param_hint="--what-if-cap",
        )
    sweep = _sweep_settings(kw, sorted(set(seqs) | set(what_if)), what_if)
    if axes:  # every value checked before connecting: the option and value are named
        ExperimentSpec("", axes, sweep).validate()
    cluster = load_cluster(ctx)
    path = kw["state_path"] or default_state_path(cluster.name)
    spec = ExperimentSpec(
        cluster.name, axes, sweep, restore=not kw["no_restore"], what_if_caps=what_if,
        measure_all=kw["measure_all"], confirm=kw["confirm"],
    )  # fmt: skip
    settings = ApplySettings(
        drain=not kw["no_drain"], deadline_s=kw["deadline"], force=kw["force"],
        over_budget=kw["over_budget"], unleased_load=kw["unleased_load"],
    )  # fmt: skip
    from spark_ops.readiness import history_key

    progress = Progress(cluster.name, len(cluster.workers), kw["as_json"], history_key(cluster))
    hooks = Hooks(progress.on_config, progress.on_step, progress.on_event, progress.on_level,
                  progress.on_note)  # fmt: skip

    async def plan_now(op: Operation) -> tuple[Any, Any, dict[str, str], Gate | None]:
        """The state, the plan, each recipe copy's digest and the budget its restarts meet, as
        the cluster stands now (a colleague's edit of any line is a change, not only a knob's)."""
        from spark_ops.remote import sha256

        knobs = await current_knobs(op)
        digests = {node: sha256(text) for node, text in (await op.read_recipes()).items()}
        state, resumed = start_state(spec, knobs, path, resume=kw["resume"])
        plan = plan_experiment(
            state, knobs, path, resumed, watchdog=cluster.watchdog, unleased=kw["unleased_load"]
        )
        gate = await read_gate(op, kw["over_budget"]) if plan.restarts else None
        return state, plan, digests, gate

    async def flow() -> Any:
        """Plan without the lock, confirm; then lock, plan again, run only the plan shown."""
        async with Operation.open(cluster, "experiment", lock=False) as op:
            if not kw["dry_run"]:
                await refuse_if_locked(op.session)
            state, plan, digests, gate = await plan_now(op)
            asked = not kw["yes"] and not kw["dry_run"]
            err = kw["as_json"]  # under --json, stdout carries the report only
            if not quiet() or asked or kw["dry_run"]:  # -q: the plan when a prompt asks
                with contextlib.redirect_stdout(sys.stderr if err else sys.stdout):
                    echo_plan(plan, len(state.results), progress.history)
                    if gate is not None:
                        echo_gate(gate)
            refusals = [r for r in (gate_refusal(gate), plan.load_refusal()) if r is not None]
            if kw["dry_run"]:
                for refusal in refusals:
                    click.secho(f"\nexperiment would refuse: {refusal.message}", fg="red", err=err)
                    click.echo(f"hint: {refusal.hint}", err=err)
                click.echo("\nDry run: nothing was changed.", err=err)
                return int(refusals[0].exit_status) if refusals else None
            if refusals:
                raise refusals[0]
            if not kw["yes"] and not await confirm("\nProceed?"):
                raise Aborted("not confirmed; nothing was changed")
            async with op.hold_lock():
                state, again, digests_now, gate_now = await plan_now(op)
                refuse_changes(
                    facts_differences(
                        {**plan.to_dict(), "recipe sha256": digests},
                        {**again.to_dict(), "recipe sha256": digests_now},
                        (gate, gate_now),
                    )
                )
                secrets = {"api_key": kw["api_key"]} if kw["api_key"] else {}
                return await run_experiment(
                    op, state, path, settings=settings, hooks=hooks, secrets=secrets
                )

    outcome = run_async(flow())
    if outcome is None or isinstance(outcome, int):
        return outcome or 0
    if kw["as_json"]:
        emit_json(outcome.to_dict())
    else:
        click.echo(render_report(outcome, width=report_width()), nl=False)
    if kw["json_path"]:
        from spark_ops.files import write_file

        text = json.dumps(outcome.to_dict(), indent=2, default=str) + "\n"
        write_file(kw["json_path"], text)
        if not quiet():
            click.echo(f"wrote {kw['json_path']}", err=True)
    if outcome.interrupted:
        return int(ExitStatus.ABORTED)
    if outcome.failure is not None:
        err = outcome.failure
        if kw["as_json"]:
            click.echo(json.dumps(err.to_dict()), err=True)
        else:
            step = SAID.get(err.message)  # its ✗ line above says it: once is enough
            said = f"the {step} step failed (the ✗ {step} line above)" if step else err.message
            click.secho(f"error: {said}", fg="red", err=True)
            if err.hint:
                click.echo(f"hint: {err.hint}", err=True)
        return int(outcome.failure.exit_status)
    return 0 if outcome.ok else int(ExitStatus.CHECK_FAILED)
