"""`spark-ops bench --request-rate`: the open-loop sweep's options parsed, run and rendered."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

# the closed-loop options an open-loop run has no use for: refused when given
CLOSED_ONLY = {
    "concurrency": "--concurrency",
    "mode": "--mode",
    "duration": "--duration",
    "rate": "--rate",
    "repeats": "--repeats",
    "steady_fraction": "--steady-fraction",
    "slo_tok_s": "--slo-tok-s",
    "what_if_cap": "--what-if-cap",
    "resume_path": "--resume",
    "plot_path": "--plot",
}

# the open-loop options a closed-loop sweep has no use for: refused when given
OPEN_ONLY = {
    "arrivals": "--arrivals",
    "requests": "--requests",
    "max_concurrency": "--max-concurrency",
    "slo_ttft_ms": "--slo-ttft-ms",
    "slo_tpot_ms": "--slo-tpot-ms",
}


def parse_rates(text: str) -> list[float]:
    """Parse '1,2,4' (requests per second) into [1.0, 2.0, 4.0] or fail naming the value."""
    try:
        rates = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        rates = []
    if not rates or any(not (math.isfinite(r) and r > 0) for r in rates):
        raise click.BadParameter(
            f"{text[:80]!r}: expected comma-separated rates > 0 (requests/s), e.g. 1,2,4",
            param_hint="--request-rate",
        )
    return rates


def slo_limit(value: float, option: str) -> float | None:
    """An SLO option's limit in ms: 0 turns it off (None), a negative value is a usage error."""
    if not math.isfinite(value) or value < 0:
        raise click.BadParameter(f"{value!r}: expected ms >= 0 (0: not applied)", param_hint=option)
    return value or None


def refuse_given(ctx: click.Context, options: dict[str, str], why: str) -> None:
    """A usage error naming the first of `options` given on the command line: '<option> <why>'."""
    from click.core import ParameterSource

    for name, option in options.items():
        source = ctx.get_parameter_source(name)
        if source in (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT):
            raise click.UsageError(f"{option} {why}")


def is_open_loop(ctx: click.Context) -> bool:
    """True when --request-rate was given (the closed-loop options refused), else False (the
    open-loop options refused): which loop `bench` runs."""
    if ctx.params["request_rate"] is None:
        refuse_given(ctx, OPEN_ONLY, "is for open-loop runs: give --request-rate")
        return False
    refuse_given(ctx, CLOSED_ONLY, "is for closed-loop sweeps: not with --request-rate")
    return True


def open_loop(ctx: click.Context) -> int | None:
    """Run the open-loop sweep `bench`'s parameters describe; ABORTED when interrupted."""
    from spark_ops.bench.openloop import RateConfig
    from spark_ops.bench.ratelevel import Slo
    from spark_ops.cli.bench import knob_value, load_printers, parse_pairs, resolve_url

    p = ctx.params
    rates = parse_rates(p["request_rate"])
    slo = Slo(slo_limit(p["slo_ttft_ms"], "--slo-ttft-ms"),
              slo_limit(p["slo_tpot_ms"], "--slo-tpot-ms"))  # fmt: skip
    knobs = {k: knob_value(v) for k, v in parse_pairs(p["knobs"], "--knob", "=").items()}
    config = RateConfig(
        base_url=resolve_url(p["url"]) if p["url"] else "http://via-inventory",
        rates=rates, model=p["model"],
        api=p["api"], arrivals=p["arrivals"], requests=p["requests"],
        max_concurrency=p["max_concurrency"], output_tokens=p["output_tokens"], seed=p["seed"],
        warmup=p["warmup"], timeout_s=p["timeout"],
        slo=slo,
        api_key=p["api_key"], headers=parse_pairs(p["headers"], "--header", ":"),
        knobs=knobs or None, prompts_path=p["prompts_path"],
    )  # fmt: skip
    config.validate()
    outputs = RateOutputs(p["as_json"], p["json_path"], p["csv_path"])
    if p["url"]:
        return run_open_loop(config, outputs)
    from functools import partial

    from spark_ops.cli.common import load_cluster
    from spark_ops.workflows.loadguard import rates_cluster

    note, plan = load_printers(p["as_json"])
    against = partial(
        rates_cluster, load_cluster(ctx), unleased=p["unleased_load"], on_note=note, on_plan=plan
    )  # the inventory's engine (tunnelled), each rate under the watchdog's load guard
    return run_open_loop(config, outputs, against)


@dataclass
class RateOutputs:
    """Where an open-loop run's result goes besides the screen."""

    as_json: bool
    json_path: Path | None
    csv_path: Path | None


def run_open_loop(config: Any, outputs: RateOutputs, against: Any = None) -> int | None:
    """Run the open-loop sweep of `config` (a RateConfig) with `against` (run_rates at its URL
    when None) and render or write its result; an interrupted run says which rates finished
    (nothing is written) and exits ABORTED."""
    from rich.console import Console

    from spark_ops.bench import ratereport
    from spark_ops.bench.openloop import run_rates
    from spark_ops.cli.common import emit_json, quiet, run_async
    from spark_ops.errors import ExitStatus

    err = Console(stderr=True)
    finished: list[float] = []

    def on_level(level: Any) -> None:
        """A finished level: one line on stderr (unless quiet or --json)."""
        finished.append(level.request_rate)
        if quiet() or outputs.as_json:
            return
        err.print(
            f"rate {level.request_rate:g}/s: {level.output_throughput:.0f} tok/s, "
            f"goodput {level.request_goodput:.2f} req/s, {level.failed} error(s)",
            highlight=False,
        )

    try:
        result = run_async((against or run_rates)(config, on_level=on_level))
    except KeyboardInterrupt:
        done = ",".join(f"{r:g}" for r in finished) or "none"
        err.print(
            f"interrupted: {len(finished)} of {len(config.rates)} rate(s) finished ({done}); "
            "an open-loop run keeps nothing: run it again",
            highlight=False,
        )
        return int(ExitStatus.ABORTED)
    if outputs.as_json:
        emit_json(result.to_dict())
    else:
        from spark_ops.cli.bench import report_width

        width = report_width()
        click.echo(ratereport.render_rate_text(result, width=width), nl=False)
    if outputs.json_path:
        ratereport.write_rate_json(result, outputs.json_path)
    if outputs.csv_path:
        ratereport.write_rate_csv(result, outputs.csv_path)
    for path in (outputs.json_path, outputs.csv_path):
        if path and not quiet():
            err.print(f"wrote {path}", highlight=False)
    return None


def compare_open_loop(
    before: Any, after: Any, names: tuple[str, str], as_json: bool, json_path: Path | None
) -> int | None:
    """`bench compare` of two open-loop results: the gate's verdict per rate both have (default
    thresholds); CHECK_FAILED when a rate fails it or none is shared."""
    import json

    from spark_ops.bench import ratereport
    from spark_ops.bench.openloop import RateResult
    from spark_ops.cli.bench import report_width
    from spark_ops.errors import BenchError, ExitStatus
    from spark_ops.files import write_file

    for result, name in ((before, names[0]), (after, names[1])):
        if not isinstance(result, RateResult):
            raise BenchError(
                f"{name}: a concurrency sweep, the other an open-loop result: compare like with "
                "like"
            )
    cmp = ratereport.compare_rates(before, after)
    text = json.dumps(cmp, indent=2)
    if as_json:
        click.echo(text)
    else:
        out = ratereport.render_compare_rates(cmp, names, width=report_width())
        click.echo(out, nl=False)
    if json_path:
        write_file(json_path, text + "\n")
    return None if cmp["ok"] else int(ExitStatus.CHECK_FAILED)
