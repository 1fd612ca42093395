"""Validation of the watchdog's YAML configuration: defaults, and errors that name the key."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from spark_ops.watchdog.config import (
    DEFAULT_CONFIG,
    WatchdogConfigError,
    config_of_commands,
    load_config,
    parse_config,
)

MINIMAL = {"action": {"kind": "command", "start": "true"}}


def test_defaults(tmp_path: Path) -> None:
    """Defaults follow the public watchdog: 120 s, 30 s, 3 failures, 1800 s grace, 2 per 6 h."""
    cfg = parse_config({**MINIMAL, "paths": {"dir": str(tmp_path)}})
    assert (cfg.probe.interval, cfg.probe.timeout, cfg.probe.failures, cfg.probe.grace) == (
        120.0,
        30.0,
        3,
        1800.0,
    )
    assert (cfg.budget.max, cfg.budget.window) == (2, 21600.0)
    assert cfg.probe.max_tokens == 5 and cfg.engine.model is None
    p = cfg.paths
    assert p.history == str(tmp_path / "restart-history")
    assert p.lock == p.history + ".lock" and p.journal == p.history + ".journal.jsonl"
    assert p.pause == str(tmp_path / "pause") and p.gave_up == str(tmp_path / "gave-up")
    assert cfg.action.start == ["/bin/sh", "-c", "true"]


def test_relative_paths_resolve_against_config_dir(tmp_path: Path) -> None:
    """paths.dir and the recipe resolve against the config file's directory."""
    conf = tmp_path / "w.yaml"
    conf.write_text(
        "paths: {dir: state, history: /var/lib/x/history, lock: /run/wd.lock}\n"
        "action: {kind: recipe, recipe: recipes/glm.yaml}\n"
    )
    cfg = load_config(conf)
    assert cfg.paths.dir == str(tmp_path / "state")
    assert cfg.paths.history == "/var/lib/x/history" and cfg.paths.lock == "/run/wd.lock"
    assert cfg.paths.journal == "/var/lib/x/history.journal.jsonl"
    assert cfg.action.recipe == str(tmp_path / "recipes" / "glm.yaml")


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        ({"probe": {"interval": 0}}, "probe.interval = 0 is not allowed; expected a number > 0"),
        ({"probe": {"failures": 1.5}}, "probe.failures = 1.5"),
        ({"probe": {"grace": -1}}, "probe.grace = -1"),
        ({"probe": {"timeout": True}}, "probe.timeout = True"),
        ({"probe": {"endpoint": "health"}}, "one of completions, chat"),
        ({"probe": {"intervall": 5}}, "unknown key probe.intervall; allowed in probe: interval"),
        ({"budget": {"max": -1}}, "budget.max = -1"),
        ({"budget": {"max": 0}}, "budget.max = 0 is not allowed; expected an integer >= 1 and <="),
        ({"budget": {"window": 1.0e300}}, "budget.window = 1e+300 is not allowed; expected a"),
        ({"budget": {"window": 2678401}}, "and <= 2.6784e+06"),
        (
            {"budget": {"window": 1e-9}},
            "budget.window = 1e-09 is not allowed; expected a number >= 1",
        ),
        ({"budget": {"window": "6h"}}, "budget.window = '6h'"),
        ({"engine": {"base_url": "localhost:8000"}}, "engine.base_url = 'localhost:8000'"),
        ({"paths": {"format": "csv"}}, "paths.format = 'csv'"),
        ({"paths": []}, "paths = [] is not allowed; expected a mapping"),
        ({"action": {"kind": "ssh"}}, "action.kind = 'ssh'"),
        ({"action": {"kind": "recipe"}}, "action.recipe is required when action.kind is recipe"),
        ({"action": {"kind": "launcher", "recipe": "x"}}, "action.workdir is required"),
        ({"action": {"kind": "systemd"}}, "action.unit is required"),
        ({"action": {"kind": "docker"}}, "action.container is required"),
        ({"action": {"kind": "command", "start": []}}, "action.start = []"),
        ({"action": {"kind": "command", "start": "x", "detach": "yes"}}, "action.detach"),
        ({"watchdog": {}}, "unknown key config.watchdog"),
    ],
)
def test_errors_name_the_key(data: dict, needle: str) -> None:
    """Each bad value is reported with file, key, value and what is allowed."""
    merged = {**MINIMAL, **data}
    with pytest.raises(WatchdogConfigError) as info:
        parse_config(merged, source="/etc/wd.yaml")
    assert needle in info.value.message and info.value.message.startswith("/etc/wd.yaml: ")


def test_unreadable_and_bad_yaml(tmp_path: Path) -> None:
    """A missing file and invalid YAML are errors naming the file."""
    with pytest.raises(WatchdogConfigError, match=r"nope\.yaml: cannot read"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("probe: [unclosed\n")
    with pytest.raises(WatchdogConfigError, match=r"bad\.yaml: not valid YAML"):
        load_config(bad)


def test_documented_example_loads_with_the_defaults() -> None:
    """The YAML example in docs/watchdog.md is valid and shows the real defaults."""
    import re

    import yaml

    doc = (Path(__file__).parents[1] / "docs" / "watchdog.md").read_text()
    match = re.search(r"```yaml\n(.*?)```", doc, re.S)
    assert match, "docs/watchdog.md lost its YAML example"
    cfg = parse_config(yaml.safe_load(match.group(1)), source="/etc/spark-watchdog/config.yaml")
    default = parse_config(
        {"action": {"kind": "recipe", "recipe": str(cfg.action.recipe)}},
        source="/etc/spark-watchdog/config.yaml",
    )
    assert cfg.probe == default.probe and cfg.budget == default.budget
    assert cfg.paths == default.paths and cfg.engine == default.engine


def test_one_rule_for_the_journal_and_lock_paths(tmp_path: Path) -> None:
    """The watchdog's config, spark-ops' inventory and history.py find the same journal and lock
    beside a history file; no other module than the journal's (headlib.history_journal, which
    history.py re-exports) spells those names."""
    from spark_ops.inventory import WatchdogSettings
    from spark_ops.watchdog import history

    cfg = parse_config({**MINIMAL, "paths": {"dir": str(tmp_path), "history": "h"}})
    wd = WatchdogSettings(restart_command="true", history_file=cfg.paths.history)
    assert cfg.paths.journal == wd.journal_path == history.default_journal(cfg.paths.history)
    assert cfg.paths.lock == wd.lock_path == history.default_lock(cfg.paths.history)
    own = WatchdogSettings("true", "h", lock_file="/x/l", journal_file="/x/j")
    assert (own.lock_path, own.journal_path) == ("/x/l", "/x/j")
    root = Path(__file__).resolve().parents[1] / "spark_ops"
    spelled = [
        str(p.relative_to(root.parent))
        for p in [*root.rglob("*.py"), *(root.parent / "refwatchdog").rglob("*.py")]
        if p != root / "headlib" / "history_journal.py" and '.journal.jsonl"' in p.read_text()
    ]
    assert spelled == []


@pytest.mark.parametrize(
    ("restart", "status", "config"),
    [
        ("spark-watchdog --config ~/w.yaml --restart-now --force", None, "~/w.yaml"),
        ("spark-watchdog --config=/etc/w.yaml --restart-now", None, "/etc/w.yaml"),
        ("/opt/bin/spark-watchdog --restart-now --force", None, DEFAULT_CONFIG),
        ("sudo spark-watchdog --restart-now", "spark-watchdog --status --json", DEFAULT_CONFIG),
        ("/usr/local/bin/my-watchdog.sh --now", None, None),
        ("my-watchdog --now", "spark-watchdog --config /srv/w.yaml --status", "/srv/w.yaml"),
        ("my-watchdog --now 'unclosed", None, None),
        ("spark-watchdog-wrapper --restart-now", None, None),
        ('spark-watchdog --config "$HOME/.config/w.yaml" --restart-now', None, "~/.config/w.yaml"),
        ("spark-watchdog --config ${HOME}/w.yaml", None, "~/w.yaml"),
        ("spark-watchdog --config ~/a.yaml --restart-now --config ~/b.yaml", None, "~/b.yaml"),
        ("cd ~/.config && spark-watchdog --config w.yaml", None, "w.yaml"),
        (
            "spark-watchdog --config ~/a.yaml --restart-now  # was: --config ~/b.yaml",
            None,
            "~/a.yaml",
        ),
        (
            "spark-watchdog --config ~/a.yaml --restart-now; echo --config ~/b.yaml",
            None,
            "~/a.yaml",
        ),
        ("echo --config ~/b.yaml && sudo spark-watchdog --config=~/a.yaml", None, "~/a.yaml"),
        ("my-watchdog --now # spark-watchdog", None, None),
        ("sh -c 'spark-watchdog --config ~/w.yaml --reason \"$0\"' {reason}", None, "~/w.yaml"),
        ("/bin/bash -c 'cd /tmp; spark-watchdog --config=/etc/w.yaml'", None, "/etc/w.yaml"),
        ("spark-watchdog --status --json \\\n--config ~/a.yaml", None, "~/a.yaml"),
        ("spark-watchdog --config /etc/a.yaml\nlogger --config /etc/l.conf", None, "/etc/a.yaml"),
        ("spark-watchdog --config /etc/wd#2.yaml", None, "/etc/wd#2.yaml"),
    ],
)
def test_one_rule_for_which_config_the_watchdog_reads(
    restart: str, status: str | None, config: str | None
) -> None:
    """The budget gate and doctor read the config config_of_commands names: the commands'
    `--config FILE`, else the reference watchdog's default when they run it, else none."""
    assert config_of_commands(restart, status) == config


def test_the_watchdog_expands_its_own_tilde(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--config=~/w.yaml` and a quoted '~/w.yaml' reach the watchdog unexpanded (no shell
    expands them): it expands `~` itself, so it reads the file spark-ops' gate reads."""
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "w.yaml").write_text(
        'budget: {max: 3, window: 600}\naction: {kind: command, start: "true"}\n'
    )
    assert load_config("~/w.yaml").budget.max == 3


def test_a_config_that_is_no_regular_file_is_refused_at_once(tmp_path: Path) -> None:
    """A FIFO or a directory given as the config is a WatchdogConfigError, never a wait."""
    os.mkfifo(tmp_path / "fifo.yaml")
    (tmp_path / "dir.yaml").mkdir()
    for name in ("fifo.yaml", "dir.yaml"):
        with pytest.raises(WatchdogConfigError, match="not a regular file"):
            load_config(tmp_path / name)
