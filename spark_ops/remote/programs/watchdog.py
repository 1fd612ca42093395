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
# The maintenance lease (watchdog/lease.py): a pause file made by spark-ops. $1 the pause file,
# $2 how long it lasts (s); stdin: the rest of the lease's JSON object (after its `{`), which
# this program opens with the expiry in the head's own clock. The file is made beside its name
# and linked into place (link(2) makes it, or fails when the name exists, a symlink too: never
# written through a link, never over an operator's pause). Exit 0: the content made, on stdout;
# 46: a pause file is there (its first 4 KiB on stdout); 66: the directory is missing or the
# file cannot be made (stderr says why).
LEASE_TAKE_SH = r"""
p=$1; ttl=$2
case $p in */*) d=${p%/*}; [ -n "$d" ] || d=/ ;; *) d=. ;; esac
shown() { if [ -f "$p" ] && [ ! -L "$p" ]; then head -c 4096 -- "$p"; fi; exit 46; }
[ -d "$d" ] || { echo "directory $d does not exist" >&2; exit 66; }
if [ -e "$p" ] || [ -L "$p" ]; then shown; fi
now=$(date +%s) || exit 66
tmp=$(mktemp "$d/.spark-ops.lease.XXXXXX") || { echo "cannot create a file in $d" >&2; exit 66; }
trap 'rm -f -- "$tmp"' EXIT
chmod 644 -- "$tmp"
{ printf '{"expires": %s, "taken": %s, ' "$((now + ttl))" "$now" && cat; } > "$tmp" || {
  echo "cannot write $tmp" >&2; exit 66; }
sync -- "$tmp" 2>/dev/null || true
ln -- "$tmp" "$p" 2>/dev/null || shown
sync -- "$d" 2>/dev/null || true
cat -- "$tmp"
"""

# End a lease: remove the pause file $1 only when it is a regular file (not a link) whose sha256
# is $2 (the content this run, or a dead run, made). Never check-then-remove by name: whatever the
# name holds is first renamed (rename(2), atomic) to a private name in the same directory, the
# file renamed is compared, and what is not ours is linked back (link(2): never over a pause made
# meanwhile), so an operator's pause moved over ours at any moment is never removed. HUP, INT and
# TERM are ignored for the few milliseconds it runs (never stopped between the rename and the link
# back). Exit 0: removed; 44: no file; 45: another content (its first 4 KiB on stdout) or not a
# regular file: left as it is (or, when a third pause took the name meanwhile, kept under the
# private name stderr names); 66: it could not be moved aside or compared.
LEASE_END_SH = r"""
trap '' HUP INT TERM
p=$1; want=$2
case $p in */*) d=${p%/*}; [ -n "$d" ] || d=/ ;; *) d=. ;; esac
[ -e "$p" ] || [ -L "$p" ] || exit 44
if [ -L "$p" ] || [ ! -f "$p" ]; then echo "$p is not a regular file" >&2; exit 45; fi
tmp=$(mktemp "$d/.spark-ops.ending.XXXXXX") || { echo "cannot create a file in $d" >&2; exit 66; }
err=$(mv -f -T -- "$p" "$tmp" 2>&1) || {
  rm -f -- "$tmp"
  [ -e "$p" ] || [ -L "$p" ] || exit 44
  if [ -L "$p" ] || [ ! -f "$p" ]; then echo "$p is not a regular file" >&2; exit 45; fi
  echo "$p cannot be moved aside: $err" >&2; exit 66; }
back() {
  if ln -P -- "$tmp" "$p" 2>/dev/null; then rm -f -- "$tmp"; sync -- "$d" 2>/dev/null || true
  else echo "$p was replaced meanwhile; the pause moved aside is kept as $tmp" >&2; fi
}
if [ -L "$tmp" ] || [ ! -f "$tmp" ]; then echo "$p is not a regular file" >&2; back; exit 45; fi
h=$(sha256sum < "$tmp") || { back; exit 66; }
h=${h%% *}
[ "$h" = "$want" ] || { head -c 4096 -- "$tmp"; back; exit 45; }
rm -f -- "$tmp" || exit 66
sync -- "$d" 2>/dev/null || true
"""

LEASE_TAKE = RemoteProgram(
    "take the watchdog lease", LEASE_TAKE_SH, (path("pause file"), integer("seconds")), result
)
LEASE_END = RemoteProgram(
    "end the watchdog lease", LEASE_END_SH, (path("pause file"), text("sha256")), result
)

# The forced restart (watchdog/contract.py trigger). $1 the inventory's restart command (shell text,
# its placeholders filled and quoted), run by the login shell as a plain command would be, but
# detached: its own session (setsid) and its output in files, stdin /dev/null. A connection lost
# mid-restart (the operator's VPN, a killed spark-ops, a server that signals the session's group)
# then neither signals the restart nor breaks its output pipe (SIGPIPE, or `set -e` on a failed
# echo): the restart runs to its end instead of stopping the engine and never starting it. This
# program waits for it and gives back what it printed and its exit code; lost with the connection,
# its two output files stay in $TMPDIR (spark-ops-restart.*) for the operator to read. They stay
# too while a process the restart left still writes to them (an engine started in the background
# without redirecting its output), named on stderr: removed, it would write out of sight for ever.
# Where the files cannot be made or take 64 KiB (no $TMPDIR, a full disk), the command runs plainly
# as before: refused, the restart would not run; its writes failing, a `set -e` one would be torn.
DETACHED_RESTART_SH = r"""
cmd=$1; tmp=${TMPDIR:-/tmp}; o=; e=
room() { dd if=/dev/zero of="$1" bs=1024 count=64 2>/dev/null && : > "$1"; }
o=$(mktemp "$tmp/spark-ops-restart.XXXXXX" 2>/dev/null) && room "$o" \
  && e=$(mktemp "$tmp/spark-ops-restart.XXXXXX" 2>/dev/null) && room "$e" || {
  rm -f -- ${o:+"$o"} ${e:+"$e"}; exec "${SHELL:-/bin/sh}" -c "$cmd"  # no room: run it plainly
}
if command -v setsid >/dev/null 2>&1; then
  setsid "${SHELL:-/bin/sh}" -c "$cmd" > "$o" 2> "$e" < /dev/null &
else
  "${SHELL:-/bin/sh}" -c "$cmd" > "$o" 2> "$e" < /dev/null &
fi
wait "$!"; rc=$?
held() {  # a process has $1 open (the same file, whatever its name holds): no name compared
  for f in /proc/[0-9]*/fd/*; do [ "$f" -ef "$1" ] && return 0; done; return 1
}
if cat -- "$o" && cat -- "$e" >&2; then  # kept when it could not be sent
  if held "$o" || held "$e"; then echo "still written by a process the restart left: $o $e" >&2
  else rm -f -- "$o" "$e"; fi
fi
exit "$rc"
"""
DETACHED_RESTART = RemoteProgram("restart command", DETACHED_RESTART_SH, (text("command"),), result)
