"""The programs run on the head for the watchdog's stamp contract: history.py, sent on stdin."""

from __future__ import annotations

from spark_ops.remote.program import RemoteProgram, integer, path, result, text

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

# Restart policies read as watchdogs (watchdog/policy.py parses what they print).
# $1 a systemd unit: the settings that bear on restarts, as `systemctl show` prints them
UNIT_RESTART_POLICY = RemoteProgram(
    "unit restart policy",
    "systemctl show -p LoadState -p Restart -p RestartUSec -p StartLimitIntervalUSec "
    '-p StartLimitBurst -p NRestarts -- "$1"',
    (text("unit"),),
    result,
    deadline=15,
)
# $1 a container: `docker inspect` (its HostConfig.RestartPolicy and RestartCount)
CONTAINER_RESTART_POLICY = RemoteProgram(
    "container restart policy", 'docker inspect -- "$1"', (text("container"),), result, deadline=15
)

# Loop-only watchdogs (watchdog/loop.py): the processes of the head, one `PID ARGS` a line
PROCESSES = RemoteProgram("processes", "ps -eo pid=,args= 2>/dev/null", (), result, deadline=15)
# $1 a pid: its environment, one VAR=value a line (the user's own processes only)
PROCESS_ENV = RemoteProgram(
    "process environment",
    'case $1 in *[!0-9]*|"") exit 2 ;; esac; tr "\\000" "\\n" < "/proc/$1/environ"',
    (integer("pid"),),
    result,
    deadline=15,
)
# $1 a file: the type of the file system of its directory (tmpfs: gone at a reboot)
FILE_SYSTEM = RemoteProgram(
    "file system type",
    'd=$(dirname -- "$1") && stat -f -c %T -- "$d"',
    (path("file"),),
    result,
    deadline=15,
)
# $1 a pause file, $2 what to write in it: created only when absent (noclobber), so a pause an
# operator set is never overwritten; exit 0 when this call created it
PAUSE_TAKE = RemoteProgram(
    "pause take",
    'set -C; { printf "%s\\n" "$2" > "$1"; } 2>/dev/null',
    (path("pause"), text("content")),
    result,
    deadline=15,
)
# $1 a pause file, $2 what PAUSE_TAKE wrote: removed only while it still holds exactly that
PAUSE_END = RemoteProgram(
    "pause end",
    '[ "$(cat -- "$1" 2>/dev/null)" = "$2" ] && rm -f -- "$1"',
    (path("pause"), text("content")),
    result,
    deadline=15,
)
