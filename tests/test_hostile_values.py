"""Property: hostile values (quotes, $(), backticks, {placeholders}, newlines, NUL, invalid UTF-8,
huge sizes) fed into every value that reaches a remote shell or a file are refused before anything
runs or is written, or arrive exactly, and nothing they hold is ever executed.

Bash itself is the judge of what a recipe's command runs: the rendered command is handed to a
real bash with `vllm` defined as a function that prints its arguments, so the words bash sees
are compared with the words spark-ops' preflight checks, and a `touch` smuggled in would leave a
file. (The remote write, read and argv paths have their own properties in test_remote.py and
test_fanout.py, on real SSH servers.)
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
from pathlib import Path
from typing import Any

import pytest
from conftest import cluster_files
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from test_remote import one_node  # noqa: F401 - one embedded SSH node for the module

from spark_ops import audit
from spark_ops.account import local_account
from spark_ops.errors import InputError, RecipeError, SparkOpsError, excerpt
from spark_ops.lock import cluster_lock
from spark_ops.recipe import changes_from_options, edit_recipe, render_recipe
from spark_ops.remote import ClusterSession, check_text
from spark_ops.workflows import ApplyOptions
from spark_ops.yamlsafe import load_yaml

REPO = Path(__file__).resolve().parents[1]
BASE = (REPO / "spark_ops" / "data" / "sim" / "glm-5.3-flash-sim.yaml").read_text()
MARK = "PWNED"

PIECES = [
    "a", "Z", "0", " ", "'", '"', "$", "(", ")", "$(touch PWNED)", "`touch PWNED`", ";",
    "; touch PWNED", "&", "|", "<", ">", "\\", "{", "}", "{port}", "{by}", "#", "*", "~", "\n",
    "\t", "=", "-", "--x", "\x00", "\udcff", "é", "\u202e",
]  # fmt: skip
hostile = st.lists(st.sampled_from(PIECES), min_size=1, max_size=8).map("".join) | st.just(
    "x" * 70_000
)
settings_ = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def bash_words(command: str, cwd: Path) -> list[str]:
    """The arguments bash passes to `vllm` when it runs command (vllm is a printing function)."""
    script = 'vllm() { shift; printf "%s\\0" "$@"; }\n' + command
    res = subprocess.run(
        ["bash", "-c", script], cwd=cwd, capture_output=True, timeout=20, check=False
    )
    return [os.fsdecode(w) for w in res.stdout.split(b"\0")[:-1]]


@settings_
@given(value=hostile, how=st.sampled_from(["flag", "set-placeholder", "set-new"]))
@example(value="-a", how="set-placeholder")  # vLLM's argparse would read it as an option
@example(value="--x", how="flag")
@example(value="-1", how="set-placeholder")  # a negative number is a value
def test_recipe_values_refused_or_exactly_what_bash_runs(
    value: str, how: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """A --flag or --set value: refused with a clear error, or bash runs the very words spark-ops
    checked (the value one word, exactly), and nothing in it runs."""
    cwd = tmp_path_factory.mktemp("bash")
    kw = {
        "flag": {"flags": [f"--served-model-name={value}"]},
        "set-placeholder": {"sets": [f"served_model_name={value}"]},
        "set-new": {"sets": [f"tokenizer_mode={value}"]},
    }[how]
    try:
        check_text("value", value, max_bytes=64 << 10)
        changes = changes_from_options(**kw)
        result = edit_recipe(BASE, changes, source="r.yaml", vllm_version="0.32")
        rendered = render_recipe(result.text, source="r.yaml")
    except (InputError, RecipeError) as exc:
        assert len(exc.message) < 1000, "an error never prints a whole value"
        return
    data = load_yaml(result.text, source="r.yaml", error=RecipeError)
    from spark_ops.recipe.render import format_command

    command = format_command(data["command"], data.get("defaults") or {}, source="r.yaml")
    words = bash_words(command, cwd)
    assert words == rendered.argv[2:], "preflight parses what bash runs"
    assert not list(cwd.iterdir()), "nothing in the value was executed"
    flag = "--served-model-name" if how != "set-new" else "--tokenizer-mode"
    assert rendered.args()[flag] == value.strip(), "the value, outer blanks trimmed (documented)"


@settings_
@given(reason=hostile | st.text(max_size=40))
def test_reason_refused_or_audited_whole(reason: str) -> None:
    """--reason: refused before connecting (exit 2) or, accepted, one ASCII JSON audit line that
    reads back as the very value."""
    try:
        opts = ApplyOptions(reason=reason)
    except InputError as exc:
        assert exc.exit_status == 2 and len(exc.message) < 1000
        return
    entry = audit.make_entry("restart", args={"reason": opts.reason})
    line = json.dumps(entry, ensure_ascii=True)
    assert line.isascii() and "\n" not in line
    assert json.loads(line)["what"]["args"]["reason"] == reason


@settings_
@given(value=hostile | st.binary(max_size=30).map(os.fsdecode))
def test_check_text_refuses_what_cannot_arrive_whole(value: str) -> None:
    """Text a node cannot receive intact (a lone surrogate from a bad byte, a NUL) is refused,
    naming the value by an excerpt; anything else passes unchanged."""
    try:
        assert check_text("v", value, max_bytes=64 << 10) == value
    except InputError as exc:
        assert "\x00" in value or not _encodable(value) or len(value.encode()) > 64 << 10
        assert len(exc.message) < 400
        return
    assert _encodable(value) and "\x00" not in value


def _encodable(value: str) -> bool:
    """Whether value is UTF-8 encodable."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


@pytest.mark.parametrize(
    "value", ["x" * 10**6, list(range(10**5)), {str(i): i for i in range(10**5)}, b"\xff" * 100]
)
def test_excerpt_never_whole(value: object) -> None:
    """An error shows a value cut short (a container by type and size, never walked)."""
    assert len(excerpt(value)) < 120


def test_inventory_alias_bomb_refused_at_once() -> None:
    """Nine levels of nine aliases: refused after the 64th alias, before anything expands."""
    text = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 9)}]\n" for i in range(9)
    )
    with pytest.raises(SparkOpsError, match="more than 64 YAML aliases"):
        load_yaml(text, source="inv.yaml", error=SparkOpsError)


names = st.lists(st.sampled_from([p for p in PIECES if p != "\x00"]), min_size=1, max_size=6).map(
    "".join
)


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(user=names)
def test_lock_and_audit_carry_hostile_user_names(one_node: Any, user: str) -> None:  # noqa: F811
    """A hostile $LOGNAME (item 1's attack) is not the operator's name: the lock owner record and
    the audit name the account from the account database; the hostile operation name reaches
    the head as data over real SSH, read back exactly, nothing executed."""
    node, c = one_node
    # no ssh.user: the login is the account's name (as OpenSSH takes it), $LOGNAME only the
    # operator's name written into the owner record and the audit entry
    home = node.spec.home
    saved = os.environ.get("LOGNAME")
    os.environ["LOGNAME"] = user

    async def go() -> None:
        """Hold the lock, read its owner record, append and read an audit entry."""
        async with ClusterSession(c) as s:
            await s.connect()
            async with cluster_lock(s, f"apply {user}"):
                owner = cluster_files(home / "h")["owner"].read_text()
                assert json.loads(owner)["user"] == local_account()
                assert json.loads(owner)["operation"] == f"apply {user}"
            await audit.record(s, audit.make_entry(f"op {user}", outcome="ok"))
            last = (await audit.read(s, 1))[-1]
            assert last["who"] == f"{local_account()}@{socket.gethostname()}"
            assert last["what"]["operation"] == f"op {user}"

    try:
        asyncio.run(go())
    finally:
        if saved is None:
            os.environ.pop("LOGNAME", None)
        else:
            os.environ["LOGNAME"] = saved
    assert not (home / MARK).exists() and not Path(MARK).exists(), "nothing was executed"


def _prompt_file(path: Path) -> object:
    """bench's reader of the operator's prompt file (`bench --prompts FILE`)."""
    from spark_ops.bench.workload import load_prompts

    return load_prompts(path)


def _watchdog_config(path: Path) -> object:
    """The reference watchdog's reader of its config (`spark-watchdog --config FILE`)."""
    from spark_ops.watchdog.config import load_config

    return load_config(path)


def _sparkrun_cluster(path: Path) -> object:
    """`init --from-sparkrun NAME`: sparkrun's cluster file, here the one at path."""
    from spark_ops.discover.sparkrun import read_sparkrun

    clusters = path.parent / ".config" / "sparkrun" / "clusters"
    clusters.mkdir(parents=True)
    path.rename(clusters / "c.yaml")
    return read_sparkrun("c", path.parent)


def _sim_config(path: Path) -> object:
    """The simulated engine's config ($SPARK_SIM_CONFIG)."""
    from spark_ops.sim.engine_config import load_config

    return load_config(path)


ALIAS_BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 9)}]\n" for i in range(9)
)


@pytest.mark.parametrize(
    "reader",
    [_prompt_file, _watchdog_config, _sparkrun_cluster, _sim_config],
    ids=lambda f: f.__name__,
)
@pytest.mark.parametrize(
    ("text", "refusal"),
    [
        (ALIAS_BOMB, "more than 64 YAML aliases"),
        ("x: " + "y" * (1 << 20), "refused before parsing"),
        ("[" * 200_000, "nested more than 128 levels deep"),  # libyaml's composer: SIGSEGV
        ("- " * 200_000 + "x", "nested more than 128 levels deep"),
    ],
    ids=["alias-bomb", "huge", "deep-flow", "deep-block"],
)
def test_every_yaml_file_an_operator_gives_gets_the_loaders_guards(
    reader: Any, text: str, refusal: str, tmp_path: Path
) -> None:
    """The prompt file, the watchdog's config, sparkrun's cluster file and the sim's config: each
    refused by the one loader (spark_ops/yamlsafe.py), naming the file, before anything expands."""
    path = tmp_path / "given.yaml"
    path.write_text(text, "utf-8")
    with pytest.raises(SparkOpsError, match=refusal) as info:
        reader(path)
    assert ".yaml" in info.value.message
