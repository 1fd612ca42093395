"""The real sparkrun (PyPI, in its own Python 3.12 venv) on the test ground, always offline.

sparkrun's loader is run as a subprocess of its venv's Python with HOME in a temp dir (no
user config, no registries), its plugin reconciliation and telemetry off, the Hub offline,
and — where the machine allows it (root) — inside a new network namespace with no interface
up but loopback, so that nothing it does can reach the network.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

from . import GroundUnavailable

VENV = Path(os.environ.get("SPARK_SPARKRUN_VENV", "/opt/spark-ops-sparkrun"))
ORACLE = Path(__file__).with_name("sparkrun_oracle.py")
#: sparkrun's own switches that keep it from installing plugins, phoning home or the Hub.
OFFLINE_ENV = {
    "SPARKRUN_NO_DEFAULT_PLUGINS": "1",
    "SPARKRUN_NO_EXTERNAL_PLUGINS": "1",
    "SPARKRUN_NO_TELEMETRY": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "DO_NOT_TRACK": "1",
}


def sparkrun_bin() -> Path:
    """The sparkrun CLI of the venv; GroundUnavailable when .ci/install-sparkrun.sh has not run."""
    path = VENV / "bin" / "sparkrun"
    if not path.is_file():
        raise GroundUnavailable(f"sparkrun not installed at {path} (run .ci/install-sparkrun.sh)")
    return path


def offline_env(home: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for a sparkrun process: a private HOME, offline switches, no proxies."""
    env = {
        "HOME": str(home),
        "PATH": f"{VENV / 'bin'}:/usr/local/bin:/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "XDG_CONFIG_HOME": str(home / ".config"),
        "XDG_CACHE_HOME": str(home / ".cache"),
        "XDG_STATE_HOME": str(home / ".local" / "state"),
        "XDG_DATA_HOME": str(home / ".local" / "share"),
        **OFFLINE_ENV,
    }
    env.update(extra or {})
    return env


def no_network_prefix(loopback: bool = False) -> list[str]:
    """`unshare -n` (a new network namespace: nothing but loopback, which `loopback` brings
    up) when this process may create one, else nothing."""
    unshare = shutil.which("unshare")
    if unshare and os.geteuid() == 0:
        probe = subprocess.run([unshare, "-n", "true"], capture_output=True, check=False)
        if probe.returncode == 0:
            if loopback:
                return [unshare, "-n", "sh", "-c", 'ip link set lo up && exec "$@"', "sh"]
            return [unshare, "-n"]
    return []


def prepare_home(home: Path) -> Path:
    """A private sparkrun home: no recipe registries (sparkrun would clone its defaults)."""
    config = home / ".config" / "sparkrun"
    config.mkdir(parents=True, exist_ok=True)
    registries = config / "registries.yaml"
    if not registries.exists():
        registries.write_text("registries: []\n", encoding="utf-8")
    return home


def run_sparkrun(
    args: Sequence[str],
    home: Path,
    *,
    timeout: float = 300,
    extra_env: dict[str, str] | None = None,
    isolate: bool = True,
) -> subprocess.CompletedProcess[str]:
    """The real sparkrun CLI, offline (no registries, no Hub, no plugins, no telemetry), in a
    network namespace of its own unless `isolate` is false: to reach the embedded nodes, which
    listen on this namespace's loopback, it then relies on those switches alone."""
    prepare_home(home)
    env = offline_env(home, extra_env)
    prefix = no_network_prefix(loopback=True) if isolate else []
    return subprocess.run(
        [*prefix, str(sparkrun_bin()), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
        check=False,
    )


def run_oracle(paths: Sequence[Path], home: Path) -> list[dict[str, object]]:
    """sparkrun's loader on each file (one process): its serve command, runtime, env."""
    python = VENV / "bin" / "python"
    sparkrun_bin()
    home.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(
        [*no_network_prefix(), str(python), "-I", str(ORACLE), *map(str, paths)],
        capture_output=True,
        text=True,
        env=offline_env(home),
        timeout=600,
        check=False,
    )
    if proc.returncode != 0:
        raise AssertionError(f"sparkrun oracle failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return list(json.loads(proc.stdout.strip().splitlines()[-1]))


def flag_maps(home: Path) -> dict[str, object]:
    """sparkrun's own vLLM / SGLang flag maps, read from the installed package."""
    python = VENV / "bin" / "python"
    sparkrun_bin()
    home.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(
        [*no_network_prefix(), str(python), "-I", str(ORACLE), "--flag-maps"],
        capture_output=True,
        text=True,
        env=offline_env(home),
        timeout=120,
        check=True,
    )
    return dict(json.loads(proc.stdout))


def bash_words(command: str) -> list[str]:
    """The words bash makes of the first command of `command` (no globbing; run, not evaluated
    beyond word splitting and quote removal: the command is a function's argument list)."""
    script = 'args() { printf "%s\\0" "$@"; }\nargs ' + command
    proc = subprocess.run(
        ["bash", "--norc", "--noprofile", "-f", "-c", script],
        capture_output=True,
        env={"PATH": "/usr/bin:/bin"},
        timeout=30,
        check=True,
    )
    return proc.stdout.decode("utf-8").split("\0")[:-1]
