"""Shared CLI plumbing: the chosen cluster, running coroutines, rendering plans and steps."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import shlex
import signal
import sys
import threading
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import click

if TYPE_CHECKING:  # the CLI imports its workflow when a command runs (start-up time)
    from spark_ops.fleet import Fleet
    from spark_ops.inventory import Cluster
    from spark_ops.workflows.facts import Gate
    from spark_ops.workflows.plan import Plan, StepRun

T = TypeVar("T")


def load_cluster(ctx: click.Context) -> Cluster:
    """The cluster chosen by --inventory / --cluster, or by --fleet and --cluster (or their
    environment variables). Under a fleet a command that reaches one cluster needs --cluster:
    without it, NeedsCluster names the fleet's clusters (only status, budget, doctor and log span
    the fleet, through fleet_span)."""
    from spark_ops.errors import NeedsCluster
    from spark_ops.inventory import load_inventory

    obj = ctx.find_root().obj or {}
    fleet = chosen_fleet(ctx)
    if fleet is None:
        return load_inventory(obj.get("inventory")).cluster(obj.get("cluster"))
    if obj.get("cluster") is None:
        names = fleet.names()
        raise NeedsCluster(
            f"{fleet.path} names the clusters {', '.join(names)}: `{ctx.command_path}` acts on "
            "one cluster; choose it with --cluster NAME",
            hint=f"{command_line().replace('spark-ops', f'spark-ops --cluster {names[0]}', 1)}; "
            "only status, budget, doctor and log span the whole fleet (docs/fleet.md)",
        )
    return fleet.member(str(obj["cluster"])).cluster


def chosen_fleet(ctx: click.Context) -> Fleet | None:
    """The fleet of --fleet / $SPARK_OPS_FLEET, or None when an inventory is chosen instead.

    -i and --fleet both on the command line (or both variables set) are a usage error; one typed
    and the other from the environment: the typed one wins.
    """
    from spark_ops.fleet import load_fleet

    obj = ctx.find_root().obj or {}
    fleet, inventory, typed = obj.get("fleet"), obj.get("inventory"), obj.get("typed") or set()
    if fleet is None:
        return None
    if inventory is not None:
        if typed == {"inventory", "fleet"}:
            raise click.UsageError(
                f"-i {inventory} and --fleet {fleet} both given: choose one (with a fleet, "
                "--cluster NAME picks its inventory)"
            )
        if not typed:
            raise click.UsageError(
                f"SPARK_OPS_INVENTORY ({inventory}) and SPARK_OPS_FLEET ({fleet}) are both set: "
                "unset one, or give -i or --fleet on the command line"
            )
        if "inventory" in typed:
            return None
    if "_fleet" not in obj:  # read once per command (it loads every inventory it names)
        obj["_fleet"] = load_fleet(fleet)
    return obj["_fleet"]


def fleet_span(ctx: click.Context) -> Fleet | None:
    """The fleet a reading command spans: a fleet chosen and no --cluster (else None)."""
    obj = ctx.find_root().obj or {}
    fleet = chosen_fleet(ctx)
    return fleet if fleet is not None and obj.get("cluster") is None else None


def run_async(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine on a fresh event loop; SIGINT and SIGTERM cancel it (workflows/interrupt)."""

    async def main() -> T:
        """The coroutine, with the signal handlers installed for its time."""
        from spark_ops.workflows import interrupt

        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        installed = []
        for sig in (signal.SIGINT, signal.SIGTERM):
            if task is None:
                break
            try:
                loop.add_signal_handler(sig, interrupt.request, task, sig.name)
                installed.append(sig)
            except (NotImplementedError, RuntimeError, ValueError):  # not the main thread
                pass
        try:
            return await coro
        except asyncio.CancelledError:
            if interrupt.received():  # a signal outside any run's own handling: plain Ctrl-C
                raise KeyboardInterrupt from None
            raise
        finally:
            for sig in installed:
                loop.remove_signal_handler(sig)

    return asyncio.run(main())


async def confirm(text: str, *, default: bool = False) -> bool:
    """click.confirm without freezing the event loop: the question waits in a thread of its own
    (a daemon, so an interrupted run never waits for an answer to end), while the SSH connections
    keep answering their keepalives (a prompt left a minute otherwise lost them all)."""
    loop = asyncio.get_running_loop()
    answer: asyncio.Future[bool] = loop.create_future()

    def ask() -> None:
        """Ask on the terminal; hand the answer (or click's Abort) back to the loop."""
        try:
            got = click.confirm(text, default=default, err=True)
        except BaseException as exc:  # Abort (EOF, Ctrl-C at the prompt) goes back to the caller
            loop.call_soon_threadsafe(_settle, answer, None, exc)
        else:
            loop.call_soon_threadsafe(_settle, answer, got, None)

    threading.Thread(target=ask, name="confirm", daemon=True).start()
    return await answer


def _settle(fut: asyncio.Future[bool], value: bool | None, exc: BaseException | None) -> None:
    """Set the prompt's future once (it may have been cancelled by an interruption meanwhile)."""
    if fut.done():
        return
    if exc is not None:
        fut.set_exception(exc)
    else:
        fut.set_result(bool(value))


def command_line() -> str:
    """The command line this process runs, shell-quoted (what "run it again" names)."""
    words = ["spark-ops", *sys.argv[1:]]
    shown = (w.encode("utf-8", "surrogateescape").decode("utf-8", "replace") for w in words)
    return shlex.join(shown)


def emit_json(data: Any) -> None:
    """Write one JSON document on stdout."""
    click.echo(json.dumps(data, indent=2, default=str))


def when(stamp: object) -> str:
    """A Unix time as local ISO text (for people); a dash for none, or one no clock can show."""
    if isinstance(stamp, bool) or not isinstance(stamp, int | float):
        return "-"
    try:  # NaN, infinity, 1e300 or 10**400 in a hand-written audit line: no time to show
        return dt.datetime.fromtimestamp(stamp).astimezone().strftime("%Y-%m-%d %H:%M:%S %Z")
    except (OverflowError, OSError, ValueError):
        return "-"


def echo_diff(diff: str) -> None:
    """Print a unified diff with colours on a TTY."""
    for line in diff.splitlines():
        color = None
        if line.startswith("+") and not line.startswith("+++"):
            color = "green"
        elif line.startswith("-") and not line.startswith("---"):
            color = "red"
        elif line.startswith("@@"):
            color = "cyan"
        click.secho(line, fg=color)


def echo_plan(plan: Plan) -> None:
    """Print a plan: warnings, per-node diffs, then the numbered steps."""
    click.secho(f"Plan: {plan.operation} on cluster {plan.cluster}", bold=True)
    for w in plan.warnings:
        click.secho(f"warning: {w}", fg="yellow")
    before = plan.facts.knobs_before or {}
    after = plan.facts.knobs_after or {}
    for key in after:
        if before.get(key) != after.get(key):
            click.echo(f"  {key}: {before.get(key)!r} -> {after.get(key)!r}")
    for ch in plan.changes:
        click.echo()
        echo_diff(ch.diff)
    if plan.steps:
        click.echo()
        click.secho("Steps:", bold=True)
        for i, s in enumerate(plan.steps, 1):
            click.echo(f"  {i}. {s.description}")
    gate = plan.facts.budget
    if gate is not None and plan.restarts:
        echo_gate(gate)


def echo_gate(gate: Gate) -> None:
    """The restart budget the plan's restart meets, and whether it may go ahead."""
    from spark_ops.workflows.facts import BudgetGate, UnreadableBudget
    from spark_ops.workflows.gate import next_slot

    if isinstance(gate, UnreadableBudget):
        text, color = f"cannot be read: {gate.error}", "red"
    elif gate.spent:
        text = (
            f"{gate.used}/{gate.allowed} used in the last {gate.window_s / 3600:g} h: "
            f"no slot left, the next frees {next_slot(gate)}"
        )
        color = "red"
    else:
        text = (
            f"{gate.used}/{gate.allowed} used in the last {gate.window_s / 3600:g} h, "
            f"{gate.remaining} left (this restart's stamp is pruned after its boot)"
        )
        color = None
    if color and gate.over_budget_given:
        text, color = text + "; --over-budget given: the restart goes ahead", "yellow"
    if isinstance(gate, BudgetGate) and gate.inventory_disagrees:  # the warnings say it whole
        text += f" [counted by {gate.limits_source}: the inventory's watchdog.budget differs]"
    click.secho(f"Restart budget: {text}", fg=color)


# failed step details already printed (detail -> step name): the final error does not repeat them
SAID: dict[str, str] = {}

_MARK = {"done": ("✓", "green"), "failed": ("✗", "red"), "skipped": ("–", "yellow")}


class Closable(Protocol):
    """Something shown on the terminal that can be closed (the boot's live view)."""

    def close(self) -> None:
        """Stop drawing, leaving the last frame."""


def step_reporter(as_json: bool, view: Closable | None = None) -> Callable[[StepRun], None]:
    """A callable(step) printing each step's start and end on stderr.

    `view` (the boot's live table) is closed before a line is printed for any step but the
    boot's own start: a step line written under a live view is erased by its next frame.
    """

    from spark_ops.workflows.plan import StepKind

    hush = quiet()

    def report(step: StepRun) -> None:
        """Print one step transition (under -q, only a failed or skipped one)."""
        if view is not None and not (step.name is StepKind.BOOT and step.status == "running"):
            view.close()
        if hush and step.status in ("running", "done"):
            return
        if as_json:
            click.echo(json.dumps({"step": step.to_dict()}), err=True)
            return
        if step.status == "running":
            click.echo(f"… {step.description}", err=True)
            return
        if step.status == "failed" and step.detail:
            SAID[str(step.detail)] = step.name
        mark, color = _MARK.get(step.status, ("?", None))
        took = f" ({step.seconds:.1f} s)" if step.seconds is not None else ""
        click.secho(f"{mark} {step.name}{took}: {step.detail}", fg=color, err=True)

    return report


def quiet() -> bool:
    """True under -q: stderr carries warnings and errors only (docs/contracts.md)."""
    ctx = click.get_current_context(silent=True)
    obj = ctx.find_root().obj if ctx is not None else None
    return bool(isinstance(obj, dict) and obj.get("quiet"))
