"""The programs of the head's shared state dir: the cluster lock (spark_ops/lock.py) and the audit
log (spark_ops/audit.py), both keyed by the watchdog's restart history."""

from __future__ import annotations

from spark_ops.remote.program import RemoteProgram, checked, integer, path, result, text

OPERATORS_GROUP = "spark-ops"  # the group the one-time set-up makes for the operators' accounts

# The shell side of the key (spark_ops/lock.py's docstring says why it is the watchdog's
# history), and the rule of the shared state (issue 34): the lock dir, the audit's state dir and
# their files may be written only by this account, root, and the operators' group (spark-ops, as
# the one-time set-up names it, or a group this account is in); a missing directory is made 2770
# and files 0660. A directory or file any other
# account could write is refused ("UNSAFE dir|file PATH<TAB>why", exit 77), never used.
KEY_SH = r"""
cluster_key() {  # key= 16 hex digits naming the watchdog whose restart history is $1 here
  r=$(readlink -f -- "$1" 2>/dev/null) || r=
  [ -n "$r" ] || r=$1
  key=$(printf 'history:%s' "$r" | sha256sum | cut -c1-16)
}
me=$(id -u); my_groups=" $(id -G) "; operators=@OPERATORS@
unsafe() {  # true (and why= says) when an account outside the operators may write $1
  why=
  if [ -L "$1" ]; then why="is a symbolic link"; return 0; fi
  [ -e "$1" ] || return 1
  st=$(stat -c '%a %u %g %U %G' -- "$1" 2>/dev/null) || { why="cannot be examined"; return 0; }
  set -- $st
  m=$((0$1))
  if [ $((m & 2)) -ne 0 ]; then why="is writable by every account (mode $1)"; return 0; fi
  # the operators: this account, root, and the group named by the set-up or one this account is in
  case $my_groups in *" $3 "*) ours=1;; *) ours=;; esac
  [ "$5" = "$operators" ] && ours=1
  if [ $((m & 16)) -ne 0 ] && [ -z "$ours" ]; then
    why="is writable by group $5, which is neither $operators nor this account's (mode $1)"
    return 0
  fi
  if [ "$2" != 0 ] && [ "$2" != "$me" ]; then
    case " $(id -G -- "$4" 2>/dev/null) " in *" $3 "*) owner_in=1;; *) owner_in=;; esac
    if [ -z "$ours" ] || [ -z "$owner_in" ]; then
      why="belongs to account $4, outside the operators' group"; return 0
    fi
  fi
  return 1
}
refuse() {  # say "UNSAFE dir|file PATH<TAB>why" (stdout and stderr), exit 77
  printf 'UNSAFE %s %s\t%s\n' "$1" "$2" "$why"; printf 'UNSAFE %s %s\t%s\n' "$1" "$2" "$why" >&2
  exit 77
}
shared_dir() {  # state dir $1: made 2770 (this account's group) when missing; refused if unsafe
  if [ ! -e "$1" ] && [ ! -L "$1" ]; then
    (umask 007; mkdir -p -- "$1" && chmod 2770 -- "$1") 2>/dev/null || true
  fi
  if unsafe "$1"; then refuse dir "$1"; fi
}
shared_file() {  # file $1: created 0660 when missing; refused if unsafe
  [ -e "$1" ] || [ -L "$1" ] || (umask 007; : >> "$1") 2>/dev/null || true
  if unsafe "$1"; then refuse file "$1"; fi
}
holder_account() {  # account= who wrote owner record $1, as its file's owner says (or empty)
  account=
  if [ -s "$1" ] && [ ! -L "$1" ]; then account=$(stat -c %U -- "$1" 2>/dev/null) || account=; fi
}
# the holder's owner record: a file of its own (0640, renamed over the last one), so that its
# owner is the account that wrote it; emptied where it cannot be replaced (never someone else's)
own_record() {
  if ! (umask 027; printf '%s\n' "$2" > "$1.$$" && mv -f -- "$1.$$" "$1") 2>/dev/null; then
    rm -f -- "$1.$$" 2>/dev/null; : | put "$1" 2>/dev/null || true
  fi
}
# Write stdin over (or, with `append`, onto) an existing shared file without O_CREAT: with
# fs.protected_regular no account may O_CREAT-open another's file in a sticky directory, even one
# it may write; dd's nocreat opens it as a plain writer.
put() {
  if [ "${2:-}" = append ]; then dd of="$1" oflag=append conv=nocreat,notrunc status=none
  else dd of="$1" conv=nocreat status=none; fi
}
""".replace("@OPERATORS@", OPERATORS_GROUP)

HOLD_SH = (
    KEY_SH
    + r"""
dir=$1; history=$2; info=$3
cluster_key "$history"; shared_dir "$dir"
lock="$dir/cluster-$key.lock"; owner="$lock.owner"
shared_file "$lock"; shared_file "$owner"
exec 9<"$lock" 2>/dev/null || { echo "ERROR cannot open the cluster lock $lock"; exit 73; }
if flock -n 9; then
  own_record "$owner" "$info"
  echo "LOCKED $lock"
  cat >/dev/null
  : | put "$owner" 2>/dev/null || true
else
  echo "BUSY $lock"
  holder_account "$owner"; echo "ACCOUNT ${account:-?}"
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
if unsafe "$dir"; then refuse dir "$dir"; fi
[ -e "$lock" ] || [ -L "$lock" ] || { echo "free $lock"; exit 0; }
if unsafe "$lock"; then refuse file "$lock"; fi
command -v flock >/dev/null 2>&1 || { echo "free $lock"; exit 0; }
if lock_free "$lock"; then echo "free $lock"; exit 0; fi
holder_account "$owner"
echo "held $lock"; echo "ACCOUNT ${account:-?}"
if unsafe "$owner"; then echo '{}'; else cat -- "$owner"; fi
"""
)


# $1: the state dir, $2: the watchdog's history path (the cluster's key). The entry (one JSON
# object without "when") arrives on stdin; the head's clock is read under the lock so that the
# file's order and its "when" values agree, and the record begins with the account this program
# runs as (id -un, id -u: the system's word, not the entry's). Files are created 0660 in a state
# dir only the operators may write: every operator appends.
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
case $rest in "}"*) sep="";; *) sep=", ";; esac
account=$(id -un | tr -dc 'A-Za-z0-9._-')
printf '{"when": %s, "account": "%s", "uid": %s%s%s\n' "$t" "$account" "$me" "$sep" "$rest" \
  | put "$f" append
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
if unsafe "$state"; then refuse dir "$state"; fi
[ -e "$f" ] || [ -L "$f" ] || exit 44
if unsafe "$f"; then refuse file "$f"; fi
if [ -e "$f.lock" ] && [ -r "$f.lock" ]; then
  exec 9<"$f.lock"
  flock -s -w 10 9 || true
fi
tail -n "$n" -- "$f"
"""
)


# doctor: "missing DIR", or "ok DIR GROUP" when DIR and this cluster's files in it ($2: the
# watchdog's history, the key) are the operators' only (else the UNSAFE line of the first that is
# not, exit 77); another cluster's files are that cluster's doctor's to judge
STATE_SAFE_SH = (
    KEY_SH
    + r"""
dir=$1; history=$2
cluster_key "$history"
if [ ! -e "$dir" ] && [ ! -L "$dir" ]; then echo "missing $dir"; exit 0; fi
if unsafe "$dir"; then refuse dir "$dir"; fi
for f in "$dir/cluster-$key".*; do
  if [ -e "$f" ] || [ -L "$f" ]; then if unsafe "$f"; then refuse file "$f"; fi; fi
done
echo "ok $dir $(stat -c %G -- "$dir")"
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
# doctor's look at a state dir: "missing DIR", "ok DIR GROUP", or UNSAFE (exit 77)
STATE_SAFE = RemoteProgram(
    "state dir safe", STATE_SAFE_SH, (path("directory"), path("history")), result
)
