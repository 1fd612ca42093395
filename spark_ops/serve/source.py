"""What the pages, the JSON endpoints and /metrics show: read through the code `status`, `log`
and `bench` use, cached a few seconds so that a scrape storm opens no SSH session per request."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from spark_ops.audit import is_attributed, read_log
from spark_ops.doctor import read_last
from spark_ops.errors import SparkOpsError
from spark_ops.inventory import Cluster
from spark_ops.log import get_logger
from spark_ops.readiness import BootHistory, history_key
from spark_ops.serve.boot import BootWatch
from spark_ops.serve.load import LoadWatch
from spark_ops.serve.nodes import FACTS_S, read_facts, short_error
from spark_ops.serve.sweeps import MAX_RESULTS, SweepReader, load_sweep
from spark_ops.status import collect_status

FIRST_WAIT_S = 3.0  # a page waits at most this for the very first node reading, never later
CACHE_S = 5.0  # a page, a script and Prometheus within this share one reading
AUDIT_LIMIT = 300  # raw lines: a run writes about ten, the history page groups them
RUN_OPERATIONS = ("apply", "restart", "rollback", "experiment")
log = get_logger(op="serve")
__all__ = ["MAX_RESULTS", "Cached", "Source", "last_run", "load_sweep"]  # serve.sweeps' as before


class Cached:
    """One value read at most once per `ttl` seconds; concurrent readers share the read.

    In the background mode (node readings: one hung node must not hold a page) a reader never
    waits on a read once a value is kept: it gets the last value, with its age in the value's
    own `time`, and a stale value starts a new read in the background. The first read is waited
    on for at most `first_wait` seconds (then the `missing` value says it is not read yet)."""

    def __init__(
        self,
        read: Callable[[], Awaitable[Any]],
        ttl: float,
        *,
        background: bool = False,
        first_wait: float = FIRST_WAIT_S,
        missing: Callable[[], Any] | None = None,
    ) -> None:
        """Keep the reader."""
        self.read = read
        self.ttl = ttl
        self.value: Any = None
        self.at = -1e18
        self.lock = asyncio.Lock()
        self.background = background
        self.first_wait = first_wait
        self.missing = missing
        self.task: asyncio.Task[None] | None = None

    async def get(self) -> Any:
        """The value, read again when older than ttl."""
        if self.background:
            return await self._get_background()
        async with self.lock:
            if time.monotonic() - self.at >= self.ttl:
                self.value = await self.read()
                self.at = time.monotonic()
            return self.value

    def refresh(self) -> asyncio.Task[None]:
        """Start a read in the background unless one runs; the running one."""
        if self.task is None or self.task.done():
            self.task = asyncio.create_task(self._refresh(), name="serve-cached-read")
        return self.task

    async def _refresh(self) -> None:
        """One read; its value kept with when it ended (a read that raises keeps the last value,
        logged; the next get reads again)."""
        try:
            self.value = await self.read()
        except Exception as exc:
            log.error("background read failed", error=repr(exc)[:300])
        self.at = time.monotonic()

    async def _get_background(self) -> Any:
        """The last value at once; a stale one read again in the background."""
        if time.monotonic() - self.at >= self.ttl:
            task = self.refresh()
            if self.value is None:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(task), self.first_wait)
        if self.value is None and self.missing is not None:
            return self.missing()
        return self.value

    async def close(self) -> None:
        """Stop a read under way."""
        if self.task is not None and not self.task.done():
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self.task


class Source:
    """Everything the server shows about one cluster."""

    def __init__(
        self, cluster: Cluster, *, results: Path | None = None, ttl: float = CACHE_S
    ) -> None:
        """Readers for status and the audit log; the boot watch; where saved sweeps are."""
        self.cluster = cluster
        self.results = results
        self.boot = BootWatch(cluster)
        self.status = Cached(self._status, ttl)
        self.audit = Cached(self._audit, ttl)
        self.sweep_reader = SweepReader(results, ttl=ttl) if results is not None else None
        self.hardware = Cached(self._hardware, max(ttl, FACTS_S), background=True,
                               missing=_facts_not_read)  # fmt: skip
        self.load = LoadWatch(cluster)

    async def _status(self) -> dict[str, Any]:
        """`status --json`'s document; an unexpected failure is a document saying so (the pages
        show it; nothing is made up)."""
        try:
            return dict(await collect_status(self.cluster))
        except Exception as exc:
            log.error("status read failed", error=repr(exc)[:300])
            said = f"status unreadable ({type(exc).__name__})"
            return {"cluster": self.cluster.name, "time": time.time(), "nodes": [],
                    "verdict": {"state": "unknown", "reasons": [said]}, "error": said}  # fmt: skip

    async def _audit(self) -> dict[str, Any]:
        """The audit log's last entries (as `spark-ops log --json`), or the error reading it."""
        try:
            return {"entries": await read_log(self.cluster, AUDIT_LIMIT)}
        except SparkOpsError as exc:
            return {"entries": [], "error": exc.message}
        except Exception as exc:  # never the page's error
            log.error("audit read failed", error=repr(exc)[:300])
            return {"entries": [], "error": f"audit log unreadable ({type(exc).__name__})"}

    async def _hardware(self) -> dict[str, Any]:
        """Each node's facts (serve.nodes), or the error reading them (the page goes on)."""
        try:
            return await read_facts(self.cluster)
        except SparkOpsError as exc:
            return {"time": time.time(), "nodes": {}, "error": short_error(exc.message)}
        except Exception as exc:  # never the page's error: said in the nodes box, logged
            log.error("node facts failed", error=repr(exc)[:300])
            said = f"node facts unreadable ({type(exc).__name__})"
            return {"time": time.time(), "nodes": {}, "error": said}

    def doctor(self) -> dict[str, Any] | None:
        """The last `spark-ops doctor` report kept on this machine for this cluster."""
        return read_last(self.cluster.name)

    def boots(self) -> dict[str, Any]:
        """This machine's boot records (`status`' last boot, the ETAs) and the live boot."""
        key = history_key(self.cluster)
        history = BootHistory()
        return {
            "live": self.boot.state.snapshot(),
            "tail": list(self.boot.tail),
            "watched_here": list(self.boot.past),
            "recorded": history.records(key)[::-1],
            "usual_s": history.estimate(key),
        }

    async def sweeps(self) -> dict[str, Any]:
        """Saved sweep results (`bench -o FILE.json`) under --results, with their what-if: read
        by one child process at a time under a budget (serve.sweeps)."""
        if self.sweep_reader is None:
            return {"dir": None, "runs": []}
        return await self.sweep_reader.get()

    async def close(self) -> None:
        """Stop what reads in the background (a sweep read's child)."""
        await self.hardware.close()
        if self.sweep_reader is not None:
            await self.sweep_reader.close()


def _facts_not_read() -> dict[str, Any]:
    """The node facts before their first reading ended."""
    return {
        "time": None,
        "nodes": {},
        "error": "node facts not read yet (reading in the background)",
    }


def last_run(entries: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The newest ended run (apply, restart, rollback, experiment) in the audit entries."""
    for e in reversed(entries):
        if not is_attributed(e):
            continue  # a line the head's program did not write is no run (issue 34)
        what: dict[str, Any] = e["what"] if isinstance(e.get("what"), dict) else {}
        if what.get("operation") in RUN_OPERATIONS and e.get("phase") not in ("intent", "step"):
            return {
                "operation": what.get("operation"),
                "outcome": e.get("outcome"),
                "ok": e.get("outcome") in ("ok", "done"),
                "when": e.get("when"),
                "who": e.get("who"),
            }
    return None
