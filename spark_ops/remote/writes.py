"""The all-or-nothing write of files on several nodes: stage everywhere (a synced temp file
beside each target, if the target is unchanged), then rename everywhere; on a failure the staged
files are removed and the renamed copies put back, or WriteNotUndone names every copy's state.

ClusterSession.write_atomic is the entry point; each step goes through the session's own methods
(stage, commit, discard), the shell text is remote/shell.py's.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from spark_ops.errors import FileChanged, RemoteError, SparkOpsError, WriteError, WriteNotUndone
from spark_ops.remote.program import check_text
from spark_ops.remote.shell import (
    COMMIT,
    DIGEST,
    DISCARD_RUN,
    MAX_READ_BYTES,
    MISMATCH_EXIT,
    NO_ROOM_EXIT,
    REMOVE,
    STAGE,
    UNDO,
    UNREPLACEABLE_EXIT,
    sha256,
)
from spark_ops.remote.transport import Result

if TYPE_CHECKING:  # the session calls in here; its type is for the checker only
    from spark_ops.remote.session import ClusterSession

OLD_STATE = "its old content"  # a copy's state after a failed undo: as before the write


def _staged(out: WriteOutcome | SparkOpsError) -> WriteOutcome:
    """A staging outcome known to have succeeded."""
    assert isinstance(out, WriteOutcome)
    return out


async def run_or_error(
    session: ClusterSession, host: str, command: str, label: str, *, sudo: bool = True
) -> Result | SparkOpsError:
    """Run a command (as root where the inventory says); its error returned, not raised."""
    try:
        return await session.run(host, command, sudo=sudo, label=label)
    except SparkOpsError as exc:
        return exc


def _with_leftovers(exc: SparkOpsError, left: Sequence[str]) -> SparkOpsError:
    """Add to an error the staged files that could not be removed (the next write removes them
    after 10 minutes)."""
    if left:
        exc.message += (
            f"; staged file(s) left: {', '.join(left)} (the next write removes them after 10 "
            "minutes, or remove them by hand)"
        )
    return exc


@dataclass(frozen=True)
class FileWrite:
    """One atomic write to do: content for a path on a node, guarded by the old content's digest."""

    host: str
    path: str
    content: str
    expected_sha: str | None = None  # None: any current content (or none) is accepted
    keep_backups: int = 5
    label: str = ""  # appended to the backup's name: ROLLED_BACK for a rollback's write
    run: str = "-"  # the journal's run id, carried by the staged file's name (discard_run)


@dataclass
class WriteOutcome:
    """Where a write landed and where the previous content was kept."""

    host: str
    path: str
    backup: str | None
    staged: str | None = None
    target: str | None = None  # the file renamed over: path, or its symlink's target
    old_sha: str | None = None  # the digest staging found there ("absent": no file)

    def to_dict(self) -> dict[str, Any]:
        """Serialize for reports."""
        return {"host": self.host, "path": self.path, "backup": self.backup}


async def stage(session: ClusterSession, w: FileWrite) -> WriteOutcome:
    """Write content to a synced temp file beside the target, if the target is unchanged.

    Also rules out, before any node renames, what would make this node's rename or its undo
    fail: an immutable or append-only file or directory, no room to copy the old content back.
    """
    check_text(f"{w.host}:{w.path}: new content", w.content, max_bytes=MAX_READ_BYTES)
    expected = "-" if w.expected_sha is None else w.expected_sha
    cmd = STAGE.line(w.path, expected, sha256(w.content), w.run)
    res = await session.run(
        w.host, cmd, input=w.content, check=False, sudo=True, label=f"stage {w.path}"
    )
    if res.exit_code == MISMATCH_EXIT:
        raise FileChanged(
            w.host, w.path, expected, res.stdout.strip(), when="since it was read", undone=""
        )
    if res.exit_code in (UNREPLACEABLE_EXIT, NO_ROOM_EXIT) or "No space left" in res.stderr:
        why = (res.stderr.strip().splitlines() or [f"exit {res.exit_code}"])[-1]
        fix = (
            "make room on that filesystem"
            if res.exit_code != UNREPLACEABLE_EXIT
            else "if the file is meant to change, `chattr -i` it (and its directory)"
        )
        raise WriteError(
            w.host,
            f"{w.path}: cannot be written: {why}; nothing written on any node",
            hint=f"on {w.host}, {fix}; then run the command again",
        )
    res.check()
    staged, target, seen = [*res.stdout.split("\0"), "", ""][:3]
    return WriteOutcome(
        w.host, w.path, None, staged=staged, target=target or w.path, old_sha=seen or None
    )


async def commit(session: ClusterSession, w: FileWrite, staged: WriteOutcome) -> WriteOutcome:
    """Back up the target, check it is still what staging saw, rename the staged file over it.

    The digest is checked on the node just before the rename (compare-and-swap); what stays
    open is the time from that check to the rename itself (docs/reliability.md).
    """
    assert staged.staged and staged.target
    keep = max(w.keep_backups, 1)
    old = staged.old_sha or w.expected_sha or "-"
    cmd = COMMIT.line(w.path, staged.staged, staged.target, keep, w.label, old)
    res = await session.run(w.host, cmd, check=False, sudo=True, label=f"rename over {w.path}")
    fields = dict(f.partition("=")[::2] for f in res.stdout.split("\0") if "=" in f)
    if res.exit_code == MISMATCH_EXIT and "found" in fields:
        raise FileChanged(
            w.host, w.path, old, fields["found"], when="while spark-ops was writing it",
            undone=" on any node",
        )  # fmt: skip
    if res.exit_code == MISMATCH_EXIT:
        raise RemoteError(w.host, f"{res.stderr.strip()}; nothing written")
    res.check()
    return WriteOutcome(w.host, w.path, fields.get("backup"), target=staged.target, old_sha=old)


async def discard(session: ClusterSession, host: str, staged_path: str) -> str | None:
    """Remove a staged temp file; the reason it could not be, or None when it is gone."""
    try:
        await session.call(host, REMOVE, staged_path, sudo=True, check=True)
    except SparkOpsError as exc:
        return exc.message
    return None


async def discard_run(session: ClusterSession, host: str, path: str, run: str) -> list[str]:
    """Remove the staged files a dead run (its journal id) left beside path's target; the removed.

    A run killed between staging and renaming leaves its staged file; only the cluster lock's
    next holder calls this, for a run the journal shows begun and never ended.
    """
    res = await session.call(host, DISCARD_RUN, path, run, sudo=True, label=f"discard {path}")
    return [f for f in res.stdout.split("\0") if f]


async def write_atomic(session: ClusterSession, writes: Sequence[FileWrite]) -> list[WriteOutcome]:
    """Write files on several nodes all-or-nothing: stage everywhere, then rename everywhere.

    On any failure every staged file is removed and the renamed copies are put back; when
    that cannot be done the error is a WriteNotUndone naming every copy's state, and its
    `written` lists the copies left changed.
    """
    staged = await session.gather(
        [str(i) for i in range(len(writes))], lambda i: session.stage(writes[int(i)])
    )
    failures = [v for v in staged.values() if isinstance(v, SparkOpsError)]
    if failures:
        left = await _discard(session, writes, staged, range(len(writes)))
        raise _with_leftovers(failures[0], left)
    # every node staged: the renames run concurrently (each is checked and undone alone)
    committed = await session.gather(
        [str(i) for i in range(len(writes))],
        lambda i: session.commit(writes[int(i)], _staged(staged[i])),
    )
    done = {int(i): v for i, v in committed.items() if isinstance(v, WriteOutcome)}
    failed = [int(i) for i, v in committed.items() if isinstance(v, SparkOpsError)]
    if failed:
        cause = committed[str(failed[0])]
        assert isinstance(cause, SparkOpsError)
        await _undo(session, writes, staged, done, failed, cause)
        raise cause
    return [done[n] for n in range(len(writes))]


async def _discard(
    session: ClusterSession,
    writes: Sequence[FileWrite],
    staged: dict[str, WriteOutcome | SparkOpsError],
    which: Iterable[int],
) -> list[str]:
    """Remove the staged files of the given writes; "host: path (why)" for each one left."""
    left: list[str] = []
    for n in which:
        out = staged[str(n)]
        if isinstance(out, WriteOutcome) and out.staged:
            why = await session.discard(writes[n].host, out.staged)
            if why is not None:
                left.append(f"{writes[n].host}: {out.staged} ({why})")
    return left


async def _undo(
    session: ClusterSession,
    writes: Sequence[FileWrite],
    staged: dict[str, WriteOutcome | SparkOpsError],
    done: dict[int, WriteOutcome],
    failed_at: Sequence[int],
    cause: SparkOpsError,
) -> None:
    """Renames failed (failed_at): drop the staged files not renamed, put the renamed copies
    (done, by write index) back.

    Returns when every copy holds its old content again (the caller re-raises `cause`);
    raises WriteNotUndone, naming each copy's state, when one could not be put back.
    """
    left = await _discard(session, writes, staged, [n for n in range(len(writes)) if n not in done])
    failed: dict[str, str] = {}
    for n, out in sorted(done.items()):
        new = sha256(writes[n].content)
        cmd = UNDO.line(out.path, out.target or out.path, out.backup or "", new, out.old_sha or "-")
        res = await run_or_error(session, out.host, cmd, f"restore {out.path}")
        if isinstance(res, SparkOpsError):
            failed[f"{out.host}:{out.path}"] = res.message.removeprefix(f"{out.host}: ")
    _with_leftovers(cause, left)
    if not failed:
        return
    states = await _states(session, writes, staged, done)
    lines, written = [], []
    for n, w in enumerate(writes):
        key = f"{w.host}:{w.path}"
        state = states[key]
        line = f"{key} holds {state}"
        if key in failed:
            line += f" (putting it back failed: {failed[key]})"
        renamed = n in done or (n in failed_at and not state.startswith("content"))
        if renamed and state != OLD_STATE:  # renamed by this run and not put back
            written.append(key)
        if n in done and done[n].backup:
            line += f"; its old content is in {done[n].backup}"
        lines.append(line)
    first = next(iter(failed)).split(":", 1)[0]
    reason = cause.message.split("; nothing written")[0]
    raise WriteNotUndone(
        first,
        f"the write failed ({reason}) and could not be undone on every node; the copies "
        f"may disagree: {'; '.join(lines)}",
        states=states,
        written=written,
        hint="make the copies agree by hand (move the named backup back over the file, or "
        "copy one node's file to the others), then run `spark-ops status`",
    ) from cause


async def _states(
    session: ClusterSession,
    writes: Sequence[FileWrite],
    staged: dict[str, WriteOutcome | SparkOpsError],
    done: dict[int, WriteOutcome],
) -> dict[str, str]:
    """What each copy holds now: its new content, its old, someone else's, or unknown."""

    async def one(n: int) -> str:
        """Read one copy's digest and name it."""
        w = writes[n]
        out = staged[str(n)]
        old = out.old_sha if isinstance(out, WriteOutcome) else w.expected_sha
        cmd = DIGEST.line(w.path)
        res = await run_or_error(session, w.host, cmd, f"digest of {w.path}")
        if isinstance(res, SparkOpsError):
            return f"unknown content ({res.message})"
        found = res.stdout.strip()
        if found == sha256(w.content):
            return "the NEW content"
        if found == old:
            return OLD_STATE
        return f"content someone else wrote (sha256 {found[:12]})"

    values = await asyncio.gather(*(one(n) for n in range(len(writes))))
    return {f"{w.host}:{w.path}": v for w, v in zip(writes, values, strict=True)}
