"""Building remote shell commands: quoting, `~` paths, and the programs run on the nodes."""

from __future__ import annotations

import hashlib
import shlex
from collections.abc import Iterable

MISSING_EXIT = 44  # our own exit code for "file does not exist"
MISMATCH_EXIT = 45  # the file changed under us (compare-and-swap failed)


def quote_path(path: str) -> str:
    """Quote a remote path for the shell, expanding a leading ~ to $HOME and nothing else."""
    if path == "~":
        return '"$HOME"'
    if path.startswith("~/"):
        return '"$HOME"/' + shlex.quote(path[2:])
    return shlex.quote(path)


def quote_args(args: Iterable[str]) -> str:
    """Join arguments into one shell command line, each quoted."""
    return " ".join(shlex.quote(str(a)) for a in args)


def sha256(text: str) -> str:
    """Hex digest of UTF-8 text (what the remote side's sha256sum prints)."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


# Shell programs run on the nodes. Arguments are passed as positional parameters ($1, $2 …) of
# `sh -c`, never spliced into the program text.
_STAGE = r"""
set -eu
p=$1; expected=$2; want=$3
case $p in */*) d=${p%/*}; b=${p##*/} ;; *) d=.; b=$p ;; esac
[ -n "$d" ] || d=/
[ -d "$d" ] || { echo "directory $d does not exist" >&2; exit 66; }
if [ "$expected" = absent ]; then
  [ ! -e "$p" ] || exit 45
elif [ "$expected" != - ]; then
  [ -e "$p" ] || exit 45
  set -- $(sha256sum < "$p")
  [ "$1" = "$expected" ] || exit 45
fi
tmp=$(mktemp "$d/.$b.spark-ops.XXXXXX")
trap 'rm -f -- "$tmp"' EXIT
cat > "$tmp"
set -- $(sha256sum < "$tmp")
[ "$1" = "$want" ] || { echo "staged content does not match (got $1)" >&2; exit 65; }
if [ -e "$p" ]; then
  chmod --reference="$p" -- "$tmp"
  chown --reference="$p" -- "$tmp" 2>/dev/null || true
fi
sync -- "$tmp"
trap - EXIT
printf '%s\n' "$tmp"
"""

_COMMIT = r"""
set -eu
p=$1; tmp=$2; keep=$3
case $p in */*) d=${p%/*} ;; *) d=. ;; esac
[ -f "$tmp" ] || { echo "staged file $tmp vanished" >&2; exit 67; }
if [ -e "$p" ]; then
  bk="$p.bak.$(date -u +%Y%m%dT%H%M%S.%NZ)"
  ln -- "$p" "$bk" 2>/dev/null || { cp -p -- "$p" "$bk.part" && mv -f -- "$bk.part" "$bk"; }
  printf 'backup=%s\n' "$bk"
fi
if ! mv -f -- "$tmp" "$p"; then
  rm -f -- "$tmp" ${bk:+"$bk"}
  echo "cannot rename the staged file over $p" >&2
  exit 68
fi
sync -- "${d:-/}" 2>/dev/null || sync
n=0
for f in "$p".bak.*; do [ -e "$f" ] && n=$((n + 1)); done
if [ "$n" -gt "$keep" ]; then
  ls -1 -- "$p".bak.* | grep -v '[.]part$' | sort | head -n "-$keep" |
    while IFS= read -r old; do rm -f -- "$old"; done
fi
"""

_UNDO = r"""
set -eu
p=$1; bk=$2
case $p in */*) d=${p%/*} ;; *) d=. ;; esac
if [ -n "$bk" ]; then mv -f -- "$bk" "$p"; else rm -f -- "$p"; fi
sync -- "${d:-/}" 2>/dev/null || sync
"""

_READ = r"""
p=$1
if [ -e "$p" ]; then cat -- "$p"; else exit 44; fi
"""


def sh_program(program: str, *args: str) -> str:
    """Build `sh -c PROGRAM sh ARGS…` with every argument quoted; `~/` paths expand on the node."""
    quoted = [quote_path(a) if a.startswith("~") else shlex.quote(a) for a in args]
    return f"sh -c {shlex.quote(program)} sh " + " ".join(quoted)
