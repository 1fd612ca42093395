"""The programs doctor runs on the head and the nodes: what exists, what is writable, what runs."""

from __future__ import annotations

from spark_ops.remote.program import RemoteProgram, path, result, text
from spark_ops.remote.programs.lock import LOCK_FREE_SH

# $1 history file, $2 lock file. Prints key=value lines; changes nothing (the lock is probed by
# the one lock probe, LOCK_FREE_SH, on a read-only descriptor, and only when it exists; a missing
# lock file only needs a writable directory to be created in).
WRITABLE_SH = (
    LOCK_FREE_SH
    + r"""
h=$1; l=$2
hd=$(dirname -- "$h"); ld=$(dirname -- "$l")
if [ -e "$h" ]; then
  if [ -f "$h" ] && [ -w "$h" ]; then echo "file=writable"; else echo "file=not-writable"; fi
else echo "file=absent"; fi
if [ -d "$hd" ]; then
  if [ -w "$hd" ]; then echo "dir=writable"; else echo "dir=not-writable"; fi
elif [ -e "$hd" ]; then echo "dir=not-a-directory"; else echo "dir=absent"; fi
command -v flock >/dev/null 2>&1 || { echo "lock=no-flock"; exit 0; }
if [ -e "$l" ]; then
  if [ ! -r "$l" ]; then echo "lock=unreadable"
  elif lock_free "$l"; then echo "lock=free"; else echo "lock=held"; fi
  if [ -w "$l" ]; then echo "lockfile=writable"; else echo "lockfile=not-writable"; fi
elif [ -d "$ld" ] && [ -w "$ld" ]; then echo "lock=absent-creatable"
else echo "lock=absent-not-creatable"; fi
"""
)


# $1 a directory that must exist or be creatable and writable (the state dir: cluster lock, audit
# log).
STATE_DIR_SH = r"""
d=$1
while [ ! -e "$d" ]; do d=$(dirname -- "$d"); done
if [ -d "$d" ] && [ -w "$d" ]; then echo "ok $d"; else echo "no $d"; fi
"""


# $1 the watchdog's python: "missing NAME" for each tool not on PATH
TOOLS_SH = (
    'for t in flock "$1" sha256sum mktemp; do command -v "$t" >/dev/null 2>&1 '
    '|| echo "missing $t"; done'
)

# $1 a program, $2 (optional) the directory a `cd DIR &&` runs it from: where it is found
FIND_COMMAND_SH = '[ -z "${2:-}" ] || cd "$2" || exit 1\ncommand -v "$1"'

WRITABLE = RemoteProgram("history writable", WRITABLE_SH, (path("history"), path("lock")), result)
STATE_DIR = RemoteProgram("state dir usable", STATE_DIR_SH, (path("directory"),), result)
TOOLS = RemoteProgram("tools present", TOOLS_SH, (text("python"),), result)
FIND_COMMAND = RemoteProgram(
    "find command", FIND_COMMAND_SH, (path("program"), path("directory", optional=True)), result
)
LOG_FILE_READABLE = RemoteProgram("log file readable", 'test -r "$1"', (path("file"),), result)
CONTAINER_STATUS = RemoteProgram(
    "container status",
    'docker inspect --format "{{.State.Status}}" "$1"',
    (text("container"),),
    result,
)
UNIT_EXISTS = RemoteProgram("unit exists", 'systemctl cat "$1" >/dev/null', (text("unit"),), result)
