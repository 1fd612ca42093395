"""The programs of the head's shared state dir: the cluster lock (spark_ops/lock.py) and the audit
log (spark_ops/audit.py), both keyed by the watchdog's restart history."""

from __future__ import annotations

from spark_ops.remote.program import RemoteProgram, checked, integer, path, result, text

# The shell side of the key (spark_ops/lock.py's docstring says why it is the watchdog's
# history). The lock dir and the audit's state dir are made sticky and world-writable like /tmp,
# files 0666.
KEY_SH = r"""
cluster_key() {  # key= 16 hex digits naming the watchdog whose restart history is $1 here
  r=$(readlink -f -- "$1" 2>/dev/null) || r=
  [ -n "$r" ] || r=$1
  key=$(printf 'history:%s' "$r" | sha256sum | cut -c1-16)
}
shared_dir() {  # create state dir $1 shareable by every account (mode 1777), if it is missing
  if [ ! -d "$1" ]; then
    (umask 0; mkdir -p -- "$1") && chmod 1777 -- "$1" 2>/dev/null || true
  fi
}
shared_file() { [ -e "$1" ] || (umask 0; : >> "$1") 2>/dev/null || true; }  # create 0666
# Write stdin over (or, with `append`, onto) an existing shared file without O_CREAT: with
# fs.protected_regular (Ubuntu's default) no account may O_CREAT-open another's file in a sticky
# directory, even one it may write; dd's nocreat opens it as a plain writer.
put() {
  if [ "${2:-}" = append ]; then dd of="$1" oflag=append conv=nocreat,notrunc status=none
  else dd of="$1" conv=nocreat status=none; fi
}
"""

HOLD_SH = (
    KEY_SH
    + r"""
dir=$1; history=$2; info=$3
cluster_key "$history"; shared_dir "$dir"
lock="$dir/cluster-$key.lock"; owner="$lock.owner"
shared_file "$lock"; shared_file "$owner"
exec 9<"$lock" 2>/dev/null || { echo "ERROR cannot open the cluster lock $lock"; exit 73; }
if flock -n 9; then
  printf '%s\n' "$info" | put "$owner" 2>/dev/null || true
  echo "LOCKED $lock"
  cat >/dev/null
  : | put "$owner" 2>/dev/null || true
else
  echo "BUSY $lock"
  cat -- "$owner" 2>/dev/null
  echo '{}'
fi
"""
)

# The one probe of a flock in sh (the cluster lock here, the watchdog's history lock in doctor):
# exit 0 when nobody holds file $1's lock right now. It takes the lock on a read-only descriptor in
# a subshell, which lets it go at once (flock works on read-only descriptors, so a lock file this
# account may not write can still be probed). The caller says what a missing file, a missing
# flock(1) or an unreadable file mean.
LOCK_FREE_SH = r"""
lock_free() { ( exec 9<"$1" && flock -n 9 ) 2>/dev/null; }
"""

# "free LOCK" or "held LOCK" and the owner record: the lock's state, taking nothing (doctor)
LOCK_PROBE_SH = (
    KEY_SH
    + LOCK_FREE_SH
    + r"""
dir=$1; history=$2
cluster_key "$history"
lock="$dir/cluster-$key.lock"; owner="$lock.owner"
[ -e "$lock" ] || { echo "free $lock"; exit 0; }
command -v flock >/dev/null 2>&1 || { echo "free $lock"; exit 0; }
if lock_free "$lock"; then echo "free $lock"; exit 0; fi
echo "held $lock"; cat -- "$owner"
"""
)


# $1: the state dir, $2: the watchdog's history path (the cluster's key). The entry (one JSON
# object without "when") arrives on stdin; the head's clock is read under the lock so that the
# file's order and its "when" values agree. Files are created 0666 in the shared state dir: every
# operator appends.
AUDIT_APPEND_SH = (
    KEY_SH
    + r"""
set -eu
state=$1; history=$2
cluster_key "$history"; shared_dir "$state"
f="$state/cluster-$key.audit.jsonl"
entry=$(cat)
case $entry in "{"*"}") ;; *) echo "entry is not one JSON object" >&2; exit 65;; esac
shared_file "$f"; shared_file "$f.lock"
exec 9<"$f.lock" || { echo "cannot open the audit lock $f.lock" >&2; exit 73; }
flock -w 10 9 || { echo "audit lock $f.lock held for more than 10 s" >&2; exit 75; }
t=$(date +%s.%N)
case $t in *N*) t=$(date +%s);; esac
rest=${entry#"{"}
case $rest in "}") sep="";; *) sep=", ";; esac
printf '{"when": %s%s%s\n' "$t" "$sep" "$rest" | put "$f" append
"""
)

# $1: the state dir, $2: the watchdog's history path, $3: how many lines from the end. Reads
# under a shared lock (no half line); the first line out is the file's path.
AUDIT_READ_SH = (
    KEY_SH
    + r"""
state=$1; history=$2; n=$3
cluster_key "$history"
f="$state/cluster-$key.audit.jsonl"
printf '%s\n' "$f"
[ -e "$f" ] || exit 44
if [ -e "$f.lock" ] && [ -r "$f.lock" ]; then
  exec 9<"$f.lock"
  flock -s -w 10 9 || true
fi
tail -n "$n" -- "$f"
"""
)


# held open on the head: "LOCKED lock", or "BUSY lock" and the owner record, or "ERROR why"
HOLD = RemoteProgram(
    "cluster lock", HOLD_SH, (path("lock dir"), path("history"), text("owner record")), result
)
# "free LOCK" or "held LOCK" and the owner record
LOCK_PROBE = RemoteProgram("lock state", LOCK_PROBE_SH, (path("lock dir"), path("history")), result)
# the entry on stdin; appended at head time under the audit file's lock
AUDIT_APPEND = RemoteProgram(
    "audit", AUDIT_APPEND_SH, (path("state dir"), path("history")), checked
)
# the file's path, then its last n lines; exit 44 when there is no audit file
AUDIT_READ = RemoteProgram(
    "audit read", AUDIT_READ_SH, (path("state dir"), path("history"), integer("lines")), result
)
