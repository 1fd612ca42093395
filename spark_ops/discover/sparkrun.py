"""`init --from-sparkrun [NAME]`: the nodes, SSH settings and recipe from sparkrun's own files.

sparkrun keeps one YAML per cluster in ~/.config/sparkrun/clusters/<name>.yaml (name, hosts,
user, ...), the default cluster's name in clusters/.default, SSH settings in
~/.config/sparkrun/config.yaml (`ssh: {user, key, options}`), and one metadata file per
launched job in ~/.cache/sparkrun/jobs/ (cluster, recipe, hosts, port, tensor_parallel). The
engine runs in containers sparkrun names `sparkrun_<intent>_<token>_{solo,head,node_0,...}`;
its restart is `sparkrun run RECIPE --cluster NAME --no-follow` (a run replaces the job's
containers: stop, then start).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from spark_ops.discover.options import Finding, InitOptions, NodeSpec, name_nodes
from spark_ops.errors import InventoryError
from spark_ops.remote.programs.discover import SPARKRUN_HEAD_LOG_COMMAND, sparkrun_restart_command
from spark_ops.yamlsafe import load_yaml

_CLUSTER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
#: OpenSSH client options that take a value as the next word.
_SSH_VALUE_FLAGS = frozenset(
    {"-b", "-c", "-D", "-E", "-e", "-F", "-I", "-i", "-J", "-L", "-l", "-m", "-O", "-o", "-p"}
    | {"-Q", "-R", "-S", "-W", "-w"}
)

#: Follows the running sparkrun head container's serve log (remote/programs/discover.py).
HEAD_LOG_COMMAND = SPARKRUN_HEAD_LOG_COMMAND


@dataclass
class SparkrunSetup:
    """What sparkrun's files say about one cluster."""

    name: str
    nodes: list[NodeSpec]
    user: str | None = None
    identity: tuple[str, ...] = ()
    port: int | None = None
    known_hosts: str | None = None
    recipe: str | None = None
    api_port: int | None = None
    tensor_parallel: int | None = None
    model: str | None = None
    findings: list[Finding] = field(default_factory=list)
    ignored_options: list[str] = field(default_factory=list)


def _yaml(path: Path) -> dict[str, Any] | None:
    """A YAML mapping file, None when absent; InventoryError for anything unreadable."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise InventoryError(f"{path}: cannot read: {exc}") from exc
    data = load_yaml(text, source=str(path), error=InventoryError)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise InventoryError(f"{path}: must be a YAML mapping, got {type(data).__name__}")
    return data


def read_sparkrun(name: str | None, home: Path) -> SparkrunSetup:
    """Read cluster NAME (else sparkrun's default cluster) from sparkrun's files under home."""
    config_dir = home / ".config" / "sparkrun"
    clusters = config_dir / "clusters"
    findings: list[Finding] = []
    if not name:
        default = clusters / ".default"
        try:
            name = default.read_text(encoding="utf-8").strip()
        except OSError:
            name = ""
        if not name:
            raise InventoryError(
                f"--from-sparkrun: no cluster named and no default cluster in {default}",
                hint="give the name: spark-ops init --from-sparkrun NAME (sparkrun cluster list)",
            )
        findings.append(Finding("cluster", "found", name, f"sparkrun's default ({default})"))
    if not _CLUSTER_NAME.match(name):
        raise InventoryError(f"--from-sparkrun {name!r}: not a sparkrun cluster name")
    path = clusters / f"{name}.yaml"
    data = _yaml(path)
    if data is None:
        raise InventoryError(
            f"--from-sparkrun {name}: {path} does not exist",
            hint="create it with `sparkrun cluster create NAME -H h1,h2,...`",
        )
    hosts = data.get("hosts")
    if not isinstance(hosts, list) or not hosts or not all(isinstance(h, str) for h in hosts):
        raise InventoryError(f"{path}: key 'hosts' must be a non-empty list of host names")
    nodes = [NodeSpec("", h.strip()) for h in hosts]
    name_nodes(nodes)
    findings.append(Finding("nodes", "found", list(hosts), f"hosts of {path} (first = head)"))
    setup = SparkrunSetup(name, nodes, findings=findings)
    config = _yaml(config_dir / "config.yaml") or {}
    ssh = config.get("ssh") if isinstance(config.get("ssh"), dict) else {}
    assert isinstance(ssh, dict)
    user = data.get("user") or ssh.get("user")
    if user is not None:
        setup.user = str(user)
        where = path if data.get("user") else config_dir / "config.yaml"
        findings.append(Finding("ssh.user", "found", setup.user, f"from {where}"))
    if ssh.get("key"):
        setup.identity = (str(Path(str(ssh["key"])).expanduser()),)
        findings.append(Finding("ssh.identity", "found", setup.identity[0], "ssh.key of config"))
    _ssh_options(setup, ssh.get("options") or [], config_dir / "config.yaml")
    _job(setup, home / ".cache" / "sparkrun" / "jobs")
    return setup


def _ssh_options(setup: SparkrunSetup, options: object, source: Path) -> None:
    """Take the port from sparkrun's ssh options (-p N, -oPort=N); note the others."""
    if isinstance(options, str):
        options = shlex.split(options)
    if not isinstance(options, list):
        raise InventoryError(f"{source}: ssh.options must be a list of ssh arguments")
    words = [str(o) for o in options]
    i = 0
    while i < len(words):
        word, nxt = words[i], words[i + 1] if i + 1 < len(words) else None
        option = (
            nxt if word == "-o" and nxt is not None else word[2:] if word.startswith("-o") else None
        )
        key, value = _option_pair(option)
        port: str | None = None
        if word == "-p" and nxt is not None:
            port = nxt
        elif word.startswith("-p") and len(word) > 2:
            port = word[2:]
        elif word == "-i" and nxt is not None:
            setup.identity = (*setup.identity, str(Path(nxt).expanduser()))
        elif key == "port":
            port = value
        elif key == "userknownhostsfile" and value:
            setup.known_hosts = str(Path(value).expanduser())
        else:
            with_value = word in _SSH_VALUE_FLAGS and nxt is not None
            setup.ignored_options.append(f"{word} {nxt}" if with_value else word)
        if port is not None:
            if not port.isdigit() or not 0 < int(port) < 65536:
                raise InventoryError(f"{source}: ssh port {port!r} is not a port number")
            setup.port = int(port)
        takes_value = word in _SSH_VALUE_FLAGS and nxt is not None
        i += 2 if takes_value else 1
    if setup.port:
        setup.findings.append(Finding("ssh.port", "found", setup.port, f"ssh.options of {source}"))
    if setup.known_hosts:
        setup.findings.append(
            Finding("ssh.known_hosts", "found", setup.known_hosts, f"ssh.options of {source}")
        )
    if setup.ignored_options:
        setup.findings.append(
            Finding(
                "ssh.options",
                "warn",
                setup.ignored_options,
                f"{source}: ssh options spark-ops does not take over; check them by hand",
            )
        )


def _option_pair(option: str | None) -> tuple[str, str]:
    """An ssh `-o` option as (lowercase key, value): `Port=22`, `Port 22`."""
    if not option:
        return "", ""
    key, _, value = option.strip().partition("=")
    if not _:
        key, _, value = option.strip().partition(" ")
    return key.strip().lower(), value.strip()


def _job(setup: SparkrunSetup, jobs: Path) -> None:
    """The newest job sparkrun launched on this cluster: its recipe, port and parallelism."""
    best: tuple[float, dict[str, Any], Path] | None = None
    for path in sorted(jobs.glob("*.yaml")) if jobs.is_dir() else []:
        try:
            data = _yaml(path)
        except InventoryError:
            continue
        if not data or data.get("cluster") != setup.name:
            continue
        started = float(data.get("started_at") or 0)
        if best is None or started > best[0]:
            best = (started, data, path)
    if best is None:
        setup.findings.append(
            Finding(
                "recipe.path",
                "missing",
                None,
                f"no job of cluster {setup.name!r} in {jobs} (sparkrun records one per "
                "`sparkrun run`); give --recipe PATH",
            )
        )
        return
    _, data, path = best
    recipe = str(data.get("recipe_ref") or data.get("recipe") or "")
    if recipe.startswith("@") or "/" not in recipe:
        setup.findings.append(
            Finding(
                "recipe.path",
                "missing",
                recipe or None,
                f"{path}: the job runs registry recipe {recipe!r}; spark-ops edits a recipe "
                "file: export it (`sparkrun export`) and give --recipe PATH",
            )
        )
    else:
        setup.recipe = recipe
        setup.findings.append(Finding("recipe.path", "found", recipe, f"the job in {path}"))
    if isinstance(data.get("port"), int):
        setup.api_port = int(data["port"])
    if isinstance(data.get("tensor_parallel"), int):
        setup.tensor_parallel = int(data["tensor_parallel"])
    if data.get("model"):
        setup.model = str(data["model"])


def restart_command(setup: SparkrunSetup, recipe: str) -> str:
    """sparkrun's own restart: run the recipe on the cluster again (it replaces the job)."""
    return sparkrun_restart_command(recipe, setup.name)


def adopt_sparkrun(
    setup: SparkrunSetup, opts: InitOptions, values: dict[str, Any], findings: list[Finding]
) -> list[Finding]:
    """Fill what sparkrun decides: the engine log, API port, parallelism, and (without a
    watchdog on the head) sparkrun's own restart; the findings those replace are dropped."""
    filled: list[Finding] = []
    values["engine.log"] = {"kind": "command", "command": HEAD_LOG_COMMAND}
    filled.append(
        Finding("engine.log", "found", "sparkrun head container", "sparkrun_*_{solo,head,node_0}")
    )
    if setup.api_port:
        values["engine.api.url"] = f"http://127.0.0.1:{setup.api_port}"
    if setup.tensor_parallel:
        values["tensor_parallel"] = setup.tensor_parallel
    if setup.model and not values.get("engine.model"):
        values["engine.model"] = setup.model
    if "recipe.path" not in values and (opts.recipe or setup.recipe):
        values["recipe.path"] = opts.recipe or setup.recipe
        filled.append(
            Finding(
                "recipe.path",
                "found",
                values["recipe.path"],
                "the recipe of sparkrun's job (not checked on the head)",
            )
        )
    recipe = values.get("recipe.path")
    if "watchdog.restart_command" not in values and recipe:
        values["watchdog.restart_command"] = restart_command(setup, str(recipe))
        filled.append(
            Finding(
                "watchdog.restart_command",
                "found",
                values["watchdog.restart_command"],
                "sparkrun's own restart (a run replaces the job's containers)",
            )
        )
        if "watchdog.history_file" not in values:
            filled.append(
                Finding(
                    "watchdog.history_file",
                    "missing",
                    None,
                    "sparkrun keeps no restart history: run spark-ops' reference watchdog "
                    "with `action: {kind: sparkrun, ...}` (docs/sparkrun.md) and use its history",
                )
            )
    keys = {f.key for f in filled}
    kept = [f for f in findings if f.key not in keys or f.status == "warn"]
    return kept + filled
