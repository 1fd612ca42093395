"""The options of `apply`, `plan`, `restart`, `rollback` and `rollout`: the knobs, the restart's
options, the --prove gate's; parsed into the ApplyOptions the workflow takes."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click

from spark_ops.cli.common import command_line

if TYPE_CHECKING:  # the CLI imports its workflow when a command runs (start-up time)
    from spark_ops.recipe import Change
    from spark_ops.workflows import ApplyOptions


def knob_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The four knobs and the generic setters, shared by apply and plan."""
    options = [
        click.option(
            "--max-num-seqs", help="Engine cap on sequences per batch (positive integer)."
        ),
        click.option(
            "--kv-cache-memory",
            help="KV cache bytes per GPU: an integer, or one suffix K M G T (binary) / k m g t.",
        ),
        click.option(
            "--moe-backend", help="MoE kernel backend (checked for the server's version)."
        ),
        click.option(
            "--enforce-eager/--no-enforce-eager",
            default=None,
            help="Add or remove --enforce-eager.",
        ),
        click.option(
            "--set", "sets", multiple=True, metavar="KEY=VALUE", help="Set a defaults key."
        ),
        click.option("--flag", "flags", multiple=True, metavar="--FLAG[=V]", help="Add a flag."),
        click.option(
            "--unset-flag", "unset_flags", multiple=True, metavar="--FLAG", help="Remove a flag."
        ),
        click.option(
            "--vllm-version", help="vLLM version to validate for when the engine is down."
        ),
        click.option("--force", is_flag=True, help="Overwrite recipe copies that differ."),
        click.option(
            "--preflight",
            type=click.Choice(["auto", "vllm", "sim", "docker", "off"]),
            default="auto",
            show_default=True,
            help="Have the head's own vLLM parse the new command line before anything stops.",
        ),
        click.option("--preflight-timeout", type=float, default=60.0, show_default=True),
        click.option(
            "--trust-keys",
            is_flag=True,
            help="Write --set/--flag keys even when the head's vLLM parser cannot be asked "
            "(an unknown key or an abbreviation is refused when it can).",
        ),
    ]
    for opt in reversed(options):
        fn = opt(fn)
    return fn


over_budget_option = click.option(
    "--over-budget",
    is_flag=True,
    help="Restart even when the watchdog's restart budget has no slot left (a failed boot then "
    "stays down: the watchdog cannot restart it).",
)


def restart_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Options shared by apply and restart."""
    options = [
        click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation."),
        click.option("--dry-run", is_flag=True, help="Show the plan and stop; change nothing."),
        click.option("--json", "as_json", is_flag=True, help="Results as JSON on stdout."),
        click.option("--no-drain", is_flag=True, help="Do not wait for in-flight requests."),
        click.option("--drain-timeout", type=float, default=120.0, show_default=True),
        click.option(
            "--deadline", type=float, help="Boot deadline in seconds (inventory's by default)."
        ),
        click.option("--reason", help="Reason recorded in the watchdog's journal."),
        click.option(
            "--boot-wait",
            type=float,
            help="When the engine is booting already (the watchdog's own restart, a colleague's): "
            "wait this many seconds for that boot to end before restarting, 0 to refuse at once "
            "(default: the inventory's boot deadline; it also bounds the wait of a stopped "
            "run's checks for its restart to start the engine). A boot is never killed.",
        ),
        over_budget_option,
    ]
    for opt in reversed(options):
        fn = opt(fn)
    return fn


def prove_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The gate's load point and limits, shared by apply --prove and rollout (the limits'
    defaults are bench/gate.py's DEFAULT_*: tests/test_rollout.py holds them equal)."""
    options = [
        click.option(
            "--prove-concurrency", type=click.IntRange(1),
            help="The gate's load point: this many requests in flight (closed loop; the default, "
            "4, when no --prove-rate is given).",
        ),
        click.option(
            "--prove-rate", type=click.FloatRange(min=0, min_open=True),
            help="The gate's load point: Poisson arrivals at this rate (req/s, seed 0) instead.",
        ),
        click.option("--prove-requests", type=click.IntRange(1), default=32, show_default=True,
                     help="Requests sent at the load point, before and after alike."),
        click.option("--prove-output-tokens", type=click.IntRange(1), default=64,
                     show_default=True, help="Output tokens of each request."),
        click.option("--max-tps-drop", type=click.FloatRange(0),
                     default=5.0, show_default=True,
                     help="Largest aggregate tok/s drop kept, in %."),
        click.option("--max-ttft-rise", type=click.FloatRange(0),
                     default=20.0, show_default=True,
                     help="Largest TTFT p95 rise kept, in %."),
        click.option("--max-tpot-rise", type=click.FloatRange(0),
                     default=10.0, show_default=True,
                     help="Largest TPOT p95 rise kept, in %."),
        click.option("--max-errors", type=click.IntRange(0), default=0,
                     show_default=True, help="Most failed requests kept after the change."),
        click.option("--unleased-load", is_flag=True,
                     help="Measure even at a point that would starve the watchdog's probe when "
                     "no lease can pause it (as bench's option)."),
    ]  # fmt: skip
    for opt in reversed(options):
        fn = opt(fn)
    return fn


def proving_of(kw: dict[str, Any]) -> Any:
    """The --prove options as the workflow takes them (a Proving), validated."""
    from spark_ops.bench.gate import LoadPoint, Thresholds
    from spark_ops.workflows.prove import Proving

    if kw.get("prove_concurrency") is not None and kw.get("prove_rate") is not None:
        raise click.UsageError("give --prove-concurrency or --prove-rate, not both")
    rate = kw.get("prove_rate")
    point = LoadPoint(
        concurrency=None if rate is not None else kw.get("prove_concurrency") or 4,
        request_rate=rate, requests=kw["prove_requests"],
        output_tokens=kw["prove_output_tokens"],
    )  # fmt: skip
    limits = Thresholds(kw["max_tps_drop"], kw["max_ttft_rise"], kw["max_tpot_rise"],
                        kw["max_errors"])  # fmt: skip
    proving = Proving(point, limits, unleased=kw.get("unleased_load", False))
    proving.validate()
    return proving


def apply_options_of(kw: dict[str, Any], operation: str = "apply") -> ApplyOptions:
    """The options of an apply (or restart, rollback) from the parsed command line: one place
    for apply, rollout and the commands sharing their options."""
    from spark_ops.workflows import ApplyOptions

    changes = _changes(kw) if operation == "apply" else []
    if operation == "apply" and not changes:
        raise click.UsageError("nothing to change: give a knob (e.g. --max-num-seqs 64) or --set")
    return ApplyOptions(
        changes=changes,
        vllm_version=kw.get("vllm_version"),
        force=kw.get("force", False),
        drain=not kw["no_drain"],
        drain_timeout_s=kw["drain_timeout"],
        rollback_on_failure=kw.get("rollback_on_failure", False),
        deadline_s=kw["deadline"],
        reason=kw["reason"] or f"planned restart (spark-ops {operation})",
        preflight=kw.get("preflight", "auto"),
        preflight_timeout_s=kw.get("preflight_timeout", 60.0),
        trust_keys=kw.get("trust_keys", False),
        command=command_line(),
        over_budget=kw.get("over_budget", False),
        boot_wait_s=kw.get("boot_wait"),
        prove=proving_of(kw) if kw.get("prove") else None,
    )


def _changes(kw: dict[str, Any]) -> list[Change]:
    """Validated recipe changes from the knob options."""
    from spark_ops.recipe import changes_from_options

    return changes_from_options(
        max_num_seqs=kw["max_num_seqs"],
        kv_cache_memory=kw["kv_cache_memory"],
        moe_backend=kw["moe_backend"],
        enforce_eager=kw["enforce_eager"],
        sets=kw["sets"],
        flags=kw["flags"],
        unset_flags=kw["unset_flags"],
    )
