"""`spark-ops bench`: the throughput sweep (default) and `compare A.json B.json`."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:
    from spark_ops.bench.stats import LevelResult

DEFAULT_CONCURRENCY = "1,6,16,32,64"
TABLE_WIDTH = 110


def resolve_url(url: str) -> str:
    """Normalise a base URL given with --url (scheme added, a trailing /v1 dropped)."""
    url = url.strip().rstrip("/")
    if url.endswith("/v1"):
        url = url[: -len("/v1")]
    if not url.startswith(("http://", "https://")):
        url = "http://" + url
    return url


def parse_levels(text: str) -> list[int]:
    """Parse '1,6,16' into [1, 6, 16] or fail with a usage error naming the value."""
    try:
        levels = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise click.BadParameter(
            f"{text!r}: expected comma-separated integers, e.g. {DEFAULT_CONCURRENCY}",
            param_hint="--concurrency",
        ) from None
    if not levels or any(c < 1 for c in levels):
        raise click.BadParameter(f"{text!r}: every level must be >= 1", param_hint="--concurrency")
    return levels


def _parse_pairs(values: tuple[str, ...], option: str, sep: str) -> dict[str, str]:
    """Parse repeated KEY<sep>VALUE options into a dict."""
    out: dict[str, str] = {}
    for item in values:
        key, found, value = item.partition(sep)
        if not found or not key.strip():
            raise click.BadParameter(f"{item!r}: expected KEY{sep}VALUE", param_hint=option)
        out[key.strip()] = value.strip()
    return out


def parse_caps(text: str | None) -> list[int]:
    """Parse --what-if-cap '6,16,32' into [6, 16, 32] (empty when not given)."""
    if text is None:
        return []
    try:
        caps = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise click.BadParameter(
            f"{text!r}: expected comma-separated integers, e.g. 6,16,32", param_hint="--what-if-cap"
        ) from None
    if not caps or caps[0] < 1:
        raise click.BadParameter(f"{text!r}: every cap must be >= 1", param_hint="--what-if-cap")
    return caps


def _knob_value(text: str) -> Any:
    """Knob values as ints where they are integers, else the text."""
    return int(text) if text.lstrip("-").isdigit() else text


@click.group(name="bench", invoke_without_command=True)
@click.option("--url", help="Engine base URL (default: the inventory's engine, tunnelled).")
@click.option("--model", help="Model name (default: the first one /v1/models lists).")
@click.option(
    "--api", type=click.Choice(["chat", "completions"]), default="chat", show_default=True
)
@click.option(
    "--concurrency",
    default=DEFAULT_CONCURRENCY,
    show_default=True,
    help="Concurrency levels, comma-separated.",
)
@click.option(
    "--output-tokens",
    type=click.IntRange(min=1),
    default=300,
    show_default=True,
    help="Tokens per request (ignore_eos).",
)
@click.option(
    "--mode",
    type=click.Choice(["burst", "sustained", "poisson"]),
    default="burst",
    show_default=True,
    help="burst: C requests at once; sustained: keep C in flight for --duration; "
    "poisson: seeded arrivals at --rate for --duration, at most C in flight.",
)
@click.option(
    "--duration",
    type=float,
    default=60.0,
    show_default=True,
    help="Seconds per run (sustained, poisson).",
)
@click.option("--rate", type=float, help="Poisson arrivals per second (mode poisson).")
@click.option(
    "--repeats", type=click.IntRange(min=1), default=3, show_default=True, help="Runs per level."
)
@click.option(
    "--warmup",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="Requests sent first, left out of the figures.",
)
@click.option("--slo-tok-s", type=float, help="Per-user tok/s to keep (e.g. 12).")
@click.option(
    "--steady-fraction",
    type=float,
    default=0.9,
    show_default=True,
    help="Steady window: in flight >= this share of C.",
)
@click.option("--timeout", type=float, default=600.0, show_default=True, help="Per request, s.")
@click.option("--api-key", envvar="SPARK_OPS_API_KEY", help="Bearer token ($SPARK_OPS_API_KEY).")
@click.option("--header", "headers", multiple=True, help="Extra header 'Name: value'.")
@click.option("--knob", "knobs", multiple=True, help="Knob in effect, reported: max_num_seqs=64.")
@click.option("--seed", type=int, default=0, show_default=True, help="Poisson arrivals seed.")
@click.option("--no-metrics", is_flag=True, help="Do not scrape /metrics.")
@click.option(
    "--what-if-cap",
    "what_if_cap",
    help="Lower max-num-seqs values to predict from this sweep, comma-separated (e.g. 6,16,32); "
    "each is added to the levels.",
)
@click.option(
    "--prompts",
    "prompts_path",
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    help="Prompt file (template, languages, tasks); default: the packaged 120 prompts.",
)
@click.option(
    "--json",
    "json_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write the result (vllm bench serve key names).",
)
@click.option(
    "--csv",
    "csv_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write one row per level.",
)
@click.option(
    "--plot",
    "plot_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write a PNG of tok/s against concurrency.",
)
@click.pass_context
def cli(
    ctx: click.Context,
    url: str | None,
    model: str | None,
    api: str,
    concurrency: str,
    output_tokens: int,
    mode: str,
    duration: float,
    rate: float | None,
    repeats: int,
    warmup: int,
    slo_tok_s: float | None,
    steady_fraction: float,
    timeout: float,
    api_key: str | None,
    headers: tuple[str, ...],
    knobs: tuple[str, ...],
    seed: int,
    no_metrics: bool,
    what_if_cap: str | None,
    prompts_path: Path | None,
    json_path: Path | None,
    csv_path: Path | None,
    plot_path: Path | None,
) -> None:
    """Sweep throughput over concurrency levels and print the note's table."""
    if ctx.invoked_subcommand is not None:
        return
    import asyncio

    from rich.console import Console

    from spark_ops.bench import report
    from spark_ops.bench.sweep import SweepConfig, run_sweep
    from spark_ops.bench.whatif import levels_with_caps, recheck_level

    caps = parse_caps(what_if_cap)
    config = SweepConfig(
        base_url=resolve_url(url) if url else "http://via-inventory",
        model=model,
        api=api,
        levels=levels_with_caps(parse_levels(concurrency), caps),
        recheck=recheck_level(caps),
        output_tokens=output_tokens,
        mode=mode,
        duration_s=duration,
        rate=rate,
        repeats=repeats,
        warmup=warmup,
        steady_fraction=steady_fraction,
        slo_tok_s=slo_tok_s,
        timeout_s=timeout,
        api_key=api_key,
        headers=_parse_pairs(headers, "--header", ":"),
        seed=seed,
        knobs={k: _knob_value(v) for k, v in _parse_pairs(knobs, "--knob", "=").items()} or None,
        metrics=not no_metrics,
        prompts_path=prompts_path,
    )
    config.validate()
    if plot_path:  # before the first request: a missing `plot` extra is said at once
        from spark_ops.bench.plot import load_pyplot

        load_pyplot()
    err = Console(stderr=True)

    def progress(level: LevelResult) -> None:
        """One line per finished level on stderr."""
        err.print(
            f"C={level.max_concurrency}: {level.output_throughput:.0f} tok/s aggregate, "
            f"{(level.per_user_tok_s or 0):.1f} tok/s per user, {level.failed} errors",
            highlight=False,
        )

    async def sweep() -> Any:
        """Run against --url, or against the inventory's engine (tunnel to the head if needed)."""
        if url:
            return await run_sweep(config, on_level=progress)
        from spark_ops.cli.common import load_cluster
        from spark_ops.workflows import engine_endpoint

        async with engine_endpoint(load_cluster(ctx)) as (base_url, recipe_knobs):
            config.base_url = base_url
            config.knobs = config.knobs or recipe_knobs
            return await run_sweep(config, on_level=progress)

    result = asyncio.run(sweep())
    out = Console()
    out.width = max(out.width, TABLE_WIDTH)  # ten columns: narrower terminals would truncate them
    out.print(report.sweep_table(result))
    for line in report.reading_lines(result):
        out.print(line, highlight=False)
    whatif = None
    if caps:
        from spark_ops.bench.report import whatif_lines, whatif_table
        from spark_ops.bench.whatif import whatif_of
        from spark_ops.errors import BenchError

        try:
            whatif = whatif_of(result, caps)
        except BenchError as exc:
            err.print(f"what-if: {exc.message}", highlight=False)
        else:
            out.print()
            out.print(whatif_table(whatif))
            for line in whatif_lines(whatif):
                out.print(line, highlight=False)
    if json_path:
        report.write_json(
            result, json_path, extra={"what_if": whatif.to_dict()} if whatif else None
        )
    if csv_path:
        report.write_csv(result, csv_path)
    if plot_path:
        from spark_ops.bench.plot import plot_sweep

        plot_sweep(result, plot_path)
    for path in (json_path, csv_path, plot_path):
        if path:
            err.print(f"wrote {path}", highlight=False)


@cli.command(name="compare")
@click.argument("before", type=click.Path(dir_okay=False, path_type=Path))
@click.argument("after", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path))
def compare_cmd(before: Path, after: Path, json_path: Path | None) -> None:
    """Compare two sweep results level by level (after/before ratios)."""
    import json

    from rich.console import Console

    from spark_ops.bench import report

    cmp = report.compare(
        report.load_result(before), report.load_result(after), names=(str(before), str(after))
    )
    out = Console()
    out.print(report.render_compare_text(cmp, width=max(out.width, 150)), end="", highlight=False)
    if json_path:
        from spark_ops.errors import BenchError
        from spark_ops.files import write_file

        write_file(json_path, json.dumps(cmp.to_dict(), indent=2) + "\n", error=BenchError)
