"""`spark-ops sim`: start, inspect and stop the embedded simulated cluster."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from spark_ops.cli.common import emit_json, quiet

_DIR = click.option(
    "--dir", "root", type=click.Path(file_okay=False, path_type=Path), default=Path(".sim"),
    show_default=True, envvar="SPARK_OPS_SIM_DIR",
    help="Where the embedded cluster keeps its files (env SPARK_OPS_SIM_DIR).",
)  # fmt: skip


@click.group()
def cli() -> None:
    """The embedded cluster: SSH nodes on loopback, the reference watchdog, a simulated vLLM."""


@cli.command()
@_DIR
@click.option("--nodes", type=click.IntRange(2, 64), default=4, show_default=True)
@click.option("--max-num-seqs", type=click.IntRange(1), default=6, show_default=True,
              help="The recipe's starting value (the ops note's cap).")  # fmt: skip
@click.option("--time-scale", type=float, default=1.0, show_default=True,
              help="Speed-up of the engine's clock (decode and boot).")  # fmt: skip
@click.option("--boot-scale", type=float, default=4.0, show_default=True,
              help="Stretch the boot phases so they can be watched.")  # fmt: skip
@click.option("--fault", help="Engine fault to inject (exit_during_weights, kv_alloc_fail, …).")
@click.option(
    "--engine-wrapper",
    is_flag=True,
    help="Start the engine under a wrapper shell (the pid file names the shell).",
)
@click.option("--executor", type=click.Choice(["mp", "ray"]), default="mp", show_default=True,
              help="mp: one engine rank per node without Ray (rank 0 on the head serves the API, "
              "the workers' ranks run headless), as launchers start it today; ray: the head's "
              "engine over the workers' Ray workers.")  # fmt: skip
@click.option("--wait/--no-wait", default=True, show_default=True,
              help="Return once the engine serves, not when the nodes listen.")  # fmt: skip
@click.option("--json", "as_json", is_flag=True)
def up(root: Path, nodes: int, max_num_seqs: int, time_scale: float, boot_scale: float,
       fault: str | None, engine_wrapper: bool, executor: str, wait: bool,
       as_json: bool) -> None:  # fmt: skip
    """Lay out and start the embedded cluster in the background."""
    from spark_ops.sim.cluster import SimOptions
    from spark_ops.sim.control import record_running, wait_serving
    from spark_ops.sim.control import up as sim_up

    opts = SimOptions(
        nodes=nodes, time_scale=time_scale, boot_scale=boot_scale, fault=fault,
        max_num_seqs=max_num_seqs, engine_wrapper=engine_wrapper, executor=executor,
    )  # fmt: skip
    state = sim_up(root, opts)
    record_running(root, state)
    if wait and not fault:
        if not as_json and not quiet():
            click.echo("Embedded cluster's nodes listen; waiting for the engine's first boot …")
        state["engine_ready_after_s"] = round(wait_serving(state), 1)
    if as_json:
        emit_json(state)
        return
    click.echo(
        f"Embedded cluster up: {nodes} nodes on 127.0.0.1 ports {list(state['ports'].values())}"
        f" (engine {'ranks without Ray' if executor == 'mp' else 'over Ray'})"
    )
    if "engine_ready_after_s" in state:
        click.echo(f"Engine serving after {state['engine_ready_after_s']} s")
    else:
        click.echo("Engine still booting (--no-wait or a fault): requests are refused until then")
    click.echo(f"Inventory: {state['inventory']}")
    click.echo(f"  export SPARK_OPS_INVENTORY={state['inventory']}")


@cli.command()
@_DIR
def down(root: Path) -> int:
    """Stop the embedded cluster (nodes, watchdog, engine)."""
    from spark_ops.errors import ExitStatus
    from spark_ops.sim.control import POINT_HINT, forget, not_running, running_elsewhere
    from spark_ops.sim.control import down as sim_down

    if sim_down(root):
        forget(root)
        click.echo(f"stopped the embedded cluster in {root.resolve()}")
        return 0
    click.echo(not_running(root), err=True)
    if running_elsewhere(root):  # not the one meant: say so, and how to name it
        click.echo(f"hint: {POINT_HINT}", err=True)
        return int(ExitStatus.CONFLICT)
    return 0


@cli.command()
@_DIR
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def status(ctx: click.Context, root: Path, as_json: bool) -> None:
    """Say whether the embedded cluster runs, and where (exit 14 when none runs here)."""
    from spark_ops.errors import ExitStatus
    from spark_ops.sim.control import POINT_HINT, not_running, read_state, running_elsewhere

    state: Any = read_state(root.resolve())
    if as_json:
        emit_json(
            state
            or {"running": False, "dir": str(root.resolve()), "elsewhere": running_elsewhere(root)}
        )
    elif state is None:
        click.echo(not_running(root))
        click.echo(f"hint: {POINT_HINT}")
    else:
        click.echo(f"running (pid {state['pid']}); inventory {state['inventory']}")
    if state is None:
        ctx.exit(int(ExitStatus.NOT_SERVING))


# command, control request, help, what it prints
_NODE_COMMANDS = (
    ("stop-node", "stop", "Take one node off the network (SSH and its Ray worker).", "stopped"),
    ("start-node", "start", "Bring a stopped node back on its old port.", "started"),
    ("stop-raylet", "stop-raylet",
     "Stop one worker's Ray worker only (as when its container dies); SSH stays up.",
     "Ray worker stopped"),
    ("start-raylet", "start-raylet", "Start a worker's Ray worker again on its old port.",
     "Ray worker started"),
)  # fmt: skip


def _node_command(command: str, request: str, doc: str, done: str) -> None:
    """Register `spark-ops sim COMMAND NAME`, sending `request NAME` to the running cluster."""

    @cli.command(command, help=doc)
    @_DIR
    @click.argument("name")
    def run(root: Path, name: str) -> None:
        """Send the request for one node (click shows `doc` as the help)."""
        from spark_ops.sim.control import node

        node(root, request, name)
        click.echo(f"{name}: {done}")


for _spec in _NODE_COMMANDS:
    _node_command(*_spec)
