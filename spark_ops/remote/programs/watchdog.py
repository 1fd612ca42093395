"""The programs run on the head for the watchdog's stamp contract: history.py, sent on stdin."""

from __future__ import annotations

from spark_ops.remote.program import RemoteProgram, path, result, text

# $1 the head's python, then history.py's subcommand and its arguments (paths: `~/` is the home);
# the script itself arrives on stdin. One JSON answer on the last line of stdout.
HISTORY_PY = RemoteProgram(
    "history.py",
    'py=$1; shift; exec "$py" - "$@"',
    (text("python"), path("arguments", many=True)),
    result,
)
