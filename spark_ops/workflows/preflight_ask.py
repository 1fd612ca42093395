"""One way of asking a host's vLLM (bare or in the engine's container) about a command line.

Find the `vllm` the engine runs (PROBE), send the check program (build_program) to the first
interpreter beside it that imports vLLM or the sim engine (PICK), and read its one answer line back,
typed (parse_answer). The programs are spark_ops/remote/programs/preflight.py's; the entry point
that tries each way and makes the answer is preflight.py's `preflight`.
"""

from __future__ import annotations

import json
import math
import posixpath
import re
import shlex
import time
from typing import Any

from spark_ops.errors import ExitStatus, SparkOpsError, excerpt
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

PROBE_TIMEOUT = 15.0
# Never fetch anything, never report usage, while checking a command line.
QUIET_ENV = dict.fromkeys(
    ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "VLLM_NO_USAGE_STATS", "DO_NOT_TRACK"), "1"
)
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_ENV_ASSIGN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
_PY_PATH = re.compile(r"(/[\w./+-]*/bin/python[0-9.]*)(?![\w.])")


class PreflightError(SparkOpsError):
    """preflight() got an argument it cannot use (names it and what is allowed)."""

    exit_status = ExitStatus.INVENTORY  # its how and timeout come from the inventory


class Unreachable(Exception):
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
    """The program's JSON result line; Unreachable when it gave none."""
    for line in reversed(res.stdout.splitlines()):
        if line.startswith(MARK):
            try:
                data = json.loads(line[len(MARK) :])
            except ValueError as exc:
                raise Unreachable(f"unreadable answer from the check program: {exc}") from exc
            if isinstance(data, dict):
                return _typed(data)
    tail = " | ".join((res.stderr or res.stdout).strip().splitlines()[-3:])
    if res.exit_code == NO_PYTHON_EXIT:
        raise Unreachable(tail or "no Python with vLLM found")
    raise Unreachable(f"the check program exited {res.exit_code} without an answer: {tail}")


# What the head's programs write in their answer, by key (None allowed for each): what else an
# answer holds is not read. A value of another type is no answer (a tampered or foreign program).
_ANSWER_TYPES: dict[str, tuple[type, ...]] = {
    "ok": (bool,), "version": (str,), "stage": (str,), "error": (str,), "python": (str,),
    "parser_module": (str,), "import_seconds": (int, float), "program_seconds": (int, float),
    "warnings": (list,), "options": (list,), "abbrev": (bool,), "cached": (bool,),
}  # fmt: skip


def _typed(data: dict[str, Any]) -> dict[str, Any]:
    """The answer when each key it holds is of the type the programs write (numbers finite, lists
    of text); Unreachable naming the first key that is not."""
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
            raise Unreachable(
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


async def ask_one(
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
        raise Unreachable(
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
        raise Unreachable(f"{why}{where}")
    if res.exit_code != 0:
        raise Unreachable(f"cannot look for {vllm}{where}: {why}")
    lines = res.stdout.split("\n", 2)
    if len(lines) < 2:
        raise Unreachable(f"probing {vllm}{where} printed nothing usable")
    path, real, text = lines[0], lines[1], lines[2] if len(lines) > 2 else ""
    kind = "sim" if SIM_MODULE in text else "vllm"
    if method == "sim" and kind != "sim":
        raise Unreachable(f"{path} is not the embedded cluster's sim engine shim")
    if method == "vllm" and kind == "sim":
        raise Unreachable(f"{path} is the sim engine's shim, not a real vLLM")
    left = timeout - (time.monotonic() - t0)
    if left <= 0:
        raise Unreachable(f"no time left after probing {path}")
    module = "vllm" if kind == "vllm" else "spark_ops.sim.engine_args"
    held = None if known is None else known.get(kind, [])
    program = build_program(kind, args if held is None else [], held)
    res = await run(PICK.argv(module, *interpreters(path, real, text, kind)), left, program)
    data = parse_answer(res)
    data["warnings"] = [str(n) for n in data.get("notes") or []] + warning_lines(res)
    if data.get("ok") is None:
        raise Unreachable(str(data.get("error") or "the check program could not run"))
    return data, kind
