"""Building remote shell commands: quoting, `~` paths, and the programs run on the nodes."""

from __future__ import annotations

import hashlib

from spark_ops.headlib.backup import (
    BACKUP_COUNTER_DIGITS,
    BACKUP_INFIX,
    BACKUP_TIME_FORMAT,
    ROLLED_BACK,
    backup_tag_pattern,
)
from spark_ops.inventory import EngineSettings
from spark_ops.remote.program import (
    RemoteProgram,
    checked,
    integer,
    path,
    result,
    text,
)
from spark_ops.remote.quoting import quote_path, quote_word

MISSING_EXIT = 44  # our own exit code for "file does not exist"
MISMATCH_EXIT = 45  # the file changed under us (compare-and-swap failed)
UNREPLACEABLE_EXIT = 70  # the file or its directory is immutable / append-only: no rename
NO_ROOM_EXIT = 71  # no room to put the old content back if the write had to be undone


def sha256(text: str) -> str:
    """Hex digest of UTF-8 text (what the remote side's sha256sum prints)."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


MAX_READ_BYTES = 1 << 20  # a file read whole (recipe, backup, --edit target): 1 MiB at most
TOO_BIG_EXIT = 47  # the file is larger than the reader accepts


def replace_undecodable(text: str) -> str:
    """Text decoded with surrogate escapes, each undecodable byte shown as U+FFFD."""
    if not any("\udc80" <= ch <= "\udcff" for ch in text):
        return text
    return text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


# Shell programs run on the nodes. Arguments are passed as positional parameters ($1, $2 …) of
# `sh -c`, never spliced into the program text.
#
# The backup naming and rotation rule is headlib/backup.py's, rendered here into sh from its
# constants (one rule, two renderings; tests/test_backup_rule.py runs both on the same names):
# <file>.bak.<date -u +%Y%m%dT%H%M%S.%6NZ>[-N][.rolled-back]; rotation removes only names of that
# shape. A symlink is written through: the staged file goes beside its target, the target is
# renamed over, the link stays, and the backup beside the link is a copy of the old content.
_TAG_GLOB = backup_tag_pattern(lambda n: "[0-9]" * n, lambda ch: ch)
_OURS_CASES = "|".join(
    ["$TAG"] + ["$TAG-" + "[0-9]" * k for k in range(1, BACKUP_COUNTER_DIGITS + 1)]
)
COMMON_SH = (
    r"""
export LC_ALL=C
TAG='"""
    + _TAG_GLOB
    + r"""'
ours() {  # $1 a backup name of $p: made by spark-ops (the naming rule), not the operator's own
"""
    + '  s=${1#"$p"'
    + BACKUP_INFIX
    + "}; s=${s%"
    + ROLLED_BACK
    + "}"
    + r"""
  case $s in """
    + _OURS_CASES
    + r""") return 0 ;; esac
  return 1
}
backup_tag() { date -u +"""
    + BACKUP_TIME_FORMAT.replace("%f", "%6N")
    + r"""; }  # the time part of a new backup's name
resolve() {  # t= the file a write to $1 replaces: $1, or the end of its symlink chain
  if [ -L "$1" ]; then t=$(readlink -f -- "$1" && echo . || :); t=${t%??}; else t=$1; fi
}
dir_of() { case $1 in */*) d=${1%/*}; [ -n "$d" ] || d=/ ;; *) d=. ;; esac; }  # d= its directory
digest() {  # h= the sha256 of file $1, or "absent" when there is none
  if [ -e "$1" ]; then h=$(sha256sum < "$1") || return 1; h=${h%% *}; else h=absent; fi
}
"""
)

REPLACEABLE_SH = (
    COMMON_SH
    + r"""
p=$1
resolve "$p"
[ -n "$t" ] || { echo "dir=unresolvable"; exit 0; }
dir_of "$t"
echo "target=$t"
if [ -e "$t" ] && [ ! -r "$t" ]; then echo "file=not-readable"; fi
if [ ! -d "$d" ]; then echo "dir=absent"; exit 0; fi
if [ -w "$d" ]; then echo "dir=writable"; else echo "dir=not-writable"; fi
for f in "$t" "$d"; do  # what refuses the rename (STAGE_SH refuses the same flags)
  [ -e "$f" ] || continue
  a=$(lsattr -d -- "$f" 2>/dev/null) || continue
  case ${a%% *} in *[ia]*) echo "flags=${a%% *} $f" ;; esac
done
"""
)  # doctor: can the atomic writer replace $1 (temp file beside its target, rename)? key=value

STAGE_SH = (
    COMMON_SH
    + r"""
set -eu
p=$1; expected=$2; want=$3; run=$4  # run: the run id the staged name carries, or -
nl='
'
case $run in
  -) ;;
  ''|*[!0-9A-Za-z-]*) printf 'run id %s is not a run id\n' "$run" >&2; exit 2 ;;
esac
resolve "$p"
[ -n "$t" ] || { printf 'symlink %s cannot be resolved\n' "$p" >&2; exit 66; }
dir_of "$t"; b=${t##*/}
[ -d "$d" ] || { printf 'directory %s does not exist\n' "$d" >&2; exit 66; }
[ ! -d "$t" ] || { printf '%s is a directory\n' "$p" >&2; exit 66; }
refuse() {  # $1 a file, $2 its lsattr flags: an immutable or append-only one cannot be replaced
  case $2 in
    *[ia]*) printf '%s is immutable or append-only (lsattr %s): ' "$1" "$2" >&2
            echo "it cannot be replaced" >&2; exit 70 ;;
  esac
}
# What refuses the rename, ruled out before any node renames: one lsattr for the file and its
# directory; when one of them shows no flags (no lsattr, a filesystem without them), each alone.
a=
if [ -e "$t" ]; then a=$(lsattr -d -- "$t" "$d" 2>/dev/null) || :; fi
f1=${a%%" "*}; r=${a#"$f1 $t$nl"}; f2=${r%%" "*}
if [ -n "$a" ] && [ "$a" = "$f1 $t$nl$f2 $d" ]; then
  refuse "$t" "$f1"; refuse "$d" "$f2"
else
  for f in "$t" "$d"; do
    [ -e "$f" ] || continue
    a=$(lsattr -d -- "$f" 2>/dev/null) || continue
    refuse "$f" "${a%%" "*}"
  done
fi
for old in "$d/.$b.spark-ops."*; do  # staged files of a killed run, older than 10 minutes
  case ${old##*.spark-ops.} in ??????|????????T??????-??????.??????) ;; *) continue ;; esac
  if [ -f "$old" ] && [ -n "$(find "$old" -maxdepth 0 -mmin +10 2>/dev/null)" ]; then
    rm -f -- "$old"
  fi
done
# The staged file: a new name created exclusively (noclobber opens with O_EXCL, as mktemp does),
# readable by its owner only until it takes the target's mode and owner.
umask 077; set -C; n=$$; tmp=
while [ -z "$tmp" ]; do
  s=00000$n; c="$d/.$b.spark-ops.${s#"${s%??????}"}"
  [ "$run" = - ] || c="$d/.$b.spark-ops.$run.${s#"${s%??????}"}"  # the next run finds its own
  if [ -e "$c" ] || [ -L "$c" ]; then n=$((n + 1)); continue; fi
  : > "$c"
  tmp=$c
done
set +C
trap 'rm -f -- "$tmp"' EXIT
if [ -e "$t" ]; then  # mode and owner first (root may chown; others keep their own). cp stops
  # before the mode when it may not chown (root without CAP_CHOWN, NFS root_squash): the mode alone
  cp --attributes-only --preserve=mode,ownership -- "$t" "$tmp" 2>/dev/null \
    || cp --attributes-only --preserve=mode -- "$t" "$tmp" 2>/dev/null || :
fi
# The content, synced with the inode (its mode and owner too) by dd's fsync; a full disk fails
# here and the trap removes the staged file. A mode that forbids us to write (not root) is taken
# after the content, then synced again.
if [ -w "$tmp" ]; then
  dd of="$tmp" bs=65536 conv=fsync status=none
else
  chmod u+w -- "$tmp"
  dd of="$tmp" bs=65536 conv=fsync status=none
  chmod --reference="$t" -- "$tmp"
  sync -- "$tmp"
fi
if [ -e "$t" ]; then  # the target as it is and what was staged, one sha256sum for both
  h=$(sha256sum -- "$t" "$tmp") || { printf '%s cannot be read\n' "$t" >&2; exit 66; }
  seen=${h%%"$nl"*}; h=${h#*"$nl"}
  seen=${seen#\\}; seen=${seen%%" "*}; h=${h#\\}; h=${h%%" "*}
else
  seen=absent; digest "$tmp"
fi
[ "$expected" = - ] || [ "$seen" = "$expected" ] || { printf '%s' "$seen"; exit 45; }
[ "$h" = "$want" ] || { echo "staged content does not match (got $h)" >&2; exit 65; }
dir_of "$p"; pd=$d; dir_of "$t"
if [ -e "$t" ] && [ "$pd" != "$d" ]; then  # an undo would copy the backup back beside $t
  need=$(( $(wc -c < "$t") / 1024 + 8 ))
  free=$(df -Pk -- "$d" 2>/dev/null | awk 'NR == 2 { print $4 }') || free=
  case $free in
    ''|*[!0-9]*) ;;
    *) [ "$free" -ge "$need" ] || {
         printf '%s has %s KiB free; putting %s back if the write had to be undone needs %s\n' \
           "$d" "$free" "$t" "$need" >&2
         exit 71; } ;;
  esac
fi
trap - EXIT
printf '%s\0%s\0%s' "$tmp" "$t" "$seen"
"""
)

COMMIT_SH = (
    COMMON_SH
    + r"""
set -eu
p=$1; tmp=$2; t0=$3; keep=$4; label=$5; old=$6
[ -f "$tmp" ] || { echo "staged file $tmp vanished" >&2; exit 67; }
resolve "$p"
[ "$t" = "$t0" ] || { rm -f -- "$tmp"; echo "$p now points to $t, not $t0" >&2; exit 45; }
bk=
if [ -e "$t" ]; then
  base="$p.bak.$(backup_tag)"; bk=$base$label; n=0
  while [ -e "$bk" ] || [ -L "$bk" ]; do n=$((n + 1)); bk=$base-$n$label; done
  if [ -L "$p" ] || ! ln -- "$t" "$bk" 2>/dev/null; then
    if ! { cp -p -- "$t" "$bk.part" && mv -f -- "$bk.part" "$bk"; }; then
      rm -f -- "$tmp" "$bk.part"
      echo "cannot keep a backup of $t as $bk" >&2
      exit 69
    fi
  fi
fi
# Compare-and-swap: the file is still the one staging saw. What is left open is the time from
# this digest to mv's rename (one fork and exec): an edit landing there is not seen.
digest "$t" || h=unreadable
if [ "$h" != "$old" ]; then
  rm -f -- "$tmp" ${bk:+"$bk"}
  printf 'found=%s\0' "$h"
  exit 45
fi
[ -z "$bk" ] || printf 'backup=%s\0' "$bk"
if ! mv -f -- "$tmp" "$t"; then
  rm -f -- "$tmp" ${bk:+"$bk"}
  echo "cannot rename the staged file over $t" >&2
  exit 68
fi
dir_of "$t"
sync -- "$d" 2>/dev/null || sync
set --
for f in "$p".bak.*; do
  if [ -f "$f" ] && ours "$f"; then set -- "$@" "$f"; fi
done
while [ "$#" -gt "$keep" ]; do rm -f -- "$1"; shift; done
"""
)

UNDO_SH = (
    COMMON_SH
    + r"""
set -eu
p=$1; t=$2; bk=$3; new=$4; old=$5
digest "$t" || h=unreadable
[ "$h" = "$new" ] || { printf 'found=%s\0' "$h"; exit 45; }  # changed again: left as it is
dir_of "$p"; pd=$d; dir_of "$t"
if [ -z "$bk" ]; then
  rm -f -- "$t"
elif [ "$pd" = "$d" ]; then  # the backup is the old file itself, or a copy beside it
  mv -f -- "$bk" "$t"  # a rename: needs no space
else  # a symlink to another directory: the backup is a copy beside the link
  u=$(mktemp "$d/.${t##*/}.spark-ops.XXXXXX")
  trap 'rm -f -- "$u"' EXIT
  cp -p -- "$bk" "$u"
  digest "$u"
  [ "$h" = "$old" ] || { echo "the copy of $bk is not whole (got $h)" >&2; exit 65; }
  sync -- "$u"
  mv -f -- "$u" "$t"
  trap - EXIT
  rm -f -- "$bk"
fi
sync -- "$d" 2>/dev/null || sync
"""
)

DIGEST_SH = (
    COMMON_SH
    + r"""
set -eu
resolve "$1"
digest "$t"
printf '%s' "$h"
"""
)

READ_SH = r"""
p=$1; max=$2
[ -e "$p" ] || exit 44
[ -f "$p" ] || { echo "$p: not a regular file" >&2; exit 13; }
[ -r "$p" ] || { echo "$p: permission denied" >&2; exit 13; }
n=$(wc -c < "$p") || exit 13
[ "$n" -le "$max" ] || { echo "$n"; exit 47; }
cat -- "$p"
"""

# The last $2 bytes of a file that only grows by lines (a journal), and the byte before them (so
# that a caller can tell whether the first line is whole): its size on the first line, then the
# bytes. Exit 44 when it does not exist.
TAIL_SH = r"""
p=$1; max=$2
[ -e "$p" ] || exit 44
[ -f "$p" ] || { echo "$p: not a regular file" >&2; exit 13; }
[ -r "$p" ] || { echo "$p: permission denied" >&2; exit 13; }
n=$(wc -c < "$p") || exit 13
echo "$n"
tail -c "$((max + 1))" -- "$p"
"""

LIST_BACKUPS_SH = (
    COMMON_SH
    + r"""
p=$1
for f in "$p".bak.*; do
  if [ -f "$f" ] && ours "$f"; then printf '%s\0' "$f"; fi
done
"""
)

DISCARD_RUN_SH = (
    COMMON_SH
    + r"""
p=$1; run=$2
case $run in ''|-|*[!0-9A-Za-z-]*) printf 'run id %s is not a run id\n' "$run" >&2; exit 2 ;; esac
resolve "$p"
dir_of "$p"; pd=$d
[ -z "$t" ] || dir_of "$t"
# only that run's staged files (its id is in their names: no other run makes them), regular, not
# links, beside whatever file it staged in the target's directory or the link's: a link retargeted
# since (recipe.yaml -> real-b.yaml, was real-a.yaml) leaves .real-a.yaml.spark-ops.<run>.<n>
for f in "$d/."*".spark-ops.$run."?????? "$pd/."*".spark-ops.$run."??????; do
  if [ -f "$f" ] && [ ! -L "$f" ]; then rm -f -- "$f" && printf '%s\0' "$f"; fi
done
"""
)  # remove a dead run's staged files beside $1 or its target ($2 its run id); print each, NUL-ended


# The writer's programs as RemoteProgram values (session.py parses what they print: their exit
# codes above mean more than success or failure).
REPLACEABLE = RemoteProgram("can replace", REPLACEABLE_SH, (path("file"),), result)
STAGE = RemoteProgram(
    "stage", STAGE_SH, (path("file"), text("expected sha"), text("new sha"), text("run")), result
)
COMMIT = RemoteProgram(
    "commit",
    COMMIT_SH,
    (path("file"), path("staged"), path("target"), integer("keep"), text("label"), text("old sha")),
    result,
)
UNDO = RemoteProgram(
    "undo",
    UNDO_SH,
    (path("file"), path("target"), path("backup"), text("new sha"), text("old sha")),
    result,
)
DIGEST = RemoteProgram("digest", DIGEST_SH, (path("file"),), checked)
READ = RemoteProgram("read", READ_SH, (path("file"), integer("max bytes")), result)
TAIL = RemoteProgram("tail", TAIL_SH, (path("file"), integer("max bytes")), result)
LIST_BACKUPS = RemoteProgram("list backups", LIST_BACKUPS_SH, (path("file"),), checked)
REMOVE = RemoteProgram("remove", 'rm -f -- "$1"', (path("file"),), result)
DISCARD_RUN = RemoteProgram("discard run", DISCARD_RUN_SH, (path("file"), text("run")), checked)


def engine_log_recent(engine: EngineSettings, lines: int = 5000) -> str:
    """The shell command that prints the engine log's recent lines."""
    target = quote_path(engine.log_target)
    if engine.log_kind == "file":
        return f"tail -n {lines} {target} 2>/dev/null"
    if engine.log_kind == "journalctl":
        return f"journalctl -n {lines} -o cat --no-pager -u {target}"
    if engine.log_kind == "docker":
        return f"docker logs --tail {lines} {target} 2>&1"
    return f"timeout 5 {engine.log_target} | tail -n {lines}"


def engine_log_last_args(engine: EngineSettings, lines: int = 5000) -> str:
    """The shell command that prints the last `non-default args` line of the engine log."""
    return engine_log_recent(engine, lines) + " | grep -a 'non-default args' | tail -n 1"


def engine_log_follow(
    engine: EngineSettings, *, from_offset: int | None = None, from_time: str | None = None
) -> str:
    """The shell command that prints engine log lines as they come.

    From now on by default; a plain file from a byte offset (`from_offset`), a journal or a
    container log from a time (`from_time`: the `--since` value, e.g. `@1700000000`).
    """
    target = quote_path(engine.log_target)
    if engine.log_kind == "file":
        if from_offset is not None:
            return f"tail -c +{from_offset + 1} -F -- {target} 2>/dev/null"
        return f"tail -n 0 -F {target} 2>/dev/null"
    if engine.log_kind == "journalctl":
        if from_time is not None:
            return f"journalctl -f -o cat --no-pager --since {quote_word(from_time)} -u {target}"
        return f"journalctl -f -n 0 -o cat -u {target}"
    if engine.log_kind == "docker":
        since = quote_word(from_time) if from_time is not None else "0s"
        return f"docker logs -f --since {since} {target} 2>&1"
    return engine.log_target
