"""The programs run on the head for the watchdog's stamp contract: history.py, sent on stdin."""

from __future__ import annotations

from spark_ops.remote.program import RemoteProgram, path, result, text

# $1 the head's python, then history.py's subcommand and its arguments (paths: `~/` is the home);
# the script itself arrives on stdin. One JSON answer on the last line of stdout. `-I` (isolated):
# the working directory (the SSH user's home) is not on the import path, nor PYTHONPATH nor the
# user's site-packages, so a stray ~/json.py or ~/socket.py never runs as history.py's import;
# history.py needs the standard library alone.
HISTORY_PY = RemoteProgram(
    "history.py",
    'py=$1; shift; exec "$py" -I - "$@"',
    (text("python"), path("arguments", many=True)),
    result,
)
