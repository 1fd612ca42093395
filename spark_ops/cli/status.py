"""`spark-ops status`: nodes, engine, load, recipe knobs and budget (once, or --watch)."""

from __future__ import annotations

import json
import time
from typing import Any

import click

from spark_ops.cli.common import emit_json, fleet_span, load_cluster, run_async, when
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
        click.secho(f"Engine: {said}; {_load(e)}", fg="red")
    elif e.get("up"):
        click.echo(
            f"Engine: serving {', '.join(e.get('models') or [])} (vLLM {e.get('version')}); "
            f"{_load(e)}"
        )
    elif e.get("booting") and not e["booting"].get("hung"):
        from spark_ops.status import booting_text

        click.secho(f"Engine: {booting_text(e['booting'])}", fg="yellow")
    else:
        click.secho(f"Engine: not serving: {e.get('error') or 'no answer'}", fg="red")
    r = data.get("recipe") or {}
    if "knobs" in r:
        knobs = ", ".join(f"{k}={_knob(k, v)}" for k, v in r["knobs"].items())
        drift = "" if r.get("same_on_all_nodes") else "  (copies DIFFER between nodes)"
        click.echo(f"Recipe {r['path']}: {knobs}{drift}")
    elif r:
        click.secho(f"Recipe: {r.get('error')}", fg="red")
    eff = e.get("effective")
    keys = ("max_num_seqs", "kv_cache_memory_bytes", "moe_backend", "enforce_eager")
    if eff:
        click.echo(
            "Effective (engine log): " + ", ".join(f"{k}={_knob(k, eff.get(k))}" for k in keys)
        )
    elif e.get("last_started_with"):
        last_args = e["last_started_with"]
        click.echo(
            "Last started with (its log's last start; not serving now): "
            + ", ".join(f"{k}={_knob(k, last_args.get(k))}" for k in keys)
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
    if boot and boot.get("outcome") == "failed":
        click.secho(f"Last boot watched from here: {_boot_text(boot, last)}", fg="red")
    elif boot and boot.get("total_s") is not None:
        click.echo(f"Last boot watched from here: {_boot_text(boot, last)}")
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
        pause = b.get("pause")  # lease.pause_shown's words: a lapsed lease is no pause
        flags = {"paused": " PAUSED", "lapsed": " LEASE-LAPSED"}[pause["state"]] if pause else ""
        flags += " GAVE-UP" if b.get("gave_up") else ""
        click.echo(f"Watchdog budget: {b['used']}/{b['allowed']} used{flags}")
        if pause:
            click.secho(f"  {pause['text']}", fg="yellow")
    elif b:
        click.secho(f"Watchdog: {b.get('error')}", fg="red")
    v = data.get("verdict") or {}
    if v:
        color = {"serving": "green", "degraded": "yellow", "experimenting": "yellow"}.get(
            v["state"], "red"
        )
        why = f": {'; '.join(v['reasons'])}" if v["reasons"] else ""
        click.secho(f"Verdict: {v['state']}{why}", fg=color, bold=True)
        if v.get("next"):
            click.echo(f"next: {v['next']}")
    own = data.get("watchdog_status")
    if own and own["answered"]:
        state = f"state {own['state']}" if own["state"] else own["text"].splitlines()[0][:120]
        click.echo(f"Watchdog says: {state}")
    elif own:
        click.secho(f"Watchdog status command did not answer: {own['text'][:200]}", fg="yellow")


def _knob(key: str, value: Any) -> str:
    """A knob's value as a person reads it (a byte count in GiB: sizes.human_value)."""
    from spark_ops.sizes import human_value

    return human_value(key, value)


def _load(e: dict[str, Any]) -> str:
    """The engine's load: requests running and waiting, KV cache usage in %."""
    from spark_ops.sizes import human_count, human_share

    def count(key: str) -> str:
        """One gauge, or ? when the metrics did not say."""
        value = e.get(key)
        return human_count(value) if isinstance(value, int | float) else "?"

    usage = e.get("kv_cache_usage")
    kv = human_share(usage) if isinstance(usage, int | float) else "?"
    return f"running {count('running')}, waiting {count('waiting')}, KV cache {kv} used"


def _boot_text(boot: dict[str, Any], last: dict[str, Any] | None) -> str:
    """How the last watched boot went (how long it took, or the phase it failed in), when, and
    whether a restart came after it."""
    started = boot.get("started_at")
    at = f"at {when(float(started))}" if isinstance(started, int | float) else "time unknown"
    if boot.get("outcome") == "failed":
        ran = boot.get("failed_after_s")
        after = f", after {ran:.0f} s" if isinstance(ran, int | float) else ""
        text = f"last boot failed (phase {boot.get('phase') or '?'}, {at}{after})"
        if boot.get("error"):
            text += f": {boot['error']}"
    else:
        text = (
            f"{boot['total_s']:.0f} s, {at}"
            if isinstance(started, int | float)
            else (f"{boot['total_s']:.0f} s")
        )
    stamp = (last or {}).get("stamp") or (last or {}).get("time")
    if (
        isinstance(started, int | float)
        and isinstance(stamp, int | float)
        and float(stamp) > float(started) + 60
    ):
        text += " (before the last restart, whose boot was not watched from here)"
    return text


def verdict_exit(data: dict[str, Any]) -> ExitStatus:
    """The status' exit code, said nowhere: the verdict's, or 4 when SSH refused a node."""
    if any(n.get("refused") for n in data.get("nodes") or []):
        return ExitStatus.UNREACHABLE
    return VERDICT_EXIT[(data.get("verdict") or {}).get("state", "not-serving")]


def _exit_status(data: dict[str, Any], as_json: bool = False) -> ExitStatus:
    """The verdict's code; 4 (UNREACHABLE) when a node's host key is unknown or changed, or it
    refused our credentials: a set-up problem to fix first, as docs/exit-codes.md says. That
    one is said on stderr as every error is: `error:`/`hint:` lines, or one JSON object."""
    refused = [n for n in data.get("nodes") or [] if n.get("refused")]
    if not refused:
        return verdict_exit(data)
    names = ", ".join(n["name"] for n in refused)
    message = "SSH refused (host key or credentials): " + "; ".join(
        f"{n['name']}: {n.get('error') or 'refused'}" for n in refused
    )
    hint = f"fix SSH to {names} first (host key or credentials): `spark-ops doctor` names the fix"
    if as_json:
        error = {"error": refused[0].get("refused_by") or "ConnectError", "message": message}
        click.echo(json.dumps({**error, "hint": hint}), err=True)
    else:
        click.secho(f"error: {message}", fg="red", err=True)
        click.echo(f"hint: {hint}", err=True)
    return ExitStatus.UNREACHABLE


@click.command()
@click.option("--json", "as_json", is_flag=True, help="As JSON on stdout.")
@click.option(
    "--watch",
    type=float,
    default=None,
    metavar="SECONDS",
    help="Refresh every N seconds, each round with its time (with --json: one document per "
    "line); Ctrl-C ends it (exit 0).",
)
@click.pass_context
def cli(ctx: click.Context, as_json: bool, watch: float | None) -> None:
    """Nodes reachable and latency, engine and load, recipe knobs, watchdog budget.

    Exit status (for scripts and alerts): 0 serving, 13 degraded (serving, but a node is down,
    the budget spent, a run unfinished ...), 14 not serving, 15 a restart under way (another
    run holds the lock, or the engine boots: the watchdog's restart, a colleague's), 21 an
    experiment under way (its restarts and sweeps go on until it ends). Under a fleet without
    --cluster: one table of every cluster, the worst of their codes (docs/fleet.md).
    """
    from spark_ops.status import collect_status

    fleet = fleet_span(ctx)
    if fleet is not None:
        from spark_ops.cli.fleet import status_fleet

        try:
            ctx.exit(status_fleet(fleet, as_json, watch))
        except KeyboardInterrupt:
            if not watch:
                raise
            click.echo("", err=True)
            ctx.exit(0)
    cluster = load_cluster(ctx)
    while True:
        try:
            data = run_async(collect_status(cluster))
            if as_json and watch:  # one document per line (JSON lines), its `time` in it
                click.echo(json.dumps(data, default=str))
            elif as_json:
                emit_json(data)
            else:
                if watch:
                    click.clear()
                    stamp = time.strftime("%Y-%m-%d %H:%M:%S %Z")
                    click.echo(f"{stamp}  every {watch:g} s; Ctrl-C to stop")
                echo_status(data)
            if not watch:
                ctx.exit(int(_exit_status(data, as_json)))
            time.sleep(watch)
        except KeyboardInterrupt:
            if not watch:
                raise
            click.echo("", err=True)  # leaving a watch is how it ends: no error, exit 0
            ctx.exit(0)
