"""The programs `spark-ops init` runs on the nodes to find the recipe, the watchdog and the engine
log (all read-only), and the sparkrun command lines it writes into an inventory."""

from __future__ import annotations

from spark_ops.remote.program import RemoteProgram, path, result, succeeded, text
from spark_ops.remote.quoting import quote_word

# $1 a test(1) operator (-f, -d, -e …), $2 a path: exit 0 when the test holds
TEST_PATH = RemoteProgram(
    "test path", 'test "$1" "$2"', (text("operator"), path("path")), succeeded
)

# $@ directories: the recipe-like YAML files under each one that exists (at most 100)
FIND_RECIPES = RemoteProgram(
    "find recipes",
    'for d in "$@"; do [ -d "$d" ] && find "$d" -maxdepth 3 -type f '
    "\\( -name '*.yaml' -o -name '*.yml' \\) 2>/dev/null; done | sort | head -n 100",
    (path("directories", many=True),),
    result,
)

# $1 a watchdog script: exit 0 when it mentions --restart-now
HAS_RESTART_NOW = RemoteProgram(
    "has --restart-now", "grep -q -e '--restart-now' -- \"$1\"", (path("script"),), succeeded
)

# $@ glob patterns (a leading ~/ is the home; a pattern is expanded by the shell, never run): the
# regular files they match
FIND_FILES = RemoteProgram(
    "find files",
    r"""
IFS=
for g in "$@"; do
  case $g in "~/"*) g=$HOME/${g#??} ;; esac
  for f in $g; do [ -f "$f" ] && echo "$f"; done
done
exit 0
""",
    (text("patterns", many=True),),
    result,
)

# Prints the log of the running sparkrun head (or solo) container, then of each one that replaces
# it: sparkrun names containers per launch, and its serve process writes to
# /tmp/sparkrun_serve.log inside the container (PID 1 is `sleep infinity` or `ray start --block`,
# so `docker logs` never shows the engine). Written into the inventory as engine.log's command.
SPARKRUN_HEAD_LOG_SH = (
    "seen=; while :; do "
    'c=$(docker ps --no-trunc --filter name=^sparkrun_ --format "{{.ID}} {{.Names}}" '
    '| grep -E "_(solo|head|node_0)$" | head -n 1 | cut -d " " -f 1); '
    'if [ -n "$c" ] && [ "$c" != "$seen" ]; then seen=$c; '
    'docker exec "$c" tail -n +1 -F /tmp/sparkrun_serve.log 2>/dev/null; fi; sleep 1; done'
)
SPARKRUN_HEAD_LOG_COMMAND = "sh -c " + quote_word(SPARKRUN_HEAD_LOG_SH)


def sparkrun_restart_command(recipe: str, cluster: str) -> str:
    """sparkrun's own restart, `sparkrun run RECIPE --cluster NAME --no-follow`, values quoted."""
    return f"sparkrun run {quote_word(recipe)} --cluster {quote_word(cluster)} --no-follow"


# Whether the reference watchdog is on PATH (where)
WATCHDOG_ON_PATH = RemoteProgram("spark-watchdog on PATH", "command -v spark-watchdog", (), result)

# The running containers' names, one a line
DOCKER_NAMES = RemoteProgram(
    "container names", "docker ps --format '{{.Names}}' 2>/dev/null", (), result
)

# The systemd units named vllm*, one a line
VLLM_UNITS = RemoteProgram(
    "vllm units",
    "systemctl list-units --type=service --all --no-legend --plain 'vllm*' 2>/dev/null",
    (),
    result,
)

# $1 a worker check (a command, run by sh), $2 the name of the embedded cluster's raylet-port
# variable, $3 the embedded cluster's rank check: "sim-rank" when the rank check passes,
# "raylet" when the worker check does, "sim" when the variable is set, else "none"
WORKER_KIND = RemoteProgram(
    "worker kind",
    'if sh -c "$3"; then echo sim-rank; elif sh -c "$1"; then echo raylet; '
    'elif [ -n "$(printenv -- "$2")" ]; then echo sim; else echo none; fi',
    (text("check"), text("variable"), text("rank check")),
    result,
)
