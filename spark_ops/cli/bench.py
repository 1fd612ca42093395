"""`spark-ops bench`: the throughput sweep (default) and `compare A.json B.json`."""

from __future__ import annotations

import json
import shlex
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:
    from spark_ops.bench.stats import LevelResult

DEFAULT_CONCURRENCY = "1,6,16,32,64"
PIPE_WIDTH = 160  # the width of a report written to a pipe or file (no terminal to fit)


def report_width() -> int:
    """The terminal's width on a TTY ($COLUMNS honoured), PIPE_WIDTH elsewhere."""
    if sys.stdout.isatty():
        return shutil.get_terminal_size((PIPE_WIDTH, 24)).columns
    return PIPE_WIDTH


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
    from spark_ops.bench.stats import MAX_LEVEL

    if not levels or any(not 1 <= c <= MAX_LEVEL for c in levels):
        raise click.BadParameter(
            f"{text[:80]!r}: every level must be 1..{MAX_LEVEL}", param_hint="--concurrency"
        )
    return levels


def parse_pairs(values: tuple[str, ...], option: str, sep: str) -> dict[str, str]:
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


def knob_value(text: str) -> Any:
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
@click.option(
    "--seed",
    type=int,
    default=0,
    show_default=True,
    help="Seed of poisson arrivals (--mode poisson, --request-rate).",
)
@click.option(
    "--request-rate",
    "request_rate",
    help="Open loop: arrivals per second, comma-separated to sweep (e.g. 1,2,4); each request is "
    "sent at its time whether or not earlier ones finished.",
)
@click.option(
    "--arrivals",
    type=click.Choice(["poisson", "constant"]),
    default="poisson",
    show_default=True,
    help="Open loop: exponential gaps from --seed, or even gaps of 1/rate.",
)
@click.option(
    "--requests",
    type=click.IntRange(min=1, max=100_000),
    default=100,
    show_default=True,
    help="Open loop: requests per rate (the same seeded schedule, scaled to each rate).",
)
@click.option(
    "--max-concurrency",
    type=click.IntRange(min=1),
    help="Open loop: at most this many requests in flight (default: no cap).",
)
@click.option(
    "--slo-ttft-ms",
    type=float,
    default=2000.0,
    show_default=True,
    help="Open loop goodput: a request's time to first token at most this (0: not applied).",
)
@click.option(
    "--slo-tpot-ms",
    type=float,
    default=100.0,
    show_default=True,
    help="Open loop goodput: a request's time per output token at most this (0: not applied).",
)
@click.option("--no-metrics", is_flag=True, help="Do not scrape /metrics.")
@click.option(
    "--unleased-load",
    is_flag=True,
    help="Run a level that would starve the watchdog's probe even when no lease can pause it.",
)
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
    "--json", "as_json", is_flag=True, help="Print the result as JSON on stdout (no table)."
)
@click.option(
    "-o",
    "--output",
    "json_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write the result as JSON to this file (vllm bench serve key names).",
)
@click.option(
    "--resume",
    "resume_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Continue the interrupted sweep whose finished levels this file keeps.",
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
    request_rate: str | None,
    arrivals: str,
    requests: int,
    max_concurrency: int | None,
    slo_ttft_ms: float,
    slo_tpot_ms: float,
    no_metrics: bool,
    unleased_load: bool,
    what_if_cap: str | None,
    prompts_path: Path | None,
    as_json: bool,
    json_path: Path | None,
    resume_path: Path | None,
    csv_path: Path | None,
    plot_path: Path | None,
) -> int | None:
    """Sweep throughput over concurrency levels (or open-loop arrival rates) and print a table.

    With --request-rate each rate's requests are sent at seeded times whatever the earlier ones
    are doing, and goodput under --slo-ttft-ms/--slo-tpot-ms is reported.

    After every level its figures are kept in a partial file; an interrupted sweep says which,
    and `--resume FILE` runs only the levels it lacks.
    """
    if ctx.invoked_subcommand is not None:
        return None
    from spark_ops.cli import bench_rate

    if bench_rate.is_open_loop(ctx):  # --request-rate given: the open-loop run
        return bench_rate.open_loop(ctx)
    from rich.console import Console

    from spark_ops.bench import report
    from spark_ops.bench.partial import (
        default_partial_path,
        load_partial,
        remove_partial,
        save_partial,
    )
    from spark_ops.bench.sweep import SweepConfig, run_sweep
    from spark_ops.bench.whatif import levels_with_caps, recheck_level
    from spark_ops.cli.common import command_line, emit_json, quiet, run_async
    from spark_ops.cli.sweep_progress import SweepDisplay
    from spark_ops.errors import ExitStatus

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
        headers=parse_pairs(headers, "--header", ":"),
        seed=seed,
        knobs={k: knob_value(v) for k, v in parse_pairs(knobs, "--knob", "=").items()} or None,
        metrics=not no_metrics,
        prompts_path=prompts_path,
    )
    config.validate()
    if plot_path:  # before the first request: a missing `plot` extra is said at once
        from spark_ops.bench.plot import load_pyplot

        load_pyplot()
    err = Console(stderr=True)
    done = load_partial(resume_path, config) if resume_path else []
    partial = resume_path or default_partial_path()
    display = SweepDisplay(list(config.levels), config.repeats, config.recheck, quiet=quiet())
    display.keep(done)
    finished: list[LevelResult] = list(done)

    def on_level(level: LevelResult) -> None:
        """A finished level: its line, and every finished level kept in the partial file."""
        display.on_level(level)
        if level not in finished:
            finished.append(level)
        save_partial(partial, config, finished)

    async def sweep() -> Any:
        """Run against --url, or against the inventory's engine (tunnel to the head if needed)."""
        kw: dict[str, Any] = {"on_level": on_level, "on_run": display.on_run, "done": done}
        if url:
            return await run_sweep(config, **kw)
        from spark_ops.cli.common import load_cluster
        from spark_ops.workflows.loadguard import sweep_cluster

        note, plan = load_printers(as_json)
        return await sweep_cluster(
            load_cluster(ctx), config, unleased=unleased_load, on_note=note, on_plan=plan, **kw
        )

    try:
        result = run_async(sweep())
    except KeyboardInterrupt:
        display.close()
        _interrupted(err, finished, list(config.levels), partial, resume_path, command_line())
        return int(ExitStatus.ABORTED)
    finally:
        display.close()
    remove_partial(partial)
    whatif = None
    if caps:
        from spark_ops.bench.whatif import whatif_of
        from spark_ops.errors import BenchError

        try:
            whatif = whatif_of(result, caps)
        except BenchError as exc:
            err.print(f"what-if: {exc.message}", highlight=False)
    extra = {"what_if": whatif.to_dict()} if whatif else None
    if as_json:
        emit_json({**result.to_dict(), **(extra or {})})
    else:
        _print_report(result, whatif)
    if json_path:
        report.write_json(result, json_path, extra=extra)
    if csv_path:
        report.write_csv(result, csv_path)
    if plot_path:
        from spark_ops.bench.plot import plot_sweep

        plot_sweep(result, plot_path)
    for path in (json_path, csv_path, plot_path):
        if path and not quiet():
            err.print(f"wrote {path}", highlight=False)
    return None


def load_printers(as_json: bool) -> tuple[Callable[[str], None], Callable[[Any], None]]:
    """How a load against the cluster is told on stderr (JSON lines under --json): a note (a
    lease taken, a level run unleased), and the load plan before any request."""
    from spark_ops.cli.common import quiet

    def note(text: str) -> None:
        """A lease taken, or a level run unleased: one line on stderr (JSON under --json)."""
        if quiet():
            return
        shown = json.dumps({"event": "note", "text": text}) if as_json else f"note: {text}"
        click.echo(shown, err=True)

    def plan(load: Any) -> None:
        """The load plan before any request: which levels run as is, leased or refused."""
        if quiet():
            return
        if as_json:
            click.echo(json.dumps({"event": "load-plan", **load.to_dict()}), err=True)
            return
        head, *rest = load.lines()
        click.echo(f"{head}:", err=True)
        for line in rest:
            click.echo(f"  {line}", err=True)

    return note, plan


def _print_report(result: Any, whatif: Any) -> None:
    """The sweep's table, its reading and the what-if, for a person on stdout."""
    from rich.console import Console

    from spark_ops.bench import report

    out = Console(width=report_width())
    out.print(report.fit_table(report.sweep_table(result), out.width, report.SWEEP_DROP))
    for line in report.reading_lines(result):
        out.print(line, highlight=False)
    if whatif is not None:
        out.print()
        out.print(report.fit_table(report.whatif_table(whatif), out.width, []))
        for line in report.whatif_lines(whatif):
            out.print(line, highlight=False)


def _interrupted(
    err: Any, finished: list[LevelResult], levels: list[int], partial: Path,
    resumed: Path | None, line: str,
) -> None:  # fmt: skip
    """What an interrupted sweep kept and the command that continues it."""
    if not finished:
        err.print("interrupted before any level finished: nothing kept", highlight=False)
        return
    words = shlex.split(line)
    if resumed:  # the command as given, less its own --resume
        i = words.index("--resume") if "--resume" in words else None
        words = words[:i] + words[i + 2 :] if i is not None else [
            w for w in words if not w.startswith("--resume=")]  # fmt: skip
    words = [*words, "--resume", str(partial)]
    err.print(
        f"interrupted: {len(finished)} of {len(levels)} level(s) finished "
        f"({','.join(str(lv.max_concurrency) for lv in finished)}), kept in {partial}\n"
        f"continue with: {shlex.join(words)}",
        highlight=False, markup=False, soft_wrap=True,  # a line to copy: never wrapped
    )  # fmt: skip


@cli.command(name="compare")
@click.argument("before", type=click.Path(dir_okay=False, path_type=Path))
@click.argument("after", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="As JSON on stdout (no table).")
@click.option(
    "-o",
    "--output",
    "json_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write the comparison as JSON to this file.",
)
def compare_cmd(before: Path, after: Path, as_json: bool, json_path: Path | None) -> int | None:
    """Compare two sweep results level by level (after/before ratios); two open-loop results
    rate by rate through the gate (exit 11 when a rate fails it)."""
    import json

    from rich.console import Console

    from spark_ops.bench import report
    from spark_ops.bench.sweep import SweepResult

    first, second = report.load_saved(before), report.load_saved(after)
    if not isinstance(first, SweepResult) or not isinstance(second, SweepResult):
        from spark_ops.cli.bench_rate import compare_open_loop

        return compare_open_loop(first, second, (str(before), str(after)), as_json, json_path)
    cmp = report.compare(first, second, names=(str(before), str(after)))
    if as_json:
        click.echo(json.dumps(cmp.to_dict(), indent=2))
    else:
        out = Console(width=report_width())
        out.print(report.render_compare_text(cmp, width=out.width), end="", highlight=False)
    if json_path:
        from spark_ops.files import write_file

        write_file(json_path, json.dumps(cmp.to_dict(), indent=2) + "\n")
    return None
