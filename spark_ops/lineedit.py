"""`exec --edit`: one atomic one-line file edit on all or some nodes of a cluster.

The line is matched and rewritten by a child process (`python -m spark_ops.linesub`) with a
deadline, then written with the one remote writer on every node that holds the file; results come
back per host as fanout's HostResult, nothing is printed here. A node that cannot be reached is a
per-host failure, not an exception: the other nodes still run.
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
import time
from collections.abc import Sequence
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from spark_ops.errors import (
    InputError,
    SparkOpsError,
    excerpt,
)
from spark_ops.fanout import (
    ERROR,
    OK,
    UNCHANGED,
    FanoutError,
    FanoutReport,
    HostResult,
    as_operation,
    connect_cap,
    connect_one,
    from_error,
    select_nodes,
)
from spark_ops.linesub import LINE_ENDS
from spark_ops.remote import ClusterSession, FileWrite, sha256

if TYPE_CHECKING:
    from spark_ops.inventory import Cluster
    from spark_ops.remote import ClusterSession

EDIT_DEADLINE_S = 5.0  # a one-line regex match on a recipe takes microseconds
# Every character str.splitlines() (and so YAML, or a reader of the recipe) takes for a line end.
LINE_BREAKS = LINE_ENDS
# The directory that holds the spark_ops package: the line-edit child's cwd, so that
# `python -m spark_ops.linesub` imports nothing from the directory spark-ops was started in.
PACKAGE_HOME = str(Path(__file__).resolve().parents[1])


@dataclass(frozen=True)
class LineEdit:
    """A one-line edit: the one line matching regex `pattern` is rewritten by re.sub()."""

    path: str
    pattern: str
    replacement: str

    def compiled(self) -> re.Pattern[str]:
        """The pattern, compiled, and its replacement template checked (InputError naming them)."""
        try:
            rx = re.compile(self.pattern)
        except re.error as exc:
            raise InputError(
                f"edit pattern {excerpt(self.pattern)} is not a valid regex: {exc}"
            ) from exc
        try:
            rx.sub(self.replacement, "")  # compiles the template: \\9, \\g<x> fail here
            re.compile(f"(?:{self.pattern})|").sub(self.replacement, "")
        except (re.error, IndexError) as exc:
            raise InputError(
                f"replacement {excerpt(self.replacement)} is not a valid template for pattern "
                f"{excerpt(self.pattern)}: {exc}",
                hint="groups are \\1 … \\9 or \\g<name>, and must exist in the pattern",
            ) from None
        return rx

    async def apply(
        self, host: str, text: str, *, deadline_s: float = EDIT_DEADLINE_S
    ) -> tuple[str, str, str]:
        """Return (new text, old line, new line); exactly one line must match."""
        try:
            (done,) = await self.substitute([text], deadline_s=deadline_s)
        except _Runaway as exc:
            raise exc.on(host) from None
        return self.outcome(host, done)

    async def spawn(self) -> asyncio.subprocess.Process:
        """Start the substitution child; it waits for its texts on stdin (and ends at EOF), so
        started early its interpreter's start-up overlaps the connections and the lock."""
        return await asyncio.create_subprocess_exec(
            sys.executable, "-m", "spark_ops.linesub",
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            cwd=PACKAGE_HOME,  # `-m` puts the cwd first on sys.path: never the operator's
        )  # fmt: skip

    async def substitute(
        self,
        texts: Sequence[str],
        *,
        deadline_s: float = EDIT_DEADLINE_S,
        child: asyncio.Task[asyncio.subprocess.Process] | None = None,
    ) -> list[dict[str, Any]]:
        """linesub.sub_line's answer for each text, all in one child process (spark_ops/linesub.py
        says why; `child` when one was spawned already) killed at deadline_s: a pattern that
        backtracks for ever is refused, naming it, and nothing is written."""
        self.compiled()
        payload = json.dumps(
            {
                "pattern": self.pattern,
                "replacement": self.replacement,
                "texts": list(texts),
                "deadline_s": deadline_s,  # the child ends itself too, should spark-ops be killed
            }
        ).encode()
        proc = await (child if child is not None else self.spawn())
        try:
            out, err = await asyncio.wait_for(proc.communicate(payload), deadline_s)
        except asyncio.TimeoutError:
            raise _Runaway(
                f"{self.path}: pattern {excerpt(self.pattern)} did not finish matching within "
                f"{deadline_s:g} s (it backtracks without end on this file, e.g. a nested "
                "repetition like (a+)+); nothing was written",
                hint="anchor the pattern (^…$) and avoid a repetition inside a repetition",
            ) from None
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        if proc.returncode != 0:
            tail = err.decode("utf-8", "replace").strip().splitlines()[-1:] or ["no output"]
            raise _Runaway(f"{self.path}: the edit failed: {tail[0][:300]}")
        done = json.loads(out)
        assert isinstance(done, list) and len(done) == len(texts)
        return done

    def outcome(self, host: str, done: dict[str, Any]) -> tuple[str, str, str]:
        """(new text, old line, new line) from one sub_line answer, or the FanoutError of a host
        whose text has no or several matching lines, or whose new line would split."""
        hits = done["hits"]
        if len(hits) != 1:
            found = (
                "no line"
                if not hits
                else f"{len(hits)} lines (" + ", ".join(str(i + 1) for i in hits[:5]) + ")"
            )
            raise FanoutError(
                host,
                f"{self.path}: {found} match {self.pattern!r}; a one-line edit needs exactly one",
            )
        if any(ch in LINE_BREAKS for ch in done["new"]):
            raise FanoutError(host, f"{self.path}: the replacement would split line {hits[0] + 1}")
        return done["text"], done["old"], done["new"]


class _Runaway(Exception):
    """The substitution child did not answer (deadline, crash): the same error for every host."""

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        """Keep the message and hint, named for a host later."""
        super().__init__(message)
        self.message, self.hint = message, hint

    def on(self, host: str) -> FanoutError:
        """The error as one host's FanoutError."""
        return FanoutError(host, self.message, hint=self.hint)


async def edit_on(
    session: ClusterSession,
    edit: LineEdit,
    hosts: Sequence[str],
    *,
    keep_backups: int = 5,
    connecting: dict[str, asyncio.Task[bool]] | None = None,
    child: asyncio.Task[asyncio.subprocess.Process] | None = None,
) -> list[HostResult]:
    """Edit one line on hosts all-or-nothing: read on each, substitute once per distinct text
    (one child for the run, `child` when spawned already), then one atomic write. A host whose
    connection is under way in `connecting` is read once that connect ends."""
    hosts = list(hosts)
    edit.compiled()
    start = time.monotonic()
    sem = connect_cap(session)
    results: dict[str, HostResult] = {}
    writes: dict[str, FileWrite] = {}
    texts: dict[str, str] = {}

    async def read(h: str) -> None:
        """Connect and read the file on one host."""
        early = (connecting or {}).get(h)
        if not await (early if early is not None else connect_one(session, h, sem)):
            results[h] = from_error(h, session.errors[h])
            return
        try:
            text = await session.read_file(h, edit.path, sudo=True)
            if text is None:
                raise FanoutError(h, f"{edit.path} does not exist")
            texts[h] = text
        except SparkOpsError as exc:
            results[h] = from_error(h, exc)

    await asyncio.gather(*(read(h) for h in hosts))
    distinct = list(dict.fromkeys(texts[h] for h in hosts if h in texts))  # inventory order
    try:
        answers = (
            dict(zip(distinct, await edit.substitute(distinct, child=child), strict=True))
            if texts
            else {}
        )
    except _Runaway as exc:
        for h in texts:
            results[h] = from_error(h, exc.on(h))
        return _finish(hosts, results, writes, start, written=False)
    for h, text in texts.items():
        try:
            new, old_line, new_line = edit.outcome(h, answers[text])
        except SparkOpsError as exc:
            results[h] = from_error(h, exc)
            continue
        info = {"path": edit.path, "old_line": old_line, "new_line": new_line, "backup": None}
        if new == text:
            results[h] = HostResult(h, UNCHANGED, extra=info)
            continue
        results[h] = HostResult(h, OK, extra=info)
        writes[h] = FileWrite(
            h, edit.path, new, expected_sha=sha256(text), keep_backups=keep_backups
        )
    if not writes or any(not r.ok for r in results.values()):
        return _finish(hosts, results, writes, start, written=False)
    order = list(writes)
    try:
        done = await session.write_atomic([writes[h] for h in order])
    except SparkOpsError as exc:  # every node put back (else `written` names the ones left)
        failed = getattr(exc, "host", None)
        left = {key.split(":", 1)[0] for key in getattr(exc, "written", [])}
        for h in order:
            if h == failed or failed not in writes or left:  # left: the error names every copy
                results[h] = from_error(h, exc)
            results[h].extra["written"] = h in left
        return _finish(hosts, results, writes, start, written=False)
    for out in done:
        results[out.host].extra["backup"] = out.backup
    return _finish(hosts, results, writes, start, written=True)


def _finish(
    hosts: list[str],
    results: dict[str, HostResult],
    writes: dict[str, Any],
    start: float,
    *,
    written: bool,
) -> list[HostResult]:
    """Order results by host; mark hosts whose write was held back because another host failed."""
    took = time.monotonic() - start
    out: list[HostResult] = []
    for h in hosts:
        r = results[h]
        r.seconds = took
        if h in writes and not written and r.kind == OK:
            r.kind = ERROR
            r.error = "not written: the edit failed on another node (all or nothing)"
        r.extra.setdefault("written", written and h in writes and r.ok)
        out.append(r)
    return out


async def edit_line(
    cluster: Cluster,
    edit: LineEdit,
    *,
    nodes: Sequence[str] | None = None,
) -> FanoutReport:
    """Apply a one-line edit of edit.path on the chosen nodes, atomically and all-or-nothing."""
    hosts = select_nodes(cluster, nodes)
    edit.compiled()  # a bad pattern or template is refused before connecting (and locking)
    start = time.monotonic()
    args = {"path": edit.path, "pattern": edit.pattern, "replacement": edit.replacement}
    keep = cluster.recipe.keep_backups
    async with ClusterSession(cluster) as session:
        # Started at once, each overlapping the rest: the substitution child's interpreter, and
        # every node's connection (under the one cap) while the head's connects and the lock is
        # taken. The lock is asked for once the head is connected, as before; nothing is read
        # before it is held.
        child = asyncio.create_task(edit.spawn())
        sem = connect_cap(session)
        head = cluster.head.name
        connecting = {
            h: asyncio.create_task(connect_one(session, h, sem))
            for h in dict.fromkeys([head, *hosts])
        }
        try:
            await connecting[head]
            async with as_operation(session, "exec --edit", args, hosts) as done:
                results = await edit_on(
                    session, edit, hosts, keep_backups=keep, connecting=connecting, child=child
                )
                done.extend(results)
        finally:
            for task in connecting.values():
                task.cancel()
            await asyncio.gather(*connecting.values(), return_exceptions=True)
            await _drop_child(child)
    label = f"edit {edit.path}: s/{edit.pattern}/{edit.replacement}/"
    return FanoutReport(
        cluster.name, label, results, time.monotonic() - start, mode="edit",
        note=edit_note(cluster, edit.path, results),
    )  # fmt: skip


async def _drop_child(child: asyncio.Task[asyncio.subprocess.Process]) -> None:
    """Kill the substitution child of a run that ended before giving it its texts."""
    with suppress(OSError, asyncio.CancelledError):
        proc = await child
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


def edit_note(cluster: Cluster, path: str, results: Sequence[HostResult]) -> str:
    """Why an edit takes no lease (it restarts nothing, so serving is not disrupted), and, for
    the recipe, when its values reach the engine; "" when no host's file changed."""
    if not any(h.kind == "ok" for h in results):
        return ""
    if path != cluster.recipe.path:
        return "no restart, so no watchdog lease: exec --edit only writes the file"
    return (
        "no restart, so no watchdog lease: exec --edit only writes the recipe, and the engine "
        "serves on its old values until its next restart: `spark-ops restart` (which takes the "
        "lease, follows the boot and verifies), or the watchdog's own restart, which starts it "
        "on the new values unverified"
    )
