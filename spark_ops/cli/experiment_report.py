"""What `spark-ops experiment` shows: its plan, its progress on stderr and its report."""

from __future__ import annotations

import io
import json
from typing import TYPE_CHECKING, Any

import click

from spark_ops.cli.common import SAID, quiet, step_reporter

if TYPE_CHECKING:  # the CLI imports its workflow when a command runs (start-up time)
    from spark_ops.workflows.experiment.plan import ExperimentPlan
    from spark_ops.workflows.experiment.run import ExperimentOutcome
    from spark_ops.workflows.experiment.state import ExperimentState
    from spark_ops.workflows.plan import StepRun


def echo_plan(plan: ExperimentPlan, n_done: int, history: str | None = None) -> None:
    """The configurations, the restarts they take and the restore, for a person."""
    click.secho(f"Experiment on cluster {plan.cluster}", bold=True)
    click.echo(
        f"  configurations: the cartesian product of the values given ({len(plan.configurations)})"
    )
    click.echo(
        f"  recipe now: {_knobs(plan.current)}; starting configuration: {_knobs(plan.start)}"
    )
    for i, row in enumerate(plan.configurations, 1):
        what = "measured earlier: skipped" if row["done"] else (
            "restart" if row["restart"] else "no restart (the recipe already has it)")  # fmt: skip
        click.echo(f"  {i}. {row['label']}: {what}" + ("" if row["done"] else ", then a sweep"))
    for row in plan.predicted:
        click.echo(f"  -  {row['label']}: predicted from the sweep at {row['from']} (no restart)")
    if plan.confirm:
        click.echo("  then, if the recommendation is a predicted one: a restart to measure it")
    s = plan.sweep
    click.echo(
        f"  sweep: concurrency {','.join(map(str, s['levels']))}, {s['mode']}, "
        f"{s['output_tokens']} output tokens, {s['repeats']} repeat(s), "
        f"SLO {s['slo_tok_s']} tok/s per user"
    )
    said: set[str] = set()  # a risk the sweeps share is said once
    for name, load in plan.load:
        head, *rest = load.lines()
        click.echo(f"  {name}, {head}:")
        for line in rest:
            if line not in said:
                click.echo(f"    {line}")
            said.add(line)
    end = f"restore {_knobs(plan.start)}" if plan.restore else "no restore (--no-restore)"
    click.echo(f"  at the end: {end}")
    from spark_ops.readiness.eta import estimate

    boot = sum(estimate(history or plan.cluster).values())  # the boots of this cluster
    took = f", ~{boot:.0f} s by the boots watched from here" if boot else ""
    click.echo(
        f"  restarts: {plan.restarts} planned (each a full boot{took}; each stamp pruned, the "
        "budget unchanged); the cluster lock is held from the answer to the end"
    )
    click.echo("  " + downtime_line(plan.restarts, plan.restarts_if_all_measured, boot))
    click.echo("  Ctrl-C stops the run, restores the starting configuration; --resume continues.")
    click.echo(
        f"  state: {plan.state_path}" + (f" (resuming: {n_done} done)" if plan.resumed else "")
    )


def downtime_line(restarts: int, full: int, boot_s: float) -> str:
    """Expected downtime of the plan beside that of measuring every configuration."""
    each = f" x ~{boot_s:.0f} s = ~{restarts * boot_s:.0f} s" if boot_s else ""
    text = f"expected downtime: {restarts} boot(s){each} with nobody served"
    if full > restarts:
        also = f", ~{full * boot_s:.0f} s" if boot_s else ""
        text += f" (measuring every configuration: {full} boots{also}; --measure-all)"
    return text


def _knobs(values: dict[str, Any]) -> str:
    """'max_num_seqs=6, moe_backend=marlin'."""
    return ", ".join(f"{k}={v}" for k, v in values.items())


class Progress:
    """Steps, boot views and sweep levels on stderr; one boot view per restart."""

    def __init__(
        self,
        cluster: str,
        workers: int | None = None,
        as_json: bool = False,
        history: str | None = None,
    ) -> None:
        """Nothing shown yet; `workers` is the inventory's worker count; JSON lines under --json;
        `history` the cluster's boot-history key (readiness.history_key), for the ETA."""
        self.cluster = cluster
        self.history = history
        self.workers = workers
        self.as_json = as_json
        self.steps = step_reporter(as_json)
        self.boot: Any = None
        self.quiet = quiet()

    def _line(self, shown: str, **data: Any) -> None:
        """One line on stderr: the text, or under --json the data as a JSON line (none under -q)."""
        if self.quiet:
            return
        if self.as_json:
            click.echo(json.dumps(data, default=str), err=True)
        else:
            click.echo(shown, err=True)

    def on_step(self, step: StepRun) -> None:
        """Print a step; close the boot view when the boot (or the rollback's) ends."""
        from spark_ops.workflows.plan import StepKind

        booted = step.name in (StepKind.BOOT, StepKind.BOOT_ROLLBACK) and step.status != "running"
        if booted and self.boot is not None:
            self.boot.close()
            self.boot = None
        self.steps(step)

    def on_event(self, event: Any) -> None:
        """Feed the boot view (opened at the first event of a boot)."""
        from spark_ops.cli.progress import make_reporter

        if self.boot is None:
            self.boot = make_reporter(
                self.cluster,
                self.as_json,
                history=self.history,
                workers_expected=self.workers,
                quiet=self.quiet,
            )
        self.boot(event)

    def on_config(self, index: int, total: int, name: str) -> None:
        """A heading per configuration."""
        data = {"event": "configuration", "index": index, "total": total, "name": name}
        self._line(click.style(f"\n[{index}/{total}] {name}", bold=True), **data)

    def on_level(self, lv: Any) -> None:
        """One line per finished level."""
        self._line(
            f"  C={lv.max_concurrency}: {lv.output_throughput:.0f} tok/s aggregate, "
            f"{(lv.per_user_tok_s or 0):.1f} tok/s per user, {lv.failed} errors",
            event="level", level=lv.to_dict(),
        )  # fmt: skip

    def on_note(self, text: str) -> None:
        """A note from the workflow."""
        self._line(f"note: {text}", event="note", text=text)


def _num(v: float | None, fmt: str = "{:.0f}") -> str:
    """A number, or a dash."""
    return "–" if v is None else fmt.format(v)


def compare_table(reading: Any) -> Any:
    """Per level: aggregate and per-user tok/s of each configuration, with ratios to the first."""
    from rich.table import Table

    table = Table(title="Configurations compared (ratios to the first)", title_justify="left")
    table.add_column("concurrent\nrequests", justify="right")
    for cfg in reading.configs:
        head = cfg["label"] + (" (predicted)" if cfg.get("predicted_from") else "")
        table.add_column(f"{head}\naggregate tok/s", justify="right")
        table.add_column(f"{head}\nper user tok/s", justify="right")
    table.add_column("best", justify="left")
    for row in reading.levels:
        cells = [str(row["concurrency"])]
        for i, x in enumerate(row["cells"]):
            ra = f" ×{x['ratio_aggregate']:.2f}" if i and x["ratio_aggregate"] else ""
            ru = f" ×{x['ratio_per_user']:.2f}" if i and x["ratio_per_user"] else ""
            cells += [_num(x["aggregate"]) + ra, _num(x["per_user"], "{:.1f}") + ru]
        cells.append((row["best"] or "–") if row["clear"] else "no clear difference")
        table.add_row(*cells)
    return table


def render_report(outcome: ExperimentOutcome, *, width: int = 160) -> str:
    """The whole report as text: each configuration's table and reading, the comparison, the end."""
    from rich.console import Console

    from spark_ops.bench import report

    console = Console(width=width, record=True, file=io.StringIO(), color_system=None)
    state = outcome.state
    for name, result in state.sweep_results():
        run = state.results[name]
        if run.get("confirmed"):
            console.print()
            console.print(f"{name}: measured to confirm the prediction (--confirm).")
        console.print()
        console.print(report.fit_table(report.sweep_table(result), width, report.SWEEP_DROP))
        for line in report.reading_lines(result):
            console.print(line, highlight=False, soft_wrap=True)
        b = run["budget"]
        console.print(
            f"Restart budget: {b['used_before']} used before, {b['used_after']} after"
            + (" — as before." if run["budget_as_before"] else f"; new stamps {b['new_stamps']}."),
            highlight=False,
        )
    _print_whatif(console, state, width)
    if len(outcome.reading.configs) > 1:
        console.print()
        table = compare_table(outcome.reading)
        per_user = [
            str(c.header) for c in table.columns if str(c.header).endswith("per user tok/s")
        ]
        console.print(report.fit_table(table, width, ["best", *reversed(per_user)]))
    console.print()
    done, total = len(state.results), len(state.spec.measured())
    if done < total:
        console.print(f"Partial reading: {done} of {total} configurations measured.")
    for line in outcome.reading.lines:
        console.print(line, highlight=False, soft_wrap=True)
    console.print(_ending(outcome), highlight=False, soft_wrap=True)
    return console.export_text()


def _print_whatif(console: Any, state: ExperimentState, width: int) -> None:
    """Each measured sweep's what-if for the lower caps predicted from it, and its confirmations.

    A confirmation that missed marks the other caps' points not to be trusted (`!`).
    """
    from spark_ops.bench.confirm import distrust_others
    from spark_ops.bench.report import fit_table, whatif_lines, whatif_table
    from spark_ops.bench.whatif import reading_lines, whatif_of
    from spark_ops.errors import BenchError
    from spark_ops.workflows.experiment.state import label

    predicted = state.spec.predicted()
    confirmations = state.confirmations()
    for name, result in state.sweep_results():
        caps = sorted(
            int(c["max_num_seqs"])
            for c in state.spec.every_configuration()
            if predicted.get(label(c)) == state.results[name]["knobs"]
            and label(c) not in state.results
        )
        checks = [c for base, c in confirmations if base == name]
        if caps:
            console.print()
            try:
                whatif = whatif_of(result, caps)
            except BenchError as exc:
                console.print(
                    f"what-if from {name}: {exc.message}", highlight=False, soft_wrap=True
                )
                continue
            for check in checks:
                distrust_others(whatif, check)
            whatif.lines = reading_lines(whatif)
            console.print(fit_table(whatif_table(whatif), width, []))
            for line in whatif_lines(whatif):
                console.print(line, highlight=False, soft_wrap=True)
        for check in checks:
            for line in check.lines():
                console.print(line, highlight=False, soft_wrap=True)


def _ending(outcome: ExperimentOutcome) -> str:
    """How the run ended, the restore and the budget, in words."""
    state = outcome.state
    done, total = len(state.results), len(state.spec.measured())
    if state.status == "finished":
        text = f"Experiment finished: {done}/{total} configurations measured."
    else:
        # the failure's message is the `error:` line on stderr: said once, not here again
        why = "interrupted" if outcome.interrupted else "failed (the error below says why)"
        text = f"Experiment {why} after {done}/{total} configurations; --resume continues it."
    r = state.restore
    if r is None:
        text += " The recipe was not restored (--no-restore)."
    elif r["ok"]:
        how = "restarted and pruned" if r.get("restarted") else "no restart needed"
        text += f" Starting configuration restored: {_knobs(r['knobs'])} ({how})."
    elif r.get("refused"):  # the gate refused it: an apply now would be refused alike
        text += (
            f" The starting configuration {_knobs(r['knobs'])} was NOT put back: {r['error']}. "
            f"Put it back with `{r['command']}` once a slot frees, or now with --over-budget."
        )
    else:
        text += " " + restore_failed(r)
    text += (
        f" Downtime spent: {state.restarts_done()} boot(s), {state.downtime_s():.1f} s"
        f" ({len(state.spec.predicted())} configuration(s) predicted without a restart)."
    )
    before, after = outcome.budget_before, outcome.budget_after
    if after is not None:
        same = "as before" if before["stamps"] == after["stamps"] else "CHANGED"
        text += f" Restart budget: {after['used']} used, {same} ({before['used']} at the start)."
    return text


def restore_failed(r: dict[str, Any]) -> str:
    """A restore that failed: why (or the ✗ line above that said it), what the recipe holds and
    the engine runs now, and the exact apply that puts the start back; each said once."""
    step = SAID.get(str(r.get("error")))
    why = f"the ✗ {step} line above" if step else r.get("error")
    text = f"RESTORE FAILED ({why}): the starting configuration {_knobs(r['knobs'])} is not back."
    recipe, engine = r.get("recipe_now"), r.get("engine_now")
    if isinstance(recipe, dict):
        held = (
            f"cannot be read ({recipe['error']})" if "error" in recipe
            else f"holds {_knobs(recipe)}"
        )  # fmt: skip
        text += f" The recipe {held};"
    if isinstance(engine, dict):
        knobs = engine.get("knobs")
        values = _knobs({k: _shown(v) for k, v in knobs.items()}) if knobs else None
        if engine.get("up"):
            unknown = "its values unknown (its log names no start-up args)"
            text += f" the engine serves {values or unknown}."
        else:
            text += " the engine does not answer" + (
                f" (last started with {values})." if values else "."
            )
    command = r.get("command")
    if command:
        text += f" Put the start back with `{command}`."
    return text


def _shown(value: Any) -> Any:
    """An engine value as shown: vLLM's default when its log does not list it."""
    return "(vLLM's default)" if value is None else value
