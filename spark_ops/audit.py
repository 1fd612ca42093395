"""The audit log: one JSON line per operation, kept on the head so every operator sees the same
history.

The file is `<cluster.state_dir>/audit.jsonl` on the head. Each entry is appended as one line by a
single `>>` write under `flock` on `audit.jsonl.lock`, with the time taken from the head's clock, so
entries from several operators' machines never interleave and are ordered by one clock.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Sequence
from typing import Any

from spark_ops.errors import RemoteError
from spark_ops.remote import ClusterSession, sh_program

AUDIT_NAME = "audit.jsonl"

# $1: the audit file. The entry (one JSON object without "when") arrives on stdin; the head's
# clock is
# read under the lock so that the file's order and its "when" values agree.
_APPEND = r"""
set -eu
f=$1
mkdir -p -- "$(dirname -- "$f")"
entry=$(cat)
case $entry in "{"*"}") ;; *) echo "entry is not one JSON object" >&2; exit 65;; esac
exec 9>>"$f.lock"
flock -w 10 9 || { echo "audit lock $f.lock held for more than 10 s" >&2; exit 75; }
t=$(date +%s.%N)
case $t in *N*) t=$(date +%s);; esac
rest=${entry#"{"}
case $rest in "}") sep="";; *) sep=", ";; esac
printf '{"when": %s%s%s\n' "$t" "$sep" "$rest" >> "$f"
"""

# $1: the audit file, $2: how many lines from the end. Reads under a shared lock (no half line).
_READ = r"""
f=$1; n=$2
[ -e "$f" ] || exit 44
if [ -e "$f.lock" ] && [ -r "$f.lock" ]; then
  exec 9<"$f.lock"
  flock -s -w 10 9 || true
fi
tail -n "$n" -- "$f"
"""


def audit_path(state_dir: str) -> str:
    """The audit file under a cluster's state_dir (on the head)."""
    return f"{state_dir.rstrip('/')}/{AUDIT_NAME}"


def who() -> str:
    """The operator as user@host of the machine spark-ops runs on."""
    from spark_ops.lock import local_user

    return f"{local_user()}@{socket.gethostname()}"


def make_entry(
    operation: str,
    *,
    args: dict[str, Any] | None = None,
    nodes: Sequence[str] = (),
    diff: str = "",
    outcome: str = "",
    detail: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Build an audit entry (the head adds "when" as it writes it)."""
    entry: dict[str, Any] = {
        "who": who(),
        "what": {"operation": operation, "args": dict(args or {})},
        "nodes": list(nodes),
        "diff": diff,
        "outcome": outcome,
    }
    if detail:
        entry["detail"] = detail
    return entry


def entry_for(
    plan: Any, opts: Any = None, outcome: Any = None, *, error: BaseException | None = None
) -> dict[str, Any]:
    """The entry of an executed plan: operation, changes asked, nodes written, diffs, outcome."""
    args: dict[str, Any] = {}
    for ch in getattr(opts, "changes", None) or ():
        name = str(getattr(ch, "name", ch)).lstrip("-").replace("-", "_")
        args[name] = "(removed)" if getattr(ch, "remove", False) else getattr(ch, "value", None)
    reason = getattr(opts, "reason", None)
    if reason:
        args["reason"] = reason
    if getattr(opts, "force", False):
        args["force"] = True
    changes = list(getattr(plan, "changes", None) or ())
    diff = "".join(str(getattr(c, "diff", "")) for c in changes)
    if error is not None:
        result = f"failed: {getattr(error, 'message', None) or error}"
    elif outcome is None:
        result = "not run"
    else:
        result = "ok" if getattr(outcome, "ok", False) else "failed"
        if getattr(outcome, "rolled_back", False):
            result = "rolled back"
        bad = [c for c in getattr(outcome, "checks", None) or () if not c.get("ok", True)]
        if result == "ok" and bad:
            names = ", ".join(sorted({f"{c.get('name')}@{c.get('host')}" for c in bad}))
            result = f"ok, checks failed: {names}"
    detail: dict[str, Any] = {}
    if outcome is not None:
        detail = {
            "stamp": getattr(outcome, "stamp", None),
            "pruned": getattr(outcome, "pruned", []),
        }
    written = (getattr(plan, "facts", None) or {}).get("written")
    if written is not None:
        detail["written"] = list(written)  # what changed, even when a later step failed
    return make_entry(
        str(getattr(plan, "operation", "?")),
        args=args,
        nodes=[str(getattr(c, "host", "?")) for c in changes],
        diff=diff,
        outcome=result,
        detail=detail,
    )


async def record(session: ClusterSession, entry: dict[str, Any]) -> None:
    """Append one entry as one JSON line to the head's audit file, under its lock, at head time."""
    data = dict(entry)
    data.pop("when", None)
    data.setdefault("who", who())
    # ASCII JSON: any value (a lone surrogate from an undecodable argv byte, a NUL) is escaped,
    # so an entry can always be sent and appended whole
    line = json.dumps(data, default=str, ensure_ascii=True, separators=(", ", ": "))
    cluster = session.cluster
    path = audit_path(cluster.state_dir)
    await session.run(cluster.head.name, sh_program(_APPEND, path), input=line + "\n", check=True)


async def read(session: ClusterSession, limit: int = 20) -> list[dict[str, Any]]:
    """The last `limit` entries, oldest first; a non-JSON line comes back as {"malformed": line}."""
    if limit < 1:
        raise ValueError(f"limit must be >= 1, got {limit}")
    cluster = session.cluster
    path = audit_path(cluster.state_dir)
    res = await session.run(cluster.head.name, sh_program(_READ, path, str(limit)), check=False)
    if res.exit_code == 44:
        return []
    if not res.ok:
        raise RemoteError(
            cluster.head.name,
            f"cannot read the audit log {path} (exit {res.exit_code}): {res.stderr.strip()[-300:]}",
            hint="check state_dir in the inventory and that the SSH user can read it",
        )
    out: list[dict[str, Any]] = []
    for raw in res.stdout.splitlines():
        if not raw.strip():
            continue
        try:
            value = json.loads(raw)
        except ValueError:
            out.append({"malformed": raw})
            continue
        out.append(value if isinstance(value, dict) else {"malformed": raw})
    return out
