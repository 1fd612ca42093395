"""`spark-ops status`: nodes, engine, load, recipe knobs and budget (once, or --watch)."""

from __future__ import annotations

import time
from typing import Any

import click

from spark_ops.cli.common import emit_json, load_cluster, run_async, when
from spark_ops.errors import ExitStatus

VERDICT_EXIT = {
    "serving": ExitStatus.OK,
    "degraded": ExitStatus.DEGRADED,
    "not-serving": ExitStatus.NOT_SERVING,
    "wedged": ExitStatus.WEDGED,
    "restarting": ExitStatus.RESTARTING,
    "experimenting": ExitStatus.EXPERIMENTING,
}


def echo_status(data: dict[str, Any]) -> None:
    """Print the status for a person."""
    click.secho(f"Cluster {data['cluster']}", bold=True)
    for n in data["nodes"]:
        if n["reachable"]:
            click.echo(
                f"  {n['name']:<8} {n['role']:<7} {n['address']:<22} up   {n['latency_ms']} ms"
            )
        else:
            click.secho(
                f"  {n['name']:<8} {n['role']:<7} {n['address']:<22} DOWN {n['error']}", fg="red"
            )
    e = data.get("engine") or {}
    probe = e.get("completion") or {}
    if e.get("up") and not probe.get("ok", True):
        from spark_ops.engine.api import CompletionProbe

        said = CompletionProbe.from_dict(probe).describe()
        click.secho(
            f"Engine: {said}; running {e.get('running')}, waiting {e.get('waiting')}", fg="red"
        )
    elif e.get("up"):
        click.echo(
            f"Engine: serving {', '.join(e.get('models') or [])} (vLLM {e.get('version')}); "
            f"running {e.get('running')}, waiting {e.get('waiting')}, "
            f"KV usage {e.get('kv_cache_usage')}"
        )
    else:
        click.secho(f"Engine: not serving {e.get('error', '')}", fg="red")
    r = data.get("recipe") or {}
    if "knobs" in r:
        knobs = ", ".join(f"{k}={v}" for k, v in r["knobs"].items())
        drift = "" if r.get("same_on_all_nodes") else "  (copies DIFFER between nodes)"
        click.echo(f"Recipe {r['path']}: {knobs}{drift}")
    elif r:
        click.secho(f"Recipe: {r.get('error')}", fg="red")
    eff = e.get("effective")
    keys = ("max_num_seqs", "kv_cache_memory_bytes", "moe_backend", "enforce_eager")
    if eff:
        click.echo("Effective (engine log): " + ", ".join(f"{k}={eff.get(k)}" for k in keys))
    elif e.get("last_started_with"):
        last_args = e["last_started_with"]
        click.echo(
            "Last started with (never served, not effective): "
            + ", ".join(f"{k}={last_args.get(k)}" for k in keys)
        )
    inst = e.get("instance")
    if inst:
        state = "running" if inst.get("alive") else "NOT running"
        click.echo(f"Engine instance: {inst.get('source')} pid {inst.get('pid')} ({state})")
    if e.get("leftovers"):
        names = ", ".join(f"{p['pid']} ({p['name']})" for p in e["leftovers"])
        click.secho(f"Left by the dead engine, still running: {names}", fg="red")
        click.echo(f"  fix: {e.get('leftovers_fix')}")
    if e.get("other_engine_processes"):
        names = ", ".join(f"{p['pid']} ({p['name']})" for p in e["other_engine_processes"])
        click.secho(f"Other engine processes on the head: {names}", fg="yellow")
    last = data.get("last_restart")
    if last:
        when_ = when(float(last.get("stamp") or last.get("time") or 0))
        click.echo(
            f"Last restart: {when_} ({last.get('reason') or '?'}, by {last.get('by') or '?'})"
        )
    boot = data.get("last_boot")
    if boot and boot.get("total_s") is not None:
        click.echo(f"Last boot watched from here: {boot['total_s']:.0f} s")
    runs = data.get("runs") or {}
    if runs.get("experiment"):
        click.secho(runs["experiment"][0].upper() + runs["experiment"][1:], fg="yellow")
    elif runs.get("in_progress"):
        click.secho(f"A run is under way: {runs['in_progress']}", fg="yellow")
    for r in runs.get("unfinished") or []:
        text = (
            f"Unfinished run {r['run']} ({r['operation']} by {r.get('who')}): "
            f"last recorded {r['last_step']}"
        )
        click.secho("".join(c if c.isprintable() else "?" for c in text), fg="red")
        click.echo("  finish it: " + "".join(c if c.isprintable() else "?" for c in r["command"]))
    b = data.get("budget") or {}
    if "used" in b:
        flags = " PAUSED" if b.get("paused") else ""
        flags += " GAVE-UP" if b.get("gave_up") else ""
        click.echo(f"Watchdog budget: {b['used']}/{b['allowed']} used{flags}")
    elif b:
        click.secho(f"Watchdog: {b.get('error')}", fg="red")
    v = data.get("verdict") or {}
    if v:
        color = {"serving": "green", "degraded": "yellow", "experimenting": "yellow"}.get(
            v["state"], "red"
        )
        why = f": {'; '.join(v['reasons'])}" if v["reasons"] else ""
        click.secho(f"Verdict: {v['state']}{why}", fg=color, bold=True)
    own = data.get("watchdog_status")
    if own and own["answered"]:
        state = f"state {own['state']}" if own["state"] else own["text"].splitlines()[0][:120]
        click.echo(f"Watchdog says: {state}")
    elif own:
        click.secho(f"Watchdog status command did not answer: {own['text'][:200]}", fg="yellow")


@click.command()
@click.option("--json", "as_json", is_flag=True, help="As JSON on stdout.")
@click.option(
    "--watch", type=float, default=None, metavar="SECONDS", help="Refresh every N seconds."
)
@click.pass_context
def cli(ctx: click.Context, as_json: bool, watch: float | None) -> None:
    """Nodes reachable and latency, engine and load, recipe knobs, watchdog budget.

    Exit status (for scripts and alerts): 0 serving, 13 degraded (serving, but a node is down,
    the budget spent, a run unfinished ...), 14 not serving, 15 a restart under way, 21 an
    experiment under way (its restarts and sweeps go on until it ends).
    """
    from spark_ops.status import collect_status

    cluster = load_cluster(ctx)
    while True:
        data = run_async(collect_status(cluster))
        if as_json:
            emit_json(data)
        else:
            if watch:
                click.clear()
            echo_status(data)
        if not watch:
            ctx.exit(int(VERDICT_EXIT[(data.get("verdict") or {}).get("state", "not-serving")]))
        time.sleep(watch)
