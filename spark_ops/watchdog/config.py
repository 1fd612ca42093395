"""The reference watchdog's config format: a YAML file, every key checked, errors name the key.

Read by both sides of the contract: the reference watchdog (refwatchdog/) runs by it, and spark-ops
reads the head's copy to check the inventory against it (the contract: history, lock, pause, the
budget it enforces) and to fill the inventory (`init`). `config_of_commands` finds which file an
inventory's restart or status command hands `spark-watchdog`.
"""

from __future__ import annotations

import math
import os
import re
import reprlib
import shlex
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from spark_ops.errors import WatchdogError, excerpt
from spark_ops.files import NotRegularFile, read_regular
from spark_ops.watchdog.history import MAX_RESTARTS, MAX_WINDOW_S, default_journal, default_lock
from spark_ops.yamlsafe import MAX_YAML_BYTES, load_yaml

DEFAULT_CONFIG = "/etc/spark-watchdog/config.yaml"
USER_CONFIG = "~/.config/spark-watchdog.yaml"  # where init and doctor look on the head
DEFAULT_STATE_DIR = "/var/lib/spark-watchdog"
ACTION_KINDS = ("recipe", "launcher", "systemd", "docker", "command", "sparkrun")
PROBE_ENDPOINTS = ("completions", "chat")
HISTORY_FORMATS = ("auto", "stamps", "jsonl")


class WatchdogConfigError(WatchdogError):
    """The watchdog's configuration file is missing or has a key with a value not allowed."""


@dataclass(frozen=True)
class EngineConfig:
    """Where the engine's OpenAI-compatible API answers."""

    base_url: str = "http://127.0.0.1:8000"
    model: str | None = None  # None: ask /v1/models
    api_key: str | None = None


@dataclass(frozen=True)
class ProbeConfig:
    """How and how often the engine is probed with a tiny real completion."""

    interval: float = 120.0
    timeout: float = 30.0
    failures: int = 3
    grace: float = 1800.0
    endpoint: str = "completions"
    prompt: str = "Say OK."
    max_tokens: int = 5


@dataclass(frozen=True)
class BudgetConfig:
    """At most ``max`` automatic restarts in any ``window`` seconds."""

    max: int = 2
    window: float = 21600.0


@dataclass(frozen=True)
class PathsConfig:
    """The files the watchdog reads and writes (absolute after loading)."""

    dir: str = DEFAULT_STATE_DIR
    history: str = ""
    format: str = "auto"
    journal: str = ""
    lock: str = ""
    lock_timeout: float = 10.0
    pause: str = ""
    gave_up: str = ""
    pid: str = ""
    engine_log: str = ""
    state: str = ""


@dataclass(frozen=True)
class ActionConfig:
    """How the engine is restarted; which keys matter depends on ``kind``."""

    kind: str = "recipe"
    timeout: float = 600.0
    stop_timeout: float = 60.0
    recipe: str | None = None
    workdir: str | None = None
    unit: str | None = None
    container: str | None = None
    stop: list[str] | None = None
    start: list[str] | None = None
    detach: bool = False
    cluster: str | None = None  # sparkrun: the saved cluster (sparkrun cluster create NAME)
    sparkrun: list[str] | None = None  # sparkrun: its CLI, a path or argv (default: `sparkrun`)
    run_options: list[str] | None = None  # sparkrun: more `sparkrun run` options


@dataclass(frozen=True)
class WatchdogConfig:
    """The whole configuration, with the file it came from."""

    source: str
    engine: EngineConfig = field(default_factory=EngineConfig)
    probe: ProbeConfig = field(default_factory=ProbeConfig)
    budget: BudgetConfig = field(default_factory=BudgetConfig)
    paths: PathsConfig = field(default_factory=PathsConfig)
    action: ActionConfig = field(default_factory=ActionConfig)

    def to_dict(self) -> dict[str, Any]:
        """Serialize (the api key is masked)."""
        data = asdict(self)
        if data["engine"]["api_key"]:
            data["engine"]["api_key"] = "***"
        return data


class _Reader:
    """Validates one section of the YAML mapping, naming file and key in every error."""

    def __init__(self, source: str, name: str, data: Any, allowed: tuple[str, ...]) -> None:
        """Check that the section is a mapping with only allowed keys."""
        self.source, self.name = source, name
        if data is None:
            data = {}
        if not isinstance(data, dict):
            self.fail("", data, "a mapping")
        unknown = sorted(str(k) for k in data if k not in allowed)
        if unknown:
            raise WatchdogConfigError(
                f"{source}: unknown key {name}.{unknown[0]}; "
                f"allowed in {name}: {', '.join(allowed)}"
            )
        self.data: dict[str, Any] = data

    def fail(self, key: str, value: Any, allowed: str) -> None:
        """Raise an error naming the file, the key, the value and what is allowed."""
        where = f"{self.name}.{key}" if key else self.name
        raise WatchdogConfigError(
            f"{self.source}: {where} = {_shown(value)} is not allowed; expected {allowed}"
        )

    def number(
        self,
        key: str,
        default: float,
        *,
        minimum: float,
        strict: bool = False,
        maximum: float = math.inf,
    ) -> float:
        """Read a finite number >= minimum (> minimum when strict), <= maximum."""
        value = self.data.get(key, default)
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        ok = ok and math.isfinite(value) and (value > minimum if strict else value >= minimum)
        if not ok or value > maximum:
            most = f" and <= {maximum:g}" if math.isfinite(maximum) else ""
            self.fail(key, value, f"a number {'>' if strict else '>='} {minimum:g}{most}")
        return float(value)

    def integer(self, key: str, default: int, *, minimum: int, maximum: int | None = None) -> int:
        """Read an integer >= minimum (<= maximum when given)."""
        value = self.data.get(key, default)
        bad = isinstance(value, bool) or not isinstance(value, int) or value < minimum
        if bad or (maximum is not None and value > maximum):
            most = f" and <= {maximum}" if maximum is not None else ""
            self.fail(key, value, f"an integer >= {minimum}{most}")
        return int(value)

    def text(self, key: str, default: str | None, *, choices: tuple[str, ...] = ()) -> str | None:
        """Read an optional non-empty string, restricted to choices when given."""
        value = self.data.get(key, default)
        if value is None:
            return None
        if not isinstance(value, str) or not value.strip():
            self.fail(key, value, "a non-empty string")
        if choices and value not in choices:
            self.fail(key, value, f"one of {', '.join(choices)}")
        return str(value)

    def flag(self, key: str, default: bool) -> bool:
        """Read a boolean."""
        value = self.data.get(key, default)
        if not isinstance(value, bool):
            self.fail(key, value, "true or false")
        return bool(value)

    def words(self, key: str) -> list[str] | None:
        """Read a list of strings (command-line arguments, passed as they are)."""
        value = self.data.get(key)
        if value is None:
            return None
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return list(value)
        self.fail(key, value, "a list of strings (arguments)")
        return None

    def command(self, key: str) -> list[str] | None:
        """Read a command: a string (run by /bin/sh -c) or a non-empty list of strings (argv)."""
        value = self.data.get(key)
        if value is None:
            return None
        if isinstance(value, str) and value.strip():
            return ["/bin/sh", "-c", value]
        if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
            return list(value)
        self.fail(key, value, "a shell command string or a non-empty list of strings")
        return None


def _shown(value: object) -> str:
    """A value in an error: its repr a few levels and items deep (a list nested thousands of
    levels, or an integer of thousands of digits, is never written out whole)."""
    try:
        return reprlib.repr(value)
    except ValueError:  # an integer past Python's 4,300 digits, inside a list
        return excerpt(value)


def _sparkrun_cli(a: _Reader) -> list[str]:
    """action.sparkrun: one path, or a list (a prefix such as `unshare -n` and the path)."""
    if isinstance(a.data.get("sparkrun"), list):
        return a.words("sparkrun") or ["sparkrun"]
    return [a.text("sparkrun", None) or "sparkrun"]


def _resolve(base: Path, value: str | None, default: str) -> str:
    """Make a path absolute against base, using default when value is None."""
    return str((base / (value if value is not None else default)).resolve())


SEPARATORS = frozenset({";", "&&", "||", "|", "&", "(", ")", ";;", "|&"})
_HOME_PREFIX = re.compile(r"^[$](HOME|[{]HOME[}])/")  # $HOME/, braced or not: the home


SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ksh"})


def simple_commands(command: str) -> list[list[str]]:
    """The words of each simple command in a shell line (split at ; && || | & and newlines, a
    backslash-newline joined, a word starting with # ending what is read), quotes removed as the
    shell removes them; the line a `sh -c '…'` runs is split too. An unbalanced line is split
    on blanks."""
    line = command.replace("\\\n", "").replace("\n", " ; ")
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    lexer.commenters = ""  # `#` only where a word starts: handled below, as the shell does
    try:
        words = list(lexer)
    except ValueError:
        words = line.split()
    out: list[list[str]] = [[]]
    for w in words:
        if w.startswith("#"):
            break
        if w in SEPARATORS:
            out.append([])
        else:
            out[-1].append(w)
    nested = [
        inner
        for c in out
        for i, w in enumerate(c[:-1])
        if w == "-c" and any(x.rsplit("/", 1)[-1] in SHELLS for x in c[:i])
        for inner in simple_commands(c[i + 1])
    ]
    return [c for c in out if c] + nested


def runs_reference_watchdog(command: str) -> bool:
    """True when a command line runs the reference `spark-watchdog` (by any path)."""
    return any(_is_reference(c) for c in simple_commands(command))


def _is_reference(words: list[str]) -> bool:
    """True when a simple command runs `spark-watchdog` (after sudo, env, nice… by any path)."""
    return any(w.rsplit("/", 1)[-1] == "spark-watchdog" for w in words)


def config_argument(command: str) -> str | None:
    """The FILE of `--config FILE` / `--config=FILE` in a watchdog command line, if any: in the
    simple command that runs spark-watchdog (else the first), the last one (click's rule), a
    leading `$HOME/` or `${HOME}/` read as `~/` (the reference watchdog expands `~` itself)."""
    commands = simple_commands(command)
    chosen = next((c for c in commands if _is_reference(c)), commands[0] if commands else [])
    found = None
    for i, w in enumerate(chosen):
        if w == "--config" and i + 1 < len(chosen):
            found = chosen[i + 1]
        elif w.startswith("--config="):
            found = w.split("=", 1)[1]
    return None if found is None else _HOME_PREFIX.sub("~/", found, count=1)


def config_of_commands(restart_command: str, status_command: str | None) -> str | None:
    """The config file of the watchdog these commands run (the one rule spark-ops has): their
    `--config FILE`, else the reference watchdog's default when they run `spark-watchdog`, else
    None (another watchdog, whose config spark-ops cannot know)."""
    named = config_argument(restart_command) or config_argument(status_command or "")
    if named is not None:
        return named
    if runs_reference_watchdog(restart_command) or runs_reference_watchdog(status_command or ""):
        return DEFAULT_CONFIG
    return None


def load_config(path: str | os.PathLike[str]) -> WatchdogConfig:
    """Load and validate the YAML configuration at path."""
    source = os.path.expanduser(str(path))  # `--config=~/x` and '~/x' reach us unexpanded
    try:
        raw = read_regular(source, limit=MAX_YAML_BYTES)
    except NotRegularFile:
        raise WatchdogConfigError(f"{source}: cannot read the config: not a regular file") from None
    except OSError as exc:
        raise WatchdogConfigError(f"{source}: cannot read the config: {exc.strerror}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise WatchdogConfigError(f"{source}: cannot read the config: not UTF-8") from None
    data = load_yaml(text, source=source, error=WatchdogConfigError)
    return parse_config(data, source=source)


def parse_config(data: Any, *, source: str = "<config>") -> WatchdogConfig:
    """Validate a configuration mapping (as loaded from YAML)."""
    top = _Reader(source, "config", data, ("engine", "probe", "budget", "paths", "action"))

    e = _Reader(source, "engine", top.data.get("engine"), ("base_url", "model", "api_key"))
    base_url = e.text("base_url", EngineConfig.base_url) or EngineConfig.base_url
    if not base_url.startswith(("http://", "https://")):
        e.fail("base_url", base_url, "an http:// or https:// URL")
    engine = EngineConfig(
        base_url=base_url.rstrip("/"), model=e.text("model", None), api_key=e.text("api_key", None)
    )

    p = _Reader(
        source,
        "probe",
        top.data.get("probe"),
        ("interval", "timeout", "failures", "grace", "endpoint", "prompt", "max_tokens"),
    )
    d = ProbeConfig()
    probe = ProbeConfig(
        interval=p.number("interval", d.interval, minimum=0, strict=True),
        timeout=p.number("timeout", d.timeout, minimum=0, strict=True),
        failures=p.integer("failures", d.failures, minimum=1),
        grace=p.number("grace", d.grace, minimum=0),
        endpoint=p.text("endpoint", d.endpoint, choices=PROBE_ENDPOINTS) or d.endpoint,
        prompt=p.text("prompt", d.prompt) or d.prompt,
        max_tokens=p.integer("max_tokens", d.max_tokens, minimum=1),
    )

    b = _Reader(source, "budget", top.data.get("budget"), ("max", "window"))
    budget = BudgetConfig(
        max=b.integer("max", BudgetConfig.max, minimum=1, maximum=MAX_RESTARTS),
        window=b.number("window", BudgetConfig.window, minimum=1, maximum=MAX_WINDOW_S),
    )

    paths_keys = tuple(PathsConfig.__dataclass_fields__)
    r = _Reader(source, "paths", top.data.get("paths"), paths_keys)
    config_dir = Path(source).parent if source != "<config>" else Path.cwd()
    base = Path(_resolve(config_dir, r.text("dir", None), DEFAULT_STATE_DIR))
    history = _resolve(base, r.text("history", None), "restart-history")
    paths = PathsConfig(
        dir=str(base),
        history=history,
        format=r.text("format", "auto", choices=HISTORY_FORMATS) or "auto",
        journal=_resolve(base, r.text("journal", None), default_journal(history)),
        lock=_resolve(base, r.text("lock", None), default_lock(history)),
        lock_timeout=r.number("lock_timeout", PathsConfig.lock_timeout, minimum=0),
        pause=_resolve(base, r.text("pause", None), "pause"),
        gave_up=_resolve(base, r.text("gave_up", None), "gave-up"),
        pid=_resolve(base, r.text("pid", None), "engine.pid"),
        engine_log=_resolve(base, r.text("engine_log", None), "engine.log"),
        state=_resolve(base, r.text("state", None), "state.json"),
    )

    action_keys = tuple(ActionConfig.__dataclass_fields__)
    a = _Reader(source, "action", top.data.get("action"), action_keys)
    kind = a.text("kind", "recipe", choices=ACTION_KINDS) or "recipe"
    workdir = a.text("workdir", None)
    recipe = a.text("recipe", None)
    action = ActionConfig(
        kind=kind,
        timeout=a.number("timeout", ActionConfig.timeout, minimum=0, strict=True),
        stop_timeout=a.number("stop_timeout", ActionConfig.stop_timeout, minimum=0),
        recipe=recipe,
        workdir=_resolve(config_dir, workdir, ".") if workdir else None,
        unit=a.text("unit", None),
        container=a.text("container", None),
        stop=a.command("stop"),
        start=a.command("start"),
        detach=a.flag("detach", False),
        cluster=a.text("cluster", None),
        sparkrun=_sparkrun_cli(a) if kind == "sparkrun" else None,
        run_options=a.words("run_options"),
    )
    needs = {
        "recipe": ("recipe",),
        "launcher": ("workdir", "recipe"),
        "systemd": ("unit",),
        "docker": ("container",),
        "command": ("start",),
        "sparkrun": ("recipe", "cluster"),
    }[kind]
    for key in needs:
        if getattr(action, key) is None:
            raise WatchdogConfigError(
                f"{source}: action.{key} is required when action.kind is {kind}"
            )
    if kind in ("recipe", "sparkrun") and recipe:
        action = ActionConfig(**{**asdict(action), "recipe": _resolve(config_dir, recipe, "")})
    return WatchdogConfig(
        source=source, engine=engine, probe=probe, budget=budget, paths=paths, action=action
    )
