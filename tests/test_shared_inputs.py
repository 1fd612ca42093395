"""Inputs named at load (issue 34): exec's mistyped option, the SSH config file that cannot be
read, and status saying when the recipe differs from the running engine. (Host names and `~user`
paths are cases of tests/fixtures/inventory/invalid/.)"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from spark_ops.cli.main import cli
from spark_ops.errors import ConnectError
from spark_ops.inventory import SSHSettings
from spark_ops.remote.connector import client_options
from spark_ops.status import recipe_vs_engine, verdict


@pytest.mark.parametrize(
    "args",
    [
        ["exec", "--node", "node2", "--", "uptime"],
        ["exec", "--node=node2", "--", "uptime"],
        ["exec", "--nodes", "node2", "-x", "--", "uptime"],
        ["exec", "--nodes", "node2", "--tiemout", "3", "uptime"],
    ],
)
def test_exec_refuses_an_unknown_option_before_dashdash(args: list[str]) -> None:
    """A mistyped option of exec is a usage error naming it, never part of the remote command."""
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 2, res.output
    assert "exec has no option" in res.output
    assert "--nodes" in res.output  # the options it has


def test_exec_passes_options_after_dashdash() -> None:
    """After --, every word is the command's (checked before the inventory is read)."""
    res = CliRunner().invoke(cli, ["exec", "--nodes", "node2", "--", "ls", "--node", "x"])
    assert "exec has no option" not in res.output


@pytest.mark.parametrize("kind", ["missing", "directory", "unreadable"])
def test_ssh_config_that_cannot_be_read_is_named(tmp_path: Path, kind: str) -> None:
    """ssh.config naming a file that cannot be read: a ConnectError naming the file and the key
    (it marked every node down without naming it)."""
    config = tmp_path / "cfg"
    if kind == "directory":
        config.mkdir()
    elif kind == "unreadable":
        config.write_text("Host *\n")
        config.chmod(0)
        if os.access(config, os.R_OK):  # root reads anything: a path no one can open instead
            (tmp_path / "a-file").write_text("")
            config = tmp_path / "a-file" / "cfg"  # ENOTDIR, for root too
    known = tmp_path / "known_hosts"
    known.write_text("")
    ssh = SSHSettings(config=str(config), known_hosts=str(known))
    with pytest.raises(ConnectError) as err:
        client_options(ssh, 22, None, name="node1")
    assert str(config) in err.value.message and "ssh.config" in err.value.message


def test_status_says_the_recipe_differs_from_the_engine() -> None:
    """An edit nobody restarted for: the recipe says 48, the engine runs 32; status is not
    "serving" and says why."""
    data = {
        "nodes": [{"name": "node1", "up": True}],
        "engine": {"up": True, "health": True},
        "recipe": {"knobs": {"max_num_seqs": 48}, "same_on_all_nodes": True},
        "budget": {"used": 0, "allowed": 2},
        "runs": {},
    }
    recipe_vs_engine(data, {"max_num_seqs": 32}, "node1")
    said = verdict(data)
    assert said["state"] != "serving"
    assert any("the recipe differs from the running engine" in r for r in said["reasons"]), said
    same = {**data, "recipe": {"knobs": {"max_num_seqs": 32}, "same_on_all_nodes": True}}
    recipe_vs_engine(same, {"max_num_seqs": 32}, "node1")
    assert "differs_from_engine" not in same["recipe"]
