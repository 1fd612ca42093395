"""Every remote program (a RemoteProgram of spark_ops/remote/) run on a real shell, bash and dash.

One runner, data in tests/fixtures/remote_programs/cases.yaml: each program's command line with
hostile arguments (quotes, `$(…)`, backticks, braces, newlines, a leading '-', `~` paths, spaces)
must hand each argument to the program intact, and one it cannot take (not UTF-8, a NUL, the wrong
type) is refused before anything runs; then the real programs run on files named with the hostile
name. Nothing may create the file PWNED. No cluster, no SSH: the shells the nodes run are local.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import pkgutil
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

import spark_ops.remote.programs
from spark_ops.errors import InputError
from spark_ops.remote import quote_args
from spark_ops.remote.program import Kind, RemoteProgram

DATA = yaml.safe_load(
    (Path(__file__).parent / "fixtures" / "remote_programs" / "cases.yaml").read_text("utf-8")
)
SHELLS = [s for s in ("bash", "dash") if shutil.which(s)]
ECHO = r"""printf '<%s>' "$#"; for a in "$@"; do printf '%s\0' "$a"; done; printf '\036'"""
H = "x 'q\" $(touch PWNED) `touch PWNED` {a,b} * \\ ü\n-z"  # the hostile file name
H1 = H.replace("\n", " ")


def _programs() -> dict[str, RemoteProgram[Any]]:
    """Every RemoteProgram of remote/shell.py and remote/programs/*, as module.NAME."""
    names = ["spark_ops.remote.shell"] + [
        f"spark_ops.remote.programs.{m.name}"
        for m in pkgutil.iter_modules(spark_ops.remote.programs.__path__)
    ]
    found: dict[str, RemoteProgram[Any]] = {}
    for name in names:
        module = importlib.import_module(name)
        for attr, value in vars(module).items():
            if isinstance(value, RemoteProgram):
                found[f"{name.rsplit('.', 1)[1]}.{attr}"] = value
    return found


PROGRAMS = _programs()


def _value(raw: Any) -> Any:
    """A fixture value: {surrogate: text} is text holding an undecodable byte."""
    return raw["surrogate"] if isinstance(raw, dict) else raw


def _sh(
    shell: str, line: str, cwd: Path, home: Path, stdin: str = ""
) -> subprocess.CompletedProcess[bytes]:
    """Run one command line as the node's login shell would (`shell -c LINE`)."""
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(home), "LC_ALL": "C.UTF-8"}
    return subprocess.run(
        [shell, "-c", line], cwd=cwd, env=env, input=stdin.encode(), capture_output=True,
        timeout=60, check=False,
    )  # fmt: skip


def _expected(kind: Kind, value: Any, home: Path) -> str:
    """What the program must see for an argument: the value, a PATH's ~/ as $HOME/."""
    if kind is Kind.INT:
        return str(value)
    if kind is Kind.PATH and value == "~":
        return str(home)
    if kind is Kind.PATH and value.startswith("~/"):
        return f"{home}/{value[2:]}"
    return str(value)


def test_every_program_is_run_here() -> None:
    """Each program has a real-shell case below, or names the test that runs it."""
    cased = {run["program"] for case in DATA["cases"] for run in case["runs"]}
    assert set(PROGRAMS) == cased | set(DATA["elsewhere"]), "a program without a case"
    assert len(PROGRAMS) >= 30


@pytest.mark.parametrize("shell", SHELLS)
@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_arguments_arrive_intact(name: str, shell: str, tmp_path: Path) -> None:
    """Every hostile value, in every parameter, reaches the program as exactly one argument."""
    program = dataclasses.replace(PROGRAMS[name], text=ECHO)
    params = program.params
    if not params:
        res = _sh(shell, program.line(), tmp_path, tmp_path)
        assert res.stdout == b"<0>\x1e", res.stderr
        return
    values = {Kind.TEXT: DATA["hostile"], Kind.PATH: DATA["hostile"], Kind.INT: DATA["ints"]}
    lines, expected = [], []
    rounds = max(len(v) for v in values.values())
    for r in range(rounds):  # each round shifts the values, so each parameter gets each one
        args = [values[p.kind][(r + i) % len(values[p.kind])] for i, p in enumerate(params)]
        if params[-1].many:
            args.append(args[-1])  # a second value for a parameter taking many
        kinds = [p.kind for p in params] + ([params[-1].kind] if params[-1].many else [])
        lines.append(program.line(*args))
        want = [_expected(k, a, tmp_path) for k, a in zip(kinds, args, strict=True)]
        expected.append(f"<{len(want)}>" + "".join(w + "\0" for w in want))
    res = _sh(shell, "\n".join(lines), tmp_path, tmp_path)
    assert res.returncode == 0, res.stderr
    got = res.stdout.decode("utf-8").split("\x1e")[:-1]
    assert got == expected
    assert not list(tmp_path.iterdir()), "a value ran as a command"


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_unsendable_arguments_refused(name: str) -> None:
    """A value an argument cannot take is refused before any line exists, naming the program and
    the argument; a wrong number of arguments too."""
    program = PROGRAMS[name]
    good = {Kind.TEXT: "x", Kind.PATH: "/x", Kind.INT: 1}
    base = [good[p.kind] for p in program.params if not p.optional and not p.many]
    for i, p in enumerate(program.params[: len(base)]):
        refused = DATA["refused"]["int" if p.kind is Kind.INT else "text"]
        for raw in refused:
            args = list(base)
            args[i] = _value(raw)
            with pytest.raises(InputError) as err:
                program.line(*args)
            assert f"{program.name}: argument {p.name}" in err.value.message
            with pytest.raises(InputError):
                program.argv(*args)
    if len(base):
        with pytest.raises(TypeError):
            program.line(*base[:-1])
    if not (program.params and program.params[-1].many):
        with pytest.raises(TypeError):
            program.line(*[good[p.kind] for p in program.params], "extra")


def _fill(value: Any, tmp: Path, home: Path) -> Any:
    """Placeholders {tmp} {home} {H} {H1} filled in one pass (in strings, lists, mappings)."""
    if isinstance(value, str):
        names = {"tmp": str(tmp), "home": str(home), "H": H, "H1": H1}
        return re.sub(r"\{(tmp|home|H1|H)\}", lambda m: names[m.group(1)], value)
    if isinstance(value, list):
        return [_fill(v, tmp, home) for v in value]
    if isinstance(value, dict):
        return {_fill(k, tmp, home): _fill(v, tmp, home) for k, v in value.items()}
    return value


def _check(expect: dict[str, Any], res: subprocess.CompletedProcess[bytes], tmp: Path) -> None:
    """One run's expectations."""
    out = res.stdout.decode("utf-8", "replace")
    err = res.stderr.decode("utf-8", "replace")
    why = f"exit {res.returncode}, stdout {out!r}, stderr {err[-500:]!r}"
    if "exit" in expect:
        if expect["exit"] == "nonzero":
            assert res.returncode != 0, why
        else:
            assert res.returncode == expect["exit"], why
    if "stdout" in expect:
        assert out == expect["stdout"], why
    if "stdout_starts" in expect:
        assert out.startswith(expect["stdout_starts"]), why
    for part in expect.get("stdout_has", []):
        assert part in out, why
    for part in expect.get("stderr_has", []):
        assert part in err, why
    if "stdout_json" in expect:
        assert json.loads(out) == expect["stdout_json"], why
    for rel in expect.get("exists", []):
        assert (tmp / rel).exists(), rel
    for rel in expect.get("absent", []):
        assert not (tmp / rel).exists(), rel


@pytest.mark.parametrize("shell", SHELLS)
@pytest.mark.parametrize("case", DATA["cases"], ids=[c["name"] for c in DATA["cases"]])
def test_programs_on_hostile_names(case: dict[str, Any], shell: str, tmp_path: Path) -> None:
    """The real programs, on files named with quotes, `$(…)`, braces, a glob, a newline."""
    home = tmp_path / "home"
    home.mkdir()
    for rel, content in _fill(case.get("files", {}), tmp_path, home).items():
        target = tmp_path / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content, encoding="utf-8")
    for run in case["runs"]:
        program = PROGRAMS[run["program"]]
        args = [a.replace("python3", sys.executable) if a == "python3" else a for a in run["args"]]
        args = _fill(args, tmp_path, home)
        if run.get("wrap") == "env":
            line = quote_args(["env", "SPARK_OPS_TEST=1", *program.argv(*args)])
        else:
            line = program.line(*args)
        res = _sh(shell, line, tmp_path, home, _fill(run.get("stdin", ""), tmp_path, home))
        _check(_fill(run.get("expect", {}), tmp_path, home), res, tmp_path)
    pwned = [p for p in tmp_path.rglob("PWNED")]
    assert not pwned, f"a value ran as a command: {pwned}"


@pytest.mark.parametrize("program", ["READ", "TAIL"])
def test_readers_refuse_what_is_no_regular_file_at_once(program: str, tmp_path: Path) -> None:
    """The remote readers (a recipe, a journal, a config) answer at once for a FIFO or a
    directory: exit 13 with "not a regular file", never a wait until the command's deadline."""
    import subprocess

    from spark_ops.remote import shell

    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "dir").mkdir()
    for name in ("fifo", "dir"):
        argv = getattr(shell, program).argv(str(tmp_path / name), 1000)
        res = subprocess.run(argv, capture_output=True, text=True, timeout=20, check=False)
        assert res.returncode == 13 and "not a regular file" in res.stderr, (name, res)
